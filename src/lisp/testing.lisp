;;;; run-tests: a system's tests (ASDF's TEST-SYSTEM) or one named suite or test, with FiveAM's
;;;; results read as data: counts, and for each failure its test, form, reason, expected and
;;;; actual values and source location.
;;;;
;;;; Loaded after systems.lisp, under the rules of helper.lisp. FiveAM is found by name when the
;;;; image has it; the helper never loads it. While a run is collecting, three FiveAM functions
;;;; are encapsulated (RUN, to take its results; PROCESS-FAILURE, to keep an IS check's expected
;;;; and actual values, which FiveAM only formats into a text; ADD-RESULT, to count checks for
;;;; progress reports); the encapsulations are removed when the last run ends.

(in-package #:mcp-agent-helper)

(defparameter *max-test-failures* 50
  "Failures described per reply; the rest are counted.")

(defvar *test-collection* nil
  "The TEST-COLLECTION of the run-tests call running in this thread.")

(defvar *test-runs* (make-hash-table :test 'equal :synchronized t)
  "Session -> the TEST-COLLECTION of its running run-tests call, for TEST-ACTIVITY.")

(defvar *test-hooks-lock* (sb-thread:make-mutex :name "mcp-agent-helper test hooks"))

(defvar *test-hooks-users* 0
  "How many run-tests calls need the FiveAM encapsulations now.")

(defclass test-collection ()
  ((results :initform '() :accessor collection-results)
   (expectations :initform '() :accessor collection-expectations)
   (checks :initform 0 :accessor collection-checks)
   (problems :initform 0 :accessor collection-problems)))

(defun fiveam-symbol (name)
  (and (find-package '#:it.bese.fiveam) (find-symbol name '#:it.bese.fiveam)))

(defun collect-fiveam-run (run &rest arguments)
  (let ((results (apply run arguments)))
    (when (and *test-collection* (listp results))
      (setf (collection-results *test-collection*) (append (collection-results *test-collection*) results)))
    results))

(defun collect-fiveam-expectation (process-failure test-expr &optional reason-format &rest format-arguments)
  "Keeps the values an IS check with a default reason compared: FiveAM passes (actual-form actual
predicate expected) to its reason's format control."
  (when (and *test-collection* (stringp reason-format) (search "evaluated to" reason-format)
             (= (length format-arguments) 4))
    (destructuring-bind (actual-form actual predicate expected) format-arguments
      (declare (ignore actual-form predicate))
      (push (list test-expr expected actual) (collection-expectations *test-collection*))))
  (apply process-failure test-expr reason-format format-arguments))

(defun count-fiveam-check (add-result result-type &rest arguments)
  (when *test-collection*
    (incf (collection-checks *test-collection*))
    (unless (string= (symbol-name result-type) "TEST-PASSED")
      (incf (collection-problems *test-collection*))))
  (apply add-result result-type arguments))

(defparameter *fiveam-hooks*
  '(("RUN" . collect-fiveam-run)
    ("PROCESS-FAILURE" . collect-fiveam-expectation)
    ("ADD-RESULT" . count-fiveam-check)))

(defun change-fiveam-hooks (delta)
  "Counts a run that starts (DELTA 1) or ends (-1), then makes the encapsulations present while
any run needs them and FiveAM is loaded (DELTA 0 only does that, for a load that brought FiveAM
in), and absent otherwise."
  (sb-thread:with-mutex (*test-hooks-lock*)
    (setf *test-hooks-users* (max 0 (+ *test-hooks-users* delta)))
    (loop for (name . hook) in *fiveam-hooks*
          for symbol = (fiveam-symbol name)
          when (and symbol (fboundp symbol))
            do (let ((present (internal-call "SB-INT" "ENCAPSULATED-P" symbol hook)))
                 (cond ((and (plusp *test-hooks-users*) (not present))
                        (internal-call "SB-INT" "ENCAPSULATE" symbol hook hook))
                       ((and (zerop *test-hooks-users*) present)
                        (internal-call "SB-INT" "UNENCAPSULATE" symbol hook)))))))

(defun test-frameworks ()
  "The test frameworks this image has loaded, by name."
  (loop for (package . name) in '(("IT.BESE.FIVEAM" . "FiveAM") ("PARACHUTE" . "Parachute")
                                  ("ROVE" . "Rove") ("LISP-UNIT2" . "lisp-unit2"))
        when (find-package package) collect name))

(defun fiveam-result-kind (result)
  (let ((names (mapcar (lambda (class) (symbol-name (class-name class)))
                       (sb-mop:class-precedence-list (class-of result)))))
    (cond ((member "UNEXPECTED-TEST-FAILURE" names :test #'string=) :error)
          ((member "TEST-FAILURE" names :test #'string=) :failed)
          ((member "TEST-SKIPPED" names :test #'string=) :skipped)
          ((member "TEST-PASSED" names :test #'string=) :passed))))

(defun slot-if-bound (object name)
  (let ((slot (fiveam-symbol name)))
    (and slot (slot-exists-p object slot) (slot-boundp object slot) (slot-value object slot))))

(defun fiveam-report (collection package)
  "The counts and failures of COLLECTION's FiveAM results."
  (let ((counts (list :passed 0 :failed 0 :errors 0 :skipped 0))
        (failures '())
        (failure-count 0)
        (tests '())
        (expectations (reverse (collection-expectations collection))))
    (dolist (result (collection-results collection))
      (let ((kind (fiveam-result-kind result))
            (test-case (slot-if-bound result "TEST-CASE")))
        (pushnew test-case tests)
        (case kind
          (:passed (incf (getf counts :passed)))
          (:skipped (incf (getf counts :skipped)))
          ((:failed :error)
           (incf (getf counts (if (eq kind :failed) :failed :errors)))
           (incf failure-count)
           (when (<= failure-count *max-test-failures*)
             (let* ((expr (slot-if-bound result "TEST-EXPR"))
                    (expectation (and (eq kind :failed) expr
                                      (find expr expectations :key #'first)))
                    (condition (and (eq kind :error) (slot-if-bound result "ACTUAL-CONDITION")))
                    (name (and test-case (slot-if-bound test-case "NAME"))))
               (when expectation
                 (setf expectations (remove expectation expectations :count 1)))
               (push (list :kind (if (eq kind :failed) "failure" "error")
                           :test (if name (print-briefly name :package package) "(unnamed test)")
                           :form (and expr (print-form-briefly expr))
                           :reason (cond (condition (format nil "~A: ~A" (standard-condition-name condition)
                                                            (condition-message condition)))
                                         (t (let ((reason (slot-if-bound result "REASON")))
                                              (and (stringp reason)
                                                   (string-trim '(#\Space #\Newline) (fold-blank-lines reason))))))
                           :expected (and expectation (print-briefly (second expectation) :package package))
                           :actual (and expectation (print-briefly (third expectation) :package package)))
                     failures)))))))
    (list :framework "FiveAM"
          :tests (count-if #'identity tests)
          :passed (getf counts :passed) :failed (getf counts :failed)
          :errors (getf counts :errors) :skipped (getf counts :skipped)
          :failures (nreverse failures)
          :failures-dropped (max 0 (- failure-count *max-test-failures*)))))

(defun fold-blank-lines (text)
  "TEXT with its runs of line breaks and blanks (FiveAM's reasons put ~2& around each value)
folded into one space."
  (with-output-to-string (out)
    (let ((blank nil))
      (loop for char across text
            do (if (member char '(#\Space #\Newline #\Tab #\Return))
                   (setf blank t)
                   (progn (when blank (write-char #\Space out) (setf blank nil))
                          (write-char char out)))))))

(defun find-fiveam-test (text package)
  "The FiveAM suite or test TEXT names."
  (unless (find-package '#:it.bese.fiveam)
    (fail "FiveAM is not loaded in this image, and suite and test are only understood for FiveAM (frameworks ~
           loaded: ~:[none~;~:*~{~A~^, ~}~]). Run the whole system's tests without suite or test."
          (test-frameworks)))
  (let ((symbol (find-existing-symbol text package)))
    (unless (funcall (fiveam-symbol "GET-TEST") symbol)
      (fail "~A names no FiveAM test or suite." (name-text symbol package)))
    symbol))

(defun test-activity (&key session token)
  "How far the session's running run-tests call is: (:ACTIVITY text or NIL)."
  (declare (ignore token))
  (let ((collection (gethash session *test-runs*)))
    (list :activity (and collection
                         (format nil "~:D check~:P done, ~:D failed" (collection-checks collection)
                                 (collection-problems collection))))))

(defun run-tests (system &key suite test package session token (max-output 65536))
  "The run-tests tool: loads SYSTEM and runs the FiveAM SUITE or TEST named, or without either
runs ASDF's TEST-SYSTEM on SYSTEM. Output goes to :STDOUT. Returns (:SYSTEM :RAN :FRAMEWORKS
:MILLISECONDS :RESULTS report-or-NIL :STDOUT (text dropped) :ERROR report-or-NIL)."
  (let* ((stdout (make-capture max-output))
         (*max-output* max-output)
         (collection (make-instance 'test-collection))
         (started (get-internal-real-time))
         (target-package nil)
         (ran nil))
    (setf (gethash session *test-runs*) collection)
    (change-fiveam-hooks 1)
    (let ((result
            (unwind-protect
                 (run-tool
                  token
                  (lambda ()
                    (setf target-package (tool-package package session))
                    (ensure-asdf)
                    (unless (funcall (asdf-function "FIND-SYSTEM") system nil)
                      (fail "System ~S was not found. Load its .asd file with ASDF:LOAD-ASD, or put its directory ~
                             in ASDF's source registry." system))
                    (let ((*test-collection* collection)
                          (*compile-verbose* nil) (*compile-print* nil) (*load-verbose* nil) (*load-print* nil)
                          (*journal-additions* nil))
                      (handler-bind ((warning #'muffle-warning))
                        (funcall (asdf-function "LOAD-SYSTEM") system))
                      ;; Loading may have brought FiveAM in.
                      (change-fiveam-hooks 0)
                      (cond ((or suite test)
                             (let ((name (find-fiveam-test (or suite test) target-package)))
                               (setf ran (format nil "FiveAM ~:[suite~;test~] ~A" test (name-text name target-package)))
                               (funcall (fiveam-symbol "RUN") name)))
                            (t
                             (setf ran (format nil "asdf:test-system ~S" system))
                             (handler-bind ((warning #'muffle-warning))
                               (funcall (asdf-function "TEST-SYSTEM") system)))))
                    (list :ok t))
                  :stdout stdout)
              (change-fiveam-hooks -1)
              (remhash session *test-runs*))))
      (if (getf result :failure)
          result
          (list :system system
                :ran ran
                :frameworks (test-frameworks)
                :milliseconds (round (* 1000 (- (get-internal-real-time) started)) internal-time-units-per-second)
                :results (and (collection-results collection)
                              (fiveam-report collection (or target-package *package*)))
                :stdout (capture-report stdout)
                :error (getf result :error))))))
