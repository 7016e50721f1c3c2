;;;; The debugger tool: requests that run in a thread parked in the server's debugger (see PARK in
;;;; tool-calls.lisp), sent by the Rust side to that thread as SLIME sends SLDB's requests. They run
;;;; inside the parked evaluation's dynamic extent, so *PARKED* and *EVALUATION* are the ones it
;;;; parked with, and frame numbers are the server's debugger's (frame 0 is where the condition
;;;; was signalled).
;;;;
;;;; Frames are reached through the server's backend (servers.lisp's BACKEND- functions): it knows
;;;; the debugger's stack top, and how to evaluate in, restart and return from a frame of this
;;;; SBCL.

(in-package #:mcp-agent-helper)

(defparameter *max-local-length* 300
  "Characters of a local's printed value shown in a frame's description.")

(defun debugger-command (function)
  "Runs FUNCTION for a debugger request. Errors inside it are reported, never debugged: a
nested error never parks a second level. Returns its plist, (:FAILURE message) or (:ERROR report)."
  (if (null *parked*)
      (list :failure "This thread is not waiting in swank-mcp's debugger.")
      (let ((outcome (handler-case (call-trapping-debugger function)
                       (tool-failure (failure)
                         (list :failure (tool-failure-message failure))))))
        (case (first outcome)
          (:ok (second outcome))
          (:failure outcome)
          (t (list :error outcome))))))

(defun frame-package (index)
  "The package of frame INDEX's function, as SLIME reads and prints in that frame (the backend's
FRAME-PACKAGE), or the package the evaluation was in when the frame's function has none."
  (or (ignore-errors (backend-frame-package index))
      (parked-package *parked*)))

