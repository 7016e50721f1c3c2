;;;; lisp-status: facts about the image only it can give (threads, memory, features, the tool
;;;; calls running), and what is wrong with it that the person should know: SBCL internals the
;;;; helper names that this SBCL lacks (sbcl.lisp), and a server's sentinel thread stuck in a
;;;; debugger.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; lisp-status

(defparameter *notable-features*
  '(:x86-64 :arm64 :x86 :ppc64 :riscv :64-bit :linux :darwin :bsd :win32 :unix
    :sb-thread :sb-unicode :sb-core-compression :asdf3 :quicklisp)
  "Features worth naming in a status line, with the servers' (SERVER-FEATURES); the rest are
counted.")

(defun listed-thread-number (server-thread-id)
  "The threads tool's number of the thread the server knows by SERVER-THREAD-ID, or NIL."
  (let ((thread (ignore-errors (backend-find-thread server-thread-id))))
    (and (typep thread 'sb-thread:thread) (thread-number thread))))

;;; A server's sentinel stuck in a debugger
;;;
;;; swank's and slynk's sentinel thread closes the connections whose client went away. When a close
;;; fails (swank 2.27 flushes a dead client's socket, and the flush's broken pipe is an error) the
;;; sentinel stops in a debugger and never serves again: every connection made after that leaks
;;; its two threads. swank-mcp's own clients no longer cause it (CLOSE-CONNECTION-QUIETLY in
;;; image-threads.lisp), but an image may have had it happen before, or from another client.
;;; Seen from outside, without touching the thread: the server's registry names its sentinel,
;;; and the thread's own bindings say whether a debugger runs in it.

(defun sbcl-debugger-level-p (thread)
  "True when THREAD runs SBCL's own debugger (a server's debugger with no connection to go to
falls back on it)."
  (let ((in-debugger (sbcl-symbol :*in-the-debugger*)))
    (and in-debugger (sb-thread:symbol-value-in-thread in-debugger thread nil))))

(defun stuck-sentinels ()
  "Each server's sentinel thread that waits in a debugger, as \"number name how it waits\"."
  (loop for server in (servers)
        for thread = (server-sentinel server)
        for waiting = (and (typep thread 'sb-thread:thread)
                           (sb-thread:thread-alive-p thread)
                           (ignore-errors (or (debugger-text thread)
                                              (and (sbcl-debugger-level-p thread) "waits in SBCL's debugger"))))
        when waiting
          collect (format nil "~D ~S ~A" (thread-number thread) (safe-princ (sb-thread:thread-name thread))
                          waiting)))

;;; ------------------------------------------------------------------------------------------
;;; The entry

(define-entry (status :caller :server :look t) (&key session token debugger-threads)
  "Facts about the image only it can give: threads, the session's package, features, memory,
:TOOL-CALLS, the other tool calls running in it, and :DEBUGGER-THREADS, the threads tool's numbers
of the threads the server knows by the ids DEBUGGER-THREADS; and what the person should know is
wrong: :STUCK-SENTINELS, the servers' sentinel threads stuck in a debugger (see STUCK-SENTINELS),
and :MISSING-INTERNALS, SBCL's internals the helper names that this SBCL lacks (sbcl.lisp)."
  (run-tool token
            (lambda ()
              (let ((session (find-session session))
                    (asdf (find-package '#:asdf)))
                (list :threads (length (sb-thread:list-all-threads))
                      :package (session-package-name session)
                      :implementation (lisp-implementation-type)
                      :version (lisp-implementation-version)
                      :machine (machine-type)
                      :software (format nil "~A ~A" (software-type) (software-version))
                      :features (mapcar #'qualified-name (remove-if-not (lambda (f) (member f *features*))
                                                                         (append *notable-features*
                                                                                 (server-features))))
                      :feature-count (length *features*)
                      :heap-used (sbcl-call :dynamic-usage)
                      :missing-internals (missing-internals)
                      :stuck-sentinels (stuck-sentinels)
                      :heap-size (sb-ext:dynamic-space-size)
                      :asdf (and asdf
                                 (let ((version (find-symbol "ASDF-VERSION" asdf)))
                                   (and version (fboundp version) (ignore-errors (funcall version)))))
                      :quicklisp (and (find-package '#:ql) t)
                      :tool-calls (sb-thread:with-mutex (*registry-lock*)
                                    ;; Not counting this call itself.
                                    (max 0 (1- (hash-table-count *running*))))
                      :debugger-threads (mapcar #'listed-thread-number debugger-threads)
                      :stopped-threads (loop for thread in (sb-thread:list-all-threads)
                                             for waiting = (and (not (sb-thread:symbol-value-in-thread
                                                                      '*parked* thread nil))
                                                                (ignore-errors (debugger-text thread)))
                                             when waiting
                                               collect (format nil "~D ~S ~A" (thread-number thread)
                                                               (safe-princ (sb-thread:thread-name thread))
                                                               waiting)))))))
