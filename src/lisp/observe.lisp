;;;; Seeing into the running image: the trace tool (calls of traced functions come back in the
;;;; [trace] section of the agent's next evaluations), the threads the agent starts (their output
;;;; and unhandled errors come back in a [background] section), the threads tool and the profile
;;;; tool.
;;;;
;;;; Loaded after printing.lisp and before evaluate.lisp (whose EVALUATE binds the specials defined
;;;; here), under the rules of package.lisp. What is traced is traced with a report function of
;;;; ours, inert outside the agent's tool calls; the encapsulations that make what an agent starts
;;;; run as the agent's are installed with the rest of the footprint (footprint.lisp).

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Trace

(defparameter *max-trace-events* 100
  "Trace events (calls and returns) shown per reply; the next are kept behind a handle.")

(defparameter *max-kept-trace-events* 10000
  "Trace events kept of one evaluation, shown or not; the rest are counted.")

(defparameter *max-trace-depth* 8
  "Nesting of traced calls shown; deeper calls are counted, not shown.")

(defparameter *max-trace-event-length* 300)

(defvar *trace-log* nil
  "Per evaluation of a session that traces something: a TRACE-LOG its traced calls go to.")

(defclass trace-log ()
  ((lock :initform (sb-thread:make-mutex :name "mcp-agent-helper trace log") :reader trace-log-lock)
   (events :initform '() :accessor trace-log-events)
   (kept :initform 0 :accessor trace-log-kept)
   (lost :initform 0 :accessor trace-log-lost
         :documentation "Events counted only: past the kept ones, or deeper than *MAX-TRACE-DEPTH*.")
   (package :initarg :package :reader trace-log-package)))

(defun make-trace-log-for (session)
  "A fresh log for an evaluation of SESSION, or NIL when SESSION traces nothing. Names in it are
printed as from the session's package."
  (and (session-traces session)
       (make-instance 'trace-log :package (or (find-package-loosely (session-package-name session))
                                              *package*))))

