;;;; The describe-symbol tool: everything a symbol names, with call syntax, documentation and
;;;; source.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; describe-symbol

(defun symbol-status-text (symbol package)
  "How SYMBOL is accessible: \"external in ALEXANDRIA\", \"internal in CL-USER\", and whether
it is also accessible in PACKAGE, where it was looked up."
  (let ((home (symbol-package symbol)))
    (if (null home)
        "uninterned"
        (format nil "~(~A~) in ~A~@[, accessible in ~A~]"
                (nth-value 1 (find-symbol (symbol-name symbol) home))
                (package-name home)
                (and (not (eq home package))
                     (eq symbol (find-symbol (symbol-name symbol) package))
                     (package-name package))))))

(defun method-text (method package)
  "A method as (NAME QUALIFIERS... (SPECIALIZERS...))."
  (let ((specializers (mapcar (lambda (specializer)
                                (typecase specializer
                                  (class (class-name specializer))
                                  (sb-mop:eql-specializer
                                   (list 'eql (sb-mop:eql-specializer-object specializer)))
                                  (t specializer)))
                              (sb-mop:method-specializers method))))
    (name-text (append (list (sb-mop:generic-function-name (sb-mop:method-generic-function method)))
                       (method-qualifiers method)
                       (list specializers))
               package)))

(defparameter *max-methods-listed* 30
  "Methods describe-symbol lists of one generic function; find-definition pages through them all.")

(defun sbcl-source-file-p (file)
  "True for a file of SBCL's own sources (its contribs, ASDF among them, included)."
  (let ((root (ignore-errors
               (let ((sources (translate-logical-pathname "SYS:SRC;")))
                 (namestring (make-pathname :directory (butlast (pathname-directory sources))
                                            :name nil :type nil :defaults sources))))))
    (and root (eql 0 (search root file)))))

(defun method-lines (function package)
  "\"Methods (N):\" and a line per method, with where it is defined: the user's methods first
(PRINT-OBJECT has some 180 of SBCL's), each group sorted; at most *MAX-METHODS-LISTED* lines."
  (let* ((methods (sb-mop:generic-function-methods function))
         (lines (mapcar #'cdr
                        (sort (mapcar (lambda (method)
                                        (let ((location (method-location method)))
                                          (cons (if (and location (sbcl-source-file-p (getf location :file))) 1 0)
                                                ;; Not found again in the file's text as the
                                                ;; definitions are: a changed file is said so.
                                                (format nil "  ~A~@[  ~A~]~@[ (~A)~]" (method-text method package)
                                                        (and location (file-location-text location))
                                                        (and location (getf location :note))))))
                                      methods)
                              (lambda (a b)
                                (or (< (car a) (car b))
                                    (and (= (car a) (car b)) (string< (cdr a) (cdr b))))))))
         (shown (subseq lines 0 (min *max-methods-listed* (length lines)))))
    (append (list (format nil "Methods (~D):" (length methods)))
            shown
            (when (> (length lines) (length shown))
              (list (format nil "  (~D more: find-definition lists them all)" (- (length lines) (length shown))))))))

(defun function-entry (name package)
  "The entry of the function NAME, a symbol or (SETF symbol)."
  (let* ((setf-name (consp name))
         (function (fdefinition name))
         (generic (typep function 'generic-function))
         (macro (and (not setf-name) (macro-function name))))
    (list :kind (cond ((and (not setf-name) (special-operator-p name)) "Special operator")
                      (macro "Macro")
                      (generic (if setf-name "Setf generic function" "Generic function"))
                      (t (if setf-name "Setf function" "Function")))
          :summary (call-syntax name package)
          :documentation (documentation-text name 'function)
          :details (and generic (method-lines function package))
          ;; The kind as find-definition labels it: the server finds the definition in the
          ;; file's current text the same way for both tools.
          :label (cond ((consp name) (format nil "function ~A" (name-text name package)))
                       (macro "macro")
                       (generic "generic function")
                       (t "function"))
          :source (cond (generic (generic-function-location function name package))
                        (t (definition-location name (if macro :macro :function)))))))

(defun variable-entry (symbol package)
  (let ((kind (variable-kind symbol)))
    (list :kind (ecase kind
                  (:special "Variable")
                  (:global "Global variable")
                  (:constant "Constant")
                  (:macro "Symbol macro"))
          :summary (if (eq kind :macro)
                       (format nil "~A expands to ~A" (name-text symbol package)
                               (print-briefly (macroexpand-1 symbol) :package package))
                       (format nil "~A = ~A" (name-text symbol package)
                               (if (boundp symbol)
                                   (print-briefly (symbol-value symbol) :package package)
                                   "(unbound)")))
          :documentation (documentation-text symbol 'variable)
          :details nil
          :label (case kind (:constant "constant") (:macro "symbol macro") (t "variable"))
          :source (definition-location symbol (case kind
                                            (:constant :constant)
                                            (:macro :symbol-macro)
                                            (t :variable))))))

(defun condition-class-p (class)
  (subtypep class (find-class 'condition)))

(defun class-entry (symbol package)
  (let* ((class (find-class symbol))
         (kind (typecase class
                 (structure-class :structure)
                 ((satisfies condition-class-p) :condition)
                 (t :class))))
    (list :kind "Class"
          :summary (format nil "~A, metaclass ~A (class-info shows its slots)"
                           (name-text symbol package) (name-text (class-name (class-of class)) package))
          :documentation (documentation-text symbol 'type)
          :details nil
          :label (second (assoc kind *definition-kinds*))
          :source (definition-location symbol kind))))

(defun type-entry (symbol package)
  (multiple-value-bind (expansion expanded) (ignore-errors (sb-ext:typexpand-1 symbol))
    (list :kind "Type"
          :summary (if expanded
                       (format nil "~A = ~A" (name-text symbol package) (print-briefly expansion :package package))
                       (name-text symbol package))
          :documentation (documentation-text symbol 'type)
          :details nil
          :label "type"
          :source (definition-location symbol :type))))

(define-entry (describe-symbol :caller :server :look t) (name &key package session token)
  "Plist: :SYMBOL (qualified), :STATUS (how it is accessible), :ENTRIES, one plist per thing the
symbol names (:KIND :SUMMARY :DOCUMENTATION :DETAILS :LABEL :SOURCE), the source a location plist
and the label its kind as find-definition names it."
  (run-tool token
            (lambda ()
              (let* ((*file-octets* (make-hash-table :test 'equal))
                     (lookup-package (tool-package package session))
                     (symbol (find-existing-symbol name lookup-package))
                     ;; Names print as seen from the symbol's own package: AREA, not SHAPES:AREA.
                     (package (or (symbol-package symbol) lookup-package))
                     (entries '()))
                (when (fboundp symbol)
                  (push (function-entry symbol package) entries))
                (when (fboundp (list 'setf symbol))
                  (push (function-entry (list 'setf symbol) package) entries))
                (when (and (variable-kind symbol) (not (keywordp symbol)))
                  (push (variable-entry symbol package) entries))
                (cond ((find-class symbol nil) (push (class-entry symbol package) entries))
                      ((type-kind symbol) (push (type-entry symbol package) entries)))
                (list :symbol (qualified-name symbol)
                      :status (symbol-status-text symbol lookup-package)
                      :entries (nreverse entries))))))
