;;;; The profile tool: a form's time, allocation and (with sb-sprof, required on first use) its
;;;; statistical profile.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; The profile tool

(defparameter *max-profile-rows* 15)

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
        (debug-fun-name (needed-internal :debug-fun-name))
        (timing (needed-internal :call-with-timing)))
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
  (let ((timing (needed-internal :call-with-timing))
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
                        (compile nil `(,(needed-internal :named-lambda) profiled-form () ,form)))))
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

(define-entry (profile-code :caller :server) (code &key (mode "cpu") package session token (max-output 65536))
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
                                             (apply (needed-internal :print-time) timings)))
                         :value (and values (print-briefly (first values) :package package))))))
             :stdout stdout)))
      (append result (list :stdout (capture-report stdout))))))
