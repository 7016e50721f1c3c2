;;;; run-tests: a system's tests (ASDF's TEST-SYSTEM) or one named suite or test, with FiveAM's,
;;;; Parachute's and RT's results read as data: counts, and for each failure its test, form,
;;;; reason, expected and actual values.
;;;;
;;;; Loaded after systems.lisp, under the rules of package.lisp. The frameworks are found by name
;;;; when the image has them; the helper never loads one. While a run is collecting, these
;;;; functions are encapsulated: FiveAM's RUN, to take its results; its PROCESS-FAILURE, to keep
;;;; an IS check's expected and actual values, which FiveAM only formats into a text; its
;;;; ADD-RESULT, to count checks for progress reports; Parachute's TEST, to take its report; RT's
;;;; DO-ENTRY, to take each test's outcome, and its EQUALP-WITH-CASE, to keep the values a test
;;;; compared; and LOAD, so that a framework the test-op itself loads is encapsulated as soon as
;;;; it is there. Only the outermost run of each framework is counted: a test that runs FiveAM
;;;; inside it (FiveAM's own tests do) is one test of the outer run. The encapsulations are
;;;; removed when the last run ends.

(in-package #:mcp-agent-helper)

(defparameter *max-test-failures* 50
  "Failures described per reply; the others are kept behind a handle, up to *MAX-KEPT-WARNINGS*,
and the rest counted.")

(defvar *test-collection* nil
  "The TEST-COLLECTION of the run-tests call running in this thread.")

(defvar *test-hooks-lock* (sb-thread:make-mutex :name "mcp-agent-helper test hooks"))

(defvar *test-hooks-users* 0
  "How many run-tests calls need the frameworks' encapsulations now.")

(defvar *fiveam-run-depth* 0
  "How many FiveAM RUNs this thread is inside: only the outermost one's results are the run's.")

(defvar *parachute-test-depth* 0)

(defvar *rt-entry-depth* 0)

(defvar *rt-comparison* nil
  "While an RT test runs: NIL, then the (actual expected) values its EQUALP-WITH-CASE compared.")

(defclass test-collection ()
  ((results :initform '() :accessor collection-results)
   (parachute-reports :initform '() :accessor collection-parachute-reports)
   (rt-outcomes :initform '() :accessor collection-rt-outcomes)
   (expectations :initform '() :accessor collection-expectations)
   (checks :initform 0 :accessor collection-checks)
   (problems :initform 0 :accessor collection-problems)))

(defun fiveam-symbol (name)
  (and (find-package '#:it.bese.fiveam) (find-symbol name '#:it.bese.fiveam)))

(defun collect-fiveam-run (run &rest arguments)
  (let* ((outermost (zerop *fiveam-run-depth*))
         (results (let ((*fiveam-run-depth* (1+ *fiveam-run-depth*)))
                    (apply run arguments))))
    (when (and outermost *test-collection* (listp results))
      (setf (collection-results *test-collection*) (append (collection-results *test-collection*) results)))
    results))

(defun outermost-fiveam-check-p ()
  "True while the checks being made are the outermost FiveAM run's, not a run a test started."
  (and *test-collection* (= *fiveam-run-depth* 1)))

(defun collect-fiveam-expectation (process-failure test-expr &optional reason-format &rest format-arguments)
  "Keeps the values an IS check with a default reason compared: FiveAM passes (actual-form actual
predicate expected) to its reason's format control. They are kept with the reason's text, which
the failure FiveAM records carries too: the same check in a loop fails with other values each
time, and FiveAM's results do not come in the order the checks ran."
  (when (and (outermost-fiveam-check-p) (stringp reason-format) (search "evaluated to" reason-format)
             (= (length format-arguments) 4))
    (destructuring-bind (actual-form actual predicate expected) format-arguments
      (declare (ignore actual-form predicate))
      (push (list test-expr expected actual (apply #'format nil reason-format format-arguments))
            (collection-expectations *test-collection*))))
  (apply process-failure test-expr reason-format format-arguments))

(defun count-fiveam-check (add-result result-type &rest arguments)
  (when (outermost-fiveam-check-p)
    (incf (collection-checks *test-collection*))
    (unless (string= (symbol-name result-type) "TEST-PASSED")
      (incf (collection-problems *test-collection*))))
  (apply add-result result-type arguments))

(defun parachute-symbol (name)
  (and (find-package '#:parachute) (find-symbol name '#:parachute)))

(defun collect-parachute-report (test &rest arguments)
  (let* ((outermost (zerop *parachute-test-depth*))
         (report (let ((*parachute-test-depth* (1+ *parachute-test-depth*)))
                   (apply test arguments))))
    (when (and outermost *test-collection*)
      (push report (collection-parachute-reports *test-collection*)))
    report))

(defun rt-packages ()
  "The RT packages this image has: SBCL's SB-RT and the portable RT's REGRESSION-TEST."
  (remove nil (list (find-package '#:sb-rt) (find-package '#:regression-test))))

(defun rt-package-entries (package)
  "PACKAGE's RT test entries: *ENTRIES* has a dummy head."
  (let ((variable (find-symbol "*ENTRIES*" package)))
    (and variable (boundp variable) (consp (symbol-value variable))
         (remove nil (rest (symbol-value variable))))))

(defun rt-entry-part (entry part)
  "PART (:PENDING :NAME :FORM or :VALUES, the expected ones) of the RT test ENTRY: a list
(pending name form . values) in SB-RT and the classic RT, a structure in later RTs, read with its
RT's own accessors."
  (if (consp entry)
      (ecase part (:pending (first entry)) (:name (second entry)) (:form (third entry)) (:values (cdddr entry)))
      (let ((accessor (loop with name = (ecase part (:pending "PEND") (:name "NAME") (:form "FORM") (:values "VALS"))
                            for package in (rt-packages)
                            for symbol = (find-symbol name package)
                            when (and symbol (fboundp symbol) (not (macro-function symbol))) return symbol)))
        (and accessor (ignore-errors (funcall accessor entry))))))

(defun rt-entries ()
  (loop for package in (rt-packages) append (rt-package-entries package)))

(defun rt-package-of (name)
  "The RT package that has a test NAME: SB-RT and RT each keep their own."
  (find-if (lambda (package)
             (find name (rt-package-entries package) :key (lambda (entry) (rt-entry-part entry :name)) :test #'equal))
           (rt-packages)))

(defun collect-rt-entry (do-entry entry &rest arguments)
  "Runs one RT test and keeps its outcome: RT only prints it. What RT printed about a failure is
kept too: for a test that signalled, it is the only place the condition is named."
  (if (or (plusp *rt-entry-depth*) (not *test-collection*) (null entry))
      (let ((*rt-entry-depth* (1+ *rt-entry-depth*)))
        (apply do-entry entry arguments))
      (let* ((stream (if arguments (first arguments) *standard-output*))
             (said (make-string-output-stream))
             (*rt-comparison* nil)
             (result (let ((*rt-entry-depth* 1))
                       (apply do-entry entry (make-broadcast-stream stream said) (rest arguments))))
             (failed (rt-entry-part entry :pending))
             (collection *test-collection*))
        (incf (collection-checks collection))
        (when failed
          (incf (collection-problems collection)))
        (push (list :name (rt-entry-part entry :name) :form (rt-entry-part entry :form)
                    :expected (rt-entry-part entry :values)
                    :failed (and failed t) :compared *rt-comparison*
                    :said (and failed (get-output-stream-string said)))
              (collection-rt-outcomes collection))
        result)))

(defun keep-rt-comparison (equalp-with-case actual expected)
  "Keeps the values the running RT test compared: the first comparison is the whole values list,
the rest its parts."
  (when (and *test-collection* (= *rt-entry-depth* 1) (null *rt-comparison*))
    (setf *rt-comparison* (list actual expected)))
  (funcall equalp-with-case actual expected))

(defun common-lisp-symbol (name)
  (find-symbol name '#:common-lisp))

(defun refresh-test-hooks (load &rest arguments)
  "A framework the run's own code loads (the usual test-op loads FiveAM with the test system) is
encapsulated once it is loaded, before its first test runs. Only then is the hooks' lock taken:
a LOAD may hold SBCL's world lock, and most loads bring no framework."
  (multiple-value-prog1 (apply load arguments)
    (when (test-hooks-missing-p)
      (change-test-hooks 0))))

(defun test-hooks-missing-p ()
  "Whether a run needs the encapsulations and a framework function loaded since lacks its own."
  (and (plusp *test-hooks-users*)
       (loop for (finder name hook) in *framework-hooks*
             for symbol = (funcall finder name)
             thereis (and symbol (fboundp symbol)
                          (not (internal-call "SB-INT" "ENCAPSULATED-P" symbol hook))))))

(defparameter *framework-hooks*
  '((fiveam-symbol "RUN" collect-fiveam-run)
    (fiveam-symbol "PROCESS-FAILURE" collect-fiveam-expectation)
    (fiveam-symbol "ADD-RESULT" count-fiveam-check)
    (parachute-symbol "TEST" collect-parachute-report)
    (sb-rt-symbol "DO-ENTRY" collect-rt-entry)
    (sb-rt-symbol "EQUALP-WITH-CASE" keep-rt-comparison)
    (portable-rt-symbol "DO-ENTRY" collect-rt-entry)
    (portable-rt-symbol "EQUALP-WITH-CASE" keep-rt-comparison)
    (common-lisp-symbol "LOAD" refresh-test-hooks))
  "(finder name hook): the functions encapsulated while a run collects.")

(defun sb-rt-symbol (name)
  (and (find-package '#:sb-rt) (find-symbol name '#:sb-rt)))

(defun portable-rt-symbol (name)
  (and (find-package '#:regression-test) (find-symbol name '#:regression-test)))

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
  (loop for (packages . name) in '((("IT.BESE.FIVEAM") . "FiveAM") (("PARACHUTE") . "Parachute")
                                   (("SB-RT" "REGRESSION-TEST") . "RT")
                                   (("ROVE") . "Rove") (("LISP-UNIT2") . "lisp-unit2"))
        when (some #'find-package packages) collect name))

(defparameter *frameworks-read* '("FiveAM" "Parachute" "RT")
  "The frameworks whose runs run-tests reads; others are only named.")

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
           (when (<= failure-count *max-kept-warnings*)
             (let* ((expr (slot-if-bound result "TEST-EXPR"))
                    (reason (slot-if-bound result "REASON"))
                    (expectation (and (eq kind :failed) expr
                                      (find-if (lambda (expectation)
                                                 (and (eq (first expectation) expr)
                                                      (equal (fourth expectation) reason)))
                                               expectations)))
                    (condition (and (eq kind :error) (slot-if-bound result "ACTUAL-CONDITION")))
                    (name (and test-case (slot-if-bound test-case "NAME"))))
               (when expectation
                 (setf expectations (remove expectation expectations :count 1)))
               (push (list :kind (if (eq kind :failed) "failure" "error")
                           :test (if name (print-briefly name :package package) "(unnamed test)")
                           :form (and expr (print-form-briefly expr))
                           :reason (cond (condition (format nil "~A: ~A" (standard-condition-name condition)
                                                            (condition-message condition)))
                                         ((stringp reason)
                                          (string-trim '(#\Space #\Newline) (fold-blank-lines reason))))
                           :expected (and expectation (print-briefly (second expectation) :package package))
                           :actual (and expectation (print-briefly (third expectation) :package package)))
                     failures)))))))
    (framework-results "FiveAM" (count-if #'identity tests) counts failures failure-count)))

(defun failure-text (failure)
  "FAILURE (a plist of a framework's report) as the run-tests reply shows it."
  (destructuring-bind (&key kind test form reason expected actual) failure
    (format nil "[~:[FAIL~;ERROR~]] ~A~@[~%  Form: ~A~]~:[~*~*~;~%  Expected: ~A~%  Actual: ~A~]~@[~%  Reason: ~A~]"
            (equal kind "error") test form (and expected actual) expected actual reason)))

(defun framework-results (framework tests counts failures failure-count)
  "A framework's report for run-tests: its counts; :FAILURES, the first *MAX-TEST-FAILURES* of
FAILURES (newest first, as collected); :FAILURES-REST, the handle of every failure kept as text and
the offset of the first not shown (see REST-LISTING); :FAILURES-DROPPED, how many were not shown."
  (let ((failures (reverse failures)))
    (list :framework framework
          :tests tests
          :passed (getf counts :passed) :failed (getf counts :failed)
          :errors (getf counts :errors 0) :skipped (getf counts :skipped 0)
          :failures (subseq failures 0 (min (length failures) *max-test-failures*))
          :failures-rest (rest-listing (mapcar #'failure-text failures) *max-test-failures*)
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


(defun test-framework-of (symbol)
  "The framework (:FIVEAM, :PARACHUTE or :RT) that has a suite or test named SYMBOL, or NIL."
  (cond ((not (and symbol (symbolp symbol) (not (keywordp symbol)))) nil)
        ((and (fiveam-symbol "GET-TEST") (funcall (fiveam-symbol "GET-TEST") symbol)) :fiveam)
        ((and (parachute-symbol "FIND-TEST") (ignore-errors (funcall (parachute-symbol "FIND-TEST") symbol)))
         :parachute)
        ((rt-package-of symbol) :rt)))

(defun tests-near (name home)
  "\" Did you mean ...?\" with the suites and tests whose names are near NAME, or \"\"."
  (let ((rt-names (make-hash-table :test 'eq)))
    (dolist (entry (rt-entries))
      (let ((name (rt-entry-part entry :name)))
        (when (symbolp name)
          (setf (gethash name rt-names) t))))
    (missing-symbol-hint name home
                         (lambda (symbol)
                           (or (gethash symbol rt-names)
                               (member (test-framework-of symbol) '(:fiveam :parachute)))))))

(defun find-named-test (text package)
  "The framework (:FIVEAM, :PARACHUTE or :RT) and the symbol of the suite or test TEXT names."
  (multiple-value-bind (symbol found name home) (find-named-symbol text package)
    (unless found
      (fail "Symbol ~A not found in package ~A.~A" name (package-display-name home) (tests-near name home)))
    (let ((framework (test-framework-of symbol))
          (frameworks (test-frameworks)))
      (unless framework
        (fail "~A names no test or suite of ~:[a framework run-tests understands (FiveAM, Parachute, RT); ~
               frameworks loaded: ~:*~:[none~;~:*~{~A~^, ~}~]. Run the whole system's tests without suite or ~
               test~;~:*~{~A~^, ~}~].~A"
              (name-text symbol package)
              (intersection frameworks *frameworks-read* :test #'string=)
              frameworks
              (tests-near name home)))
      (values framework symbol))))

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
                          (when (<= failure-count *max-kept-warnings*)
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
      (framework-results "Parachute" tests counts failures failure-count))))

(defun rt-values-text (values package)
  "An RT test's values as one text: the value, or (VALUES a b) for several."
  (print-briefly (if (= (length values) 1) (first values) (cons 'values values)) :package package))

(defun rt-actual-text (said)
  "What RT printed as a failed test's actual value (for a test that signalled, the condition):
the text after \"Actual value: \" or \"Actual values: \" up to its closing full stop."
  (let* ((start (search "Actual value" said))
         (colon (and start (position #\: said :start start)))
         (end (and colon (search (format nil ".~%") said :start2 colon))))
    (and colon (string-trim '(#\Space #\Newline) (one-line (subseq said (1+ colon) (or end (length said))) 300)))))

(defun rt-report (outcomes package)
  "The counts and failures of RT's OUTCOMES (one per test run; RT has one check per test): a test
whose values differ from the expected ones failed, one that signalled an error is an error."
  (let ((counts (list :passed 0 :failed 0 :errors 0))
        (failures '())
        (failure-count 0))
    (dolist (outcome (reverse outcomes))
      (destructuring-bind (&key name form expected failed compared said) outcome
        (cond ((not failed) (incf (getf counts :passed)))
              (t
               ;; RT compares the values only when the test returned: no comparison, it signalled.
               ;; (A later RT's deftest may name its own :TEST, whose comparison is not seen:
               ;; its failures count as errors.)
               (let ((kind (if compared :failed :errors)))
                 (incf (getf counts kind))
                 (incf failure-count)
                 (when (<= failure-count *max-kept-warnings*)
                   (push (list :kind (if compared "failure" "error")
                               :test (print-briefly name :package package)
                               :form (print-form-briefly form)
                               :reason (and (not compared)
                                            (format nil "The test signalled ~A." (or (rt-actual-text said) "an error")))
                               :expected (rt-values-text expected package)
                               :actual (and compared (rt-values-text (first compared) package)))
                         failures)))))))
    (framework-results "RT" (length outcomes) counts failures failure-count)))

(defun muffle-if-possible (warning)
  "Muffles WARNING when it can be (a warning SIGNALled rather than WARNed has no MUFFLE-WARNING
restart): compiling the system under test is not what the reply is about."
  (let ((restart (find-restart 'muffle-warning warning)))
    (when restart
      (invoke-restart restart))))

(define-entry test-activity (&key session token)
  "How far the session's running run-tests call is: (:ACTIVITY text or NIL)."
  (declare (ignore token))
  (let ((collection (session-test-run (find-session session))))
    (list :activity (and collection (plusp (collection-checks collection))
                         (format nil "~:D check~:P done, ~:D failed" (collection-checks collection)
                                 (collection-problems collection))))))

(define-entry run-tests (system &key suite test package session token (max-output 65536))
  "The run-tests tool: loads SYSTEM and runs the FiveAM or Parachute SUITE or the FiveAM,
Parachute or RT TEST named, or without either runs ASDF's TEST-SYSTEM on SYSTEM. Output goes to
:STDOUT. Returns (:SYSTEM :RAN :FRAMEWORKS :MILLISECONDS :RESULTS reports, one per framework that
ran, :COMPILER-ERRORS texts, :STDOUT (text dropped) :RUN-ERROR report-or-NIL)."
  (let* ((stdout (make-capture max-output))
         (*max-output* max-output)
         (*handles* (session-handles session))
         ;; What the tests start runs as the agent's (see observe.lisp).
         (*agent-session* (find-session session))
         (collection (make-instance 'test-collection))
         (started (get-internal-real-time))
         (target-package nil)
         (compiler-errors '())
         (ran nil))
    (setf (session-test-run (find-session session)) collection)
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
                      (flet ((building (function)
                               ;; The system's warnings are not what the reply is about; the
                               ;; compiler's errors say why it could not be built.
                               (handler-bind ((warning #'muffle-if-possible)
                                              (condition (lambda (condition)
                                                           (let ((text (compiler-error-text condition)))
                                                             (when text (push text compiler-errors))))))
                                 (funcall function))))
                        (building (lambda () (funcall (asdf-function "LOAD-SYSTEM") system)))
                        ;; Loading may have brought a framework in.
                        (change-test-hooks 0)
                        (cond ((or suite test)
                               (multiple-value-bind (framework name) (find-named-test (or suite test) target-package)
                                 (when (and suite (eq framework :rt))
                                   (fail "~A is an RT test, and RT has no suites: give it as test, or run the ~
                                          system's tests without suite." (name-text name target-package)))
                                 (setf ran (format nil "~A ~:[suite~;test~] ~A"
                                                   (ecase framework (:fiveam "FiveAM") (:parachute "Parachute") (:rt "RT"))
                                                   test (name-text name target-package)))
                                 (ecase framework
                                   (:fiveam (funcall (fiveam-symbol "RUN") name))
                                   (:parachute (funcall (parachute-symbol "TEST") name :report (parachute-symbol "PLAIN")))
                                   (:rt (funcall (find-symbol "DO-TEST" (rt-package-of name)) name)))))
                              (t
                               (setf ran (format nil "asdf:test-system ~S" system))
                               (building (lambda () (funcall (asdf-function "TEST-SYSTEM") system)))))))
                    (list :ok t))
                  :stdout stdout
                  :turn (list *asdf-turn* (format nil "run-tests of ~S" system)))
              (change-test-hooks -1)
              (setf (session-test-run (find-session session)) nil))))
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
                                        (list (parachute-report (collection-parachute-reports collection) package)))
                                   (and (collection-rt-outcomes collection)
                                        (list (rt-report (collection-rt-outcomes collection) package)))))
                :compiler-errors (reverse compiler-errors)
                :stdout (capture-report stdout)
                ;; Not :ERROR, which the server takes for a failure of the whole call: the
                ;; output and counts of a run that failed half-way are the reply too.
                :run-error (without-asdf-frames (getf result :error)))))))
