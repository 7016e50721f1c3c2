;;;; The trace tool: calls of traced functions come back in the [trace] section of the agent's
;;;; next evaluations. What is traced is traced with a report function of ours, inert outside the
;;;; agent's tool calls.
;;;;
;;;; Loaded before evaluate.lisp (src/image/helper.rs lists the order), whose EVALUATE binds the
;;;; specials defined here: read before their DEFVAR, those bindings would be lexical.

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
   (test :initarg :test :initform nil :reader wide-trace-test
         :documentation "The agent's condition over a call's arguments (RUN-CONDITION), or NIL to
record every call.")
   (passed :initform (make-hash-table :test 'eq :weakness :key :synchronized t) :reader wide-trace-passed
           :documentation "Thread -> the depths of its calls under way that the condition passed
over, innermost first: their returns are passed over too.")
   (session :initarg :session :reader wide-trace-session))
  (:documentation "A session's trace of calls made by other threads than its evaluations' (the
trace tool's threads argument): kept until its next evaluate-lisp reply takes them."))

(defun start-wide-trace (session specs thread max-calls seconds package &optional test)
  "Records, for SESSION, the calls of SPECS that other threads make (THREAD's only, when given),
those TEST holds for if it is given, until MAX-CALLS calls or SECONDS have passed; replaces the
session's earlier one."
  (let ((trace (make-instance 'wide-trace
                              :log (make-instance 'trace-log :package package)
                              :thread thread
                              :test test
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
              ((passed-over-p trace depth kind values))
              ((and (eq kind :enter) (zerop depth)
                    (<= (sb-ext:atomic-decf (car (wide-trace-calls-left trace))) 0))
               (setf (wide-trace-ended trace) :calls))
              (t
               (let ((*trace-log* (wide-trace-log trace))
                     (*wide-trace-thread* (safe-princ (sb-thread:thread-name sb-thread:*current-thread*))))
                 (record-trace-event depth name kind nil values))))))))

(defun passed-over-p (trace depth kind values)
  "Whether TRACE's condition passes over this event of the current thread: a call (:ENTER, VALUES
its arguments) it does not hold for, or the return of one."
  (let ((test (wide-trace-test trace))
        (thread sb-thread:*current-thread*))
    (when test
      (let ((passed (wide-trace-passed trace)))
        (if (eq kind :enter)
            (unless (eq (run-condition test (wide-trace-session trace) values) t)
              (push depth (gethash thread passed))
              t)
            (when (eql (first (gethash thread passed)) depth)
              (pop (gethash thread passed))
              t))))))

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

(define-entry (trace-functions :caller :server) (functions &key untrace package threads condition (max-calls 1000)
                                                            (seconds 300) session token)
  "The trace tool: traces FUNCTIONS (texts of names) for SESSION, or with UNTRACE untraces them
(all of SESSION's when FUNCTIONS is empty). THREADS, \"all\" or a thread as the threads tool names
it, records the calls other threads make too, those CONDITION (code over the one function's
parameters by name) holds for when it is given, until MAX-CALLS calls or SECONDS have passed.
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
             (let ((thread (and threads (not (string-equal threads "all")) (find-thread threads)))
                   (test (and condition
                              (if (and threads (= (length specs) 1) (symbolp (first specs)))
                                  (condition-test condition (first specs)
                                                  (or (symbol-package (first specs)) package))
                                  (fail "A condition watches one function (not a method) in other threads: give ~
                                         one of `functions`, and `threads`.")))))
               (dolist (spec specs)
                 (trace-spec spec)
                 (sb-thread:with-mutex ((session-lock session))
                   (pushnew spec (session-traces session) :key #'spec-key :test #'string=)))
               (when threads
                 (start-wide-trace session specs thread max-calls seconds package test)
                 (when test
                   (ensure-condition-watchdog)))
               (list :traced (names (session-traces session))
                     :untraced nil
                     :max-events *max-trace-events* :max-depth *max-trace-depth*
                     :other-threads (and threads
                                         (format nil "~:[every thread~;~:*thread ~A~]: ~{~A~^, ~}~@[ when ~A~], for ~
                                                      ~:D s or ~:D calls, whichever comes first"
                                                 (and thread (format nil "~D ~S" (thread-number thread)
                                                                     (safe-princ (sb-thread:thread-name thread))))
                                                 (names specs) condition seconds max-calls))))))))))
