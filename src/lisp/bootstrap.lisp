;;;; Puts the swank-mcp helper into the image. Sent as source when a connection finds the image
;;;; without the helper's current revision; everything else arrives through ENSURE-HELPER.
;;;;
;;;; Compiling the helper's source takes about 600 ms and holds SBCL's world lock all along, so
;;;; the compiled file is kept in the cache directory of the machine the image runs on, under a
;;;; name that says which helper revision and which SBCL it is for; later images load it in
;;;; milliseconds, and without the source crossing the wire. Where the cache cannot be written,
;;;; and for a server that promised --read-only (which writes no file), the source is loaded as
;;;; before.
;;;;
;;;; The image holds one revision of the helper at a time. A connection whose swank-mcp has another
;;;; one (an older or newer swank-mcp attached to the same image) replaces it only while none of
;;;; its calls runs; otherwise ENSURE-HELPER refuses, and that swank-mcp says why. A call made for a
;;;; revision the image no longer holds runs nothing (CALL, in calls.lisp), so neither swank-mcp
;;;; ever runs the other's definitions.
;;;;
;;;; The connection loads this file with SBCL's interpreter where it has one: these functions run
;;;; once per image, and compiling them cost more than running them.

(or (find-package "MCP-AGENT-HELPER")
    ;; Another connection may create it at the same moment.
    (ignore-errors (make-package "MCP-AGENT-HELPER" :use '("COMMON-LISP")))
    (find-package "MCP-AGENT-HELPER"))

(in-package "MCP-AGENT-HELPER")

(defvar *version* nil
  "A digest of the helper text loaded in this image (nil before the first load, and after
UNINSTALL).")

(defvar *release* nil
  "The release of the swank-mcp that loaded the helper, as it named itself.")

(defvar *calls-running* (list 0)
  "How many calls (see CALL) run now, in a cons for ATOMIC-INCF: while any does, the helper is not
replaced.")

(defvar *load-lock* nil
  "Held while the helper is checked and loaded: connections that arrive together (several
servers, a test suite) load it once, and the others find it current.")

(sb-ext:compare-and-swap (symbol-value '*load-lock*) nil (sb-thread:make-mutex :name "mcp-agent-helper load"))

(defun non-empty-environment-variable (name)
  (let ((value (sb-ext:posix-getenv name)))
    (and value (plusp (length value)) value)))

(defun helper-cache-directory ()
  "$SWANK_MCP_CACHE_DIR, $XDG_CACHE_HOME/swank-mcp/ or ~/.cache/swank-mcp/, in the image's own
environment, as a native namestring ending in a slash."
  (let ((base (or (non-empty-environment-variable "SWANK_MCP_CACHE_DIR")
                  (let ((cache (or (non-empty-environment-variable "XDG_CACHE_HOME")
                                   (let ((home (non-empty-environment-variable "HOME")))
                                     (and home (concatenate 'string (string-right-trim "/" home) "/.cache"))))))
                    (and cache (concatenate 'string (string-right-trim "/" cache) "/swank-mcp"))))))
    (and base (concatenate 'string (string-right-trim "/" base) "/"))))

(defun file-name-part (text)
  (substitute-if #\_ (lambda (char) (not (or (alphanumericp char) (find char ".-")))) text))

(defun helper-fasl (digest)
  "The compiled helper for DIGEST and this SBCL: a fasl only loads into the version and build
that wrote it."
  (let ((directory (helper-cache-directory)))
    (and directory
         (sb-ext:parse-native-namestring
          (format nil "~Ahelper-~A-~A-~A-~A.fasl" directory (file-name-part digest)
                  (file-name-part (lisp-implementation-type))
                  (file-name-part (lisp-implementation-version))
                  (file-name-part (machine-type)))))))

(defun call-quietly (function)
  "Calls FUNCTION with the standard readtable and CL-USER, printing nothing: the user's REPL (or
*inferior-lisp* buffer) is no place for the helper's compilation."
  (let ((*standard-output* (make-broadcast-stream))
        (*error-output* (make-broadcast-stream))
        (*load-verbose* nil) (*load-print* nil)
        (*compile-verbose* nil) (*compile-print* nil)
        (*package* (find-package "COMMON-LISP-USER"))
        (*readtable* (copy-readtable nil)))
    (handler-bind ((warning #'muffle-warning))
      (funcall function))))

(defun load-cached-helper (digest write-cache)
  "Loads the cached compiled helper for DIGEST if there is one; true when it did. A file that
does not load (cut short, or written by another build) is deleted, when WRITE-CACHE, so that the
source replaces it."
  (let ((fasl (helper-fasl digest)))
    (when (and fasl (probe-file fasl))
      (handler-case (progn (call-quietly (lambda () (load fasl)))
                           t)
        (error ()
          (when write-cache
            (ignore-errors (delete-file fasl)))
          nil)))))

(defun compile-helper-into-cache (digest source)
  "Compiles SOURCE into the cache as DIGEST's fasl, through temporary files renamed into place, so
that an image reading the cache never sees half a file. Returns true when the fasl is there."
  (let ((fasl (helper-fasl digest)))
    (when fasl
      ;; Unique per process: images started together seed the same random state.
      (let* ((getpid (find-symbol "UNIX-GETPID" "SB-UNIX"))
             (stem (format nil "~A.~D.~36R" (sb-ext:native-namestring fasl)
                           (if (and getpid (fboundp getpid)) (funcall getpid) 0)
                           (random (expt 36 8) (make-random-state t))))
             (source-file (sb-ext:parse-native-namestring (concatenate 'string stem ".lisp")))
             (compiled (sb-ext:parse-native-namestring (concatenate 'string stem ".fasl-tmp"))))
        (unwind-protect
             (handler-case
                 (progn
                   (ensure-directories-exist fasl)
                   (with-open-file (out source-file :direction :output :if-exists :supersede
                                                    :external-format :utf-8)
                     (write-string source out))
                   (call-quietly (lambda ()
                                   (compile-file source-file :output-file compiled :external-format :utf-8)))
                   (rename-file compiled fasl)
                   t)
               (error () nil))
          (ignore-errors (delete-file source-file))
          (ignore-errors (when (probe-file compiled) (delete-file compiled))))))))

(defun calls-running ()
  "How many calls of the helper in the image run now: those CALL counts, or for a helper from
before CALL, those it registered under a token."
  (max (car *calls-running*)
       (let ((running (and (boundp '*running*) (symbol-value '*running*))))
         (if (hash-table-p running) (hash-table-count running) 0))))

(defun installed (digest release how)
  "Puts in the footprint of the helper just loaded (footprint.lisp), which is then current."
  ;; By name: the helper defines it.
  (funcall 'install)
  (setf *version* digest
        *release* release)
  how)

(defun tell-emacs-of-loading (digest text)
  "Tells the Emacs activity buffers subscribed here TEXT, as an event of its own (its id names the
revision DIGEST, so that a later text replaces it): an agent's first call in a fresh image waits
while the helper is loaded, seconds when it is compiled, and the person sees that at once rather
than nothing until the call's own note. The subscriptions (*EMACS-FEEDS*, see activity.lisp) are
made by Emacs before any helper is loaded."
  (when (boundp '*emacs-feeds*)
    (multiple-value-bind (seconds minutes hours) (get-decoded-time)
      (dolist (feed (symbol-value '*emacs-feeds*))
        (when (eq (third feed) :activity)
          (ignore-errors
           (funcall (fourth feed)
                    (list :call :id (format nil "helper-~A" digest) :state :event :event :helper
                                :tool "swank-mcp" :version 0
                                :time (format nil "~2,'0D:~2,'0D:~2,'0D" hours minutes seconds)
                                :outcome text))))))))

(defun ensure-helper (digest release source &optional (write-cache t))
  "Makes the helper whose text has DIGEST, which swank-mcp RELEASE sends, current in this image.
Returns :CURRENT when it already was, :CACHED when its compiled file was loaded, :NEED-SOURCE when
SOURCE (nil) is needed to go on, :COMPILED when SOURCE was compiled into the cache and loaded, or
:SOURCE when it was loaded as source because the cache cannot be written or WRITE-CACHE is NIL
(for a server that promised --read-only, which writes no file). Returns (:BUSY release
digest calls) when the image holds another revision, of that release and digest, and it is running
that many calls: it is not replaced under their feet."
  (sb-thread:with-mutex (*load-lock*)
    (cond ((equal *version* digest) :current)
          ((and *version* (plusp (calls-running)))
           (list :busy *release* *version* (calls-running)))
          (t
           (tell-emacs-of-loading digest "swank-mcp is loading its helper into the image for an agent's \
first call here, which waits for it (seconds when it is compiled).")
           (let ((state (cond ((load-cached-helper digest write-cache) (installed digest release :cached))
                              ((null source) :need-source)
                              ((and write-cache (compile-helper-into-cache digest source)
                                    (load-cached-helper digest t))
                               (installed digest release :compiled))
                              (t (call-quietly (lambda () (load (make-string-input-stream source))))
                                 (installed digest release :source)))))
             (unless (eq state :need-source)
               (tell-emacs-of-loading digest "swank-mcp loaded its helper into the image; the agent's \
call goes on."))
             state)))))
