;;; swank-mcp-tests.el --- Tests of swank-mcp.el with a real SLIME or SLY  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: MIT

;;; Commentary:

;; Runs against a real SBCL that the tests start through SLIME (Debian's
;; `slime' package), the way M-x slime does:
;;
;;   emacs --batch -L elisp-compat -l elisp-compat/swank-mcp-tests.el \
;;         -f ert-run-tests-batch-and-exit
;;
;; `cargo test --test emacs' runs it with SWANK_MCP_BIN set to the freshly
;; built binary, which the end-to-end test drives; without it that test is
;; skipped.  With SWANK_MCP_TEST_BACKEND=sly and SWANK_MCP_SLY_DIR naming a
;; SLY checkout, the same tests run through SLY instead (SLY is not packaged
;; in Debian).

;;; Code:

(require 'ert)
(require 'cl-lib)
(require 'json)
(require 'swank-mcp)

(defconst swank-mcp-tests--backend
  (if (equal (getenv "SWANK_MCP_TEST_BACKEND") "sly") 'sly 'slime)
  "The front end the tests start the image with.")

(defconst swank-mcp-tests--start-timeout 300
  "Seconds the first start may take: it compiles swank and its contribs once.")

;; The tests answer a prompt as soon as it shows; one test checks the delay itself.
(setq swank-mcp-approval-read-delay 0)

(defvar swank-mcp-tests--connection nil
  "The connection to the image the tests started.")

(defvar swank-mcp-tests--ready nil
  "Set once the front end has finished setting up the connection.")

(defun swank-mcp-tests--mark-ready ()
  "Note that the connection is set up."
  (setq swank-mcp-tests--ready t))

;; Only one of them is loaded, at run time.
(declare-function slime "ext:slime" (&optional command coding-system))
(declare-function slime-setup "ext:slime" (&optional contribs))
(declare-function slime-output-buffer "ext:slime-repl" (&optional noprompt))
(declare-function sly "ext:sly" (&optional command coding-system interactive))
(declare-function sly-mrepl--find-buffer "ext:sly-mrepl" (&optional connection thread))
(declare-function sly--events-buffer "ext:sly" (process))
(declare-function slime-events-buffer "ext:slime" ())
(defvar inferior-lisp-program)
(defvar slime-default-connection)
(defvar sly-default-connection)
(defvar slime-repl-history-file)
(defvar slime-background-message-function)
(defvar slime-connected-hook)
(defvar sly-connected-hook)
(defvar sly-mrepl-history-file-name)

(defun swank-mcp-tests--wait (what predicate &optional seconds)
  "Process input until PREDICATE returns non-nil; return that value.
Fail, naming WHAT, after SECONDS (default 30), with what the swank-mcp
processes wrote."
  (let ((deadline (+ (float-time) (or seconds 30)))
        value)
    (while (not (setq value (funcall predicate)))
      (when (> (float-time) deadline)
        (ert-fail (format "timed out waiting for %s%s" what (swank-mcp-tests--servers-said))))
      (accept-process-output nil 0.1))
    value))

(defun swank-mcp-tests--servers-said ()
  "The end of what the running swank-mcp servers wrote, and of their log."
  (mapconcat (lambda (buffer)
               (with-current-buffer buffer
                 (format "\n--- %s:\n%s" (buffer-name)
                         (buffer-substring-no-properties (max (point-min) (- (point-max) 4000)) (point-max)))))
             (cl-remove-if-not
              #'buffer-live-p
              (cons (get-buffer "*swank-mcp-stderr*")
                    (cl-loop for process in (process-list)
                             when (and (string-prefix-p "swank-mcp" (process-name process))
                                       (process-live-p process))
                             collect (process-buffer process))))
             ""))

(defun swank-mcp-tests--connect ()
  "Return the connection to an SBCL started the way `slime' or `sly' start it."
  (unless (and swank-mcp-tests--connection (process-live-p swank-mcp-tests--connection))
    (setq inferior-lisp-program "sbcl"
          swank-mcp-tests--ready nil)
    ;; A Lisp left without its connection by a test that failed half-way would make the front
    ;; end ask whether to start another beside it, which a batch Emacs cannot answer: the
    ;; tests after it start from a fresh Lisp instead.
    (dolist (buffer (buffer-list))
      (when (string-match-p "inferior-lisp" (buffer-name buffer))
        (let ((process (get-buffer-process buffer)))
          (when process
            (set-process-query-on-exit-flag process nil)
            (delete-process process)))
        (kill-buffer buffer)))
    (pcase swank-mcp-tests--backend
      ('slime
       (require 'slime)
       (setq slime-repl-history-file (expand-file-name "history" (make-temp-file "swank-mcp-tests" t))
             slime-background-message-function #'ignore)
       ;; SLIME's default contribs, as an interactive user gets them.
       (slime-setup '(slime-fancy))
       ;; Loaded before SLIME, swank-mcp is turned on by its command, as the README says.
       (swank-mcp-setup)
       ;; Last, after the contribs load: a request made earlier would be answered inside
       ;; SLIME's own synchronous wait for them, which cancels that wait.
       (add-hook 'slime-connected-hook #'swank-mcp-tests--mark-ready t)
       (slime))
      ('sly
       (let ((dir (or (getenv "SWANK_MCP_SLY_DIR") (error "Set SWANK_MCP_SLY_DIR to a SLY checkout"))))
         (add-to-list 'load-path dir)
         (require 'sly)
         (swank-mcp-setup)
         (setq sly-mrepl-history-file-name (expand-file-name "history" (make-temp-file "swank-mcp-tests" t)))
         (add-hook 'sly-connected-hook #'swank-mcp-tests--mark-ready t)
         (sly))))
    (swank-mcp-tests--wait "the Lisp to start and connect" (lambda () swank-mcp-tests--ready)
                           swank-mcp-tests--start-timeout)
    (setq swank-mcp-tests--connection (car (swank-mcp--current))))
  swank-mcp-tests--connection)

(defun swank-mcp-tests--eval (form)
  "Evaluate FORM in the test image, as the user's Emacs does."
  (swank-mcp-tests--connect)
  (pcase-let ((`(,connection . ,backend) (swank-mcp--current)))
    (swank-mcp--eval connection backend form)))

(defun swank-mcp-tests--server-function (name)
  "The symbol NAME (a string) of the test image's server package."
  (intern (format "%s:%s" (if (eq swank-mcp-tests--backend 'sly) "slynk" "swank") name)))

(defun swank-mcp-tests--repl-buffer ()
  "The user's REPL buffer, or nil while there is none."
  (pcase swank-mcp-tests--backend
    ('slime (slime-output-buffer))
    ('sly (sly-mrepl--find-buffer swank-mcp-tests--connection))))

(defun swank-mcp-tests--repl-text ()
  "The text of the user's REPL buffer (empty while there is none)."
  (let ((repl (swank-mcp-tests--repl-buffer)))
    (if repl
        (with-current-buffer repl (buffer-substring-no-properties (point-min) (point-max)))
      "")))

(defun swank-mcp-tests--free-port ()
  "A port nothing listens on now."
  (let* ((probe (make-network-process :name "swank-mcp-port-probe" :server t
                                      :host "127.0.0.1" :service t :noquery t))
         (port (process-contact probe :service)))
    (delete-process probe)
    port))

(defun swank-mcp-tests--listening-p (port)
  "Whether something accepts connections on PORT."
  (condition-case nil
      (progn (delete-process (open-network-stream "swank-mcp-probe" nil "127.0.0.1" port)) t)
    (file-error nil)))

(defmacro swank-mcp-tests--with-port (&rest body)
  "Run BODY with `swank-mcp-port' set to a free port and no server open."
  (declare (indent 0) (debug t))
  `(let ((swank-mcp-port (swank-mcp-tests--free-port)))
     (swank-mcp-tests--connect)
     (swank-mcp-stop)
     (unwind-protect (progn ,@body)
       (swank-mcp-stop))))

(defmacro swank-mcp-tests--answering (asker answers &rest body)
  "Run BODY with ASKER answering ANSWERS in turn; return the questions asked.
ASKER is the function that asks, unquoted: `y-or-n-p' or `yes-or-no-p'."
  (declare (indent 2) (debug t))
  `(let ((answers ,answers)
         (questions '()))
     (cl-letf (((symbol-function ',asker)
                (lambda (question)
                  (push question questions)
                  (when (null answers) (ert-fail (format "unexpected question: %s" question)))
                  (pop answers))))
       ,@body)
     (should (null answers))
     (nreverse questions)))

(defun swank-mcp-tests--mcp-start (port &rest args)
  "Start the swank-mcp binary for PORT with ARGS; return the process.
What it writes to stdout collects in the process buffer: as an MCP server,
one JSON message a line."
  (let ((program (or (getenv "SWANK_MCP_BIN") (ert-skip "SWANK_MCP_BIN is not set (cargo test --test emacs sets it)"))))
    (make-process :name "swank-mcp" :buffer (generate-new-buffer " *swank-mcp*") :noquery t
                  :connection-type 'pipe
                  :command (append (list program "--port" (number-to-string port)) args)
                  :stderr (get-buffer-create "*swank-mcp-stderr*")
                  :sentinel #'ignore)))

(defun swank-mcp-tests--run (port &rest args)
  "Run the swank-mcp binary at PORT with ARGS; return (EXIT-CODE . STDOUT).
Emacs keeps serving its own Lisp connection meanwhile, as it would for a
user: the image may be waiting for it."
  (let ((process (apply #'swank-mcp-tests--mcp-start port args)))
    (swank-mcp-tests--wait "swank-mcp to exit" (lambda () (not (process-live-p process))) 60)
    (accept-process-output process 0.1)
    (prog1 (cons (process-exit-status process) (with-current-buffer (process-buffer process) (buffer-string)))
      (unless (eql (process-exit-status process) 0)
        (message "swank-mcp %S exited with %s:%s" args (process-exit-status process) (swank-mcp-tests--servers-said)))
      (kill-buffer (process-buffer process)))))

(defun swank-mcp-tests--mcp-send (process message)
  "Send MESSAGE, an alist, to PROCESS as one JSON line."
  (process-send-string process (concat (json-encode message) "\n")))

(defun swank-mcp-tests--mcp-response (process id &optional seconds)
  "The response of PROCESS to request ID, waiting at most SECONDS (default 30)."
  (swank-mcp-tests--wait
   (format "the response to request %s" id)
   (lambda ()
     (with-current-buffer (process-buffer process)
       ;; Whole lines only: the last may still be arriving.
       (cl-loop for line in (split-string (buffer-substring (point-min)
                                                            (save-excursion (goto-char (point-max))
                                                                            (skip-chars-backward "^\n")
                                                                            (point)))
                                          "\n" t)
                for message = (let ((json-object-type 'alist) (json-array-type 'list) (json-key-type 'symbol))
                                (json-read-from-string line))
                when (equal (alist-get 'id message) id) return message)))
   seconds))

(defun swank-mcp-tests--mcp-initialize (process)
  "Initialize the MCP session with PROCESS as a client that cannot elicit."
  (swank-mcp-tests--mcp-send process `((jsonrpc . "2.0") (id . 1) (method . "initialize")
                                       (params . ((protocolVersion . "2025-06-18")
                                                  (capabilities . ,(make-hash-table))
                                                  (clientInfo . ((name . "ert") (version . "0")))))))
  (swank-mcp-tests--mcp-response process 1)
  (swank-mcp-tests--mcp-send process '((jsonrpc . "2.0") (method . "notifications/initialized"))))

(defun swank-mcp-tests--mcp-call (process id tool arguments)
  "Send PROCESS the call of TOOL with ARGUMENTS (an alist) as request ID."
  (swank-mcp-tests--mcp-send process `((jsonrpc . "2.0") (id . ,id) (method . "tools/call")
                                       (params . ((name . ,tool) (arguments . ,arguments))))))

(defun swank-mcp-tests--result-text (response)
  "The text of the tools/call RESPONSE."
  (alist-get 'text (car (alist-get 'content (alist-get 'result response)))))

(defun swank-mcp-tests--response-ok (server id)
  "Check that SERVER's response to ID is a success; return its text."
  (let ((response (swank-mcp-tests--mcp-response server id)))
    (should (eq (alist-get 'isError (alist-get 'result response)) :json-false))
    (swank-mcp-tests--result-text response)))

(defun swank-mcp-tests--response-error (server id &optional seconds)
  "Check that SERVER's response to ID is an error; return its text.
Wait at most SECONDS (default 30) for it."
  (let ((response (swank-mcp-tests--mcp-response server id seconds)))
    (should (eq (alist-get 'isError (alist-get 'result response)) t))
    (swank-mcp-tests--result-text response)))

(defmacro swank-mcp-tests--with-server (bindings &rest body)
  "Run BODY with an MCP server for a port opened in the image.
BINDINGS is (SERVER . ARGUMENTS): SERVER is bound to the server, started
with ARGUMENTS and initialized as the MCP client \"ert\", which cannot elicit."
  (declare (indent 1) (debug t))
  `(swank-mcp-tests--with-port
     (let ((,(car bindings) nil))
       (unwind-protect
           (progn
             (setq ,(car bindings) (swank-mcp-tests--mcp-start (swank-mcp-start) ,@(cdr bindings)))
             (swank-mcp-tests--mcp-initialize ,(car bindings))
             ,@body)
         (when ,(car bindings) (delete-process ,(car bindings)))))))

;;;; The state every test starts from

(defun swank-mcp-tests--debugger-buffers ()
  "The user's debugger buffers (SLDB or SLY-DB) now open."
  (cl-remove-if-not (lambda (buffer)
                      (memq (buffer-local-value 'major-mode buffer) '(sldb-mode sly-db-mode)))
                    (buffer-list)))

(defun swank-mcp-tests--quit-debuggers ()
  "Close the person's debugger buffers an earlier test left, their threads let go."
  (dolist (buffer (swank-mcp-tests--debugger-buffers))
    (with-current-buffer buffer
      (ignore-errors (call-interactively (if (eq swank-mcp-tests--backend 'sly) 'sly-db-quit 'sldb-quit)))
      (when (buffer-live-p buffer)
        ;; SLY asks before it kills a debugger buffer whose connection is live.
        (let ((kill-buffer-query-functions nil))
          (kill-buffer buffer))))))

(defun swank-mcp-tests--start-clean ()
  "Bring Emacs to the state each test starts from, whatever the test before left.
A live connection to the test image; swank-mcp turned on; approval mode
off; no activity, approval, undo or reply buffer, no MCP server and no
debugger buffer of an earlier test; no port waiting to be opened again.  A
test that fails half-way, or that closes the connection, then costs only
its own result."
  (when swank-mcp-approval-mode
    (swank-mcp-approval-mode -1))
  (setq swank-mcp--approvals nil
        swank-mcp--reopen nil)
  (swank-mcp--approvals-forget-batch)
  (dolist (buffer (buffer-list))
    (when (or (memq (buffer-local-value 'major-mode buffer)
                    '(swank-mcp-activity-mode swank-mcp-approval-buffer-mode swank-mcp-undo-mode))
              (equal (buffer-name buffer) "*swank-mcp reply*"))
      (kill-buffer buffer)))
  (dolist (process (process-list))
    (when (and (string-prefix-p "swank-mcp" (process-name process)) (not (process-contact process :server)))
      (delete-process process)))
  ;; The front end reads a connection's input from a timer, which it schedules again when an
  ;; event failed: one left for a connection that has closed since fails every later wait.
  (dolist (timer timer-list)
    (when (and (memq (timer--function timer) '(slime-process-available-input sly-process-available-input))
               (not (process-live-p (car (timer--args timer)))))
      (cancel-timer timer)))
  (swank-mcp-tests--connect)
  (swank-mcp-tests--quit-debuggers)
  (swank-mcp-setup))

(defmacro swank-mcp-tests--deftest (name arguments &rest body)
  "Define the ERT test NAME, with ARGUMENTS and BODY, as `ert-deftest' does.
It starts from the state `swank-mcp-tests--start-clean' makes."
  (declare (indent 2) (doc-string 3) (debug (&define name sexp def-body)))
  (let ((documentation (and (stringp (car body)) (cdr body) (list (car body)))))
    `(ert-deftest ,name ,arguments
       ,@documentation
       (swank-mcp-tests--start-clean)
       ,@(if documentation (cdr body) body))))

;;;; Turning it on

(defvar slime-mode-hook)
(defvar sly-mode-hook)
(declare-function swank-mcp-init "swank-mcp" ())
(declare-function swank-mcp-unload "swank-mcp" ())

(swank-mcp-tests--deftest swank-mcp-loading-changes-no-keymap-or-hook-and-turning-it-on-does ()
  "Loading swank-mcp leaves SLIME's and SLY's maps and hooks alone.
Turning it on binds the prefix and adds the hook that binds it in later
buffers: as SLIME's contrib (what `slime-setup' calls), or with
`swank-mcp-setup' for SLY; turning it off undoes both."
  (pcase-let* ((`(,hook ,map) (if (eq swank-mcp-tests--backend 'sly)
                                  (progn (swank-mcp-tests--connect) '(sly-mode-hook sly-mode-map))
                                '(slime-mode-hook slime-mode-map)))
               (feature (if (eq swank-mcp-tests--backend 'sly) 'sly 'slime)))
    (require feature)
    ;; The suite turned it on: off, then loaded again, now that the front end is there, which
    ;; is when the contrib is registered.
    (swank-mcp-teardown)
    (load (locate-library "swank-mcp") nil t)
    (let ((keymap (symbol-value map)))
      (should-not (memq #'swank-mcp-bind-keys (symbol-value hook)))
      (should-not (keymapp (lookup-key keymap swank-mcp-key-prefix)))
      (if (eq feature 'slime)
          (progn (should (get 'slime-contribs 'swank-mcp))
                 (swank-mcp-init))
        (swank-mcp-setup))
      (unwind-protect
          (progn (should (memq #'swank-mcp-bind-keys (symbol-value hook)))
                 (should (eq (lookup-key keymap swank-mcp-key-prefix) swank-mcp-command-map)))
        (if (eq feature 'slime) (swank-mcp-unload) (swank-mcp-teardown)))
      (should-not (memq #'swank-mcp-bind-keys (symbol-value hook)))
      (should-not (keymapp (lookup-key keymap swank-mcp-key-prefix)))
      ;; swank-mcp's own buffers have the commands regardless.
      (should (eq (lookup-key swank-mcp-activity-mode-map swank-mcp-key-prefix) swank-mcp-command-map))
      (swank-mcp-setup))))

;;;; The client configuration

(swank-mcp-tests--deftest swank-mcp-configuration-is-ready-to-paste ()
  (let* ((swank-mcp-program "/opt/swank mcp/bin/swank-mcp")
         (text (swank-mcp-client-configuration 4011))
         (lines (split-string text "\n")))
    (should (member (concat "  claude mcp add --transport stdio swank -- "
                            (shell-quote-argument swank-mcp-program) " --port 4011")
                    lines))
    (let ((json-object-type 'alist) (json-array-type 'list) (json-key-type 'string))
      (should (equal (json-read-from-string (nth 4 lines))
                     `(("mcpServers" . (("swank" . (("command" . ,swank-mcp-program) ("args" . ("--port" "4011")))))))))
      (should (equal (json-read-from-string (nth 7 lines))
                     `(("servers" . (("swank" . (("type" . "stdio") ("command" . ,swank-mcp-program)
                                                 ("args" . ("--port" "4011"))))))))))))

(swank-mcp-tests--deftest swank-mcp-commands-need-a-connection ()
  (cl-letf (((symbol-function 'slime-current-connection) #'ignore)
            ((symbol-function 'sly-current-connection) #'ignore))
    (let ((slime-default-connection nil)
          (sly-default-connection nil))
      (should-error (swank-mcp-start) :type 'user-error)
      (should-error (swank-mcp-stop) :type 'user-error))))

;;;; Against the real image

(swank-mcp-tests--deftest swank-mcp-start-opens-a-persistent-port ()
  (swank-mcp-tests--with-port
    (let ((port (swank-mcp-start)))
      (should (eql port swank-mcp-port))
      (should (swank-mcp-tests--listening-p port))
      ;; :dont-close t: it keeps accepting after the first client.
      (should (swank-mcp-tests--listening-p port))
      (should (eql (swank-mcp-start) port))
      (should (equal (mapcar #'car (swank-mcp-status)) (list port)))
      (with-current-buffer swank-mcp--buffer-name
        (should (string-match-p (format "claude mcp add .* --port %d$" port) (buffer-string)))
        ;; How to approve and watch the agent's calls, and the keys.
        (should (string-match-p "add \"--confirm\", \"mutating\" to the arguments" (buffer-string)))
        (should (string-match-p "turn on M-x swank-mcp-approval-mode (C-c C-x m m)" (buffer-string)))
        (should (string-match-p "C-c C-x m is swank-mcp's prefix: a activity, m approval mode, p the prompt"
                                (buffer-string))))
      ;; A program this Emacs cannot find is said so.
      (let ((swank-mcp-program (getenv "SWANK_MCP_BIN")))
        (when swank-mcp-program
          (swank-mcp-start)
          (should-not (string-match-p "Warning" (with-current-buffer swank-mcp--buffer-name (buffer-string))))))
      (let ((swank-mcp-program "/nonexistent/bin/swank-mcp"))
        (swank-mcp-start)
        (should (string-match-p "\\`Warning: `swank-mcp-program' is \"/nonexistent/bin/swank-mcp\", which this Emacs does not find"
                                (with-current-buffer swank-mcp--buffer-name (buffer-string))))))))

(swank-mcp-tests--deftest swank-mcp-the-configuration-buffers-g-writes-it-again-and-h-lists-its-keys ()
  (swank-mcp-tests--with-port
    (let ((port (swank-mcp-start)))
      (swank-mcp--show-configuration port "image" nil)
      (with-current-buffer swank-mcp--buffer-name
        ;; g writes it as the options now are.
        (let ((swank-mcp-program "/elsewhere/bin/swank-mcp"))
          (call-interactively (key-binding "g"))
          (should (string-match-p "claude mcp add .* /elsewhere/bin/swank-mcp --port" (buffer-string))))
        ;; h describes the mode, which says what g and q do.
        (should (eq (key-binding "h") #'describe-mode))
        (should (string-match-p "g writes it again,\\(.\\|\n\\)*; q hides it"
                                (substitute-command-keys (documentation 'swank-mcp-configuration-mode))))
        ;; Once the port is closed, g says so rather than show it.
        (swank-mcp-stop)
        (should (string-match-p (format "Port %d is no longer open" port)
                                (cadr (should-error (call-interactively (key-binding "g")) :type 'user-error))))))))

(swank-mcp-tests--deftest swank-mcp-start-takes-the-next-free-port ()
  (swank-mcp-tests--with-port
    (let ((taken (make-network-process :name "swank-mcp-squatter" :server t :noquery t
                                       :host "127.0.0.1" :service swank-mcp-port)))
      (unwind-protect
          (let ((port (swank-mcp-start)))
            (should (< swank-mcp-port port (+ swank-mcp-port swank-mcp-port-attempts))))
        (delete-process taken)))))

(swank-mcp-tests--deftest swank-mcp-stop-closes-the-port ()
  (swank-mcp-tests--with-port
    ;; Several rounds: a stop right after the start used to race the server's own
    ;; registration of the new port now and then, and the port stayed open.
    (dotimes (_ 10)
      (let ((port (swank-mcp-start)))
        (should (eql (swank-mcp-stop) port))
        ;; The server's sentinel thread closes it a moment later.
        (swank-mcp-tests--wait "the port to close" (lambda () (not (swank-mcp-tests--listening-p port))) 10)
        (should-not (swank-mcp-status))
        (should-not (swank-mcp-stop))))))

(swank-mcp-tests--deftest swank-mcp-end-to-end-the-agent-and-the-user-share-the-image ()
  (swank-mcp-tests--with-port
    (let ((port (swank-mcp-start)))
      ;; Defined from Emacs (as C-x C-e does), called by the agent.
      (swank-mcp-tests--eval `(,(swank-mcp-tests--server-function "interactive-eval")
                               "(defun swank-mcp-from-emacs (x) (* x 2))"))
      (should (equal (swank-mcp-tests--run port "eval" "(swank-mcp-from-emacs 21)") '(0 . "=> 42\n")))
      ;; Defined by the agent, called from Emacs.
      (should (eql 0 (car (swank-mcp-tests--run port "eval" "(defun swank-mcp-from-agent (x) (+ x 100))"))))
      (let ((output-and-value (swank-mcp-tests--eval `(,(swank-mcp-tests--server-function "eval-and-grab-output")
                                                       "(swank-mcp-from-agent 1)"))))
        ;; Slynk describes integers at length: "101 (7 bits, #x65, ...)".
        (should (equal (car output-and-value) ""))
        (should (equal (car (split-string (cadr output-and-value))) "101")))
      ;; The agent's output comes back to the agent and stays out of the user's REPL...
      (let ((result (swank-mcp-tests--run port "eval" "(progn (format t \"agent-output-marker~%\") (finish-output) 7)")))
        (should (eql (car result) 0))
        (should (string-match-p "\\`\\[stdout\\]\nagent-output-marker\n\n=> 7\n\\'" (cdr result))))
      ;; ...although the image's global output goes there: a thread the user starts prints
      ;; to the REPL, so the absence above is the capture winning.
      (swank-mcp-tests--eval `(,(swank-mcp-tests--server-function "interactive-eval")
                               "(sb-thread:make-thread (lambda () (format t \"global-output-marker~%\") (finish-output)))"))
      (swank-mcp-tests--wait "the global output in the REPL"
                             (lambda () (string-match-p "global-output-marker" (swank-mcp-tests--repl-text))))
      ;; A thread the agent starts prints into the agent's replies instead.
      (let ((result (swank-mcp-tests--run
                     port "eval"
                     "(sb-thread:join-thread (sb-thread:make-thread (lambda () (format t \"agent-thread-marker~%\") 8)))")))
        (should (eql (car result) 0))
        (should (string-match-p "\\`\\[background\\]\nOutput of your threads:\nagent-thread-marker\n\n=> 8\n\\'"
                                (cdr result))))
      (should-not (string-match-p "agent-thread-marker" (swank-mcp-tests--repl-text)))
      (should-not (string-match-p "agent-output-marker" (swank-mcp-tests--repl-text))))))

;;;; The agent's debugger and the user's

(defun swank-mcp-tests--said (process)
  "What PROCESS has written so far."
  (with-current-buffer (process-buffer process) (buffer-string)))

(swank-mcp-tests--deftest swank-mcp-the-agents-debugger-stays-out-of-the-users-emacs ()
  (swank-mcp-tests--with-server (server)
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(error \"agent-stop-marker\")") (debug . t)))
    (let ((session (swank-mcp-tests--wait "the agent's evaluation to stop in the debugger"
                                          (lambda () (let ((said (swank-mcp-tests--said server)))
                                                       (and (string-match "\\[DEBUGGER \\(D[0-9]+\\)\\]" said)
                                                            (match-string 1 said)))))))
      ;; The stop went to the agent's connection: the user's Emacs shows nothing.
      (accept-process-output nil 0.5)
      (should-not (swank-mcp-tests--debugger-buffers))
      ;; An error of the user's own still reaches the user's debugger.
      (funcall (intern (format "%s-eval-async" swank-mcp-tests--backend)) '(cl:error "user-error-marker"))
      (let ((debugger (car (swank-mcp-tests--wait "the user's debugger" #'swank-mcp-tests--debugger-buffers))))
        (with-current-buffer debugger
          (should (string-match-p "user-error-marker" (buffer-string)))
          (call-interactively (intern (if (eq swank-mcp-tests--backend 'sly) "sly-db-quit" "sldb-quit")))))
      (swank-mcp-tests--wait "the user's debugger to close"
                             (lambda () (null (swank-mcp-tests--debugger-buffers))))
      (swank-mcp-tests--mcp-call server 3 "debugger" `((session . ,session) (action . "abort")))
      (swank-mcp-tests--wait "the agent's evaluation to be aborted"
                             (lambda () (string-match-p "EVALUATION-ABORTED" (swank-mcp-tests--said server)))))
    (process-send-eof server)
    (swank-mcp-tests--wait "swank-mcp to exit" (lambda () (not (process-live-p server))) 30)))

;;;; Keeping the human in charge

(defun swank-mcp-tests--image-value (name)
  "The value of CL-USER's variable NAME (a string) in the image, or :unbound."
  (swank-mcp-tests--eval `(cl:let ((symbol (cl:find-symbol ,name "COMMON-LISP-USER")))
                            (cl:if (cl:and symbol (cl:boundp symbol)) (cl:symbol-value symbol) :unbound))))

(defun swank-mcp-tests--idle (seconds)
  "Serve the connections for SECONDS, as an Emacs whose user reads does."
  (let ((end (+ (float-time) seconds)))
    (while (< (float-time) end)
      (accept-process-output nil 0.05))))

(defun swank-mcp-tests--prompt (pattern &optional seconds)
  "The approval buffer once it shows text matching PATTERN, within SECONDS."
  (swank-mcp-tests--wait (format "the approval prompt %S" pattern)
                         (lambda () (let ((buffer (get-buffer swank-mcp--approval-buffer-name)))
                                      (and buffer
                                           (with-current-buffer buffer (string-match-p pattern (buffer-string)))
                                           buffer)))
                         seconds))

(defun swank-mcp-tests--last-message ()
  "The last line of *Messages*."
  (with-current-buffer (messages-buffer)
    (save-excursion
      (goto-char (point-max))
      (skip-chars-backward "\n")
      (buffer-substring-no-properties (line-beginning-position) (point)))))

(defun swank-mcp-tests--wait-approval-subscription ()
  "Wait until the image has every approval subscription of approval mode."
  (swank-mcp-tests--wait "the approval subscription"
                         (lambda () (cl-every (lambda (subscribed)
                                                (swank-mcp--subscribed-p (nth 1 subscribed) (nth 2 subscribed)))
                                              swank-mcp--approval-channels))))

(defmacro swank-mcp-tests--with-approvals (bindings &rest body)
  "Run BODY with approval mode on and an MCP server for a port opened.
BINDINGS is (SERVER . ARGUMENTS), as `swank-mcp-tests--with-server' takes."
  (declare (indent 1) (debug t))
  `(swank-mcp-tests--with-server ,bindings
     (swank-mcp-approval-mode 1)
     (unwind-protect
         (progn
           (swank-mcp-tests--wait-approval-subscription)
           ,@body)
       (swank-mcp-approval-mode -1))))

(defmacro swank-mcp-tests--with-activity (buffer &rest body)
  "Run BODY with BUFFER bound to the activity buffer, once it is subscribed."
  (declare (indent 1) (debug t))
  `(let ((,buffer (swank-mcp-activity)))
     (unwind-protect
         (progn
           (swank-mcp-tests--wait "the activity subscription"
                                  (lambda () (with-current-buffer ,buffer
                                               (swank-mcp--subscribed-p swank-mcp--activity-backend
                                                                        swank-mcp--activity-channel))))
           ,@body)
       (kill-buffer ,buffer))))

(defun swank-mcp-tests--responded-p (process id)
  "Whether PROCESS has answered request ID."
  (string-match-p (format "\"id\":%d[,}]" id) (swank-mcp-tests--said process)))

(swank-mcp-tests--deftest swank-mcp-approval-mode-waits-for-the-users-answer ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    ;; n: declined, and nothing changed in the image.
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-approval* :first)")))
    (with-current-buffer (swank-mcp-tests--prompt ":first")
      ;; Named by its MCP client, shown with its code and how to answer, in a window that is
      ;; not selected.
      (should (string-match-p "\\`ert asks to run evaluate-lisp\\.$" (buffer-string)))
      (should (string-match-p "^C-c C-c runs it, C-c C-k declines it, C-c C-a runs it and allows evaluate-lisp"
                              (buffer-string)))
      (should (string-match-p "(defparameter \\*swank-mcp-approval\\* :first)" (buffer-string)))
      ;; The keys stay in the header line as a long diff scrolls.
      (should (equal header-line-format "C-c C-c run, C-c C-k decline, C-c C-a run and allow for the session, q hide"))
      (should (get-buffer-window (current-buffer)))
      (should-not (eq (window-buffer (selected-window)) (current-buffer)))
      (should (string-match-p "ert asks to run evaluate-lisp\\.  Answer in \\*swank-mcp approval\\* (C-c C-x m p goes there)"
                              (swank-mcp-tests--last-message)))
      (should (eq (swank-mcp-decline) :taken)))
    (should (string-match-p "declined by the user" (swank-mcp-tests--response-error server 2)))
    (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-APPROVAL*") :unbound))
    ;; y: it runs.
    (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(defparameter *swank-mcp-approval* :second)")))
    (with-current-buffer (swank-mcp-tests--prompt ":second")
      (should (eq (swank-mcp-approve) :taken))
      (should (string-match-p "evaluate-lisp approved" (swank-mcp-tests--last-message))))
    (swank-mcp-tests--response-ok server 3)
    (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-APPROVAL*") :second))
    (should-not (get-buffer swank-mcp--approval-buffer-name))
    (should-not (string-match-p "swank-mcp-approval" (swank-mcp-tests--repl-text)))))

(swank-mcp-tests--deftest swank-mcp-an-approved-load-of-a-file-changed-since-the-prompt-is-refused ()
  (let* ((directory (make-temp-file "swank-mcp-changed" t))
         (file (expand-file-name "changed.lisp" directory)))
    (unwind-protect
        (swank-mcp-tests--with-approvals (server "--confirm" "load-file" "--root" directory)
          (with-temp-file file (insert "(defparameter *swank-mcp-changed-file* :shown)\n"))
          (swank-mcp-tests--mcp-call server 2 "load-file" `((file_path . ,file)))
          (with-current-buffer (swank-mcp-tests--prompt ":shown")
            ;; Rewritten while the person reads the prompt: approving it runs nothing, and Emacs
            ;; says why rather than that it runs.
            (with-temp-file file (insert "(defparameter *swank-mcp-changed-file* :unseen)\n"))
            (should (equal (swank-mcp-approve) '(:refused "changed.lisp changed since the prompt was shown")))
            (should (string-match-p "load-file was approved, but refused because changed\\.lisp changed since the prompt was shown; nothing ran\\."
                                    (swank-mcp-tests--last-message))))
          (should (string-match-p "\\`load-file was not run: changed\\.lisp changed between the preview the user was shown and their answer"
                                  (swank-mcp-tests--response-error server 2)))
          (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-CHANGED-FILE*") :unbound)))
      (delete-directory directory t))))

(defun swank-mcp-tests--answer-after (seconds)
  "Approve a call SECONDS after its prompt shows; check that it ran."
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp"
                                           "--confirm-timeout" (format "%ds" (+ seconds 30)))
    (let ((code (format "(defparameter *swank-mcp-approved-after-%d* :ran)" seconds)))
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" `((code . ,code)))
      (with-current-buffer (swank-mcp-tests--prompt (regexp-quote code))
        (swank-mcp-tests--idle seconds)
        (should (eq (swank-mcp-approve) :taken)))
      (should (equal (swank-mcp-tests--response-ok server 2)
                     (format "=> *SWANK-MCP-APPROVED-AFTER-%d*" seconds)))
      (should (eq (swank-mcp-tests--image-value (format "*SWANK-MCP-APPROVED-AFTER-%d*" seconds)) :ran)))))

(swank-mcp-tests--deftest swank-mcp-approval-answered-after-3-seconds-runs ()
  (swank-mcp-tests--answer-after 3))

(swank-mcp-tests--deftest swank-mcp-approval-answered-after-60-seconds-runs ()
  (swank-mcp-tests--answer-after 60))

(swank-mcp-tests--deftest swank-mcp-approval-answered-too-late-runs-nothing ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp" "--confirm-timeout" "2s")
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-too-late* :ran)")))
    (with-current-buffer (swank-mcp-tests--prompt "swank-mcp-too-late")
      ;; The user reads past the time limit while Emacs does nothing else, so that the prompt
      ;; is still up when y is pressed.
      (call-process "sleep" nil nil nil "3")
      (should (eq (swank-mcp-approve) :ended))
      (should (string-match-p "already ended; nothing ran" (swank-mcp-tests--last-message))))
    (should (string-match-p "did not answer the approval request within 2 s" (swank-mcp-tests--response-error server 2)))
    (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-TOO-LATE*") :unbound))
    ;; Unanswered, the prompt goes when the request ends.
    (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(defparameter *swank-mcp-unanswered* :ran)")))
    (swank-mcp-tests--prompt "swank-mcp-unanswered")
    (swank-mcp-tests--response-error server 3)
    (swank-mcp-tests--wait "the stale prompt to go" (lambda () (not (get-buffer swank-mcp--approval-buffer-name))) 1)
    ;; The echo area says why it went, and that nothing ran.
    (should (string-match-p "nobody answered in time: the approval request of evaluate-lisp timed out (--confirm-timeout) and it did not run"
                            (swank-mcp-tests--last-message)))
    (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-UNANSWERED*") :unbound))))

(swank-mcp-tests--deftest swank-mcp-approvals-waiting-together-are-counted ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (swank-mcp-tests--with-activity activity
      (display-buffer activity)
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-first-of-two* 1)")))
      (swank-mcp-tests--prompt "first-of-two")
      (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(defparameter *swank-mcp-second-of-two* 2)")))
      (with-current-buffer (swank-mcp-tests--prompt "(1 of 2)")
        (should (string-match-p "first-of-two" (buffer-string)))
        ;; The prompt is beside the activity buffer, not in its place.
        (should (get-buffer-window activity))
        (swank-mcp-decline)
        ;; The echo area ends on the call shown next.
        (should (string-match-p "evaluate-lisp declined; it does not run\\.  Next: ert asks to run evaluate-lisp\\. (2 of 2)"
                                (swank-mcp-tests--last-message))))
      (with-current-buffer (swank-mcp-tests--prompt "second-of-two")
        (should (string-match-p "\\`ert asks to run evaluate-lisp\\. (2 of 2)$" (buffer-string)))
        (swank-mcp-approve))
      (should (string-match-p "declined by the user" (swank-mcp-tests--response-error server 2)))
      (swank-mcp-tests--response-ok server 3)
      ;; Both calls stay in the activity buffer, the declined one too.
      (swank-mcp-tests--wait-activity activity "both calls, ended"
                                      "declined.*\n.*first-of-two\\(.\\|\n\\)*done.*\n.*second-of-two"))))

;;;;; A prompt never takes what the user types

(defun swank-mcp-tests--visit-lisp-source (buffer &optional text)
  "Show BUFFER alone, as a Lisp source the user edits, holding TEXT.
The front end's minor mode is on in it, as in the user's own source buffers."
  (delete-other-windows)
  (switch-to-buffer buffer)
  (when text (insert text))
  (lisp-mode)
  (funcall (intern (format "%s-mode" swank-mcp-tests--backend)) 1))

(swank-mcp-tests--deftest swank-mcp-a-prompt-never-takes-the-keys-typed-in-a-lisp-buffer ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (let ((source (generate-new-buffer "swank-mcp-typing.lisp")))
      (unwind-protect
          (progn
            (swank-mcp-tests--visit-lisp-source source)
            ;; The user is typing when the agent's call asks for approval.
            (execute-kbd-macro "(defv")
            (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-typed-through* :ran)")))
            (swank-mcp-tests--prompt "typed-through")
            ;; Every key the prompt once answered (y, n, a, q) goes on to the Lisp buffer.
            (execute-kbd-macro "ar *any-way* 0) ; yes, no, always, quit\n")
            (should (equal (with-current-buffer source (buffer-string))
                           "(defvar *any-way* 0) ; yes, no, always, quit\n"))
            (should (eq (window-buffer (selected-window)) source))
            ;; The call still waits, and nothing ran.
            (swank-mcp-tests--idle 0.5)
            (should-not (swank-mcp-tests--responded-p server 2))
            (should (swank-mcp--approval-shown))
            (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-TYPED-THROUGH*") :unbound))
            ;; Answered by an explicit act: the user goes to the prompt (C-c C-x m p), reads, and
            ;; declines (C-c C-k); an answer before the call could be read is refused.
            (execute-kbd-macro (kbd "C-c C-x m p"))
            (should (eq (window-buffer (selected-window)) (get-buffer swank-mcp--approval-buffer-name)))
            (let ((swank-mcp-approval-read-delay 60))
              (should (string-match-p "This call was shown a moment ago: read it, then answer"
                                      (cadr (should-error (execute-kbd-macro (kbd "C-c C-k")) :type 'user-error)))))
            (should (swank-mcp--approval-shown))
            (execute-kbd-macro (kbd "C-c C-k"))
            (should (string-match-p "declined by the user"
                                    (swank-mcp-tests--response-error server 2)))
            (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-TYPED-THROUGH*") :unbound))
            (should (eq (window-buffer (selected-window)) source)))
        (kill-buffer source)))))

(swank-mcp-tests--deftest swank-mcp-a-hidden-prompt-comes-back-with-the-next-call ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-hidden-first* 1)")))
    (swank-mcp-tests--prompt "hidden-first")
    (swank-mcp-show-approval)
    ;; q hides it; the call goes on waiting.
    (execute-kbd-macro "q")
    (should-not (get-buffer-window swank-mcp--approval-buffer-name))
    (should (string-match-p "1 call still waits for your answer; C-c C-x m p shows the prompt again"
                            (swank-mcp-tests--last-message)))
    ;; The next call brings the window back, with a message naming it.
    (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(defparameter *swank-mcp-hidden-second* 2)")))
    (swank-mcp-tests--wait "the prompt's window" (lambda () (get-buffer-window swank-mcp--approval-buffer-name)))
    (should (string-match-p "ert asks to run evaluate-lisp\\. (2 of 2)  Answer in" (swank-mcp-tests--last-message)))
    (with-current-buffer (swank-mcp-tests--prompt "(1 of 2)")
      (should (string-match-p "hidden-first" (buffer-string)))
      (swank-mcp-approve))
    (with-current-buffer (swank-mcp-tests--prompt "hidden-second")
      (swank-mcp-approve))
    (swank-mcp-tests--response-ok server 2)
    (swank-mcp-tests--response-ok server 3)))

(swank-mcp-tests--deftest swank-mcp-overlapping-calls-all-stay-in-the-activity-buffer ()
  (swank-mcp-tests--with-approvals (server)
    (swank-mcp-tests--with-activity activity
      ;; The first starts first and ends first.
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(progn (sleep 0.5) :overlapping-first)")))
      (swank-mcp-tests--wait-activity activity "the first call, running" "overlapping-first")
      (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(progn (sleep 1.5) :overlapping-second)")))
      (swank-mcp-tests--response-ok server 2)
      (swank-mcp-tests--response-ok server 3)
      (swank-mcp-tests--wait-activity activity "the second call, done"
                                      "done.*\n.*overlapping-second")
      (swank-mcp-tests--idle 0.2)
      (let ((text (swank-mcp-tests--activity-text activity)))
        (should (string-match-p "done.*\n.*overlapping-first" text))
        (should (string-match-p "done.*\n.*overlapping-second" text))))))

(swank-mcp-tests--deftest swank-mcp-the-read-delay-counts-from-when-the-prompt-is-selected ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (let ((source (generate-new-buffer "swank-mcp-delay.lisp"))
          (swank-mcp-approval-read-delay 1.0))
      (unwind-protect
          (progn
            (swank-mcp-tests--visit-lisp-source source)
            (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-read-delay* :ran)")))
            (swank-mcp-tests--prompt "read-delay")
            ;; Shown beside, longer than the delay, while the person works in their buffer.
            (swank-mcp-tests--idle 1.5)
            ;; Going there starts the delay again: an answer typed right after is refused.
            (execute-kbd-macro (kbd "C-c C-x m p"))
            (should (string-match-p "This call was shown a moment ago: read it, then answer"
                                    (cadr (should-error (execute-kbd-macro (kbd "C-c C-c")) :type 'user-error))))
            (swank-mcp-tests--idle 0.2)
            (should-not (swank-mcp-tests--responded-p server 2))
            ;; Once read there, it is answered.
            (swank-mcp-tests--idle 1.0)
            (execute-kbd-macro (kbd "C-c C-c"))
            (swank-mcp-tests--response-ok server 2)
            (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-READ-DELAY*") :ran)))
        (kill-buffer source)))))

;;;;; Stopping the agent

(defun swank-mcp-tests--thread-names ()
  "The names of the image's threads, as its thread list shows them."
  (swank-mcp-tests--eval '(cl:mapcar 'sb-thread:thread-name (sb-thread:list-all-threads))))

(defun swank-mcp-tests--cancel ()
  "Run `swank-mcp-cancel-call' in the current buffer; return the image's answer.
The command returns at once; its answer comes when the image sends it."
  (let* ((none (make-symbol "none"))
         (answer none))
    (swank-mcp-cancel-call (lambda (reply) (setq answer reply)))
    (swank-mcp-tests--wait "the answer to the cancellation" (lambda () (not (eq answer none))))
    answer))

(swank-mcp-tests--deftest swank-mcp-cancel-call-stops-the-agents-running-call ()
  (swank-mcp-tests--with-approvals (server)
    (swank-mcp-tests--with-activity activity
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(loop (sleep 0.1)) :first-loop")))
      (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(loop (sleep 0.1)) :second-loop")))
      (swank-mcp-tests--wait-activity activity "both loops, running"
                                      "running\n.*first-loop\\(.\\|\n\\)*running\n.*second-loop")
      ;; The image's thread list, and the agent's threads tool, name each worker by its call.
      (swank-mcp-tests--wait "the workers named by their calls"
                             (lambda () (>= (cl-count-if (lambda (name)
                                                           (and (stringp name)
                                                                (string-match-p "\\`swank-mcp evaluate-lisp, call .*-call-[0-9]+\\'"
                                                                                name)))
                                                         (swank-mcp-tests--thread-names))
                                            2)))
      (swank-mcp-tests--mcp-call server 4 "threads" '((action . "list")))
      (should (string-match-p "\"swank-mcp evaluate-lisp, call [^\"]*-call-[0-9]+\""
                              (swank-mcp-tests--response-ok server 4)))
      ;; M-x swank-mcp-cancel-call: the newest call.  The agent is told within a second.
      (let ((start (float-time)))
        (swank-mcp-tests--cancel)
        (should (string-match-p "cancelled evaluate-lisp (ert): its evaluation was interrupted, and the agent is told"
                                (swank-mcp-tests--last-message)))
        (let ((text (swank-mcp-tests--response-error server 3 1)))
          (message "swank-mcp: the agent was told of the cancellation after %.0f ms"
                   (* 1000 (- (float-time) start)))
          (should (string-match-p "EVALUATION-CANCELLED\nThe user cancelled this call in Emacs (M-x swank-mcp-cancel-call)"
                                  text))))
      (should-not (swank-mcp-tests--responded-p server 2))
      ;; In the activity buffer, C-c C-c on a call cancels that one.
      (swank-mcp-tests--wait-activity activity "the second loop, cancelled"
                                      "cancelled.*\n.*second-loop.*\n +Cancelled in Emacs\\.")
      (let ((window (display-buffer activity)))
        (swank-mcp-tests--goto-call activity "first-loop")
        (set-window-point window (with-current-buffer activity (point)))
        (with-selected-window window
          (execute-kbd-macro (kbd "C-c C-c"))))
      (should (string-match-p "The user cancelled this call in Emacs"
                              (swank-mcp-tests--response-error server 2 1)))
      (swank-mcp-tests--wait-activity activity "the first loop, cancelled"
                                      "cancelled.*\n.*first-loop.*\n +Cancelled in Emacs\\.")
      ;; The workers have their own names back, and nothing is left to cancel.
      (should-not (cl-find-if (lambda (name) (and (stringp name) (string-match-p "evaluate-lisp, call" name)))
                              (swank-mcp-tests--thread-names)))
      (should (plist-get (swank-mcp-tests--cancel) :failure)))))

(swank-mcp-tests--deftest swank-mcp-a-call-whose-server-went-away-is-not-left-running ()
  (swank-mcp-tests--with-approvals (server)
    (swank-mcp-tests--with-activity activity
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(progn (sleep 3) :server-goes-away)")))
      (swank-mcp-tests--wait-activity activity "the call, running" "running\n.*server-goes-away")
      ;; The agent's server is killed: it can never say how the call ended.
      (delete-process server)
      (swank-mcp-tests--wait-activity activity "the call, ended by the image"
                                      "server gone\n.*server-goes-away.*\n +The agent's server went away before this call ended")
      (should (string-match-p "No agent's call is running or waiting"
                              (plist-get (swank-mcp-tests--cancel) :failure))))))

(swank-mcp-tests--deftest swank-mcp-cancel-call-cancels-a-call-waiting-for-approval ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (swank-mcp-tests--with-activity activity
      (let ((messages (with-current-buffer (messages-buffer) (point-max))))
        (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-cancelled-first* t)")))
        (swank-mcp-tests--prompt "cancelled-first")
        (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(defparameter *swank-mcp-cancelled-waiting* t)")))
        (swank-mcp-tests--prompt "(1 of 2)")
        ;; The newest: the second of two.
        (swank-mcp-tests--cancel)
        (should (string-match-p "declined by the user" (swank-mcp-tests--response-error server 3)))
        ;; The call left waits alone: the first of one, not the second of two.
        (with-current-buffer (swank-mcp-tests--prompt "(1 of 1)")
          (should (string-match-p "cancelled-first" (buffer-string)))
          (swank-mcp-approve))
        (swank-mcp-tests--response-ok server 2)
        (swank-mcp-tests--wait-activity activity "the cancelled call, as such"
                                        "cancelled  (waited [0-9]+ ms for approval)\n.*cancelled-waiting.*\n +Cancelled in Emacs\\.")
        ;; Whatever came first, the image's end of the request or its answer to the
        ;; cancellation, the echo area said it was cancelled, never that another Emacs
        ;; declined it.
        (let ((said (with-current-buffer (messages-buffer) (buffer-substring-no-properties messages (point-max)))))
          (should (string-match-p "cancelled evaluate-lisp (ert), which waited for approval; it does not run" said))
          (should (string-match-p "evaluate-lisp was cancelled in Emacs (M-x swank-mcp-cancel-call); it did not run" said))
          (should-not (string-match-p "declined in another Emacs" said)))
        (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-CANCELLED-WAITING*") :unbound))))))

;;;;; The user's event log

(defun swank-mcp-tests--events-buffer ()
  "The connection's event log (*slime-events*, or SLY's)."
  (if (eq swank-mcp-tests--backend 'sly)
      (sly--events-buffer swank-mcp-tests--connection)
    (slime-events-buffer)))

(defun swank-mcp-tests--events-text ()
  "The text of the connection's event log."
  (with-current-buffer (swank-mcp-tests--events-buffer)
    (buffer-substring-no-properties (point-min) (point-max))))

(swank-mcp-tests--deftest swank-mcp-a-burst-of-calls-leaves-the-users-event-log-alone ()
  (swank-mcp-tests--with-approvals (server "--confirm" "load-file")
    (swank-mcp-tests--with-activity activity
      (let ((calls 100))
        (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(+ 1 2)")))
        (swank-mcp-tests--response-ok server 2)
        (swank-mcp-tests--idle 0.5)
        (swank-mcp-tests--eval '(cl:identity "users-own-history-marker"))
        (let ((before (length (swank-mcp-tests--events-text))))
          (dotimes (i calls)
            (swank-mcp-tests--mcp-call server (+ 100 i) "evaluate-lisp"
                                       `((code . ,(format "(progn \"a burst of calls\" (list :burst %d))" i)))))
          (dotimes (i calls)
            (swank-mcp-tests--mcp-response server (+ 100 i)))
          (swank-mcp-tests--wait "the burst's last call, done"
                                 (lambda () (string-match-p (format "done.*\n.*:burst %d)" (1- calls))
                                                            (swank-mcp-tests--activity-text activity))))
          (let* ((text (swank-mcp-tests--events-text))
                 (added (substring text before))
                 (lines (split-string added "\n" t)))
            (message "swank-mcp event log (%s): %d characters, %d lines for %d calls"
                     swank-mcp-tests--backend (length added) (length lines) calls)
            ;; Each message on one line of its own, short.
            (dolist (line lines)
              (should (string-match-p "\\`(:channel-send [0-9]+ :call :id \"[^\"]+\" :state :[a-z-]+ :tool \"evaluate-lisp\" :version \u2026)\\'"
                                      line))
              (unless (<= (length line) 160) (ert-fail (substring line 0 400))))
            ;; Under a third of what the log keeps, and the user's own request is still there.
            (should (< (length added) 33000))
            (should (string-match-p "users-own-history-marker" text))))))))

(swank-mcp-tests--deftest swank-mcp-without-approval-mode-a-confirmed-call-is-refused ()
  (swank-mcp-approval-mode -1)
  (swank-mcp-tests--with-server (server "--confirm" "evaluate-lisp")
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-refused* t)")))
    (should (string-match-p "swank-mcp-approval-mode" (swank-mcp-tests--response-error server 2)))
    (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-REFUSED*") :unbound))))

;;;;; The activity record

(defun swank-mcp-tests--activity-text (buffer)
  "The text of activity BUFFER."
  (with-current-buffer buffer (buffer-substring-no-properties (point-min) (point-max))))

(defun swank-mcp-tests--wait-activity (buffer what regexp)
  "Wait until activity BUFFER matches REGEXP, naming WHAT."
  (swank-mcp-tests--wait what (lambda () (string-match-p regexp (swank-mcp-tests--activity-text buffer)))))

(defun swank-mcp-tests--goto-call (buffer regexp)
  "Move point in activity BUFFER to the last call whose lines match REGEXP."
  (with-current-buffer buffer
    (goto-char (point-max))
    (should (re-search-backward regexp nil t))))

(defun swank-mcp-tests--check-reply-shown (buffer line call reply)
  "Check that RET on the last call matching CALL in activity BUFFER gives REPLY.
First wait until BUFFER matches LINE."
  (swank-mcp-tests--wait-activity buffer (format "the activity line %S" line) line)
  (swank-mcp-tests--goto-call buffer call)
  (when (get-buffer "*swank-mcp reply*")
    (kill-buffer "*swank-mcp reply*"))
  ;; The reply is shown when the image sends it.
  (with-current-buffer buffer (swank-mcp-activity-show-reply))
  (swank-mcp-tests--wait "the reply shown" (lambda () (get-buffer "*swank-mcp reply*")))
  (should (equal (with-current-buffer "*swank-mcp reply*" (buffer-string)) reply)))

(swank-mcp-tests--deftest swank-mcp-activity-records-every-call-with-its-state ()
  (let* ((root (make-temp-file "swank-mcp-activity" t))
         (file (expand-file-name "forms.lisp" root))
         (buffer nil))
    (with-temp-file file
      (insert "(defun swank-mcp-loaded-marker () :loaded)\n"))
    (swank-mcp-tests--with-approvals (server "--confirm" "load-form" "--root" root)
      (unwind-protect
          (progn
            ;; A call made before the buffer opens is in the record too.
            (swank-mcp-tests--mcp-call server 2 "evaluate-lisp"
                                       '((code . "(progn (princ \"activity-output-marker\") (list :activity-marker (+ 1 2)))")))
            (let ((done (swank-mcp-tests--response-ok server 2)))
              (setq buffer (swank-mcp-activity))
              ;; RET shows the reply as the agent received it, its output included.
              (should (string-match-p "activity-output-marker" done))
              (swank-mcp-tests--check-reply-shown buffer "evaluate-lisp  (ert)  done  [0-9]+ ms\n +(progn (princ"
                                                  "activity-output-marker" done))
            ;; A load-form waits for approval, shown as such, and is declined.
            (swank-mcp-tests--mcp-call server 3 "load-form"
                                       `((file_path . ,file) (form_type . "defun") (form_name . "swank-mcp-loaded-marker")))
            (swank-mcp-tests--wait-activity buffer "the load-form waiting" "load-form  (ert)  waiting for approval")
            ;; Its arguments one to a line, not as JSON; and the keys in the header line, which
            ;; does not scroll away.
            (swank-mcp-tests--wait-activity buffer "the load-form's arguments"
                                            (format "waiting for approval\n    file_path: %s\n    form_name: swank-mcp-loaded-marker\n    form_type: defun\n"
                                                    (regexp-quote file)))
            (with-current-buffer buffer
              (should (equal header-line-format "RET reply, n/p move, / filter, C-c C-c cancel, b unbreak, g reread, h help"))
              ;; It fits a window half as wide as a frame of 160 columns, fringes aside.
              (should (<= (string-width header-line-format) 78)))
            (should-not (string-match-p "g reread" (swank-mcp-tests--activity-text buffer)))
            ;; RET on the waiting call goes to its prompt.
            (swank-mcp-tests--prompt "run load-form")
            (swank-mcp-tests--goto-call buffer "load-form  (ert)  waiting for approval")
            (with-current-buffer buffer (swank-mcp-activity-show-reply))
            (with-current-buffer (window-buffer (selected-window))
              (should (equal (buffer-name) swank-mcp--approval-buffer-name))
              (should (string-match-p "\\`ert asks to run load-form\\." (buffer-string)))
              (swank-mcp-decline))
            ;; It never ran: only its wait is timed.
            (swank-mcp-tests--check-reply-shown buffer "load-form  (ert)  declined  (waited [0-9]+ ms for approval)$"
                                                "load-form  (ert)  declined"
                                                (swank-mcp-tests--response-error server 3))
            ;; Approved, it compiles into the image and is recorded as done.
            (swank-mcp-tests--mcp-call server 4 "load-form"
                                       `((file_path . ,file) (form_type . "defun") (form_name . "swank-mcp-loaded-marker")))
            (with-current-buffer (swank-mcp-tests--wait
                                  "the second approval"
                                  (lambda () (let ((approval (get-buffer swank-mcp--approval-buffer-name)))
                                               (and approval
                                                    (equal (plist-get (nth 2 (buffer-local-value 'swank-mcp--approval-shown
                                                                                                 approval))
                                                                      :tool)
                                                           "load-form")
                                                    approval))))
              (swank-mcp-approve))
            (swank-mcp-tests--check-reply-shown buffer "load-form  (ert)  done  [0-9]+ ms  (waited [0-9]+ ms for approval)$"
                                                "load-form  (ert)  done"
                                                (swank-mcp-tests--response-ok server 4))
            ;; A failed call, with the error the agent got.
            (swank-mcp-tests--mcp-call server 5 "evaluate-lisp" '((code . "(error \"activity-failure-marker\")")))
            (let ((failed (swank-mcp-tests--response-error server 5)))
              (should (string-match-p "activity-failure-marker" failed))
              (swank-mcp-tests--check-reply-shown buffer "evaluate-lisp  (ert)  failed  [0-9]+ ms" "activity-failure-marker"
                                                  failed))
            (with-current-buffer buffer
              ;; n and p go from call to call (the record holds the calls of other tests too).
              (swank-mcp-tests--goto-call buffer "activity-output-marker")
              (forward-line -1)
              (should (looking-at "[0-9:]+  evaluate-lisp .* done"))
              (swank-mcp-activity-next 2)
              (should (looking-at "[0-9:]+  load-form .* done"))
              (swank-mcp-activity-previous)
              (should (looking-at "[0-9:]+  load-form .* declined"))
              (swank-mcp-activity-next 2)
              (should (looking-at "[0-9:]+  evaluate-lisp .* failed"))
              (should-error (swank-mcp-activity-next) :type 'user-error)
              ;; A filter by state, then by tool.
              (swank-mcp-activity-filter '(state . :failed))
              (should (string-match-p "failed" (buffer-string)))
              (should-not (string-match-p "load-form\\|  done" (buffer-string)))
              (swank-mcp-activity-filter '(tool . "load-form"))
              (should (string-match-p "declined" (buffer-string)))
              (should-not (string-match-p "evaluate-lisp  (ert)" (buffer-string)))
              (swank-mcp-activity-filter nil)
              ;; g reads the whole record again, and shows it when it comes.
              (let ((before (buffer-substring-no-properties (point-min) (point-max))))
                (let ((inhibit-read-only t)) (erase-buffer))
                (revert-buffer)
                (swank-mcp-tests--wait "the record read again"
                                       (lambda () (equal (buffer-substring-no-properties (point-min) (point-max))
                                                         before)))))
            (should-not (string-match-p "activity-output-marker\\|activity-failure-marker"
                                        (swank-mcp-tests--repl-text))))
        (when buffer (kill-buffer buffer))))))

;;;;; The buffers of the files agents write

(defun swank-mcp-tests--messages-match-p (regexp)
  "Whether a line of *Messages* matches REGEXP."
  (cl-some (lambda (line) (string-match-p regexp line))
           (split-string (with-current-buffer (messages-buffer) (buffer-string)) "\n")))

(defun swank-mcp-tests--edit (server id file name)
  "Have SERVER's agent replace the defun NAME of FILE by one that returns :agents.
ID numbers the request; the edit is loaded into the image."
  (swank-mcp-tests--mcp-call server id "edit-lisp-form"
                             `((file_path . ,file) (form_type . "defun") (form_name . ,name) (operation . "replace")
                               (content . ,(format "(defun %s () :agents)" name)) (load . t)))
  (swank-mcp-tests--response-ok server id))

(defun swank-mcp-tests--compile-defun ()
  "Compile the defun at point, as C-c C-c does."
  (call-interactively (if (eq swank-mcp-tests--backend 'sly) 'sly-compile-defun 'slime-compile-defun)))

;; Issue 49: the agent patched a file the person had open, and nothing in Emacs said so.
(swank-mcp-tests--deftest swank-mcp-an-agents-edit-reverts-a-clean-buffer-and-flags-compiling-an-older-one ()
  (let* ((root (make-temp-file "swank-mcp-writes" t))
         (clean-file (expand-file-name "clean.lisp" root))
         (dirty-file (expand-file-name "dirty.lisp" root))
         (buffers '()))
    (with-temp-file clean-file (insert "(defun swank-mcp-clean () :old)\n"))
    (with-temp-file dirty-file (insert "(defun swank-mcp-dirty () :old)\n"))
    (swank-mcp-tests--with-server (server "--root" root)
      (swank-mcp-tests--with-activity activity
        (unwind-protect
            (let ((clean (find-file-noselect clean-file))
                  (dirty (find-file-noselect dirty-file)))
              (setq buffers (list clean dirty))
              (with-current-buffer dirty
                (goto-char (point-max))
                (insert ";; the person's unsaved note\n"))
              ;; A buffer without unsaved changes shows the agent's text.
              (swank-mcp-tests--edit server 2 clean-file "swank-mcp-clean")
              (swank-mcp-tests--wait "the clean buffer reverted"
                                     (lambda () (with-current-buffer clean (string-match-p ":agents" (buffer-string)))))
              (should-not (buffer-modified-p clean))
              (should (swank-mcp-tests--messages-match-p
                       "^swank-mcp: ert's edit-lisp-form at [0-9:]+ wrote clean\\.lisp; its buffer now shows the agent's text\\.$"))
              ;; One with unsaved changes keeps them, and the person is told.
              (swank-mcp-tests--edit server 3 dirty-file "swank-mcp-dirty")
              (swank-mcp-tests--wait-activity activity "the kept buffer's line"
                                              (format "buffer not reverted\n    ert's edit-lisp-form at [0-9:]+ wrote %s, \
which the buffer dirty.lisp visits with unsaved changes: the buffer was left as it is"
                                                      (regexp-quote dirty-file)))
              (should (swank-mcp-tests--messages-match-p "^swank-mcp: ert's edit-lisp-form .* wrote .*dirty\\.lisp, which"))
              (with-current-buffer dirty
                (should (string-match-p ":old)\n;; the person's unsaved note" (buffer-string)))
                ;; C-c C-c of its older text is flagged; it is compiled all the same.
                (goto-char (point-min))
                (swank-mcp-tests--compile-defun))
              (swank-mcp-tests--wait-activity activity "the older text's compilation flagged"
                                              "compiled older text\n    Line 1 was compiled from the buffer dirty.lisp, \
whose text is older than the agent's write of .*dirty\\.lisp (ert's edit-lisp-form at")
              (swank-mcp-tests--wait "the person's text compiled"
                                     (lambda () (equal (swank-mcp-tests--user-value "(swank-mcp-dirty)") ":OLD")))
              ;; Reverted, it holds the agent's text, and compiling that is not flagged.
              (let ((flagged (lambda () (cl-count-if (lambda (line) (string-match-p "^[0-9:]+  compiled older text" line))
                                                     (split-string (swank-mcp-tests--activity-text activity) "\n")))))
                (with-current-buffer dirty
                  (revert-buffer t t)
                  (should (string-match-p ":agents" (buffer-string)))
                  (goto-char (point-min))
                  (swank-mcp-tests--compile-defun))
                (swank-mcp-tests--wait "the agent's text compiled"
                                       (lambda () (equal (swank-mcp-tests--user-value "(swank-mcp-dirty)") ":AGENTS")))
                (swank-mcp-tests--idle 0.5)
                (should (= (funcall flagged) 1))))
          (dolist (buffer buffers)
            (with-current-buffer buffer (set-buffer-modified-p nil))
            (kill-buffer buffer)))))))

;; Issue 49: RET on a call showed the reply in the REPL's window, in place of the REPL.
(swank-mcp-tests--deftest swank-mcp-a-reply-shown-leaves-the-repls-window-alone ()
  (swank-mcp-tests--with-server (server)
    (swank-mcp-tests--with-activity activity
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(list :reply-beside-the-repl)")))
      (swank-mcp-tests--response-ok server 2)
      (swank-mcp-tests--wait-activity activity "the call" "done.*\n.*:reply-beside-the-repl")
      (when (get-buffer "*swank-mcp reply*")
        (kill-buffer "*swank-mcp reply*"))
      (delete-other-windows)
      (switch-to-buffer activity)
      (let ((repl-window (split-window-right)))
        (set-window-buffer repl-window (swank-mcp-tests--repl-buffer))
        (swank-mcp-tests--goto-call activity ":reply-beside-the-repl")
        (swank-mcp-activity-show-reply)
        (swank-mcp-tests--wait "the reply shown" (lambda () (get-buffer-window "*swank-mcp reply*")))
        (should (eq (window-buffer repl-window) (swank-mcp-tests--repl-buffer)))
        (should (eq (window-buffer (selected-window)) activity))))))

;; Issue 49: run-tests reloaded the person's changed files first, which its reply said and its
;; activity line did not.
(swank-mcp-tests--deftest swank-mcp-a-reload-before-the-tests-shows-under-the-call ()
  (swank-mcp-tests--with-server (server)
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(+ 1 2)")))
    (swank-mcp-tests--response-ok server 2)
    (swank-mcp-tests--with-activity activity
      ;; The note an agent's server sends as run-tests ends, with the reply as run_tests.rs makes it.
      (swank-mcp-tests--eval
       '(mcp-agent-helper:note-activities
         '((:id "ert-reloading-run" :tool "run-tests" :state :done :input "{\"system\":\"tally\"}" :client "ert"
                :milliseconds 40
                :text "PASSED tally/tests: 3 of 3 checks passed.
Before the tests, ASDF reloaded 1 changed file of tally (tally.lisp); undo entries 4 to 5 hold what it replaced."))))
      (swank-mcp-tests--wait-activity
       activity "the reload under the call"
       "run-tests  (ert)  done  40 ms\n.*\n    PASSED tally/tests: 3 of 3 checks passed\\.\n    Before the tests, ASDF \
reloaded 1 changed file of tally (tally\\.lisp); undo entries 4 to 5 hold what it replaced\\.\n"))))

;; Issue 49: every agent of one MCP client had that client's name.
(swank-mcp-tests--deftest swank-mcp-an-agent-goes-by-the-name-it-was-given ()
  (swank-mcp-tests--with-approvals (server "--name" "reviewer" "--confirm" "evaluate-lisp")
    (swank-mcp-tests--with-activity activity
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(list :named-agent)")))
      (with-current-buffer (swank-mcp-tests--prompt ":named-agent")
        (should (string-match-p "\\`reviewer asks to run evaluate-lisp\\." (buffer-string)))
        (swank-mcp-approve))
      (swank-mcp-tests--response-ok server 2)
      (swank-mcp-tests--wait-activity activity "the named agent's call" "evaluate-lisp  (reviewer)  done"))))

;; Issue 49: a window at the end of the activity buffer stayed at its start once the buffer had
;; shown the record, and missed the calls that came next.
(swank-mcp-tests--deftest swank-mcp-a-window-at-the-end-of-the-activity-buffer-follows-new-calls ()
  (swank-mcp-tests--with-server (server)
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(list :before-the-buffer)")))
    (swank-mcp-tests--response-ok server 2)
    (delete-other-windows)
    (let ((window (split-window-right)))
      (swank-mcp-tests--with-activity activity
        (set-window-buffer window activity)
        (set-window-point window (with-current-buffer activity (point-max)))
        ;; The record comes after the subscription, and the buffer is written again.
        (swank-mcp-tests--wait-activity activity "the record" ":before-the-buffer")
        (should (= (window-point window) (with-current-buffer activity (point-max))))
        (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(list :after-the-record)")))
        (swank-mcp-tests--response-ok server 3)
        (swank-mcp-tests--wait-activity activity "the next call" "done.*\n.*:after-the-record")
        (should (= (window-point window) (with-current-buffer activity (point-max))))
        ;; g reads the record again; the window stays at the end.
        (with-current-buffer activity (revert-buffer))
        (swank-mcp-tests--idle 0.5)
        (should (= (window-point window) (with-current-buffer activity (point-max))))))))

(defun swank-mcp-tests--mailbox-count ()
  "How many mailboxes the image's server keeps.
It keeps one for each thread that exchanged a message."
  (swank-mcp-tests--eval `(cl:length (cl:symbol-value (cl:find-symbol "*MAILBOXES*"
                                                                      ,(if (eq swank-mcp-tests--backend 'sly)
                                                                           "SLYNK-SBCL"
                                                                         "SWANK/SBCL"))))))

(swank-mcp-tests--deftest swank-mcp-an-idle-activity-buffer-and-approval-mode-cost-nothing ()
  (swank-mcp-tests--with-port
    (let* ((port (swank-mcp-start))
           (buffer (swank-mcp-activity)))
      (swank-mcp-approval-mode 1)
      (unwind-protect
          (progn
            ;; An agent has loaded the helper and gone.
            (should (eql 0 (car (swank-mcp-tests--run port "eval" "(+ 1 2)"))))
            (swank-mcp-tests--idle 1)
            (let ((mailboxes (swank-mcp-tests--mailbox-count))
                  (events (buffer-size (swank-mcp-tests--events-buffer))))
              (swank-mcp-tests--idle 10)
              (should (equal (buffer-size (swank-mcp-tests--events-buffer)) events))
              ;; The count itself is a request of its own, whose thread may add one.
              (should (<= (swank-mcp-tests--mailbox-count) (1+ mailboxes)))))
        (swank-mcp-approval-mode -1)
        (kill-buffer buffer)))))

(defun swank-mcp-tests--milliseconds-until (predicate)
  "Milliseconds until PREDICATE holds, serving the connections meanwhile."
  (let ((start (float-time))
        (deadline (+ (float-time) 30)))
    (while (not (funcall predicate))
      (when (> (float-time) deadline)
        (ert-fail "timed out waiting for the measured event"))
      (accept-process-output nil 0.001))
    (* 1000 (- (float-time) start))))

(defun swank-mcp-tests--median (numbers)
  "The median of NUMBERS."
  (nth (/ (length numbers) 2) (sort (copy-sequence numbers) #'<)))

(swank-mcp-tests--deftest swank-mcp-latency-of-the-activity-line-and-the-prompt ()
  "Print the time from a call's request to its activity line and its prompt.
benches/emacs_latency.sh runs this test alone and shows the figures."
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (swank-mcp-tests--with-activity activity
      (let ((lines '())
            (prompts '())
            (count (lambda (buffer text) (with-current-buffer buffer (how-many (regexp-quote text) (point-min) (point-max))))))
        (dotimes (round 11)
          (let ((shown (funcall count activity "describe-symbol")))
            (swank-mcp-tests--mcp-call server (+ 100 round) "describe-symbol" '((symbol . "car")))
            (push (swank-mcp-tests--milliseconds-until
                   (lambda () (> (funcall count activity "describe-symbol") shown)))
                  lines)
            (swank-mcp-tests--mcp-response server (+ 100 round)))
          (let ((code (format "(list :latency-round %d)" round)))
            (swank-mcp-tests--mcp-call server (+ 200 round) "evaluate-lisp" `((code . ,code)))
            (push (swank-mcp-tests--milliseconds-until
                   (lambda () (let ((buffer (get-buffer swank-mcp--approval-buffer-name)))
                                (and buffer (> (funcall count buffer code) 0)))))
                  prompts)
            (with-current-buffer swank-mcp--approval-buffer-name
              (swank-mcp-approve))
            (swank-mcp-tests--mcp-response server (+ 200 round))))
        ;; The first round loads the helper into the image.
        (let ((lines (butlast lines)) (prompts (butlast prompts)))
          (message "swank-mcp latency (%s, %d calls): activity line median %.1f ms, max %.1f ms; prompt median %.1f ms, max %.1f ms"
                   swank-mcp-tests--backend (length lines)
                   (swank-mcp-tests--median lines) (apply #'max lines)
                   (swank-mcp-tests--median prompts) (apply #'max prompts)))))))

;;;;; A prompt that ends while the person answers it

(swank-mcp-tests--deftest swank-mcp-keys-meant-for-a-prompt-that-ended-go-nowhere ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp" "--confirm-timeout" "2s")
    (let* ((source (generate-new-buffer "swank-mcp-ended.lisp"))
           (text "(defun swank-mcp-compiled-by-mistake () :compiled)\n")
           (ended-prompt
            (lambda (id code)
              ;; The person goes to the prompt (C-c C-x m p) and reads past the time limit.
              (swank-mcp-tests--mcp-call server id "evaluate-lisp" `((code . ,code)))
              (swank-mcp-tests--prompt (regexp-quote code))
              (execute-kbd-macro (kbd "C-c C-x m p"))
              (should (eq (window-buffer (selected-window)) (get-buffer swank-mcp--approval-buffer-name)))
              (window-buffer (selected-window))))
           (check-inert
            (lambda (prompt)
              ;; Focus stays in the prompt, which says how its call ended; what they go on
              ;; typing there (an answer, yes RET) does nothing but say so again.
              (should (eq (window-buffer (selected-window)) prompt))
              (should (string-match-p "\nThis request ended (timed out); nothing ran\\.  q to dismiss\\.\n"
                                      (with-current-buffer prompt (buffer-string))))
              (should (equal (with-current-buffer prompt header-line-format)
                             "This request ended: q dismisses it"))
              (execute-kbd-macro (kbd "C-c C-c"))
              (execute-kbd-macro (kbd "yes RET"))
              (execute-kbd-macro (kbd "C-c C-a"))
              (should (string-match-p "This request ended (timed out); nothing ran\\.  q to dismiss"
                                      (swank-mcp-tests--last-message)))
              (should (eq (window-buffer (selected-window)) prompt))
              (should (equal (with-current-buffer source (buffer-string)) text))
              ;; q dismisses it.
              (execute-kbd-macro "q")
              (should-not (get-buffer swank-mcp--approval-buffer-name)))))
      (unwind-protect
          (progn
            (swank-mcp-tests--visit-lisp-source source text)
            (goto-char (point-min))
            (forward-char 1)
            ;; The request times out while the prompt has the focus.
            (let ((prompt (funcall ended-prompt 2 "(defparameter *swank-mcp-ended-first* :ran)")))
              (swank-mcp-tests--response-error server 2)
              (swank-mcp-tests--wait "the prompt to say its call ended"
                                     (lambda () (with-current-buffer prompt swank-mcp--approval-ended)))
              (funcall check-inert prompt))
            ;; It times out while the person is asked whether to allow the tool for the session
            ;; (C-c C-a): they read the question past the time limit, then type yes RET.
            (let ((prompt (funcall ended-prompt 3 "(defparameter *swank-mcp-ended-second* :ran)")))
              (cl-letf (((symbol-function 'yes-or-no-p)
                         (lambda (_question)
                           (swank-mcp-tests--wait "the request to time out"
                                                  (lambda () (swank-mcp-tests--responded-p server 3)))
                           (swank-mcp-tests--idle 0.5)
                           t)))
                (execute-kbd-macro (kbd "C-c C-a")))
              (should (string-match-p "this request (evaluate-lisp) ended while you were asked; nothing ran"
                                      (swank-mcp-tests--last-message)))
              (funcall check-inert prompt))
            ;; Nothing ran, and nothing was compiled.
            (swank-mcp-tests--idle 1)
            (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-ENDED-FIRST*") :unbound))
            (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-ENDED-SECOND*") :unbound))
            (should-not (swank-mcp-tests--eval
                         '(cl:fboundp (cl:find-symbol "SWANK-MCP-COMPILED-BY-MISTAKE" "COMMON-LISP-USER")))))
        (kill-buffer source)))))

;;;;; Approval mode turned off and on

(swank-mcp-tests--deftest swank-mcp-approval-mode-off-refuses-the-calls-waiting-and-on-again-shows-them ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-waited-through* :ran)")))
    (swank-mcp-tests--prompt "waited-through")
    ;; Another subscription, as another Emacs makes, is sent the call that waits already.
    (pcase-let* ((`(,connection . ,backend) (swank-mcp--current))
                 (told '())
                 (gone nil)
                 (other (swank-mcp--subscribe connection backend :approvals
                                              `((:approval . ,(lambda (_channel &rest plist) (push plist told)))
                                                (:approval-ended . ignore)))))
      (unwind-protect
          (progn
            (swank-mcp-tests--wait "the new subscription to be sent the call waiting"
                                   (lambda () (cl-find-if (lambda (plist)
                                                            (string-match-p "waited-through" (plist-get plist :text)))
                                                          told)))
            ;; Off here, while the other watches: the call waits on, for the other to answer.
            (swank-mcp-approval-mode -1)
            (should-not (get-buffer swank-mcp--approval-buffer-name))
            (swank-mcp-tests--wait "the message that the other Emacs answers"
                                   (lambda () (string-match-p "calls waiting in the image of .* are left to the other Emacs"
                                                              (swank-mcp-tests--last-message))))
            (should-not (swank-mcp-tests--responded-p server 2))
            ;; On again: the new subscription shows the call that waits.
            (swank-mcp-approval-mode 1)
            (with-current-buffer (swank-mcp-tests--prompt "waited-through")
              (should (eq (swank-mcp-decline) :taken)))
            (should (string-match-p "declined by the user" (swank-mcp-tests--response-error server 2))))
        (swank-mcp--unsubscribe connection backend other nil (lambda (_) (setq gone t)))
        (swank-mcp-tests--wait "the other subscription to go" (lambda () gone))))
    ;; Off with no other Emacs watching: the call waiting is refused at once, saying why.
    (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(defparameter *swank-mcp-turned-off* :ran)")))
    (swank-mcp-tests--prompt "swank-mcp-turned-off")
    (let ((start (float-time)))
      (swank-mcp-approval-mode -1)
      (should (string-match-p "\\`evaluate-lisp was not run: the user turned approval mode off in Emacs"
                              (swank-mcp-tests--response-error server 3 2)))
      (let ((told (* 1000 (- (float-time) start))))
        (swank-mcp-tests--wait "the message that the call was refused"
                               (lambda () (string-match-p "approval mode is off; 1 call waiting in the image of .* was refused, and the agent is told why"
                                                          (swank-mcp-tests--last-message))))
        (message "swank-mcp: the agent was told approval mode was turned off after %.0f ms" told)))
    (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-TURNED-OFF*") :unbound))))

;;;;; Stopping the agent from a busy REPL

(swank-mcp-tests--deftest swank-mcp-cancel-from-a-busy-repl-does-not-wait-for-it ()
  (swank-mcp-tests--with-server (server)
    (swank-mcp-tests--with-activity activity
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(loop (sleep 0.1)) :busy-repl-loop")))
      (swank-mcp-tests--wait-activity activity "the agent's call, running" "running\n.*busy-repl-loop")
      (let* ((repl (swank-mcp-tests--wait "the REPL buffer" #'swank-mcp-tests--repl-buffer))
             (window (display-buffer repl))
             (slept nil))
        ;; The person's own evaluation keeps the REPL's thread busy for 5 s.
        (with-current-buffer repl
          (funcall (intern (format "%s-eval-async" swank-mcp-tests--backend)) '(cl:sleep 5)
                   (lambda (_) (setq slept t))))
        (swank-mcp-tests--idle 0.3)
        (let ((start (float-time)))
          (with-selected-window window
            (execute-kbd-macro (kbd "C-c C-x m c")))
          (let ((returned (- (float-time) start)))
            (message "swank-mcp: C-c C-x m c in a busy REPL returned after %.0f ms" (* 1000 returned))
            (should (< returned 0.3)))
          (should (string-match-p "The user cancelled this call in Emacs"
                                  (swank-mcp-tests--response-error server 2 1)))
          (should (< (- (float-time) start) 1.5))
          (should-not slept))
        (swank-mcp-tests--wait "the REPL's evaluation to end" (lambda () slept) 10)))))

;;;;; Swank-mcp's own buffers, the port, the activity buffer's size

(swank-mcp-tests--deftest swank-mcp-commands-are-bound-in-swank-mcps-own-buffers ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (swank-mcp-tests--with-activity activity
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-own-buffers* :ran)")))
      (let* ((prompt (swank-mcp-tests--prompt "own-buffers"))
             (undo (swank-mcp-undo)))
        (unwind-protect
            (dolist (buffer (list activity prompt undo (get-buffer swank-mcp--buffer-name)))
              (with-current-buffer buffer
                (should (eq (key-binding (kbd "C-c C-x m a")) #'swank-mcp-activity))
                (should (eq (key-binding (kbd "C-c C-x m p")) #'swank-mcp-show-approval))
                (should (eq (key-binding (kbd "C-c C-x m c")) #'swank-mcp-cancel-call))))
          (kill-buffer undo))
        ;; And they work there: in the prompt, C-c C-x m c declines its call.
        (with-selected-window (display-buffer prompt)
          (execute-kbd-macro (kbd "C-c C-x m c")))
        (should (string-match-p "declined by the user" (swank-mcp-tests--response-error server 2)))))))

(defun swank-mcp-tests--listening-ports ()
  "The ports of the servers that listen in the test image."
  (let* ((backend (cdr (swank-mcp--current)))
         (alive-p (intern (format "%s::thread-alive-p" (swank-mcp--backend-server-backend backend)))))
    (swank-mcp-tests--eval `(cl:loop for server in ,(swank-mcp--backend-servers backend)
                                     when (cl:and (cl:third server) (,alive-p (cl:third server)))
                                     collect (cl:second server)))))

(swank-mcp-tests--deftest swank-mcp-start-shows-the-port-open-in-the-image ()
  (swank-mcp-tests--with-port
    (let ((port (swank-mcp-start)))
      (should (equal (swank-mcp-tests--listening-ports) (list port)))
      ;; An Emacs that does not know of it (reconnected, or another) finds it open.
      (let ((swank-mcp--servers nil))
        (should (eql (swank-mcp-start t) port))
        (should (string-match-p (format "port %d was open already in this image, no second one was opened" port)
                                (swank-mcp-tests--last-message))))
      (should (equal (swank-mcp-tests--listening-ports) (list port))))))

(swank-mcp-tests--deftest swank-mcp-the-activity-buffer-keeps-its-last-lines ()
  (swank-mcp-tests--with-server (server)
    (let ((swank-mcp-activity-max-lines 20))
      (swank-mcp-tests--with-activity activity
        (dotimes (i 12)
          (swank-mcp-tests--mcp-call server (+ 10 i) "evaluate-lisp" `((code . ,(format "(list :bounded %d)" i))))
          (swank-mcp-tests--response-ok server (+ 10 i)))
        (swank-mcp-tests--wait-activity activity "the last call, done" "done.*\n.*:bounded 11)")
        (with-current-buffer activity
          ;; The header's line, and the calls that fit in 20 lines, the newest.
          (should (<= (count-lines (point-min) (point-max)) 22))
          (should (string-match-p ":bounded 8)\\(.\\|\n\\)*:bounded 11)" (buffer-string)))
          (should-not (string-match-p ":bounded 0)" (buffer-string)))
          (should (<= (length swank-mcp--activity-calls) 20)))))))

;;;;; A restarted Lisp

(defun swank-mcp-tests--restart-lisp ()
  "Quit the test image and start another, as a person restarts their Lisp.
Return the new connection."
  (let* ((connection (swank-mcp-tests--connect))
         (inferior (funcall (intern (format "%s-inferior-process" swank-mcp-tests--backend)) connection)))
    ;; SLY's teardown of its REPL may signal text-read-only from the connection's sentinel, as
    ;; it inserts its last words: the Lisp quits all the same, and the close hooks before it ran.
    (condition-case nil
        (funcall (intern (format "%s-quit-lisp" swank-mcp-tests--backend)) t)
      (text-read-only nil))
    (swank-mcp-tests--wait "the Lisp to quit"
                           (lambda () (not (or (process-live-p connection) (and inferior (process-live-p inferior))))))
    (setq swank-mcp-tests--ready nil)
    (swank-mcp-tests--connect)))

(swank-mcp-tests--deftest swank-mcp-after-a-restart-the-activity-buffer-is-a-fresh-one ()
  (let* ((old (swank-mcp-activity))
         (name (buffer-name old))
         (new nil))
    (unwind-protect
        (progn
          (swank-mcp-tests--wait "the first image's subscription"
                                 (lambda () (with-current-buffer old
                                              (swank-mcp--subscribed-p swank-mcp--activity-backend
                                                                       swank-mcp--activity-channel))))
          (swank-mcp-tests--restart-lisp)
          (should (string-match-p "The connection closed\\.\n\\'" (swank-mcp-tests--activity-text old)))
          (setq new (swank-mcp-activity))
          ;; The new connection has the name and a buffer of its own; the old one keeps what
          ;; it showed, under another.
          (should-not (eq new old))
          (should (equal (buffer-name new) name))
          (should (equal (buffer-name old) (concat (string-remove-suffix "*" name) ", closed*")))
          (with-current-buffer new
            (should (eq swank-mcp--activity-connection swank-mcp-tests--connection))
            (should-not (string-match-p "The connection closed" (buffer-string))))
          ;; Subscribed in the new image: an agent's call there shows in it.
          (swank-mcp-tests--with-server (server)
            (swank-mcp-tests--wait "the new image's subscription"
                                   (lambda () (with-current-buffer new
                                                (swank-mcp--subscribed-p swank-mcp--activity-backend
                                                                         swank-mcp--activity-channel))))
            (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(list :after-the-restart)")))
            (swank-mcp-tests--response-ok server 2)
            (swank-mcp-tests--wait-activity new "the call in the new image" "done.*\n.*:after-the-restart")))
      (kill-buffer old)
      (when new (kill-buffer new)))))

;; Issue 49: an agent's first call in a fresh image waits while the helper loads (seconds when
;; it is compiled), and Emacs showed nothing all that time.
(swank-mcp-tests--deftest swank-mcp-the-first-call-in-a-fresh-image-shows-at-once ()
  (swank-mcp-tests--restart-lisp)
  (let ((arrived '()))
    (cl-letf* ((show (symbol-function 'swank-mcp--activity-show))
               ((symbol-function 'swank-mcp--activity-show)
                (lambda (call)
                  (push (or (plist-get call :event) (plist-get call :tool)) arrived)
                  (funcall show call))))
      (swank-mcp-tests--with-port
        (swank-mcp-tests--with-activity activity
          (let ((server (swank-mcp-tests--mcp-start (swank-mcp-start))))
            (unwind-protect
                (progn
                  (swank-mcp-tests--mcp-initialize server)
                  (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(list :first-call)")))
                  (swank-mcp-tests--response-ok server 2)
                  (swank-mcp-tests--wait-activity activity "the first call" "evaluate-lisp  (ert)  done")
                  ;; The helper's loading came first, before the call's own note could.
                  (should (eq (car (last arrived)) :helper))
                  (should (string-match-p "swank-mcp's helper\n    swank-mcp loaded its helper into the image"
                                          (swank-mcp-tests--activity-text activity))))
              (delete-process server))))))))

;; Issue 49: an agent killed while its call waited was said to have withdrawn its request.
(swank-mcp-tests--deftest swank-mcp-a-killed-agents-request-is-said-to-have-lost-its-server ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(list :asked-by-a-killed-agent)")))
    (swank-mcp-tests--prompt ":asked-by-a-killed-agent")
    (delete-process server)
    (swank-mcp-tests--wait "the prompt to go" (lambda () (not (get-buffer swank-mcp--approval-buffer-name))))
    (should (swank-mcp-tests--messages-match-p
             "^swank-mcp: the agent's server went away (it exited or was killed): evaluate-lisp did not run\\.$"))
    (should-not (swank-mcp-tests--messages-match-p "withdrew its request"))))

;; Issue 49: after restarts, a call still shown running for ever, closed buffers piling up as
;; "<2>", "<3>", and an undo buffer that did not say its image was gone.
(swank-mcp-tests--deftest swank-mcp-a-restart-leaves-one-closed-buffer-of-each-and-no-call-running ()
  (let ((kept '()))
    (unwind-protect
        (progn
          (swank-mcp-tests--with-server (server)
            (swank-mcp-tests--with-activity activity
              (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(sleep 60)")))
              (swank-mcp-tests--wait-activity activity "the call running" "evaluate-lisp  (ert)  running\n    (sleep 60)")
              (push (swank-mcp-undo) kept)
              (let ((name (buffer-name activity)))
                (swank-mcp-tests--restart-lisp)
                (should (equal (buffer-name activity) (concat (string-remove-suffix "*" name) ", closed*")))
                (should (string-match-p "evaluate-lisp  (ert)  unknown: the connection closed\n    (sleep 60)"
                                        (swank-mcp-tests--activity-text activity)))
                ;; The undo buffer says its image is gone, and reads no journal.
                (with-current-buffer (car (last kept))
                  (should (string-match-p ", closed\\*\\'" (buffer-name)))
                  (should (string-match-p "The connection closed" header-line-format))
                  (should-error (revert-buffer) :type 'user-error))
                ;; Another restart: the newer closed buffer takes the name, the older goes.
                (let ((second (swank-mcp-activity)))
                  (push second kept)
                  (swank-mcp-tests--wait "the second image's subscription"
                                         (lambda () (with-current-buffer second
                                                      (swank-mcp--subscribed-p swank-mcp--activity-backend
                                                                               swank-mcp--activity-channel))))
                  (swank-mcp-tests--restart-lisp)
                  (should (buffer-live-p second))
                  (should-not (buffer-live-p activity))
                  (should (equal (buffer-name second) (concat (string-remove-suffix "*" name) ", closed*")))
                  (should-not (cl-find-if (lambda (buffer) (string-match-p "swank-mcp.*<[0-9]+>" (buffer-name buffer)))
                                          (buffer-list))))))))
      (dolist (buffer kept)
        (when (buffer-live-p buffer)
          (kill-buffer buffer))))))

;; Issue 49: a call whose Lisp restarted while it waited for approval died with it.
(swank-mcp-tests--deftest swank-mcp-a-call-whose-lisp-restarted-leaves-no-prompt ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(list :dies-with-its-lisp)")))
    (let ((prompt (swank-mcp-tests--prompt ":dies-with-its-lisp")))
      ;; The person is answering it: its window is selected.
      (select-window (get-buffer-window prompt t))
      (swank-mcp-tests--restart-lisp)
      (swank-mcp-tests--wait "the prompt to go" (lambda () (not (get-buffer swank-mcp--approval-buffer-name))))
      (should-not swank-mcp--approvals)
      (should (cl-every (lambda (subscribed) (process-live-p (car subscribed))) swank-mcp--approval-channels))
      (should (cl-some (lambda (line)
                         (string-match-p "the Lisp connection closed: evaluate-lisp waiting for approval ended" line))
                       (split-string (with-current-buffer (messages-buffer) (buffer-string)) "\n"))))))

;; Issue 49: the port swank-mcp-start opened is opened again in the restarted Lisp, and
;; swank-mcp-status finds a port open in the image as swank-mcp-start does.
(swank-mcp-tests--deftest swank-mcp-a-restarted-lisp-gets-its-port-again-and-status-agrees-with-start ()
  (swank-mcp-tests--with-port
    (let ((port (swank-mcp-start)))
      (swank-mcp-tests--restart-lisp)
      (swank-mcp-tests--wait "the port open again" (lambda () (equal (swank-mcp-tests--listening-ports) (list port))))
      ;; Said once the image's answer comes, which may be a moment after the port listens.
      (swank-mcp-tests--wait "the echo area to say so"
                             (lambda () (swank-mcp-tests--messages-match-p
                                         (format "^swank-mcp: the Lisp restarted; port %d is open again in the new image$"
                                                 port))))
      (let ((swank-mcp--servers nil))
        (should (equal (mapcar #'car (swank-mcp-status)) (list port)))
        (should (string-match-p (format "swank-mcp: port %d open in the" port) (swank-mcp-tests--last-message)))
        (should (eql (swank-mcp-start t) port))))))

;;;;; Undo

(defun swank-mcp-tests--user-eval (code)
  "Evaluate CODE (a string) in the image as the user's C-x C-e does.
Return what it printed."
  (cadr (swank-mcp-tests--eval `(,(swank-mcp-tests--server-function "eval-and-grab-output") ,code))))

(defun swank-mcp-tests--user-value (code)
  "The printed value of CODE (a string), evaluated as the user's own code is.
Only its first word: Slynk describes an integer at length after it."
  (car (split-string (swank-mcp-tests--user-eval code))))

(defun swank-mcp-tests--undo-goto (regexp)
  "Move to the last line of the undo buffer matching REGEXP."
  (goto-char (point-max))
  (should (re-search-backward regexp nil t))
  (beginning-of-line))

(swank-mcp-tests--deftest swank-mcp-undo-asks-and-refuses-what-the-user-changed-since ()
  (swank-mcp-tests--with-port
    (let ((port (swank-mcp-start))
          (message-log-max t))
      (swank-mcp-tests--user-eval "(defun swank-mcp-greet () :users-first)")
      (should (eql 0 (car (swank-mcp-tests--run port "eval" "(defun swank-mcp-greet () :agents)"))))
      ;; The user redefines it after the agent did.
      (swank-mcp-tests--user-eval "(defun swank-mcp-greet () :users-newer)")
      (let ((buffer (swank-mcp-undo)))
        (unwind-protect
            (with-current-buffer buffer
              (should (string-match-p "SWANK-MCP-GREET: replaced a definition with no source file (defined at the REPL)"
                                      (buffer-string)))
              (should-not (string-match-p "at defined at" (buffer-string)))
              ;; The keys stay in the header line, however far the journal scrolls.
              (should (equal header-line-format "r restores the entry at point, R every entry from it on, \
</> older/newer entries, g reads the journal again"))
              ;; Asked first: no means nothing happens.
              (swank-mcp-tests--undo-goto "function +COMMON-LISP-USER::SWANK-MCP-GREET")
              (let ((questions (swank-mcp-tests--answering y-or-n-p '(nil) (swank-mcp-undo-restore))))
                (should (string-match-p "\\`Restore entry [0-9]+, function COMMON-LISP-USER::SWANK-MCP-GREET\\? \\'"
                                        (car questions))))
              (should (equal (swank-mcp-tests--user-value "(swank-mcp-greet)") ":USERS-NEWER"))
              ;; Yes, but the definition changed since: refused, saying what changed, and not forced.
              (swank-mcp-tests--undo-goto "function +COMMON-LISP-USER::SWANK-MCP-GREET")
              (let ((questions (swank-mcp-tests--answering y-or-n-p '(t nil) (swank-mcp-undo-restore))))
                (should (string-match-p "changed since: redefined after the agent's call.*Restore anyway"
                                        (cadr questions))))
              (should (equal (swank-mcp-tests--user-value "(swank-mcp-greet)") ":USERS-NEWER"))
              (should-not (string-match-p "SWANK-MCP-GREET.*\n +(restored)" (buffer-string)))
              ;; Forced, the definition the agent replaced is back.
              (swank-mcp-tests--undo-goto "function +COMMON-LISP-USER::SWANK-MCP-GREET")
              (swank-mcp-tests--answering y-or-n-p '(t t) (swank-mcp-undo-restore))
              (should (equal (swank-mcp-tests--user-value "(swank-mcp-greet)") ":USERS-FIRST"))
              (should (string-match-p "SWANK-MCP-GREET.*\n +(restored)$" (buffer-string)))
              ;; A page at a time, with the journal's own paging.
              (should (eql 0 (car (swank-mcp-tests--run port "eval" "(defun swank-mcp-paged () :agents)"))))
              (let ((swank-mcp-undo-page-size 1)
                    (entry-numbers (lambda ()
                                     (let ((numbers '()))
                                       (goto-char (point-min))
                                       (while (re-search-forward "^ *\\([0-9]+\\)  " nil t)
                                         (push (string-to-number (match-string 1)) numbers))
                                       numbers))))
                (revert-buffer)
                (let ((newest (funcall entry-numbers)))
                  (should (equal (length newest) 1))
                  (should (string-match-p "older entries: < shows them" (buffer-string)))
                  (swank-mcp-undo-older)
                  (should (equal (funcall entry-numbers) (list (1- (car newest)))))
                  (should (string-match-p "1 newer entries: > shows them" (buffer-string)))
                  (swank-mcp-undo-newer)
                  (should (equal (funcall entry-numbers) newest))
                  (should-error (swank-mcp-undo-newer) :type 'user-error))))
          (kill-buffer buffer))))))

(swank-mcp-tests--deftest swank-mcp-undo-restores-methods-a-class-and-says-where-the-file-stands ()
  (let* ((root (make-temp-file "swank-mcp-undo" t))
         (file (expand-file-name "agent.lisp" root)))
    (with-temp-file file
      (insert "(in-package :cl-user)\n(defun swank-mcp-from-file () :agents-file-version)\n"))
    (swank-mcp-tests--with-server (server "--root" root)
      (swank-mcp-tests--user-eval
       "(progn (defclass swank-mcp-shape () ((users-slot :initform 1)))
               (defgeneric swank-mcp-area (shape))
               (defmethod swank-mcp-area ((shape swank-mcp-shape)) :users-method)
               (defun swank-mcp-from-file () :users-version))")
      (swank-mcp-tests--mcp-call
       server 2 "evaluate-lisp"
       '((code . "(progn (defclass swank-mcp-shape () ((agents-slot :initform 2)))
                               (defmethod swank-mcp-area ((shape swank-mcp-shape)) :agents-method)
                               (defmethod swank-mcp-area ((shape integer)) :agents-added-method))")))
      (swank-mcp-tests--response-ok server 2)
      (swank-mcp-tests--mcp-call server 3 "load-form"
                                 `((file_path . ,file) (form_type . "defun") (form_name . "swank-mcp-from-file")))
      (swank-mcp-tests--response-ok server 3)
      (should (equal (swank-mcp-tests--user-value "(swank-mcp-area 3)") ":AGENTS-ADDED-METHOD"))
      (let ((buffer (swank-mcp-undo)))
        (unwind-protect
            (with-current-buffer buffer
              (should (string-match-p "class +COMMON-LISP-USER::SWANK-MCP-SHAPE (redefined): replaced"
                                      (buffer-string)))
              (should (string-match-p "method +COMMON-LISP-USER::SWANK-MCP-AREA ((INTEGER)): added: restoring removes it" (buffer-string)))
              ;; Every entry from the class on, newest first.
              (swank-mcp-tests--undo-goto "class +COMMON-LISP-USER::SWANK-MCP-SHAPE")
              (swank-mcp-tests--answering y-or-n-p '(t) (swank-mcp-undo-restore-since))
              (let ((said (with-current-buffer "*Messages*" (buffer-string))))
                (should (string-match-p "Restored [0-9]+ method COMMON-LISP-USER::SWANK-MCP-AREA: removed" said))
                (should (string-match-p (format "Restored [0-9]+ function COMMON-LISP-USER::SWANK-MCP-FROM-FILE: .*Only the image changed: %s still holds the agent's version (line 2)"
                                                (regexp-quote file))
                                        said)))
              ;; What became of an entry on the line after it, which truncation cannot cut.
              (cl-loop for (line next) on (split-string (buffer-string) "\n")
                       when (string-match-p "SWANK-MCP-\\(SHAPE\\|AREA\\)" line)
                       do (should (string-match-p "\\`      (restored)\\'" next)))
              ;; The entry itself says where the file stands.
              (should (string-match-p (format "SWANK-MCP-FROM-FILE: .*\n      (restored; only in the image: %s still holds the agent's version)$"
                                              (regexp-quote file))
                                      (buffer-string))))
          (kill-buffer buffer)))
      (should (equal (swank-mcp-tests--user-value "(swank-mcp-from-file)") ":USERS-VERSION"))
      (should (equal (swank-mcp-tests--user-value
                      "(swank-mcp-area (make-instance 'swank-mcp-shape))")
                     ":USERS-METHOD"))
      (should (string-match-p "NO-APPLICABLE-METHOD\\|no applicable method"
                              (swank-mcp-tests--user-eval
                               "(handler-case (swank-mcp-area 3) (error (e) (princ-to-string (type-of e))))")))
      (should (equal (swank-mcp-tests--user-value
                      "(mapcar #'sb-mop:slot-definition-name (sb-mop:class-direct-slots (find-class 'swank-mcp-shape)))")
                     "(USERS-SLOT)")))))

;;;;; At home in Emacs

(swank-mcp-tests--deftest swank-mcp-commands-are-bound-under-the-front-ends-prefix ()
  (swank-mcp-tests--connect)
  ;; A Lisp source buffer, as the user visits one.
  (with-temp-buffer
    (lisp-mode)
    (funcall (intern (format "%s-mode" swank-mcp-tests--backend)) 1))
  (let ((map (symbol-value (intern (format "%s-mode-map" swank-mcp-tests--backend)))))
    (should (eq (lookup-key map (kbd "C-c C-x m a")) #'swank-mcp-activity))
    (should (eq (lookup-key map (kbd "C-c C-x m u")) #'swank-mcp-undo))
    (should (eq (lookup-key map (kbd "C-c C-x m m")) #'swank-mcp-approval-mode))
    (should (eq (lookup-key map (kbd "C-c C-x m r")) #'swank-mcp-revoke-session-allowances))
    (should (eq (lookup-key map (kbd "C-c C-x m p")) #'swank-mcp-show-approval))
    (should (eq (lookup-key map (kbd "C-c C-x m c")) #'swank-mcp-cancel-call))
    (should (eq (lookup-key map (kbd "C-c C-x m b")) #'swank-mcp-clear-breakpoints))
    ;; The front end's own bindings under the same prefix stay.
    (should (eq (lookup-key map (kbd "C-c C-x t")) (intern (format "%s-list-threads" swank-mcp-tests--backend))))
    (should (eq (lookup-key map (kbd "C-c C-x c")) (intern (format "%s-list-connections" swank-mcp-tests--backend)))))
  ;; In the REPL too, where SLIME has no slime-mode, beside the front end's own keys.
  (let ((repl (swank-mcp-tests--wait "the REPL buffer" #'swank-mcp-tests--repl-buffer)))
    (with-current-buffer repl
      (should (eq (key-binding (kbd "C-c C-x m a")) #'swank-mcp-activity))
      (should (eq (key-binding (kbd "C-c C-x m c")) #'swank-mcp-cancel-call))
      (should (eq (key-binding (kbd "C-c C-x t")) (intern (format "%s-list-threads" swank-mcp-tests--backend)))))))

(swank-mcp-tests--deftest swank-mcp-approval-mode-shows-in-the-mode-line-and-allowances-can-be-revoked ()
  (swank-mcp-tests--with-approvals (server "--confirm" "evaluate-lisp")
    (should (equal (cadr (assq 'swank-mcp-approval-mode minor-mode-alist)) " MCP-approve"))
    ;; C-c C-a: run, and allow evaluate-lisp for the rest of the session, once confirmed.
    (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(defparameter *swank-mcp-allowed* 1)")))
    (with-current-buffer (swank-mcp-tests--prompt "allowed\\* 1")
      (let ((questions (swank-mcp-tests--answering yes-or-no-p '(nil) (should-not (swank-mcp-approve-for-session)))))
        (should (equal questions '("Run evaluate-lisp now, and every later evaluate-lisp call of ert without \
asking you, for the rest of its session? "))))
      ;; Not confirmed: the call still waits.
      (should (string-match-p "not answered; evaluate-lisp still waits" (swank-mcp-tests--last-message)))
      (should (swank-mcp--approval-shown))
      (should (eq (swank-mcp-tests--image-value "*SWANK-MCP-ALLOWED*") :unbound))
      (swank-mcp-tests--answering yes-or-no-p '(t) (should (eq (swank-mcp-approve-for-session) :taken))))
    (swank-mcp-tests--response-ok server 2)
    ;; Allowed: the next call runs unasked.
    (swank-mcp-tests--mcp-call server 3 "evaluate-lisp" '((code . "(defparameter *swank-mcp-allowed* 2)")))
    (swank-mcp-tests--response-ok server 3)
    (should (eql (swank-mcp-tests--image-value "*SWANK-MCP-ALLOWED*") 2))
    ;; Revoked: the next call waits for an answer again.
    (should (equal (swank-mcp-revoke-session-allowances) '(("evaluate-lisp" "ert"))))
    (should-not (swank-mcp-revoke-session-allowances))
    (swank-mcp-tests--mcp-call server 4 "evaluate-lisp" '((code . "(defparameter *swank-mcp-allowed* 3)")))
    (with-current-buffer (swank-mcp-tests--prompt "allowed\\* 3")
      (swank-mcp-decline))
    (should (string-match-p "declined by the user" (swank-mcp-tests--response-error server 4)))
    (should (eql (swank-mcp-tests--image-value "*SWANK-MCP-ALLOWED*") 2)))
  (should-not swank-mcp-approval-mode))

;;;;; The image's own threads: the person's SLDB, the agent's attach and breakpoints

(defun swank-mcp-tests--define-shop ()
  "Define, as the person would, a worker that prices a job and records it.
Both keep their frames (debug 2), so that a frame of theirs can be restarted.
No name holds \"swank\": slynk's reader would read it as \"slynk\"."
  (swank-mcp-tests--user-eval
   "(progn (defvar *mcp-shop-done* '()) (defvar *mcp-shop-worker* nil)
      (defun mcp-shop-price (qty) (declare (optimize (debug 2))) (* qty 10))
      (defun mcp-shop-work (job) (declare (optimize (debug 2)))
        (push (cons sb-thread:*current-thread* (mcp-shop-price job)) *mcp-shop-done*))
      t)"))

(defun swank-mcp-tests--match (regexp text)
  "The first group of REGEXP in TEXT; fail when it does not match."
  (should (string-match regexp text))
  (match-string 1 text))

(swank-mcp-tests--deftest swank-mcp-the-agent-fixes-a-thread-waiting-in-the-users-debugger ()
  (swank-mcp-tests--with-server (server)
    (swank-mcp-tests--with-activity activity
      ;; swank-mcp's connection comes after the person's, as when they M-x slime first.
      (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(+ 1 2)")))
      (should (equal (swank-mcp-tests--response-ok server 2) "=> 3"))
      (swank-mcp-tests--define-shop)
      ;; The person starts a worker whose job's quantity came as text.
      (swank-mcp-tests--user-eval "(setf *mcp-shop-worker*
                                     (sb-thread:make-thread (lambda () (sleep 0.5) (mcp-shop-work \"3\"))
                                                           :name \"shop-worker\"))")
      ;; Their debugger shows the error, as ever, and the thread waits there.
      (let ((debugger (car (swank-mcp-tests--wait "the person's debugger" #'swank-mcp-tests--debugger-buffers))))
        (with-current-buffer debugger
          (should (string-match-p "is not of type" (buffer-string)))))
      (should (eq (swank-mcp-tests--eval '(cl:and (sb-thread:thread-alive-p cl-user::*mcp-shop-worker*) :alive))
                  :alive))
      ;; The agent attaches to it by name, reads the local, fixes the function, restarts the frame.
      (swank-mcp-tests--mcp-call server 3 "debugger" '((action . "attach") (thread . "shop-worker")))
      (let* ((attached (swank-mcp-tests--response-ok server 3))
             (session (swank-mcp-tests--match "\\[DEBUGGER \\(D[0-9]+\\)\\]" attached))
             (frame (string-to-number
                     (swank-mcp-tests--match "^ *\\([0-9]+\\): (\\(?:[A-Z-]+::?\\)?MCP-SHOP-PRICE " attached))))
        (should (string-match-p "waits in the person's Emacs debugger" attached))
        ;; The person's activity buffer says so, with the condition the thread stopped with.
        (swank-mcp-tests--wait-activity
         activity "the attach in the activity buffer"
         "attached to a thread\n    An agent attached to thread [0-9]+ \"shop-worker\", which waits in the person's \
Emacs debugger with TYPE-ERROR: The value \"3\" is not of type NUMBER")
        ;; Numbered as the person's M-x slime-list-threads (sly-list-threads) numbers it.
        (let ((listed (cl-find "shop-worker" (cdr (swank-mcp-tests--eval
                                                   `(,(swank-mcp-tests--server-function "list-threads"))))
                               :key #'cadr :test #'equal)))
          (should (string-match-p (format "attached to thread %d \"shop-worker\"" (car listed))
                                  (swank-mcp-tests--activity-text activity))))
        (swank-mcp-tests--mcp-call server 4 "debugger" `((session . ,session) (action . "frame") (frame . ,frame)))
        (should (string-match-p "QTY = \"3\"" (swank-mcp-tests--response-ok server 4)))
        (swank-mcp-tests--mcp-call server 5 "evaluate-lisp"
                                   '((code . "(defun mcp-shop-price (qty) (* (if (stringp qty) (parse-integer qty) qty) 10))")))
        (swank-mcp-tests--response-ok server 5)
        (swank-mcp-tests--mcp-call server 6 "debugger" `((session . ,session) (action . "restart_frame") (frame . ,frame)))
        (should (string-match-p "left the debugger" (swank-mcp-tests--response-ok server 6))))
      ;; The person's debugger closes, the same thread finished the same job, and their
      ;; connection still answers.
      (swank-mcp-tests--wait "the person's debugger to close" (lambda () (null (swank-mcp-tests--debugger-buffers))))
      (should (eql (swank-mcp-tests--eval '(cl:let ((done (cl:first cl-user::*mcp-shop-done*)))
                                            (cl:and (cl:eq (cl:car done) cl-user::*mcp-shop-worker*) (cl:cdr done))))
                   30))
      (should (equal (swank-mcp-tests--user-value "(+ 40 2)") "42")))))

(swank-mcp-tests--deftest swank-mcp-the-activity-buffer-shows-the-agents-breakpoints-and-b-clears-them ()
  (swank-mcp-tests--with-server (server)
    (swank-mcp-tests--with-activity activity
      (swank-mcp-tests--user-eval "(progn (defvar *swank-mcp-priced* nil) (defun swank-mcp-tariff (qty) (* qty 10)) t)")
      (swank-mcp-tests--mcp-call server 2 "debugger" '((action . "break") (function . "swank-mcp-tariff")
                                                       (condition . "(> qty 5)")))
      (let ((number (swank-mcp-tests--match "\\`Breakpoint \\([0-9]+\\): " (swank-mcp-tests--response-ok server 2))))
        (swank-mcp-tests--wait-activity
         activity "the breakpoint set"
         (format "breakpoint set\n    An agent set breakpoint %s on [A-Z-]*:*SWANK-MCP-TARIFF when (> qty 5), \
every thread: a call that stops waits for the agent, not in your debugger\\.\n" number))
        ;; The person's thread stops at it: for the agent, not in their debugger, and they see it.
        (swank-mcp-tests--user-eval "(sb-thread:make-thread (lambda () (setf *swank-mcp-priced* (swank-mcp-tariff 7)))
                                                            :name \"tariff-worker\")")
        (swank-mcp-tests--wait-activity
         activity "the stop at the breakpoint"
         (format "stopped at a breakpoint\n    Thread [0-9]+ \"tariff-worker\" stopped at breakpoint %s: \
[A-Z-]*:*SWANK-MCP-TARIFF called with (7)\\. It waits for the agent\\.\n" number))
        (should-not (swank-mcp-tests--debugger-buffers))
        ;; b in the activity buffer removes every agent's breakpoint (C-c C-x m b elsewhere).
        (with-current-buffer activity
          (should (eq (key-binding (kbd "C-c C-x m b")) #'swank-mcp-clear-breakpoints)))
        (with-selected-window (display-buffer activity)
          (execute-kbd-macro (kbd "b")))
        (swank-mcp-tests--wait-activity
         activity "the breakpoint removed"
         (format "breakpoint removed\n    Removed breakpoint %s on [A-Z-]*:*SWANK-MCP-TARIFF when (> qty 5), \
every thread: cleared in Emacs\\.\n" number))
        (swank-mcp-tests--wait "the echo area to say so"
                               (lambda () (string-match-p (format "removed the agents' breakpoint on .*SWANK-MCP-TARIFF (%s)\\."
                                                                  number)
                                                          (swank-mcp-tests--last-message))))
        ;; The thread stopped at it goes on at once, and no call stops any more.
        (swank-mcp-tests--wait-activity
         activity "the thread let go"
         (format "left a breakpoint\n    Thread [0-9]+ \"tariff-worker\" left breakpoint %s: it was let go, as \
cleared in Emacs\\.\n" number))
        (swank-mcp-tests--wait "the stopped call to finish"
                               (lambda () (eql (swank-mcp-tests--image-value "*SWANK-MCP-PRICED*") 70)))
        (should (equal (swank-mcp-tests--user-value
                        "(sb-thread:join-thread (sb-thread:make-thread (lambda () (swank-mcp-tariff 9)))
                                                :timeout 10 :default :stopped)")
                       "90"))
        (swank-mcp-tests--mcp-call server 3 "debugger" '((action . "breakpoints")))
        (should (equal (swank-mcp-tests--response-ok server 3) "No breakpoints.")))
      ;; A breakpoint goes with its agent's session, and the person sees that too.
      (swank-mcp-tests--mcp-call server 6 "debugger" '((action . "break") (function . "swank-mcp-tariff")))
      (let ((number (swank-mcp-tests--match "\\`Breakpoint \\([0-9]+\\): " (swank-mcp-tests--response-ok server 6))))
        (delete-process server)
        (swank-mcp-tests--wait-activity
         activity "the breakpoint gone with its session"
         (format "breakpoint removed\n    Removed breakpoint %s on [A-Z-]*:*SWANK-MCP-TARIFF, every thread: \
its agent's session ended\\.\n" number))))))

;;;;; The person's connection closing

;; Not through SLY: SLY itself halts SBCL into LDB when it disconnects with an sly-db open,
;; reproduced with no swank-mcp in the image (M-x sly, an error in a thread, sly-disconnect: SBCL
;; 2.2.9 halts after slynk's ";; closing 0 listeners").
(unless (eq swank-mcp-tests--backend 'sly)
(swank-mcp-tests--deftest swank-mcp-disconnecting-with-a-debugger-open-keeps-the-image ()
  ;; The Emacs that started the Lisp takes its global output; when it disconnects while a thread
  ;; waits in its SLDB and another at the agent's breakpoint, the image, both threads and the
  ;; agent's connection go on.
  (let* ((connection (swank-mcp-tests--connect))
         (inferior (funcall (intern (format "%s-inferior-process" swank-mcp-tests--backend)) connection))
         (server nil))
    (unwind-protect
        (let ((swank-mcp-port (swank-mcp-tests--free-port)))
          (setq server (swank-mcp-tests--mcp-start (swank-mcp-start)))
          (swank-mcp-tests--mcp-initialize server)
          (swank-mcp-tests--mcp-call server 2 "evaluate-lisp" '((code . "(+ 1 2)")))
          (should (equal (swank-mcp-tests--response-ok server 2) "=> 3"))
          (swank-mcp-tests--user-eval "(progn (defvar *mcp-kept-done* nil) (defun mcp-kept-rate (q) (* q 10)) t)")
          (swank-mcp-tests--mcp-call server 3 "debugger" '((action . "break") (function . "mcp-kept-rate")))
          (swank-mcp-tests--response-ok server 3)
          (swank-mcp-tests--user-eval "(sb-thread:make-thread (lambda () (setf *mcp-kept-done* (mcp-kept-rate 4)))
                                                             :name \"kept-rater\")")
          ;; The thread errs once the request that made it has returned: SLIME enters a recursive
          ;; edit for a debugger that opens while a synchronous request waits, which a batch Emacs
          ;; leaves at once, and the connection then fails under the test.
          (swank-mcp-tests--user-eval "(sb-thread:make-thread (lambda () (sleep 0.5) (error \"kept-worker fails\"))
                                                             :name \"kept-worker\")")
          (swank-mcp-tests--wait "the person's debugger" #'swank-mcp-tests--debugger-buffers)
          ;; SLY asks whether to kill the debugger's buffer on the way out: as the person, yes.
          (cl-letf (((symbol-function 'y-or-n-p) (lambda (&rest _) t)))
            (funcall (intern (format "%s-disconnect" swank-mcp-tests--backend))))
          (swank-mcp-tests--wait "the connection to close" (lambda () (not (process-live-p connection))))
          ;; Threads print after the disconnect, as workers do.
          (swank-mcp-tests--mcp-call server 4 "evaluate-lisp"
                                     '((code . "(sb-thread:join-thread (sb-thread:make-thread (lambda () (print :after) (finish-output) :printed)))")))
          (should (string-match-p "=> :PRINTED" (swank-mcp-tests--response-ok server 4)))
          (should (process-live-p inferior))
          (should-not (with-current-buffer (process-buffer inferior)
                        (string-match-p "LDB\\|party is over" (buffer-string))))
          (swank-mcp-tests--mcp-call server 5 "threads" '())
          (let ((threads (swank-mcp-tests--response-ok server 5)))
            (should (string-match-p "kept-worker" threads))
            (should (string-match-p "kept-rater" threads)))
          ;; The thread at the breakpoint still waits for the agent, who lets it go.
          (swank-mcp-tests--mcp-call server 6 "debugger" '((action . "unbreak")))
          (should (string-match-p "went on" (swank-mcp-tests--response-ok server 6)))
          (swank-mcp-tests--mcp-call server 7 "evaluate-lisp"
                                     '((code . "(loop repeat 200 until cl-user::*mcp-kept-done* do (sleep 0.05)
                                                  finally (return cl-user::*mcp-kept-done*))")))
          (should (string-match-p "=> 40" (swank-mcp-tests--response-ok server 7))))
      (when server (delete-process server))
      ;; SLY asks (a buffer-local query) before it kills a debugger buffer whose connection is
      ;; live, as it is when the test failed before the disconnect.
      (dolist (buffer (swank-mcp-tests--debugger-buffers))
        (with-current-buffer buffer
          (let ((kill-buffer-query-functions nil))
            (kill-buffer buffer))))
      (when (process-live-p inferior)
        (kill-process inferior))
      ;; SLY's teardown of a REPL whose connection is gone may signal from its sentinel: the
      ;; Lisp ends all the same, and the test's own result is what counts.
      (ignore-errors
        (swank-mcp-tests--wait "the Lisp to end" (lambda () (not (process-live-p inferior)))))
      ;; Its port is not opened again in the next test's Lisp: that one is no restart of this one.
      (setq swank-mcp-tests--ready nil
            swank-mcp--reopen nil)))))

(provide 'swank-mcp-tests)

;;; swank-mcp-tests.el ends here
