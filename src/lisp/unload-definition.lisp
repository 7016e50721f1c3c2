;;;; edit-lisp-form's delete with load: removing a deleted definition from the image.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Removing a deleted definition from the image

(defun read-package-designator (text)
  "The package the designator TEXT (`:app`, `#:app`, `\"APP\"`, `app`) names."
  (let* ((designator (let ((*package* (find-package '#:keyword)) (*read-eval* nil))
                       (read-from-string text)))
         (name (and (typep designator '(or string symbol character)) (string designator))))
    (or (and name (find-package name))
        (fail "The file's IN-PACKAGE names the package ~A, which does not exist in the image: load the ~
               file that defines it first." text))))

(defun method-specializer (specializer)
  (cond ((and (consp specializer) (eq (first specializer) 'eql))
         (sb-mop:intern-eql-specializer
          (let ((object (second specializer)))
            (if (constantp object) (eval object) object))))
        ((symbolp specializer) (find-class specializer))
        (t specializer)))

(defun remove-defined-method (name rest)
  "Removes the method that (DEFMETHOD NAME . REST) defines. Returns the text that says so."
  (let* ((qualifiers (loop for x in rest until (listp x) collect x))
         (lambda-list (find-if #'listp rest))
         (required (loop for parameter in lambda-list
                         until (member parameter lambda-list-keywords)
                         collect (if (consp parameter) (second parameter) t)))
         (generic (and (fboundp name) (fdefinition name)))
         (method (and (typep generic 'generic-function)
                      (ignore-errors (find-method generic qualifiers (mapcar #'method-specializer required) nil)))))
    (if method
        (progn (remove-method generic method)
               (format nil "Removed the method ~A from the image." (package-qualified (list* name (append qualifiers (list required))))))
        (format nil "The image has no such method of ~A; nothing to remove." (package-qualified name)))))

(defun package-qualified (object)
  "OBJECT printed with every symbol's package prefix: LOADTEST::HELPER."
  (print-briefly object :package (load-time-value (find-package '#:keyword))))

(defun undefine-form (form)
  "Undoes in the image what loading FORM, a definition, did, where that can sensibly be done.
Returns the text that says what happened."
  (let* ((operator (and (consp form) (symbolp (first form)) (symbol-name (first form))))
         (name (and (consp form) (consp (rest form)) (second form)))
         (function-name-p (or (symbolp name) (and (consp name) (eq (first name) 'setf)))))
    (cond
      ((and (member operator '("DEFUN" "DEFGENERIC" "DEFMACRO") :test #'string=) function-name-p name)
       (if (fboundp name)
           (let ((macro (and (symbolp name) (macro-function name))))
             (journal (if macro :macro :function) name :previous (or macro (fdefinition name)))
             (fmakunbound name)
             (format nil "~A is no longer defined in the image (undo can put it back)." (package-qualified name)))
           (format nil "~A was not defined in the image; nothing to remove." (package-qualified name))))
      ((and (string= operator "DEFMETHOD") function-name-p name)
       (remove-defined-method name (cddr form)))
      ((and (member operator '("DEFVAR" "DEFPARAMETER") :test #'string=) (symbolp name) name)
       (if (boundp name)
           (progn (makunbound name)
                  (format nil "~A is now unbound in the image (it stays declared special)." (package-qualified name)))
           (format nil "~A was not bound in the image; nothing to remove." (package-qualified name))))
      ((member operator '("DEFCLASS" "DEFSTRUCT" "DEFINE-CONDITION") :test #'string=)
       (format nil "Nothing was undone in the image: a class cannot sensibly be removed (its instances, ~
                    subclasses and methods refer to it), so ~A stays defined until the image restarts."
               (package-qualified (if (consp name) (first name) name))))
      (t
       (format nil "Nothing was undone in the image: there is no sensible way to remove what ~A ~A defined; ~
                    it stays until the image restarts."
               (or operator "this form") (package-qualified name))))))

(define-entry (unload-definition :caller :server) (text &key package session token)
  "Removes from the image what the definition TEXT (read in the package the designator text
PACKAGE names, or CL-USER) defined, for edit-lisp-form's delete with load. Returns (:NOTE text)."
  (declare (ignore session))
  (run-tool token
            (lambda ()
              (let* ((*package* (if package (read-package-designator package) (find-package '#:common-lisp-user)))
                     (form (let ((*read-eval* nil)) (read-from-string text))))
                (list :note (undefine-form form))))))
