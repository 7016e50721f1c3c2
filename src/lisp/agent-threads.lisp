;;;; The threads the agent starts: their output and unhandled errors come back in a
;;;; [background] section of the agent's next evaluation. The encapsulation of SBCL's
;;;; START-THREAD that does it is installed with the rest of the footprint (footprint.lisp).

(in-package #:mcp-agent-helper)

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
                    :gone nil
                    :stop (and waits (stop-number condition))
                    ;; Taken out by TAKE-BACKGROUND, which tells from it whether the stop is still
                    ;; there.
                    :waiting-thread (and waits sb-thread:*current-thread*)
                    :attach (and waits
                                 (let ((id (server-thread-id sb-thread:*current-thread*)))
                                   (and id (list id (thread-number sb-thread:*current-thread*)
                                                 (stop-number condition))))))
              (background-errors background)))))

(defun stop-as-it-is-now (report)
  "REPORT, a thread's stop as RECORD-BACKGROUND-ERROR noted it, as it is now: a thread that has
surely left the stop since (it ended, or waits at another stop) is said to have, and is no longer
offered to attach to."
  (destructuring-bind (&key waiting-thread attach stop &allow-other-keys) report
    ;; A thread in no debugger may be on its way into the one it was noted for: only one that
    ;; ended, or waits at another stop, has surely left it.
    (let ((gone (and waiting-thread attach
                     (or (not (sb-thread:thread-alive-p waiting-thread))
                         (let ((now (ignore-errors (thread-stop waiting-thread))))
                           (and now stop (/= now stop)))))))
      (loop for (key value) on report by #'cddr
            unless (eq key :waiting-thread)
              append (list key (if (and gone (member key '(:gone :waits :attach)))
                                   (eq key :gone)
                                   value))))))

(defun take-background (session)
  "What SESSION's agent threads printed and their errors since the last reply, taken (the buffer
is emptied): (:OUTPUT (text dropped) :ERRORS reports :ERRORS-DROPPED n)."
  (let ((background (session-background-slot session)))
    (if (null background)
        (list :output (list "" 0) :errors nil :errors-dropped 0)
        (sb-thread:with-mutex ((background-lock background))
          (prog1 (list :output (capture-report (background-output background))
                       :errors (mapcar #'stop-as-it-is-now (reverse (background-errors background)))
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
