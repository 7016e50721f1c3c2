;;;; Symbol names as the user types them, and printing for the user.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Symbol names as the user types them

(defun parse-symbol-designator (text)
  "Splits TEXT, a symbol as one types it (foo, pkg:foo, pkg::foo, :foo, |Mixed Case|, 'foo), into
its package name (NIL when unqualified) and its symbol name, converting case as the current
readtable would (:INVERT is taken as :UPCASE). Reads nothing and interns nothing. Returns NIL
when TEXT is not a symbol name."
  (let* ((text (string-trim '(#\Space #\Tab #\Newline #\Return) text))
         (text (cond ((and (> (length text) 2) (string= "#'" text :end2 2)) (subseq text 2))
                     ((and (> (length text) 1) (char= (char text 0) #\')) (subseq text 1))
                     (t text)))
         (convert (ecase (readtable-case *readtable*)
                    ((:upcase :invert) #'char-upcase)
                    (:downcase #'char-downcase)
                    (:preserve #'identity)))
         (part (make-string-output-stream))
         (package nil)
         (after-colons nil)
         (in-bars nil)
         (i 0)
         (end (length text)))
    (loop while (< i end)
          do (let ((c (char text i)))
               (cond (in-bars
                      (cond ((char= c #\|) (setf in-bars nil))
                            ((and (char= c #\\) (< (1+ i) end)) (incf i) (write-char (char text i) part))
                            (t (write-char c part))))
                     ((char= c #\|) (setf in-bars t))
                     ((char= c #\\)
                      (when (= (1+ i) end) (return-from parse-symbol-designator nil))
                      (incf i)
                      (write-char (char text i) part))
                     ((char= c #\:)
                      (when after-colons (return-from parse-symbol-designator nil))
                      (let ((prefix (get-output-stream-string part)))
                        (setf package (if (and (zerop i) (string= prefix "")) "KEYWORD" prefix)
                              after-colons t)
                        (when (and (< (1+ i) end) (char= (char text (1+ i)) #\:))
                          (incf i))))
                     ((or (member c '(#\Space #\Tab #\Newline #\Return #\( #\) #\" #\; #\` #\,))
                          (and (char= c #\#) (zerop i)))
                      (return-from parse-symbol-designator nil))
                     (t (write-char (funcall convert c) part))))
             (incf i))
    (let ((name (get-output-stream-string part)))
      (unless (or in-bars (string= name ""))
        (values package name)))))

(defun find-named-symbol (text package)
  "The symbol TEXT names, looked up from PACKAGE (or in the package TEXT names). Returns the
symbol, whether it exists, its name as parsed, and the package it was looked up in. Fails when
TEXT is not a symbol name or names a package that does not exist."
  (multiple-value-bind (package-name name) (parse-symbol-designator text)
    (unless name
      (fail "~S is not a symbol name." text))
    ;; Found from PACKAGE, as the reader would in it: its package-local nicknames count.
    (let ((home (if package-name
                    (or (let ((*package* package)) (find-package package-name))
                        (fail-missing-package package-name))
                    package)))
      (multiple-value-bind (symbol status) (find-symbol name home)
        (values symbol (and status t) name home)))))

(defun find-existing-symbol (text package)
  "Like FIND-NAMED-SYMBOL, but fails when there is no such symbol, offering the near names that
name something."
  (multiple-value-bind (symbol found name home) (find-named-symbol text package)
    (unless found
      (fail "Symbol ~A not found in package ~A.~A" name (package-display-name home)
            (missing-symbol-hint name home)))
    symbol))

;;; ------------------------------------------------------------------------------------------
;;; Printing for the user

(defparameter *printer-state-variables*
  (sbcl-symbols :*circularity-hash-table* :*circularity-counter*)
  "SBCL's state of the *PRINT-CIRCLE* print under way. A print started while another is under way
(a traced function that a PRINT-OBJECT method calls, reported while the value is printed) would
share it: each would mark the other's objects as seen twice, printing #1= and #1# for them.")

(defun print-briefly (object &key (package *package*) (length 10) (level 4) (limit 300))
  "OBJECT printed readably where possible, on one line, cut to LIMIT characters: a print of its
own, whatever print is under way (see *PRINTER-STATE-VARIABLES*)."
  (let ((text (handler-case
                  (progv *printer-state-variables* (make-list (length *printer-state-variables*))
                    (let ((*package* package)
                          (*print-pretty* nil) (*print-readably* nil) (*print-circle* t)
                          (*print-length* length) (*print-level* level))
                      (prin1-to-string object)))
                (error () (format nil "#<unprintable ~A>" (safe-princ (type-of object)))))))
    (if (> (length text) limit)
        (concatenate 'string (subseq text 0 limit) " ...")
        text)))

(defun print-form-briefly (form &key (length 12) (level 4) (limit 200))
  "FORM on one line, abbreviated, as the compiler and macroexpander reports show it. Printed
pretty (so that (DEFUN F () ...) keeps its ()), with the line breaks SBCL forces after LET and
the like folded into spaces."
  (let* ((text (handler-case (let ((*print-pretty* t) (*print-right-margin* 100000)
                                   (*print-length* length) (*print-level* level) (*print-circle* t)
                                   (*print-readably* nil) (*print-lines* nil))
                               (prin1-to-string form))
                 (error () "#<unprintable form>")))
         (folded (with-output-to-string (out)
                   (loop with i = 0
                         while (< i (length text))
                         do (let ((c (char text i)))
                              (if (char= c #\Newline)
                                  (progn (write-char #\Space out)
                                         (setf i (or (position #\Space text :start (1+ i) :test-not #'char=)
                                                     (length text))))
                                  (progn (write-char c out) (incf i))))))))
    (if (> (length folded) limit) (concatenate 'string (subseq folded 0 limit) " ...") folded)))

(defun name-text (name package)
  "A symbol or function name as the user would type it from PACKAGE."
  (print-briefly name :package package :length nil :level nil :limit 1000))

(defun qualified-name (symbol)
  "SYMBOL with its package prefix whatever the current package: ALEXANDRIA:FLATTEN."
  (name-text symbol (load-time-value (find-package '#:keyword))))

(defun documentation-text (symbol kind)
  "The documentation, trimmed, or NIL when there is none or it is blank."
  (let* ((text (ignore-errors (documentation symbol kind)))
         (trimmed (and (stringp text) (string-trim '(#\Space #\Newline #\Tab) text))))
    (and trimmed (plusp (length trimmed)) trimmed)))

(defun lambda-list-text (name lambda-list package)
  "(NAME . LAMBDA-LIST) as text, with the lambda list's variables shown by name only: their
package (SB-C::TEST in the lambda list of IF) says nothing to a caller."
  (labels ((text (x)
             (cond ((and (symbolp x) x (not (keywordp x))) (symbol-name x))
                   ((consp x)
                    (format nil "(~{~A~^ ~}~@[ . ~A~])"
                            (loop for tail = x then (cdr tail)
                                  while (consp tail) collect (text (car tail)))
                            (let ((end (cdr (last x)))) (and end (text end)))))
                   (t (print-briefly x :package package :limit 100)))))
    (format nil "(~A~@[ ~A~])" (name-text name package)
            (and lambda-list (subseq (text lambda-list) 1 (1- (length (text lambda-list))))))))

(defun call-syntax (name package)
  "How to call the function or macro NAME: (NAME ARG ...)."
  (let ((lambda-list (handler-case (sb-introspect:function-lambda-list name)
                       (error () :unknown))))
    (if (eq lambda-list :unknown)
        (format nil "(~A ...)" (name-text name package))
        (lambda-list-text name lambda-list package))))
