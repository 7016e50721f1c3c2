;;;; run-tests: a system's tests (ASDF's TEST-SYSTEM) or one named suite or test, with FiveAM's
;;;; and Parachute's results read as data: counts, and for each failure its test, form, reason,
;;;; expected and actual values.
;;;;
;;;; Loaded after systems.lisp, under the rules of helper.lisp. The frameworks are found by name
;;;; when the image has them; the helper never loads one. While a run is collecting, these
;;;; functions are encapsulated: FiveAM's RUN, to take its results; its PROCESS-FAILURE, to keep
;;;; an IS check's expected and actual values, which FiveAM only formats into a text; its
;;;; ADD-RESULT, to count checks for progress reports; and Parachute's TEST, to take its report.
;;;; The encapsulations are removed when the last run ends.

(in-package #:mcp-agent-helper)

(defparameter *max-test-failures* 50
  "Failures described per reply; the rest are counted.")

(defvar *test-collection* nil
  "The TEST-COLLECTION of the run-tests call running in this thread.")

(defvar *test-runs* (make-hash-table :test 'equal :synchronized t)
  "Session -> the TEST-COLLECTION of its running run-tests call, for TEST-ACTIVITY.")

(defvar *test-hooks-lock* (sb-thread:make-mutex :name "mcp-agent-helper test hooks"))

(defvar *test-hooks-users* 0
  "How many run-tests calls need the frameworks' encapsulations now.")

(defclass test-collection ()
  ((results :initform '() :accessor collection-results)
   (parachute-reports :initform '() :accessor collection-parachute-reports)
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

(defun parachute-symbol (name)
  (and (find-package '#:parachute) (find-symbol name '#:parachute)))

(defun collect-parachute-report (test &rest arguments)
  (let ((report (apply test arguments)))
    (when *test-collection*
      (push report (collection-parachute-reports *test-collection*)))
    report))

(defparameter *framework-hooks*
  '((fiveam-symbol "RUN" collect-fiveam-run)
    (fiveam-symbol "PROCESS-FAILURE" collect-fiveam-expectation)
    (fiveam-symbol "ADD-RESULT" count-fiveam-check)
    (parachute-symbol "TEST" collect-parachute-report))
  "(finder name hook): the framework functions encapsulated while a run collects.")

(defun change-test-hooks (delta)
  "Counts a run that starts (DELTA 1) or ends (-1), then makes the encapsulations present while
any run needs them and their framework is loaded (DELTA 0 only does that, for a load that brought
a framework in), and absent otherwise."
  (sb-thread:with-mutex (*test-hooks-lock*)
    (setf *test-hooks-users* (max 0 (+ *test-hooks-users* delta)))
    (loop for (finder name hook) in *framework-hooks*
          for symbol = (funcall finder name)
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

(defun find-named-test (text package)
  "The framework (:FIVEAM or :PARACHUTE) and the symbol of the suite or test TEXT names."
  (let ((symbol (find-existing-symbol text package)))
    (cond ((and (fiveam-symbol "GET-TEST") (funcall (fiveam-symbol "GET-TEST") symbol))
           (values :fiveam symbol))
          ((and (parachute-symbol "FIND-TEST") (funcall (parachute-symbol "FIND-TEST") symbol))
           (values :parachute symbol))
          (t (fail "~A names no test or suite of ~:[a framework run-tests understands (FiveAM, Parachute); ~
                    frameworks loaded: ~:*~:[none~;~:*~{~A~^, ~}~]. Run the whole system's tests without suite or ~
                    test~;~:*~{~A~^ or ~}~]."
                   (name-text symbol package)
                   (remove-if-not (lambda (name) (member name '("FiveAM" "Parachute") :test #'string=))
                                  (test-frameworks))
                   (test-frameworks))))))

(defun parachute-report (reports package)
  "The counts and failures of Parachute's REPORTS: checks (results that are not whole tests) by
status, and each failed check with the test it is in."
  (let ((test-result-class (find-class (parachute-symbol "TEST-RESULT") nil))
        (counts (list :passed 0 :failed 0 :skipped 0))
        (tests 0)
        (failures '())
        (failure-count 0))
    (flet ((call (name object) (ignore-errors (funcall (parachute-symbol name) object)))
           (text (object) (print-briefly object :package package)))
      (dolist (report (reverse reports))
        (let ((current-test nil))
          (loop for result across (coerce (funcall (parachute-symbol "RESULTS") report) 'vector)
                for status = (call "STATUS" result)
                do (if (and test-result-class (typep result test-result-class))
                       (let ((test (call "EXPRESSION" result)))
                         (incf tests)
                         (setf current-test (or (call "NAME" test) test)))
                       (case status
                         (:passed (incf (getf counts :passed)))
                         (:skipped (incf (getf counts :skipped)))
                         (:failed
                          (incf (getf counts :failed))
                          (incf failure-count)
                          (when (<= failure-count *max-test-failures*)
                            (let ((comparison (call "COMPARISON" result)))
                              (push (list :kind "failure"
                                          :test (if current-test (text current-test) "(unnamed test)")
                                          :form (print-form-briefly (call "EXPRESSION" result))
                                          :reason (or (call "DESCRIPTION" result)
                                                      (and comparison
                                                           (format nil "~A evaluated to ~A, which is not ~A to ~A"
                                                                   (print-form-briefly (call "VALUE-FORM" result))
                                                                   (text (call "VALUE" result)) (text comparison)
                                                                   (text (call "EXPECTED" result)))))
                                          :expected (and comparison (text (call "EXPECTED" result)))
                                          :actual (and comparison (text (call "VALUE" result))))
                                    failures)))))))))
      (list :framework "Parachute"
            :tests tests
            :passed (getf counts :passed) :failed (getf counts :failed)
            :errors 0 :skipped (getf counts :skipped)
            :failures (nreverse failures)
            :failures-dropped (max 0 (- failure-count *max-test-failures*))))))

(defun muffle-if-possible (warning)
  "Muffles WARNING when it can be (a warning SIGNALled rather than WARNed has no MUFFLE-WARNING
restart): compiling the system under test is not what the reply is about."
  (let ((restart (find-restart 'muffle-warning warning)))
    (when restart
      (invoke-restart restart))))

(defun test-activity (&key session token)
  "How far the session's running run-tests call is: (:ACTIVITY text or NIL)."
  (declare (ignore token))
  (let ((collection (gethash session *test-runs*)))
    (list :activity (and collection (plusp (collection-checks collection))
                         (format nil "~:D check~:P done, ~:D failed" (collection-checks collection)
                                 (collection-problems collection))))))

(defun run-tests (system &key suite test package session token (max-output 65536))
  "The run-tests tool: loads SYSTEM and runs the FiveAM or Parachute SUITE or TEST named, or
without either runs ASDF's TEST-SYSTEM on SYSTEM. Output goes to :STDOUT. Returns (:SYSTEM :RAN
:FRAMEWORKS :MILLISECONDS :RESULTS reports, one per framework that ran, :STDOUT (text dropped)
:ERROR report-or-NIL)."
  (let* ((stdout (make-capture max-output))
         (*max-output* max-output)
         (*handles* (session-handles session))
         ;; What the tests start runs as the agent's (see observe.lisp).
         (*agent-session* session)
         (collection (make-instance 'test-collection))
         (started (get-internal-real-time))
         (target-package nil)
         (ran nil))
    (setf (gethash session *test-runs*) collection)
    (change-test-hooks 1)
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
                      (handler-bind ((warning #'muffle-if-possible))
                        (funcall (asdf-function "LOAD-SYSTEM") system))
                      ;; Loading may have brought a framework in.
                      (change-test-hooks 0)
                      (cond ((or suite test)
                             (multiple-value-bind (framework name) (find-named-test (or suite test) target-package)
                               (setf ran (format nil "~:[FiveAM~;Parachute~] ~:[suite~;test~] ~A"
                                                 (eq framework :parachute) test (name-text name target-package)))
                               (if (eq framework :fiveam)
                                   (funcall (fiveam-symbol "RUN") name)
                                   (funcall (parachute-symbol "TEST") name :report (parachute-symbol "PLAIN")))))
                            (t
                             (setf ran (format nil "asdf:test-system ~S" system))
                             (handler-bind ((warning #'muffle-if-possible))
                               (funcall (asdf-function "TEST-SYSTEM") system)))))
                    (list :ok t))
                  :stdout stdout)
              (change-test-hooks -1)
              (remhash session *test-runs*))))
      (if (getf result :failure)
          result
          (list :system system
                :ran ran
                :frameworks (test-frameworks)
                :milliseconds (round (* 1000 (- (get-internal-real-time) started)) internal-time-units-per-second)
                :results (let ((package (or target-package *package*)))
                           (append (and (collection-results collection)
                                        (list (fiveam-report collection package)))
                                   (and (collection-parachute-reports collection)
                                        (list (parachute-report (collection-parachute-reports collection) package)))))
                :stdout (capture-report stdout)
                :error (getf result :error))))))
