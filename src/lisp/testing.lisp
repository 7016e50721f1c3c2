;;;; run-tests: a system's tests (ASDF's TEST-SYSTEM) or one named suite or test, with FiveAM's,
;;;; Parachute's and RT's results read as data: counts, and for each failure its test, form,
;;;; reason, expected and actual values.
;;;;
;;;; The frameworks are found by name
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
  "Failing tests described per reply at most; the others are kept behind a handle, up to
*MAX-KEPT-WARNINGS*, and the rest counted.")

(defparameter *failing-characters-shown* 2400
  "About how many characters of a red reply the failing tests' texts take (the first one whole,
however long): the summary and the suspects take the rest of the 4,000 a red reply keeps to; the
failing tests past them are behind a handle.")

(defvar *test-collection* nil
  "The TEST-COLLECTION of the run-tests call running in this thread.")

(defvar *fiveam-run-depth* 0
  "How many FiveAM RUNs this thread is inside: only the outermost one's results are the run's.")

(defvar *parachute-test-depth* 0)

(defvar *rt-entry-depth* 0)

(defvar *rt-comparison* nil
  "While an RT test runs: NIL, then the (actual expected) values its EQUALP-WITH-CASE compared.")

(defclass test-collection ()
  ((fiveam-runs :initform '() :accessor collection-fiveam-runs
                :documentation "The results of each outermost FiveAM run, newest first.")
   (parachute-reports :initform '() :accessor collection-parachute-reports)
   (rt-outcomes :initform '() :accessor collection-rt-outcomes)
   (expectations :initform '() :accessor collection-expectations)
   (checkers :initform '() :accessor collection-checkers
             :documentation "(form reason function) of each failing FiveAM check made in a function
of its own, not in the test's body: see CHECKING-FUNCTION.")
   (checks :initform 0 :accessor collection-checks)
   (problems :initform 0 :accessor collection-problems)))

(defun fiveam-symbol (name)
  (and (find-package '#:it.bese.fiveam) (find-symbol name '#:it.bese.fiveam)))

(defun collect-fiveam-run (run &rest arguments)
  (let* ((outermost (zerop *fiveam-run-depth*))
         (results (let ((*fiveam-run-depth* (1+ *fiveam-run-depth*)))
                    (apply run arguments))))
    (when (and outermost *test-collection* (listp results))
      (push results (collection-fiveam-runs *test-collection*)))
    results))

(defun outermost-fiveam-check-p ()
  "True while the checks being made are the outermost FiveAM run's, not a run a test started."
  (and *test-collection* (= *fiveam-run-depth* 1)))

(defun checking-function ()
  "The function of the test's code that the failing FiveAM check being recorded was made in, when
it is not the test's own body: a check in a helper the tests call (esrap's
CALL-EXPECTING-SIGNALS-ESRAP-ERROR) shows only its form, (INTEGERP POSITION), which reads as the
test's while it checks what the helper was given. NIL for a check in the test's body, and when
the check was the last form of its function, whose frame the compiler then reused for FiveAM's."
  (let ((fiveam (find-package '#:it.bese.fiveam)))
    (loop repeat 40
          for frame = (sbcl-call :top-frame) then (sbcl-call :frame-down frame)
          while frame
          do (let* ((name (ignore-errors (sbcl-call :debug-fun-name (sbcl-call :frame-debug-fun frame))))
                    ;; A check in a closure is made in the function the closure is in.
                    (named (if (consp name) (second (member :in name)) name))
                    (package (and named (symbolp named) (symbol-package named))))
               (cond ((eq package fiveam) (return nil))
                     ((and package
                           (or (member package (list (load-time-value (find-package '#:mcp-agent-helper))
                                                     (find-package '#:common-lisp)))
                               (eql 0 (search "SB-" (package-name package))))))
                     (t
                      (return (and package
                                   ;; FiveAM's own functions for a test's body.
                                   (not (eql 0 (search "%TEST-" (symbol-name named))))
                                   (not (eql 0 (search "%INNER-TEST-" (symbol-name named))))
                                   (not (funcall (fiveam-symbol "GET-TEST") named))
                                   named))))))))

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
  (when (outermost-fiveam-check-p)
    (let ((checker (checking-function)))
      (when checker
        (push (list test-expr (ignore-errors (apply #'format nil reason-format format-arguments)) checker)
              (collection-checkers *test-collection*)))))
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

(defun rt-package-of-entry (entry)
  "The RT package whose test ENTRY is: a structure's type is its RT's; a list is in the *ENTRIES*
of one of them."
  (if (consp entry)
      (find-if (lambda (package) (member entry (rt-package-entries package) :test #'eq)) (rt-packages))
      (symbol-package (type-of entry))))

(defun rt-entry-part (entry part)
  "PART (:PENDING :NAME :FORM or :VALUES, the expected ones) of the RT test ENTRY: a list
(pending name form . values) in SB-RT and the classic RT, a structure in later RTs, read with the
accessors of its own RT: an image may have two, SB-RT's NAME is a function of lists too, and
applied to another RT's structure it would name every test NIL."
  (if (consp entry)
      (ecase part (:pending (first entry)) (:name (second entry)) (:form (third entry)) (:values (cdddr entry)))
      (let* ((package (symbol-package (type-of entry)))
             (accessor (and package
                            (find-symbol (ecase part (:pending "PEND") (:name "NAME") (:form "FORM") (:values "VALS"))
                                         package))))
        (and accessor (fboundp accessor) (not (macro-function accessor))
             (ignore-errors (funcall accessor entry))))))

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
        (push (list :entry entry :name (rt-entry-part entry :name) :form (rt-entry-part entry :form)
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

(defun test-hooks-missing-p ()
  "Whether a run needs the encapsulations and a framework function loaded since lacks its own."
  (and (plusp *test-hooks-users*)
       (loop for (finder name hook) in *framework-hooks*
             for symbol = (funcall finder name)
             thereis (and symbol (fboundp symbol)
                          (not (sbcl-call :encapsulated-p symbol hook))))))

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
            do (let ((present (sbcl-call :encapsulated-p symbol hook)))
                 (cond ((and (plusp *test-hooks-users*) (not present))
                        (sbcl-call :encapsulate symbol hook hook))
                       ((and (zerop *test-hooks-users*) present)
                        (sbcl-call :unencapsulate symbol hook)))))))

(defun test-frameworks ()
  "The test frameworks this image has loaded, by name."
  (loop for (packages . name) in '((("IT.BESE.FIVEAM") . "FiveAM") (("PARACHUTE") . "Parachute")
                                   (("SB-RT" "REGRESSION-TEST") . "RT")
                                   (("ROVE") . "Rove") (("LISP-UNIT2") . "lisp-unit2"))
        when (some #'find-package packages) collect name))

(defparameter *frameworks-read* '("FiveAM" "Parachute" "RT")
  "The frameworks whose runs run-tests reads; others are only named.")

;;; ------------------------------------------------------------------------------------------
;;; Tallies: each framework's results, per distinct test
;;;
;;; A test-op may run its suite more than once (Alexandria's runs its RT tests interpreted, then
;;; compiled): the reply counts distinct tests, says how often they ran, and lists once a failure
;;; that every run repeats. A tally keeps each test's runs in order, and each failure with the run
;;; it belongs to.

(defclass test-tally ()
  ((framework :initarg :framework :reader tally-framework)
   (package :initarg :package :reader tally-package
            :documentation "The package test names are printed from.")
   (tests :initform (make-hash-table :test 'equal) :reader tally-tests
          :documentation "A test's name, printed -> its TESTED.")
   (order :initform '() :accessor tally-order
          :documentation "The TESTEDs, newest first.")
   (checks :initform (list :passed 0 :failed 0 :errors 0 :skipped 0) :accessor tally-checks)
   (kept :initform 0 :accessor tally-kept
         :documentation "Failures kept, at most *MAX-KEPT-WARNINGS*; the others are counted.")))

(defclass tested ()
  ((name :initarg :name :reader tested-name)
   ;; The package its forms and values are printed from, as its source reads: the package of
   ;; its name, or the tally's.
   (home :initarg :home :reader tested-home)
   ;; One per run of the test, newest first: :PASSED, :SKIPPED, :FAILED or :ERROR.
   (statuses :initform '() :accessor tested-statuses)
   ;; Newest first: (run kind form reason expected actual), RUN counting the test's runs from 1.
   (failures :initform '() :accessor tested-failures)))

(defun make-tally (framework package)
  (make-instance 'test-tally :framework framework :package package))

(defun tally-run (tally name)
  "Starts a run of the test NAME (a symbol or any object naming it) and returns its TESTED."
  (let* ((key (print-briefly name :package (tally-package tally)))
         (tested (or (gethash key (tally-tests tally))
                     (let ((new (make-instance 'tested :name key
                                                       ;; A test named by a keyword (nibbles' RT
                                                       ;; tests) has forms of another package.
                                                       :home (or (and (symbolp name) (not (keywordp name))
                                                                      (symbol-package name))
                                                                 (tally-package tally)))))
                       (push new (tally-order tally))
                       (setf (gethash key (tally-tests tally)) new)))))
    (push :passed (tested-statuses tested))
    tested))

(defparameter *status-severity* '(:passed :skipped :failed :error))

(defun tally-check (tally tested status)
  "Counts a check of TESTED's current run that ended with STATUS, which is that run's status when
it is the worst so far."
  (incf (getf (tally-checks tally) (ecase status (:passed :passed) (:skipped :skipped) (:failed :failed) (:error :errors))))
  (when (> (position status *status-severity*) (position (first (tested-statuses tested)) *status-severity*))
    (setf (first (tested-statuses tested)) status)))

(defun tally-failure (tally tested kind &key form checked-in reason expected actual)
  "Keeps a failure (KIND :FAILED or :ERROR) of TESTED's current run, with FORM, the check, made in
the function CHECKED-IN when not in the test's body, and REASON, EXPECTED and ACTUAL as texts."
  (when (< (tally-kept tally) *max-kept-warnings*)
    (incf (tally-kept tally))
    (push (list (length (tested-statuses tested)) kind
                (and form (let ((*package* (tested-home tested)))
                            ;; A test's form is read whole, as its source has it.
                            (format nil "~A~@[, checked in ~A~]"
                                    (print-form-briefly form :length 30 :level 12 :limit 600)
                                    (and checked-in (print-briefly checked-in :package (tested-home tested))))))
                reason expected actual)
          (tested-failures tested))))

(defun value-text (value tested)
  (print-briefly value :package (tested-home tested)))

(defun runs-text (runs)
  "Which runs RUNS (a list of numbers) are: \"run 2\", \"runs 1 and 3\"."
  (format nil "run~P ~{~D~#[~; and ~:;, ~]~}" (length runs) runs))

(defun failed-runs (tested)
  "The runs (numbers from 1) in which TESTED failed."
  (loop for status in (reverse (tested-statuses tested))
        for run from 1
        when (member status '(:failed :error)) collect run))

(defparameter *max-values-shown* 20
  "The failures of one check (a check in a loop) a failing test's text lists.")

(defparameter *max-checks-shown* 3
  "The failing checks of one test its text lists: a few say how it fails, and the handle after
them has every one.")

(defun distinct-failures (tested)
  "TESTED's failures, each once, in the order they came: (((kind form reason expected actual) nth)
. runs newest first). A failure repeated in another run is the same one; one repeated within a
run (a check in a loop failing alike) is another, and NTH, counting from 1, tells them apart: the
counts stay true."
  (let ((distinct '())
        (seen (make-hash-table :test 'equal)))
    (dolist (failure (reverse (tested-failures tested)))
      (destructuring-bind (run . fields) failure
        (let* ((key (list fields (incf (gethash failure seen 0))))
               (same (assoc key distinct :test #'equal)))
          (if same
              (push run (cdr same))
              (push (list key run) distinct)))))
    (reverse distinct)))

(defun times-text (times)
  (case times (1 nil) (2 "twice") (t (format nil "~D times" times))))

(defun failures-text (tested &optional limit)
  "TESTED's failures as the reply shows them under the line naming it: each check that failed
once, its form with its expected and actual values (or the reason, when there are no values); a
check that failed several times (in a loop) shows its form once with how many failures and how
many of them alike, then each distinct failure's values once, saying how many times it came, at
most LIMIT of them when given, and then at most *MAX-CHECKS-SHOWN* checks. A failure that only
some of the failing runs had says which. Returns the text, and whether LIMIT left failures out."
  (let ((failed-runs (failed-runs tested))
        (distinct (distinct-failures tested))
        (cut nil))
    (flet ((fields (entry) (first (first entry)))
           (check (entry) (subseq (first (first entry)) 0 2)))
      (values
       (with-output-to-string (out)
         (loop with checks = (remove-duplicates (mapcar #'check distinct) :test #'equal :from-end t)
               for check in checks
               for shown-checks from 1
               when (and limit (> shown-checks *max-checks-shown*))
                 do (format out "~%  ... ~D more failed check~:P" (- (length checks) *max-checks-shown*))
                    (setf cut t)
                    (loop-finish)
               do
           (let* ((group (remove-if-not (lambda (entry) (equal (check entry) check)) distinct))
                  (alike (remove-duplicates (mapcar #'fields group) :test #'equal :from-end t))
                  (times (mapcar (lambda (fields) (count fields group :key #'fields :test #'equal)) alike))
                  (several (rest group)))
             (format out "~@[~%  Form: ~A~]~:[~; (~D failures~@[, ~{~D~^ and ~} alike~])~]"
                     (second check) several (length group) (remove 1 times))
             (loop for fields in alike
                   for (nil nil reason expected actual) = fields
                   for n in times
                   ;; The runs of its first time: a failure the other runs lack is told apart.
                   for runs = (rest (find fields group :key #'fields :test #'equal))
                   for notes = (remove nil (list (times-text n)
                                                 (and (< (length runs) (length failed-runs))
                                                      (runs-text (reverse runs)))))
                   for shown from 1
                   do (cond ((and limit (> shown limit))
                             (format out "~%  ... ~D more" (reduce #'+ (nthcdr (1- shown) times)))
                             (setf cut t)
                             (loop-finish))
                            ((and expected actual several)
                             (format out "~%  Expected: ~A  Actual: ~A" expected actual))
                            ((and expected actual)
                             (format out "~%  Expected: ~A~%  Actual: ~A" expected actual))
                            (reason
                             ;; A reason of several lines (a condition's laid-out report) keeps
                             ;; its lines under the block's.
                             (format out "~%  Reason: ~A"
                                     (with-output-to-string (indented)
                                       (loop for char across reason
                                             do (write-char char indented)
                                                (when (char= char #\Newline)
                                                  (write-string "    " indented)))))))
                      (when (or reason (and expected actual))
                        (format out "~@[ (~{~A~^; ~})~]" notes))))))
       cut))))

(defun variant-stem (name)
  "NAME, a test's printed name, without its last part (after a dot, hyphen, slash or underscore),
or NIL when it has none: tests FOO.INTERPRETED and FOO.COMPILED (one body run two ways) are
variants of FOO, whose failures alike a reply shows once."
  (let* ((start (let ((colon (position #\: name :from-end t))) (if colon (1+ colon) 0)))
         (end (position-if (lambda (char) (find char "./-_")) name :start start :from-end t)))
    (and end (subseq name 0 end))))

(defun alike-groups (failing)
  "FAILING, the failing TESTEDs, in groups of variants (see VARIANT-STEM) that failed alike in the
same runs, each group in order, the groups in the order of their first test."
  (let ((groups '()))
    (dolist (tested failing)
      (let* ((key (list (or (variant-stem (tested-name tested)) (tested-name tested))
                        (failures-text tested) (failed-runs tested) (length (tested-statuses tested))))
             (group (assoc key groups :test #'equal)))
        (if group
            (push tested (cdr group))
            (push (list key tested) groups))))
    (mapcar (lambda (group) (reverse (rest group))) (reverse groups))))

(defun group-text (group &optional limit)
  "The failures GROUP (TESTEDs alike) had, as the reply shows them: one line naming every test in
it, then their failures (see FAILURES-TEXT). Returns the text, and whether LIMIT left failures
out."
  (let* ((tested (first group))
         (runs (length (tested-statuses tested)))
         (failed-runs (failed-runs tested)))
    (multiple-value-bind (failures cut) (failures-text tested limit)
      (values (format nil "[~:[FAIL~;ERROR~]] ~{~A~#[~; and ~:;, ~]~}~:[~; (alike)~]~@[ (failed in ~A only)~]~A"
                      (find :error (tested-failures tested) :key #'second)
                      (mapcar #'tested-name group) (rest group)
                      (and (< (length failed-runs) runs) (format nil "~A of ~D" (runs-text failed-runs) runs))
                      failures)
              cut))))

(defun group-shown-text (group)
  "GROUP's text as a reply shows it: at most *MAX-VALUES-SHOWN* failures of one check, and then a
handle of the whole text."
  (multiple-value-bind (text cut) (group-text group *max-values-shown*)
    (let ((handle (and cut (let ((whole (group-text group))) (text-handle whole 0 (length whole))))))
      (if handle
          (format nil "~A~%  [every failure of this test: inspect ~A]" text handle)
          text))))

(defun tally-report (tally)
  "The tally as run-tests replies with it: :FRAMEWORK; :TESTS, the distinct tests; :RUNS, how
many times each ran, and :UNIFORM, whether all ran that many times; :PASSED, :FAILED, :ERRORS and
:SKIPPED, the tests by their worst run; :FAILED-EVERY-RUN, the failing tests that failed in each
of their runs; :CHECKS, the checks of all runs by outcome; :FAILING, the failing tests of the
first groups alike (see ALIKE-GROUPS) whose texts fit in *FAILING-CHARACTERS-SHOWN*, at most
*MAX-TEST-FAILURES*, each (:TEST :SAME-AS :KIND
:FAILED-RUNS :TEXT :FAILURES): SAME-AS the first test of its group, for the others, which have no
TEXT; FAILURES the first *MAX-VALUES-SHOWN* failures, each (:RUN :FORM :REASON :EXPECTED
:ACTUAL); :FAILING-REST, the handle of every group's text and the offset of the first not shown
(see REST-LISTING); :FAILING-DROPPED, how many failing tests were not shown."
  (let* ((all (reverse (tally-order tally)))
         (counts (list :passed 0 :failed 0 :errors 0 :skipped 0))
         (runs (reduce #'max all :key (lambda (tested) (length (tested-statuses tested))) :initial-value 0))
         (failing (remove-if-not (lambda (tested) (intersection '(:failed :error) (tested-statuses tested))) all))
         (groups (alike-groups failing))
         (shown (loop with characters = 0
                      for group in groups
                      repeat *max-test-failures*
                      for text = (group-shown-text group)
                      while (or (zerop characters) (<= (+ characters (length text)) *failing-characters-shown*))
                      do (incf characters (length text))
                      collect (cons group text))))
    (dolist (tested all)
      (let ((worst (reduce (lambda (a b) (if (> (position b *status-severity*) (position a *status-severity*)) b a))
                           (tested-statuses tested))))
        (incf (getf counts (ecase worst (:passed :passed) (:skipped :skipped) (:failed :failed) (:error :errors))))))
    (list :framework (tally-framework tally)
          :tests (length all)
          :runs runs
          :uniform (every (lambda (tested) (= runs (length (tested-statuses tested)))) all)
          :passed (getf counts :passed) :failed (getf counts :failed)
          :errors (getf counts :errors) :skipped (getf counts :skipped)
          :failed-every-run (count-if (lambda (tested)
                                        (every (lambda (status) (member status '(:failed :error)))
                                               (tested-statuses tested)))
                                      failing)
          :checks (tally-checks tally)
          :failing (loop for (group . text) in shown
                         append (loop for tested in group
                                      for first = t then nil
                                      collect (list :test (tested-name tested)
                                                    :same-as (and (not first) (tested-name (first group)))
                                                    :kind (if (member :error (tested-statuses tested)) "error" "failure")
                                                    :failed-runs (failed-runs tested)
                                                    :text (and first text)
                                                    :failures (loop for (run kind form reason expected actual)
                                                                      in (reverse (tested-failures tested))
                                                                    repeat *max-values-shown*
                                                                    collect (list :run run
                                                                                  :kind (if (eq kind :error) "error" "failure")
                                                                                  :form form :reason reason
                                                                                  :expected expected :actual actual)))))
          :failing-rest (rest-listing (mapcar #'group-text groups) (length shown))
          :failing-dropped (loop for group in (nthcdr (length shown) groups) sum (length group)))))

;;; FiveAM

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
  "The tally of COLLECTION's FiveAM runs: each outermost run's results, a test's checks in it."
  (let* ((tally (make-tally "FiveAM" package))
         (expectations (reverse (collection-expectations collection)))
         ;; The place of each expectation: the order the checks failed in, which FiveAM's
         ;; results do not keep.
         (order (let ((table (make-hash-table :test 'eq)))
                  (loop for expectation in expectations for i from 0 do (setf (gethash expectation table) i))
                  table)))
    (dolist (results (reverse (collection-fiveam-runs collection)))
      (let ((in-this-run (make-hash-table :test 'eq))
            (failures '()))
        (dolist (result results)
          (let* ((kind (fiveam-result-kind result))
                 (test-case (slot-if-bound result "TEST-CASE"))
                 (name (or (and test-case (slot-if-bound test-case "NAME")) "(unnamed test)"))
                 (tested (or (gethash test-case in-this-run)
                             (setf (gethash test-case in-this-run) (tally-run tally name)))))
            (when kind
              (tally-check tally tested kind))
            (when (member kind '(:failed :error))
              (let* ((expr (slot-if-bound result "TEST-EXPR"))
                     (reason (slot-if-bound result "REASON"))
                     (expectation (and (eq kind :failed) expr
                                       (find-if (lambda (expectation)
                                                  (and (eq (first expectation) expr)
                                                       (equal (fourth expectation) reason)))
                                                expectations)))
                     (condition (and (eq kind :error) (slot-if-bound result "ACTUAL-CONDITION"))))
                (when expectation
                  (setf expectations (remove expectation expectations :count 1)))
                (push (list tested kind expr reason expectation condition) failures)))))
        (dolist (failure (stable-sort (nreverse failures) #'<
                                      :key (lambda (failure)
                                             (gethash (fifth failure) order most-positive-fixnum))))
          (destructuring-bind (tested kind expr reason expectation condition) failure
            (tally-failure tally tested kind
                           :form expr
                           :checked-in (third (find-if (lambda (checker)
                                                         (and (eq (first checker) expr) (equal (second checker) reason)))
                                                       (collection-checkers collection)))
                           :reason (cond (condition (format nil "~A: ~A" (standard-condition-name condition)
                                                            (condition-message condition)))
                                         ((stringp reason)
                                          (string-trim '(#\Space #\Newline) (fold-blank-lines reason))))
                           :expected (and expectation (value-text (second expectation) tested))
                           :actual (and expectation (value-text (third expectation) tested)))))))
    (tally-report tally)))

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

;;; Parachute

(defun parachute-report (reports package)
  "The tally of Parachute's REPORTS: in each, a test's result, then the results of its checks."
  (let ((tally (make-tally "Parachute" package))
        (test-result-class (find-class (parachute-symbol "TEST-RESULT") nil)))
    (flet ((call (name object) (ignore-errors (funcall (parachute-symbol name) object))))
      (dolist (report (reverse reports))
        (let ((tested nil))
          (loop for result across (coerce (funcall (parachute-symbol "RESULTS") report) 'vector)
                for status = (call "STATUS" result)
                do (cond ((and test-result-class (typep result test-result-class))
                          (let ((test (call "EXPRESSION" result)))
                            (setf tested (tally-run tally (or (call "NAME" test) test)))))
                         ((member status '(:passed :failed :skipped))
                          (unless tested
                            (setf tested (tally-run tally "(unnamed test)")))
                          (tally-check tally tested status)
                          (when (eq status :failed)
                            (parachute-failure tally tested result #'call)))))))
      (tally-report tally))))

(defun parachute-failure (tally tested result call)
  "Keeps the failed Parachute check RESULT of TESTED; CALL calls Parachute's readers."
  (let ((comparison (funcall call "COMPARISON" result)))
    (flet ((text (name) (value-text (funcall call name result) tested)))
      (tally-failure tally tested :failed
                     :form (funcall call "EXPRESSION" result)
                     :reason (or (funcall call "DESCRIPTION" result)
                                 (and comparison
                                      (format nil "~A evaluated to ~A, which is not ~A to ~A"
                                              (let ((*package* (tested-home tested)))
                                                (print-form-briefly (funcall call "VALUE-FORM" result)))
                                              (text "VALUE") (value-text comparison tested) (text "EXPECTED"))))
                     :expected (and comparison (text "EXPECTED"))
                     :actual (and comparison (text "VALUE"))))))

;;; RT

(defun rt-values-text (values tested)
  "An RT test's values as one text: the value, or (VALUES a b) for several."
  (value-text (if (= (length values) 1) (first values) (cons 'values values)) tested))

(defun rt-actual-text (said)
  "What RT printed as a failed test's actual value (for a test that signalled, the condition):
the text after \"Actual value: \" or \"Actual values: \" up to its closing full stop."
  (let* ((start (search "Actual value" said))
         (colon (and start (position #\: said :start start)))
         (end (and colon (search (format nil ".~%") said :start2 colon))))
    (and colon (string-trim '(#\Space #\Newline) (one-line (subseq said (1+ colon) (or end (length said))) 300)))))

(defun rt-report (outcomes package)
  "The tally of RT's OUTCOMES, one per test run (RT has one check per test): a test whose values
differ from the expected ones failed, one that signalled an error is an error."
  (let ((tally (make-tally "RT" package)))
    (dolist (outcome (reverse outcomes))
      (destructuring-bind (&key name form expected failed compared said &allow-other-keys) outcome
        (let ((tested (tally-run tally name))
              ;; RT compares the values only when the test returned: no comparison, it signalled.
              ;; (A later RT's deftest may name its own :TEST, whose comparison is not seen: its
              ;; failures count as errors.)
              (status (cond ((not failed) :passed) (compared :failed) (t :error))))
          (tally-check tally tested status)
          (unless (eq status :passed)
            (tally-failure tally tested status
                           :form form
                           :reason (and (not compared)
                                        (format nil "The test signalled ~A." (or (rt-actual-text said) "an error")))
                           :expected (rt-values-text expected tested)
                           :actual (and compared (rt-values-text (first compared) tested)))))))
    (tally-report tally)))


(defun test-framework-of (symbol)
  "The framework (:FIVEAM, :PARACHUTE or :RT) that has a suite or test named SYMBOL, or NIL."
  (cond ((not (and symbol (symbolp symbol))) nil)
        ;; FiveAM's suites may be named by keywords: (def-suite :jobq).
        ((and (fiveam-symbol "GET-TEST") (funcall (fiveam-symbol "GET-TEST") symbol)) :fiveam)
        ((keywordp symbol) nil)
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
        (let ((read (intersection frameworks *frameworks-read* :test #'string=)))
          (fail "~A names no test or suite of ~:[a framework run-tests understands (FiveAM, Parachute, RT); ~
                 frameworks loaded: ~:[none~;~:*~{~A~^, ~}~]. Run the whole system's tests without suite or ~
                 test~;~:*~{~A~^ or ~}~*~].~A"
                (name-text symbol package) read frameworks (tests-near name home))))
      (values framework symbol))))

(defparameter *max-build-warnings* 10
  "Compiler warnings of the build a run-tests reply lists; the others are counted.")

(defun build-warning-text (warning)
  "The text of WARNING, a full warning the compiler gave on a file of the system under test, with
its place; NIL for any other condition (style-warnings, a warning the tests give, or their COMPILE
gives). The compiler gives some at the end of the compilation unit, outside the file's
compilation, with the file's context."
  (let ((context (compiler-context)))
    (and (not (typep warning 'style-warning))
         (not (asdf-summary-warning-p warning))
         (not (muffled-by-sbcl-p warning))
         (or *compile-file-truename*
             (typep (and context (context-slot context :compiler-error-context-file-name)) '(or pathname string)))
         (format nil "~A: ~A~A" (warning-category warning) (compiler-message warning) (warning-place context)))))

(defun muffle-if-possible (warning)
  "Muffles WARNING when it can be (a warning SIGNALled rather than WARNed has no MUFFLE-WARNING
restart): what the build printed is not what the reply is about."
  (let ((restart (find-restart 'muffle-warning warning)))
    (when restart
      (invoke-restart restart))))

(defun output-handle (stdout report)
  "The handle of all the text STDOUT kept: the one REPORT (its CAPTURE-REPORT) names when it was
cut, else a new one; NIL when nothing was written or the call keeps no handles. A run's output
stays behind it: the reply says what the agent acts on."
  (or (third report)
      (let ((text (capture-kept-text stdout)))
        (and (plusp (length text)) (text-handle text 0 (length text))))))

(defun reloaded-sentence (reloaded)
  "What RELOADED (see RELOADED-FILES) says, as a sentence for a failure's text, or NIL."
  (destructuring-bind (&key files journal reset) reloaded
    (and files
         (format nil "Before that, ASDF reloaded ~D file~:P (~{~A~^, ~}~:[~;, ...~])~@[; undo entries ~{~D to ~D~} ~
                      have what they replaced~]~@[; its DEFPARAMETERs set ~{~A~^, ~} again~]."
                 (length files) (mapcar #'second (subseq files 0 (min 5 (length files))))
                 (> (length files) 5) journal reset))))

(define-entry (test-activity :caller :server) (&key session token)
  "How far the session's running run-tests call is: (:ACTIVITY text or NIL)."
  (declare (ignore token))
  (let ((collection (session-test-run (find-session session))))
    (list :activity (and collection (plusp (collection-checks collection))
                         (format nil "~:D check~:P done, ~:D failed" (collection-checks collection)
                                 (collection-problems collection))))))

(define-entry (run-tests :caller :server) (system &key suite test package session token (max-output 65536))
  "The run-tests tool: loads SYSTEM and runs the FiveAM or Parachute SUITE or the FiveAM,
Parachute or RT TEST named, or without either runs ASDF's TEST-SYSTEM on SYSTEM. Output goes to
:STDOUT. Returns (:SYSTEM :RAN :FRAMEWORKS :MILLISECONDS :RESULTS tallies, one per framework that
ran (see TALLY-REPORT), :COMPILER-ERRORS texts, :COMPILER-WARNINGS the first texts, and
:COMPILER-WARNING-COUNT, :RELOADED (see RELOADED-FILES), :SUSPECTS (see FIND-SUSPECTS), :STDOUT (text dropped ...),
:OUTPUT-HANDLE, :RUN-ERROR report-or-NIL)."
  (let* ((stdout (make-capture max-output))
         (*max-output* max-output)
         (*handles* (session-handles session))
         ;; What the tests start runs as the agent's (see exit-guard.lisp).
         (*agent-session* (find-session session))
         (collection (make-instance 'test-collection))
         (started (get-internal-real-time))
         (target-package nil)
         (compiler-errors '())
         (compiler-warnings '())
         (warning-count 0)
         (reloaded nil)
         (suspects nil)
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
                          (*journal-additions* nil)
                          (planned (planned-reloads (if (or suite test) "LOAD-OP" "TEST-OP") system))
                          (completed nil))
                      (flet ((building (function)
                               ;; The compiler's errors say why the system could not be built,
                               ;; its warnings where it may be wrong.
                               (handler-bind ((warning (lambda (warning)
                                                         (let ((text (build-warning-text warning)))
                                                           (when text
                                                             (when (< (length compiler-warnings) *max-build-warnings*)
                                                               (push text compiler-warnings))
                                                             (incf warning-count)))
                                                         (muffle-if-possible warning)))
                                              (condition (lambda (condition)
                                                           (let ((text (compiler-error-text condition)))
                                                             (when text (push text compiler-errors))))))
                                 (funcall function))))
                        (unwind-protect
                             (progn
                               (building (lambda () (funcall (asdf-function "LOAD-SYSTEM") system)))
                               ;; Loading may have brought a framework in.
                               (change-test-hooks 0)
                               (cond ((or suite test)
                                      (multiple-value-bind (framework name)
                                          (find-named-test (or suite test) target-package)
                                        (when (and suite (eq framework :rt))
                                          (fail "~A is an RT test, and RT has no suites: give it as test, or run ~
                                                 the system's tests without suite." (name-text name target-package)))
                                        (setf ran (format nil "~A ~:[suite~;test~] ~A"
                                                          (ecase framework (:fiveam "FiveAM") (:parachute "Parachute") (:rt "RT"))
                                                          test (name-text name target-package)))
                                        (ecase framework
                                          (:fiveam (funcall (fiveam-symbol "RUN") name))
                                          (:parachute (funcall (parachute-symbol "TEST") name
                                                               :report (parachute-symbol "PLAIN")))
                                          (:rt (funcall (find-symbol "DO-TEST" (rt-package-of name)) name)))))
                                     (t
                                      (setf ran (format nil "asdf:test-system ~S" system))
                                      (building (lambda () (funcall (asdf-function "TEST-SYSTEM") system)))))
                               (setf completed t))
                          ;; The test-op loads the test system too: what was reloaded is known
                          ;; once it ran.
                          (setf reloaded (reloaded-files planned completed))
                          ;; A test-op that signals because tests failed (anaphora's does) has
                          ;; its suspects too.
                          (setf suspects (suspects-or-why system collection target-package)))))
                    (list :ok t))
                  :stdout stdout
                  :turn (list *asdf-turn* (format nil "run-tests of ~S" system)))
              (change-test-hooks -1)
              (setf (session-test-run (find-session session)) nil))))
      (if (getf result :failure)
          ;; ASDF's reload before the failure changed the image: said, with where undo has it.
          (list :failure (format nil "~A~@[~%~A~]" (getf result :failure) (reloaded-sentence reloaded)))
          (let ((report (capture-report stdout)))
            (list :system system
                  :ran ran
                  :frameworks (test-frameworks)
                  :milliseconds (round (* 1000 (- (get-internal-real-time) started)) internal-time-units-per-second)
                  :results (let ((package (or target-package *package*)))
                             (append (and (collection-fiveam-runs collection)
                                          (list (fiveam-report collection package)))
                                     (and (collection-parachute-reports collection)
                                          (list (parachute-report (collection-parachute-reports collection) package)))
                                     (and (collection-rt-outcomes collection)
                                          (list (rt-report (collection-rt-outcomes collection) package)))))
                  :compiler-errors (reverse compiler-errors)
                  :compiler-warnings (reverse compiler-warnings)
                  :compiler-warning-count warning-count
                  :reloaded reloaded
                  :suspects suspects
                  :stdout report
                  :output-handle (output-handle stdout report)
                  ;; Not :ERROR, which the server takes for a failure of the whole call: the
                  ;; output and counts of a run that failed half-way are the reply too.
                  :run-error (without-asdf-frames (getf result :error))))))))
