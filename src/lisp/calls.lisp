;;;; How the swank-mcp server calls the helper (CALL, which runs only the helper revision that
;;;; server loaded); running a call under a token, so that a timeout or a cancellation interrupts
;;;; the right thread; taking turns at what only one call may use at a time (ASDF); and what a
;;;; call that will not stop is doing.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; The server's way in
;;;
;;; An image holds one revision of the helper at a time, in one package. Two swank-mcp versions
;;; attached to one image (a person upgrading swank-mcp while their image runs) would each load
;;; their own over the other's, and each would then call the other's definitions under the
;;; other's feet. So every call names the revision its server loaded: a call for another one
;;; runs nothing, and its server loads its own revision again, which ENSURE-HELPER (bootstrap.lisp)
;;; does only while none of the other revision's calls runs, and refuses otherwise.

(defvar *calling* nil
  "True in a thread while it runs a CALL.")

(defvar *readable-directories* :any
  "Where a call may read source files: :ANY, or for a server that promised --read-only (LOOK),
the native names of its roots, to which READABLE-FILE-P adds the image's ASDF systems'
directories.")

(defun in-call-p ()
  *calling*)

(defun call-entry (version name arguments looks-only &optional (readable :any))
  (if (sb-thread:with-mutex (*load-lock*)
        (when (equal version *version*)
          (sb-ext:atomic-incf (car *calls-running*))
          t))
      (unwind-protect
           (multiple-value-bind (symbol status) (find-symbol (string-upcase name) '#:mcp-agent-helper)
             (unless (and (eq status :external) (fboundp symbol))
               (error "The swank-mcp helper has no entry ~A." name))
             (when (and looks-only (not (get symbol 'look)))
               ;; NAME once: the message is printed with *PRINT-CIRCLE*, which would show the
               ;; one string twice as #1=... #1#.
               (error "~A is refused: this swank-mcp server promised to change nothing (--read-only), ~
                       and it is not one of the helper's entries that only look." name))
             (let ((*calling* t)
                   (*readable-directories* readable))
               (apply symbol arguments)))
        (sb-ext:atomic-decf (car *calls-running*)))
      :other-helper))

(define-entry (call :caller :server) (version name &rest arguments)
  "How the swank-mcp server calls the helper: the entry NAME (an exported function, named by a
string in any case) applied to ARGUMENTS, when VERSION is the revision of the helper in the image.
Otherwise nothing runs and the answer is :OTHER-HELPER: another swank-mcp loaded its own revision
since, or the helper was uninstalled."
  (call-entry version name arguments nil))

(define-entry (look :caller :server) (version name roots &rest arguments)
  "CALL for a server that promised --read-only: it runs only an entry defined as a look (see
DEFINE-ENTRY), which takes no code, so the promise rests on what each look is rather than on
which tools the server offers. ROOTS are the server's (native directory names): the entry reads
source files only under them and the image's ASDF systems' directories."
  (call-entry version name arguments t roots))

;;; ------------------------------------------------------------------------------------------
;;; Running evaluations, so that a timeout or a cancellation can interrupt the right thread

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
  (destructuring-bind (&optional slot word-bytes) (sbcl-symbols :thread-state-word-slot :n-word-bytes)
    (and word-bytes (boundp slot) (boundp word-bytes) (* (symbol-value slot) (symbol-value word-bytes)))))

(defun current-thread-sap-function ()
  (let ((name (sbcl-symbol :current-thread-sap)))
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
in it: an agent thread, timer, interruption; see agent-threads.lisp and exit-guard.lisp).")

(defvar *exit-allowed* nil
  "True while agent code that may end the image runs: a tool call that allows it, or what such a
call started (see REFUSE-AGENT-EXIT).")

(defvar *journal-additions* t
  "Whether the undo journal lists what an agent's call defines anew (a function, a method, a
class), besides what it replaces. Not while a system loads: its hundreds of new definitions would
push the replacements out of the bounded journal.")

(defun token-call (token)
  "The agent's tool call TOKEN's evaluation is for, as two values, its id in the activity record
and its tool; NIL for a token made outside a call. The agent's server makes such a token
CALL-ID/TOOL/N (src/image/call_tag.rs), where only the id may hold a slash."
  (let* ((last (position #\/ token :from-end t))
         (before (and last (position #\/ token :from-end t :end last))))
    (when before
      (values (subseq token 0 before) (subseq token (1+ before) last)))))

(defun name-thread-for-call (token)
  "Names the current thread after the agent's call TOKEN is for, as the image's thread lists
(SLIME's, the threads tool's) show it. Returns a list of the name it had, or NIL when TOKEN is
no call's."
  (multiple-value-bind (call tool) (token-call token)
    (when call
      (list (shiftf (sb-thread:thread-name sb-thread:*current-thread*)
                    (format nil "swank-mcp ~A, call ~A" tool call))))))

(defun call-registered (token function &key (rename t))
  "Calls FUNCTION with a fresh EVALUATION registered under TOKEN. Returns what FUNCTION returns
or, when the evaluation is aborted, the report it was aborted with. With RENAME, the thread is
named after the call meanwhile."
  (let* ((evaluation (make-instance 'evaluation))
         (*evaluation* evaluation)
         (early nil)
         (*agent-call* token)
         (named-from (and rename (name-thread-for-call token))))
    (reset-send-counter)
    (unwind-protect
         ;; Registered inside the CATCH: a CANCEL that finds the evaluation registered may
         ;; interrupt it at once, and its throw needs the tag to be there already.
         (catch (evaluation-tag evaluation)
           (sb-thread:with-mutex (*registry-lock*)
             (setf early (or (gethash token *early-cancellations*)
                             (gethash (token-call token) *cancelled-calls*)))
             (remhash token *early-cancellations*)
             (unless early
               (setf (gethash token *running*) evaluation)))
           (when early
             (throw (evaluation-tag evaluation) (interruption-report (car early) (cdr early) nil)))
           (multiple-value-prog1 (funcall function evaluation)
             (sb-sys:without-interrupts (setf (evaluation-state evaluation) :done))))
      (setf (evaluation-state evaluation) :done)
      (when named-from
        (setf (sb-thread:thread-name sb-thread:*current-thread*) (first named-from)))
      (sb-thread:with-mutex (*registry-lock*)
        (remhash token *running*)
        (note-finished token))
      (rearm-stack-guard)
      (forget-finished-threads)
      (close-dead-connections))))

;;; ------------------------------------------------------------------------------------------
;;; Taking turns
;;;
;;; ASDF is not thread-safe: two systems loaded at once (two agents, or parallel tool calls) can
;;; break its tables (an SBCL AVER in a hash table was seen). The tools' ASDF work takes turns.

(defvar *waiting-for* nil
  "The TURN this thread waits for, if it waits: an interruption of its call says so.")

(defun call-with-turn (turn what function)
  "Calls FUNCTION once no other thread has TURN, holding it meanwhile; WHAT says what FUNCTION
does, for the calls that wait. The wait can be interrupted, as any point of a call can."
  (let ((lock (turn-lock turn)))
    (if (sb-thread:holding-mutex-p lock)
        (funcall function)
        (let ((*waiting-for* turn))
          (sb-thread:with-recursive-lock (lock)
            (let ((*waiting-for* nil))
              (setf (turn-holder turn) what
                    (turn-since turn) (get-internal-real-time))
              (unwind-protect (funcall function)
                (setf (turn-holder turn) nil))))))))

(defun waiting-note ()
  "What the current thread waits for, as a sentence for an interruption's report, or NIL."
  (let ((turn *waiting-for*))
    (when turn
      (let ((holder (turn-holder turn))
            (since (turn-since turn)))
        (format nil "It was waiting for its turn at ~A, which the tools use one call at a time~@[: ~A has ~
                     had it for ~,1F s~]."
                (turn-name turn) holder
                (and since (/ (- (get-internal-real-time) since) internal-time-units-per-second)))))))

(define-entry (cancel :caller :server) (token kind reason)
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
       (abort-evaluation evaluation
                         (interruption-report kind (format nil "~A~@[ ~A~]" reason (waiting-note))
                                              (backtrace-lines nil :interrupted t)))))))

(defun thread-text (thread)
  (format nil "~S" (sb-thread:thread-name thread)))

(defun waiting-text (thread)
  "What THREAD waits for, when it waits for a lock or a condition, or NIL."
  (let ((waiting-for (ignore-errors (sbcl-call :thread-waiting-for thread))))
    (typecase waiting-for
      (null nil)
      (sb-thread:mutex
       (let ((owner (sb-thread:mutex-owner waiting-for)))
         (format nil "waits for the lock ~S~:[~;, held by thread ~:*~A~]"
                 (sb-thread:mutex-name waiting-for) (and owner (thread-text owner)))))
      (t (format nil "waits on ~A" (ignore-errors (princ-to-string waiting-for)))))))

(define-entry (stuck-report :caller :server) (token)
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
