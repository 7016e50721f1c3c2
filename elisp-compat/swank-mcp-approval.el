;;; swank-mcp-approval.el --- Approve the agents' calls in Emacs before they run  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The swank-mcp authors

;; Author: The swank-mcp authors
;; URL: https://github.com/swank-mcp/swank-mcp
;; SPDX-License-Identifier: MIT

;; This file is not part of GNU Emacs.

;;; Commentary:

;; Part of swank-mcp (see swank-mcp.el): M-x swank-mcp-approval-mode shows
;; the calls swank-mcp runs with --confirm in a prompt of their own, which
;; takes no key meant for another buffer, and answers them; and M-x
;; swank-mcp-revoke-session-allowances takes back "allow for the session".

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'swank-mcp)

;;;; Approval mode
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

;;;; Taking back "allow for the session"

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

(provide 'swank-mcp-approval)

;;; swank-mcp-approval.el ends here
