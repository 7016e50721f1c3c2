;;; swank-mcp.el --- Let an AI agent work in your SLIME or SLY Lisp image  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The swank-mcp authors

;; Author: The swank-mcp authors
;; Version: 0.1.0
;; Package-Requires: ((emacs "26.1"))
;; Keywords: lisp, tools, processes
;; URL: https://github.com/swank-mcp/swank-mcp
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
;; Keeping the human in charge of what the agent does in the image:
;;
;;   M-x swank-mcp-activity  a buffer (one per connection) showing every tool
;;                           call the agents make in this image, with its
;;                           state; RET shows the text the agent received
;;   M-x swank-mcp-cancel-call
;;                           end the agent's newest call (in the activity
;;                           buffer, C-c C-c ends the call at point); the
;;                           agent is told that you cancelled it
;;   M-x swank-mcp-undo      what the agents defined, to put back what it
;;                           replaced (asking first)
;;   M-x swank-mcp-approval-mode
;;                           calls that swank-mcp runs with --confirm wait for
;;                           your answer, shown with their code or diff in a
;;                           window of their own that does not take your keys:
;;                           there C-c C-c runs the call, C-c C-k declines it,
;;                           C-c C-a runs it and allows the tool for the rest
;;                           of the agent's session (after asking you)
;;   M-x swank-mcp-show-approval
;;                           go to the prompt of the calls waiting
;;   M-x swank-mcp-revoke-session-allowances
;;                           take back every "allow for the session"
;;   M-x swank-mcp-clear-breakpoints
;;                           remove every breakpoint the agents set (the
;;                           activity buffer shows them, the threads that
;;                           stop at them, and the threads an agent attaches
;;                           to, such as one waiting in your SLDB)
;;
;; In swank-mcp's own buffers, and once it is turned on (as a contrib,
;; `(slime-setup '(slime-fancy swank-mcp))' or `swank-mcp' in `sly-contribs',
;; or M-x swank-mcp-setup) in SLIME and SLY buffers, the SLIME REPL included,
;; these are under C-c C-x m (`swank-mcp-key-prefix'): a activity, c cancel,
;; u undo, m approval mode, p the prompt, r revoke, b clear the breakpoints,
;; s start, q stop, i status.
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
(require 'subr-x)

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

(defconst swank-mcp--approval-buffer-name "*swank-mcp approval*"
  "The buffer that shows a call waiting for approval.")

(defvar swank-mcp--approvals nil
  "Calls waiting for approval: a list of (CONNECTION BACKEND PLIST), oldest first.")

(defcustom swank-mcp-key-prefix (kbd "C-c C-x m")
  "The key of `swank-mcp-command-map' in SLIME's, SLY's and swank-mcp's buffers.
It is bound in `slime-mode-map', `slime-repl-mode-map' (the SLIME REPL,
which has no `slime-mode'), `sly-mode-map' and the maps of swank-mcp's own
buffers.
The default is under the prefix of SLIME's and SLY's own commands for
threads and connections, where neither binds m.  Set it before swank-mcp
is loaded and turned on; nil binds nothing."
  :type '(choice key-sequence (const :tag "No binding" nil))
  :group 'swank-mcp)

(cl-defstruct (swank-mcp--backend (:constructor swank-mcp--make-backend)
                                  (:copier nil))
  "How to talk to the Lisp image through one Emacs front end."
  name                 ; "SLIME" or "SLY"
  current-connection   ; function returning the current connection or nil
  default-connection   ; variable holding the connection used where no other is chosen
  eval                 ; function evaluating a form in the dispatching connection
  eval-async           ; the same, calling a continuation with the value
  connections          ; variable listing the open connections
  dispatching-variable ; variable that selects the connection `eval' uses
  thread-variable      ; variable that selects the image's thread a request runs in
  connection-name      ; function of a connection
  pid                  ; function of a connection
  create-server        ; the server's own function symbols
  stop-server
  servers              ; the server's list of listening servers (internal, same in both)
  server-package       ; the server's package and its backend's, as written in forms
  server-backend
  make-channel         ; the front end's channels, which the image sends messages down
  close-channel
  channel-id
  channel-put
  channel-get
  connected-hook       ; hook run when a connection is set up
  close-hooks          ; hook run with a connection that closed
  log-event)           ; the front end's function that writes an event in its event log

;; SLIME and SLY are both optional: only the one the user runs is loaded, so
;; their functions are named here, not referred to.
(defun swank-mcp--front-end (name prefix server-package server-backend)
  "The backend of front end NAME, whose functions and variables start with PREFIX.
Its server's package is SERVER-PACKAGE, and the package of that server's
backend SERVER-BACKEND, as written in forms."
  (let ((own (lambda (suffix) (intern (concat prefix suffix))))
        (server (lambda (name) (intern (concat server-package name)))))
    (swank-mcp--make-backend
     :name name
     :current-connection (funcall own "-current-connection")
     :default-connection (funcall own "-default-connection")
     :eval (funcall own "-eval")
     :eval-async (funcall own "-eval-async")
     :connections (funcall own "-net-processes")
     :dispatching-variable (funcall own "-dispatching-connection")
     :thread-variable (funcall own "-current-thread")
     :connection-name (funcall own "-connection-name")
     :pid (funcall own "-pid")
     :create-server (funcall server ":create-server")
     :stop-server (funcall server ":stop-server")
     :servers (funcall server "::*servers*")
     :server-package server-package
     :server-backend server-backend
     :make-channel (funcall own "-make-channel")
     :close-channel (funcall own "-close-channel")
     :channel-id (funcall own "-channel.id")
     :channel-put (funcall own "-channel-put")
     :channel-get (funcall own "-channel-get")
     :connected-hook (funcall own "-connected-hook")
     :close-hooks (funcall own "-net-process-close-hooks")
     :log-event (funcall own "-log-event"))))

(defconst swank-mcp--slime (swank-mcp--front-end "SLIME" "slime" "swank" "swank/backend"))

(defconst swank-mcp--sly (swank-mcp--front-end "SLY" "sly" "slynk" "slynk-backend"))

(defvar swank-mcp--servers nil
  "The servers `swank-mcp-start' opened: a list of (CONNECTION BACKEND PORT).")

(defvar swank-mcp--reopen nil
  "The ports `swank-mcp-start' opened in images whose connection closed.
A list of (BACKEND . PORT): the next connection of BACKEND, the person's
restarted Lisp, opens each again (`swank-mcp--reopen-ports'), so that the
agents configured for it reach the new image.")

(defun swank-mcp--server-connection-closed (connection)
  "Remember the port `swank-mcp-start' opened in CONNECTION's image, which closed."
  (let ((server (assq connection swank-mcp--servers)))
    (when server
      (setq swank-mcp--servers (delq server swank-mcp--servers))
      (push (cons (nth 1 server) (nth 2 server)) swank-mcp--reopen))))

(defun swank-mcp--reopen-ports ()
  "Open again, in the current connection's image, its front end's lost ports.
Those are the ports the front end's last image had.  Asynchronously: the
front end is still setting the connection up as its hook runs.  The echo
area says whether each one is open again, or, when it could not be, that
the agents configured for it are cut off."
  (let ((current (swank-mcp--current)))
    (when current
      (pcase-let ((`(,connection . ,backend) current))
        (dolist (lost (cl-remove-if-not (lambda (lost) (eq (car lost) backend)) swank-mcp--reopen))
          (setq swank-mcp--reopen (delq lost swank-mcp--reopen))
          (let ((wanted (cdr lost)))
            (swank-mcp--eval-async
             connection backend (let ((swank-mcp-port wanted)) (swank-mcp--open-server-request backend))
             (lambda (opened)
               (let ((port (car opened)))
                 (when (and (integerp port) (not (assq connection swank-mcp--servers)))
                   (push (list connection backend port) swank-mcp--servers))
                 (message "%s" (swank-mcp--reopened-text wanted port)))))))))))

(defun swank-mcp--reopened-text (wanted port)
  "What became of port WANTED in a restarted Lisp, where PORT was opened (or nil)."
  (cond ((eql port wanted)
         (format "swank-mcp: the Lisp restarted; port %d is open again in the new image" wanted))
        ((integerp port)
         (format "swank-mcp: the Lisp restarted; port %d was taken, so port %d is open instead: the agents \
configured for %d are cut off until their configuration names %d" wanted port wanted port))
        (t (format "swank-mcp: the Lisp restarted; port %d could not be opened again: the agents configured \
for it are cut off (M-x swank-mcp-start)" wanted))))

(defun swank-mcp--connection-of (backend)
  "The current connection of BACKEND, if it is loaded and connected.
In a buffer of a connection that closed (the REPL of a Lisp that was
restarted), the front end's default connection, the new one, if it is live."
  (let ((current (swank-mcp--backend-current-connection backend))
        (default (swank-mcp--backend-default-connection backend)))
    (and (fboundp current)
         (cl-find-if (lambda (connection) (and connection (process-live-p connection)))
                     (list (funcall current) (and (boundp default) (symbol-value default)))))))

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

(defun swank-mcp--request-buffer ()
  "The buffer swank-mcp's requests are made from.
SLIME and SLY call a request's continuation in the buffer it was made from,
which must outlive the request; and a request made from the REPL buffer
would go to the REPL's thread (see `swank-mcp--in-new-thread')."
  (get-buffer-create " *swank-mcp requests*"))

(defmacro swank-mcp--in-new-thread (connection backend &rest body)
  "Run BODY, which make requests through BACKEND, for CONNECTION's image.
Each request runs in a thread of its own in the image.  The front end sends
a request to the thread its buffer names: in the REPL buffer the REPL's
thread, which runs the person's own evaluation (a `(sleep 12)', or one
waiting for a lock an agent's call holds), and would take the request only
after it."
  (declare (indent 2) (debug t))
  `(with-current-buffer (swank-mcp--request-buffer)
     (cl-progv (list (swank-mcp--backend-dispatching-variable ,backend)
                     (swank-mcp--backend-thread-variable ,backend))
         (list ,connection t)
       ,@body)))

(defun swank-mcp--eval (connection backend form)
  "Evaluate FORM through BACKEND in the image of CONNECTION and return its value.
Emacs waits for it: only for requests that take the image a moment, and that
no lock of the person's or an agent's code can hold up."
  (swank-mcp--in-new-thread connection backend
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

(defun swank-mcp--open-server-form (backend)
  "Return a form for the server still listening in BACKEND's image.
Its value is nil when none listens.  A server that still listens has its
thread; the one the person's `slime' or `sly' connected through accepted
that one connection and its thread has ended."
  (let ((alive-p (intern (format "%s::thread-alive-p" (swank-mcp--backend-server-backend backend)))))
    `(cl:find-if (cl:lambda (server) (cl:and (cl:third server) (,alive-p (cl:third server))))
                 ,(swank-mcp--backend-servers backend))))

(defun swank-mcp--note-open-server ()
  "Note in `swank-mcp--servers' the port open in the current connection's image.
One opened before Emacs reconnected, or by another Emacs, is open all the
same: `swank-mcp-status' says so, as `swank-mcp-start' does."
  (let ((current (swank-mcp--current)))
    (when (and current (not (assq (car current) swank-mcp--servers)))
      (let ((port (ignore-errors
                    (swank-mcp--eval (car current) (cdr current)
                                     `(cl:second ,(swank-mcp--open-server-form (cdr current)))))))
        (when (integerp port)
          (push (list (car current) (cdr current) port) swank-mcp--servers))))))

(defun swank-mcp--open-server-request (backend)
  "The form that opens a server in BACKEND's image, unless one is open.
See `swank-mcp--open-server', which evaluates it."
  (let ((servers (swank-mcp--backend-servers backend)))
    `(cl:let ((open ,(swank-mcp--open-server-form backend)))
       (cl:if open
              (cl:cons (cl:second open) cl:nil)
              (cl:let ((port (cl:loop for port from ,swank-mcp-port
                                      below ,(+ swank-mcp-port swank-mcp-port-attempts)
                                      do (cl:handler-case
                                             (cl:return (,(swank-mcp--backend-create-server backend)
                                                         :port port :dont-close t))
                                           (cl:error nil nil)))))
                (cl:loop repeat 100
                         until (cl:or (cl:null port) (cl:find port ,servers :key 'cl:second))
                         do (cl:sleep 0.01))
                (cl:and port (cl:cons port cl:t)))))))

(defun swank-mcp--open-server (connection backend)
  "Open a persistent server in the image of CONNECTION, unless one is open.
Return (PORT . OPENED): OPENED is nil when the port was open already; nil
when no port could be opened.  BACKEND says how to reach the image.  Tries
`swank-mcp-port' and the ports after it, in the image itself, where a taken
port shows as an error."
  ;; The image is asked, not this Emacs's list: a port opened before Emacs
  ;; reconnected, or by another Emacs, is still open.
  ;; Every symbol is package-qualified: the server reads requests in a
  ;; package that uses nothing.  The variable may stay unqualified.
  ;; The new server's listening thread registers it a moment after
  ;; create-server returns, and a stop-server that arrives first is lost:
  ;; wait for the registration (a second at most).
  (swank-mcp--eval connection backend (swank-mcp--open-server-request backend)))

;;;###autoload
(defun swank-mcp-start (&optional interactive)
  "Open a persistent swank or slynk server for swank-mcp; return its port.
The server is opened in the image of the current SLIME or SLY connection on
`swank-mcp-port', or on the next free port when that one is taken, and
keeps accepting connections (:dont-close t).  When one is already open in
that image (opened by this Emacs, before it reconnected, or by another),
its port is returned and no second one is opened.  The configuration for
MCP clients is put in the buffer *swank-mcp*, which is shown when
INTERACTIVE is non-nil (as it is when called as a command)."
  (interactive (list t))
  (swank-mcp--forget-closed)
  (pcase-let* ((`(,connection . ,backend) (swank-mcp--require-current))
               (known (nth 2 (assq connection swank-mcp--servers)))
               (`(,port . ,opened) (if known (cons known nil) (swank-mcp--open-server connection backend))))
    (unless (integerp port)
      (error "No free port in %d-%d for the swank-mcp server"
             swank-mcp-port (+ swank-mcp-port swank-mcp-port-attempts -1)))
    (unless (assq connection swank-mcp--servers)
      (push (list connection backend port) swank-mcp--servers))
    (add-hook (swank-mcp--backend-close-hooks backend) #'swank-mcp--server-connection-closed)
    (add-hook (swank-mcp--backend-connected-hook backend) #'swank-mcp--reopen-ports)
    (swank-mcp--show-configuration port (swank-mcp--describe-connection connection backend) interactive)
    (when interactive
      (message "swank-mcp: port %d %s; the client configuration is in %s%s" port
               (if opened "is open" "was open already in this image, no second one was opened")
               swank-mcp--buffer-name
               (if (executable-find swank-mcp-program)
                   ""
                 (format " (but this Emacs does not find %s)" swank-mcp-program))))
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
        ;; The server's sentinel thread forgets it a moment later: wait for that (a second at
        ;; most), so that a `swank-mcp-start' right after does not find it still open.
        (swank-mcp--eval connection backend
                         `(cl:progn
                            (,(swank-mcp--backend-stop-server backend) ,port)
                            (cl:loop repeat 100
                                     while (cl:find ,port ,(swank-mcp--backend-servers backend) :key 'cl:second)
                                     do (cl:sleep 0.01))))
        (setq swank-mcp--servers (delq server swank-mcp--servers))
        (message "swank-mcp: closed port %d" port)
        port))))

;;;###autoload
(defun swank-mcp-status ()
  "Say which swank-mcp ports are open, in which images.
Return a list of (PORT . DESCRIPTION), one per open port.  The current
connection's image is asked, as `swank-mcp-start' asks it."
  (interactive)
  (swank-mcp--forget-closed)
  (swank-mcp--note-open-server)
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

(defun swank-mcp--keys-text ()
  "Return where the commands are bound, for the *swank-mcp* buffer."
  (if swank-mcp-key-prefix
      (format "In SLIME and SLY buffers (the REPL too) and swank-mcp's own, %s is swank-mcp's prefix: a activity, \
m approval mode, p the prompt of a call waiting, c cancel the agent's call, u undo, r revoke \
\"allow for the session\", b clear the agents' breakpoints, s start, q stop, i status.\n"
              (key-description swank-mcp-key-prefix))
    "The commands are M-x swank-mcp-activity, swank-mcp-approval-mode, swank-mcp-show-approval, \
swank-mcp-cancel-call, swank-mcp-undo, swank-mcp-revoke-session-allowances, swank-mcp-clear-breakpoints, \
swank-mcp-start, swank-mcp-stop and swank-mcp-status.\n"))

(defvar-local swank-mcp--configuration-shown nil
  "The port and the image the *swank-mcp* buffer shows, as (PORT WHERE).")

(define-derived-mode swank-mcp-configuration-mode special-mode "swank-mcp"
  "The configuration MCP clients need to attach swank-mcp to the image.
\\<swank-mcp-configuration-mode-map>\\[revert-buffer] writes it again, as `swank-mcp-program' and
the other options now are; \\[quit-window] hides it.
\\{swank-mcp-configuration-mode-map}"
  ;; special-mode's g would otherwise fail: the buffer visits no file.
  (setq-local revert-buffer-function #'swank-mcp--configuration-revert))

(defun swank-mcp--configuration-revert (&rest _)
  "Write the *swank-mcp* buffer again, for its port if that is still open."
  (swank-mcp--forget-closed)
  (pcase-let ((`(,port ,where) swank-mcp--configuration-shown))
    (unless (cl-find port swank-mcp--servers :key (lambda (server) (nth 2 server)))
      (user-error "Port %d is no longer open; M-x swank-mcp-start opens one" port))
    (swank-mcp--show-configuration port where nil)
    (message "swank-mcp: the configuration for port %d, as the options now are" port)))

(defun swank-mcp--show-configuration (port where display)
  "Fill the *swank-mcp* buffer for PORT opened in WHERE; show it when DISPLAY."
  (with-current-buffer (get-buffer-create swank-mcp--buffer-name)
    (swank-mcp-configuration-mode)
    (setq swank-mcp--configuration-shown (list port where))
    (let ((inhibit-read-only t))
      (erase-buffer)
      (unless (executable-find swank-mcp-program)
        (insert (propertize
                 (format "Warning: `swank-mcp-program' is %S, which this Emacs does not find (`executable-find'):
the clients below will fail to start it unless it is on their PATH.  Set `swank-mcp-program'
to its absolute file name (M-x customize-variable RET swank-mcp-program), then M-x swank-mcp-start.\n\n"
                         swank-mcp-program)
                 'face 'warning)))
      (insert (format "swank-mcp can attach on port %d to the image of the %s.\n\n" port where)
              (swank-mcp-client-configuration port)
              (format "
To approve the agent's calls before they run, add \"--confirm\", \"mutating\" to the arguments
above (every tool that changes something; or name tools: \"--confirm\", \"evaluate-lisp,load-file\"),
and turn on M-x swank-mcp-approval-mode%s: each call then waits for your answer in
the buffer %s, which opens at the bottom of the frame without taking your keys.
M-x swank-mcp-activity shows every call of the agent, and M-x swank-mcp-cancel-call ends one.

"
                      (if swank-mcp-key-prefix (format " (%s m)" (key-description swank-mcp-key-prefix)) "")
                      swank-mcp--approval-buffer-name)
              (swank-mcp--keys-text)
              "M-x swank-mcp-stop closes the port; M-x swank-mcp-status lists open ones.\n"))
    (goto-char (point-min))
    (when display
      (display-buffer (current-buffer)))))

;;;; Keeping the human in charge: the activity feed and approvals
;;
;; The image tells Emacs, through the helper swank-mcp loads into it (package
;; MCP-AGENT-HELPER, src/lisp/activity.lisp): the activity buffer and
;; approval mode each open a channel of the SLIME or SLY connection and
;; subscribe it in the image, which then sends one message down it when a
;; call of an agent changes state (waiting for approval, running, ended) or
;; waits for approval.  Nothing is asked of the image otherwise, but for the
;; whole record once when the activity buffer opens or is refreshed.
;; Messages arrive as the connection's other events do: Emacs never waits for
;; the image, and nothing is written to the REPL buffer.

(defun swank-mcp--helper-call (function &rest arguments)
  "Return a form to call the helper's FUNCTION (a string) with ARGUMENTS.
It is nil there until an agent's swank-mcp has loaded the helper."
  ;; Not named `function': Emacs would print (function X) as #'X.
  `(cl:let ((helper (cl:and (cl:find-package "MCP-AGENT-HELPER")
                            (cl:find-symbol ,function "MCP-AGENT-HELPER"))))
     (cl:if (cl:and helper (cl:fboundp helper))
            (cl:funcall helper ,@arguments)
            cl:nil)))

(defun swank-mcp--eval-async (connection backend form continuation)
  "Evaluate FORM through BACKEND in CONNECTION's image, asynchronously.
CONTINUATION is called with the value."
  (swank-mcp--in-new-thread connection backend
    (funcall (swank-mcp--backend-eval-async backend) form continuation)))

(defun swank-mcp--feeds-form (update)
  "Return a form to change the image's list of subscribed channels with UPDATE.
UPDATE is a form of a function from the old list to the new.  The list is
the helper's *EMACS-FEEDS*, made here when no agent has loaded the helper
yet, so that the image tells Emacs from the helper's first call on."
  ;; Two subscriptions at once (a file watch and an activity buffer as a Lisp connects) each run
  ;; in a thread of their own: one may make the package the other has just made, and a plain
  ;; `setf' of an unbound list could drop the other's subscription.  The compare-and-swap sets
  ;; the list only while it is unbound (SBCL then signals, having set it: ignored).
  `(cl:let* ((package (cl:or (cl:find-package "MCP-AGENT-HELPER")
                             (cl:ignore-errors (cl:make-package "MCP-AGENT-HELPER" :use '("COMMON-LISP")))
                             (cl:find-package "MCP-AGENT-HELPER")))
             (feeds (cl:intern "*EMACS-FEEDS*" package)))
     (cl:unless (cl:boundp feeds)
       (cl:ignore-errors
        (sb-ext:compare-and-swap (cl:symbol-value feeds) (sb-kernel:make-unbound-marker) cl:nil)))
     (sb-ext:atomic-update (cl:symbol-value feeds) ,update)
     cl:t))

(defun swank-mcp--connection-form (backend)
  "Return the form for the requesting connection, in the image of BACKEND."
  (intern (format "%s::*emacs-connection*" (swank-mcp--backend-server-package backend))))

(defun swank-mcp--subscribe-form (backend id topic)
  "Return a form to subscribe channel ID of the requesting connection to TOPIC.
BACKEND names the server's parts the form uses: the connection the request
came in on, its control thread, which writes to Emacs, and the backend's
`send' to that thread's mailbox, which exists already (no thread or mailbox
is made per message).  A channel subscribed to :approvals is then sent the
calls that wait for approval already."
  (let* ((server (swank-mcp--backend-server-package backend))
         (connection (swank-mcp--connection-form backend))
         (control-thread (intern (format "%s::mconn.control-thread" server)))
         (alive-p (intern (format "%s::thread-alive-p" (swank-mcp--backend-server-backend backend))))
         (send (intern (format "%s::send" (swank-mcp--backend-server-backend backend))))
         (subscribe (swank-mcp--feeds-form
                     `(cl:lambda (feeds)
                        (cl:let ((thread (,control-thread ,connection)))
                          (cl:cons (cl:list ,connection ,id ,topic
                                            (cl:lambda (message)
                                              (cl:when (,alive-p thread)
                                                (,send thread (cl:list :channel-send ,id message))
                                                cl:t))
                                            (cl:lambda () (,alive-p thread)))
                                   feeds))))))
    (if (eq topic :approvals)
        `(cl:progn ,subscribe
                   ,(swank-mcp--helper-call "SEND-WAITING-APPROVALS" connection id)
                   cl:t)
      subscribe)))

(defun swank-mcp--unsubscribe-form (backend id)
  "Return a form to drop the subscription of channel ID.
The channel is the requesting connection's; BACKEND names the server's
variable of that connection."
  (let ((connection (swank-mcp--connection-form backend)))
    (swank-mcp--feeds-form
     `(cl:lambda (feeds)
        (cl:remove-if (cl:lambda (feed) (cl:and (cl:eq (cl:first feed) ,connection) (cl:eql (cl:second feed) ,id)))
                      feeds)))))

(defvar swank-mcp--own-channels (make-hash-table)
  "The ids of the channels swank-mcp subscribed, whose messages are logged briefly.")

(defconst swank-mcp--logged-elements 10
  "How many elements of a message down a swank-mcp channel the event log shows.")

(defun swank-mcp--log-briefly (log event &rest arguments)
  "Write EVENT with LOG, the front end's event logger, called with ARGUMENTS.
A message down one of swank-mcp's channels is written on one short line:
the event with the message's elements in it, the first few of them.  The
image sends one for each change of each call of an agent, and the front
end's event log (*slime-events*, *sly-events*) keeps only its last 100,000
characters, which are there for the user's own requests: a burst of an
agent's calls must not push them out."
  (apply log
         (if (and (eq (car-safe event) :channel-send) (gethash (nth 1 event) swank-mcp--own-channels))
             ;; Flat, so that the pretty printer keeps it on one line.
             (let ((flat (append (list :channel-send (nth 1 event)) (nth 2 event))))
               (if (> (length flat) swank-mcp--logged-elements)
                   (append (cl-subseq flat 0 swank-mcp--logged-elements) (list (intern "\u2026")))
                 flat))
           event)
         arguments))

(defun swank-mcp--subscribe (connection backend topic operations &optional subscribed)
  "Subscribe a new channel of CONNECTION to TOPIC; return the channel.
TOPIC is :activity or :approvals; BACKEND says how to reach the image.
OPERATIONS is an alist of message keywords and the functions that handle
them, called with the channel and the message's plist.  The channel's
:subscribed property is set once the image has it, and then SUBSCRIBED, a
function of no arguments, is called when given."
  (let ((table (make-hash-table :test 'eq))
        (channel nil))
    (pcase-dolist (`(,message . ,function) operations)
      (puthash message function table))
    (swank-mcp--in-new-thread connection backend
      (setq channel (funcall (swank-mcp--backend-make-channel backend) table "swank-mcp")))
    (puthash (funcall (swank-mcp--backend-channel-id backend) channel) t swank-mcp--own-channels)
    (advice-add (swank-mcp--backend-log-event backend) :around #'swank-mcp--log-briefly)
    (swank-mcp--eval-async connection backend
                           (swank-mcp--subscribe-form backend (funcall (swank-mcp--backend-channel-id backend) channel) topic)
                           (lambda (_)
                             (funcall (swank-mcp--backend-channel-put backend) channel :subscribed t)
                             (when subscribed
                               (funcall subscribed))))
    channel))

(defun swank-mcp--unsubscribe (connection backend channel &optional then-form then)
  "Drop the subscription of CHANNEL of CONNECTION, then close the channel.
BACKEND says how to reach the image.  The channel stays open until the image
has dropped it: a message sent meanwhile must find it.  THEN-FORM, when
given, is evaluated in the image right after, in the same request, and THEN
is called with its value."
  (if (not (process-live-p connection))
      nil
    (swank-mcp--eval-async connection backend
                           `(cl:progn
                              ,(swank-mcp--unsubscribe-form backend (funcall (swank-mcp--backend-channel-id backend)
                                                                             channel))
                              ,(or then-form 'cl:nil))
                           (lambda (value)
                             (when then
                               (funcall then value))
                             (remhash (funcall (swank-mcp--backend-channel-id backend) channel)
                                      swank-mcp--own-channels)
                             (swank-mcp--in-new-thread connection backend
                               (funcall (swank-mcp--backend-close-channel backend) channel))))))

(defun swank-mcp--fontify (text mode)
  "TEXT with the faces MODE's font lock gives it."
  (with-temp-buffer
    (insert text)
    (delay-mode-hooks (funcall mode))
    (font-lock-ensure)
    (buffer-string)))

(defun swank-mcp--fontify-shown (text)
  "TEXT fontified as a diff when it is one, else as Lisp."
  (if (string-match-p "^@@ " text)
      (swank-mcp--fontify text 'diff-mode)
    (swank-mcp--fontify text 'lisp-mode)))

;;;;; The activity buffer

(defvar-local swank-mcp--activity-connection nil
  "The connection whose image this activity buffer shows.")
(defvar-local swank-mcp--activity-backend nil
  "The backend of `swank-mcp--activity-connection'.")
(defvar-local swank-mcp--activity-channel nil
  "The channel down which the image tells this buffer of calls.")
(defvar-local swank-mcp--activity-entries nil
  "The calls shown: a hash table of call id -> (START . END) markers.")
(defvar-local swank-mcp--activity-calls nil
  "Every call the image reported, shown or filtered out.
A list of plists, newest first.")
(defvar-local swank-mcp--activity-filter nil
  "Nil to show every call, else (KIND . VALUE): KIND `tool' or `state'.")
(defvar-local swank-mcp--activity-lines 0
  "How many lines the calls shown take.")

(defcustom swank-mcp-activity-max-lines 5000
  "Lines of calls an activity buffer keeps; the oldest calls beyond them go.
The buffer, and the calls it remembers for its filters, would otherwise grow
for as long as it is open, and every change of a call (and the prompt of a
call waiting behind it) would take longer.  The image's own record, which
\[revert-buffer] reads again, keeps its last 200 calls."
  :type 'integer
  :group 'swank-mcp)

(defconst swank-mcp--call-states
  '((:waiting "waiting for approval" warning)
    (:running "running" warning)
    (:declined "declined" error)
    (:timed-out "timed out" error)
    (:cancelled "cancelled" shadow)
    (:failed "failed" error)
    (:done "done" success)
    ;; The image's own end of a call whose server went away first.
    (:lost "server gone" shadow)
    ;; Shown by Emacs once the connection closed before the call was told to have ended.
    (:unknown "unknown: the connection closed" shadow)
    ;; Not a call: an event of the agents' debugging (`swank-mcp--event-kinds').
    (:event "event" font-lock-keyword-face))
  "Each state a call can be in, with how it is named and its face.
The last, :event, is the state of the events between the calls.")

(defconst swank-mcp--event-kinds
  '((:breakpoint-set "breakpoint set" warning)
    (:breakpoint-removed "breakpoint removed" shadow)
    (:breakpoint-hit "stopped at a breakpoint" error)
    (:breakpoint-left "left a breakpoint" success)
    (:attached "attached to a thread" warning)
    ;; Told as a fresh image loads swank-mcp's helper for an agent's first call.
    (:helper "swank-mcp's helper" shadow)
    ;; Recorded by Emacs: what the person's buffers hold against the agents' writes.
    (:buffer-kept "buffer not reverted" warning)
    (:stale-compile "compiled older text" error))
  "The events the image records between the calls, with their names and faces.
An agent's breakpoint stops the image's threads, yours included, and an
agent may attach to a thread waiting in your debugger: these say so.")

(defvar swank-mcp-activity-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "RET") #'swank-mcp-activity-show-reply)
    (define-key map (kbd "n") #'swank-mcp-activity-next)
    (define-key map (kbd "p") #'swank-mcp-activity-previous)
    (define-key map (kbd "/") #'swank-mcp-activity-filter)
    (define-key map (kbd "C-c C-c") #'swank-mcp-cancel-call)
    (define-key map (kbd "b") #'swank-mcp-clear-breakpoints)
    map)
  "Keymap of `swank-mcp-activity-mode'.")

(define-derived-mode swank-mcp-activity-mode special-mode "swank-mcp activity"
  "The tool calls agents make in a Lisp image, newest at the bottom.
Each shows its state: waiting for approval, running, declined, timed out,
cancelled, failed, done, or server gone (the agent's server went away
before the call ended).  Between them, events: an agent's breakpoint set
or removed, a thread that stopped at one or left it, a thread an agent
attached to (one waiting in your debugger, with its condition).
\\<swank-mcp-activity-mode-map>\\[swank-mcp-activity-show-reply] shows the reply the agent received for the call at
point, or the prompt of a call waiting for approval, \\[swank-mcp-activity-next] and \\[swank-mcp-activity-previous] move
between calls, \\[swank-mcp-activity-filter] shows only one tool's or one state's calls, \\[swank-mcp-cancel-call] ends
the call at point, \\[swank-mcp-clear-breakpoints] removes every agent's breakpoint, \\[revert-buffer] reads the whole
record again."
  (setq truncate-lines t)
  ;; In the header line, which stays where the buffer's first lines scroll away.
  (setq header-line-format (swank-mcp--activity-keys-text))
  (setq-local revert-buffer-function #'swank-mcp--activity-revert)
  (add-hook 'kill-buffer-hook #'swank-mcp--activity-stop nil t))

(defun swank-mcp--subscribed-p (backend channel)
  "Whether the image has subscribed BACKEND's CHANNEL."
  (and channel (funcall (swank-mcp--backend-channel-get backend) channel :subscribed)))

;;;###autoload
(defun swank-mcp-activity ()
  "Show each tool call of agents in the current connection's image, as it happens.
The buffer is one per connection.  The image keeps the record of the last
200 calls, so the calls made before the buffer opened show too, and tells
the buffer of each change while it is open."
  (interactive)
  (pcase-let* ((`(,connection . ,backend) (swank-mcp--require-current))
               (name (format "*swank-mcp activity: %s*"
                             (funcall (swank-mcp--backend-connection-name backend) connection)))
               (buffer (get-buffer name)))
    (when (and buffer (not (eq (buffer-local-value 'swank-mcp--activity-connection buffer) connection)))
      ;; The buffer of an earlier connection of that name, which closed (the Lisp restarted):
      ;; it keeps what it showed under another name, and the new connection gets a buffer of
      ;; its own, subscribed in the new image.
      (with-current-buffer buffer
        (swank-mcp--activity-stop)
        (swank-mcp--keep-as-closed))
      (setq buffer nil))
    (unless buffer
      (setq buffer (get-buffer-create name))
      (with-current-buffer buffer
        (swank-mcp-activity-mode)
        (setq swank-mcp--activity-connection connection
              swank-mcp--activity-backend backend
              swank-mcp--activity-entries (make-hash-table :test 'equal))
        (let ((inhibit-read-only t))
          (insert (swank-mcp--activity-header)))
        (setq swank-mcp--activity-channel
              (swank-mcp--subscribe connection backend :activity
                                    `((:call . ,(lambda (_channel &rest call)
                                                  (when (buffer-live-p buffer)
                                                    (with-current-buffer buffer
                                                      (swank-mcp--activity-show call))))))
                                    (lambda ()
                                      (when (buffer-live-p buffer)
                                        (with-current-buffer buffer
                                          (swank-mcp--activity-read-record))))))
        (add-hook (swank-mcp--backend-close-hooks backend) #'swank-mcp--activity-connection-closed)))
    (when (called-interactively-p 'any)
      (display-buffer buffer))
    buffer))

(defun swank-mcp--keep-as-closed ()
  "Rename the current buffer, of a connection that closed, with \", closed\" added.
It keeps what it showed, and the connection's next buffer takes its name.
The buffer of that name that an earlier connection left goes: after each
restart of the Lisp only the last closed one stays, rather than one more
\"<2>\", \"<3>\" every time."
  (let* ((name (format "%s, closed*" (string-remove-suffix "*" (buffer-name))))
         (older (get-buffer name)))
    (unless (string-suffix-p ", closed*" (buffer-name))
      (when older
        (kill-buffer older))
      (rename-buffer name))))

(defun swank-mcp--activity-connection-closed (connection)
  "Say in the activity buffer of CONNECTION that it closed.
A call it showed waiting or running will never be told to have ended:
it is shown as ended with the connection, its outcome unknown."
  (dolist (buffer (buffer-list))
    (with-current-buffer buffer
      (when (and (derived-mode-p 'swank-mcp-activity-mode)
                 (eq swank-mcp--activity-connection connection)
                 swank-mcp--activity-channel)
        (setq swank-mcp--activity-channel nil)
        (dolist (call (copy-sequence swank-mcp--activity-calls))
          (when (memq (plist-get call :state) '(:waiting :running))
            (swank-mcp--activity-show (plist-put (copy-sequence call) :state :unknown))))
        (let ((inhibit-read-only t))
          (save-excursion
            (goto-char (point-max))
            (insert (propertize "The connection closed.\n" 'face 'shadow))))
        (swank-mcp--keep-as-closed)))))

(defun swank-mcp--activity-stop ()
  "Unsubscribe this buffer in the image.
The image tells it nothing more then."
  (when swank-mcp--activity-channel
    (swank-mcp--unsubscribe swank-mcp--activity-connection swank-mcp--activity-backend
                            swank-mcp--activity-channel)
    (setq swank-mcp--activity-channel nil)))

(defconst swank-mcp--lisp-arguments '(code content form)
  "The arguments of tools that hold Lisp source, shown fontified as Lisp.")

(defun swank-mcp--input-text (input)
  "Return INPUT, the code or the arguments of a call, for the activity buffer.
Code is fontified as Lisp; arguments, which come as a JSON object, are
shown one to a line, and those that hold Lisp source are fontified as
such."
  (let ((arguments (and (string-prefix-p "{" input)
                        (condition-case nil
                            (let ((json-object-type 'alist) (json-key-type 'symbol) (json-array-type 'list))
                              (json-read-from-string input))
                          (error nil)))))
    (cond ((null arguments)
           (if (string-prefix-p "{" input) input (swank-mcp--fontify input 'lisp-mode)))
          ((not (consp arguments)) input)
          (t
           (mapconcat
            (pcase-lambda (`(,name . ,value))
              (let ((text (if (stringp value) value (json-encode value))))
                (concat (propertize (format "%s:" name) 'face 'font-lock-keyword-face)
                        (if (string-match-p "\n" text) "\n" " ")
                        (if (and (stringp value) (memq name swank-mcp--lisp-arguments))
                            (swank-mcp--fontify text 'lisp-mode)
                          text))))
            arguments "\n")))))

(defun swank-mcp--event-text (event)
  "The lines that show EVENT, a plist from the image's RECORD-PLIST with :event."
  (let ((kind (or (assq (plist-get event :event) swank-mcp--event-kinds)
                  (list nil (format "%s" (plist-get event :event)) 'warning))))
    (propertize
     (concat (propertize (plist-get event :time) 'face 'shadow) "  "
             (propertize (nth 1 kind) 'face (nth 2 kind))
             "\n    " (or (plist-get event :outcome) "") "\n")
     'swank-mcp-call (plist-get event :id))))

(defun swank-mcp--activity-text (call)
  "The lines that show CALL, a plist from the image's RECORD-PLIST.
An event has lines of its own (`swank-mcp--event-text')."
  (if (plist-get call :event)
      (swank-mcp--event-text call)
    (swank-mcp--call-text call)))

(defun swank-mcp--call-text (call)
  "The lines that show CALL, a call of an agent's."
  (let* ((milliseconds (plist-get call :milliseconds))
         (waited (plist-get call :waited))
         (state (or (assq (plist-get call :state) swank-mcp--call-states)
                    (list nil (format "%s" (plist-get call :state)) 'warning)))
         (input (string-trim (or (plist-get call :input) "")))
         (input-lines (split-string (swank-mcp--input-text input) "\n"))
         (shown (mapconcat (lambda (line) (concat "    " line))
                           (if (> (length input-lines) 12)
                               (append (cl-subseq input-lines 0 12) (list "..."))
                             input-lines)
                           "\n"))
         (outcome (plist-get call :outcome)))
    (propertize
     (concat (propertize (plist-get call :time) 'face 'shadow) "  "
             (propertize (plist-get call :tool) 'face 'font-lock-function-name-face)
             (propertize (format "  (%s%s)" (or (plist-get call :client) "unknown client")
                                 (if (plist-get call :package) (format ", in %s" (plist-get call :package)) ""))
                         'face 'shadow)
             "  " (propertize (nth 1 state) 'face (nth 2 state))
             ;; How long it ran, and apart, how long it waited for the person's answer.
             (if milliseconds (format "  %d ms" milliseconds) "")
             (if waited (propertize (format "  (waited %d ms for approval)" waited) 'face 'shadow) "")
             "\n"
             (if (string-empty-p input) "" (concat shown "\n"))
             (if outcome
                 (concat "    " (propertize outcome 'face (if (eq (car state) :done) 'success 'error)) "\n")
               "")
             ;; The person's changed files that ASDF reloaded into the image first (run-tests).
             (if (plist-get call :reloaded)
                 (concat "    " (propertize (plist-get call :reloaded) 'face 'warning) "\n")
               ""))
     'swank-mcp-call (plist-get call :id))))

(defun swank-mcp--activity-shown-p (call)
  "Whether CALL passes the buffer's filter."
  (pcase swank-mcp--activity-filter
    (`(tool . ,tool) (equal (plist-get call :tool) tool))
    (`(state . ,state) (eq (plist-get call :state) state))
    (_ t)))

(defun swank-mcp--activity-show (call)
  "Record CALL and show it, replacing its lines when they are shown already."
  (let* ((inhibit-read-only t)
         (id (plist-get call :id))
         (shown (gethash id swank-mcp--activity-entries))
         (at-end (= (point) (point-max)))
         (windows (cl-remove-if-not (lambda (window) (= (window-point window) (point-max)))
                                    (get-buffer-window-list (current-buffer) nil t))))
    (setq swank-mcp--activity-calls
          (cons call (cl-remove id swank-mcp--activity-calls :key (lambda (c) (plist-get c :id)) :test #'equal)))
    ;; Every call shown takes a line at least: no more are remembered than can be shown.
    (let ((last-kept (nthcdr (1- (max 1 swank-mcp-activity-max-lines)) swank-mcp--activity-calls)))
      (when last-kept
        (setcdr last-kept nil)))
    ;; The new lines go in before the old ones are deleted: inserted where the old lines
    ;; were deleted, they would land before the next call's start marker (which stays put
    ;; at an insertion), and that call's next change would delete them with its own.
    (save-excursion
      (goto-char (if shown (car shown) (point-max)))
      (if (swank-mcp--activity-shown-p call)
          (let ((start (point-marker))
                (text (swank-mcp--activity-text call)))
            (insert text)
            (cl-incf swank-mcp--activity-lines (cl-count ?\n text))
            (puthash id (cons start (point-marker)) swank-mcp--activity-entries))
        (remhash id swank-mcp--activity-entries))
      (when shown
        (cl-decf swank-mcp--activity-lines (count-lines (point) (cdr shown)))
        (delete-region (point) (cdr shown))
        (set-marker (car shown) nil)
        (set-marker (cdr shown) nil)))
    (swank-mcp--activity-trim)
    ;; Newest at the bottom: whoever was at the end follows it.
    (when at-end (goto-char (point-max)))
    (dolist (window windows)
      (set-window-point window (point-max)))))

(defun swank-mcp--activity-trim ()
  "Drop the oldest entries while the shown ones take too many lines.
That is more than `swank-mcp-activity-max-lines'.  The newest call shown
always stays."
  (let ((inhibit-read-only t))
    (while (and (> swank-mcp--activity-lines swank-mcp-activity-max-lines)
                (> (hash-table-count swank-mcp--activity-entries) 1))
      (let* ((start (next-single-property-change (point-min) 'swank-mcp-call))
             (id (get-text-property start 'swank-mcp-call))
             (entry (gethash id swank-mcp--activity-entries)))
        (cl-decf swank-mcp--activity-lines (count-lines (car entry) (cdr entry)))
        (delete-region (car entry) (cdr entry))
        (set-marker (car entry) nil)
        (set-marker (cdr entry) nil)
        (remhash id swank-mcp--activity-entries)
        (setq swank-mcp--activity-calls
              (cl-remove id swank-mcp--activity-calls :key (lambda (c) (plist-get c :id)) :test #'equal))))))

(defun swank-mcp--activity-header ()
  "Return the first line of the activity buffer: what is in it."
  (propertize (format "Tool calls of agents in the image of the %s%s.\n"
                      (swank-mcp--describe-connection swank-mcp--activity-connection swank-mcp--activity-backend)
                      (pcase swank-mcp--activity-filter
                        (`(,kind . ,value)
                         (format "; only %s %s" kind
                                 (if (eq kind 'state) (nth 1 (assq value swank-mcp--call-states)) value)))
                        (_ "")))
              'face 'shadow))

(defun swank-mcp--activity-keys-text ()
  "Return the keys of the activity buffer, for its header line.
Short enough for a window half as wide as a frame; the mode's help,
which it names, says the rest."
  (substitute-command-keys
   "\\<swank-mcp-activity-mode-map>\\[swank-mcp-activity-show-reply] reply, \
\\[swank-mcp-activity-next]/\\[swank-mcp-activity-previous] move, \\[swank-mcp-activity-filter] filter, \\[swank-mcp-cancel-call] cancel, \
\\[swank-mcp-clear-breakpoints] unbreak, \\[revert-buffer] reread, \\[describe-mode] help"))

(defun swank-mcp--activity-redisplay ()
  "Show again every call recorded that passes the filter, oldest first."
  (let ((inhibit-read-only t)
        (calls (reverse swank-mcp--activity-calls)))
    (erase-buffer)
    (clrhash swank-mcp--activity-entries)
    (setq swank-mcp--activity-lines 0)
    (insert (swank-mcp--activity-header))
    (setq swank-mcp--activity-calls nil)
    (mapc #'swank-mcp--activity-show calls)))

(defun swank-mcp--activity-take-record (calls)
  "Show the whole record the image sent, oldest first.
CALLS is that record.  A call the image told of meanwhile keeps the newer
of its two states, and the calls it told of that CALLS lack, which started
later, stay after them."
  (let* ((told swank-mcp--activity-calls)
         (id (lambda (call) (plist-get call :id)))
         (merged (mapcar (lambda (call)
                           (let ((newer (cl-find (plist-get call :id) told :key id :test #'equal)))
                             (if (and newer (> (plist-get newer :version) (plist-get call :version)))
                                 newer
                               call)))
                         calls))
         (later (cl-remove-if (lambda (call) (cl-find (plist-get call :id) calls :key id :test #'equal))
                              told)))
    (setq swank-mcp--activity-calls (append later (reverse merged)))
    (swank-mcp--activity-redisplay)))

(defun swank-mcp--activity-read-record ()
  "Ask the image for its whole record; show it when it comes.
Asked once the buffer has subscribed, so that no change is missed."
  (let ((buffer (current-buffer)))
    (swank-mcp--eval-async swank-mcp--activity-connection swank-mcp--activity-backend
                           (swank-mcp--helper-call "ACTIVITY-RECORDS")
                           (lambda (calls)
                             (when (buffer-live-p buffer)
                               (with-current-buffer buffer
                                 (swank-mcp--activity-take-record calls)))))))

(defun swank-mcp--activity-revert (&rest _)
  "Read the image's whole record again, for `revert-buffer'.
It is shown when it comes: Emacs does not wait for a busy image."
  (unless swank-mcp--activity-channel
    (user-error "The connection of this buffer closed"))
  (setq swank-mcp--activity-calls nil)
  (swank-mcp--activity-read-record))

(defun swank-mcp--activity-starts ()
  "Return the start of each call shown, in order."
  (let ((starts '())
        (position (point-min)))
    ;; Calls side by side differ by id: each change of the property is a start or an end.
    (while (setq position (next-single-property-change position 'swank-mcp-call))
      (when (get-text-property position 'swank-mcp-call)
        (push position starts)))
    (nreverse starts)))

(defun swank-mcp-activity-next (&optional count)
  "Move to the start of the next call, or the COUNTth next.
A negative COUNT moves back."
  (interactive "p")
  (let ((count (or count 1)))
    (dotimes (_ (abs count))
      (let* ((starts (swank-mcp--activity-starts))
             (next (if (< count 0)
                       (car (last (cl-remove-if-not (lambda (start) (< start (point))) starts)))
                     (cl-find-if (lambda (start) (> start (point))) starts))))
        (unless next
          (user-error "No %s call" (if (< count 0) "earlier" "later")))
        (goto-char next)))))

(defun swank-mcp-activity-previous (&optional count)
  "Move to the start of the previous call, or the COUNTth previous."
  (interactive "p")
  (swank-mcp-activity-next (- (or count 1))))

(defun swank-mcp-activity-filter (filter)
  "Show only the work of one tool, or in one state, by FILTER.
FILTER is (tool . NAME), (state . KEYWORD) such as (state . :failed), or
nil for every call.  Interactively, read a tool name or a state; an empty
answer shows every call."
  (interactive
   (let* ((states (mapcar (lambda (state) (nth 1 state)) swank-mcp--call-states))
          (tools (delete-dups (mapcar (lambda (call) (plist-get call :tool)) swank-mcp--activity-calls)))
          (answer (completing-read "Show only the calls of tool or in state (empty: all): "
                                   (append tools states) nil nil)))
     (list (cond ((string-empty-p answer) nil)
                 ((member answer states)
                  (cons 'state (car (cl-find answer swank-mcp--call-states :key #'cadr :test #'equal))))
                 (t (cons 'tool answer))))))
  (setq swank-mcp--activity-filter filter)
  (swank-mcp--activity-redisplay)
  (goto-char (point-max)))

(defun swank-mcp-activity-show-reply ()
  "Show the reply the agent received for the call at point, exactly as it got it.
On a call waiting for approval, go to its prompt.  The reply is shown when
the image sends it: Emacs does not wait for a busy image."
  (interactive)
  (let* ((id (or (get-text-property (point) 'swank-mcp-call) (user-error "No call here")))
         (call (cl-find id swank-mcp--activity-calls :key (lambda (c) (plist-get c :id)) :test #'equal))
         (approval (cl-find-if (lambda (approval)
                                 (and (eq (car approval) swank-mcp--activity-connection)
                                      (equal (plist-get (nth 2 approval) :call) id)))
                               swank-mcp--approvals)))
    (if approval
        (swank-mcp-show-approval approval)
      (swank-mcp--eval-async swank-mcp--activity-connection swank-mcp--activity-backend
                             (swank-mcp--helper-call "ACTIVITY-REPLY" id)
                             (lambda (reply)
                               (let ((text (plist-get reply :text)))
                                 (if text
                                     (swank-mcp--show-reply call text)
                                   (message "swank-mcp: %s"
                                            (if (memq (plist-get call :state) '(:waiting :running))
                                                "this call has not ended yet."
                                              "the image no longer keeps this call's reply.")))))))))

(defconst swank-mcp--reply-display-action
  '((display-buffer-reuse-window display-buffer-below-selected display-buffer-in-side-window)
    (side . bottom)
    (inhibit-same-window . t))
  "How a reply is shown: below the activity buffer, or at the bottom of the frame.
Never in another window in place of its buffer, which would be the REPL's.")

(defun swank-mcp--show-reply (call text)
  "Show TEXT, the reply the agent received for CALL, or an event's whole text."
  (with-current-buffer (get-buffer-create "*swank-mcp reply*")
    (let ((inhibit-read-only t))
      (erase-buffer)
      (insert text))
    (special-mode)
    (setq header-line-format
          (if (plist-get call :event)
              (format "An event of the agents' debugging (%s, %s)" (plist-get call :time)
                      (nth 1 (assq (plist-get call :event) swank-mcp--event-kinds)))
            (format "What the agent received from %s (%s, %s)" (plist-get call :tool) (plist-get call :time)
                    (nth 1 (assq (plist-get call :state) swank-mcp--call-states)))))
    (goto-char (point-min))
    (display-buffer (current-buffer) swank-mcp--reply-display-action)))

;;;;; Undo

(defcustom swank-mcp-undo-page-size 50
  "Journal entries the undo buffer lists at a time."
  :type 'integer
  :group 'swank-mcp)

(defvar-local swank-mcp--undo-connection nil
  "The connection whose image's journal this undo buffer shows.")
(defvar-local swank-mcp--undo-backend nil
  "The backend of `swank-mcp--undo-connection'.")
(defvar-local swank-mcp--undo-before nil
  "The page shown: the entries numbered below this, or the newest when nil.")
(defvar-local swank-mcp--undo-page nil
  "The journal's last listing: its plist, with :older and :newer counts.")

(defvar swank-mcp-undo-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "r") #'swank-mcp-undo-restore)
    (define-key map (kbd "R") #'swank-mcp-undo-restore-since)
    (define-key map (kbd "n") #'next-line)
    (define-key map (kbd "p") #'previous-line)
    (define-key map (kbd "<") #'swank-mcp-undo-older)
    (define-key map (kbd ">") #'swank-mcp-undo-newer)
    map)
  "Keymap of `swank-mcp-undo-mode'.")

(define-derived-mode swank-mcp-undo-mode special-mode "swank-mcp undo"
  "The definitions agents' calls made in a Lisp image, oldest first.
\\<swank-mcp-undo-mode-map>\\[swank-mcp-undo-restore] puts back what the entry at point replaced (after asking),
\\[swank-mcp-undo-restore-since] every entry from the one at point on, newest first; an entry
whose definition changed since is restored only when you force it.
\\[swank-mcp-undo-older] and \\[swank-mcp-undo-newer] show older and newer entries, \\[revert-buffer] reads the
journal again."
  (setq truncate-lines t)
  ;; In the header line, which stays where the buffer's first lines scroll away.
  (setq header-line-format
        (substitute-command-keys
         "\\<swank-mcp-undo-mode-map>\\[swank-mcp-undo-restore] restores the entry at point, \
\\[swank-mcp-undo-restore-since] every entry from it on, \\[swank-mcp-undo-older]/\\[swank-mcp-undo-newer] older/newer \
entries, \\[revert-buffer] reads the journal again"))
  (setq-local revert-buffer-function (lambda (&rest _) (swank-mcp-undo-refresh))))

;;;###autoload
(defun swank-mcp-undo ()
  "List what agents defined in the current image, to restore what it replaced.
The journal of the functions, macros, methods and classes their calls
defined lives in the image.  Restoring an entry puts back the definition it
replaced (a function behaves as before and \\[xref-find-definitions] finds it
where it was; a method the agent added is removed; a class gets its
previous slots back), after asking.  A definition changed since the
agent's call, by you or another agent, is not overwritten unless you force
it."
  (interactive)
  (pcase-let* ((`(,connection . ,backend) (swank-mcp--require-current))
               (buffer (get-buffer-create
                        (format "*swank-mcp undo: %s*"
                                (funcall (swank-mcp--backend-connection-name backend) connection)))))
    (with-current-buffer buffer
      (swank-mcp-undo-mode)
      (setq swank-mcp--undo-connection connection
            swank-mcp--undo-backend backend)
      (swank-mcp-undo-refresh))
    (add-hook (swank-mcp--backend-close-hooks backend) #'swank-mcp--undo-connection-closed)
    (when (called-interactively-p 'any)
      (pop-to-buffer buffer))
    buffer))

(defun swank-mcp--undo-connection-closed (connection)
  "Mark the undo buffer of CONNECTION, which closed, as closed.
It lists the journal of an image that is gone (the Lisp restarted, say):
its name and header line say so, and the next connection's journal gets
a buffer of its own."
  (dolist (buffer (buffer-list))
    (with-current-buffer buffer
      (when (and (derived-mode-p 'swank-mcp-undo-mode) (eq swank-mcp--undo-connection connection))
        (setq header-line-format "The connection closed: this journal was its image's, which is gone.")
        (swank-mcp--keep-as-closed)))))

(defun swank-mcp--undo-call (&rest arguments)
  "Call the image's undo journal with ARGUMENTS; return its plist.
Signal a `user-error' with the image's message when it reports a failure."
  (unless (process-live-p swank-mcp--undo-connection)
    (user-error "The connection of this journal closed; M-x swank-mcp-undo shows the current one's"))
  (let ((reply (swank-mcp--eval swank-mcp--undo-connection swank-mcp--undo-backend
                                (apply #'swank-mcp--helper-call "UNDO-JOURNAL" arguments))))
    (cond ((null reply) (user-error "No agent has worked in this image yet: there is nothing to undo"))
          ((plist-get reply :failure) (user-error "%s" (plist-get reply :failure)))
          ((plist-get reply :error) (user-error "%s" (plist-get (plist-get reply :error) :message)))
          (t reply))))

(defun swank-mcp--location-text (location)
  "LOCATION, a plist (:file :line :column :note :origin), as one might read it."
  (let ((file (plist-get location :file)))
    (if file
        (concat file
                (if (plist-get location :line) (format ":%d" (plist-get location :line)) "")
                (if (plist-get location :note) (format " (%s)" (plist-get location :note)) ""))
      (or (plist-get location :origin) "no source file"))))

(defun swank-mcp--made-text (location)
  "Return the place of a definition, from LOCATION.
That is \"defined at FILE:LINE\", or the origin of a definition without a
file, which says it already (\"defined at the REPL, no source file\")."
  (if (plist-get location :file)
      (format "defined at %s" (swank-mcp--location-text location))
    (swank-mcp--location-text location)))

(defun swank-mcp--undo-replaced-text (entry)
  "What the journal ENTRY's definition replaced, in words."
  (let ((previous (plist-get entry :previous))
        (kind (plist-get entry :kind)))
    (cond ((and previous (plist-get previous :file))
           (format "replaced the definition from %s" (swank-mcp--location-text previous)))
          (previous
           (format "replaced a definition with no source file (%s)"
                   (string-remove-suffix ", no source file" (swank-mcp--location-text previous))))
          ((equal kind "method") "added: restoring removes it")
          ((equal kind "class") "new")
          (t "new: restoring undefines it"))))

(defun swank-mcp-undo-refresh ()
  "Read the image's journal again."
  (interactive)
  (let ((reply (apply #'swank-mcp--undo-call
                      :page-size swank-mcp-undo-page-size
                      (and swank-mcp--undo-before (list :before swank-mcp--undo-before))))
        (line (line-number-at-pos))
        (inhibit-read-only t))
    (setq swank-mcp--undo-page reply)
    (erase-buffer)
    (insert (propertize (format "Definitions agents made in the image of the %s.\n"
                                (swank-mcp--describe-connection swank-mcp--undo-connection
                                                                swank-mcp--undo-backend))
                        'face 'shadow))
    (when (> (plist-get reply :older) 0)
      (insert (propertize (substitute-command-keys
                           (format "(%d older entries: \\<swank-mcp-undo-mode-map>\\[swank-mcp-undo-older] shows them)\n"
                                   (plist-get reply :older)))
                          'face 'shadow)))
    (dolist (entry (plist-get reply :entries))
      (let ((restorable (plist-get entry :restorable))
            (restored (plist-get entry :restored)))
        ;; What became of it on a line of its own, which the truncated entry line cannot cut.
        (insert (propertize
                 (format "%4d  %s  %-8s %s%s: %s\n%s"
                         (plist-get entry :number) (plist-get entry :time) (plist-get entry :kind)
                         (propertize (plist-get entry :name) 'face 'font-lock-function-name-face)
                         (if (plist-get entry :detail) (format " %s" (plist-get entry :detail)) "")
                         (swank-mcp--undo-replaced-text entry)
                         (propertize
                          (cond ((and restored (plist-get entry :agent-file))
                                 (format "      (restored; only in the image: %s still holds the agent's version)\n"
                                         (plist-get (plist-get entry :agent-file) :file)))
                                (restored "      (restored)\n")
                                ((not restorable) (format "      (cannot be restored: %s)\n" (plist-get entry :note)))
                                (t ""))
                          'face 'shadow))
                 'swank-mcp-entry (plist-get entry :number)))))
    (when (> (or (plist-get reply :newer) 0) 0)
      (insert (propertize (substitute-command-keys
                           (format "(%d newer entries: \\<swank-mcp-undo-mode-map>\\[swank-mcp-undo-newer] shows them)\n"
                                   (plist-get reply :newer)))
                          'face 'shadow)))
    (goto-char (point-min))
    (forward-line (1- line))))

(defun swank-mcp-undo-older ()
  "List the entries older than those shown."
  (interactive)
  (let ((first (cl-find-if #'identity (mapcar (lambda (entry) (plist-get entry :number))
                                              (plist-get swank-mcp--undo-page :entries)))))
    (unless (and first (> (plist-get swank-mcp--undo-page :older) 0))
      (user-error "No older entries"))
    (setq swank-mcp--undo-before first)
    (swank-mcp-undo-refresh)
    (goto-char (point-max))))

(defun swank-mcp-undo-newer ()
  "List the entries newer than those shown."
  (interactive)
  (unless (> (or (plist-get swank-mcp--undo-page :newer) 0) 0)
    (user-error "No newer entries"))
  (let* ((last (plist-get (car (last (plist-get swank-mcp--undo-page :entries))) :number))
         (before (+ last 1 swank-mcp-undo-page-size)))
    ;; The page ending just before BEFORE starts after LAST, unless fewer entries follow.
    (setq swank-mcp--undo-before (if (> swank-mcp-undo-page-size (plist-get swank-mcp--undo-page :newer))
                                     nil
                                   before))
    (swank-mcp-undo-refresh)
    (goto-char (point-min))))

(defun swank-mcp--undo-entry-at-point ()
  "The journal entry at point, as the listing gave it."
  (let ((number (or (get-text-property (line-beginning-position) 'swank-mcp-entry)
                    (user-error "No journal entry on this line"))))
    (cl-find number (plist-get swank-mcp--undo-page :entries) :key (lambda (entry) (plist-get entry :number)))))

(defun swank-mcp--undo-restored-text (restored)
  "What became of the entry RESTORED, a plist of the journal's reply."
  (let ((now (plist-get restored :now))
        (kind (plist-get restored :kind))
        (file (plist-get restored :agent-file)))
    (concat (format "Restored %d %s %s: " (plist-get restored :number) kind (plist-get restored :name))
            (cond ((and now (equal kind "method"))
                   (format "the method it replaced is back, %s" (swank-mcp--made-text now)))
                  ((equal kind "method") "removed (the agent added it)")
                  (now (format "now %s" (swank-mcp--made-text now)))
                  (t "undefined again (it was new)"))
            (if file
                (format ".  Only the image changed: %s still holds the agent's version%s"
                        (plist-get file :file)
                        (if (plist-get file :line) (format " (line %d)" (plist-get file :line)) ""))
              ""))))

(defun swank-mcp--undo-restore (what arguments)
  "Restore WHAT (a description) with the journal ARGUMENTS, after asking.
An entry refused because its definition changed since is restored only when
the user, told what changed, says to force it."
  (when (y-or-n-p (format "Restore %s? " what))
    (let* ((reply (apply #'swank-mcp--undo-call arguments))
           (changed (cl-remove-if-not (lambda (skipped) (plist-get skipped :changed)) (plist-get reply :skipped)))
           (forced (and changed
                        (y-or-n-p (format "%s.  Restore anyway, overwriting that definition? "
                                          (mapconcat (lambda (skipped)
                                                       (format "Entry %d %s %s %s" (plist-get skipped :number)
                                                               (plist-get skipped :kind) (plist-get skipped :name)
                                                               (plist-get skipped :reason)))
                                                     changed "; ")))
                        (swank-mcp--undo-call :entries `',(mapcar (lambda (skipped) (plist-get skipped :number))
                                                                 changed)
                                              :force t))))
      (swank-mcp-undo-refresh)
      (message "%s"
               (string-join
                (append (mapcar #'swank-mcp--undo-restored-text
                                (append (plist-get reply :restored) (plist-get forced :restored)))
                        (mapcar (lambda (skipped) (format "Not restored %d %s: %s" (plist-get skipped :number)
                                                          (plist-get skipped :name) (plist-get skipped :reason)))
                                (append (cl-remove-if (lambda (skipped) (and forced (plist-get skipped :changed)))
                                                      (plist-get reply :skipped))
                                        (plist-get forced :skipped))))
                "\n")))))

(defun swank-mcp-undo-restore ()
  "Put back what the entry at point replaced, after asking.
A definition changed since the agent's call is overwritten only when you
say to force it."
  (interactive)
  (let ((entry (swank-mcp--undo-entry-at-point)))
    (swank-mcp--undo-restore (format "entry %d, %s %s" (plist-get entry :number) (plist-get entry :kind)
                                     (plist-get entry :name))
                             (list :entries `'(,(plist-get entry :number))))))

(defun swank-mcp-undo-restore-since ()
  "Put back every entry from the one at point on, newest first, after asking."
  (interactive)
  (let ((entry (swank-mcp--undo-entry-at-point)))
    (swank-mcp--undo-restore (format "every entry from %d on" (plist-get entry :number))
                             (list :since (plist-get entry :number)))))

;;;;; Approval mode
;;
;; A prompt must never take keys meant for something else: it is shown in a
;; window of its own that is not selected, so that what the user types goes
;; on reaching the buffer they type in, and it is answered only by a key
;; sequence no typing makes (C-c C-c, C-c C-k, C-c C-a, as a commit message
;; buffer is), in the prompt's own buffer.  "Allow for the session" asks
;; again, and a prompt whose call has just taken the place of another takes
;; no answer for a moment (`swank-mcp-approval-read-delay').

(defcustom swank-mcp-approval-read-delay 1.0
  "Seconds a call must have been shown in the prompt before it takes an answer.
They count from when the call took its place in the prompt, or later, from
when the prompt's window was shown again or selected.  An answer sooner,
such as a second \\<swank-mcp-approval-buffer-mode-map>\\[swank-mcp-approve] meant for the call shown before, or one
typed right after going to the prompt, is refused, so that a call is never
answered before it could be read."
  :type 'number
  :group 'swank-mcp)

(defconst swank-mcp--approval-display-action
  '((display-buffer-reuse-window display-buffer-in-side-window)
    (side . bottom)
    (window-height . swank-mcp--fit-approval-window)
    (inhibit-same-window . t))
  "How the prompt is shown: beside the windows shown, so that they stay.")

(defvar swank-mcp--approval-channels nil
  "The channels subscribed to approvals: a list of (CONNECTION BACKEND CHANNEL).")

(defvar swank-mcp--approvals-answered 0
  "How many calls were answered here since none was waiting.
The prompt numbers the calls of such a batch, those answered and those
waiting: the second of two is (2 of 2), before and after the first is
answered.  A call that ended otherwise (cancelled, timed out, answered in
another Emacs) leaves the batch: the one left of two is (1 of 1).")

(defvar swank-mcp--approvals-numbered nil
  "Whether the prompt numbers the calls: once two of a batch were counted.")

(defun swank-mcp--approvals-forget-batch ()
  "Start a new batch: none waits."
  (setq swank-mcp--approvals-answered 0
        swank-mcp--approvals-numbered nil))

(defvar swank-mcp--answering nil
  "The approval whose answer is on its way to the image.
The image may say that its request ended before it answers: that end is
the answer's own.")

(defvar swank-mcp--asking nil
  "The approval whose \"allow for the session\" question the minibuffer asks.")

(defvar-local swank-mcp--approval-shown nil
  "The approval the approval buffer shows: an element of `swank-mcp--approvals'.
Once it has ended while the person was answering, the one it showed.")

(defvar-local swank-mcp--approval-ended nil
  "Why the call the prompt shows ended, as the prompt says it; nil while it waits.
The prompt of a call that ended while the person was answering it stays, its
keys inert, until they dismiss it.")

(defvar-local swank-mcp--approval-shown-since 0
  "When the person could begin to read what the approval buffer shows.
That is when it began to show `swank-mcp--approval-shown', or later, when
its window was shown again or selected: the read delay counts from then.")

(defvar swank-mcp-approval-buffer-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "C-c C-c") #'swank-mcp-approve)
    (define-key map (kbd "C-c C-k") #'swank-mcp-decline)
    (define-key map (kbd "C-c C-a") #'swank-mcp-approve-for-session)
    (define-key map (kbd "q") #'swank-mcp-approval-hide)
    map)
  "Keymap of `swank-mcp-approval-buffer-mode'.")

(defvar swank-mcp-approval-ended-map
  (let ((map (make-sparse-keymap)))
    (set-keymap-parent map swank-mcp-approval-buffer-mode-map)
    ;; The keys that answer, and those typed when a question goes (yes RET),
    ;; only say that the call ended.
    (dolist (key '("C-c C-c" "C-c C-k" "C-c C-a" "RET" "SPC" "DEL" "TAB" "C-j" "g"))
      (define-key map (kbd key) #'swank-mcp-approval-ended-key))
    (define-key map [remap self-insert-command] #'swank-mcp-approval-ended-key)
    (define-key map (kbd "q") #'swank-mcp-approval-dismiss)
    map)
  "Keymap of the prompt of a call that ended while the person was answering it.")

(define-derived-mode swank-mcp-approval-buffer-mode special-mode "swank-mcp approval"
  "A tool call that waits for your approval.
\\<swank-mcp-approval-buffer-mode-map>\\[swank-mcp-approve] runs it, \\[swank-mcp-decline] declines it,
\\[swank-mcp-approve-for-session] runs it and allows the tool for the agent's session, after asking you.
\\[swank-mcp-approval-hide] hides the window: the call goes on waiting.
No key that typing makes answers: a prompt that comes while you type in
another buffer leaves your keys to that buffer."
  (setq truncate-lines nil)
  (add-hook 'window-selection-change-functions #'swank-mcp--approval-selected nil t))

(defun swank-mcp--approval-selected (window)
  "Start the read delay again as WINDOW, the prompt's, is selected.
The keys typed next go to the prompt, and a prompt is answered only once
it could be read there (`swank-mcp-approval-read-delay')."
  (when (eq window (selected-window))
    (with-current-buffer (window-buffer window)
      (setq swank-mcp--approval-shown-since (float-time)))))

;;;###autoload
(define-minor-mode swank-mcp-approval-mode
  "Approve in Emacs the tool calls swank-mcp runs with --confirm.
While it is on, every image Emacs is connected to (SLIME and SLY) tells
Emacs of calls waiting for approval.  Each is shown with its code or diff in
the buffer *swank-mcp approval*, in a window at the bottom of the frame
that is not selected, with a bell and a message in the echo area: you go on
typing where you were.  Go to that window (\\[swank-mcp-show-approval]),
read, and answer there: \\<swank-mcp-approval-buffer-mode-map>\\[swank-mcp-approve] runs the call, \\[swank-mcp-decline] declines it,
\\[swank-mcp-approve-for-session] runs it and allows the tool for the rest of the agent's
session (after asking you)."
  :global t
  :group 'swank-mcp
  :lighter " MCP-approve"
  (dolist (backend (list swank-mcp--slime swank-mcp--sly))
    (if swank-mcp-approval-mode
        (progn (add-hook (swank-mcp--backend-connected-hook backend) #'swank-mcp--approval-subscribe)
               (add-hook (swank-mcp--backend-close-hooks backend) #'swank-mcp--approval-connection-closed))
      (remove-hook (swank-mcp--backend-connected-hook backend) #'swank-mcp--approval-subscribe)
      (remove-hook (swank-mcp--backend-close-hooks backend) #'swank-mcp--approval-connection-closed)))
  (if swank-mcp-approval-mode
      (swank-mcp--approval-subscribe)
    ;; The calls waiting are not left to wait for an answer nobody gives until
    ;; --confirm-timeout: the image refuses them at once, and tells their agents
    ;; why, unless another Emacs in approval mode can answer them.
    (pcase-dolist (`(,connection ,backend ,channel) swank-mcp--approval-channels)
      (swank-mcp--unsubscribe connection backend channel
                              (swank-mcp--helper-call "REFUSE-UNWATCHED-APPROVALS")
                              (lambda (refused)
                                (swank-mcp--approval-mode-off-said connection backend refused))))
    (let ((shown (swank-mcp--approval-shown)))
      (when (and shown (swank-mcp--approval-engaged-p shown))
        (swank-mcp--approval-end-shown shown '("approval mode was turned off" "it is not answered here"))))
    (setq swank-mcp--approval-channels nil
          swank-mcp--approvals nil)
    (swank-mcp--approval-show)))

(defun swank-mcp--approval-connection-closed (connection)
  "Forget every approval asked by CONNECTION's image, which closed.
No prompt stays for them, not even one the person was answering, and no
key is left bound to them; the echo area says so."
  (let ((dead (cl-remove-if-not (lambda (approval) (eq (car approval) connection)) swank-mcp--approvals))
        (buffer (get-buffer swank-mcp--approval-buffer-name)))
    (setq swank-mcp--approval-channels (cl-remove connection swank-mcp--approval-channels :key #'car)
          swank-mcp--approvals (cl-set-difference swank-mcp--approvals dead))
    (when (and buffer (eq connection (car (buffer-local-value 'swank-mcp--approval-shown buffer))))
      (with-current-buffer buffer
        (setq swank-mcp--approval-ended nil
              swank-mcp--approval-shown nil)
        (use-local-map swank-mcp-approval-buffer-mode-map)))
    (let ((asked swank-mcp--asking))
      (when (eq (car asked) connection)
        (run-at-time 0 nil (lambda ()
                             (when (eq swank-mcp--asking asked)
                               (throw 'swank-mcp--question-ended :ended))))))
    (swank-mcp--approval-show)
    (when dead
      (message "swank-mcp: the Lisp connection closed: %s waiting for approval ended with it and did not run."
               (if (cdr dead) (format "%d calls" (length dead)) (plist-get (nth 2 (car dead)) :tool))))))

(defun swank-mcp--approval-mode-off-said (connection backend refused)
  "Say what became of the requests of CONNECTION's image as the mode went off.
REFUSED is the image's answer: how many it refused, or :watched when another
Emacs in approval mode answers them; nil without the helper.  BACKEND names
the front end."
  (cond ((eq refused :watched)
         (message "swank-mcp: approval mode is off; the calls waiting in the image of the %s are left to the other Emacs in approval mode there."
                  (swank-mcp--describe-connection connection backend)))
        ((and (integerp refused) (> refused 0))
         (message "swank-mcp: approval mode is off; %d call%s waiting in the image of the %s %s refused, and the agent%s told why."
                  refused (if (= refused 1) "" "s") (swank-mcp--describe-connection connection backend)
                  (if (= refused 1) "was" "were") (if (= refused 1) " is" "s are")))))

(defun swank-mcp--connections ()
  "Every open connection, as (CONNECTION . BACKEND)."
  (cl-loop for backend in (list swank-mcp--slime swank-mcp--sly)
           for variable = (swank-mcp--backend-connections backend)
           when (boundp variable)
           append (cl-loop for connection in (symbol-value variable)
                           when (process-live-p connection)
                           collect (cons connection backend))))

(defun swank-mcp--approval-subscribe ()
  "Subscribe every open connection not subscribed yet to its image's approvals."
  (setq swank-mcp--approval-channels
        (cl-remove-if-not (lambda (subscribed) (process-live-p (car subscribed))) swank-mcp--approval-channels))
  (pcase-dolist (`(,connection . ,backend) (swank-mcp--connections))
    (unless (assq connection swank-mcp--approval-channels)
      (push (list connection backend
                  (swank-mcp--subscribe
                   connection backend :approvals
                   `((:approval . ,(lambda (_channel &rest plist)
                                     (swank-mcp--approval-add connection backend plist)))
                     (:approval-ended . ,(lambda (_channel &rest plist)
                                           (swank-mcp--approval-ended connection plist))))))
            swank-mcp--approval-channels))))

(defun swank-mcp--fit-approval-window (window)
  "Make WINDOW as tall as the prompt in it, up to half its frame."
  (fit-window-to-buffer window (max window-min-height (/ (frame-height (window-frame window)) 2))))

(defun swank-mcp--approval-key (command &optional map)
  "The keys of COMMAND in the prompt, as text.
MAP names the prompt's keymap, by default `swank-mcp-approval-buffer-mode-map'."
  (substitute-command-keys (format "\\<%s>\\[%s]" (or map 'swank-mcp-approval-buffer-mode-map) command)))

(defun swank-mcp--approval-go-key ()
  "Return the keys that go to the prompt, as text."
  (if swank-mcp-key-prefix
      (format "%s p" (key-description swank-mcp-key-prefix))
    "M-x swank-mcp-show-approval"))

(defun swank-mcp--approval-number (approval)
  "Return \" (N of M)\" for APPROVAL, the Nth of a batch of M that came together.
Return \"\" for a call that came alone.  See `swank-mcp--approvals-answered'."
  (let ((position (cl-position approval swank-mcp--approvals)))
    (if (or (null position) (not swank-mcp--approvals-numbered))
        ""
      (format " (%d of %d)"
              (+ swank-mcp--approvals-answered position 1)
              (+ swank-mcp--approvals-answered (length swank-mcp--approvals))))))

(defun swank-mcp--approval-heading (approval)
  "The first line of the prompt for APPROVAL."
  (let ((plist (nth 2 approval)))
    (format "%s asks to run %s.%s"
            (or (plist-get plist :client) "The agent")
            (plist-get plist :tool)
            (swank-mcp--approval-number approval))))

(defun swank-mcp--approval-add (connection backend plist)
  "Note the approval PLIST that CONNECTION's image asks for, and show it.
BACKEND says how to reach the image.  The prompt shows the oldest call
waiting; each new one is announced with its window, a bell and a message.
One the image tells of twice (as it subscribes this Emacs, see
`swank-mcp--subscribe-form') is shown once."
  (let ((approval (list connection backend plist)))
    (unless (swank-mcp--approval-find connection (plist-get plist :id))
      (swank-mcp--approval-announce approval))))

(defun swank-mcp--approval-announce (approval)
  "Add APPROVAL to those waiting, and announce it."
  (setq swank-mcp--approvals (append swank-mcp--approvals (list approval)))
  (when (> (+ swank-mcp--approvals-answered (length swank-mcp--approvals)) 1)
    (setq swank-mcp--approvals-numbered t))
  (let ((buffer (swank-mcp--approval-show)))
    (when buffer
      (unless (get-buffer-window buffer t)
        ;; Hidden until now: what it shows is read from now on.
        (with-current-buffer buffer
          (setq swank-mcp--approval-shown-since (float-time))))
      (display-buffer buffer swank-mcp--approval-display-action)
      (ding t)
      (message "swank-mcp: %s  Answer in %s (%s goes there)."
               (swank-mcp--approval-heading approval) swank-mcp--approval-buffer-name
               (swank-mcp--approval-go-key)))))

(defun swank-mcp--approval-find (connection id)
  "The approval ID of CONNECTION's image that waits, or nil."
  (cl-find-if (lambda (approval)
                (and (eq (car approval) connection) (eql (plist-get (nth 2 approval) :id) id)))
              swank-mcp--approvals))

(defun swank-mcp--approval-remove (approval &optional ended answered)
  "Forget APPROVAL: it was answered or has ended.
With ENDED, (REASON CONSEQUENCE) as `swank-mcp--approval-end-shown' takes
them, the prompt that shows it stays, saying so.  ANSWERED says that it
was answered here, and so stays counted in its batch."
  (setq swank-mcp--approvals (delq approval swank-mcp--approvals))
  (when answered
    (cl-incf swank-mcp--approvals-answered))
  (unless swank-mcp--approvals
    (swank-mcp--approvals-forget-batch))
  (when ended
    (swank-mcp--approval-end-shown approval ended))
  (swank-mcp--approval-show))

(defun swank-mcp--approval-next-text ()
  "Return the heading of the next call in the prompt, if one waits."
  (let ((next (or (swank-mcp--approval-shown) (car swank-mcp--approvals))))
    (if next
        (format "  Next: %s" (swank-mcp--approval-heading next))
      "")))

(defun swank-mcp--approval-engaged-p (approval)
  "Whether the person may be answering APPROVAL now.
They are when Emacs asks them about it in the minibuffer, or when the prompt
shows it in the selected window (or in the window the minibuffer was entered
from): the keys they type next are meant for it."
  (let ((buffer (get-buffer swank-mcp--approval-buffer-name))
        (window (if (window-minibuffer-p)
                    (or (minibuffer-selected-window) (selected-window))
                  (selected-window))))
    (or (eq swank-mcp--asking approval)
        (and buffer
             (eq approval (buffer-local-value 'swank-mcp--approval-shown buffer))
             (eq (window-buffer window) buffer)))))

(defun swank-mcp--ended-why (verdict)
  "How the request that ended with VERDICT ended, as (REASON CONSEQUENCE)."
  (pcase verdict
    (:timeout '("timed out" "nothing ran"))
    (:cancelled '("the agent withdrew it" "nothing ran"))
    (:lost '("the agent's server went away" "nothing ran"))
    (:no '("declined in another Emacs" "nothing ran"))
    (:cancelled-in-emacs '("cancelled in Emacs" "nothing ran"))
    ((or :yes :always) '("approved in another Emacs" "the call runs"))
    (:turned-off '("approval mode was turned off" "nothing ran"))
    (_ (list (format "%s" verdict) "nothing ran"))))

(defun swank-mcp--approval-end-shown (approval why)
  "Keep the prompt of APPROVAL, which ended, saying WHY, until it is dismissed.
WHY is (REASON CONSEQUENCE).  Its window stays where it is, selected or not:
focus never moves, so what the person goes on typing reaches the prompt, whose
keys now only say that the call ended (`swank-mcp-approval-ended-map').  A
question the minibuffer asks about it is taken back (`swank-mcp--answer')."
  (let ((buffer (get-buffer swank-mcp--approval-buffer-name)))
    (when (and buffer (eq approval (buffer-local-value 'swank-mcp--approval-shown buffer)))
      (with-current-buffer buffer
        (setq swank-mcp--approval-ended
              (format "This request ended (%s); %s." (car why) (cadr why)))
        (use-local-map swank-mcp-approval-ended-map)
        (swank-mcp--approval-insert approval)))
    (when (eq swank-mcp--asking approval)
      ;; From a timer, which runs inside the minibuffer's wait, as `with-timeout' does: not
      ;; from the connection's process filter, in the middle of its input.
      (run-at-time 0 nil (lambda ()
                           (when (eq swank-mcp--asking approval)
                             (throw 'swank-mcp--question-ended :ended)))))))

(defun swank-mcp--approval-ended (connection plist)
  "The image ended the approval request PLIST of CONNECTION's image.
PLIST has the request's :id and :verdict.  A request not answered here
ended by itself: the echo area says how, and that nothing ran.  When the
person was answering it, its prompt stays, saying so."
  (let ((approval (swank-mcp--approval-find connection (plist-get plist :id))))
    (when (and approval (not (eq approval swank-mcp--answering)))
      (let ((tool (plist-get (nth 2 approval) :tool)))
        (swank-mcp--approval-remove approval (and (swank-mcp--approval-engaged-p approval)
                                                  (swank-mcp--ended-why (plist-get plist :verdict))))
        (message "swank-mcp: %s%s"
                 (pcase (plist-get plist :verdict)
                   (:timeout (format "nobody answered in time: the approval request of %s timed out \
\(--confirm-timeout) and it did not run." tool))
                   (:cancelled (format "the agent withdrew its request: %s was cancelled and did not run." tool))
                   (:lost (format "the agent's server went away (it exited or was killed): %s did not run." tool))
                   ((or :yes :always) (format "%s was approved in another Emacs." tool))
                   (:no (format "%s was declined in another Emacs; it did not run." tool))
                   (:cancelled-in-emacs (format "%s was cancelled in Emacs (M-x swank-mcp-cancel-call); it did not run."
                                                tool))
                   (:turned-off (format "approval mode was turned off: %s did not run." tool))
                   (_ (format "the approval request of %s ended; %s did not run." tool tool)))
                 (swank-mcp--approval-next-text))))))

(defun swank-mcp--approval-shown ()
  "Return the approval in the prompt, or nil when none waits there."
  (let ((buffer (get-buffer swank-mcp--approval-buffer-name)))
    (and buffer
         (not (buffer-local-value 'swank-mcp--approval-ended buffer))
         (buffer-local-value 'swank-mcp--approval-shown buffer))))

(defun swank-mcp--approval-insert (approval)
  "Fill the current buffer, the prompt, with APPROVAL.
Once it has ended, with why instead of the keys that answer."
  ;; The keys again in the header line, which stays as a long diff scrolls.
  (setq header-line-format
        (if swank-mcp--approval-ended
            (format "This request ended: %s dismisses it"
                    (swank-mcp--approval-key 'swank-mcp-approval-dismiss 'swank-mcp-approval-ended-map))
          (format "%s run, %s decline, %s run and allow for the session, %s hide"
                  (swank-mcp--approval-key 'swank-mcp-approve)
                  (swank-mcp--approval-key 'swank-mcp-decline)
                  (swank-mcp--approval-key 'swank-mcp-approve-for-session)
                  (swank-mcp--approval-key 'swank-mcp-approval-hide))))
  (let ((inhibit-read-only t))
    (erase-buffer)
    (insert (propertize (swank-mcp--approval-heading approval) 'face 'bold) "\n"
            (if swank-mcp--approval-ended
                (propertize (format "%s  %s to dismiss.\n\n" swank-mcp--approval-ended
                                    (swank-mcp--approval-key 'swank-mcp-approval-dismiss 'swank-mcp-approval-ended-map))
                            'face 'warning)
              (propertize
               (format "%s runs it, %s declines it, %s runs it and allows %s for the rest of \
the session (after asking you).  %s hides this window; the call goes on waiting.\n\n"
                       (swank-mcp--approval-key 'swank-mcp-approve)
                       (swank-mcp--approval-key 'swank-mcp-decline)
                       (swank-mcp--approval-key 'swank-mcp-approve-for-session)
                       (plist-get (nth 2 approval) :tool)
                       (swank-mcp--approval-key 'swank-mcp-approval-hide))
               'face 'shadow))
            (swank-mcp--fontify-shown (or (plist-get (nth 2 approval) :text) ""))
            "\n")
    (goto-char (point-min))
    (dolist (window (get-buffer-window-list (current-buffer) nil t))
      (set-window-point window (point-min))
      (set-window-start window (point-min)))))

(defun swank-mcp--approval-show (&optional wanted)
  "Show WANTED, the approval shown, or the oldest waiting; return the buffer.
When none waits, close the buffer and return nil.  The buffer is not
displayed here.  Approvals of connections that closed are dropped: nobody can
answer them.  A prompt whose call ended while the person was answering it
stays as it is until they dismiss it."
  (setq swank-mcp--approvals
        (cl-remove-if-not (lambda (approval) (process-live-p (car approval))) swank-mcp--approvals))
  (let ((buffer (get-buffer swank-mcp--approval-buffer-name)))
    (cond
     ((and buffer (buffer-local-value 'swank-mcp--approval-ended buffer))
      buffer)
     ((null swank-mcp--approvals)
      (swank-mcp--approvals-forget-batch)
      (when buffer
        (quit-windows-on buffer)
        (kill-buffer buffer))
      nil)
     (t
      (with-current-buffer (get-buffer-create swank-mcp--approval-buffer-name)
        (unless (derived-mode-p 'swank-mcp-approval-buffer-mode)
          (swank-mcp-approval-buffer-mode))
        (let ((shown (cond ((memq wanted swank-mcp--approvals) wanted)
                           ((memq swank-mcp--approval-shown swank-mcp--approvals) swank-mcp--approval-shown)
                           (t (car swank-mcp--approvals)))))
          (if (eq shown swank-mcp--approval-shown)
              ;; The same call, whose number may have changed: the rest stays, and so
              ;; does where the user scrolled to.
              (let ((inhibit-read-only t))
                (save-excursion
                  (goto-char (point-min))
                  (delete-region (point) (line-end-position))
                  (insert (propertize (swank-mcp--approval-heading shown) 'face 'bold))))
            (setq swank-mcp--approval-shown shown
                  swank-mcp--approval-shown-since (float-time))
            (swank-mcp--approval-insert shown)))
        (current-buffer))))))

(defun swank-mcp-approval-ended-key ()
  "Say that the call of this prompt ended; do nothing else."
  (interactive)
  (message "swank-mcp: %s  %s to dismiss." swank-mcp--approval-ended
           (swank-mcp--approval-key 'swank-mcp-approval-dismiss 'swank-mcp-approval-ended-map)))

(defun swank-mcp-approval-dismiss ()
  "Dismiss the prompt of a call that ended: show the next call waiting, if any."
  (interactive)
  (setq swank-mcp--approval-ended nil
        swank-mcp--approval-shown nil)
  (use-local-map swank-mcp-approval-buffer-mode-map)
  (swank-mcp--approval-show))

(defun swank-mcp--answer (verdict)
  "Answer the approval shown in the current buffer with VERDICT.
Return what the image says: :taken, :ended when the request had ended, or
\(:refused WHY) when the server checked the approved call and refused it,
WHY saying what changed since the prompt was shown (its file); nil when
the user took back an answer that needed confirming."
  (let ((shown swank-mcp--approval-shown))
    (when swank-mcp--approval-ended
      (user-error "%s" swank-mcp--approval-ended))
    (unless (and (derived-mode-p 'swank-mcp-approval-buffer-mode) (memq shown swank-mcp--approvals))
      (user-error "No call waits for approval here; answer in %s" swank-mcp--approval-buffer-name))
    (when (< (- (float-time) swank-mcp--approval-shown-since) swank-mcp-approval-read-delay)
      (user-error "This call was shown a moment ago: read it, then answer"))
    (pcase-let* ((`(,connection ,backend ,plist) shown)
                 (tool (plist-get plist :tool))
                 (confirmed
                  (or (not (eq verdict :always))
                      ;; A request that ends meanwhile takes the question back
                      ;; (`swank-mcp--approval-end-shown').
                      (catch 'swank-mcp--question-ended
                        (let ((swank-mcp--asking shown))
                          (yes-or-no-p (format "Run %s now, and every later %s call of %s without asking you, \
for the rest of its session? "
                                               tool tool (or (plist-get plist :client) "this agent"))))))))
      (cond
       ((not (memq shown swank-mcp--approvals))
        (message "swank-mcp: this request (%s) ended while you were asked; nothing ran.%s"
                 tool (swank-mcp--approval-next-text))
        :ended)
       ((not confirmed)
        (message "swank-mcp: not answered; %s still waits" tool)
        nil)
       (t
        (let ((taken (let ((swank-mcp--answering shown))
                       (swank-mcp--eval connection backend
                                        (swank-mcp--helper-call "ANSWER-APPROVAL" (plist-get plist :id) verdict)))))
          (swank-mcp--approval-remove shown nil t)
          (message "swank-mcp: %s%s"
                   (pcase taken
                     (:taken
                      (format "%s %s" tool
                              (pcase verdict
                                (:yes "approved; it runs now.")
                                (:no "declined; it does not run.")
                                (:always "approved, and allowed for the rest of the session."))))
                     (`(:refused ,why)
                      (format "%s was approved, but refused because %s; nothing ran." tool why))
                     (_ (format "this request (%s) already ended; nothing ran." tool)))
                   (swank-mcp--approval-next-text))
          (or taken :ended)))))))

(defun swank-mcp-approve ()
  "Run the call shown."
  (interactive)
  (swank-mcp--answer :yes))

(defun swank-mcp-decline ()
  "Decline the call shown: it does not run."
  (interactive)
  (swank-mcp--answer :no))

(defun swank-mcp-approve-for-session ()
  "Run the call shown, and allow its tool for the rest of the agent's session.
You are asked to confirm it first."
  (interactive)
  (swank-mcp--answer :always))

(defun swank-mcp-approval-hide ()
  "Hide the prompt; what is in it waits on for your answer."
  (interactive)
  (quit-window)
  (message "swank-mcp: %d call%s still wait%s for your answer; %s shows the prompt again."
           (length swank-mcp--approvals) (if (cdr swank-mcp--approvals) "s" "")
           (if (cdr swank-mcp--approvals) "" "s") (swank-mcp--approval-go-key)))

(defun swank-mcp-show-approval (&optional approval)
  "Go to the prompt, where what waits for your approval is shown.
With APPROVAL, an element of `swank-mcp--approvals', the prompt shows that one."
  (interactive)
  (let ((buffer (swank-mcp--approval-show approval)))
    (unless buffer
      (user-error "No call waits for your approval"))
    (unless (eq (window-buffer (selected-window)) buffer)
      ;; Read from now on: an answer typed right after going there is refused
      ;; (`swank-mcp-approval-read-delay').
      (with-current-buffer buffer
        (setq swank-mcp--approval-shown-since (float-time))))
    (select-window (display-buffer buffer swank-mcp--approval-display-action))))

;;;;; Taking back "allow for the session"

;;;###autoload
(defun swank-mcp-revoke-session-allowances ()
  "Make every tool you allowed for an agent's session need your approval again.
This applies to every image Emacs is connected to.  Return the tools revoked,
each (TOOL CLIENT)."
  (interactive)
  (let ((revoked
         (cl-loop for (connection . backend) in (swank-mcp--connections)
                  append (swank-mcp--eval connection backend
                                          (swank-mcp--helper-call "REVOKE-SESSION-ALLOWANCES")))))
    (message "swank-mcp: %s"
             (if revoked
                 (format "%s need%s your approval again"
                         (mapconcat (lambda (allowance) (format "%s (for %s)" (car allowance) (cadr allowance)))
                                    revoked ", ")
                         (if (cdr revoked) "" "s"))
               "no tool was allowed for a session"))
    revoked))

;;;;; Stopping an agent's call

;;;###autoload
(defun swank-mcp-cancel-call (&optional then)
  "End an agent's call: the newest one running or waiting for approval.
In an activity buffer, the call at point.  A running call's evaluation in
the image is interrupted at once, and so is any it would start after, and
the agent receives the reply that you cancelled the call; what it did
before that stays done.  A call waiting for approval is cancelled: it
does not run, and its agent is told that it was declined.
Emacs does not wait for the image, which may be busy (your REPL's own
evaluation included): the echo area says what happened once it answers.
THEN, when given, is called with the image's answer, a plist (nil when no
agent has worked in the image)."
  (interactive)
  (pcase-let ((`(,connection . ,backend)
               (if (derived-mode-p 'swank-mcp-activity-mode)
                   (cons swank-mcp--activity-connection swank-mcp--activity-backend)
                 (swank-mcp--require-current)))
              (call (and (derived-mode-p 'swank-mcp-activity-mode)
                         (get-text-property (point) 'swank-mcp-call))))
    (when (and call (plist-get (cl-find call swank-mcp--activity-calls
                                        :key (lambda (c) (plist-get c :id)) :test #'equal)
                               :event))
      (user-error "This line is an event, not a call: there is nothing to cancel"))
    (swank-mcp--eval-async connection backend
                           (swank-mcp--helper-call "CANCEL-CALL" (or call 'cl:nil))
                           (lambda (reply)
                             (swank-mcp--cancel-said reply)
                             (when then
                               (funcall then reply))))))

(defun swank-mcp--cancel-said (reply)
  "Tell in the echo area what the image's REPLY to a cancellation means."
  (let ((record (or (plist-get reply :cancelled) (plist-get reply :declined))))
    (message "swank-mcp: %s"
             (cond ((null reply) "no agent has worked in this image yet.")
                   ((plist-get reply :failure) (plist-get reply :failure))
                   (t
                    (format (cond ((plist-get reply :declined)
                                   "cancelled %s (%s), which waited for approval; it does not run.")
                                  ((> (plist-get reply :interrupted) 0)
                                   "cancelled %s (%s): its evaluation was interrupted, and the agent is told.")
                                  (t "cancelled %s (%s): it had no evaluation running in the image; it stops \
at its next one, and the agent is told."))
                            (plist-get record :tool) (or (plist-get record :client) "unknown client")))))))

;;;;; Clearing the agents' breakpoints

;;;###autoload
(defun swank-mcp-clear-breakpoints (&optional then)
  "Remove every breakpoint agents set in the current connection's image.
In an activity buffer, its connection's image.  An agent's breakpoint
stops any thread that calls its function, yours included, and the thread
waits for the agent; after this no call stops for an agent.  A thread that
waits at one already still waits until its agent continues it.  Emacs does
not wait for the image: the echo area says what was removed once it
answers.  THEN, when given, is called with the image's answer, the removed
breakpoints' plists (nil when there were none)."
  (interactive)
  (pcase-let ((`(,connection . ,backend)
               (if (derived-mode-p 'swank-mcp-activity-mode)
                   (cons swank-mcp--activity-connection swank-mcp--activity-backend)
                 (swank-mcp--require-current))))
    (swank-mcp--eval-async connection backend
                           (swank-mcp--helper-call "REMOVE-ALL-BREAKPOINTS")
                           (lambda (removed)
                             (message "swank-mcp: %s"
                                      (if removed
                                          (format "removed the agents' breakpoint%s on %s."
                                                  (if (cdr removed) "s" "")
                                                  (mapconcat (lambda (breakpoint)
                                                               (format "%s (%d)" (plist-get breakpoint :function)
                                                                       (plist-get breakpoint :number)))
                                                             removed ", "))
                                        "no agent has a breakpoint in this image."))
                             (when then
                               (funcall then removed))))))

;;;;; The buffers of the files agents write
;;
;; An agent's edit-lisp-form writes a file the person may have open.  Once
;; swank-mcp is turned on, Emacs subscribes every connection to the agents'
;; calls that named files (topic :files), and as such a call ends it looks
;; at the buffers visiting those files: a file whose date changed was
;; written.  A buffer without unsaved changes is reverted to the agent's
;; text; one with unsaved changes is left alone, and the person is told,
;; since compiling its text would load their older version over the
;; agent's.  Such a compilation is flagged in the activity buffer too.

(defvar swank-mcp--file-channels nil
  "The channels subscribed to the agents' writes of files.
A list of (CONNECTION BACKEND CHANNEL).")

(defvar-local swank-mcp--agent-write nil
  "The agent's write of the visited file that the buffer's text predates, or nil.
A plist of the image's :written message (:tool, :client, :time), set when
the buffer had unsaved changes as the agent wrote the file, and so was not
reverted; nil again once it is.")
;; Kept as the major mode runs again, as a revert that preserves no modes makes it.
(put 'swank-mcp--agent-write 'permanent-local t)

(defun swank-mcp--watch-files ()
  "Subscribe every open connection not subscribed yet to the agents' writes."
  (setq swank-mcp--file-channels
        (cl-remove-if-not (lambda (subscribed) (process-live-p (car subscribed))) swank-mcp--file-channels))
  (pcase-dolist (`(,connection . ,backend) (swank-mcp--connections))
    (unless (assq connection swank-mcp--file-channels)
      (push (list connection backend
                  (swank-mcp--subscribe connection backend :files
                                        `((:written . ,(lambda (_channel &rest written)
                                                         (swank-mcp--agent-wrote connection backend written))))))
            swank-mcp--file-channels))))

(defun swank-mcp--unwatch-files ()
  "Drop every subscription to the agents' writes."
  (pcase-dolist (`(,connection ,backend ,channel) swank-mcp--file-channels)
    (swank-mcp--unsubscribe connection backend channel))
  (setq swank-mcp--file-channels nil))

(defun swank-mcp--writer-text (written)
  "Who wrote, and how, by WRITTEN, the image's :written message."
  (format "%s's %s at %s" (or (plist-get written :client) "the agent") (plist-get written :tool)
          (plist-get written :time)))

(defun swank-mcp--agent-wrote (connection backend written)
  "An agent's call that named files ended; WRITTEN is the image's message.
Each buffer that visits one of its :files that changed on disk since the
buffer read or saved it is reverted when it has no unsaved changes, and
otherwise left as it is, the person told in the echo area and in the
activity buffer of CONNECTION's image (BACKEND says how to reach it)."
  (dolist (file (plist-get written :files))
    (let ((buffer (find-buffer-visiting file)))
      (when (and buffer (file-exists-p file) (not (verify-visited-file-modtime buffer)))
        (with-current-buffer buffer
          (if (buffer-modified-p)
              (let ((text (format "%s wrote %s, which the buffer %s visits with unsaved changes: the buffer \
was left as it is, its text older than the agent's (M-x revert-buffer shows the agent's; saving overwrites it)."
                                  (swank-mcp--writer-text written) file (buffer-name))))
                (setq swank-mcp--agent-write written)
                (add-hook 'after-revert-hook #'swank-mcp--forget-agent-write nil t)
                (message "swank-mcp: %s" text)
                (swank-mcp--note-emacs-event connection backend :buffer-kept text))
            (revert-buffer t t t)
            (message "%s" (format "swank-mcp: %s wrote %s; its buffer now shows the agent's text."
                                  (swank-mcp--writer-text written) (buffer-name)))))))))

(defun swank-mcp--forget-agent-write ()
  "Note that this buffer, reverted, no longer predates an agent's write."
  (setq swank-mcp--agent-write nil))
;; Run from the buffer-local hook after a revert that runs the major mode again.
(put 'swank-mcp--forget-agent-write 'permanent-local-hook t)

(defun swank-mcp--note-emacs-event (connection backend kind text)
  "Record the event KIND, told by TEXT, in the activity record of an image.
The image is CONNECTION's, reached as BACKEND says.  Every activity buffer
shows the event among the agents' calls."
  (swank-mcp--eval-async connection backend (swank-mcp--helper-call "NOTE-EMACS-EVENT" kind text) #'ignore))

(defun swank-mcp--check-stale-compile (start end)
  "Flag a compilation of START to END whose text predates an agent's write.
For `slime-before-compile-functions', and before SLY compiles: the buffer
was not reverted since an agent wrote its file, so the image is about to
run the person's older text where the agent's was loaded.  Said in the
echo area and in the activity buffer; the compilation goes on."
  (let ((current (swank-mcp--current)))
    (when (and swank-mcp--agent-write current)
      (let ((text (format "%s compiled from the buffer %s, whose text is older than the agent's write of %s \
\(%s): the image now runs that older text where the agent's was loaded (M-x revert-buffer shows the agent's)."
                          (if (and (= start (point-min)) (= end (point-max)))
                              "The whole file was"
                            (format "Line %d was" (line-number-at-pos start)))
                          (buffer-name) buffer-file-name (swank-mcp--writer-text swank-mcp--agent-write))))
        (message "swank-mcp: %s" text)
        (swank-mcp--note-emacs-event (car current) (cdr current) :stale-compile text)))))

(defun swank-mcp--check-stale-file-compile (&rest _)
  "Flag compiling the buffer's file, as `swank-mcp--check-stale-compile' does."
  (swank-mcp--check-stale-compile (point-min) (point-max)))

;;;;; Key bindings

(defvar swank-mcp-command-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "a") #'swank-mcp-activity)
    (define-key map (kbd "u") #'swank-mcp-undo)
    (define-key map (kbd "m") #'swank-mcp-approval-mode)
    (define-key map (kbd "p") #'swank-mcp-show-approval)
    (define-key map (kbd "c") #'swank-mcp-cancel-call)
    (define-key map (kbd "r") #'swank-mcp-revoke-session-allowances)
    (define-key map (kbd "b") #'swank-mcp-clear-breakpoints)
    (define-key map (kbd "s") #'swank-mcp-start)
    (define-key map (kbd "q") #'swank-mcp-stop)
    (define-key map (kbd "i") #'swank-mcp-status)
    map)
  "The swank-mcp commands, under `swank-mcp-key-prefix' in SLIME and SLY buffers.")

(defvar slime-mode-map)
(defvar slime-repl-mode-map)
(defvar sly-mode-map)

(defconst swank-mcp--front-end-hooks '(slime-mode-hook slime-repl-mode-hook sly-mode-hook)
  "The hooks that bind `swank-mcp-command-map' once swank-mcp is turned on.")

(defun swank-mcp--front-end-maps ()
  "The mode maps of SLIME and SLY that exist now.
The SLIME REPL's is among them: it has no `slime-mode'."
  (list (bound-and-true-p slime-mode-map) (bound-and-true-p slime-repl-mode-map)
        (bound-and-true-p sly-mode-map)))

(defun swank-mcp--bind-prefix (maps)
  "Bind `swank-mcp-command-map' in those of MAPS that exist.
It goes under `swank-mcp-key-prefix'."
  (when swank-mcp-key-prefix
    (dolist (map maps)
      (when (and (keymapp map) (not (eq (lookup-key map swank-mcp-key-prefix) swank-mcp-command-map)))
        (define-key map swank-mcp-key-prefix swank-mcp-command-map)))))

(defun swank-mcp-bind-keys ()
  "Bind `swank-mcp-command-map' in SLIME's and SLY's mode maps.
It goes under `swank-mcp-key-prefix'.  Run by `slime-mode-hook',
`slime-repl-mode-hook' and `sly-mode-hook' once `swank-mcp-setup' has
added it there: the maps exist once the mode does, and binding again
changes nothing."
  (swank-mcp--bind-prefix (swank-mcp--front-end-maps)))

;;;###autoload
(defun swank-mcp-setup ()
  "Turn swank-mcp on in SLIME and SLY: its commands under `swank-mcp-key-prefix'.
Loading swank-mcp changes no SLIME or SLY keymap or hook; this does, as
the contrib `swank-mcp' does when SLIME or SLY turn it on, by
\=(slime-setup \='(slime-fancy swank-mcp)) or with `swank-mcp' in
`sly-contribs'.  `swank-mcp-teardown' undoes it."
  (interactive)
  (dolist (hook swank-mcp--front-end-hooks)
    (add-hook hook #'swank-mcp-bind-keys))
  (dolist (backend (list swank-mcp--slime swank-mcp--sly))
    (add-hook (swank-mcp--backend-connected-hook backend) #'swank-mcp--watch-files))
  (add-hook 'slime-before-compile-functions #'swank-mcp--check-stale-compile)
  ;; SLY has no hook before it compiles.
  (advice-add 'sly-compile-region :before #'swank-mcp--check-stale-compile)
  (advice-add 'sly-compile-file :before #'swank-mcp--check-stale-file-compile)
  (swank-mcp--watch-files)
  (swank-mcp-bind-keys))

(defun swank-mcp-teardown ()
  "Undo `swank-mcp-setup': its hooks go, and its keys in SLIME's and SLY's maps."
  (interactive)
  (dolist (hook swank-mcp--front-end-hooks)
    (remove-hook hook #'swank-mcp-bind-keys))
  (dolist (backend (list swank-mcp--slime swank-mcp--sly))
    (remove-hook (swank-mcp--backend-close-hooks backend) #'swank-mcp--server-connection-closed)
    (remove-hook (swank-mcp--backend-connected-hook backend) #'swank-mcp--reopen-ports)
    (remove-hook (swank-mcp--backend-connected-hook backend) #'swank-mcp--watch-files))
  (remove-hook 'slime-before-compile-functions #'swank-mcp--check-stale-compile)
  (advice-remove 'sly-compile-region #'swank-mcp--check-stale-compile)
  (advice-remove 'sly-compile-file #'swank-mcp--check-stale-file-compile)
  (swank-mcp--unwatch-files)
  (when swank-mcp-key-prefix
    (dolist (map (swank-mcp--front-end-maps))
      (when (and (keymapp map) (eq (lookup-key map swank-mcp-key-prefix) swank-mcp-command-map))
        (define-key map swank-mcp-key-prefix nil)))))

;; swank-mcp's own buffers have its commands whether or not it is turned on in SLIME or SLY.
(swank-mcp--bind-prefix (list swank-mcp-activity-mode-map swank-mcp-approval-buffer-mode-map
                              swank-mcp-undo-mode-map swank-mcp-configuration-mode-map))

;; A contrib of the front end that loads this file to turn it on: `slime-setup' and `sly-setup'
;; load their contribs after themselves, and find them registered under the feature's name.  The
;; macros are theirs, so the definitions are read only once they are there.
(dolist (front-end '((slime . define-slime-contrib) (sly . define-sly-contrib)))
  (when (featurep (car front-end))
    (eval `(,(cdr front-end) swank-mcp
            "Let an AI agent work in the image: swank-mcp's commands in the front end's buffers."
            (:license "MIT")
            (:on-load (swank-mcp-setup))
            (:on-unload (swank-mcp-teardown)))
          t)))

(provide 'swank-mcp)

;;; swank-mcp.el ends here
