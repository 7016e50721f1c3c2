;;;; The undo journal: every global function, macro, setf function, method and class definition
;;;; an agent's own code makes in the image, with the definition it replaced and where that one's
;;;; source was, so that the undo tool can put it back: a function or macro gets its previous
;;;; definition again, a method the agent added is removed (and the one it replaced put back), a
;;;; class the agent redefined is made again from its previous definition.
;;;;
;;;; The journal lives in the image (DEFVARs, which a reload of the helper keeps), so it outlives
;;;; the server process that made the entries, and it is bounded. Only definitions made while a
;;;; tool call runs (*AGENT-CALL*, bound by CALL-REGISTERED) are journaled: the user's own
;;;; redefinitions from Emacs are theirs to manage. Within a call, what is not the agent's code
;;;; is left out: a module loaded by REQUIRE (whoever asks: the profile tool's SB-SPROF, or an
;;;; agent's own (require :sb-posix)), whose half-undone definitions would leave a module that
;;;; REQUIRE believes loaded and that does not work; and definitions of uninterned names, which
;;;; macroexpansion makes (LOOP's hash-table iterators) and no one can name to call. A system
;;;; the agent loads (load-system, run-tests, or ASDF called from its code) is the agent's work,
;;;; but only its replacements are journaled (*JOURNAL-ADDITIONS*): its hundreds of new
;;;; definitions would push them out of the bounded journal.
;;;;
;;;; Each entry keeps the agent's definition too, so that undo can tell whether the name still
;;;; holds it: a definition changed since (by the user at their REPL, by another agent's call)
;;;; is not overwritten unless the caller forces it.
;;;;
;;;; One call makes one entry per name it redefines, however many times it defines it: what the
;;;; image held before the call, replaced by what it holds after. Compiling a file defines its
;;;; macros (and what EVAL-WHEN evaluates) once when the compiler meets them and again when the
;;;; fasl loads, and an agent may well define a function twice in one evaluation: the later
;;;; definition continues the call's entry for the name (or, for a name the call made anew while
;;;; additions are not journaled, makes none), so that the journal an agent reads lists each
;;;; change once, and undoing it puts back what was there before the call.
;;;;
;;;; SBCL tells about a function's replacement through SB-INT:*SETF-FDEFINITION-HOOK*, called
;;;; before the change. DEFMACRO, DEFMETHOD and DEFCLASS do not go through it, so their loaders
;;;; (SB-C::%DEFMACRO, SB-PCL::LOAD-DEFMETHOD, SB-PCL::LOAD-DEFCLASS) are encapsulated. Both are
;;;; installed with the rest of the helper's footprint (footprint.lisp); each costs the image's own
;;;; definitions one special-variable test when no agent call runs.

(in-package #:mcp-agent-helper)

(defparameter *calls-remembered* 16
  "Agent calls whose definitions *CALLS-DEFINITIONS* keeps: more than run at once.")

(defun forget-journal ()
  "Drops every entry, and with them the definitions they kept, for UNINSTALL."
  (sb-thread:with-mutex (*journal-lock*)
    (setf *journal* '()
          *calls-definitions* '())))

(defparameter *journal-limit* 500
  "Entries kept; the oldest go first. Each holds on to the function it replaced.")

(defparameter *journal-shown* 100
  "The newest entries listed when the caller asks for no page size.")

(defun journal-cause ()
  "What is making the change being journaled, as the listing tells it: the agent's tool, and the
file being loaded when that is not the agent's own text (a tool's private copy), so that an
ASDF reload's hundred entries (run-tests after an edit) are told from the agent's edits."
  (let* ((tool (nth-value 1 (token-call *agent-call*)))
         (loading (and *load-truename*
                       (not (search "mcp-agent-load-" (namestring *load-truename*)))
                       (file-namestring *load-truename*))))
    (and tool (format nil "~A~@[, loading ~A~]" tool loading))))

(defclass journal-entry ()
  ((number :initarg :number :reader entry-number)
   (time :initform (get-universal-time) :reader entry-time)
   (cause :initform (journal-cause) :reader entry-cause)
   ;; :FUNCTION, :MACRO, :METHOD or :CLASS; a setf function is a :FUNCTION named (SETF F).
   (kind :initarg :kind :reader entry-kind)
   (name :initarg :name :reader entry-name)
   ;; What the agent's definition replaced, or NIL when there was none: the function, the macro
   ;; function, the method with the same qualifiers and specializers, or the class's definition
   ;; as CLASS-DEFINITION gives it.
   (previous :initarg :previous :initform nil :reader entry-previous)
   ;; Where PREVIOUS was defined, as SB-INTROSPECT found it before the change.
   (source :initarg :source :initform nil :reader entry-source)
   ;; The agent's definition: the function, macro function or method object, or the class's
   ;; CLASS-SHAPE; what the name must still hold for undo to restore without being forced.
   (installed :initarg :installed :initform nil :accessor entry-installed)
   ;; For a class, where the agent's DEFCLASS was, found just after it: the class object itself
   ;; then takes any later definition's place. Functions and methods keep their own.
   (installed-source :initform nil :accessor entry-installed-source)
   (detail :initarg :detail :initform nil :reader entry-detail)
   (restored :initform nil :accessor entry-restored)))

(defparameter *requiring-variable* (sbcl-symbol :*requiring*)
  "SBCL's list of the modules REQUIRE is loading, in this thread: non-NIL inside a REQUIRE.")

(defun journaling-p (name)
  "Whether a definition of NAME made now is an agent's own: made during an agent's call, not while
a module is REQUIREd, and of a name someone can call (an interned symbol, or (SETF symbol))."
  (and *agent-call*
       (not (and *requiring-variable* (boundp *requiring-variable*) (symbol-value *requiring-variable*)))
       (let ((symbol (if (and (consp name) (eq (first name) 'setf) (consp (rest name)) (null (cddr name)))
                         (second name)
                         name)))
         (and symbol (symbolp symbol) (symbol-package symbol) t))))

(defun definition-source (object)
  (and object (ignore-errors (sb-introspect:find-definition-source object))))

(defun call-definitions ()
  "The table of the definitions the running agent call made (see *CALLS-DEFINITIONS*); under
*JOURNAL-LOCK*."
  (or (cdr (assoc *agent-call* *calls-definitions* :test #'eq))
      (let ((table (make-hash-table :test 'eq)))
        (push (cons *agent-call* table) *calls-definitions*)
        (when (> (length *calls-definitions*) *calls-remembered*)
          (setf *calls-definitions* (subseq *calls-definitions* 0 *calls-remembered*)))
        table)))

(defun note-installed (entry definition)
  "Records DEFINITION, which the running agent call has just made, as ENTRY's (NIL when the call
made it anew and it is not journaled)."
  (sb-thread:with-mutex (*journal-lock*)
    (when entry
      (setf (entry-installed entry) definition))
    (when definition
      (setf (gethash definition (call-definitions)) entry))))

(defun journal (kind name &key previous (source (and (functionp previous) (definition-source previous)))
                                installed detail)
  "Journals the running agent call's change of NAME's definition of KIND from PREVIOUS (whose
definition source is SOURCE; NIL when there was none) to INSTALLED (when known before the
change, else see NOTE-INSTALLED; NIL for a removal). When PREVIOUS is a definition this call made
itself, the call's entry for NAME goes on instead, holding what the image had before the call.
Returns the entry, or NIL when there is none (additions are not journaled now)."
  (let ((entry (sb-thread:with-mutex (*journal-lock*)
                 (multiple-value-bind (own madep) (if previous (gethash previous (call-definitions)) (values nil nil))
                   (cond (madep own)
                         ((or previous *journal-additions*)
                          ;; Its file's compile date, which a method or a class of that file
                          ;; recorded later has none of, is known once the function is replaced.
                          (note-compile-date source)
                          (let ((entry (make-instance 'journal-entry :number *next-journal-number* :kind kind
                                                                     :name name :previous previous :source source
                                                                     :detail detail)))
                            (push entry *journal*)
                            (incf *next-journal-number*)
                            (when (> (length *journal*) *journal-limit*)
                              (setf *journal* (subseq *journal* 0 *journal-limit*)))
                            entry)))))))
    (note-installed entry installed)
    entry))

(defun note-fdefinition-change (name new-definition)
  "From SBCL's fdefinition hook, before NAME's global function becomes NEW-DEFINITION."
  (note-load-definition name :function)
  (when (and (journaling-p name)
             ;; A new generic function comes with its methods, which are journaled themselves.
             (not (typep new-definition 'generic-function)))
    (let ((previous (and (fboundp name)
                         (not (and (symbolp name) (or (macro-function name) (special-operator-p name))))
                         (fdefinition name))))
      (unless (eq previous new-definition)
        (journal :function name :previous previous :installed new-definition)))))

(defun journal-defmacro (definer name &rest arguments)
  "Encapsulates SB-C::%DEFMACRO: journals the macro NAME had before an agent's call redefines it,
and the one the call makes."
  (note-load-definition name :macro)
  (let* ((journaling (journaling-p name))
         (entry (and journaling (ignore-errors (journal :macro name :previous (macro-function name))))))
    (multiple-value-prog1 (apply definer name arguments)
      (when journaling
        (ignore-errors (note-installed entry (macro-function name)))))))

(defun journal-defparameter (definer name value &rest arguments)
  "Encapsulates SB-IMPL::%DEFPARAMETER: journals the value NAME had before an agent's call sets
it again to another one. A load of the person's file (an edit's, or ASDF's reload before
run-tests) runs its DEFPARAMETERs, and a value the person set at their REPL is their data."
  (let ((entry (and (journaling-p name) (symbolp name) (boundp name)
                    (not (equalp (symbol-value name) value))
                    ;; Boxed, so that a NIL value is a previous one too.
                    (ignore-errors (journal :variable name :previous (list (symbol-value name))
                                                           :detail (format nil "(was ~A)"
                                                                           (print-briefly (symbol-value name)
                                                                                          :package (symbol-package name)
                                                                                          :length 5 :level 2 :limit 80)))))))
    (multiple-value-prog1 (apply definer name value arguments)
      (when entry
        (ignore-errors (note-installed entry (list (symbol-value name))))))))

(defun variables-reset (first last)
  "The variables journal entries FIRST to LAST set again, each \"NAME (was VALUE)\"."
  (sb-thread:with-mutex (*journal-lock*)
    (loop for entry in (reverse *journal*)
          when (and (eq (entry-kind entry) :variable) (<= first (entry-number entry) last))
            collect (format nil "~A ~A" (entry-name-text entry) (entry-detail entry)))))

(defun generic-function-named (name)
  (and (fboundp name) (typep (fdefinition name) 'generic-function) (fdefinition name)))

(defun specializer-text (specializer)
  (typecase specializer
    (class (class-name specializer))
    (sb-mop:eql-specializer (list 'eql (sb-mop:eql-specializer-object specializer)))
    (t specializer)))

(defun method-detail (method name)
  "METHOD's qualifiers and specializers, as (:AROUND (CIRCLE T))."
  (print-briefly (append (method-qualifiers method)
                         (list (mapcar #'specializer-text (sb-mop:method-specializers method))))
                 :package (symbol-package (if (consp name) (second name) name))
                 :limit 200))

(defun journal-defmethod (definer &rest arguments)
  "Encapsulates SB-PCL::LOAD-DEFMETHOD (class name qualifiers specializers ...): journals the
method an agent's call adds, and the one with the same qualifiers and specializers it replaces."
  (let* ((name (second arguments))
         (journaling (journaling-p name))
         (before (and journaling
                      (ignore-errors (let ((generic (generic-function-named name)))
                                       (and generic (copy-list (sb-mop:generic-function-methods generic))))))))
    (multiple-value-prog1 (apply definer arguments)
      (when journaling
        (ignore-errors
         ;; PCL puts a new method first, and the one it replaces has its qualifiers and
         ;; specializers (interned objects): a test per method, not a search through all of them
         ;; per method, which made a call defining N methods of one function cost N^3.
         (let* ((after (sb-mop:generic-function-methods (generic-function-named name)))
                (added (let ((newest (first after))) (and newest (not (member newest before)) newest)))
                (replaced (and added
                               (find-if (lambda (method)
                                          (and (equal (method-qualifiers method) (method-qualifiers added))
                                               (equal (sb-mop:method-specializers method)
                                                      (sb-mop:method-specializers added))))
                                        before))))
           (when added
             (journal :method name :previous replaced :source (definition-source replaced)
                                   :installed added :detail (method-detail added name)))))))))

(defun slot-definition-plist (slot)
  "SLOT, a direct slot definition, as ENSURE-CLASS's :DIRECT-SLOTS takes it."
  (append (list :name (sb-mop:slot-definition-name slot)
                :initargs (sb-mop:slot-definition-initargs slot)
                :readers (sb-mop:slot-definition-readers slot)
                :writers (sb-mop:slot-definition-writers slot)
                :allocation (sb-mop:slot-definition-allocation slot)
                :type (sb-mop:slot-definition-type slot))
          (let ((documentation (documentation slot t)))
            (and documentation (list :documentation documentation)))
          (and (sb-mop:slot-definition-initfunction slot)
               (list :initform (sb-mop:slot-definition-initform slot)
                     :initfunction (sb-mop:slot-definition-initfunction slot)))))

(defparameter *class-source-slot* (sbcl-symbol :source)
  "The slot of a PCL class that holds where it was defined, which DEFCLASS sets.")

(defun class-definition (class)
  "What ENSURE-CLASS takes to make CLASS again as it is now: a plist of its arguments."
  (append (list :metaclass (class-name (class-of class))
                :direct-superclasses (sb-mop:class-direct-superclasses class)
                :direct-slots (mapcar #'slot-definition-plist (sb-mop:class-direct-slots class))
                :direct-default-initargs (sb-mop:class-direct-default-initargs class)
                :documentation (documentation class t))
          ;; Not an initarg: RESTORE-ENTRY sets the slot itself.
          (let ((source (and *class-source-slot* (ignore-errors (slot-value class *class-source-slot*)))))
            (and source (list :definition-source source)))))

(defun class-shape (class)
  "CLASS's definition as a list comparable with EQUAL (no functions): its superclasses' names, its
direct slots and default initargs, or NIL when CLASS is no standard class."
  (and (typep class 'standard-class)
       (list (mapcar #'class-name (sb-mop:class-direct-superclasses class))
             (mapcar (lambda (slot)
                       (let ((plist (copy-list (slot-definition-plist slot))))
                         (remf plist :initfunction)
                         plist))
                     (sb-mop:class-direct-slots class))
             (mapcar (lambda (initarg) (subseq initarg 0 2)) (sb-mop:class-direct-default-initargs class)))))

(defun journal-defclass (definer name &rest arguments)
  "Encapsulates SB-PCL::LOAD-DEFCLASS: journals the class an agent's call defines, with the
definition it had before when it is redefined."
  (let* ((journaling (journaling-p name))
         (class (and journaling (find-class name nil)))
         (entry (and journaling
                     (ignore-errors
                      (journal :class name
                               :previous (and (typep class 'standard-class) (class-definition class))
                               :source (and (typep class 'standard-class) (definition-source class))
                               :detail (if (typep class 'standard-class) "(redefined)" "(new)"))))))
    (multiple-value-prog1 (apply definer name arguments)
      (when entry
        (ignore-errors
         (setf (entry-installed entry) (class-shape (find-class name))
               (entry-installed-source entry) (definition-source (find-class name))))))))

;;; ------------------------------------------------------------------------------------------
;;; The undo tool

(defun restorable-p (entry)
  "Whether undo can put ENTRY's previous state back: a new class cannot be taken out of the image."
  (or (member (entry-kind entry) '(:function :macro :method :variable))
      (and (eq (entry-kind entry) :class) (entry-previous entry))))

(defun kind-text (entry)
  (case (entry-kind entry)
    (:function (if (consp (entry-name entry)) "setf function" "function"))
    (:macro "macro")
    (:method "method")
    (:class "class")
    (:variable "variable")))

(defun entry-name-text (entry)
  "ENTRY's name, package-qualified: FOO::BAR, or (SETF FOO::BAR)."
  (let ((name (entry-name entry)))
    (if (consp name)
        (format nil "(~A ~A)" (symbol-name (first name)) (qualified-name (second name)))
        (qualified-name name))))

(defun time-text (universal-time)
  (multiple-value-bind (second minute hour day month year) (decode-universal-time universal-time 0)
    (format nil "~D-~2,'0D-~2,'0D ~2,'0D:~2,'0D:~2,'0D UTC" year month day hour minute second)))

(defun location-of (source name definition)
  "The location plist of the SB-INTROSPECT definition source SOURCE of NAME's DEFINITION; a no-file
one for NIL. A definition without a file that an agent's call made is not the user's REPL's."
  (let ((location (if source (source-location source name) (no-file-location name))))
    (when (and (null (getf location :file)) definition
               (find definition *journal* :key #'entry-installed :test #'eq))
      (setf (getf location :origin) "defined by an agent's tool call, no source file"))
    location))

(defun file-location-of (source name)
  "SOURCE's location when it is in a file, else NIL."
  (let ((location (and source (source-location source name))))
    (and (getf location :file) location)))

(defun location-plist-text (location)
  "A location plist (SOURCE-LOCATION) as file:line:column, or why there is no file."
  (destructuring-bind (&key file line column origin &allow-other-keys) location
    (cond ((null file) (or origin "no source file"))
          ((and line column) (format nil "~A:~D:~D" file line column))
          (line (format nil "~A:~D" file line))
          (t file))))

(defun where-text (location)
  "Where a location plist says a definition was made, to follow \"now\": \"defined at file:line\",
or its origin, which already says \"defined at the REPL\" or \"built into SBCL\"."
  (if (getf location :file)
      (format nil "defined at ~A" (location-plist-text location))
      (location-plist-text location)))

(defun unrestorable-reason (entry)
  (format nil "the class was new, and a class cannot be taken out of the image: (setf (find-class '~A) nil) ~
               takes its name away (its instances and methods stay), or restart the image"
          (entry-name-text entry)))

(defun entry-plist (entry)
  "ENTRY as the undo tool shows it; :AGENT-FILE is where the agent's definition came from, when
that was a file, which undo leaves as it is."
  (list :number (entry-number entry)
        :time (time-text (entry-time entry))
        :kind (kind-text entry)
        :name (entry-name-text entry)
        :detail (entry-detail entry)
        :cause (entry-cause entry)
        :restorable (and (restorable-p entry) t)
        :restored (entry-restored entry)
        :previous (and (entry-previous entry) (not (eq (entry-kind entry) :variable))
                       (location-of (entry-source entry) (entry-name entry) (entry-previous entry)))
        :note (and (not (restorable-p entry)) (unrestorable-reason entry))
        :agent-file (agent-file entry)))

(defun current-definition (entry)
  "What ENTRY's name holds now, in the terms of ENTRY-INSTALLED: NIL when nothing."
  (let ((name (entry-name entry)))
    (ecase (entry-kind entry)
      (:function (and (fboundp name)
                      (not (and (symbolp name) (or (macro-function name) (special-operator-p name))))
                      (fdefinition name)))
      (:macro (macro-function name))
      (:method (let ((installed (entry-installed entry))
                     (generic (generic-function-named name)))
                 (and generic
                      (find-method generic (method-qualifiers installed) (sb-mop:method-specializers installed) nil))))
      (:class (class-shape (find-class name nil)))
      (:variable (and (boundp name) (list (symbol-value name)))))))

(defun current-source (entry)
  "Where the definition ENTRY's name holds now was made, or NIL."
  (let ((name (entry-name entry)))
    (case (entry-kind entry)
      (:class (definition-source (find-class name nil)))
      (:variable nil)
      (t (definition-source (current-definition entry))))))

(defun same-definition-p (entry definition)
  (case (entry-kind entry)
    (:class (equal definition (entry-installed entry)))
    ;; Values are boxed: the same value is the same object in the box.
    (:variable (and definition (entry-installed entry) (eq (first definition) (first (entry-installed entry)))))
    (t (eq definition (entry-installed entry)))))

(defun changed-since (entry journal)
  "NIL when ENTRY's name still holds the agent's definition ENTRY made; else what changed it."
  (let ((now (current-definition entry)))
    (unless (same-definition-p entry now)
      (let ((later (find-if (lambda (other)
                              (and (> (entry-number other) (entry-number entry))
                                   (eq (entry-kind other) (entry-kind entry))
                                   (equal (entry-name other) (entry-name entry))
                                   (not (entry-restored other))
                                   (same-definition-p other now)))
                            journal)))
        (cond (later
               (format nil "changed since: journal entry ~D (a later agent call) redefined it; undo that entry first"
                       (entry-number later)))
              ((null now)
               (format nil "changed since: it is no longer defined (removed after the agent's call, not by a ~
                            journaled agent call)"))
              (t
               (format nil "changed since: redefined after the agent's call, not by a journaled agent call (by ~
                            the user at their REPL, a file load, or another program), now ~A"
                       (where-text (location-of (current-source entry) (entry-name entry) now)))))))))

(defun restore-entry (entry)
  "Puts back the definition ENTRY replaced, or removes the agent's when there was none."
  (let ((name (entry-name entry))
        (previous (entry-previous entry))
        ;; Putting a definition back is no agent's redefinition to journal.
        (*agent-call* nil))
    ;; The definition being put back was made in its package (a system's load binds *PACKAGE*
    ;; to it), where a locked package such as Alexandria's lets it be made: from here the lock
    ;; would refuse it, and offer restarts no agent can choose.
    (sb-ext:without-package-locks
     (ecase (entry-kind entry)
       (:function (if previous (setf (fdefinition name) previous) (fmakunbound name)))
       (:macro (if previous (setf (macro-function name) previous) (fmakunbound name)))
       (:method (let ((installed (entry-installed entry)))
                  (let ((generic (sb-mop:method-generic-function installed)))
                    (when generic
                      (remove-method generic installed))
                    (when (and previous generic (null (sb-mop:method-generic-function previous)))
                      (add-method generic previous)))))
       (:variable (setf (symbol-value name) (first previous)))
       (:class (let ((arguments (copy-list previous)))
                 (remf arguments :definition-source)
                 (let ((class (apply #'sb-mop:ensure-class name arguments))
                       (source (getf previous :definition-source)))
                   ;; So that find-definition points where the previous definition was again.
                   (when source
                     (setf (slot-value class *class-source-slot*) source)))))))
    (setf (entry-restored entry) t)))

(defun restored-plist (entry)
  (list :number (entry-number entry) :name (entry-name-text entry) :kind (kind-text entry)
        :detail (entry-detail entry)
        :now (let ((now (current-definition entry)))
               (and now (not (eq (entry-kind entry) :variable))
                    (location-of (current-source entry) (entry-name entry) now)))
        :agent-file (agent-file entry)))

(defun agent-file (entry)
  "Where the agent's definition ENTRY made came from, when it was a file (edit-lisp-form's load,
load-form, load-file): a location plist, or NIL."
  (and (not (eq (entry-kind entry) :variable))
       (file-location-of (if (eq (entry-kind entry) :class)
                             (entry-installed-source entry)
                             (definition-source (entry-installed entry)))
                         (entry-name entry))))

(defun journal-page (journal before page-size)
  "The entries of JOURNAL (newest first) numbered below BEFORE (all when NIL), the newest
PAGE-SIZE of them: (values page-oldest-first older newer)."
  (let* ((newer (if before (count-if (lambda (entry) (>= (entry-number entry) before)) journal) 0))
         (candidates (nthcdr newer journal))
         (page (subseq candidates 0 (min (length candidates) page-size))))
    (values (reverse page) (- (length candidates) (length page)) newer)))

(define-entry (undo-journal :caller (:server :emacs)) (&key entries since force before page-size session token)
  "The undo tool. Without ENTRIES (a list of numbers) or SINCE (a number), lists the journal: the
newest PAGE-SIZE entries (default *JOURNAL-SHOWN*) numbered below BEFORE (default: all). With
them, restores those entries, or every entry from SINCE on, newest first; an entry whose name was
changed since the agent's call is skipped unless FORCE. Returns a plist: :LISTED, whether this is
a listing; :ENTRIES, the page oldest first (see ENTRY-PLIST), with :OLDER and :NEWER counting the
entries before and after it; :RESTORED, (:NUMBER :NAME :KIND :DETAIL :NOW :AGENT-FILE) for each
entry restored, :NOW where the name's definition is now or NIL, :AGENT-FILE the file location the
agent's definition came from, which undo leaves as it is; :SKIPPED, (:NUMBER :NAME :KIND :REASON
:CHANGED) for the named entries not restored, :CHANGED true when only FORCE would restore it;
:LIMIT, the journal's size."
  (declare (ignore session))
  (run-tool token
            (lambda ()
              (let* ((*file-octets* (make-hash-table :test 'equal))
                     (journal (sb-thread:with-mutex (*journal-lock*) (copy-list *journal*)))
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
                ;; Newest first: when calls redefined a name one after another, the oldest
                ;; entry's definition is the one left in place.
                (dolist (entry wanted)
                  (flet ((skip (reason &optional changed)
                           (push (list :number (entry-number entry) :name (entry-name-text entry)
                                       :kind (kind-text entry) :reason reason :changed changed)
                                 skipped)))
                    (let ((changed nil))
                      (cond ((entry-restored entry) (skip "already restored"))
                            ((not (restorable-p entry)) (skip (unrestorable-reason entry)))
                            ((and (not force) (setf changed (changed-since entry journal)))
                             (skip changed t))
                            (t (restore-entry entry)
                               (push (restored-plist entry) restored))))))
                (multiple-value-bind (page older newer)
                    (if (or entries since)
                        (values '() 0 0)
                        (journal-page journal before (or page-size *journal-shown*)))
                  (list :listed (not (or entries since))
                        :entries (mapcar #'entry-plist page)
                        :older older
                        :newer newer
                        :restored (sort restored #'> :key (lambda (r) (getf r :number)))
                        :skipped (sort skipped #'< :key (lambda (s) (getf s :number)))
                        :limit *journal-limit*))))))
