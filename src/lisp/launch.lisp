;;;; Starts a private swank server for `swank-mcp --launch` and for the test suite.
;;;;
;;;; Fed to `sbcl` on standard input; everything it needs comes from the environment, so no
;;;; path or port is ever pasted into Lisp source. The image lives exactly as long as its
;;;; standard input stays open: the process that started it holds the pipe, and when that
;;;; process exits for any reason (even SIGKILL) the pipe closes and the image exits too.
;;;;
;;;; Not run with --script or --disable-debugger: both would change how the image treats errors
;;;; in the user's own threads (the first makes stack exhaustion fatal).

(defpackage #:mcp-agent-launch (:use #:common-lisp))
(in-package #:mcp-agent-launch)

(defun env (name &optional default)
  (let ((value (sb-ext:posix-getenv name)))
    (if (and value (plusp (length value))) value default)))

(defun fail (what condition)
  (format *error-output* "~&swank-mcp: ~A failed: ~A~%" what condition)
  (finish-output *error-output*)
  (sb-ext:exit :code 1 :abort t))

(defun swank-fasls-missing-p ()
  "Whether swank-loader will compile swank (its first start here): true when the fasl of one of
its core files is missing. Asks swank-loader's internals, so anything unexpected there counts as
not knowing, which says nothing."
  (ignore-errors
   (let ((package (find-package '#:swank-loader)))
     (flet ((internal (name) (find-symbol name package)))
       (let ((files (symbol-value (internal "*SWANK-FILES*")))
             (source (symbol-value (internal "*SOURCE-DIRECTORY*")))
             (fasl (symbol-value (internal "*FASL-DIRECTORY*"))))
         (some (lambda (source-file)
                 (not (probe-file (funcall (internal "BINARY-PATHNAME") source-file fasl))))
               (funcall (internal "SRC-FILES") files source)))))))

(handler-case
    ;; Compiling swank the first time prints pages of notes; they belong on stderr, which the
    ;; launcher sends to its log file.
    (let ((*standard-output* *error-output*))
      (load (env "SWANK_MCP_LOADER"))
      (when (swank-fasls-missing-p)
        ;; The launcher tells the user that this start takes a minute.
        (format sb-sys:*stdout* "~&swank-mcp-compiling~%")
        (finish-output sb-sys:*stdout*))
      (funcall (read-from-string "swank-loader:init")))
  (error (e) (fail "loading swank" e)))

;; Loading swank leaves the image past the point where it collects garbage (some 58 MB in use
;; against SBCL's 54 MB between collections), so the first request would pay for a 25-30 ms
;; collection of swank's own leftovers; it is paid here, before the port is announced.
(sb-ext:gc :full t)

(handler-case
    (let ((port (funcall (read-from-string "swank:create-server")
                         :port (parse-integer (env "SWANK_MCP_PORT" "0"))
                         :interface (env "SWANK_MCP_INTERFACE" "127.0.0.1")
                         :dont-close t)))
      ;; The launcher reads this line to learn the port (the tests ask for port 0).
      (format t "~&swank-mcp-port: ~D~%" port)
      (finish-output))
  (error (e) (fail "starting the swank server" e)))

(progn
  (loop while (read-line *standard-input* nil nil))
  (sb-ext:exit :abort t))
