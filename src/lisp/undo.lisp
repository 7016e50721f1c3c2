;;;; The undo journal: every global function, macro and setf function definition an agent's tool
;;;; call replaces, with the definition it replaced and where that one's source was, so that the
;;;; undo tool can put it back. Methods and classes an agent's call defines are journaled too,
;;;; but only listed: a method or class cannot be put back as it was by swapping one object.
;;;;
;;;; The journal lives in the image (DEFVARs, which a reload of the helper keeps), so it outlives
;;;; the server process that made the entries, and it is bounded. Only definitions made while a
;;;; tool call runs (*AGENT-CALL*, bound by CALL-REGISTERED) are journaled: the user's own
;;;; redefinitions from Emacs are theirs to manage.
;;;;
;;;; SBCL tells about a function's replacement through SB-INT:*SETF-FDEFINITION-HOOK*, called
;;;; before the change. DEFMACRO, DEFMETHOD and DEFCLASS do not go through it, so their loaders
;;;; (SB-C::%DEFMACRO, SB-PCL::LOAD-DEFMETHOD, SB-PCL::LOAD-DEFCLASS) are encapsulated. These are
;;;; with the exit guard (evaluate.lisp), the helper's only changes that outlast a call; each costs
;;;; the image's own definitions one special-variable test when no agent call runs.
;;;;
;;;; Loaded after systems.lisp, under the rules of helper.lisp.

