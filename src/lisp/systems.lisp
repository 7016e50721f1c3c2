;;;; load-system: ASDF's LOAD-SYSTEM with its output and compiler warnings captured, and a way
;;;; for the client to see what a long load is doing meanwhile.
;;;;
;;;; ASDF is required when a system is first
;;;; loaded, not when the helper is, and is called through FIND-SYMBOL: the helper must load in
;;;; an image without it.

(in-package #:mcp-agent-helper)

(defparameter *max-system-warnings* 50)

(defun asdf-function (name)
  (let ((symbol (find-symbol name '#:asdf)))
    (if (and symbol (fboundp symbol))
        (symbol-function symbol)
        (fail "This image's ASDF has no ~A." name))))

(defun ensure-asdf ()
  (unless (find-package '#:asdf)
    (handler-case (require :asdf)
      (error (e) (fail "ASDF is not available in this image: ~A" (condition-message e))))))

(defun file-being-processed ()
  "The file the current thread compiles or loads, as text."
  (let ((file (or *compile-file-truename* *load-truename*)))
    (and file (ignore-errors (sb-ext:native-namestring file)))))

(define-entry (load-activity :caller :server) (&key session token)
  "What the session's running load-system is doing, for progress reports: (:ACTIVITY text), the
text \"compiling FILE\", \"loading FILE\" or NIL."
  (declare (ignore token))
  (let ((thread (session-loading-thread (find-session session))))
    (flet ((file-of (variable)
             (multiple-value-bind (value ok) (sb-thread:symbol-value-in-thread variable thread nil)
               (and ok value (ignore-errors (sb-ext:native-namestring value))))))
      (list :activity
            (when (and thread (sb-thread:thread-alive-p thread))
              (let ((compiling (file-of '*compile-file-truename*)))
                (if compiling
                    (format nil "compiling ~A" compiling)
                    (let ((loading (file-of '*load-truename*)))
                      (and loading (format nil "loading ~A" loading))))))))))

(defun asdf-summary-warning-p (condition)
  "True for the warning ASDF adds after a file compiled with warnings: it repeats them."
  (let ((name (class-name (class-of condition))))
    (and (symbolp name)
         (member (symbol-name name) '("COMPILE-WARNED-WARNING" "COMPILE-FAILED-WARNING") :test #'string=)
         (eql 0 (search "UIOP" (package-name (symbol-package name)))))))

(defun asdf-frame-p (line)
  "True for a backtrace line of a function of ASDF or UIOP (packages ASDF/... and UIOP/...)."
  (let* ((end (if (and (> (length line) 1) (char= (char line 1) #\())
                  (position #\) line)
                  (position #\Space line)))
         (head (subseq line 0 (or end (length line)))))
    (or (search "ASDF/" head) (search "UIOP/" head))))

(defun without-asdf-frames (report)
  "REPORT with its backtrace cut at ASDF's machinery: what failed inside the system's own code
is above it, and twenty frames of ASDF planning say nothing about the system."
  (when report
    (setf (getf report :backtrace)
          (loop for line in (getf report :backtrace)
                until (asdf-frame-p line)
                collect line)))
  report)

(defun abandoned-load-error (report)
  "The error REPORT of a load that failed, as load-system's reply tells it: without ASDF's frames,
and without restarts, since the load was unwound before the reply went out and ASDF's retry and
accept went with it."
  (let ((report (without-asdf-frames report)))
    (when report
      (setf (getf report :restarts) nil))
    report))

(defun warning-place (context)
  "The lines that say where the compiler CONTEXT is: the form, and file:line:column of the source
file (never the fasl), or just the file being processed when there is no context."
  (if (null context)
      (let ((file (file-being-processed))) (if file (format nil "~%  (in ~A)" file) ""))
      (let* ((name (or (context-slot context :compiler-error-context-file-name) *compile-file-truename*))
             (file (and (typep name '(or pathname string)) (ignore-errors (source-pathname-text name))))
             (compiling (and *compile-file-truename*
                             (ignore-errors (sb-ext:native-namestring *compile-file-truename*)))))
        ;; The subform is found by reading the file in the current package, which is the file's
        ;; own only while that file is being compiled.
        (let ((*compile-file-truename* (and file (equal file compiling) *compile-file-truename*)))
          (multiple-value-bind (line column form) (context-location context (and file (file-octets file)))
            (format nil "~@[~%  in form: ~A~]~@[~%  at: ~A~]" form
                    (and file (if line (format nil "~A:~D:~D" file line column) file))))))))

;;; ------------------------------------------------------------------------------------------
;;; Errors the compiler reports on a file: a form it could not compile, a file it could not read

(defun input-error-p (condition)
  "True for SBCL's report of a read error in a file being compiled."
  (let ((class (sbcl-symbol :input-error-in-compile-file)))
    (and class (typep condition class))))

(defun read-error-message (condition)
  "The reader's own complaint inside CONDITION, an input error of COMPILE-FILE, without the
stream SBCL names (the place is given as file:line:column instead), with what exists of a symbol
or package it did not find."
  (let ((cause (or (ignore-errors (sbcl-call :encapsulated-condition condition)) condition))
        (invoker (ignore-errors (sbcl-call :input-error-in-compile-file-invoker condition))))
    (format nil "READ error during ~A: ~A~A" (or invoker "COMPILE-FILE") (reader-error-text cause)
            (unknown-name-hint cause))))

(defun token-delimiter-octet-p (octet)
  (member octet '(9 10 12 13 32 34 39 40 41 44 59 96)))

(defun read-error-octet-position (condition octets)
  "Where in OCTETS, the file being compiled, the read error CONDITION is: the start of the token
the reader stopped after (SBCL gives the position after it), or NIL when SBCL does not say."
  (let* ((info (ignore-errors (sbcl-call :stream-error-position-info (stream-error-stream condition))))
         (position (second (assoc :file-position info))))
    (when (and octets (integerp position) (<= 0 position (length octets)))
      (let ((start position))
        (loop while (and (> start 0) (not (token-delimiter-octet-p (aref octets (1- start)))))
              do (decf start))
        (if (= start position) (max 0 (1- position)) start)))))

(defun compiler-error-text (condition)
  "For SBCL's COMPILER-ERROR (a form the compiler could not process, or a file it could not
read), the text load-system and run-tests show: the compiler's or the reader's own message and
file:line:column. NIL for any other condition, and for a COMPILE the code runs (tests that check
what the compiler refuses): only a file the system is built from is the system's error."
  (let ((class (sbcl-symbol :compiler-error)))
    (when (and class (typep condition class) *compile-file-truename*)
      (let ((cause (or (ignore-errors (sbcl-call :encapsulated-condition condition)) condition)))
        (if (input-error-p cause)
            (let* ((file (file-being-processed))
                   (octets (and file (file-octets file)))
                   (at (read-error-octet-position cause octets)))
              (format nil "ERROR: ~A~@[~%  at: ~A~]" (read-error-message cause)
                      (and file (if at
                                    (multiple-value-bind (line column) (octet-line-and-column octets at)
                                      (format nil "~A:~D:~D" file line column))
                                    file))))
            (format nil "ERROR: ~A~A" (compiler-message cause) (warning-place (compiler-context))))))))

(defun pending-undefined-warnings ()
  "The undefined-function (and -variable, -type) warnings the current compilation unit holds for
its end, as (category text) for LOAD-SYSTEM: an aborted unit drops them. An undefined variable is
a WARNING, the others STYLE-WARNINGs, as SBCL signals them at the unit's end."
  (let ((variable (sbcl-symbol :*undefined-warnings*)))
    (destructuring-bind (&optional name-of kind-of contexts-of)
        (sbcl-symbols :undefined-warning-name :undefined-warning-kind :undefined-warning-warnings)
      (when (and variable (boundp variable) contexts-of)
        (ignore-errors
         (loop for warning in (symbol-value variable)
               for category = (if (eq (funcall kind-of warning) :variable) :warning :style-warning)
               collect (list category
                             (format nil "~A: undefined ~(~A~): ~A~A"
                                     category (funcall kind-of warning) (qualified-name (funcall name-of warning))
                                     (warning-place (first (funcall contexts-of warning)))))))))))

(define-entry (load-system :caller :server) (system &key force session token (max-output 65536))
  "Loads SYSTEM with ASDF for the load-system tool. Returns a plist: :SYSTEM; :WAS-LOADED, whether
it was loaded before; :MILLISECONDS; :WARNINGS, texts of the warnings (capped), :WARNINGS-REST (see
REST-LISTING), :WARNING-COUNT, :STYLE-WARNING-COUNT, :NOTE-COUNT; :ERRORS and :ERROR-COUNT, the
compiler's errors (a form it could not compile, a file it could not read) at file:line:column;
:RELOADED, the files of loaded systems it loaded again (see RELOADED-FILES); :STDOUT (text
dropped); and :LOAD-ERROR, a report when the load failed (its output and warnings are
kept)."
  (let ((stdout (make-capture max-output))
        (*max-output* max-output)
        (*handles* (session-handles session))
        ;; What the system's code starts while it loads runs as the agent's (see exit-guard.lisp).
        (*agent-session* (find-session session))
        (warnings '())
        (errors '())
        (kept 0)
        (counts (list :error 0 :warning 0 :style-warning 0 :note 0)))
    (labels ((note (category text)
               (incf (getf counts category))
               (case category
                 (:note)
                 (:error (when (< (length errors) *max-system-warnings*) (push text errors)))
                 ;; The first warnings are shown, the others kept behind a handle, up to a bound.
                 (t (when (< kept *max-kept-warnings*)
                      (incf kept)
                      (push text warnings)))))
             (record (condition)
               (unless (or (asdf-summary-warning-p condition) (muffled-by-sbcl-p condition))
                 (let ((category (typecase condition
                                   (style-warning :style-warning)
                                   (warning :warning)
                                   (t :note))))
                   (note category (format nil "~A: ~A~A" (warning-category condition) (compiler-message condition)
                                          (warning-place (and (not (eq category :note)) (compiler-context)))))))))
      (let* ((started (get-internal-real-time))
             (was-loaded nil)
             ;; The undefined-function warnings the compilation unit held back when an error
             ;; came: a unit that is aborted never reports them.
             (pending '())
             (reloaded nil)
             (result
               (run-tool
                token
                (lambda ()
                  (ensure-asdf)
                  (let ((found (funcall (asdf-function "FIND-SYSTEM") system nil)))
                    (unless found
                      (fail "System ~S was not found. ASDF looks for ~A.asd in its source registry (by default ~
                             ~~/common-lisp/, ~~/.local/share/common-lisp/source/ and /usr/share/common-lisp/), ~
                             and in the directories listed in ASDF:*CENTRAL-REGISTRY*; add the system's ~
                             directory to one of them, or load its .asd file with ASDF:LOAD-ASD.~A"
                            system (string-downcase system) (did-you-mean (systems-near system))))
                    (setf was-loaded (and (funcall (asdf-function "COMPONENT-LOADED-P") found) t)))
                  (setf (session-loading-thread (find-session session)) sb-thread:*current-thread*)
                  (unwind-protect
                       (let ((*compile-verbose* nil) (*compile-print* nil) (*journal-additions* nil)
                             (*load-verbose* nil) (*load-print* nil)
                             (planned (planned-reloads "LOAD-OP" system))
                             (completed nil))
                         (handler-bind ((condition (lambda (condition)
                                                     (let ((text (compiler-error-text condition)))
                                                       (when text (note :error text)))))
                                        (warning #'record)
                                        (sb-ext:compiler-note #'record)
                                        (error (lambda (e)
                                                 (declare (ignore e))
                                                 (setf pending (pending-undefined-warnings)))))
                           (unwind-protect (progn (funcall (asdf-function "LOAD-SYSTEM") system :force force)
                                                  (setf completed t))
                             (setf reloaded (reloaded-files planned completed))))
                         (list :loaded t))
                    (setf (session-loading-thread (find-session session)) nil)))
                :stdout stdout
                :turn (list *asdf-turn* (format nil "load-system of ~S" system)))))
        (when (getf result :error)
          (loop for (category text) in pending do (note category text)))
        (if (getf result :failure)
            result
            (list :system system
                  :was-loaded was-loaded
                  :milliseconds (round (* 1000 (- (get-internal-real-time) started))
                                       internal-time-units-per-second)
                  :warnings (let ((warnings (reverse warnings)))
                              (subseq warnings 0 (min (length warnings) *max-system-warnings*)))
                  :warnings-rest (rest-listing (reverse warnings) *max-system-warnings*)
                  :errors (reverse errors)
                  :error-count (getf counts :error)
                  :warning-count (getf counts :warning)
                  :style-warning-count (getf counts :style-warning)
                  :note-count (getf counts :note)
                  :reloaded reloaded
                  :stdout (capture-report stdout)
                  :load-error (abandoned-load-error (getf result :error))))))))

;;; ------------------------------------------------------------------------------------------
;;; What a load reloaded
;;;
;;; Loading a system (load-system, or the load a test-op makes first) makes ASDF compile and load
;;; again every file of a loaded system that changed since it was loaded, and the files that
;;; depend on it: their definitions replace the image's, among them any the user changed only in
;;; the image. The replies say which files; the undo journal (undo.lisp) has what they replaced.
;;; Which files is known from ASDF's plan, made before the load: the stamps it keeps are write
;;; dates in seconds, which a file compiled twice within a second leaves as they were.

(defun asdf-symbol (name)
  (find-symbol name '#:asdf))

(defun planned-reloads (operation system)
  "Before ASDF performs OPERATION (a name: \"LOAD-OP\", \"TEST-OP\") on SYSTEM: the number the
next journal entry gets, followed by each source file of a loaded system that its plan loads
again, as (component load-stamp compile-stamp recompiled): its stamps now, and whether the plan
compiles it again. Nothing when ASDF cannot say."
  (cons (symbol-value '*next-journal-number*) ; the journal is defined after this file
        (ignore-errors
         (let* ((time (asdf-symbol "COMPONENT-OPERATION-TIME"))
                (make-operation (asdf-function "MAKE-OPERATION"))
                (load-op (funcall make-operation (asdf-symbol "LOAD-OP")))
                (compile-op (funcall make-operation (asdf-symbol "COMPILE-OP")))
                (plan (funcall (asdf-symbol "CALL-WITH-ASDF-SESSION")
                               (lambda ()
                                 (funcall (asdf-function "MAKE-PLAN") nil (asdf-symbol operation) system))))
                (actions (mapcar (lambda (action)
                                   (cons (type-of (funcall (asdf-symbol "ACTION-OPERATION") action))
                                         (funcall (asdf-symbol "ACTION-COMPONENT") action)))
                                 (funcall (asdf-symbol "PLAN-ACTIONS") plan))))
           (loop for (operation-type . component) in actions
                 for loaded = (and (typep component (asdf-symbol "CL-SOURCE-FILE"))
                                   (eq operation-type (type-of load-op))
                                   (funcall time load-op component))
                 when loaded
                   collect (list component loaded (funcall time compile-op component)
                                 (and (find-if (lambda (action)
                                                 (and (eq (car action) (type-of compile-op))
                                                      (eq (cdr action) component)))
                                               actions)
                                      t)))))))

(defun reloaded-files (planned completed)
  "The files of PLANNED (see PLANNED-RELOADS) that the load loaded again: all of them when it
COMPLETED, else those whose stamp moved. NIL, or (:FILES ((system file recompiled changed) ...)
:JOURNAL (first last)): FILE relative to the system's directory, RECOMPILED whether it was
compiled again, CHANGED whether its source is newer than what was loaded (else it was reloaded
for depending on a changed one), and the journal entries made since, if any."
  (destructuring-bind (journal-before . files) planned
    (let* ((load-op (funcall (asdf-function "MAKE-OPERATION") (asdf-symbol "LOAD-OP")))
           (pathname-of (asdf-function "COMPONENT-PATHNAME"))
           (reloaded (loop for (component loaded compiled recompiled) in files
                           for system = (funcall (asdf-function "COMPONENT-SYSTEM") component)
                           for source = (funcall pathname-of component)
                           when (or completed
                                    (not (eql loaded (funcall (asdf-symbol "COMPONENT-OPERATION-TIME")
                                                              load-op component))))
                             collect (list (funcall (asdf-function "COMPONENT-NAME") system)
                                           (enough-namestring source (funcall pathname-of system))
                                           recompiled
                                           ;; A stamp is the write date of what was loaded.
                                           (let ((written (and source (ignore-errors (file-write-date source)))))
                                             (and written (> written (or compiled loaded)) t)))))
           (journal-after (symbol-value '*next-journal-number*)))
      (and reloaded
           (list :files reloaded
                 :journal (and (> journal-after journal-before) (list journal-before (1- journal-after)))
                 :reset (and (> journal-after journal-before) (variables-reset journal-before (1- journal-after))))))))

(defun file-defparameters (file)
  "The variables FILE's top-level DEFPARAMETERs name, as symbols of the packages its IN-PACKAGE
forms name before them (read as text: nothing of the file is evaluated)."
  (let ((package (find-package '#:common-lisp-user))
        (variables '()))
    (with-open-file (in file :external-format :utf-8 :if-does-not-exist nil)
      (when in
        (loop for line = (read-line in nil)
              while line
              do (flet ((name-after (prefix)
                          (and (eql 0 (search prefix line :test #'char-equal))
                               (let* ((start (length prefix))
                                      (end (or (position-if (lambda (c) (member c '(#\Space #\Tab #\) #\())) line
                                                            :start start)
                                               (length line))))
                                 (string-upcase (string-left-trim "#:" (subseq line start end)))))))
                   (let ((in-package (name-after "(in-package "))
                         (defparameter (name-after "(defparameter ")))
                     (cond (in-package (setf package (or (find-package in-package) package)))
                           (defparameter
                            (let ((symbol (find-symbol defparameter package)))
                              (when (and symbol (boundp symbol))
                                (pushnew symbol variables))))))))))
    (nreverse variables)))

(define-entry (test-reload-plan :caller :server) (system &key session token)
  "What run-tests' test-op of SYSTEM would load again before its tests, for the preview the
person approving the call is shown: (:FILES (\"system: file\" ...) :VARIABLES (\"NAME (now
VALUE)\" ...)), the changed source files of loaded systems its plan loads again, and the variables
their DEFPARAMETERs would set again (a value set at the REPL is the person's data). Nothing is
loaded, not even a system's .asd: only a registered system has a plan."
  (declare (ignore session))
  (run-tool token
            (lambda ()
              (let ((changed '()))
                (when (and (find-package '#:asdf) (funcall (asdf-function "REGISTERED-SYSTEM") system))
                  (loop for (component loaded compiled) in (rest (planned-reloads "TEST-OP" system))
                        for source = (funcall (asdf-function "COMPONENT-PATHNAME") component)
                        for written = (and source (ignore-errors (file-write-date source)))
                        when (and written (> written (or compiled loaded)))
                          do (push (cons component source) changed)))
                (setf changed (nreverse changed))
                (list :files (loop for (component . source) in changed
                                   for owner = (funcall (asdf-function "COMPONENT-SYSTEM") component)
                                   collect (format nil "~A: ~A" (funcall (asdf-function "COMPONENT-NAME") owner)
                                                   (enough-namestring source (funcall (asdf-function "COMPONENT-PATHNAME")
                                                                                      owner))))
                      :variables (loop for (nil . source) in changed
                                       append (loop for symbol in (file-defparameters source)
                                                    collect (format nil "~A (now ~A)" (qualified-name symbol)
                                                                    (print-briefly (symbol-value symbol)
                                                                                   :package (symbol-package symbol)
                                                                                   :length 5 :level 2 :limit 80)))))))))
