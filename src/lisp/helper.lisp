;;;; The swank-mcp helper: the Lisp side of the tools, put into the attached image by
;;;; bootstrap.lisp once per revision of its text. This first file holds what every tool shares:
;;;; output capture, running a call under a token that a timeout or cancellation can interrupt,
;;;; backtraces and condition reports, sessions, reading the user's code, RUN-TOOL and FAIL, and
;;;; the printers; names.lisp, handles.lisp, observe.lisp, evaluate.lisp, debugger.lisp,
;;;; introspection.lisp, compile.lisp, systems.lisp, testing.lisp, undo.lisp, loading.lisp,
;;;; activity.lisp, inspect.lisp and workers.lisp follow, one per purpose, in that order.
;;;;
;;;; Rules this file keeps, because it runs inside somebody else's live image:
;;;; - Everything lives in the MCP-AGENT-HELPER package; nothing global is changed (no DECLAIM,
;;;;   no *FEATURES* push, no changes to the readtable, the printer or the debugger hooks
;;;;   outside the dynamic extent of a call). The one exception is the undo journal's hooks on
;;;;   definitions (undo.lisp), installed once and inert outside tool calls.
;;;; - It is independent of swank and slynk: the Rust side calls it through either, so it must
;;;;   not mention either package. (The package name avoids the word "swank" for the same
;;;;   reason: Slynk's reader rewrites any token containing it.) The exceptions find the server's
;;;;   parts by name: FORGET-FINISHED-THREADS its mailbox list, the debugger tool its backend,
;;;;   START-WORKER (workers.lisp) its request loop.
;;;; - It is compiled into a file that replaces the previous revision's definitions, or loaded
;;;;   as source, so redefinition must be harmless: DEFCLASS rather than DEFSTRUCT, DEFVAR for
;;;;   state that must survive a reload.
;;;; - It names no SBCL internal in its source (see EXISTING-SYMBOLS): one that a future SBCL
;;;;   drops must fail the tool that needs it, not the helper's load.
;;;; - What a session makes once is made with NEW; what every call makes, with MAKE-INSTANCE of
;;;;   a quoted class (see NEW).

(defpackage #:mcp-agent-helper
  (:use #:common-lisp)
  (:export #:*version* #:evaluate #:cancel
           #:compile-code #:expand-form #:class-info #:describe-symbol #:apropos-search
           #:find-definition #:xref #:status #:load-system #:load-activity
           #:stuck-report #:undo-journal #:load-source #:load-source-file #:unload-definition #:system-directories
           #:debugger-report #:debugger-frame #:debugger-eval-in-frame #:debugger-invoke-restart
           #:debugger-restart-frame #:debugger-return-from-frame #:debugger-abort
           #:note-activities #:activity-records #:request-approval #:answer-approval
           #:allow-for-session #:session-allowed-p #:revoke-session-allowances
           #:inspect-value #:end-session #:handle-count #:start-worker
           #:trace-functions #:threads #:profile-code #:run-tests #:test-activity))

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Instances

(defun new (class &rest initargs)
  "MAKE-INSTANCE of CLASS through the generic path, for what a session makes once. With a quoted
class SBCL compiles an optimized constructor at the first instance, some 2 ms holding the world
lock, on the first call of a fresh image; the instances it makes after that take a tenth of the
time or less (evaluate-lisp's four per call: 9 us a call instead of 18), so what every call makes
is made that way."
  (apply #'make-instance class initargs))

;;; ------------------------------------------------------------------------------------------
;;; SBCL internals, found by name (first in the file: INTERNAL-CALL is a macro)

(defun existing-symbols (package-name &rest names)
  "The symbols of PACKAGE-NAME named NAMES that exist in this SBCL. Internal names move between
SBCL releases; reading them as SB-IMPL::X would intern them, which the package lock forbids, and
SB-IMPL:X is a read error once X is no longer external: either way the whole helper would fail
to load. So this file names no SBCL internal in its source; it finds them here."
  (let ((package (find-package package-name)))
    (and package
         (loop for name in names
               for symbol = (find-symbol name package)
               when symbol collect symbol))))

(defun sbcl-internal (package-name name)
  "The symbol PACKAGE-NAME:NAME of SBCL's internals, or a failure of the one tool that needs it
when this SBCL lacks it."
  (or (first (existing-symbols package-name name))
      (fail "This SBCL (~A) has no ~A::~A, which this tool needs; swank-mcp is tested with SBCL 2.2.9."
            (lisp-implementation-version) package-name name)))

(defmacro internal-call (package-name name &rest arguments)
  "Calls the function PACKAGE-NAME:NAME of SBCL's internals (see SBCL-INTERNAL)."
  `(funcall (sbcl-internal ,package-name ,name) ,@arguments))

(defun encapsulate-once (function-name tag wrapper)
  "Encapsulates FUNCTION-NAME with WRAPPER under TAG, unless it already is: a reload of the
helper finds its encapsulations in place. Does nothing where SBCL has no encapsulations, so that
the helper still loads there."
  (when (and (= 2 (length (existing-symbols "SB-INT" "ENCAPSULATE" "ENCAPSULATED-P")))
             (fboundp function-name)
             (not (internal-call "SB-INT" "ENCAPSULATED-P" function-name tag)))
    (internal-call "SB-INT" "ENCAPSULATE" function-name tag wrapper)))

;;; ------------------------------------------------------------------------------------------
;;; Capped output capture
;;;
;;; Output is cut inside the image so that a 20 MB print never crosses the wire (a swank frame
;;; holds at most 16 MB and the server closes the connection beyond that). A capture shows LIMIT
;;; characters: an output stream (a log) its start and its end, where a run's verdict is; a
;;; printed value its start. It keeps more than it shows, for the agent to read through a handle:
;;; KEEP characters of the start and, for a log, a quarter as many of the end; what is written
;;; between is counted and dropped, so a program may log without end and still finish.
;;;
;;; Only the pretty printer is stopped: it holds on to some 13-25 bytes for each character of
;;; one printed object it passes on, so printing a circular list without *PRINT-CIRCLE* would
;;; exhaust a 1 GB heap after about 40 million characters.

(defvar *max-output* 65536
  "Per call: the characters kept of each section of the reply (--max-output). Condition
messages are cut to it too.")

(defparameter *runaway-output-factor* 64
  "One printed object the pretty printer passes on is stopped past this many times a capture's
limit: far more than anybody reads, far less than endless printing needs to exhaust the heap.")

(defparameter *max-kept-output* 4000000
  "The most characters a capture keeps of the start of its text (see MAKE-CAPTURE).")

(define-condition output-limit-exceeded (error)
  ((limit :initarg :limit :reader output-limit)
   (bound :initarg :bound :reader output-bound))
  (:report (lambda (condition stream)
             (format stream "The pretty printer passed on ~:D characters of one printed object (~D times ~
                             --max-output, ~:D) without reaching its end, so the evaluation was stopped: ~
                             printing without end (a circular list while *PRINT-CIRCLE* is NIL) would ~
                             exhaust the image's memory, since the pretty printer holds on to what it ~
                             prints. Print less, or bind *PRINT-CIRCLE* to T to print circular structure."
                     (output-bound condition) *runaway-output-factor* (output-limit condition)))))

(defclass capture-stream (sb-gray:fundamental-character-output-stream)
  ((buffer :initform (make-array 256 :element-type 'character :adjustable t :fill-pointer 0)
           :reader capture-buffer)
   ;; The characters shown in the reply.
   (limit :initarg :limit :reader capture-limit)
   ;; The characters of the start kept, at least LIMIT: what is kept past those shown is read
   ;; back in slices through a handle (see CAPTURE-REPORT).
   (keep :initarg :keep :reader capture-keep)
   ;; A log's last characters, a ring that OVERFLOW indexes; NIL for a value.
   (tail :initarg :tail :reader capture-tail)
   ;; Characters written past KEEP: the last of them are in TAIL, the others are lost.
   (overflow :initform 0 :accessor capture-overflow)
   ;; :ANY stops whatever writes past BOUND, :PRETTY only the pretty printer's printing of one
   ;; object, NIL nothing.
   (runaway :initarg :runaway :reader capture-runaway)
   (bound :initarg :bound :reader capture-bound)
   ;; The pretty printer writes from its own buffer, one per printed object: the last string
   ;; written, and how many characters came from it in a row.
   (source :initform nil :accessor capture-source)
   (source-count :initform 0 :accessor capture-source-count)
   ;; Tracked over everything written, kept or not, so FRESH-LINE and the pretty printer
   ;; behave as on an uncapped stream.
   (column :initform 0 :accessor capture-column)))

(defun make-capture (limit &key (runaway :pretty) keep (tail t))
  "A capture that shows LIMIT characters and keeps KEEP of the start (by default the runaway
bound, within *MAX-KEPT-OUTPUT*) and with TAIL (a log) a quarter as many of the end. RUNAWAY (see
the class) says which writer it stops past the bound."
  (let* ((bound (* *runaway-output-factor* (max limit 1024)))
         (keep (max limit (min *max-kept-output* (or keep bound)))))
    (make-instance 'capture-stream
                   :limit limit
                   :keep keep
                   :tail (and tail (make-string (max limit (floor keep 4))))
                   :runaway runaway
                   :bound bound)))

(defun capture-written (stream)
  (+ (fill-pointer (capture-buffer stream)) (capture-overflow stream)))

(defun capture-lost (stream)
  "The characters written but kept neither in the start nor in the tail."
  (let ((tail (capture-tail stream)))
    (max 0 (- (capture-overflow stream) (if tail (length tail) 0)))))

(defun pretty-printer-writing-p ()
  "True when the pretty printer is the one writing to the capture (it is among the last callers)."
  (let ((package (load-time-value (find-package "SB-PRETTY"))))
    (labels ((pretty-name-p (name)
               (typecase name
                 (symbol (eq (symbol-package name) package))
                 (cons (or (pretty-name-p (car name)) (pretty-name-p (cdr name)))))))
      (loop for frame = (sb-di:top-frame) then (sb-di:frame-down frame)
            for depth below 12
            while frame
              thereis (pretty-name-p (sb-di:debug-fun-name (sb-di:frame-debug-fun frame)))))))

(defun check-capture-bound (stream source count)
  "Stops the writer of COUNT characters from SOURCE (a string, or NIL for a character) when it is
a runaway for STREAM."
  (case (capture-runaway stream)
    (:any (when (> (capture-written stream) (capture-bound stream))
            (error 'output-limit-exceeded :limit (capture-limit stream) :bound (capture-bound stream))))
    (:pretty
     (if (and source (eq source (capture-source stream)))
         (let ((before (capture-source-count stream))
               (bound (capture-bound stream)))
           (setf (capture-source-count stream) (+ before count))
           ;; The stack is looked at once per bound's worth of characters from one string.
           (when (and (> (+ before count) bound)
                      (/= (floor before bound) (floor (+ before count) bound))
                      (pretty-printer-writing-p))
             (error 'output-limit-exceeded :limit (capture-limit stream) :bound bound)))
         (when source
           (setf (capture-source stream) source
                 (capture-source-count stream) count))))))

(defun capture-overflow-write (stream string start end)
  "Writes the characters of STRING from START to END, all past KEEP, into the tail."
  (let ((tail (capture-tail stream))
        (overflow (capture-overflow stream)))
    (when tail
      ;; Only the last SIZE characters can stay in the ring.
      (let ((size (length tail)))
        (loop for i from (max start (- end size)) below end
              do (setf (schar tail (mod (+ overflow (- i start)) size)) (char string i)))))
    (incf (capture-overflow stream) (- end start))))

(defmethod sb-gray:stream-write-char ((stream capture-stream) char)
  (let ((buffer (capture-buffer stream)))
    (if (< (fill-pointer buffer) (capture-keep stream))
        (vector-push-extend char buffer)
        (let ((tail (capture-tail stream)))
          (when tail
            (setf (schar tail (mod (capture-overflow stream) (length tail))) char))
          (incf (capture-overflow stream))
          (check-capture-bound stream nil 1))))
  (setf (capture-column stream) (if (char= char #\Newline) 0 (1+ (capture-column stream))))
  char)

(defmethod sb-gray:stream-write-string ((stream capture-stream) string &optional (start 0) end)
  (let* ((end (or end (length string)))
         (buffer (capture-buffer stream))
         (room (max 0 (- (capture-keep stream) (fill-pointer buffer))))
         (kept-end (min end (+ start room)))
         (newline (position #\Newline string :start start :end end :from-end t)))
    (when (> kept-end start)
      (let ((old (fill-pointer buffer))
            (needed (+ (fill-pointer buffer) (- kept-end start))))
        (when (> needed (array-dimension buffer 0))
          (setf buffer (adjust-array buffer (max needed (* 2 (array-dimension buffer 0))))
                (slot-value stream 'buffer) buffer))
        (setf (fill-pointer buffer) needed)
        (replace buffer string :start1 old :start2 start :end2 kept-end)))
    (when (< kept-end end)
      (capture-overflow-write stream string kept-end end))
    (setf (capture-column stream)
          (if newline (- end newline 1) (+ (capture-column stream) (- end start))))
    (check-capture-bound stream string (- end start))
    string))

(defmethod sb-gray:stream-line-column ((stream capture-stream))
  (capture-column stream))

(defmethod sb-gray:stream-start-line-p ((stream capture-stream))
  (zerop (capture-column stream)))

(defun capture-kept-text (stream)
  "Everything the capture kept: the start and, for a log, the end, in order."
  (let* ((buffer (capture-buffer stream))
         (tail (capture-tail stream))
         (overflow (capture-overflow stream))
         (in-tail (if tail (min overflow (length tail)) 0))
         (text (make-string (+ (fill-pointer buffer) in-tail))))
    (replace text buffer)
    (when (plusp in-tail)
      ;; The ring's oldest character is at OVERFLOW mod its size once it has gone round.
      (let ((oldest (if (> overflow (length tail)) (mod overflow (length tail)) 0)))
        (loop for i below in-tail
              do (setf (schar text (+ (fill-pointer buffer) i))
                       (schar tail (mod (+ oldest i) (length tail)))))))
    text))

(defun capture-shown (stream)
  "The characters of the start and of the end the reply shows."
  (let ((limit (capture-limit stream)))
    (cond ((<= (capture-written stream) limit) (values (capture-written stream) 0))
          ((capture-tail stream) (values (- limit (floor limit 4)) (floor limit 4)))
          (t (values limit 0)))))

(defun capture-text (stream)
  "The start shown."
  (let ((buffer (capture-buffer stream)))
    (subseq buffer 0 (min (fill-pointer buffer) (capture-shown stream)))))

(defun capture-dropped (stream)
  "The characters written but not shown."
  (multiple-value-bind (head tail) (capture-shown stream)
    (- (capture-written stream) head tail)))

(defun capture-report (stream)
  "The text shown and how many characters were not: (text dropped more offset handle tail lost).
MORE is the handle of all the text kept (when some was cut and the call keeps handles, see
HANDLES.LISP) and OFFSET where the characters not shown begin there; HANDLE is a printed value's
own (NIL here); TAIL the end shown; LOST the characters not shown that were not kept either, at the
end of the start kept (MORE's text stops there, or goes on with the end kept)."
  (let ((dropped (capture-dropped stream)))
    (if (zerop dropped)
        (list (capture-text stream) 0)
        (multiple-value-bind (head-shown tail-shown) (capture-shown stream)
          (let* ((kept (capture-kept-text stream))
                 (lost (capture-lost stream))
                 (handle (and (> (length kept) (+ head-shown tail-shown))
                              (text-handle kept lost (fill-pointer (capture-buffer stream))))))
            (list (subseq kept 0 head-shown) dropped handle head-shown nil
                  (subseq kept (- (length kept) tail-shown)) lost))))))

;;; ------------------------------------------------------------------------------------------
;;; Running evaluations, so that a timeout or a cancellation can interrupt the right thread

(defvar *registry-lock* (sb-thread:make-mutex :name "mcp-agent-helper registry"))

(defvar *running* (make-hash-table :test 'equal)
  "Token -> the EVALUATION in progress under that token.")

(defvar *early-cancellations* (make-hash-table :test 'equal)
  "Token -> (kind . reason) for cancellations that arrived before their evaluation started: the
cancel request and the evaluation run in different worker threads, in either order.")

(defvar *recently-finished* (make-hash-table :test 'equal)
  "Token -> the internal real time its evaluation finished, for the last calls only: it tells a
call whose reply never reached the client apart from one that never started.")

(defparameter *recently-finished-limit* 256)

(defun note-finished (token)
  "Records that TOKEN's evaluation finished. Called with *REGISTRY-LOCK* held."
  (when (>= (hash-table-count *recently-finished*) *recently-finished-limit*)
    (clrhash *recently-finished*))
  (setf (gethash token *recently-finished*) (get-internal-real-time)))

(defclass evaluation ()
  ((thread :initform sb-thread:*current-thread* :reader evaluation-thread)
   ;; A fresh tag per evaluation: an interrupt queued for an earlier evaluation on a reused
   ;; thread can never throw into a later one.
   (tag :initform (list 'evaluation) :reader evaluation-tag)
   ;; :RUNNING until the result is complete. An interrupt delivered after that finds it
   ;; :DONE and does nothing, so a late cancellation cannot unwind a finished call.
   (state :initform :running :accessor evaluation-state)))

(defun abort-evaluation (evaluation report)
  (when (eq (evaluation-state evaluation) :running)
    (throw (evaluation-tag evaluation) report)))

(defun stack-guard-offset ()
  "Byte offset of this thread's control-stack-guard-page-protected flag: the first byte of the
thread's state word in SBCL's thread structure."
  (destructuring-bind (&optional slot word-bytes) (existing-symbols "SB-VM" "THREAD-STATE-WORD-SLOT" "N-WORD-BYTES")
    (and word-bytes (boundp slot) (boundp word-bytes) (* (symbol-value slot) (symbol-value word-bytes)))))

(defun current-thread-sap-function ()
  (let ((name (first (existing-symbols "SB-THREAD" "CURRENT-THREAD-SAP"))))
    (and name (fboundp name) (fdefinition name))))

(defun rearm-stack-guard ()
  "Re-protects this thread's control stack guard page if a stack exhaustion left it disabled.
SBCL re-protects it only when the stack grows back through the page next to it; an exhaustion
unwound by a THROW (as the debugger hook does) skips that, and SBCL 2.2 recycles the thread's
memory with the guard still off, so the next exhaustion in a swank worker kills the whole image
instead of signalling an error."
  ;; Runs after every call: the lookups by name are done once, when the helper loads, and the
  ;; runtime's function is looked up only in the rare case that the guard is off. Its address is
  ;; never kept, since a saved and restarted image may have the runtime elsewhere.
  (let ((offset (load-time-value (stack-guard-offset)))
        (thread-sap (load-time-value (current-thread-sap-function))))
    (when (and offset thread-sap (zerop (sb-sys:sap-ref-8 (funcall thread-sap) offset)))
      (let ((reset (sb-sys:find-foreign-symbol-address "reset_thread_control_stack_guard_page")))
        (when reset
          (sb-alien:alien-funcall
           (sb-alien:sap-alien (sb-sys:int-sap reset) (function sb-alien:void sb-alien:system-area-pointer))
           (funcall thread-sap)))))))

(defvar *evaluation* nil
  "The EVALUATION the current thread runs for a tool call, if any.")

(defvar *agent-call* nil
  "The token of the tool call running in this thread, while it runs: what the undo journal
(undo.lisp) journals is what is defined while this is bound.")

(defvar *agent-session* nil
  "The session of the agent's evaluation running in this thread (or of the agent's code running
in it: an agent thread, timer, interruption; see observe.lisp).")

(defvar *exit-allowed* nil
  "True while agent code that may end the image runs: a tool call that allows it, or what such a
call started (see REFUSE-AGENT-EXIT).")

(defvar *journal-additions* t
  "Whether the undo journal lists what an agent's call defines anew (a function, a method, a
class), besides what it replaces. Not while a system loads: its hundreds of new definitions would
push the replacements out of the bounded journal.")

(defun call-registered (token function)
  "Calls FUNCTION with a fresh EVALUATION registered under TOKEN. Returns what FUNCTION returns
or, when the evaluation is aborted, the report it was aborted with."
  (let* ((evaluation (make-instance 'evaluation))
         (*evaluation* evaluation)
         (early nil)
         (*agent-call* token))
    (reset-send-counter)
    (sb-thread:with-mutex (*registry-lock*)
      (setf early (gethash token *early-cancellations*))
      (remhash token *early-cancellations*)
      (unless early
        (setf (gethash token *running*) evaluation)))
    (unwind-protect
         (catch (evaluation-tag evaluation)
           (when early
             (throw (evaluation-tag evaluation) (interruption-report (car early) (cdr early) nil)))
           (multiple-value-prog1 (funcall function evaluation)
             (sb-sys:without-interrupts (setf (evaluation-state evaluation) :done))))
      (setf (evaluation-state evaluation) :done)
      (sb-thread:with-mutex (*registry-lock*)
        (remhash token *running*)
        (note-finished token))
      (rearm-stack-guard)
      (forget-finished-threads)
      (close-dead-connections))))

;;; ------------------------------------------------------------------------------------------
;;; The server's mailboxes of finished threads
;;;
;;; The SBCL backends of swank and slynk keep a mailbox for every thread that ever exchanged a
;;; message, in one list searched linearly on every message, and never drop one. Each tool call
;;; runs in a worker thread of its own, so an agent's calls would grow that list without bound:
;;; after 86,000 calls every request to the image (the user's own SLIME requests too) took
;;; 700 us longer and the dead threads could never be collected. A finished thread's mailbox
;;; can never be read again, so dropping it changes nothing else.

(defun server-mailbox-registry ()
  "The symbols of the server backend's mailbox list and its lock, and the readers of a mailbox's
thread and queue, or NIL when the attached server has no such list."
  (loop for package-name in '("SWANK/SBCL" "SLYNK-SBCL")
        for package = (find-package package-name)
        for names = (and package
                         (mapcar (lambda (name) (find-symbol name package))
                                 '("*MAILBOXES*" "*MAILBOX-LOCK*" "MAILBOX.THREAD" "MAILBOX.QUEUE")))
        when (and names (every #'identity names)
                  (boundp (first names)) (boundp (second names))
                  (fboundp (third names)) (fboundp (fourth names)))
          return names))

(defun forget-finished-threads ()
  "Drops the server's mailboxes of threads that have finished and have nothing queued."
  ;; Looked up once, when the helper loads: the server it is loaded through is already there.
  (destructuring-bind (&optional list-symbol lock-symbol thread-reader queue-reader)
      (load-time-value (server-mailbox-registry))
    (when (and list-symbol (typep (symbol-value lock-symbol) 'sb-thread:mutex))
      (flet ((finished-p (mailbox)
               (let ((thread (ignore-errors (funcall thread-reader mailbox))))
                 (and (typep thread 'sb-thread:thread)
                      (not (sb-thread:thread-alive-p thread))
                      (null (ignore-errors (funcall queue-reader mailbox)))))))
        (sb-thread:with-mutex ((symbol-value lock-symbol))
          (let ((mailboxes (symbol-value list-symbol)))
            (when (some #'finished-p mailboxes)
              (setf (symbol-value list-symbol) (remove-if #'finished-p mailboxes)))))))))

(defun cancel (token kind reason)
  "Interrupts the evaluation running under TOKEN. KIND is :TIMEOUT or :CANCELLED and REASON
the text to report. Returns T when an evaluation was interrupted, NIL when it had not started
yet (it will abort as soon as it does)."
  (let ((evaluation (sb-thread:with-mutex (*registry-lock*)
                      (or (gethash token *running*)
                          ;; An evaluation that already finished needs no cancelling later.
                          (progn (unless (gethash token *recently-finished*)
                                   (setf (gethash token *early-cancellations*) (cons kind reason)))
                                 nil)))))
    ;; Interrupted outside the lock: every call takes it to register, so a target thread slow to
    ;; take the interruption must never hold up the rest of the image.
    (when evaluation
      (interrupt-evaluation evaluation kind reason)
      t)))

(defun interrupt-evaluation (evaluation kind reason)
  "Makes EVALUATION's thread unwind it with a report of KIND and REASON, unless it is done."
  (sb-thread:interrupt-thread
   (evaluation-thread evaluation)
   (lambda ()
     (when (eq (evaluation-state evaluation) :running)
       (abort-evaluation evaluation (interruption-report kind reason (backtrace-lines nil :interrupted t)))))))

(defun thread-text (thread)
  (format nil "~S" (sb-thread:thread-name thread)))

(defun waiting-text (thread)
  "What THREAD waits for, when it waits for a lock or a condition, or NIL."
  (let ((waiting-for (ignore-errors (internal-call "SB-THREAD" "THREAD-WAITING-FOR" thread))))
    (typecase waiting-for
      (null nil)
      (sb-thread:mutex
       (let ((owner (sb-thread:mutex-owner waiting-for)))
         (format nil "waits for the lock ~S~:[~;, held by thread ~:*~A~]"
                 (sb-thread:mutex-name waiting-for) (and owner (thread-text owner)))))
      (t (format nil "waits on ~A" (ignore-errors (princ-to-string waiting-for)))))))

(defun stuck-report (token)
  "Why the evaluation under TOKEN has not unwound after an interruption, for the error the
client shows: lines saying where it is and which threads of the image wait for a lock, and who
holds it. Takes no lock it could wait on for long, since the image may be deadlocked."
  (let ((lines '()))
    (flet ((note (control &rest arguments)
             (push (apply #'format nil control arguments) lines)))
      (if (sb-thread:grab-mutex *registry-lock* :timeout 0.5)
          (multiple-value-bind (evaluation finished)
              (unwind-protect (values (gethash token *running*) (gethash token *recently-finished*))
                (sb-thread:release-mutex *registry-lock*))
            (cond (evaluation
                   (let ((thread (evaluation-thread evaluation)))
                     (note "The evaluation runs in thread ~A~:[, which is not waiting for a lock~;, which ~:*~A~]."
                           (thread-text thread) (waiting-text thread))))
                  (finished
                   (note "The evaluation finished ~,1F s ago, but its reply did not reach swank-mcp."
                         (/ (- (get-internal-real-time) finished) internal-time-units-per-second)))
                  (t
                   (note "The evaluation has not started: its request waits in the image."))))
          (let ((owner (sb-thread:mutex-owner *registry-lock*)))
            (note "The helper's registry lock is held~@[ by thread ~A~]." (and owner (thread-text owner)))))
      (dolist (thread (sb-thread:list-all-threads))
        (let ((waiting (waiting-text thread)))
          (when waiting
            (note "Thread ~A ~A." (thread-text thread) waiting)))))
    (format nil "~{~A~^~%~}" (reverse lines))))

(defun interruption-report (kind reason backtrace)
  (list :kind kind
        :type (ecase kind
                (:timeout "EVALUATION-TIMEOUT")
                (:cancelled "EVALUATION-CANCELLED")
                (:aborted "EVALUATION-ABORTED"))
        :class nil
        :message reason
        :backtrace backtrace
        :restarts nil))

;;; ------------------------------------------------------------------------------------------
;;; Backtraces

(defparameter *max-frames* 20)
(defparameter *max-frame-length* 400)

(defparameter *evaluator-functions*
  (append '(eval)
          (existing-symbols "SB-INT" "SIMPLE-EVAL-IN-LEXENV")
          (existing-symbols "SB-IMPL" "SIMPLE-EVAL-PROGN-BODY" "%SIMPLE-EVAL" "EVAL-IN-LEXENV" "EVAL-PROGN-BODY"))
  "Frames of the evaluator itself: they sit between the helper and the user's code and say
nothing the user wrote.")

(defparameter *interruption-functions*
  (append (existing-symbols "SB-THREAD" "RUN-INTERRUPTION" "%INTERRUPT-THREAD")
          (existing-symbols "SB-SYS" "INVOKE-INTERRUPTION")
          (existing-symbols "SB-UNIX" "SIGURG-HANDLER"))
  "Frames of the interruption machinery, above the code a timeout or cancellation interrupted.")

(defun frame-function-symbol (name)
  "The symbol a frame's function name is about: the name itself, the function of (SETF F), or the
enclosing function of a local function such as (FLET F :IN PARENT) or (LAMBDA () :IN PARENT)."
  (cond ((symbolp name) name)
        ((and (consp name) (eq (first name) 'setf)) (second name))
        ((consp name)
         (let ((in (member :in name)))
           (cond ((and in (symbolp (second in))) (second in))
                 ((symbolp (second name)) (second name)))))))

(defun evaluator-frame-p (name)
  "True for a frame, named NAME, of the evaluator under the user's code (see *EVALUATOR-FUNCTIONS*)."
  (member (frame-function-symbol name) *evaluator-functions*))

(defun server-package-p (package)
  (let ((name (package-name package)))
    (or (eql 0 (search "SWANK" name)) (eql 0 (search "SLYNK" name)))))

(defun own-frame-p (name)
  "Frames of this helper (its capture streams' methods included) or of the swank/slynk server:
never the user's business."
  (let* ((symbol (frame-function-symbol name))
         (package (and symbol (symbol-package symbol))))
    (or (and (consp name) (eq (first name) :method) (member 'capture-stream (car (last name))))
        (and package
             (or (eq package (load-time-value (find-package '#:mcp-agent-helper)))
                 (server-package-p package))))))

(defparameter *implementation-packages*
  '("SB-INT" "SB-KERNEL" "SB-IMPL" "SB-C" "SB-PCL" "SB-VM" "SB-DI" "SB-FASL" "SB-FORMAT"
    "SB-PRETTY" "SB-LOOP" "SB-BIGNUM" "SB-REGALLOC")
  "SBCL's implementation packages: their exports are for SBCL itself, not for users.")

(defun implementation-internal-p (name)
  "True for frames of SBCL's own machinery under a failing call, such as
SB-KERNEL::INTEGER-/-INTEGER under (/ 1 0): functions of an implementation package, or internal
symbols of any other SB- package, and the runtime's own frames (named by strings)."
  (let* ((symbol (frame-function-symbol name))
         (package (and symbol (symbol-package symbol))))
    (or (stringp name)
        (and package
             (eql 0 (search "SB-" (package-name package)))
             (or (member (package-name package) *implementation-packages* :test #'string=)
                 (not (eq :external (nth-value 1 (find-symbol (symbol-name symbol) package)))))))))

(defun standard-function-name-p (name)
  (let ((symbol (frame-function-symbol name)))
    (and symbol (eq (symbol-package symbol) (load-time-value (find-package '#:common-lisp))))))

(defun frame-name-and-args (frame)
  (handler-case (internal-call "SB-DEBUG" "FRAME-CALL" frame :replace-dynamic-extent-objects t)
    (error () (internal-call "SB-DEBUG" "FRAME-CALL" frame))))

(defun frame-call-of (frame condition)
  "The name and arguments of FRAME's call. SBCL shows a call to an undefined function as
(\"undefined function\" ARGS...); the name the user called is in the condition."
  (multiple-value-bind (name args) (frame-name-and-args frame)
    (if (and (equal name "undefined function") (typep condition 'undefined-function))
        (values (cell-error-name condition) args)
        (values name args))))

(defun print-frame (name args)
  (let ((*print-length* 10)
        (*print-level* 4)
        (*print-circle* t)
        (*print-pretty* nil)
        (*print-readably* nil))
    (let ((text (handler-case (prin1-to-string (if (listp args) (cons name args) (list name args)))
                  (error () (format nil "(~A ...)" (ignore-errors (prin1-to-string name)))))))
      (if (> (length text) *max-frame-length*)
          (concatenate 'string (subseq text 0 *max-frame-length*) " ...")
          text))))

(defun backtrace-lines (condition &key interrupted)
  "The user's part of the current stack, innermost first, as printed calls. Called from the
debugger hook or from an interruption, while the stack is still there. Stops at the helper's
own frames; drops the signalling machinery above the user's code and the evaluator below it."
  (handler-case
      (let ((frames '())
            (top (if interrupted
                     (internal-call "SB-DI" "TOP-FRAME")
                     (let ((hint (sbcl-internal "SB-DEBUG" "*STACK-TOP-HINT*")))
                       (progv (list hint) (list (symbol-value hint))
                         (or (internal-call "SB-DEBUG" "RESOLVE-STACK-TOP-HINT")
                             (internal-call "SB-DI" "TOP-FRAME"))))))
            (seen-user-frame nil)
            (reached-helper nil)
            ;; The implementation's frame nearest the user's code: the one that signalled, such
            ;; as SB-KERNEL::INTEGER-/-INTEGER under (/ 10 X), which a tail call may have left as
            ;; the only trace of the user's function that called it.
            (signalling nil))
        ;; Bounded walk: a control-stack-exhausted error has thousands of frames below, and
        ;; the hook runs on what is left of the stack.
        (loop for frame = top then (internal-call "SB-DI" "FRAME-DOWN" frame)
              for walked from 0 below (+ *max-frames* 200)
              while (and frame (< (length frames) (+ *max-frames* 10)))
              do (multiple-value-bind (name args) (frame-call-of frame condition)
                   (cond ((own-frame-p name)
                          (when seen-user-frame
                            (setf reached-helper t)
                            (loop-finish)))
                         ((and interrupted (not seen-user-frame)
                               (member (frame-function-symbol name) *interruption-functions*))
                          ;; Everything above the interruption belongs to it: start afresh.
                          (setf frames '()))
                         ((and (not seen-user-frame) (implementation-internal-p name))
                          (setf signalling (cons name args)))
                         (t
                          ;; Below a standard function's own frame, (/ 1 0) say, the
                          ;; implementation's frame adds nothing.
                          (unless (or seen-user-frame (null signalling) (standard-function-name-p name))
                            (push signalling frames))
                          (setf seen-user-frame t)
                          (push (cons name args) frames)))))
        (when reached-helper
          (loop while (and frames (evaluator-frame-p (car (first frames))))
                do (pop frames)))
        (let ((calls (nreverse frames)))
          (loop for (name . args) in calls
                for i below *max-frames*
                collect (print-frame name args))))
    (error (e)
      (list (format nil "(backtrace unavailable: ~A)" (safe-princ e))))))

;;; ------------------------------------------------------------------------------------------
;;; Conditions as text

(defun safe-princ (object)
  (handler-case (let ((*print-pretty* nil) (*print-readably* nil)) (princ-to-string object))
    (error () (format nil "#<~A (unprintable)>" (ignore-errors (type-of object))))))

(defun condition-message (condition)
  "The condition's report on one logical line (SBCL's reports use pretty-printer directives
that would otherwise break a short message over several lines), cut to *MAX-OUTPUT*."
  (let ((stream (make-capture *max-output* :runaway :any :tail nil))
        (endless nil))
    (handler-case (let ((*print-pretty* nil) (*print-readably* nil)
                        (*print-length* 50) (*print-level* 5))
                    (princ condition stream))
      (output-limit-exceeded () (setf endless t))
      (error (e) (return-from condition-message
                   (format nil "(the condition's report itself failed: ~A)" (safe-princ e)))))
    (destructuring-bind (text dropped &optional more offset handle tail (lost 0)) (capture-report stream)
      (declare (ignore handle tail))
      (if (zerop dropped)
          text
          (format nil "~A~%[... ~:[~;more than ~]~:D more characters of this message not shown: the limit ~
                       is ~:D (--max-output)~:[~*~*~*~*~;; inspect ~A with offset ~D for ~
                       ~:[the rest~*~;the next ~:D~]~]~:[~;, where the report was stopped: it went on without ~
                       end~]~:[~;. The last ~:D were not kept~]]"
                  text endless dropped (capture-limit stream)
                  more more offset (or endless (plusp lost)) (- dropped lost)
                  endless (plusp lost) lost)))))

(defun implementation-class-p (class)
  "Classes that are SBCL implementation details (SB-INT:SIMPLE-STYLE-WARNING,
SB-KERNEL::CONTROL-STACK-EXHAUSTED, ...), as opposed to standard and user classes and SBCL's
documented extensions in SB-EXT."
  (let* ((name (class-name class))
         (package (and (symbolp name) (symbol-package name))))
    (or (null package)
        (and (eql 0 (search "SB-" (package-name package)))
             (string/= (package-name package) "SB-EXT")))))

(defun standard-condition-name (condition)
  "The name to show for CONDITION's type: its own class name unless that is an implementation
detail, in which case the nearest superclass a Lisp programmer knows (usually from COMMON-LISP).
EXACT-CONDITION-NAME keeps the precise one for the structured result."
  (let* ((class (class-of condition))
         (precedence (or (ignore-errors (sb-mop:class-precedence-list class)) (list class)))
         ;; SIMPLE-CONDITION is the mixin that carries a format control; SB-INT:SIMPLE-STYLE-WARNING
         ;; is a STYLE-WARNING to the reader, not a SIMPLE-CONDITION.
         (shown (or (find-if (lambda (c)
                               (and (not (implementation-class-p c))
                                    (or (eq c class) (not (eq (class-name c) 'simple-condition)))))
                             precedence)
                    class))
         (*package* (find-package '#:common-lisp-user)))
    (prin1-to-string (class-name shown))))

(defun warning-category (warning)
  "Warnings are shown by category, as the compiler reports them: WARNING rather than the
SIMPLE-WARNING class that merely carries a format string."
  (let ((name (standard-condition-name warning)))
    (if (string= name "SIMPLE-WARNING") "WARNING" name)))

(defun exact-condition-name (condition)
  (let ((*package* (find-package '#:keyword)))
    (prin1-to-string (type-of condition))))

(defvar *tool-input* nil
  "The empty input stream a tool call reads from, to recognise its end of file in reports.")

(defun condition-report (kind condition backtrace &optional restarts)
  "The report of CONDITION: its type and message, BACKTRACE (printed frames) and RESTARTS (the
restart objects it offered, innermost first)."
  (let ((message (condition-message condition)))
    (when (and (typep condition 'end-of-file) *tool-input*
               (let ((stream (stream-error-stream condition)))
                 (or (eq stream *tool-input*)
                     (and (typep stream 'two-way-stream)
                          (eq (two-way-stream-input-stream stream) *tool-input*)))))
      (setf message (format nil "~A~%Interactive input is not available through MCP: *STANDARD-INPUT*, ~
                                 *QUERY-IO* and *DEBUG-IO* are at end of file. Pass data in the code instead."
                            message)))
    (list :kind kind
          :type (standard-condition-name condition)
          :class (exact-condition-name condition)
          :message (concatenate 'string message (unknown-name-hint condition))
          :backtrace backtrace
          :restarts (restart-reports restarts))))

(defvar *outer-restarts* '()
  "The restarts in force where the current evaluation began: the server's, not the code's.")

(defun evaluation-restarts (condition)
  "The restarts that the evaluated code, or SBCL on its behalf, offers for CONDITION, innermost
first: those a programmer chooses from in the debugger. The server's own (back to its top level)
are left out: the debugger tool's abort is the way out."
  (remove-if (lambda (restart) (member restart *outer-restarts*)) (compute-restarts condition)))

(defun restart-reports (restarts)
  "Each restart as (NAME REPORT), as SLDB lists them; NAME is \"\" for an anonymous restart."
  (loop for restart in restarts
        collect (list (let ((name (restart-name restart))) (if name (symbol-name name) ""))
                      (handler-case (let ((*print-pretty* nil) (*print-readably* nil)) (princ-to-string restart))
                        (error () "(its report failed)")))))

;;; ------------------------------------------------------------------------------------------
;;; Sessions: the REPL state of one client, kept apart from the user's own REPL

(defvar *sessions* (make-hash-table :test 'equal :synchronized t))

(defparameter *history-variables* '(* ** *** + ++ +++ / // /// -)
  "The REPL variables a session keeps for itself, so that the agent's * is not the user's *.")

(defclass session ()
  ((package-name :initform "COMMON-LISP-USER" :accessor session-package-name)
   ;; Concurrent calls of one session each work on their own bindings; the last to finish
   ;; writes its history back, as two REPL listeners sharing globals would.
   (history :initform (mapcar (constantly nil) *history-variables*) :accessor session-history)))

(defun find-session (id)
  (or (gethash id *sessions*)
      (setf (gethash id *sessions*) (new 'session))))

(defun find-package-loosely (name)
  "The package NAME names, written as the user likes: INVENTORY, inventory, :inventory, #:inventory
or \"inventory\" (package names are usually upper case; the prefixes and quotes are how Lisp
code writes a package designator)."
  (let* ((trimmed (string-trim '(#\Space #\Tab #\Newline #\Return) name))
         (bare (cond ((and (> (length trimmed) 2) (string= "#:" trimmed :end2 2)) (subseq trimmed 2))
                     ((and (> (length trimmed) 1) (char= #\: (char trimmed 0))) (subseq trimmed 1))
                     ((and (> (length trimmed) 2) (char= #\" (char trimmed 0))
                           (char= #\" (char trimmed (1- (length trimmed)))))
                      (subseq trimmed 1 (1- (length trimmed))))
                     (t trimmed))))
    (or (find-package name) (find-package bare) (find-package (string-upcase bare)))))

(defun record-history (form values)
  "Updates the REPL variables as the standard REPL does after evaluating FORM."
  (setf +++ ++ ++ + + form
        /// // // / / values
        *** ** ** * * (first values)))

;;; ------------------------------------------------------------------------------------------
;;; Reading user code and running a tool in a call

(define-condition unreadable-code (error)
  ((cause :initarg :cause :reader unreadable-code-cause)
   (code :initarg :code :reader unreadable-code-code)
   (position :initarg :position :reader unreadable-code-position)
   (forms-done :initarg :forms-done :reader unreadable-code-forms-done))
  (:report (lambda (condition stream)
             (princ (getf (unreadable-code-report condition) :message) stream))))

(defun line-and-column (code position)
  "1-based line and column of POSITION in CODE."
  (let ((line-start (let ((newline (position #\Newline code :end position :from-end t)))
                      (if newline (1+ newline) 0))))
    (values (1+ (count #\Newline code :end position))
            (1+ (- position line-start)))))

(defun reader-error-text (condition)
  "The reader's complaint without SBCL's \"Stream: #<...>\" suffix, which names a stream the
user never saw; the position is given in the user's terms instead."
  (if (typep condition 'simple-condition)
      (handler-case (let ((*print-pretty* nil))
                      (apply #'format nil (simple-condition-format-control condition)
                             (simple-condition-format-arguments condition)))
        (error () (condition-message condition)))
      (condition-message condition)))

(defun unreadable-code-report (condition)
  "The code itself could not be read: say where, in the user's terms, without the reader's
internal frames."
  (let ((cause (unreadable-code-cause condition))
        (done (unreadable-code-forms-done condition)))
    (multiple-value-bind (line column)
        (line-and-column (unreadable-code-code condition) (unreadable-code-position condition))
      (list :kind :read
            :type (standard-condition-name cause)
            :class (exact-condition-name cause)
            :message (format nil "~A~@[~%~A~]"
                             (if (typep cause 'end-of-file)
                                 (format nil "The code ends inside a form: the form at line ~D, column ~D is not closed."
                                         line column)
                                 (format nil "~A~A (reading the form at line ~D, column ~D)"
                                         (reader-error-text cause) (unknown-name-hint cause) line column))
                             (case done
                               (0 nil)
                               (1 "The form before it was evaluated.")
                               (t (format nil "The ~D forms before it were evaluated." done))))
            :backtrace nil
            :restarts nil))))

(defun resolve-package (requested session)
  "The package to evaluate in: REQUESTED if given, else the session's. Returns the package (or
NIL when REQUESTED does not exist) and a note for the user, if any."
  (cond (requested (values (find-package-loosely requested) nil))
        ((find-package-loosely (session-package-name session)))
        (t (values (find-package '#:common-lisp-user)
                   (format nil "The session package ~A no longer exists; evaluating in COMMON-LISP-USER."
                           (session-package-name session))))))

(defvar *tool-output* nil
  "The current tool call's output captures, (stdout . stderr).")

(defmacro with-tool-streams ((stdout stderr) &body body)
  "Binds the standard streams for a tool call: output into the captures, and every input stream
at end of file, so that READ-LINE, Y-OR-N-P or a debugger prompt fail at once instead of waiting
for a user who cannot answer (or, in an Emacs-hosted image, stealing the user's REPL)."
  (let ((input (gensym "INPUT")) (null-output (gensym "NULL-OUTPUT")))
    `(let* ((,input (make-string-input-stream ""))
            (,null-output (make-broadcast-stream))
            (*tool-input* ,input)
            (*tool-output* (cons ,stdout ,stderr))
            (*standard-output* ,stdout)
            (*error-output* ,stderr)
            (*trace-output* ,stderr)
            (*standard-input* ,input)
            (*terminal-io* (make-two-way-stream ,input ,stdout))
            (*query-io* (make-two-way-stream ,input ,null-output))
            (*debug-io* (make-two-way-stream ,input ,null-output)))
       ,@body)))

(defvar *parked* nil
  "While an evaluation waits in the server's debugger for the agent: the PARKED it waits with.")

(defclass parked ()
  ((condition :initarg :condition :reader parked-condition)
   (restarts :initarg :restarts :reader parked-restarts)
   (package :initarg :package :reader parked-package)
   (stdout :initarg :stdout :reader parked-stdout)
   (stderr :initarg :stderr :reader parked-stderr)))

(defparameter *debug-timeout* 600
  "Seconds a parked evaluation waits for the agent before it is aborted.")

(defun park (condition server-hook)
  "Enters the server's debugger (SLDB's protocol) with CONDITION, as an unhandled error in
SLIME's REPL does: the thread waits there for the debugger tool's requests, which run in this
dynamic extent and find the evaluation in *PARKED*. Returns only if the server's debugger does."
  (let* ((evaluation *evaluation*)
         (*parked* (make-instance 'parked :condition condition
                                          :restarts (evaluation-restarts condition)
                                          :package *package*
                                          :stdout (car *tool-output*)
                                          :stderr (cdr *tool-output*)))
         ;; Aborted from the image's side too, so that a server that dies (or a client that never
         ;; comes back) cannot leave the thread waiting forever. The timer is the helper's, not
         ;; the agent's code (see MAKE-AGENT-TIMER).
         (timer (and evaluation
                     (let ((*agent-session* nil))
                       (sb-ext:make-timer
                        (lambda ()
                          (interrupt-evaluation
                           evaluation :timeout
                           (format nil "The evaluation waited in the debugger for ~:D seconds without an action and ~
                                        was aborted (--debug-timeout)." *debug-timeout*)))
                        :thread t :name "swank-mcp debugger timeout")))))
    (when timer
      (sb-ext:schedule-timer timer *debug-timeout*))
    (unwind-protect (funcall server-hook condition server-hook)
      (when timer
        (sb-ext:unschedule-timer timer)))))

(defun call-trapping-debugger (function &key debug)
  "Calls FUNCTION. Anything that would enter the debugger (an unhandled error, BREAK,
INVOKE-DEBUGGER) is turned into a report, taken while the failing frames are still on the stack,
and unwound, so that no thread is left in a debugger nobody drives. With DEBUG, it enters the
server's debugger instead (see PARK), and is unwound only when that returns. Returns (:OK .
values) or the report, and as a second value the condition that failed."
  (let ((tag (list 'debugger))
        (server-hook (and debug (or *debugger-hook* sb-ext:*invoke-debugger-hook*)))
        (*outer-restarts* (compute-restarts)))
    (multiple-value-bind (outcome failed-condition)
           (catch tag
             (let* ((hook (lambda (condition hook)
                     (declare (ignore hook))
                     (cond
                       ((typep condition 'unreadable-code)
                        (throw tag (values (unreadable-code-report condition) condition)))
                       ((typep condition 'storage-condition)
                         ;; The stack (or heap) is nearly gone: SBCL leaves only a small margin
                         ;; below the guard page, and overrunning it kills the whole image.
                         ;; Only the frames' names are taken here (a walk that conses a little and
                         ;; uses no stack); they are printed once the stack has been unwound.
                         (throw tag (values condition (ignore-errors (stack-function-names)))))
                       (t
                        (when server-hook
                          (park condition server-hook))
                        (throw tag (values (condition-report (if (typep condition 'error) :error :debugger)
                                                             condition
                                                             (backtrace-lines condition)
                                                             (evaluation-restarts condition))
                                           condition))))))
                    (sb-ext:*invoke-debugger-hook* hook)
                    (*debugger-hook* hook))
               (cons :ok (multiple-value-list (funcall function)))))
      (if (typep outcome 'condition)
          (values (condition-report :error outcome (folded-backtrace failed-condition)) outcome)
          (values outcome failed-condition)))))

(defparameter *max-stack-walk* 200000
  "Frames walked after a stack exhaustion: more than a default control stack holds.")

(defun stack-function-names ()
  "The names of the functions of the current stack's frames, innermost first."
  (loop for frame = (internal-call "SB-DI" "TOP-FRAME") then (internal-call "SB-DI" "FRAME-DOWN" frame)
        repeat *max-stack-walk*
        while frame
        collect (internal-call "SB-DI" "DEBUG-FUN-NAME" (internal-call "SB-DI" "FRAME-DEBUG-FUN" frame))))

(defun folded-backtrace (names)
  "NAMES (innermost first, from STACK-FUNCTION-NAMES) as backtrace lines, the user's part only, each
run of one function folded into one line: FACT x 9,870."
  (let* ((trampoline (position-if #'stringp names :end (min 20 (length names)) :from-end t))
         ;; Above the runtime's signal trampoline is the error's own machinery.
         (below-signal (if trampoline (nthcdr (1+ trampoline) names) names))
         (user (member-if (lambda (name) (not (or (own-frame-p name) (implementation-internal-p name))))
                          below-signal))
         (user (subseq user 0 (position-if #'own-frame-p user)))
         (user (reverse (member-if-not #'evaluator-frame-p (reverse user))))
         (runs '()))
    (dolist (name user)
      (if (and runs (equal (car (first runs)) name))
          (incf (cdr (first runs)))
          (push (cons name 1) runs)))
    (loop for (name . count) in (nreverse runs)
          for i below *max-frames*
          collect (let ((text (handler-case (let ((*print-pretty* nil)) (prin1-to-string name))
                                (error () "(unprintable)"))))
                    (if (> count 1) (format nil "~A x ~:D" text count) text)))))

(defun muffled-by-sbcl-p (condition)
  "True for a warning SBCL itself never prints (SB-EXT:*MUFFLED-WARNINGS*), such as the
redefinition of a file's macros and functions by loading the fasl just compiled from it: its own
handler muffles them only after every handler of ours has seen them."
  (typep condition sb-ext:*muffled-warnings*))

(defun char-at (text i)
  "The character at I of TEXT, a string or a vector of UTF-8 octets (the scanner only looks at
ASCII), or NIL past the end."
  (when (< i (length text))
    (let ((element (aref text i)))
      (if (characterp element) element (code-char element)))))

(defun layout-char-p (c)
  (member c '(#\Space #\Tab #\Newline #\Return #\Page)))

(defun skip-block-comment (text i)
  "I is just after #|. Returns the position after the matching |#."
  (let ((depth 1) (end (length text)))
    (loop while (and (< i end) (plusp depth))
          do (let ((c (char-at text i)) (next (char-at text (1+ i))))
               (cond ((and (eql c #\|) (eql next #\#)) (decf depth) (incf i 2))
                     ((and (eql c #\#) (eql next #\|)) (incf depth) (incf i 2))
                     (t (incf i)))))
    (min i end)))

(defun skip-layout (text i)
  "The position of the next form in TEXT (a string or octets) from I, past whitespace and
comments."
  (let ((end (length text)))
    (loop
      (let ((c (char-at text i)))
        (cond ((null c) (return end))
              ((layout-char-p c) (incf i))
              ((eql c #\;)
               (loop do (incf i) until (member (char-at text i) '(nil #\Newline))))
              ((and (eql c #\#) (eql (char-at text (1+ i)) #\|))
               (setf i (skip-block-comment text (+ i 2))))
              (t (return i)))))))

;;; ------------------------------------------------------------------------------------------
;;; Running a tool

(define-condition tool-failure (error)
  ((message :initarg :message :reader tool-failure-message))
  (:report (lambda (condition stream) (princ (tool-failure-message condition) stream)))
  (:documentation "A failure the user can act on (no such package, no such class): reported as
its message alone, without a condition type or backtrace."))

(defun fail (control &rest arguments)
  (error 'tool-failure :message (apply #'format nil control arguments)))

(defun run-tool (token function &key (stdout (make-broadcast-stream)) (stderr (make-broadcast-stream)))
  "Calls FUNCTION, which returns the tool's plist, registered under TOKEN (so that a timeout or a
cancellation interrupts it) with the tool streams bound to STDOUT and STDERR (by default output
goes nowhere: nothing a tool does prints in the user's image). Returns the plist, or
(:FAILURE message) for a TOOL-FAILURE, or (:ERROR report) for anything else that went wrong."
  (let* ((hooks (hook-lists))
         (outcome (call-registered
                   token
                   (lambda (evaluation)
                     (declare (ignore evaluation))
                     (with-tool-streams (stdout stderr)
                       (handler-case (call-trapping-debugger function)
                         (tool-failure (failure)
                           (list :failure (tool-failure-message failure)))))))))
    ;; The tools that run the agent's code (load-file and the like) bind its session: hooks that
    ;; code added run as the agent's (see ADOPT-HOOKS).
    (when *agent-session*
      (adopt-hooks hooks *agent-session* *exit-allowed*))
    (case (first outcome)
      (:ok (second outcome))
      (:failure outcome)
      ;; A condition report, or the report of a timeout or cancellation.
      (t (list :error outcome)))))

(defun tool-package (requested session)
  "The package a tool works in: REQUESTED when given, else the session's current package."
  (or (resolve-package requested (find-session session))
      (fail-missing-package requested)))

(defun package-display-name (package)
  "The shortest of PACKAGE's names (CL-USER rather than COMMON-LISP-USER), for messages."
  (reduce (lambda (a b) (if (< (length b) (length a)) b a))
          (package-nicknames package)
          :initial-value (package-name package)))

;;; ------------------------------------------------------------------------------------------
;;; Symbol names as the user types them

(defun parse-symbol-designator (text)
  "Splits TEXT, a symbol as one types it (foo, pkg:foo, pkg::foo, :foo, |Mixed Case|, 'foo), into
its package name (NIL when unqualified) and its symbol name, converting case as the current
readtable would (:INVERT is taken as :UPCASE). Reads nothing and interns nothing. Returns NIL
when TEXT is not a symbol name."
  (let* ((text (string-trim '(#\Space #\Tab #\Newline #\Return) text))
         (text (cond ((and (> (length text) 2) (string= "#'" text :end2 2)) (subseq text 2))
                     ((and (> (length text) 1) (char= (char text 0) #\')) (subseq text 1))
                     (t text)))
         (convert (ecase (readtable-case *readtable*)
                    ((:upcase :invert) #'char-upcase)
                    (:downcase #'char-downcase)
                    (:preserve #'identity)))
         (part (make-string-output-stream))
         (package nil)
         (after-colons nil)
         (in-bars nil)
         (i 0)
         (end (length text)))
    (loop while (< i end)
          do (let ((c (char text i)))
               (cond (in-bars
                      (cond ((char= c #\|) (setf in-bars nil))
                            ((and (char= c #\\) (< (1+ i) end)) (incf i) (write-char (char text i) part))
                            (t (write-char c part))))
                     ((char= c #\|) (setf in-bars t))
                     ((char= c #\\)
                      (when (= (1+ i) end) (return-from parse-symbol-designator nil))
                      (incf i)
                      (write-char (char text i) part))
                     ((char= c #\:)
                      (when after-colons (return-from parse-symbol-designator nil))
                      (let ((prefix (get-output-stream-string part)))
                        (setf package (if (and (zerop i) (string= prefix "")) "KEYWORD" prefix)
                              after-colons t)
                        (when (and (< (1+ i) end) (char= (char text (1+ i)) #\:))
                          (incf i))))
                     ((or (member c '(#\Space #\Tab #\Newline #\Return #\( #\) #\" #\; #\` #\,))
                          (and (char= c #\#) (zerop i)))
                      (return-from parse-symbol-designator nil))
                     (t (write-char (funcall convert c) part))))
             (incf i))
    (let ((name (get-output-stream-string part)))
      (unless (or in-bars (string= name ""))
        (values package name)))))

(defun find-named-symbol (text package)
  "The symbol TEXT names, looked up from PACKAGE (or in the package TEXT names). Returns the
symbol, whether it exists, its name as parsed, and the package it was looked up in. Fails when
TEXT is not a symbol name or names a package that does not exist."
  (multiple-value-bind (package-name name) (parse-symbol-designator text)
    (unless name
      (fail "~S is not a symbol name." text))
    (let ((home (if package-name
                    (or (find-package package-name)
                        (fail-missing-package package-name))
                    package)))
      (multiple-value-bind (symbol status) (find-symbol name home)
        (values symbol (and status t) name home)))))

(defun find-existing-symbol (text package)
  "Like FIND-NAMED-SYMBOL, but fails when there is no such symbol, offering the near names that
name something."
  (multiple-value-bind (symbol found name home) (find-named-symbol text package)
    (unless found
      (fail "Symbol ~A not found in package ~A.~A" name (package-display-name home)
            (missing-symbol-hint name home)))
    symbol))

;;; ------------------------------------------------------------------------------------------
;;; Printing for the user

(defparameter *printer-state-variables*
  (existing-symbols "SB-IMPL" "*CIRCULARITY-HASH-TABLE*" "*CIRCULARITY-COUNTER*")
  "SBCL's state of the *PRINT-CIRCLE* print under way. A print started while another is under way
(a traced function that a PRINT-OBJECT method calls, reported while the value is printed) would
share it: each would mark the other's objects as seen twice, printing #1= and #1# for them.")

(defun print-briefly (object &key (package *package*) (length 10) (level 4) (limit 300))
  "OBJECT printed readably where possible, on one line, cut to LIMIT characters: a print of its
own, whatever print is under way (see *PRINTER-STATE-VARIABLES*)."
  (let ((text (handler-case
                  (progv *printer-state-variables* (make-list (length *printer-state-variables*))
                    (let ((*package* package)
                          (*print-pretty* nil) (*print-readably* nil) (*print-circle* t)
                          (*print-length* length) (*print-level* level))
                      (prin1-to-string object)))
                (error () (format nil "#<unprintable ~A>" (safe-princ (type-of object)))))))
    (if (> (length text) limit)
        (concatenate 'string (subseq text 0 limit) " ...")
        text)))

(defun print-form-briefly (form)
  "FORM on one line, abbreviated, as the compiler and macroexpander reports show it. Printed
pretty (so that (DEFUN F () ...) keeps its ()), with the line breaks SBCL forces after LET and
the like folded into spaces."
  (let* ((text (handler-case (let ((*print-pretty* t) (*print-right-margin* 100000)
                                   (*print-length* 12) (*print-level* 4) (*print-circle* t)
                                   (*print-readably* nil) (*print-lines* nil))
                               (prin1-to-string form))
                 (error () "#<unprintable form>")))
         (folded (with-output-to-string (out)
                   (loop with i = 0
                         while (< i (length text))
                         do (let ((c (char text i)))
                              (if (char= c #\Newline)
                                  (progn (write-char #\Space out)
                                         (setf i (or (position #\Space text :start (1+ i) :test-not #'char=)
                                                     (length text))))
                                  (progn (write-char c out) (incf i))))))))
    (if (> (length folded) 200) (concatenate 'string (subseq folded 0 200) " ...") folded)))

(defun name-text (name package)
  "A symbol or function name as the user would type it from PACKAGE."
  (print-briefly name :package package :length nil :level nil :limit 1000))

(defun qualified-name (symbol)
  "SYMBOL with its package prefix whatever the current package: ALEXANDRIA:FLATTEN."
  (name-text symbol (load-time-value (find-package '#:keyword))))

(defun documentation-text (symbol kind)
  "The documentation, trimmed, or NIL when there is none or it is blank."
  (let* ((text (ignore-errors (documentation symbol kind)))
         (trimmed (and (stringp text) (string-trim '(#\Space #\Newline #\Tab) text))))
    (and trimmed (plusp (length trimmed)) trimmed)))

(defun lambda-list-text (name lambda-list package)
  "(NAME . LAMBDA-LIST) as text, with the lambda list's variables shown by name only: their
package (SB-C::TEST in the lambda list of IF) says nothing to a caller."
  (labels ((text (x)
             (cond ((and (symbolp x) x (not (keywordp x))) (symbol-name x))
                   ((consp x)
                    (format nil "(~{~A~^ ~}~@[ . ~A~])"
                            (loop for tail = x then (cdr tail)
                                  while (consp tail) collect (text (car tail)))
                            (let ((end (cdr (last x)))) (and end (text end)))))
                   (t (print-briefly x :package package :limit 100)))))
    (format nil "(~A~@[ ~A~])" (name-text name package)
            (and lambda-list (subseq (text lambda-list) 1 (1- (length (text lambda-list))))))))

(defun call-syntax (name package)
  "How to call the function or macro NAME: (NAME ARG ...)."
  (let ((lambda-list (handler-case (sb-introspect:function-lambda-list name)
                       (error () :unknown))))
    (if (eq lambda-list :unknown)
        (format nil "(~A ...)" (name-text name package))
        (lambda-list-text name lambda-list package))))
