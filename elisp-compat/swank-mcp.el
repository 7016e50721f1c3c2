;;; swank-mcp.el --- Let an AI agent work in your SLIME or SLY Lisp image  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The swank-mcp authors

;; Author: The swank-mcp authors
;; Version: 0.1.0
;; Package-Requires: ((emacs "26.1"))
;; Keywords: lisp, tools, processes
;; SPDX-License-Identifier: MIT

;; This file is not part of GNU Emacs.

;;; Commentary:

;; swank-mcp is an MCP server that lets an AI agent (Claude Code, Claude
;; Desktop, Cursor, VS Code, ...) evaluate code in a live Common Lisp image
;; through the image's swank (SLIME) or slynk (SLY) server.
;;
;; An image started by M-x slime or M-x sly serves Emacs on a port of its
;; own, which accepts that one connection.  `swank-mcp-start' opens a second,
;; persistent server in the image of the current SLIME or SLY connection, for
;; swank-mcp to attach to, and shows the client configuration to paste:
;;
;;   M-x swank-mcp-start     open the port (`swank-mcp-port', or the next free
;;                           one) and show the configuration
;;   M-x swank-mcp-status    say which ports are open, in which images
;;   M-x swank-mcp-stop      close the port of the current connection
;;
;; The agent then works in the same image as you: what it defines you can
;; call from your REPL, and the other way round.  Output of its evaluations
;; comes back to the agent and does not appear in your REPL.
;;
;; `swank-mcp-start' is also a function: it returns the port, so that
;; Lisp code (an init file, a project's .dir-locals.el hook) can open the
;; port after connecting.

;;; Code:

(require 'cl-lib)
(require 'json)

(defgroup swank-mcp nil
  "Open a swank or slynk port in the current Lisp image for swank-mcp."
  :group 'lisp
  :prefix "swank-mcp-")

(defcustom swank-mcp-port 4005
  "Port `swank-mcp-start' opens; the next free one is used when it is taken."
  :type 'integer
  :group 'swank-mcp)

