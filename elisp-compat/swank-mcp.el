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
;;
;; This file holds the front end (the port, the connection to the image,
;; the keys and turning swank-mcp on); the rest is by concern, as SLY's
;; contribs are: swank-mcp-activity.el (the activity buffer, cancelling
;; calls, clearing breakpoints, the buffers of files agents write),
;; swank-mcp-undo.el and swank-mcp-approval.el.

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

(defconst swank-mcp--helper-package "MCP-AGENT-HELPER"
  "The package of the helper swank-mcp loads into the image.
As src/lisp/package.lisp names it.")

(defun swank-mcp--helper-call (function &rest arguments)
  "Return a form to call the helper's FUNCTION (a string) with ARGUMENTS.
It is nil there until an agent's swank-mcp has loaded the helper."
  ;; Not named `function': Emacs would print (function X) as #'X.
  `(cl:let ((helper (cl:and (cl:find-package ,swank-mcp--helper-package)
                            (cl:find-symbol ,function ,swank-mcp--helper-package))))
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
  `(cl:let* ((package (cl:or (cl:find-package ,swank-mcp--helper-package)
                             (cl:ignore-errors (cl:make-package ,swank-mcp--helper-package :use '("COMMON-LISP")))
                             (cl:find-package ,swank-mcp--helper-package)))
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

(provide 'swank-mcp)

;; The parts by concern, each of which requires the core above: loaded with it, so that the
;; commands under `swank-mcp-key-prefix' work from a checkout on `load-path' as from a package.
(require 'swank-mcp-activity)
(require 'swank-mcp-undo)
(require 'swank-mcp-approval)

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

;;; swank-mcp.el ends here
