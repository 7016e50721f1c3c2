;;;; The macroexpand-form tool: expands a form one step, or every macro in it, running none of its
;;;; code.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; macroexpand-form

(defun circular-p (object)
  "True when OBJECT, a form, contains itself through its conses or arrays. (Shared structure is
not circular.)"
  (let ((on-path (make-hash-table :test 'eq))
        (done (make-hash-table :test 'eq)))
    (labels ((walk (x)
               (let ((chain '()))
                 (loop while (and (graph-node-p x) (not (gethash x done)))
                       do (when (gethash x on-path) (return-from circular-p t))
                          (setf (gethash x on-path) t)
                          (push x chain)
                          (if (consp x)
                              (progn (walk (car x))
                                     (setf x (cdr x)))
                              (progn (map-children #'walk x)
                                     (return))))
                 (dolist (node chain)
                   (remhash node on-path)
                   (setf (gethash node done) t)))))
      (walk object)
      nil)))

(defun read-single-form (text)
  "The one form in TEXT, or NIL and a message saying why it could not be read."
  (let ((eof '#:eof)
        (*read-eval* nil))
    (with-input-from-string (in text)
      (let* ((start (skip-layout text 0))
             (form (handler-case (read in nil eof)
                     (error (e)
                       (return-from read-single-form
                         (values nil (getf (read-failure e text start (file-position in)) :message)))))))
        (when (eq form eof)
          (return-from read-single-form (values nil "there is no form to expand")))
        (remember-form form)
        (let ((next (skip-layout text (file-position in))))
          (when (< next (length text))
            (multiple-value-bind (line column) (line-and-column text next)
              (return-from read-single-form
                (values nil (format nil "expected one form, but more follows at line ~D, column ~D"
                                    line column))))))
        form))))

(defun macro-error-report (condition)
  "The contract's [ERROR] TYPE block for a macro that signalled: the condition's exact type as
the user would type it, and its message; the macro's internals are no backtrace worth reading."
  (let ((report (condition-report :error condition nil)))
    (setf (getf report :type)
          (let ((*package* (find-package '#:common-lisp-user)))
            (prin1-to-string (type-of condition))))
    report))

(defun expansion-report (form full max-output)
  "The plist EXPAND-FORM returns for FORM, read."
  (multiple-value-bind (expansion expanded)
      (handler-case (let ((neutral (neutralize form)))
                      (when (circular-code-p neutral)
                        (error 'circular-code :form form))
                      (if full
                          ;; The walker gives back the very form when no macro is in it.
                          (let ((walked (sb-cltl2:macroexpand-all neutral)))
                            (values (rearm walked) (not (eq walked neutral))))
                          (multiple-value-bind (expansion expanded) (macroexpand-1 neutral)
                            (values (rearm expansion) expanded))))
        (error (e)
          (return-from expansion-report (list :error (macro-error-report e)))))
    (let ((output (make-capture max-output :tail nil)))
      (let ((*print-case* :downcase) (*print-pretty* t)
            (*print-circle* (circular-p expansion))
            (*print-readably* nil) (*print-length* nil) (*print-level* nil)
            (*print-lines* nil) (*print-right-margin* nil))
        (prin1 expansion output))
      (list :form (let ((*print-case* :upcase)) (print-form-briefly form))
            :expansion (capture-report output)
            :expanded (and expanded t)))))

(define-entry (expand-form :caller :server) (text &key full package session token (max-output 65536))
  "Expands the form TEXT for the macroexpand-form tool: one step (MACROEXPAND-1), or every macro
anywhere in it when FULL. Returns (:FORM header-text :EXPANSION (text dropped) :EXPANDED bool),
(:READ-ERROR message), or (:ERROR report) when the macro signalled."
  (let ((*max-output* max-output)
        (*handles* (session-handles session)))
   (run-tool token
            (lambda ()
              (let ((package (tool-package package session)))
                (running-no-request-code
                  (leaving-image-unchanged (text package)
                    (let ((*package* package))
                      (multiple-value-bind (form read-error) (read-single-form text)
                        (if read-error
                            (list :read-error read-error)
                            (progn (note-request-code form)
                                   (expansion-report form full max-output))))))))))))