(defcustom swank-mcp-port-attempts 20
  "How many consecutive ports, from `swank-mcp-port' on, to try."
  :type 'integer
  :group 'swank-mcp)

(defcustom swank-mcp-program "swank-mcp"
  "The swank-mcp command, as the MCP clients should run it.
Give an absolute file name when it is not on the clients' PATH."
  :type 'string
  :group 'swank-mcp)

(defcustom swank-mcp-server-name "swank"
  "The name under which the shown configurations register swank-mcp."
  :type 'string
  :group 'swank-mcp)

(defconst swank-mcp--buffer-name "*swank-mcp*"
  "The buffer that shows the client configuration.")

;; SLIME and SLY are both optional: only the one the user runs is loaded.
(declare-function slime-current-connection "ext:slime" ())
(declare-function slime-eval "ext:slime" (sexp &optional package))
(declare-function slime-connection-name "ext:slime" (&optional process))
(declare-function slime-pid "ext:slime" (&optional process))
(declare-function sly-current-connection "ext:sly" ())
(declare-function sly-eval "ext:sly" (sexp &optional package cancel-on-input cancel-on-input-retval))
(declare-function sly-connection-name "ext:sly" (&optional process))
(declare-function sly-pid "ext:sly" (&optional process))

(cl-defstruct (swank-mcp--backend (:constructor swank-mcp--make-backend)
                                  (:copier nil))
  "How to talk to the Lisp image through one Emacs front end."
  name                 ; "SLIME" or "SLY"
  current-connection   ; function returning the current connection or nil
  eval                 ; function evaluating a form in the dispatching connection
  dispatching-variable ; variable that selects the connection `eval' uses
  connection-name      ; function of a connection
  pid                  ; function of a connection
  create-server        ; the server's own function symbols
  stop-server
  servers)             ; the server's list of listening servers (internal, same in both)

(defconst swank-mcp--slime
  (swank-mcp--make-backend
   :name "SLIME"
   :current-connection #'slime-current-connection
   :eval #'slime-eval
   :dispatching-variable 'slime-dispatching-connection
   :connection-name #'slime-connection-name
   :pid #'slime-pid
   :create-server 'swank:create-server
   :stop-server 'swank:stop-server
   :servers 'swank::*servers*))

(defconst swank-mcp--sly
  (swank-mcp--make-backend
   :name "SLY"
   :current-connection #'sly-current-connection
   :eval #'sly-eval
   :dispatching-variable 'sly-dispatching-connection
   :connection-name #'sly-connection-name
   :pid #'sly-pid
   :create-server 'slynk:create-server
   :stop-server 'slynk:stop-server
   :servers 'slynk::*servers*))

(defvar swank-mcp--servers nil
  "The servers `swank-mcp-start' opened: a list of (CONNECTION BACKEND PORT).")

(defun swank-mcp--connection-of (backend)
  "The current connection of BACKEND, if it is loaded and connected."
  (let ((current (swank-mcp--backend-current-connection backend)))
    (and (fboundp current)
         (let ((connection (funcall current)))
           (and connection (process-live-p connection) connection)))))

(defun swank-mcp--current ()
  "The current Lisp connection as (CONNECTION . BACKEND), or nil.
In a buffer where SLY is active SLY comes first, elsewhere SLIME."
  (let ((order (if (bound-and-true-p sly-mode)
                   (list swank-mcp--sly swank-mcp--slime)
                 (list swank-mcp--slime swank-mcp--sly))))
    (cl-loop for backend in order
             for connection = (swank-mcp--connection-of backend)
             when connection return (cons connection backend))))

(defun swank-mcp--require-current ()
  "Like `swank-mcp--current', but signals a `user-error' without a connection."
  (or (swank-mcp--current)
      (user-error "No SLIME or SLY connection: start one with M-x slime or M-x sly first")))

(defun swank-mcp--eval (connection backend form)
  "Evaluate FORM through BACKEND in the image of CONNECTION and return its value."
  (cl-progv (list (swank-mcp--backend-dispatching-variable backend)) (list connection)
    (funcall (swank-mcp--backend-eval backend) form)))

(defun swank-mcp--forget-closed ()
  "Drop the servers whose Emacs connection has closed."
  (setq swank-mcp--servers
        (cl-remove-if-not (lambda (server) (process-live-p (car server)))
                          swank-mcp--servers)))

(defun swank-mcp--describe-connection (connection backend)
  "A short description of CONNECTION of BACKEND for messages."
  (format "%s connection `%s' (pid %s)" (swank-mcp--backend-name backend)
          (funcall (swank-mcp--backend-connection-name backend) connection)
          (funcall (swank-mcp--backend-pid backend) connection)))

(defun swank-mcp--open-server (connection backend)
  "Open a persistent server in the image of CONNECTION; return its port.
BACKEND says how to reach the image.  Tries `swank-mcp-port' and the ports
after it, in the image itself, where a taken port shows as an error."
  ;; Every symbol is package-qualified: the server reads requests in a
  ;; package that uses nothing.  The variable may stay unqualified.
  ;; The new server's listening thread registers it a moment after
  ;; create-server returns, and a stop-server that arrives first is lost:
  ;; wait for the registration (a second at most).
  (swank-mcp--eval
   connection backend
   `(cl:let ((port (cl:loop for port from ,swank-mcp-port
                            below ,(+ swank-mcp-port swank-mcp-port-attempts)
                            do (cl:handler-case
                                   (cl:return (,(swank-mcp--backend-create-server backend)
                                               :port port :dont-close t))
                                 (cl:error nil nil)))))
      (cl:loop repeat 100
               until (cl:or (cl:null port)
                            (cl:find port ,(swank-mcp--backend-servers backend) :key 'cl:second))
               do (cl:sleep 0.01))
      port)))

;;;###autoload
(defun swank-mcp-start (&optional interactive)
  "Open a persistent swank or slynk server for swank-mcp; return its port.
The server is opened in the image of the current SLIME or SLY connection on
`swank-mcp-port', or on the next free port when that one is taken, and
keeps accepting connections (:dont-close t).  When one is already open in
that image, its port is returned.  The configuration for MCP clients is put
in the buffer *swank-mcp*, which is shown when INTERACTIVE is non-nil (as
it is when called as a command)."
  (interactive (list t))
  (swank-mcp--forget-closed)
  (pcase-let* ((`(,connection . ,backend) (swank-mcp--require-current))
               (port (or (nth 2 (assq connection swank-mcp--servers))
                         (swank-mcp--open-server connection backend))))
    (unless (integerp port)
      (error "No free port in %d-%d for the swank-mcp server"
             swank-mcp-port (+ swank-mcp-port swank-mcp-port-attempts -1)))
    (unless (assq connection swank-mcp--servers)
      (push (list connection backend port) swank-mcp--servers))
    (swank-mcp--show-configuration port (swank-mcp--describe-connection connection backend) interactive)
    (when interactive
      (message "swank-mcp: port %d is open; the client configuration is in %s" port swank-mcp--buffer-name))
    port))

;;;###autoload
(defun swank-mcp-stop ()
  "Close the server `swank-mcp-start' opened in the current connection's image.
Clients already attached stay connected until they disconnect.
Return the port closed, or nil when none was open."
  (interactive)
  (swank-mcp--forget-closed)
  (pcase-let* ((`(,connection . ,backend) (swank-mcp--require-current))
               (server (assq connection swank-mcp--servers)))
    (if (not server)
        (progn (message "swank-mcp: no port is open in this image") nil)
      (let ((port (nth 2 server)))
        (swank-mcp--eval connection backend `(,(swank-mcp--backend-stop-server backend) ,port))
        (setq swank-mcp--servers (delq server swank-mcp--servers))
        (message "swank-mcp: closed port %d" port)
        port))))

;;;###autoload
(defun swank-mcp-status ()
  "Say which swank-mcp ports are open, in which images.
Return a list of (PORT . DESCRIPTION), one per open port."
  (interactive)
  (swank-mcp--forget-closed)
  (let ((open (mapcar (lambda (server)
                        (cons (nth 2 server)
                              (swank-mcp--describe-connection (nth 0 server) (nth 1 server))))
                      swank-mcp--servers)))
    (message "%s"
             (if open
                 (mapconcat (lambda (entry) (format "swank-mcp: port %d open in the %s" (car entry) (cdr entry)))
                            open "\n")
               "swank-mcp: no port is open (M-x swank-mcp-start opens one)"))
    open))

(defun swank-mcp-client-configuration (port)
  "The configuration for MCP clients to attach swank-mcp to PORT, as text."
  (let* ((args (list "--port" (number-to-string port)))
         (server `((command . ,swank-mcp-program) (args . ,(vconcat args))))
         (claude (mapconcat #'shell-quote-argument
                            (append (list "claude" "mcp" "add" "--transport" "stdio" swank-mcp-server-name "--"
                                          swank-mcp-program)
                                    args)
                            " ")))
    (concat
     "Claude Code:\n  " claude "\n\n"
     "Claude Desktop (claude_desktop_config.json), Cursor (.cursor/mcp.json), a project's .mcp.json:\n  "
     (json-encode `((mcpServers . ((,swank-mcp-server-name . ,server))))) "\n\n"
     "VS Code (.vscode/mcp.json):\n  "
     (json-encode `((servers . ((,swank-mcp-server-name . ((type . "stdio") ,@server))))))
     "\n")))

(defun swank-mcp--show-configuration (port where display)
  "Fill the *swank-mcp* buffer for PORT opened in WHERE; show it when DISPLAY."
  (with-current-buffer (get-buffer-create swank-mcp--buffer-name)
    (special-mode)
    (let ((inhibit-read-only t))
      (erase-buffer)
      (insert (format "swank-mcp can attach on port %d to the image of the %s.\n\n" port where)
              (swank-mcp-client-configuration port)
              "\nM-x swank-mcp-stop closes the port; M-x swank-mcp-status lists open ones.\n"))
    (goto-char (point-min))
    (when display
      (display-buffer (current-buffer)))))

(provide 'swank-mcp)

;;; swank-mcp.el ends here