(in-package #:mcp-agent-helper)

(defvar *journal* '()
  "The journal's entries, newest first.")

(defvar *journal-lock* (sb-thread:make-mutex :name "mcp-agent-helper journal"))

(defvar *next-journal-number* 1
  "The number the next entry gets: entries keep their number for as long as the image runs.")

(defparameter *journal-limit* 500
  "Entries kept; the oldest go first. Each holds on to the function it replaced.")

(defparameter *journal-shown* 100
  "The newest entries the undo tool lists: more is more than a reader takes in.")

(defclass journal-entry ()
  ((number :initarg :number :reader entry-number)
   (time :initform (get-universal-time) :reader entry-time)
   ;; :FUNCTION, :MACRO, :METHOD or :CLASS; a setf function is a :FUNCTION named (SETF F).
   (kind :initarg :kind :reader entry-kind)
   (name :initarg :name :reader entry-name)
   ;; The function or macro function replaced, or NIL when there was none.
   (previous :initarg :previous :initform nil :reader entry-previous)
   ;; Where PREVIOUS was defined, as SB-INTROSPECT found it before the change.
   (source :initarg :source :initform nil :reader entry-source)
   (detail :initarg :detail :initform nil :reader entry-detail)
   (restored :initform nil :accessor entry-restored)))

(defun journal (kind name &key previous detail)
  "Adds an entry for NAME, whose definition of KIND an agent's call is about to make: a
replacement of PREVIOUS, or an addition (PREVIOUS nil, and every method and class)."
  (when (or *journal-additions* (and previous (member kind '(:function :macro))))
    (let ((source (and previous (ignore-errors (sb-introspect:find-definition-source previous)))))
      (sb-thread:with-mutex (*journal-lock*)
        (push (make-instance 'journal-entry :number *next-journal-number* :kind kind :name name
                                            :previous previous :source source :detail detail)
              *journal*)
        (incf *next-journal-number*)
        (when (> (length *journal*) *journal-limit*)
          (setf *journal* (subseq *journal* 0 *journal-limit*)))))))

(defun journaled-function-name-p (name)
  "Global function names an agent writes: a symbol or (SETF symbol); not the internal names SBCL
gives the functions of methods and the like, such as (SB-PCL::FAST-METHOD F (INTEGER))."
  (or (and (symbolp name) name)
      (and (consp name) (eq (first name) 'setf) (symbolp (second name)) (null (cddr name)))))

(defun note-fdefinition-change (name new-definition)
  "From SBCL's fdefinition hook, before NAME's global function becomes NEW-DEFINITION."
  (when (and *agent-call*
             (journaled-function-name-p name)
             ;; A new generic function comes with its methods, which are journaled themselves.
             (not (typep new-definition 'generic-function)))
    (let ((previous (and (fboundp name)
                         (not (and (symbolp name) (or (macro-function name) (special-operator-p name))))
                         (fdefinition name))))
      (unless (eq previous new-definition)
        (journal :function name :previous previous)))))

(defun journal-defmacro (definer name &rest arguments)
  "Encapsulates SB-C::%DEFMACRO: journals the macro NAME had before an agent's call redefines it."
  (when (and *agent-call* (symbolp name))
    (ignore-errors (journal :macro name :previous (macro-function name))))
  (apply definer name arguments))

(defun journal-defmethod (definer &rest arguments)
  "Encapsulates SB-PCL::LOAD-DEFMETHOD (class name qualifiers specializers ...): lists the method."
  (when *agent-call*
    (ignore-errors
     (destructuring-bind (class name qualifiers specializers &rest rest) arguments
       (declare (ignore class rest))
       (journal :method name
                :detail (print-briefly (append qualifiers
                                               (list (mapcar (lambda (specializer)
                                                               (if (typep specializer 'class)
                                                                   (class-name specializer)
                                                                   specializer))
                                                             specializers)))
                                       :package (symbol-package (if (consp name) (second name) name))
                                       :limit 200)))))
  (apply definer arguments))

(defun journal-defclass (definer name &rest arguments)
  "Encapsulates SB-PCL::LOAD-DEFCLASS: lists the class, saying whether it replaced one."
  (when (and *agent-call* (symbolp name))
    (ignore-errors (journal :class name :detail (if (find-class name nil) "(redefined)" "(new)"))))
  (apply definer name arguments))

(defvar *fdefinition-hook* nil
  "The function this helper put on SBCL's fdefinition hook: one closure for the life of the image,
which calls NOTE-FDEFINITION-CHANGE by name so that a reloaded helper's definition takes over.")

(defun install-journal-hooks ()
  "Puts the journal's hooks into the image once; a reload finds them there."
  (let ((hook (first (existing-symbols "SB-INT" "*SETF-FDEFINITION-HOOK*"))))
    (when (and hook (boundp hook))
      (unless *fdefinition-hook*
        ;; Errors are dropped: the hook runs inside every DEFUN of the image, whose definition
        ;; must never fail because the journal did.
        (setf *fdefinition-hook* (lambda (name new-definition)
                                   (ignore-errors (note-fdefinition-change name new-definition)))))
      (unless (member *fdefinition-hook* (symbol-value hook))
        (push *fdefinition-hook* (symbol-value hook)))))
  ;; Looked up, not named: the helper's load must not fail where SBCL lacks them.
  (loop for (package-name name wrapper) in '(("SB-C" "%DEFMACRO" journal-defmacro)
                                            ("SB-PCL" "LOAD-DEFMETHOD" journal-defmethod)
                                            ("SB-PCL" "LOAD-DEFCLASS" journal-defclass))
        for definer = (first (existing-symbols package-name name))
        when definer
          do (encapsulate-once definer 'mcp-agent-journal wrapper)))

(install-journal-hooks)

;;; ------------------------------------------------------------------------------------------
;;; The undo tool

(defun restorable-p (entry)
  (member (entry-kind entry) '(:function :macro)))

(defun kind-text (entry)
  (case (entry-kind entry)
    (:function (if (consp (entry-name entry)) "setf function" "function"))
    (:macro "macro")
    (:method "method")
    (:class "class")))

(defun entry-name-text (entry)
  "ENTRY's name, package-qualified: FOO::BAR, or (SETF FOO::BAR)."
  (let ((name (entry-name entry)))
    (if (consp name)
        (format nil "(~A ~A)" (symbol-name (first name)) (qualified-name (second name)))
        (qualified-name name))))

(defun time-text (universal-time)
  (multiple-value-bind (second minute hour day month year) (decode-universal-time universal-time 0)
    (format nil "~D-~2,'0D-~2,'0D ~2,'0D:~2,'0D:~2,'0D UTC" year month day hour minute second)))

(defun entry-plist (entry)
  "ENTRY as the undo tool shows it."
  (let ((previous (entry-previous entry)))
    (list :number (entry-number entry)
          :time (time-text (entry-time entry))
          :kind (kind-text entry)
          :name (entry-name-text entry)
          :detail (entry-detail entry)
          :restorable (and (restorable-p entry) t)
          :restored (entry-restored entry)
          :previous (cond ((not (restorable-p entry)) nil)
                          ((null previous) nil)
                          ((entry-source entry) (source-location (entry-source entry) (entry-name entry)))
                          (t (no-file-location (entry-name entry)))))))

(defun current-location (entry)
  "Where ENTRY's name is defined now, or NIL when it is not."
  (let* ((name (entry-name entry))
         (definition (if (eq (entry-kind entry) :macro)
                         (and (symbolp name) (macro-function name))
                         (and (fboundp name) (fdefinition name))))
         (source (and definition (ignore-errors (sb-introspect:find-definition-source definition)))))
    (cond ((null definition) nil)
          (source (source-location source name))
          (t (no-file-location name)))))

(defun restore-entry (entry)
  "Puts back the definition ENTRY replaced, or removes NAME's when there was none."
  (let ((name (entry-name entry))
        (previous (entry-previous entry))
        ;; Putting a definition back is no agent's redefinition to journal.
        (*agent-call* nil))
    (ecase (entry-kind entry)
      (:function (if previous (setf (fdefinition name) previous) (fmakunbound name)))
      (:macro (if previous (setf (macro-function name) previous) (fmakunbound name))))
    (setf (entry-restored entry) t)))

(defun undo-journal (&key entries since session token)
  "The undo tool. Without ENTRIES (a list of numbers) or SINCE (a number), lists the journal;
with them, restores those entries, or every entry from SINCE on, newest first. Returns a plist:
:ENTRIES, the journal oldest first (see ENTRY-PLIST); :RESTORED, (:NUMBER :NAME :KIND :NOW) for
each entry restored, :NOW where the name's definition is now or NIL; :SKIPPED, (:NUMBER :NAME
:REASON) for the named entries that were not restored; :LIMIT, the journal's size. :ENTRIES has
the newest *JOURNAL-SHOWN* entries only; :OLDER counts the others."
  (declare (ignore session))
  (run-tool token
            (lambda ()
              (let* ((journal (sb-thread:with-mutex (*journal-lock*) (copy-list *journal*)))
                     (wanted (cond (entries
                                    (dolist (number entries)
                                      (unless (find number journal :key #'entry-number)
                                        (fail "There is no journal entry ~D; call undo without arguments to list ~
                                               the entries (~:[the journal is empty~;~:*numbers ~D to ~D~])."
                                              number (and journal (entry-number (car (last journal))))
                                              (and journal (entry-number (first journal))))))
                                    (remove-if-not (lambda (entry) (member (entry-number entry) entries)) journal))
                                   (since
                                    (remove-if (lambda (entry) (< (entry-number entry) since)) journal))))
                     (restored '())
                     (skipped '()))
                ;; Newest first: when one call redefined a name twice, the oldest entry's
                ;; definition is the one left in place.
                (dolist (entry wanted)
                  (flet ((skip (reason)
                           (push (list :number (entry-number entry) :name (entry-name-text entry)
                                       :kind (kind-text entry) :reason reason)
                                 skipped)))
                    (cond ((entry-restored entry) (skip "already restored"))
                          ((not (restorable-p entry))
                           (skip (if (eq (entry-kind entry) :method)
                                     "methods cannot be restored automatically: remove it with REMOVE-METHOD or redefine it"
                                     "classes cannot be restored automatically: redefine the class as it was")))
                          (t (restore-entry entry)
                             (push (list :number (entry-number entry) :name (entry-name-text entry)
                                         :kind (kind-text entry) :now (current-location entry))
                                   restored)))))
                (list :entries (mapcar #'entry-plist (reverse (subseq journal 0 (min (length journal) *journal-shown*))))
                      :older (max 0 (- (length journal) *journal-shown*))
                      :restored (sort restored #'> :key (lambda (r) (getf r :number)))
                      :skipped (sort skipped #'< :key (lambda (s) (getf s :number)))
                      :limit *journal-limit*)))))
