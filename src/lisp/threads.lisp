;;;; The threads tool: the image's threads, a thread's backtrace, interrupting or ending a thread
;;;; the agent started, and how a thread waits (in a debugger, on a lock).

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; The threads tool

(defun thread-number (thread)
  "THREAD's number as the person's M-x slime-list-threads (or sly-list-threads) shows it: the
server backend's THREAD-ID, which numbers a thread the first time it is asked and keeps that number
for the thread's life. An image without a server's backend gets the helper's own numbers."
  (let* ((server (or (current-server) (first (servers))))
         (thread-id (and server (server-thread-id-function server))))
    (or (and thread-id (ignore-errors (funcall thread-id thread)))
        (gethash thread *thread-numbers*)
        (setf (gethash thread *thread-numbers*)
              (1+ (sb-ext:atomic-incf (car *thread-number-counter*)))))))

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
          (debugger (thread-debugger thread)))
      (cond (parked
             (format nil "waits in swank-mcp's debugger (~A)" (standard-condition-name (parked-condition parked))))
            (debugger
             (destructuring-bind (&key level condition front-end &allow-other-keys) debugger
               (format nil "waits in the ~A debugger, level ~D~@[ (~A)~]"
                       front-end level
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
    (loop for frame = (sbcl-call :top-frame) then (sbcl-call :frame-down frame)
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

(define-entry (threads :caller :server) (&key (action "list") thread force session token)
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
