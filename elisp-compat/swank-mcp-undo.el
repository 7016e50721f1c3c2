;;; swank-mcp-undo.el --- Put back what agents redefined in the image  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The swank-mcp authors

;; Author: The swank-mcp authors
;; URL: https://github.com/swank-mcp/swank-mcp
;; SPDX-License-Identifier: MIT

;; This file is not part of GNU Emacs.

;;; Commentary:

;; Part of swank-mcp (see swank-mcp.el): M-x swank-mcp-undo lists the
;; journal of what the agents' calls defined in the image, and puts back
;; what an entry replaced, after asking.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'swank-mcp)

;;;; Undo

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
          ((equal kind "variable") "set again by a DEFPARAMETER: restoring puts that value back")
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
                  ((equal kind "variable") "its value is back")
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

(provide 'swank-mcp-undo)

;;; swank-mcp-undo.el ends here
