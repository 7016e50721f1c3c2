;;;; Sessions: the REPL state of one client, kept apart from the user's own REPL.
;;;;
;;;; Loaded after conditions.lisp, under the rules of package.lisp.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Sessions: the REPL state of one client, kept apart from the user's own REPL

(defvar *sessions* (make-hash-table :test 'equal :synchronized t))

(defparameter *history-variables* '(* ** *** + ++ +++ / // /// -)
  "The REPL variables a session keeps for itself, so that the agent's * is not the user's *.")

(defclass session ()
  ((package-name :initform "COMMON-LISP-USER" :accessor session-package-name)
   ;; Concurrent calls of one session each work on their own bindings; the last to finish
   ;; writes its history back, as two REPL listeners sharing globals would.
   (history :initform (mapcar (constantly nil) *history-variables*) :accessor session-history)))

(defun find-session (id)
  (or (gethash id *sessions*)
      (setf (gethash id *sessions*) (new 'session))))

(defun find-package-loosely (name)
  "The package NAME names, written as the user likes: INVENTORY, inventory, :inventory, #:inventory
or \"inventory\" (package names are usually upper case; the prefixes and quotes are how Lisp
code writes a package designator)."
  (let* ((trimmed (string-trim '(#\Space #\Tab #\Newline #\Return) name))
         (bare (cond ((and (> (length trimmed) 2) (string= "#:" trimmed :end2 2)) (subseq trimmed 2))
                     ((and (> (length trimmed) 1) (char= #\: (char trimmed 0))) (subseq trimmed 1))
                     ((and (> (length trimmed) 2) (char= #\" (char trimmed 0))
                           (char= #\" (char trimmed (1- (length trimmed)))))
                      (subseq trimmed 1 (1- (length trimmed))))
                     (t trimmed))))
    (or (find-package name) (find-package bare) (find-package (string-upcase bare)))))

(defun record-history (form values)
  "Updates the REPL variables as the standard REPL does after evaluating FORM."
  (setf +++ ++ ++ + + form
        /// // // / / values
        *** ** ** * * (first values)))
