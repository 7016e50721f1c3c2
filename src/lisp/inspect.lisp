;;;; The inspect tool: what SLIME's inspector shows of an object (its type, then its slots,
;;;; elements, hash-table entries, or function and class facts), paged, each part with a handle
;;;; to walk into; and the text behind a handle (a string, or output a reply cut) in slices.
;;;;
;;;; Written here rather than on the server's inspector (EMACS-INSPECT): its pages are made for
;;;; an Emacs buffer (action buttons, check boxes, grouping controls), differ between swank and
;;;; slynk, and would tie the helper to one of them.

(in-package #:mcp-agent-helper)

(defparameter *part-text-limit* 200
  "Characters of a part's printed value shown in an inspect page.")

(defun brief (object)
  "OBJECT on one line, as an inspect page shows a part."
  (print-briefly object :length 10 :level 3 :limit *part-text-limit*))

(defun part (label value &optional label-object)
  "One line of an inspect page: LABEL (a string), VALUE printed with its handle, and the handle
of LABEL-OBJECT when the label stands for an object of its own (a hash-table key)."
  (list label (brief value) (value-handle value)
        (and label-object (value-handle label-object))))

(defun fact (label control &rest arguments)
  (list label (apply #'format nil control arguments)))

(defun class-name-text (class)
  (brief (if (typep class 'class) (class-name class) class)))

(defun page-of-list (list start end)
  "Parts START to END of LIST, a proper list, and how many elements it has."
  (values (loop for element in (nthcdr start list)
                for i from start below end
                collect (part (format nil "~D" i) element))
          (length list)))

(defun list-shape (list)
  "How LIST ends: :PROPER, :DOTTED or :CIRCULAR."
  (cond ((null (list-length-safely list)) :circular)
        ((cdr (last list)) :dotted)
        (t :proper)))

(defun list-length-safely (list)
  "LIST-LENGTH for a list that may be dotted: its conses, or NIL when it is circular."
  (loop for slow = list then (cdr slow)
        for fast = list then (cddr fast)
        for count from 0 by 2
        do (cond ((not (consp fast)) (return count))
                 ((not (consp (cdr fast))) (return (1+ count)))
                 ((and (> count 0) (eq fast slow)) (return nil)))))

(defun cons-page (object start end)
  (ecase (list-shape object)
    (:proper
     (multiple-value-bind (parts total) (page-of-list object start end)
       (values (list (fact "Length" "~:D" total)) "Elements" parts total)))
    (:dotted
     (let* ((conses (list-length-safely object))
            (total (1+ conses)))
       (values (list (fact "Shape" "a dotted list of ~:D conses" conses))
               "Elements"
               (loop for i from start below (min end total)
                     collect (if (< i conses)
                                 (part (format nil "~D" i) (nth i object))
                                 (part "tail" (cdr (last object)))))
               total)))
    (:circular
     (multiple-value-bind (conses loop-start) (circular-list-conses object)
       (values (list (fact "Shape" "a circular list of ~:D conses, the last one's cdr the ~:R (element ~D)"
                           conses (1+ loop-start) loop-start))
               "Elements"
               (loop for tail = (nthcdr start object) then (cdr tail)
                     for i from start below (min end conses)
                     collect (part (format nil "~D" i) (car tail)))
               conses)))))

(defun circular-list-conses (list)
  "How many distinct conses the circular LIST has, and the index of the one its last cons's cdr
points back to (Floyd's cycle finding)."
  (let ((slow list) (fast list))
    (loop do (setf slow (cdr slow) fast (cddr fast))
          until (eq slow fast))
    ;; The cycle starts where a pointer from the head and one from the meeting point meet.
    (let ((start 0) (head list))
      (loop until (eq head slow)
            do (setf head (cdr head) slow (cdr slow))
               (incf start))
      (values (+ start (loop for tail = (cdr head) then (cdr tail)
                             count t
                             until (eq tail head)))
              start))))

(defun vector-page (object start end)
  (let ((total (length object)))
    (values (append (list (fact "Length" "~:D" total)
                          (fact "Element type" "~A" (brief (array-element-type object))))
                    (and (array-has-fill-pointer-p object)
                         (list (fact "Fill pointer" "~:D (of ~:D)" (fill-pointer object) (array-dimension object 0)))))
            "Elements"
            (loop for i from start below (min end total)
                  collect (part (format nil "~D" i) (aref object i)))
            total)))

(defun array-page (object start end)
  (let ((total (array-total-size object))
        (dimensions (array-dimensions object)))
    (values (list (fact "Dimensions" "~A" (brief dimensions))
                  (fact "Element type" "~A" (brief (array-element-type object))))
            "Elements (row-major)"
            (loop for i from start below (min end total)
                  collect (part (format nil "~A"
                                        (let ((subscripts '()) (rest i))
                                          (dolist (d (reverse dimensions) subscripts)
                                            (push (mod rest d) subscripts)
                                            (setf rest (floor rest d)))))
                                (row-major-aref object i)))
            total)))

(defun hash-table-page (object start end)
  (let ((parts '()) (i 0))
    (block walk
      (maphash (lambda (key value)
                 (when (>= i end) (return-from walk))
                 (when (>= i start)
                   (push (part (brief key) value key) parts))
                 (incf i))
               object))
    (values (list (fact "Test" "~A" (brief (hash-table-test object)))
                  (fact "Count" "~:D" (hash-table-count object))
                  (fact "Size" "~:D" (hash-table-size object))
                  (fact "Weakness" "~A" (brief (ignore-errors (sb-ext:hash-table-weakness object))))
                  (fact "Synchronized" "~:[no~;yes~]" (ignore-errors (sb-ext:hash-table-synchronized-p object))))
            "Entries (key = value)"
            (nreverse parts)
            (hash-table-count object))))

(defun slot-page (object start end)
  "The slots of OBJECT, a standard object, structure or condition, with their values."
  (let* ((class (class-of object))
         (slots (ignore-errors (sb-mop:class-slots class)))
         (total (length slots)))
    (values (list (fact "Class" "~A" (class-name-text class)))
            "Slots"
            (loop for slot in (subseq slots (min start total) (min end total))
                  for name = (sb-mop:slot-definition-name slot)
                  collect (multiple-value-bind (value error)
                              (ignore-errors (if (sb-mop:slot-boundp-using-class class object slot)
                                                 (sb-mop:slot-value-using-class class object slot)
                                                 '#1=#:unbound))
                            (cond (error (list (brief name) (format nil "#<unreadable: ~A>" (safe-princ error)) nil nil))
                                  ((eq value '#1#) (list (brief name) "#<unbound>" nil nil))
                                  (t (part (brief name) value)))))
            total)))

(defun slot-origin (class slot)
  "The class among CLASS's precedence list whose direct slot SLOT comes from."
  (let ((name (sb-mop:slot-definition-name slot)))
    (find-if (lambda (c) (find name (sb-mop:class-direct-slots c) :key #'sb-mop:slot-definition-name))
             (sb-mop:class-precedence-list class))))

(defun class-page (class start end)
  (let* ((finalized (ignore-errors (sb-mop:class-finalized-p class)))
         (slots (if finalized (sb-mop:class-slots class) (sb-mop:class-direct-slots class)))
         (total (length slots)))
    (values (remove nil
                    (list (fact "Name" "~A" (brief (class-name class)))
                          (fact "Metaclass" "~A" (class-name-text (class-of class)))
                          (fact "Superclasses" "~{~A~^ ~}" (mapcar #'class-name-text (sb-mop:class-direct-superclasses class)))
                          (and finalized
                               (fact "Precedence" "~{~A~^ ~}" (mapcar #'class-name-text (sb-mop:class-precedence-list class))))
                          (fact "Subclasses" "~:[none~;~:*~{~A~^ ~}~]"
                                (mapcar #'class-name-text (sb-mop:class-direct-subclasses class)))
                          (let ((doc (documentation class t)))
                            (and doc (fact "Documentation" "~A" doc)))))
            (if finalized "Slots (effective; from the class that defines them)" "Direct slots (not finalized)")
            (loop for slot in (subseq slots (min start total) (min end total))
                  for origin = (and finalized (slot-origin class slot))
                  collect (list (brief (sb-mop:slot-definition-name slot))
                                (format nil "~@[initargs ~{~S~^ ~}~]~@[ type ~A~]~@[ ~(~A~) allocation~]~@[ from ~A~]"
                                        (sb-mop:slot-definition-initargs slot)
                                        (let ((type (sb-mop:slot-definition-type slot)))
                                          (and (not (eq type t)) (brief type)))
                                        (let ((allocation (sb-mop:slot-definition-allocation slot)))
                                          (and (not (eq allocation :instance)) allocation))
                                        (and origin (not (eq origin class)) (class-name-text origin)))
                                (value-handle slot)
                                nil))
            total)))

(defun function-facts (function)
  (let ((name (nth-value 2 (function-lambda-expression function)))
        (lambda-list (ignore-errors (sb-introspect:function-lambda-list function)))
        (source (ignore-errors (sb-introspect:find-definition-source function))))
    (remove nil
            (list (fact "Name" "~A" (brief name))
                  (fact "Call" "~A" (lambda-list-text (or name 'lambda) lambda-list *package*))
                  (let ((doc (documentation function t)))
                    (and doc (fact "Documentation" "~A" doc)))
                  ;; As describe-symbol and find-definition say it.
                  (let ((location (cond ((typep function 'generic-function)
                                         (let ((name (sb-mop:generic-function-name function)))
                                           (generic-function-location function name *package*)))
                                        ((and source (sb-introspect:definition-source-pathname source))
                                         (source-location source name)))))
                    (if (getf location :file)
                        (fact "Source" "~A~@[ (~A)~]" (file-location-text location) (location-remark location))
                        (fact "Source" "defined at the REPL or in a form without a file")))
                  (and (typep function 'generic-function)
                       (fact "Method combination" "~A"
                             (brief (sb-mop:generic-function-method-combination function))))))))

(defun closure-values (function)
  "The values FUNCTION closes over, when it is a closure and this SBCL tells them."
  (ignore-errors
   (when (sbcl-call :closurep function)
     (loop for i below (1- (sbcl-call :get-closure-length function))
           collect (sbcl-call :%closure-index-ref function i)))))

(defun function-page (function start end)
  (if (typep function 'generic-function)
      (let* ((methods (sb-mop:generic-function-methods function))
             (total (length methods)))
        (values (function-facts function)
                "Methods (qualifiers and specializers)"
                (loop for method in (subseq methods (min start total) (min end total))
                      collect (list (format nil "~{~S ~}~A" (method-qualifiers method)
                                            (brief (mapcar (lambda (s)
                                                             (if (typep s 'class) (class-name s)
                                                                 (list 'eql (sb-mop:eql-specializer-object s))))
                                                           (sb-mop:method-specializers method))))
                                    (brief method) (value-handle method) nil))
                total))
      (let ((closed (closure-values function)))
        (values (function-facts function)
                "Closed-over values"
                (loop for value in (subseq closed (min start (length closed)) (min end (length closed)))
                      for i from start
                      collect (part (format nil "~D" i) value))
                (length closed)))))

(defun symbol-page (symbol start end)
  (let ((parts (remove nil
                       (list (and (boundp symbol) (part "value" (symbol-value symbol)))
                             (and (fboundp symbol) (not (macro-function symbol)) (not (special-operator-p symbol))
                                  (part "function" (fdefinition symbol)))
                             (and (macro-function symbol) (part "macro" (macro-function symbol)))
                             (and (find-class symbol nil) (part "class" (find-class symbol)))
                             (and (symbol-plist symbol) (part "plist" (symbol-plist symbol)))
                             (and (symbol-package symbol) (part "package" (symbol-package symbol)))))))
    (values (list (fact "Name" "~S" (symbol-name symbol))
                  (fact "Package" "~:[none (uninterned)~;~:*~A~]"
                        (and (symbol-package symbol) (package-name (symbol-package symbol)))))
            "Bindings"
            (subseq parts (min start (length parts)) (min end (length parts)))
            (length parts))))

(defun package-page (package start end)
  (let ((external 0) (internal 0))
    (do-symbols (symbol package)
      (when (eq (symbol-package symbol) package)
        (if (eq (nth-value 1 (find-symbol (symbol-name symbol) package)) :external)
            (incf external)
            (incf internal))))
    (let ((used (package-use-list package)))
      (values (list (fact "Name" "~A" (package-name package))
                    (fact "Nicknames" "~:[none~;~:*~{~A~^ ~}~]" (package-nicknames package))
                    (fact "Used by" "~:[none~;~:*~{~A~^ ~}~]" (mapcar #'package-name (package-used-by-list package)))
                    (fact "Symbols" "~:D external, ~:D internal" external internal))
              "Uses"
              (loop for p in (subseq used (min start (length used)) (min end (length used)))
                    collect (part (package-name p) p))
              (length used)))))

(defun number-facts (number)
  (remove nil
          (list (fact "Value" "~A" (brief number))
                (and (integerp number) (fact "Hexadecimal" "#x~X" number))
                (and (integerp number) (fact "Bits" "~:D (integer-length)" (integer-length number)))
                (and (rationalp number) (not (integerp number)) (fact "As a float" "~A" (float number 1d0))))))

(defun object-page (object start end)
  "What inspect shows of OBJECT: its facts, the title of its parts, the parts START to END, and
how many parts it has."
  (typecase object
    (class (class-page object start end))
    (function (function-page object start end))
    (cons (cons-page object start end))
    (hash-table (hash-table-page object start end))
    (symbol (symbol-page object start end))
    (package (package-page object start end))
    (number (values (number-facts object) "Parts" '() 0))
    (character (values (list (fact "Code" "~D" (char-code object))
                             (fact "Name" "~:[none~;~:*~A~]" (char-name object)))
                       "Parts" '() 0))
    ((and vector (not string)) (vector-page object start end))
    ((and array (not string)) (array-page object start end))
    ((or standard-object structure-object condition) (slot-page object start end))
    (t (values '() "Parts" '() 0))))

(defun text-of (object)
  "The text a handle pages through: a string's characters or a cut output's kept text, or NIL."
  (typecase object
    (kept-text (kept-text object))
    (string object)))

(define-entry (inspect-value :caller :server) (&key handle code package session token (offset 0) (limit 50) (text-limit 16000))
  "The inspect tool: the object behind HANDLE (\"@3\"), or the value of CODE evaluated in PACKAGE
now. Its parts OFFSET to OFFSET + LIMIT, or for a text (a string, or the kept text of cut output)
its characters OFFSET to OFFSET + TEXT-LIMIT. Returns a plist: :HANDLE :PRINTED :TYPE :FACTS
((label text) ...) :SECTION :PARTS ((label printed handle label-handle) ...) :OFFSET :TOTAL, and
for a text :TEXT, :LOST (characters written but not kept) and :GAP (where in the text they were)."
  (let ((*handles* (session-handles session)))
    (run-tool
     token
     (lambda ()
       (let* ((*package* (tool-package package session))
              (object (cond (handle (handle-object handle))
                            (code (let ((values (read-and-evaluate code (lambda (form values)
                                                                          (declare (ignore form values))))))
                                    (when (null values)
                                      (fail "The code returned no values: there is nothing to inspect."))
                                    (first values)))
                            (t (fail "Give a handle (like @3, from an earlier reply) or code to evaluate."))))
              (handle (or (and handle (handle-name (parse-integer (string-left-trim "@" (string-trim " " handle)))))
                          (value-handle object)
                          ""))
              (text (text-of object)))
         (if text
             (let* ((start (min offset (length text)))
                    (lost (if (typep object 'kept-text) (kept-text-lost object) 0))
                    (gap (and (plusp lost) (kept-text-gap object)))
                    ;; A page stops where characters were not kept, for its note to say so.
                    (end (min (length text) (+ start text-limit)
                              (if (and gap (> gap start)) gap (length text)))))
               (list :handle handle
                     :printed (if (typep object 'kept-text) "cut output" (brief object))
                     :type (if (typep object 'kept-text) "TEXT" (brief (type-of object)))
                     :facts nil :section "Text" :parts nil
                     :offset start :total (length text)
                     :text (subseq text start end)
                     :lost lost :gap gap))
             (multiple-value-bind (facts section parts total) (object-page object offset (+ offset limit))
               (list :handle handle :printed (brief object) :type (brief (type-of object))
                     :facts facts :section section :parts parts
                     :offset offset :total total :text nil :lost 0 :gap nil))))))))
