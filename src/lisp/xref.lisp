;;;; The xref tool: who calls, references, binds or sets a name, who uses a macro, which methods
;;;; specialize on a class.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; xref

(defparameter *max-xref-hits* 100)

(defun unwrapped-function (function)
  "FUNCTION, or the function it wraps when it is an encapsulation (TRACE's, a breakpoint's,
run-tests'), unwrapped to the innermost: a call to a traced function goes through its wrapper,
whose name is SB-IMPL::ENCAPSULATION and whose source is SBCL's."
  (let ((info-type (sbcl-symbol :encapsulation-info)))
    (loop
      (let ((info (and info-type
                       (sbcl-call :closurep function)
                       (loop for index below (1- (sbcl-call :get-closure-length function))
                             for value = (sbcl-call :%closure-index-ref function index)
                             when (typep value info-type) return value))))
        (if info
            (setf function (sbcl-call :encapsulation-info-definition info))
            (return function))))))

(defun function-callees (symbol)
  "(name . definition-source) of the functions SYMBOL's function (all its methods, for a generic
function) calls."
  (let* ((function (fdefinition symbol))
         (functions (if (typep function 'generic-function)
                        (mapcar #'sb-mop:method-function (sb-mop:generic-function-methods function))
                        (list function))))
    (remove-duplicates
     (loop for f in functions
           append (loop for wrapped in (ignore-errors (sb-introspect:find-function-callees f))
                        for callee = (unwrapped-function wrapped)
                        collect (cons (sbcl-call :%fun-name callee)
                                      (ignore-errors (sb-introspect:find-definition-source callee)))))
     :key #'car :test #'equal)))

(defparameter *xref-kinds* '("calls" "callees" "references" "binds" "sets" "macroexpands" "specializes"))

(defun walking-all-functions (function)
  "Calls FUNCTION, which walks every function of the image (SB-INTROSPECT's WHO-* do). The walk
signals an error when another thread redefines a function under it; a fresh walk sees the new
definition, so it is tried again before the error is let through."
  (loop repeat 2
        do (handler-case (return-from walking-all-functions (funcall function))
             (error () nil)))
  (funcall function))

(defun xref-pairs (symbol kind package)
  "(name . definition-source) of each function that stands in relation KIND to SYMBOL."
  (flet ((check (ok control)
           (unless ok (fail control (name-text symbol package))))
         (who (walker)
           (walking-all-functions (lambda () (funcall walker symbol)))))
    (cond ((string= kind "calls") (who #'sb-introspect:who-calls))
          ((string= kind "references") (who #'sb-introspect:who-references))
          ((string= kind "binds") (who #'sb-introspect:who-binds))
          ((string= kind "sets") (who #'sb-introspect:who-sets))
          ((string= kind "macroexpands")
           (check (macro-function symbol) "~A is not a macro.")
           (who #'sb-introspect:who-macroexpands))
          ((string= kind "specializes")
           (check (find-class symbol nil) "~A is not a class.")
           ;; SBCL names these methods (METHOD NAME); the qualifiers and specializers are in
           ;; the source's description.
           (loop for (name . source) in (sb-introspect:who-specializes-directly symbol)
                 collect (cons (append (if (consp name) name (list name))
                                       (let ((describe (sbcl-symbol :definition-source-description)))
                                         (and source describe (fboundp describe) (funcall describe source))))
                               source)))
          (t
           (check (and (fboundp symbol) (not (macro-function symbol)) (not (special-operator-p symbol)))
                  "~A is not a function.")
           (function-callees symbol)))))

(defun source-order-key (pair)
  "Sorts definitions by file, then by place in the file, without reading any file."
  (let ((source (cdr pair)))
    (if (and source (sb-introspect:definition-source-pathname source))
        (list 0 (namestring (sb-introspect:definition-source-pathname source))
              (or (sb-introspect:definition-source-character-offset source)
                  (first (sb-introspect:definition-source-form-path source))
                  0))
        (list 1 "" 0))))

(defun key< (a b)
  (loop for x in a for y in b
        unless (equal x y)
          return (if (stringp x) (string< x y) (< x y))))

(defun own-function-name-p (name)
  "True for this helper's own functions: they call CAR too, but are none of the user's business."
  (let ((symbol (frame-function-symbol name)))
    (and symbol (eq (symbol-package symbol) (load-time-value (find-package '#:mcp-agent-helper))))))

(defun hit-location (caller source package)
  "Where xref's hit CALLER, with its SB-INTROSPECT SOURCE, is: a slot accessor's method, which
\"specializes\" lists as (METHOD NAME SPECIALIZERS...), says which DEFCLASS made it, as
find-definition's does."
  (let ((location (source-location source caller))
        (accessor (and (consp caller) (eq (first caller) 'method) (consp (rest caller))
                       (accessor-method-described (second caller) source))))
    (when (and accessor (getf location :file))
      (setf (getf location :made-by) (accessor-made-by accessor package)))
    location))

(define-entry (xref :caller :server :look t) (name kind &key package session token)
  "Plist: :SYMBOL, :KIND, :TOTAL and :HITS, each (:NAME :SOURCE location), in file order, at most
*MAX-XREF-HITS*; :REST, the handle of every hit's line (its name and file: finding the line in
the file is what the cap spares) and the offset of the first not listed (see REST-LISTING)."
  (let ((*handles* (session-handles session)))
   (run-tool token
            (lambda ()
              (let* ((lookup-package (tool-package package session))
                     (symbol (find-existing-symbol name lookup-package))
                     (package (or (symbol-package symbol) lookup-package))
                     (kind (or (find kind *xref-kinds* :test #'string-equal)
                               (fail "Unknown xref kind ~S: use ~{~A~^, ~}." kind *xref-kinds*)))
                     (pairs (remove-duplicates
                             (remove-if #'own-function-name-p (xref-pairs symbol kind package) :key #'car)
                             :test #'equal :key (lambda (pair) (cons (car pair) (source-order-key pair)))))
                     (shown (subseq (sort (copy-list pairs) #'key< :key #'source-order-key)
                                    0 (min (length pairs) *max-xref-hits*)))
                     (*file-octets* (make-hash-table :test 'equal)))
                (list :symbol (qualified-name symbol)
                      :kind (string-downcase kind)
                      :total (length pairs)
                      :hits (loop for (caller . source) in shown
                                  collect (list :name (name-text caller package)
                                                :source (if source
                                                            (hit-location caller source package)
                                                            (no-file-location caller))))
                      :rest (rest-listing
                             (loop for pair in (sort (copy-list pairs) #'key< :key #'source-order-key)
                                   for (caller . source) = pair
                                   collect (format nil "~A  ~A" (name-text caller package)
                                                   (let ((file (and source (sb-introspect:definition-source-pathname source))))
                                                     (if file (namestring file) "no file"))))
                             *max-xref-hits*)))))))
