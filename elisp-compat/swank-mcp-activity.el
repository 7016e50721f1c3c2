;;; swank-mcp-activity.el --- The agents' calls in the image, as they happen  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The swank-mcp authors

;; Author: The swank-mcp authors
;; URL: https://github.com/swank-mcp/swank-mcp
;; SPDX-License-Identifier: MIT

;; This file is not part of GNU Emacs.

;;; Commentary:

;; Part of swank-mcp (see swank-mcp.el): the activity buffer (M-x
;; swank-mcp-activity), which shows every tool call of the agents in the
;; image of a SLIME or SLY connection as it happens; ending an agent's call
;; (M-x swank-mcp-cancel-call) and removing the agents' breakpoints (M-x
;; swank-mcp-clear-breakpoints); and the buffers of the files the agents
;; write, reverted or flagged.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'swank-mcp)

;;;; The activity buffer

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
  "Show again every call recorded that passes the filter, oldest first.
The windows at the end stay there, following the calls that come next:
erasing the buffer would leave them at its start."
  (let ((inhibit-read-only t)
        (calls (reverse swank-mcp--activity-calls))
        (at-end (= (point) (point-max)))
        (following (cl-remove-if-not (lambda (window) (= (window-point window) (point-max)))
                                     (get-buffer-window-list (current-buffer) nil t))))
    (erase-buffer)
    (clrhash swank-mcp--activity-entries)
    (setq swank-mcp--activity-lines 0)
    (insert (swank-mcp--activity-header))
    (setq swank-mcp--activity-calls nil)
    (mapc #'swank-mcp--activity-show calls)
    (when at-end
      (goto-char (point-max)))
    (dolist (window following)
      (set-window-point window (point-max)))))

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

;;;; Stopping an agent's call

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

;;;; Clearing the agents' breakpoints

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

;;;; The buffers of the files agents write
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

(provide 'swank-mcp-activity)

;;; swank-mcp-activity.el ends here
