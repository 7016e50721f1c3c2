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

(handler-case
    ;; Compiling swank the first time prints pages of notes; they belong on stderr.
    (let ((*standard-output* *error-output*))
      (load (env "SWANK_MCP_LOADER"))
      (funcall (read-from-string "swank-loader:init")))
  (error (e) (fail "loading swank" e)))

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