(defun read-forms (code &optional (package (parked-package *parked*)))
  "The forms of CODE, read in PACKAGE: by default the one the evaluation was in when it stopped."
  (let ((*package* package)
        (eof '#:eof))
    (with-input-from-string (in code)
      (loop for form = (read in nil eof)
            until (eq form eof)
            collect form))))

(defun frame-call (frame)
  "FRAME's call as text, its symbols printed as seen from the package the evaluation was in, and
the function's name."
  (multiple-value-bind (name args) (frame-call-of frame (parked-condition *parked*))
    (values (let ((*package* (parked-package *parked*))) (print-frame name args)) name)))

(defun user-frames (end)
  "The evaluation's frames, from frame 0 to END (exclusive; NIL for all), as (index frame name),
innermost first, down to the evaluated code: the helper's and the evaluator's frames below it,
and the server's, are left out, as in every backtrace this helper prints. Always counted from
frame 0, which tells the helper's frames above the user's from those below them. In a thread of
the image's own the helper's frames (a breakpoint's stop) stand between the person's, which all
count."
  (let ((frames '())
        (seen-user-frame nil)
        (image-thread (parked-image-thread-p *parked*)))
    (loop for frame in (backend-compute-backtrace 0 end)
          for index from 0
          do (let ((name (frame-call-of frame (parked-condition *parked*))))
               (cond ((own-frame-p name)
                      (when (and seen-user-frame (not image-thread)) (loop-finish)))
                     (t
                      (unless (implementation-internal-p name)
                        (setf seen-user-frame t))
                      (push (list index frame name) frames)))))
    ;; A thread of the image's own (see ATTACHED) has SBCL's thread start under its code, never
    ;; the agent's business: left out as the evaluator's frames are.
    (loop while (and frames (rest frames)
                     (implementation-internal-p (third (first frames)))
                     (not (evaluator-frame-p (third (first frames)))))
          do (pop frames))
    (let ((innermost-evaluator nil))
      (loop while (and frames (evaluator-frame-p (third (first frames))))
            do (setf innermost-evaluator (pop frames)))
      ;; Code evaluated at top level, such as (error ...) itself, has no frame of its own: the
      ;; evaluator's frame that runs the form stands for it, so that the frame actions still work.
      (when (and (null frames) innermost-evaluator)
        (push innermost-evaluator frames)))
    (nreverse frames)))

(defun debugger-frames (start end)
  "The evaluation's frames numbered START to END (exclusive) as (index call)."
  (loop for (index frame) in (user-frames end)
        when (>= index start)
          collect (list index (frame-call frame))))

(defun check-user-frame (index)
  "Fails unless frame INDEX is one of the evaluation's: the helper's, the evaluator's and the
server's frames below the user's code are not the agent's to look at or act on."
  (let ((indices (mapcar #'first (user-frames nil))))
    (unless (member index indices)
      (if indices
          (fail "Frame ~D is not one of the evaluation's: its frames are ~{~D~^, ~}~:[~;, ...~] (the last, ~D, ~
                 is the outermost call of the evaluated code; below it are the evaluator's, swank-mcp's and ~
                 the server's). The backtrace action lists them."
                index (subseq indices 0 (min 10 (length indices))) (> (length indices) 10) (car (last indices)))
          (fail "Frame ~D is not one of the evaluation's, and no frame of the evaluated code is on the stack." index)))))

(defun replaced-definition-p (name function)
  "True when FUNCTION is code NAME, a global function's name, was defined as before its current
definition: a frame running it, or a value holding it, goes on with the old code. A traced or
breakpointed name (its definition a closure) says nothing either way."
  (and (symbolp name) name (fboundp name) (not (macro-function name))
       (functionp function)
       (let ((current (fdefinition name)))
         (and (not (sbcl-call :closurep current))
              (not (sbcl-call :closurep function))
              (not (eq current function))))))

(defun runs-replaced-definition-p (frame name)
  "Whether FRAME, a frame of the function NAME, runs a definition of it replaced since it was
entered."
  (replaced-definition-p name (ignore-errors (sbcl-call :debug-fun-fun (sbcl-call :frame-debug-fun frame)))))

(defun older-definition-lines (start end)
  "Lines naming, among the frames numbered START to END, those that run a definition replaced since
they were entered, and those that hold a replaced function in a local (REDUCE's :KEY, a callback):
after a fix, they go on with the old code."
  (let ((lines '()))
    (loop for (index frame name) in (user-frames end)
          when (>= index start)
            do (when (runs-replaced-definition-p frame name)
                 (push (format nil "Frame ~D runs the definition of ~A from before its last redefinition: ~
                                    restart_frame ~D calls the current one."
                               index (qualified-name name) index)
                       lines))
               (dolist (local (ignore-errors (backend-frame-locals index)))
                 (let* ((value (getf local :value))
                        (held (and (functionp value) (ignore-errors (sbcl-call :%fun-name value)))))
                   (when (replaced-definition-p held value)
                     (push (format nil "Frame ~D holds the definition of ~A from before its last redefinition in ~
                                        ~A: it calls the old code until that frame, or one above it that passes ~
                                        the function, is restarted."
                                   index (qualified-name held)
                                   (let ((*package* (frame-package index))) (prin1-to-string (getf local :name))))
                           lines)))))
    (nreverse lines)))

(define-entry (debugger-report :caller :server :attached t) (&key (start 0) (end *max-frames*))
  "What the evaluation stopped with: the condition with its restarts, frames START to END, which of
them run or hold a replaced definition, and the output so far."
  (debugger-command
   (lambda ()
     (let ((condition (parked-condition *parked*))
           (end (max start (min end (+ start 1000)))))
       (list :condition (condition-report (if (typep condition 'error) :error :debugger)
                                          condition nil (parked-restarts *parked*))
             :frames (debugger-frames start end)
             :older (older-definition-lines start end)
             :stdout (captured-so-far (parked-stdout *parked*))
             :stderr (captured-so-far (parked-stderr *parked*)))))))

(defun captured-so-far (stream)
  (if (typep stream 'capture-stream) (capture-report stream) (list "" 0)))

(defun file-line-and-column (file position snippet)
  "The line and column (both from 1) in FILE of a swank location's POSITION and SNIPPET, or NIL.
Swank's SBCL backend counts a frame's position from 0 and a definition's from 1 (its fallback for
code without debug blocks); both read SNIPPET at the character the location means, so the text
says which count this one is."
  (ignore-errors
   (let* ((text (with-open-file (in file :external-format :utf-8 :element-type 'character)
                  (let ((text (make-string (file-length in))))
                    (subseq text 0 (read-sequence text in)))))
          (probe (and (stringp snippet) (subseq snippet 0 (min 40 (length snippet)))))
          (offset (flet ((at-p (offset)
                           (and (<= 0 offset (length text))
                                (string= probe text :start2 offset :end2 (min (length text) (+ offset (length probe)))))))
                    (cond ((null probe) (1- position))
                          ((at-p (1- position)) (1- position))
                          ((at-p position) position)
                          (t (1- position)))))
          (offset (max 0 (min offset (length text))))
          (line-start (let ((newline (position #\Newline text :end offset :from-end t)))
                        (if newline (1+ newline) 0))))
     (list (1+ (count #\Newline text :end offset)) (1+ (- offset line-start))))))

(defun location-text (location)
  "A swank source location as file:line:column, or what there is instead."
  (flet ((part (key) (rest (assoc key (rest location)))))
    (cond ((and (consp location) (eq (first location) :error))
           (format nil "unknown (~A)" (second location)))
          ((not (and (consp location) (eq (first location) :location)))
           "unknown")
          ((part :file)
           (let* ((file (first (part :file)))
                  (position (first (part :position)))
                  (line-and-column (and (integerp position)
                                        (file-line-and-column file position (first (part :snippet))))))
             (if line-and-column
                 (format nil "~A:~{~D:~D~}" file line-and-column)
                 file)))
          ((part :buffer) (format nil "Emacs buffer ~A" (first (part :buffer))))
          ((part :source-form) "no file (evaluated, not loaded from a file)")
          (t "unknown"))))

(defun location-source (location)
  "The source text a swank location carries: the snippet at a file position, or the whole form
of code that was evaluated rather than loaded from a file."
  (flet ((part (key) (first (rest (assoc key (rest location))))))
    (let ((text (and (consp location) (eq (first location) :location)
                     (or (part :source-form) (part :snippet)))))
      (and (stringp text) (string-right-trim '(#\Space #\Newline) text)))))

(define-entry (debugger-frame :caller :server :attached t) (index)
  "Frame INDEX: its call, its locals printed within the print limits, where its code is (swank's
place and snippet, and its definition's place, see FRAME-DEFINITION), and whether it runs a
definition replaced since (its file then shows the new text, not the code the frame runs)."
  (debugger-command
   (lambda ()
     (check-user-frame index)
     (let ((frame (first (backend-compute-backtrace index (1+ index))))
           (location (ignore-errors (backend-frame-source-location index))))
       (multiple-value-bind (call name) (frame-call frame)
         (list :call call
               :replaced (and (runs-replaced-definition-p frame name) t)
               ;; Named as seen from the frame's package, in which eval_in_frame reads them.
               :locals (loop with package = (frame-package index)
                             for local in (backend-frame-locals index)
                             collect (list (let ((*package* package))
                                             (prin1-to-string (getf local :name)))
                                           (local-value-text (getf local :value))))
               :location (location-text location)
               :source (let ((source (location-source location)))
                         (and source (first-form-text source)))
               :definition (frame-definition frame name)))))))

(defun frame-definition (frame name)
  "Where the code FRAME runs was compiled from, for the server to find it again in the file's
current text: (:NAME name as xref's hits give it :LOCATION as SOURCE-LOCATION gives it, noted when
the file changed since), or NIL when SBCL recorded no file. Swank reads a frame's place against
the file as it is now, where lines added above put another form."
  (let* ((function (ignore-errors (sbcl-call :debug-fun-fun (sbcl-call :frame-debug-fun frame))))
         (source (and function (ignore-errors (sb-introspect:find-definition-source function)))))
    (and source
         (sb-introspect:definition-source-pathname source)
         (list :name (name-text name (load-time-value (find-package '#:keyword)))
               :location (source-location source name)))))

(defun first-form-text (text)
  "TEXT up to the end of the form it starts with: a source snippet is cut at a fixed length, and
would run on into the next definition. All of TEXT when that form does not end within it."
  (handler-case
      (with-input-from-string (in text)
        (let ((*read-suppress* t)
              (*read-eval* nil))
          (read-preserving-whitespace in)
          (subseq text 0 (file-position in))))
    (error () text)))

(defun local-value-text (value)
  "VALUE of a local as a frame's locals show it: printed within *MAX-LOCAL-LENGTH*, and when cut,
the handle of its whole printed text. (A local shown whole gets no handle: the lines would be
long with them, and most locals are never looked into.)"
  (destructuring-bind (text dropped &rest more)
      (let ((*handles* nil))
        (print-value value *max-local-length*))
    (declare (ignore more))
    (if (zerop dropped)
        text
        (destructuring-bind (text dropped &optional more (offset 0) handle tail (lost 0))
            (print-value value *max-local-length*)
          (declare (ignore handle tail))
          (if more
              (format nil "~A ... [~:D more characters~:[~*~;, ~:D of them kept~]: inspect ~A with offset ~D]"
                      text dropped (plusp lost) (- dropped lost) more offset)
              (concatenate 'string text " ..."))))))

(define-entry (debugger-eval-in-frame :caller :server :attached :agent-code) (code index)
  "Evaluates the forms of CODE, read in the frame's package, in frame INDEX with its locals in
scope; returns the last form's printed values, what it printed and its warnings. The warnings are
muffled here: the parked evaluation's handlers, which are still in force, would otherwise put them
in the reply of the evaluation once it resumes (and *FRAME-EVALUATION* keeps them from recording
a compile-time error, which cannot be muffled)."
  (debugger-command
   (lambda ()
     (check-user-frame index)
     (let ((stdout (make-capture *max-output*))
           (values '())
           (warnings '()))
       (flet ((record (condition)
                (unless (or (muffled-by-sbcl-p condition)
                            (member condition warnings :key #'car))
                  (push (cons condition (warning-text condition)) warnings))
                (let ((muffle (find-restart 'muffle-warning condition)))
                  (when muffle (invoke-restart muffle)))))
         (handler-bind ((warning #'record)
                        (condition (lambda (condition)
                                     (when (compile-time-error-p condition)
                                       (record condition)))))
           (let ((*standard-output* stdout)
                 (*frame-evaluation* t))
             (dolist (form (read-forms code (frame-package index)))
               (setf values (multiple-value-list (backend-eval-in-frame form index)))))))
       (list :values (mapcar (lambda (value) (print-value value *max-output*)) values)
             :stdout (capture-report stdout)
             :warnings (mapcar #'cdr (reverse (last warnings *max-warnings*))))))))

(defun find-parked-restart (designator)
  "The parked evaluation's restart numbered DESIGNATOR, or named it (a string, any case)."
  (let* ((restarts (parked-restarts *parked*))
         (named (lambda (name)
                  (find name restarts
                        :key (lambda (r) (if (restart-name r) (symbol-name (restart-name r)) ""))
                        :test #'string-equal)))
         (restart (if (integerp designator)
                      (and (< -1 designator (length restarts)) (nth designator restarts))
                      ;; The continue action goes on from a step as from a breakpoint.
                      (or (funcall named designator)
                          (and (string-equal designator "CONTINUE") (funcall named "STEP-CONTINUE"))))))
    (cond ((and (null restart) (null restarts))
           (fail "There is no restart ~A: this evaluation offers none (no RESTART-CASE or WITH-SIMPLE-RESTART ~
                  around the error, and the server's own restarts back to its top level are not the code's). ~
                  Go on with return_from_frame or restart_frame, or end the evaluation with the abort action."
                 designator))
          ((null restart)
           (fail "There is no restart ~A. The restarts are:~%~{~A~^~%~}" designator
                 (loop for (name report) in (restart-reports restarts)
                       for i from 0
                       collect (format nil "~D: [~A] ~A" i name report))))
          ((not (member restart (compute-restarts (parked-condition *parked*))))
           (fail "The restart ~A is no longer active." designator))
          (t restart))))

(define-entry (debugger-invoke-restart :caller :server :attached :agent-code) (designator &optional arguments)
  "Invokes the restart DESIGNATOR (a number or a name) with the values of ARGUMENTS, forms as
strings evaluated in order. Returns only when the restart does."
  (debugger-command
   (lambda ()
     (let* ((restart (find-parked-restart designator))
            (values (loop for text in arguments
                          append (mapcar #'eval (read-forms text)))))
       (apply #'invoke-restart restart values)
       (list :returned t)))))

(define-entry (debugger-restart-frame :caller :server :attached t) (index)
  "Restarts frame INDEX: its function is called again with the same arguments."
  (debugger-command
   (lambda ()
     (check-user-frame index)
     (backend-restart-frame index)
     (fail "Frame ~D cannot be restarted (it may have been compiled with too little debug ~
            information: (declaim (optimize (debug 2))) and recompile)." index))))

(define-entry (debugger-return-from-frame :caller :server :attached :agent-code) (index code)
  "Makes frame INDEX return the values of CODE's last form, evaluated in that frame."
  (debugger-command
   (lambda ()
     (check-user-frame index)
     (let* ((forms (read-forms code (frame-package index)))
            (form (if (rest forms) `(progn ,@forms) (first forms)))
            (outcome (backend-return-from-frame index form)))
       (fail "Could not return from frame ~D: ~A" index outcome)))))

(define-entry (debugger-abort :caller :server :attached t) ()
  "Unwinds the parked evaluation; its call reports that it was aborted. In a thread of the image's
own (see ATTACHED), invokes its ABORT restart, as SLDB's abort does."
  (debugger-command
   (lambda ()
     (if *evaluation*
         (abort-evaluation *evaluation*
                           (interruption-report :aborted "The evaluation was aborted from the debugger." nil))
         (let ((abort (find 'abort (parked-restarts *parked*) :key #'restart-name)))
           (if abort
               (invoke-restart abort)
               (fail "The thread has no ABORT restart: invoke one of its restarts instead."))))
     (fail "The evaluation could not be aborted: it has already finished."))))

(define-entry (debugger-step :caller :server :attached t) (kind index)
  "Steps the stopped thread as SLDB's s, x and o do (KIND \"into\", \"over\" or \"out\"), through the
server's own stepper commands: from a step, the next one; from a stop with a CONTINUE restart (a
breakpoint, BREAK), SBCL's stepper is turned on and the thread continues to its first step. Returns
only when it could not step."
  (debugger-command
   (lambda ()
     (let* ((server (current-server))
            (step (and server (server-step-function server kind))))
       (unless (member kind '("into" "over" "out") :test #'string=)
         (fail "Unknown step ~S: use into, over or out." kind))
       (unless step
         (fail "The swank or slynk server in this image has no command to step ~A, which stepping needs." kind))
       (funcall step index)
       (fail "The thread could not be stepped from here.")))))