(defclass wide-trace ()
  ((log :initarg :log :reader wide-trace-log)
   (thread :initarg :thread :reader wide-trace-thread
           :documentation "The only thread whose calls it records, or NIL for every thread.")
   (functions :initarg :functions :reader wide-trace-functions
              :documentation "The spec keys of the functions it records.")
   (deadline :initarg :deadline :reader wide-trace-deadline
             :documentation "The internal real time after which it records nothing.")
   (calls-left :initarg :calls-left :reader wide-trace-calls-left
               :documentation "How many more outermost calls it records, in a cons for ATOMIC-DECF.")
   (ended :initform nil :accessor wide-trace-ended
          :documentation "Why it stopped recording, once it has: :CALLS or :TIME.")
   (session :initarg :session :reader wide-trace-session))
  (:documentation "A session's trace of calls made by other threads than its evaluations' (the
trace tool's threads argument): kept until its next evaluate-lisp reply takes them."))

(defvar *wide-traces* '()
  "The WIDE-TRACEs recording, newest first; changed only under *WIDE-TRACES-LOCK*.")

(defvar *wide-traces-lock* (sb-thread:make-mutex :name "mcp-agent-helper wide traces"))

(defun start-wide-trace (session specs thread max-calls seconds package)
  "Records, for SESSION, the calls of SPECS that other threads make (THREAD's only, when given),
until MAX-CALLS calls or SECONDS have passed; replaces the session's earlier one."
  (let ((trace (make-instance 'wide-trace
                              :log (make-instance 'trace-log :package package)
                              :thread thread
                              :functions (mapcar #'spec-key specs)
                              :deadline (+ (get-internal-real-time) (* seconds internal-time-units-per-second))
                              :calls-left (list max-calls)
                              :session session)))
    (sb-thread:with-mutex (*wide-traces-lock*)
      (setf *wide-traces* (cons trace (remove session *wide-traces* :key #'wide-trace-session))))
    trace))

(defun stop-wide-trace (session)
  (sb-thread:with-mutex (*wide-traces-lock*)
    (setf *wide-traces* (remove session *wide-traces* :key #'wide-trace-session))))

(defvar *wide-trace-thread* nil
  "While an event of another thread is recorded: that thread's name, which its line starts with.")

(defun record-wide-trace-event (depth name kind values)
  "Records a call outside the agent's evaluations in each wide trace that watches it: the calls of
the image's own threads."
  (let ((key nil))
    (dolist (trace *wide-traces*)
      (when (and (null (wide-trace-ended trace))
                 (or (null (wide-trace-thread trace)) (eq (wide-trace-thread trace) sb-thread:*current-thread*))
                 (member (or key (setf key (spec-key name))) (wide-trace-functions trace) :test #'string=))
        (cond ((> (get-internal-real-time) (wide-trace-deadline trace))
               (setf (wide-trace-ended trace) :time))
              ((and (eq kind :enter) (zerop depth)
                    (<= (sb-ext:atomic-decf (car (wide-trace-calls-left trace))) 0))
               (setf (wide-trace-ended trace) :calls))
              (t
               (let ((*trace-log* (wide-trace-log trace))
                     (*wide-trace-thread* (safe-princ (sb-thread:thread-name sb-thread:*current-thread*))))
                 (record-trace-event depth name kind nil values))))))))

(defun take-wide-trace (session)
  "The events SESSION's wide trace recorded since the last reply, taken (its log emptied), with a
line that says so when it stopped recording."
  (let ((trace (find session *wide-traces* :key #'wide-trace-session)))
    (when trace
      (let ((log (wide-trace-log trace)))
        (sb-thread:with-mutex ((trace-log-lock log))
          (prog1 (append (reverse (trace-log-events log))
                         (when (plusp (trace-log-lost log))
                           (list (format nil "(~:D more events of other threads were counted, not kept)"
                                         (trace-log-lost log))))
                         (case (wide-trace-ended trace)
                           (:calls (list "(the trace of other threads reached its max_calls and stopped)"))
                           (:time (list "(the trace of other threads reached its time limit and stopped)"))))
            (setf (trace-log-events log) '()
                  (trace-log-kept log) 0
                  (trace-log-lost log) 0)
            (when (wide-trace-ended trace)
              (stop-wide-trace session))))))))

(defun record-trace-event (depth name kind frame values)
  "SBCL's TRACE report function (:REPORT): records the event in the current evaluation's log, if
any, or in the wide traces that watch the calls of other threads. Calls nobody watches are not
reported anywhere."
  (declare (ignore frame))
  (let ((log *trace-log*))
    (when (and (null log) *wide-traces*)
      (return-from record-trace-event (record-wide-trace-event depth name kind values)))
    (when log
      (sb-thread:with-mutex ((trace-log-lock log))
        (if (or (>= depth *max-trace-depth*) (>= (trace-log-kept log) *max-kept-trace-events*))
            (incf (trace-log-lost log))
            (let ((package (trace-log-package log)))
              (incf (trace-log-kept log))
              (push (let ((indent (format nil "~@[[~A] ~]~A" *wide-trace-thread*
                                          (make-string (* 2 depth) :initial-element #\Space))))
                      (ecase kind
                        (:enter (format nil "~A~D: ~A" indent depth
                                        (print-briefly (cons name values) :package package
                                                                          :limit *max-trace-event-length*)))
                        (:exit (format nil "~A~D: ~A returned~{ ~A~}" indent depth
                                       (print-briefly name :package package)
                                       (mapcar (lambda (value)
                                                 (print-briefly value :package package
                                                                      :limit *max-trace-event-length*))
                                               values)))
                        (:non-local-exit (format nil "~A~D: ~A exited non-locally" indent depth
                                                 (print-briefly name :package package)))))
                    (trace-log-events log))))))))

(defun trace-report (session)
  "The current evaluation's trace events, oldest first, then those of other threads SESSION's wide
trace recorded since its last reply: (shown dropped rest lost), the events shown, how many were
not, the handle of the events kept and the offset of the first not shown (see REST-LISTING), and
how many were not kept."
  (let ((log *trace-log*)
        (others (take-wide-trace session)))
    (multiple-value-bind (own lost)
        (if log
            (sb-thread:with-mutex ((trace-log-lock log))
              (values (reverse (trace-log-events log)) (trace-log-lost log)))
            (values '() 0))
      (let ((events (append own (and others (cons "Calls by other threads since the last reply:" others)))))
        (list (subseq events 0 (min (length events) *max-trace-events*))
              (+ (max 0 (- (length events) *max-trace-events*)) lost)
              (rest-listing events *max-trace-events*)
              lost)))))

(defun read-trace-spec (text package)
  "The function TEXT names, as TRACE takes it: a symbol, (SETF NAME), or (METHOD NAME QUALIFIER*
(SPECIALIZER*)). Fails when TEXT names no function or method of the image."
  (let ((trimmed (string-trim '(#\Space #\Tab #\Newline #\Return) text)))
    (if (and (plusp (length trimmed)) (char= (char trimmed 0) #\())
        ;; A spec naming nothing of the image is refused, and must leave no name interned.
        (call-leaving-image-unchanged
         trimmed package
         (lambda ()
           (let ((spec (handler-case (let ((*package* package) (*read-eval* nil))
                                       (multiple-value-bind (form end) (read-from-string trimmed)
                                         (unless (= end (length trimmed))
                                           (fail "~S holds more than one name; give each its own element of functions."
                                                 text))
                                         form))
                         (tool-failure (failure) (error failure))
                         (error (e) (fail "~S is not a function name: ~A" text (condition-message e))))))
             (cond ((and (consp spec) (eq (first spec) 'setf))
                    (unless (fboundp spec)
                      (fail "~A is not a function of this image." (name-text spec package)))
                    spec)
                   ((and (consp spec) (eq (first spec) 'method))
                    (check-method-spec spec text package)
                    spec)
                   (t (fail "~S is neither a symbol, (SETF name) nor (METHOD name qualifier* (specializer*))." text))))))
        (let ((symbol (find-existing-symbol text package)))
          (unless (fboundp symbol)
            (fail "~A is not a function or macro of this image." (name-text symbol package)))
          (when (special-operator-p symbol)
            (fail "~A is a special operator; it cannot be traced." (name-text symbol package)))
          symbol))))

(defun specializer-object (specializer)
  (cond ((and (consp specializer) (eq (first specializer) 'eql))
         (sb-mop:intern-eql-specializer (second specializer)))
        ((symbolp specializer) (find-class specializer nil))
        (t nil)))

(defun check-method-spec (spec text package)
  "Fails unless SPEC, (METHOD NAME QUALIFIER* (SPECIALIZER*)), names an existing method; the
failure lists the generic function's methods."
  (destructuring-bind (&optional name &rest rest) (rest spec)
    (let* ((generic (and name (fboundp name) (fdefinition name)))
           (specializers (car (last rest)))
           (qualifiers (butlast rest)))
      (unless (typep generic 'generic-function)
        (fail "~A in ~S is not a generic function." (name-text name package) text))
      (unless (and (listp specializers) rest)
        (fail "~S has no specializer list: write (method ~(~A~) [qualifier ...] (specializer ...)), e.g. ~
               (method ~(~A~) :around (integer))." text (name-text name package) (name-text name package)))
      (let ((objects (mapcar #'specializer-object specializers)))
        (unless (and (every #'identity objects)
                     (find-method generic qualifiers objects nil))
          (fail "~A has no method ~S. Its methods: ~{~A~^, ~}." (name-text name package) text
                (mapcar (lambda (method)
                          (print-briefly `(method ,name ,@(method-qualifiers method)
                                                  ,(mapcar #'specializer-name
                                                           (sb-mop:method-specializers method)))
                                         :package package))
                        (sb-mop:generic-function-methods generic))))))))

(defun specializer-name (specializer)
  (if (typep specializer 'sb-mop:eql-specializer)
      `(eql ,(sb-mop:eql-specializer-object specializer))
      (class-name specializer)))

(defun spec-key (spec)
  "SPEC as text, the same for equal specifications whatever package prints them."
  (qualified-name spec))

(defun trace-spec (spec)
  ;; TRACE is a macro whose names are not evaluated: the specification is put in the form as an
  ;; object, never as text.
  (eval `(trace :report record-trace-event ,spec)))

(defun untrace-spec (spec)
  (eval `(untrace ,spec)))

(defun traced-elsewhere-p (spec session)
  "True when a session other than SESSION traces SPEC too."
  (sb-ext:with-locked-hash-table (*sessions*)
    (loop for other being the hash-values of *sessions*
            thereis (and (not (eq other session))
                         (member (spec-key spec) (session-traces other) :key #'spec-key :test #'string=)))))

(defun untrace-session (session &optional specs)
  "Untraces SPECS (all of SESSION's when NIL) for SESSION; a function another session traces
stays traced. Returns the specifications untraced."
  (let* ((traced (session-traces session))
         (targets (or specs traced))
         (keys (mapcar #'spec-key targets)))
    (dolist (spec targets)
      (unless (traced-elsewhere-p spec session)
        (ignore-errors (untrace-spec spec))))
    (sb-thread:with-mutex ((session-lock session))
      (setf (session-traces session)
            (remove-if (lambda (spec) (member (spec-key spec) keys :test #'string=)) (session-traces session))))
    (unless (session-traces session)
      (stop-wide-trace session))
    targets))

(define-entry trace-functions (functions &key untrace package threads (max-calls 1000) (seconds 300) session token)
  "The trace tool: traces FUNCTIONS (texts of names) for SESSION, or with UNTRACE untraces them
(all of SESSION's when FUNCTIONS is empty). THREADS, \"all\" or a thread as the threads tool names
it, records the calls other threads make too, until MAX-CALLS calls or SECONDS have passed.
Returns (:TRACED names :UNTRACED names :MAX-EVENTS n :MAX-DEPTH n :OTHER-THREADS text)."
  (run-tool
   token
   (lambda ()
     (let* ((package (tool-package package session))
            (session (find-session session))
            (specs (mapcar (lambda (text) (read-trace-spec text package)) functions)))
       (flet ((names (specs) (mapcar (lambda (spec) (name-text spec package)) specs)))
         (if untrace
             (let ((unknown (remove-if (lambda (spec)
                                         (member (spec-key spec) (session-traces session)
                                                 :key #'spec-key :test #'string=))
                                       specs)))
               (when unknown
                 (fail "~{~A~^, ~} ~[~;is~:;are~] not traced by this session; it traces ~:[nothing~;~:*~{~A~^, ~}~]."
                       (names unknown) (length unknown) (names (session-traces session))))
               (let ((untraced (untrace-session session specs)))
                 (list :traced (names (session-traces session))
                       :untraced (names untraced)
                       :max-events *max-trace-events* :max-depth *max-trace-depth*
                       :other-threads nil)))
             (let ((thread (and threads (not (string-equal threads "all")) (find-thread threads))))
               (dolist (spec specs)
                 (trace-spec spec)
                 (sb-thread:with-mutex ((session-lock session))
                   (pushnew spec (session-traces session) :key #'spec-key :test #'string=)))
               (when threads
                 (start-wide-trace session specs thread max-calls seconds package))
               (list :traced (names (session-traces session))
                     :untraced nil
                     :max-events *max-trace-events* :max-depth *max-trace-depth*
                     :other-threads (and threads
                                         (format nil "~:[every thread~;~:*thread ~A~]: ~{~A~^, ~}, for ~:D s or ~:D ~
                                                      calls, whichever comes first"
                                                 (and thread (format nil "~D ~S" (thread-number thread)
                                                                     (safe-princ (sb-thread:thread-name thread))))
                                                 (names specs) seconds max-calls))))))))))

;;; ------------------------------------------------------------------------------------------
;;; Threads the agent starts
;;;
;;; SBCL's SB-THREAD::START-THREAD is encapsulated, which every way of starting a Lisp thread
;;; calls (SB-THREAD:MAKE-THREAD, bordeaux-threads, SBCL's internal MAKE-SYSTEM-THREAD): a thread
;;; started during an agent's tool call runs its function with its output going into the
;;; session's background buffer, and an unhandled error (or BREAK) in it is recorded there with a
;;; short backtrace instead of waiting in a debugger nobody drives. The next evaluate-lisp reply
;;; of the session carries both, in [background].

(defparameter *max-background-output* 16000
  "Characters of agent threads' output kept per session until a reply takes them.")

(defparameter *max-background-errors* 10)

(defvar *agent-threads* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "Thread -> the SESSION whose agent started it, until the session ends.")

(defun forget-agent-threads (session)
  "Forgets which threads SESSION's agent started: it has ended."
  (sb-ext:with-locked-hash-table (*agent-threads*)
    (loop for thread being the hash-keys of *agent-threads* using (hash-value owner)
          when (eq owner session)
            collect thread into forgotten
          finally (dolist (thread forgotten)
                    (remhash thread *agent-threads*)))))

(defclass background ()
  ((lock :initform (sb-thread:make-mutex :name "mcp-agent-helper background") :reader background-lock)
   (output :initform (make-capture *max-background-output* :runaway nil) :accessor background-output)
   (errors :initform '() :accessor background-errors)
   (errors-dropped :initform 0 :accessor background-errors-dropped)))

(defun session-background (session)
  "SESSION's BACKGROUND: what its agent threads printed and their errors, made when first needed."
  (or (session-background-slot session)
      (sb-thread:with-mutex ((session-lock session))
        (or (session-background-slot session)
            (setf (session-background-slot session) (new 'background))))))

(defclass background-stream (sb-gray:fundamental-character-output-stream)
  ;; The BACKGROUND itself: once the session ends, a thread still printing writes into a buffer
  ;; nobody reads, which goes when the thread goes.
  ((background :initarg :background :reader background-stream-background)
   (column :initform 0 :accessor background-stream-column))
  (:documentation "Output of an agent's thread: written into its session's background buffer,
under that buffer's lock since several threads may print at once."))

(defmethod sb-gray:stream-write-char ((stream background-stream) char)
  (let ((background (background-stream-background stream)))
    (sb-thread:with-mutex ((background-lock background))
      (write-char char (background-output background))))
  (setf (background-stream-column stream) (if (char= char #\Newline) 0 (1+ (background-stream-column stream))))
  char)

(defmethod sb-gray:stream-write-string ((stream background-stream) string &optional (start 0) end)
  (let ((background (background-stream-background stream))
        (end (or end (length string))))
    (sb-thread:with-mutex ((background-lock background))
      (write-string string (background-output background) :start start :end end))
    (let ((newline (position #\Newline string :start start :end end :from-end t)))
      (setf (background-stream-column stream)
            (if newline (- end newline 1) (+ (background-stream-column stream) (- end start))))))
  string)

(defmethod sb-gray:stream-line-column ((stream background-stream))
  (background-stream-column stream))

(defun without-runtime-frames (lines)
  "Backtrace LINES without the runtime's own frames (named by strings), which say nothing."
  (remove-if (lambda (line) (eql 0 (search "(\"" line))) lines))

(defun record-background-error (background condition backtrace &key went-on waits)
  "Records CONDITION, unhandled in the current thread, in BACKGROUND with the first frames of
BACKTRACE; WENT-ON when the thread continues after it, WAITS (where) when it waits in a debugger,
with the server's id and the threads tool's number of the thread and the number of its stop, by
which the agent's server opens it as a debugger session."
  (sb-thread:with-mutex ((background-lock background))
    (if (>= (length (background-errors background)) *max-background-errors*)
        (incf (background-errors-dropped background))
        (push (list :thread (safe-princ (sb-thread:thread-name sb-thread:*current-thread*))
                    :type (standard-condition-name condition)
                    :message (condition-message condition)
                    :backtrace (let ((lines (without-runtime-frames backtrace)))
                                 (subseq lines 0 (min 8 (length lines))))
                    :went-on went-on
                    :waits waits
                    :attach (and waits
                                 (let ((id (server-thread-id sb-thread:*current-thread*)))
                                   (and id (list id (thread-number sb-thread:*current-thread*)
                                                 (stop-number condition))))))
              (background-errors background)))))

(defun take-background (session)
  "What SESSION's agent threads printed and their errors since the last reply, taken (the buffer
is emptied): (:OUTPUT (text dropped) :ERRORS reports :ERRORS-DROPPED n)."
  (let ((background (session-background-slot session)))
    (if (null background)
        (list :output (list "" 0) :errors nil :errors-dropped 0)
        (sb-thread:with-mutex ((background-lock background))
          (prog1 (list :output (capture-report (background-output background))
                       :errors (reverse (background-errors background))
                       :errors-dropped (background-errors-dropped background))
            (setf (background-output background) (make-capture *max-background-output* :runaway nil)
                  (background-errors background) '()
                  (background-errors-dropped background) 0))))))

(defun call-as-agent (session exit-allowed function arguments leave)
  "FUNCTION applied to ARGUMENTS as code of SESSION's agent: with output into the session's
background, exits refused unless EXIT-ALLOWED (see REFUSE-AGENT-EXIT), hooks it adds made the
agent's (see CALL-CLAIMING-HOOKS), and an error it leaves unhandled (or a BREAK) recorded there
with a short backtrace; LEAVE, which must not return, is then called instead of waiting in a
debugger nobody drives."
  (let* ((background (session-background session))
         (stream (make-instance 'background-stream :background background))
         (input (make-string-input-stream ""))
         (*agent-session* session)
         (*exit-allowed* exit-allowed)
         (*standard-output* stream)
         (*error-output* stream)
         (*trace-output* stream)
         (*standard-input* input)
         (*terminal-io* (make-two-way-stream input stream))
         (*query-io* (make-two-way-stream input stream))
         (*debug-io* (make-two-way-stream input stream)))
    (let* ((hook (lambda (condition hook)
                   (declare (ignore hook))
                   (let ((continue (and (typep condition 'threads-tool-interrupt)
                                        (find-restart 'continue condition))))
                     (record-background-error background condition (backtrace-lines condition)
                                              :went-on (and continue t))
                     ;; The threads tool's interrupt: noted, and the thread goes on.
                     (if continue
                         (invoke-restart continue)
                         (funcall leave)))))
           (sb-ext:*invoke-debugger-hook* hook)
           (*debugger-hook* hook))
      (call-claiming-hooks (lambda () (apply function arguments))))))

(defun start-agent-thread (start-thread thread function arguments)
  "The encapsulation of SBCL's SB-THREAD::START-THREAD: inside an agent's evaluation, or in code
of the agent's, the new THREAD runs FUNCTION as the agent's code (see CALL-AS-AGENT), is aborted
after an unhandled error (JOIN-THREAD sees it end abnormally), and is remembered as the agent's."
  (let ((session *agent-session*)
        (exit-allowed *exit-allowed*))
    (if session
        (progn
          (setf (gethash thread *agent-threads*) session)
          (funcall start-thread thread
                   (lambda (&rest arguments)
                     (call-as-agent session exit-allowed function arguments #'sb-thread:abort-thread))
                   arguments))
        (funcall start-thread thread function arguments))))

;;; ------------------------------------------------------------------------------------------
;;; An agent cannot end the user's image by accident
;;;
;;; SB-EXT:EXIT (which UIOP:QUIT, SB-EXT:QUIT, SB-THREAD:ABORT-THREAD of the main thread and
;;; SB-THREAD:TERMINATE-THREAD of it call) is encapsulated: in code an agent's tool call runs,
;;; directly or through what it starts, it signals EXIT-REFUSED unless the call allows exits (the
;;; server started the image, or runs with --allow-exit). A catch around the call could not stop an
;;; exit instead: from another thread SBCL takes the exit lock, unwinds that thread, runs the exit
;;; hooks and tells the main thread to exit. Code the agent hands to the image to run later, or in
;;; another thread (a thread, a timer, an interruption, a finalizer), is made to run as the agent's
;;; code wherever it runs, so that the guard knows it for the agent's. A function put on one of
;;; SBCL's hook lists is not handed to anything the helper sees: it is known for the agent's by
;;; when it appeared there (see CALL-CLAIMING-HOOKS), and SBCL runs it as the agent's code then.

(define-condition exit-refused (error)
  ((arguments :initarg :arguments :reader exit-refused-arguments))
  (:report (lambda (condition stream)
             (format stream "(SB-EXT:EXIT~{ ~A~}) was refused: this image is not swank-mcp's to end (it did not ~
                             start it), and ending it would lose the state of whoever works in it. Start ~
                             swank-mcp with --allow-exit to let an evaluation end the image."
                     (let ((*package* (find-package '#:common-lisp)))
                       (mapcar #'prin1-to-string (exit-refused-arguments condition)))))))

(defvar *unowned-hook* nil
  "True while a hook of no known owner that may be the agent's runs (see HOOK-AS-OWNED): an exit in
it is refused.")

(defun refuse-agent-exit (exit &rest arguments)
  (if (and (or *agent-call* *agent-session* *unowned-hook*) (not *exit-allowed*))
      (error 'exit-refused :arguments arguments)
      (apply exit arguments)))

(defvar *agent-callbacks* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "The functions AGENT-CALLBACK made.")

(defun agent-callback (function &key whole-thread (session *agent-session*) (exit-allowed *exit-allowed*)
                                     (owner (or *evaluation* sb-thread:*current-thread*)))
  "FUNCTION, which the agent's code of SESSION hands to the image to call later or elsewhere, as a
function that runs it as the agent's code (see CALL-AS-AGENT) in whatever thread calls it. An
exit it tries and does not handle, or an error it leaves to the debugger, is recorded in the
session's background and ends the call of FUNCTION, not the thread, unless WHOLE-THREAD (FUNCTION
is the thread's body): the code around it is not the agent's and must not see the agent's error.
Called inside the code that made it, OWNER (its evaluation, or its agent thread): a timer that
interrupts it, as WITH-TIMEOUT's does, FUNCTION runs as it is, and that code's handlers and
debugger see its errors."
  (let ((callback
          (lambda (&rest arguments)
            (if (and owner
                     (eq owner (or *evaluation* sb-thread:*current-thread*))
                     (eq *agent-session* session))
                (apply function arguments)
                (let ((tag (list 'agent-callback)))
                  (when whole-thread
                    (setf (gethash sb-thread:*current-thread* *agent-threads*) session))
                  (catch tag
                    (flet ((leave () (throw tag nil)))
                      (handler-bind ((exit-refused
                                       (lambda (condition)
                                         (record-background-error (session-background session) condition
                                                                  (backtrace-lines condition)
                                                                  :went-on (not whole-thread))
                                         (leave))))
                        (call-as-agent session exit-allowed function arguments #'leave)))))))))
    (setf (gethash callback *agent-callbacks*) t)
    callback))

(defparameter *hook-variables* '(sb-ext:*exit-hooks* sb-ext:*after-gc-hooks* sb-ext:*save-hooks*)
  "Lists of functions SBCL calls later in whichever thread, through SB-INT:CALL-HOOKS:
SB-EXT:*EXIT-HOOKS* when the human exits (where a hook that exits again would end the image at
once, with another code, before the human's own hooks and the flushing of output ran),
SB-EXT:*AFTER-GC-HOOKS* after any collection, SB-EXT:*SAVE-HOOKS* when the human saves the image
(where an exit would end it unsaved). SB-EXT:*INIT-HOOKS* is not among them: its functions run in
the new process a saved core starts, not in this image.")

(defvar *hook-owners* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "Function (or designator) on a list of *HOOK-VARIABLES* -> whose it is: :PERSON, or for an
agent's, the AGENT-CALLBACK that SBCL calls instead (see CALL-OWNED-HOOKS). The lists themselves
are never changed while the helper is installed, so that the person's code and the agent's see
and remove exactly what they put there.")

(defvar *agent-code-runs* '()
  "One entry for each run of agent code under way in the image (see CALL-CLAIMING-HOOKS):
(lists . exit-allowed), LISTS the values of *HOOK-VARIABLES* when it began. Replaced, never
changed, under *HOOK-LOCK*, so that it is read without the lock while hooks run.")

(defvar *hook-lock* (sb-thread:make-mutex :name "mcp-agent-helper hook owners"))

(defmacro with-hook-lock (&body body)
  ;; Without collections: one in this thread while it holds the lock would run the hooks, and an
  ;; agent's hook takes the lock when it ends.
  `(sb-sys:without-gcing (sb-thread:with-mutex (*hook-lock*) ,@body)))

(defun claim-hooks (owner &optional (before '()))
  "Gives each function on the lists of *HOOK-VARIABLES* that has no owner and was not on them
when they held BEFORE (a CAR of an *AGENT-CODE-RUNS* entry) the owner OWNER makes of it."
  (loop for variable in *hook-variables*
        for old = (pop before)
        do (dolist (hook (symbol-value variable))
             (unless (or (gethash hook *hook-owners*) (member hook old))
               (setf (gethash hook *hook-owners*) (funcall owner hook))))))

(defun call-claiming-hooks (function)
  "Calls FUNCTION, which runs as the agent's code when *AGENT-SESSION* is bound. A function that
appears on a list of *HOOK-VARIABLES* while it runs becomes the agent's: SBCL runs it as the
agent's code (see CALL-OWNED-HOOKS), in whatever thread, however deep in the agent's hooks,
timers or threads it was added. Which thread added one cannot be known, so one the person adds
meanwhile is taken for the agent's too; what is added while no agent code runs is the person's."
  (let ((session *agent-session*)
        (exit-allowed *exit-allowed*))
    (if (null session)
        (funcall function)
        (let ((run nil))
          ;; Uninterrupted between the bookkeeping and the call: a run left in the list would
          ;; keep every later hook from being the person's.
          (sb-sys:without-interrupts
            (unwind-protect
                 (progn
                   (with-hook-lock
                     (unless *agent-code-runs*
                       (claim-hooks (constantly :person)))
                     (setf run (cons (mapcar #'symbol-value *hook-variables*) exit-allowed))
                     (setf *agent-code-runs* (cons run *agent-code-runs*)))
                   (sb-sys:with-local-interrupts (funcall function)))
              (when run
                (with-hook-lock
                  (claim-hooks (lambda (hook)
                                 (agent-callback hook :session session :exit-allowed exit-allowed :owner nil))
                               (car run))
                  (setf *agent-code-runs* (remove run *agent-code-runs*))))))))))

(defun hook-as-owned (hook)
  "What SBCL calls for HOOK: an agent's hook's AGENT-CALLBACK; HOOK itself when it is the
person's; or, while agent code that added it may still run, HOOK with exits refused."
  (let ((owner (gethash hook *hook-owners*)))
    (cond ((functionp owner) owner)
          ((and (null owner)
                (loop for (lists . exit-allowed) in *agent-code-runs*
                      thereis (and (not exit-allowed)
                                   (loop for variable in *hook-variables*
                                         for old in lists
                                         thereis (and (member hook (symbol-value variable))
                                                      (not (member hook old)))))))
           (lambda (&rest arguments)
             (let ((*unowned-hook* t)
                   (*exit-allowed* nil))
               (apply hook arguments))))
          (t hook))))

(defun call-owned-hooks (call-hooks kind hooks &rest options)
  "The encapsulation of SB-INT:CALL-HOOKS, by which SBCL runs the lists of *HOOK-VARIABLES*: each
hook runs as HOOK-AS-OWNED says. An exit is refused by what the thread runs when it exits, and a
collection runs the hooks in whichever thread allocated, the person's too: so a hook is known for
the agent's by when it was added."
  (apply call-hooks kind (mapcar #'hook-as-owned hooks) options))

(defun remove-agent-hooks ()
  "For UNINSTALL: takes the agents' functions off the lists of *HOOK-VARIABLES*, where without the
helper they would run as the person's code. Returns a line for each list changed."
  (loop for variable in *hook-variables*
        for removed = (loop (let* ((old (symbol-value variable))
                                   (new (remove-if (lambda (hook)
                                                     ;; A revision before *HOOK-OWNERS* put its
                                                     ;; AGENT-CALLBACKs on the lists themselves.
                                                     (or (functionp (gethash hook *hook-owners*))
                                                         (gethash hook *agent-callbacks*)))
                                                   old)))
                              (when (eq old (sb-ext:compare-and-swap (symbol-value variable) old new))
                                (return (- (length old) (length new))))))
        when (plusp removed)
          collect (format nil "~D function~:P an agent put on ~A" removed (qualified-name variable))))

(defun make-agent-timer (make-timer function &rest options &key thread &allow-other-keys)
  "The encapsulation of SB-EXT:MAKE-TIMER: the function of a timer the agent's code makes runs as
the agent's code, in the thread the timer interrupts or in a new one (THREAD T)."
  (if *agent-session*
      (apply make-timer (agent-callback function :whole-thread (eq thread t)) options)
      (apply make-timer function options)))

(defun interrupt-as-agent (interrupt-thread thread function)
  "The encapsulation of SB-THREAD:INTERRUPT-THREAD: an interruption the agent's code sends runs
as the agent's code in the thread it interrupts, the main thread included."
  (funcall interrupt-thread thread (if *agent-session* (agent-callback function) function)))

(defun finalize-as-agent (finalize object function &rest options)
  "The encapsulation of SB-EXT:FINALIZE: a finalizer the agent's code sets runs as the agent's
code in whatever thread runs finalizers."
  (apply finalize object (if *agent-session* (agent-callback function) function) options))

(defun run-timers-as-nobody (run-expired-timers &rest arguments)
  "The encapsulation of SBCL's SIGALRM handler's work: it runs in whichever thread took the
signal, an agent's evaluation among them, and the timers it runs (the human's too) must not pass
for that thread's code. An agent's timer carries its agent with it (see MAKE-AGENT-TIMER)."
  (let ((*agent-session* nil)
        (*agent-call* nil)
        (*exit-allowed* nil))
    (apply run-expired-timers arguments)))

;;; ------------------------------------------------------------------------------------------
;;; The threads tool

(defvar *thread-numbers* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "Thread -> the number the threads tool shows it by: small, and the same for the thread's life.")

(defvar *thread-number-counter* (list 0)
  "The last thread number given, in a cons for ATOMIC-INCF; kept across reloads of the helper, as
the numbers given are.")

(defun thread-number (thread)
  (or (gethash thread *thread-numbers*)
      (setf (gethash thread *thread-numbers*)
            (1+ (sb-ext:atomic-incf (car *thread-number-counter*))))))

(defun find-thread (designator)
  "The live or recently ended thread DESIGNATOR (a number from the list, or a name) names."
  (let* ((threads (sb-thread:list-all-threads))
         (number (ignore-errors (parse-integer designator)))
         (found (if number
                    (find number threads :key #'thread-number)
                    (remove designator threads :key #'sb-thread:thread-name :test-not #'equal))))
    (cond ((typep found 'sb-thread:thread) found)
          ((and (consp found) (rest found))
           (fail "~D threads are named ~S; name it by number: ~{~D~^, ~}." (length found) designator
                 (mapcar #'thread-number found)))
          ((consp found) (first found))
          (t (fail "No thread ~:[named ~S~;numbered ~A~] in the image. Its threads: ~{~A~^; ~}." number designator
                   (mapcar (lambda (thread) (format nil "~A ~S" (thread-number thread) (sb-thread:thread-name thread)))
                           threads))))))

(defun debugger-text (thread)
  "How THREAD waits in a debugger, with the condition it stopped with, or NIL: swank-mcp's (an
agent's evaluation, which the debugger tool acts on) or the server's own (SLIME's or SLY's)."
  (flet ((in-thread (symbol)
           (and symbol (sb-thread:symbol-value-in-thread symbol thread nil))))
    (let ((parked (in-thread '*parked*))
          (level (in-thread (first (or (existing-symbols "SWANK" "*SLDB-LEVEL*")
                                       (existing-symbols "SLYNK" "*SLY-DB-LEVEL*"))))))
      (cond (parked
             (format nil "waits in swank-mcp's debugger (~A)" (standard-condition-name (parked-condition parked))))
            ((and (integerp level) (plusp level))
             (let ((condition (in-thread (first (or (existing-symbols "SWANK" "*SWANK-DEBUGGER-CONDITION*")
                                                    (existing-symbols "SLYNK" "*SLYNK-DEBUGGER-CONDITION*"))))))
               (format nil "waits in the ~:[SLY~;SLIME~] debugger, level ~D~@[ (~A)~]"
                       (find-package "SWANK") level
                       (and (typep condition 'condition)
                            (let ((message (condition-message condition)))
                              (format nil "~A: ~A" (standard-condition-name condition)
                                      (subseq message 0 (or (position #\Newline message) (length message)))))))))))))

(defun thread-entry (thread session)
  (list :number (thread-number thread)
        :name (safe-princ (sb-thread:thread-name thread))
        :alive (and (sb-thread:thread-alive-p thread) t)
        :waiting (ignore-errors (or (debugger-text thread) (waiting-text thread)))
        :agent (eq (gethash thread *agent-threads*) session)
        :current (eq thread sb-thread:*current-thread*)))

(defparameter *max-thread-frames* 40
  "Lines of a thread's backtrace the threads tool shows; the rest are counted.")

(defun thread-stack-lines ()
  "The current thread's whole stack below the interruption that runs this, innermost first: the
frames of the helper and of the server each run as one line that counts them (a thread waiting
in a debugger has the code that stopped under them), at most *MAX-THREAD-FRAMES* lines and one
that says how many frames are not shown."
  ;; Each entry is (frames . call), CALL a (name . args) to print or NIL for a run of own frames.
  (let ((entries '()))
    (loop for frame = (internal-call "SB-DI" "TOP-FRAME") then (internal-call "SB-DI" "FRAME-DOWN" frame)
          for walked below 10000
          while frame
          do (multiple-value-bind (name args) (frame-call-of frame nil)
               (cond ((member (frame-function-symbol name) *interruption-functions*)
                      ;; Everything above the interruption belongs to it: start afresh.
                      (setf entries '()))
                     ;; The runtime's own frames, named by strings, say nothing.
                     ((stringp name))
                     ((not (own-frame-p name))
                      (push (cons 1 (cons name args)) entries))
                     ((and entries (null (cdr (first entries))))
                      (incf (car (first entries))))
                     (t (push (cons 1 nil) entries)))))
    (let* ((entries (nreverse entries))
           (shown (subseq entries 0 (min (length entries) *max-thread-frames*)))
           (not-shown (reduce #'+ (nthcdr (length shown) entries) :key #'car)))
      (append (loop for (frames . call) in shown
                    collect (if call
                                (print-frame (car call) (cdr call))
                                (format nil "(~D frame~:P of swank-mcp's helper and the swank or slynk server)" frames)))
              (and (plusp not-shown)
                   (list (format nil "(~D more frame~:P not shown)" not-shown)))))))

(defun thread-backtrace (thread)
  "THREAD's stack, innermost first, taken by interrupting it briefly; a line that says so when it
did not answer within two seconds."
  (if (eq thread sb-thread:*current-thread*)
      (fail "That is the thread of this call itself.")
      (let ((semaphore (sb-thread:make-semaphore))
            (lines nil))
        (sb-thread:interrupt-thread thread
                                    (lambda ()
                                      (setf lines (thread-stack-lines))
                                      (sb-thread:signal-semaphore semaphore)))
        (if (sb-thread:wait-on-semaphore semaphore :timeout 2)
            lines
            (list "(unavailable: the thread did not answer the interruption within 2 seconds)")))))

(define-condition threads-tool-interrupt (condition) ()
  (:report "Interrupted by the swank-mcp threads tool (action interrupt)."))

(defun check-may-stop (thread force session)
  (unless (or force (eq (gethash thread *agent-threads*) session))
    (fail "Thread ~A ~S was not started by this agent~:[~; (another agent's session started it)~]: pass force: true ~
           to act on it anyway." (thread-number thread) (sb-thread:thread-name thread) (gethash thread *agent-threads*)))
  (when (eq thread sb-thread:*current-thread*)
    (fail "That is the thread of this call itself.")))

(define-entry threads (&key (action "list") thread force session token)
  "The threads tool. ACTION is \"list\", \"backtrace\", \"interrupt\" or \"abort\"; THREAD a number
or name. Returns (:ACTION action :THREADS entries :THREAD entry :BACKTRACE lines :ENDED bool)."
  (run-tool
   token
   (lambda ()
     (let ((target (and thread (find-thread thread)))
           (session (find-session session)))
       (when (and (not (string= action "list")) (null target))
         (fail "The ~A action needs thread (a number or name from the list)." action))
       (cond
         ((string= action "list")
          (list :action action
                :threads (mapcar (lambda (thread) (thread-entry thread session)) (sb-thread:list-all-threads))
                :thread nil :backtrace nil :ended nil))
         ((string= action "backtrace")
          (list :action action :threads nil :thread (thread-entry target session)
                :backtrace (thread-backtrace target) :ended nil))
         ((string= action "interrupt")
          (check-may-stop target force session)
          (let ((lines (thread-backtrace target)))
            (sb-thread:interrupt-thread target (lambda ()
                                                 (with-simple-restart (continue "Return from the interruption.")
                                                   (invoke-debugger (make-condition 'threads-tool-interrupt)))))
            (list :action action :threads nil :thread (thread-entry target session) :backtrace lines :ended nil)))
         ((string= action "abort")
          (check-may-stop target force session)
          (sb-thread:terminate-thread target)
          (let ((ended (handler-case (progn (sb-thread:join-thread target :timeout 2 :default nil) t)
                         (error () (not (sb-thread:thread-alive-p target))))))
            (list :action action :threads nil :thread (thread-entry target session) :backtrace nil
                  :ended (and (not (sb-thread:thread-alive-p target)) ended t))))
         (t (fail "Unknown action ~S: use list, backtrace, interrupt or abort." action)))))))

;;; ------------------------------------------------------------------------------------------
;;; The profile tool

(defparameter *max-profile-rows* 15)

(defvar *profile-lock* (sb-thread:make-mutex :name "swank-mcp profile")
  "Held by a profile from loading sb-sprof to taking its rows: sb-sprof's samples and sampling are
the image's, so two profiles at once would count each other's samples.")

(defun ensure-sb-sprof ()
  (unless (find-package '#:sb-sprof)
    (handler-case (require :sb-sprof)
      (error (e) (fail "SBCL's statistical profiler (sb-sprof) cannot be loaded: ~A" (condition-message e))))))

(defun sprof-symbol (name)
  (or (find-symbol name '#:sb-sprof)
      (fail "This SBCL's sb-sprof has no ~A." name)))

(defun profile-rows (mode package)
  "The profile as rows (:NAME :SELF :SELF-PERCENT :CUMULATIVE :CUMULATIVE-PERCENT), most self
samples first, and the number of samples; tallied from the samples rather than read from
sb-sprof's report, whose Total can count a function more than once a sample (past 100%) and
which holds the frames of the helper and the server under the code.
Here a function's cumulative count is the samples with it anywhere on the stack, each once.
A sample's self frame is its innermost one, except in MODE \"alloc\": there the innermost frame is
SBCL's allocation trampoline (SB-VM::ALLOC-TRAMP, LIST-ALLOC-TRAMP), which would take every self
sample, so it is the innermost function of the user's code under it (past SBCL's own functions,
MAKE-LIST's among them, when the code called one), or of SBCL's when the code has none there.
Frames from the timing on out (CALL-WITH-TIMING, the helper, the evaluator, the server, the
thread) are not counted. Names print as from PACKAGE."
  (let ((self (make-hash-table :test 'equal))
        (cumulative (make-hash-table :test 'equal))
        (samples 0)
        (map-pc-locs (sprof-symbol "MAP-TRACE-PC-LOCS"))
        (debug-fun-name (sbcl-internal "SB-DI" "DEBUG-FUN-NAME"))
        (timing (sbcl-internal "SB-IMPL" "CALL-WITH-TIMING")))
    (funcall (sprof-symbol "MAP-TRACES")
             (lambda (thread trace)
               (declare (ignore thread))
               (incf samples)
               (let ((names '()))
                 ;; Frames come outermost first; a symbol is an assembly routine, a string a C
                 ;; function of the runtime.
                 (funcall map-pc-locs
                          (lambda (info pc)
                            (declare (ignore pc))
                            (unless (or (symbolp info) (stringp info))
                              (push (funcall debug-fun-name info) names)))
                          trace)
                 (let* ((code (loop for name in names
                                    until (or (own-frame-p name) (eq name timing))
                                    unless (evaluator-frame-p name)
                                      collect name))
                        (users (if (string= mode "alloc")
                                   (member-if-not (lambda (name)
                                                    (or (implementation-internal-p name)
                                                        (standard-function-name-p name)))
                                                  code)
                                   code)))
                   (when code
                     (incf (gethash (first (or users code)) self 0)))
                   (dolist (name (remove-duplicates code :test #'equal))
                     (incf (gethash name cumulative 0))))))
             (symbol-value (sprof-symbol "*SAMPLES*")))
    (flet ((percent (count) (format nil "~,1F" (if (plusp samples) (/ (* 100 count) samples) 0))))
      (let ((rows (loop for name being the hash-keys of cumulative using (hash-value total)
                        collect (list name (gethash name self 0) total))))
        (setf rows (sort rows (lambda (a b) (or (> (second a) (second b))
                                                (and (= (second a) (second b)) (> (third a) (third b)))))))
        (values (loop for (name own total) in rows
                      repeat *max-profile-rows*
                      collect (list :name (print-briefly name :package package :length nil :level nil)
                                    :self own
                                    :self-percent (percent own)
                                    :cumulative total
                                    :cumulative-percent (percent total)))
                samples)))))

(defun read-code-forms (code package)
  "The forms of CODE, read in PACKAGE."
  (let ((*package* package) (forms '()) (eof '#:eof))
    (with-input-from-string (in code)
      (loop (let ((form (read in nil eof)))
              (when (eq form eof) (return (nreverse forms)))
              (push form forms))))))

(defun sum-timings (a b)
  "The timings A and B (plists as SB-IMPL::CALL-WITH-TIMING gives them) added up: the counts
summed, :ABORTED when either was."
  (loop for (key value) on (or b a) by #'cddr
        for other = (getf a key)
        nconc (list key (if (and (numberp value) (numberp other)) (+ value other) (or value other)))))

(defun run-measured (forms package profiling)
  "Runs FORMS in PACKAGE one by one, as EVAL takes them, each compiled before it runs and the
run alone measured by SBCL's timing (TIME's), under sb-sprof with PROFILING (a mode, or NIL): the
compiler's time and allocation, and the profiler's and the helper's own, are not the code's.
Compiled one at a time, so that a form sees what the forms before it defined. Returns the values
of the last form and the timings summed."
  (let ((timing (sbcl-internal "SB-IMPL" "CALL-WITH-TIMING"))
        ;; Compiled here, sb-sprof being loaded on first use, after the helper.
        (profiled (if profiling
                      (compile nil `(lambda (run)
                                      (,(sprof-symbol "WITH-PROFILING")
                                       (:mode ,profiling :sample-interval 0.001 :max-samples 200000
                                        :threads (list sb-thread:*current-thread*) :report nil)
                                       (funcall run))))
                      #'funcall))
        (total nil)
        (values nil))
    (dolist (form (top-level-forms forms) (values values total))
      ;; Named in the helper's package, the form's function is cut off the profile's stacks
      ;; with the helper's own frames.
      (let ((function (let ((*package* package))
                        (compile nil `(sb-int:named-lambda profiled-form () ,form)))))
        (funcall profiled
                 (lambda ()
                   (funcall timing
                            (lambda (&rest timings) (setf total (sum-timings total timings)))
                            (lambda () (setf values (multiple-value-list (funcall function)))))))))))

(defun top-level-forms (forms)
  "FORMS with each PROGN's subforms in its place, as EVAL takes them one by one: a macro one of
them defines is defined when the next is compiled."
  (loop for form in forms
        if (and (consp form) (eq (first form) 'progn))
          append (top-level-forms (rest form))
        else
          collect form))

(define-entry profile-code (code &key (mode "cpu") package session token (max-output 65536))
  "The profile tool: runs CODE (evaluated form by form in PACKAGE or the session's package) once,
under sb-sprof (MODE \"cpu\" or \"alloc\") or TIME (\"time\"). The figures are those of the code's
own run (RUN-MEASURED), the same that TIME's report gives. Returns (:MODE :MILLISECONDS :BYTES
:GC-MILLISECONDS :SAMPLES :ROWS :TIME-REPORT :VALUE :STDOUT)."
  (let ((stdout (make-capture max-output))
        (*max-output* max-output)
        (*handles* (session-handles session)))
    (let ((result
            (run-tool
             token
             (lambda ()
               (let ((package (tool-package package session))
                     (rows nil)
                     (samples 0))
                 (unless (member mode '("cpu" "alloc" "time") :test #'string=)
                   (fail "Unknown mode ~S: use cpu, alloc or time." mode))
                 (multiple-value-bind (values timings)
                     (if (string= mode "time")
                         (run-measured (read-code-forms code package) package nil)
                         (sb-thread:with-mutex (*profile-lock*)
                           ;; Under the lock too: another profile's REQUIRE under way has made
                           ;; the package, but not yet its functions.
                           (ensure-sb-sprof)
                           (funcall (sprof-symbol "RESET"))
                           (multiple-value-prog1
                               (run-measured (read-code-forms code package) package
                                             (if (string= mode "cpu") :cpu :alloc))
                             (multiple-value-setq (rows samples) (profile-rows mode package)))))
                   (list :mode mode
                         :milliseconds (getf timings :real-time-ms 0)
                         :bytes (getf timings :bytes-consed 0)
                         :gc-milliseconds (getf timings :gc-run-time-ms 0)
                         :samples samples
                         :rows rows
                         :time-report (and (string= mode "time")
                                           (with-output-to-string (*trace-output*)
                                             (apply (sbcl-internal "SB-IMPL" "PRINT-TIME") timings)))
                         :value (and values (print-briefly (first values) :package package))))))
             :stdout stdout)))
      (append result (list :stdout (capture-report stdout))))))
