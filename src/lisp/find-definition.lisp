;;;; The find-definition tool: every definition of a symbol at file:line:column, with its text on
;;;; request.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; find-definition

(defun definition-label (kind source package)
  "A definition's kind, with a method's qualifiers and specializers."
  (let ((label (second (assoc kind *definition-kinds*)))
        (description (let ((accessor (sbcl-symbol :definition-source-description)))
                       (and accessor (fboundp accessor) (funcall accessor source)))))
    (if (and (eq kind :method) description)
        (format nil "~A ~A" label (name-text description package))
        label)))

(define-entry (find-definition :caller :server :look t) (name &key package session token (offset 0) (limit most-positive-fixnum))
  "Plist: :SYMBOL; :NAMES, what the symbol names; :TOTAL, how many definitions it has;
:DEFINITIONS, each (:KIND label :SOURCE location) from the OFFSETth on, at most LIMIT, the
location a plist as SOURCE-LOCATION gives it. Only those are located in their files, so a symbol
with a great many definitions (a generic function of 400,000 methods) costs a page's worth."
  (run-tool token
            (lambda ()
              (let* ((lookup-package (tool-package package session))
                     (symbol (find-existing-symbol name lookup-package))
                     (package (or (symbol-package symbol) lookup-package))
                     (*file-octets* (make-hash-table :test 'equal))
                     (seen (make-hash-table :test 'equal))
                     (found '()))
                ;; The same definition can come back under two kinds (a generic function as a
                ;; function too): one entry per label and place, decided without reading files.
                (flet ((add (kind name source)
                         (let ((key (list (second (assoc kind *definition-kinds*))
                                          (let ((accessor (sbcl-symbol :definition-source-description)))
                                            (and (eq kind :method) accessor (fboundp accessor) (funcall accessor source)))
                                          (consp name)
                                          (ignore-errors (namestring (sb-introspect:definition-source-pathname source)))
                                          (sb-introspect:definition-source-form-path source)
                                          (sb-introspect:definition-source-character-offset source))))
                           (unless (gethash key seen)
                             (setf (gethash key seen) t)
                             (push (list kind name source) found)))))
                  (loop for (kind) in *definition-kinds*
                        do (dolist (source (ignore-errors (sb-introspect:find-definition-sources-by-name symbol kind)))
                             (add kind symbol source)))
                  (when (fboundp (list 'setf symbol))
                    (dolist (source (ignore-errors (sb-introspect:find-definition-sources-by-name
                                                    (list 'setf symbol) :function)))
                      (add :function (list 'setf symbol) source))))
                (setf found (nreverse found))
                (list :symbol (qualified-name symbol)
                      :names (symbol-kinds symbol)
                      :total (length found)
                      :definitions
                      (loop for (kind name source) in (nthcdr offset found)
                            repeat limit
                            collect (let ((label (definition-label kind source package)))
                                      (list :kind (if (consp name)
                                                      (format nil "~A ~A" label (name-text name package))
                                                      label)
                                            :source (definition-source-location kind name source package)))))))))

(defun definition-source-location (kind name source package)
  "Where find-definition's definition of KIND, NAME, with SB-INTROSPECT's SOURCE, is: a generic
function with no file of its own (a slot accessor's, or one made by DEFMETHOD alone) is where
describe-symbol and inspect place it too (see GENERIC-FUNCTION-LOCATION); a slot accessor's
method says which DEFCLASS made it, as its generic function does."
  (cond ((and (member kind '(:generic-function :function))
              (null (sb-introspect:definition-source-pathname source))
              (fboundp name)
              (typep (fdefinition name) 'generic-function))
         (generic-function-location (fdefinition name) name package))
        ((eq kind :method)
         (let ((location (source-location source name))
               (accessor (accessor-method-described name source)))
           (when (and accessor (getf location :file))
             (setf (getf location :made-by) (accessor-made-by accessor package)))
           location))
        (t (source-location source name))))
