;;;; load-form, load-file and edit-lisp-form's load: compile a file's definitions into the image
;;;; with their source locations, as C-c C-c and C-c C-k do, and report the compiler's conditions
;;;; at file, line and column. (The reverse, for a deleted definition, is unload-definition.lisp.)
;;;;
;;;; The server reads the file and sends the octets to compile: to LOAD-SOURCE the file with
;;;; everything but the chosen definitions blanked out, each definition at its own offset, line and
;;;; top-level form number (src/source/load.rs); to LOAD-SOURCE-FILE the whole file. The image
;;;; never reads the real file: what it compiles is what the server checked (and, under --confirm,
;;;; showed the human), whatever happens to the file meanwhile. The octets are compiled from a
;;;; private file of the image's own whose source name is the real file's, with the real file's
;;;; write date, so that SBCL records each definition where it is in the real file and
;;;; find-definition sees no change.

(in-package #:mcp-agent-helper)

(defparameter *max-load-conditions* 100
  "Compiler conditions a load reports in full; the rest are only counted.")

(defun temporary-directory ()
  "The native name of the directory for temporary files, ending in a slash."
  (let ((directory (sb-ext:posix-getenv "TMPDIR")))
    (cond ((zerop (length directory)) "/tmp/")
          ((char= (char directory (1- (length directory))) #\/) directory)
          (t (concatenate 'string directory "/")))))

(defun posix (name &rest arguments)
  "Calls SB-POSIX's function NAME, the contrib required on first use."
  (require :sb-posix)
  (apply (find-symbol name '#:sb-posix) arguments))

(defun posix-flag (name)
  (require :sb-posix)
  (symbol-value (find-symbol name '#:sb-posix)))

(defun set-write-date (native-name universal-time)
  "Gives the file NATIVE-NAME the write date UNIVERSAL-TIME."
  (ignore-errors
   (let ((unix-time (- universal-time (encode-universal-time 0 0 0 1 1 1970 0))))
     (posix "UTIMES" native-name unix-time unix-time))))

;;; ------------------------------------------------------------------------------------------
;;; Where a compiler condition is, in a file's octets

(defun compiler-context ()
  "SBCL's context of the condition being signalled: the form's file position, source path and
text, or NIL."
  (let ((find (sbcl-symbol :find-error-context)))
    (and find (ignore-errors (funcall find nil)))))

(defun context-slot (context name)
  (let ((reader (sbcl-symbol name)))
    (and context reader (fboundp reader) (ignore-errors (funcall reader context)))))

(defun one-line (text limit)
  "TEXT with each run of blank space made one space, cut to LIMIT characters."
  (let ((folded (with-output-to-string (out)
                  (let ((blank nil))
                    (loop for c across (string-trim '(#\Space #\Tab #\Newline #\Return) text)
                          do (if (layout-char-p c)
                                 (setf blank t)
                                 (progn (when blank (write-char #\Space out) (setf blank nil))
                                        (write-char c out))))))))
    (if (> (length folded) limit) (concatenate 'string (subseq folded 0 limit) " ...") folded)))

(defun subform-octet-position (octets start path)
  "The byte position in OCTETS of the subform along PATH (indices from the top-level form,
outermost first) of the top-level form at byte START, read in the current package, or START."
  (or (ignore-errors
       (let* ((text (sb-ext:octets-to-string octets :start start :external-format :utf-8))
              (positions (make-hash-table :test 'eq))
              (*read-eval* nil)
              (form (let ((*readtable* (position-recording-readtable positions)))
                      ;; A #. form is skipped, not evaluated, and stands for the one element its
                      ;; value is in the form the compiler read: the subforms after it keep their
                      ;; places (under *READ-EVAL* NIL the reading would stop there, and every
                      ;; condition of the form would be placed at its start).
                      (set-dispatch-macro-character #\# #\.
                                                    (lambda (stream sub-char argument)
                                                      (declare (ignore sub-char argument))
                                                      (let ((*read-suppress* t)) (read stream t nil t))
                                                      (make-symbol "READ-TIME-VALUE")))
                      (with-input-from-string (in text) (read in))))
              (character (subform-position form path positions)))
         (and character
              (+ start (length (sb-ext:string-to-octets text :end character :external-format :utf-8))))))
      start))

(defun call-in-reading-package (function)
  "Calls FUNCTION, which reads a form of the file being compiled only to find its subforms, with
*PACKAGE* that file's package while it is being compiled. Warnings deferred to the end of the
compilation unit come after, when the file's package is unknown: then in a package made for the
call, so that reading interns nothing anywhere else."
  (if *compile-file-truename*
      (funcall function)
      (let ((package (make-package (format nil "MCP-AGENT-READING-~36R" (random (expt 36 8))) :use '(#:common-lisp))))
        (unwind-protect (let ((*package* package)) (funcall function))
          (delete-package package)))))

(defun condition-location (octets)
  "Where in OCTETS, a file's contents, the condition being signalled is: (values line column
form-text), each NIL when SBCL does not say."
  (context-location (compiler-context) octets))

(defun context-location (context octets)
  "Where in OCTETS the compiler CONTEXT is: (values line column form-text)."
  (let* ((position (context-slot context :compiler-error-context-file-position))
         (path (context-slot context :compiler-error-context-original-source-path))
         (source (context-slot context :compiler-error-context-original-source))
         (form (and (stringp source) (one-line source 200))))
    (if (and octets (integerp position) (<= position (length octets)))
        (let* ((start (skip-layout octets position))
               (at (if path
                       (call-in-reading-package (lambda ()
                                                  (subform-octet-position octets start (rest (reverse path)))))
                       start)))
          (multiple-value-bind (line column) (octet-line-and-column octets at)
            (values line column form)))
        (values nil nil form))))

;;; ------------------------------------------------------------------------------------------
;;; Compiling and loading a file, recording what the compiler says

(defun call-recording-file-conditions (octets function)
  "Calls FUNCTION, which compiles a file whose contents are OCTETS. Returns its values and the
conditions: a list of plists (:SEVERITY :MESSAGE :FORM :LINE :COLUMN), in the order they came."
  (let ((conditions '())
        (last nil)
        (compiler-error (needed-internal :compiler-error))
        (encapsulated (needed-internal :encapsulated-condition)))
    (flet ((record (severity condition)
             (unless (eq condition last)
               (setf last condition)
               (multiple-value-bind (line column form)
                   (if (input-error-p condition)
                       ;; A read error has no form: it is where the reader stopped.
                       (let ((at (read-error-octet-position condition octets)))
                         (and at (octet-line-and-column octets at)))
                       (condition-location octets))
                 (push (list :severity severity
                             :message (if (input-error-p condition)
                                          (read-error-message condition)
                                          (compiler-message condition))
                             :form form :line line :column column)
                       conditions)))))
      (let ((values (multiple-value-list
                     (handler-bind ((condition
                                      (lambda (c)
                                        (when (typep c compiler-error)
                                          (record "ERROR" (funcall encapsulated c)))))
                                    (sb-ext:compiler-note (lambda (c) (record "NOTE" c)))
                                    (warning
                                      (lambda (c)
                                        (unless (or (muffled-by-sbcl-p c) (asdf-summary-warning-p c))
                                          (record (if (typep c 'style-warning) "STYLE-WARNING" "WARNING") c)))))
                       (funcall function)))))
        (values values (nreverse conditions))))))

(defun load-report (conditions loaded &key inactive dropped)
  (flet ((count-of (severity) (count severity conditions :key (lambda (c) (getf c :severity)) :test #'string=)))
    (list :loaded loaded
          :warnings (count-of "WARNING")
          :errors (count-of "ERROR")
          :style-warnings (count-of "STYLE-WARNING")
          :notes (count-of "NOTE")
          :conditions (subseq conditions 0 (min (length conditions) *max-load-conditions*))
          ;; The handle of every condition, one line each, past those the reply shows.
          :rest (rest-listing (loop for condition in conditions
                                    collect (format nil "~A~@[ at line ~D~]~@[, column ~D~]: ~A"
                                                    (getf condition :severity) (getf condition :line)
                                                    (getf condition :column) (getf condition :message)))
                              *max-load-conditions*)
          :inactive inactive
          :dropped dropped)))

(defun text-octets (text)
  "The octets TEXT carries, one per character: the server sends a file's bytes as the characters of
the same codes (Latin-1), so that the image gets exactly those bytes whatever their encoding."
  (let ((octets (make-array (length text) :element-type '(unsigned-byte 8))))
    (loop for c across text
          for i from 0
          do (if (< (char-code c) 256)
                 (setf (aref octets i) (char-code c))
                 (fail "The text to load came with the character ~S, which is no octet: swank-mcp sends a ~
                        file's bytes one per character. Nothing was loaded." c)))
    octets))

(defun call-with-private-copy (octets write-date function)
  "Calls FUNCTION with the pathnames of a file that holds OCTETS, with the write date WRITE-DATE
when given, and of the fasl to compile it to. Both are in a directory made for the call, that only
this user may enter, and are removed with it after: no other process can put its own text in
their place, or read them."
  (let* ((directory (handler-case (posix "MKDTEMP" (concatenate 'string (temporary-directory) "mcp-agent-load-XXXXXX"))
                      (error (e)
                        (fail "The image could not make a directory for the file to compile in ~A (~A); ~
                               nothing was loaded." (temporary-directory) (condition-message e)))))
         (source (concatenate 'string directory "/source.lisp"))
         (fasl (concatenate 'string directory "/source.fasl")))
    (unwind-protect
         (let ((descriptor (posix "OPEN" source
                                  (logior (posix-flag "O-WRONLY") (posix-flag "O-CREAT") (posix-flag "O-EXCL"))
                                  #o600)))
           (with-open-stream (out (sb-sys:make-fd-stream descriptor :output t :element-type '(unsigned-byte 8)
                                                                     :file source))
             (write-sequence octets out))
           (when write-date
             (set-write-date source write-date))
           (funcall function (sb-ext:parse-native-namestring source) (sb-ext:parse-native-namestring fasl)))
      ;; Whatever the compiler left there, not only the two files it was asked for.
      (dolist (file (ignore-errors
                     (directory (merge-pathnames (make-pathname :name :wild :type :wild)
                                                 (sb-ext:parse-native-namestring (concatenate 'string directory "/"))))))
        (ignore-errors (delete-file file)))
      (ignore-errors (posix "RMDIR" directory)))))

;;; ------------------------------------------------------------------------------------------
;;; The callers a load leaves stale: a function keeps the expansion of the macros, and the body
;;; of the inline functions, it was compiled with, so it runs the old code until recompiled.

(defclass load-changes ()
  ((expanders :initform '() :accessor changed-expanders
              :documentation "The macros and inline functions the load defined, latest first.")
   (defined :initform (make-hash-table :test 'equal) :reader defined-names
            :documentation "Every function and macro the load defined: compiled with the new code.")))

(defvar *load-changes* nil
  "The LOAD-CHANGES of the load COMPILE-AND-LOAD runs in this thread, or NIL.")

(defparameter *max-stale-callers* 200
  "Callers of a load's macros and inline functions that are recompiled at most.")

(defun note-load-definition (name kind)
  "Called as NAME is defined, a :MACRO or a :FUNCTION (from the encapsulation of SB-C::%DEFMACRO
and the fdefinition hook): during a load, records it, and as an expander when it is a macro or
an inline function."
  (let ((changes *load-changes*))
    (when changes
      (setf (gethash name (defined-names changes)) t)
      (when (or (eq kind :macro)
                (eq (ignore-errors (sbcl-call :info :function :inlinep name)) 'inline))
        (pushnew name (changed-expanders changes) :test #'equal)))))

(defun stale-callers (changes)
  "The functions compiled with an older definition of an expander CHANGES records: those SBCL's
xref says expand the macro or call (so inline) the function, less those the load defined itself.
Each (:EXPANDER name :NAME name :SOURCE location), once, under the first expander that finds it."
  (let ((seen (make-hash-table :test 'equal))
        (callers '())
        (*file-octets* (or *file-octets* (make-hash-table :test 'equal))))
    (dolist (expander (reverse (changed-expanders changes)))
      (loop for (caller . source) in (ignore-errors
                                      (if (and (symbolp expander) (macro-function expander))
                                          (sb-introspect:who-macroexpands expander)
                                          (sb-introspect:who-calls expander)))
            unless (or (gethash caller (defined-names changes)) (gethash caller seen))
              do (setf (gethash caller seen) t)
                 (push (list :expander (package-qualified expander)
                             :name (package-qualified caller)
                             :source (source-location source caller))
                       callers)))
    (let ((callers (nreverse callers)))
      (subseq callers 0 (min (length callers) *max-stale-callers*)))))

(defun compile-and-load (octets file write-date)
  "Compiles OCTETS, the text to load of FILE (the real file's native name, written WRITE-DATE), from
a private copy (see CALL-WITH-PRIVATE-COPY) whose source name is FILE, and loads the result unless
the compiler reported an error. Returns the report of LOAD-REPORT, with :CALLERS, the functions
of the image still running an older expansion of a macro or inline function it redefined (see
STALE-CALLERS)."
  (let* ((changes (make-instance 'load-changes))
         (report (let ((*load-changes* changes))
                   (compile-and-load-recording octets file write-date))))
    (append report (list :callers (and (getf report :loaded) (stale-callers changes))))))

(defvar *compile-policy* nil
  "While bound, an OPTIMIZE declaration COMPILE-AND-LOAD compiles with, as the base policy the
file's own declarations refine: the debugger tool's recompile for stepping, (debug 3).")

(defun compile-and-load-recording (octets file write-date)
  (call-with-private-copy
   octets write-date
   (lambda (source fasl)
     (let ((*compile-verbose* nil) (*compile-print* nil) (*load-verbose* nil) (*load-print* nil)
           (*package* (find-package '#:common-lisp-user))
           (*readtable* (copy-readtable nil)))
       (multiple-value-bind (values conditions)
           (call-recording-file-conditions
            octets
            (lambda ()
              (with-compilation-unit (:override t :source-namestring file :policy *compile-policy*)
                (compile-file source :output-file fasl))))
         (let* ((output (first values))
                (errors (find "ERROR" conditions :key (lambda (c) (getf c :severity)) :test #'string=))
                (loaded (and output (not errors)
                             (handler-case (progn (load output) t)
                               (error (e)
                                 (setf conditions
                                       (append conditions
                                               (list (list :severity "ERROR"
                                                           :message (format nil "Loading the compiled code failed: ~A"
                                                                            (condition-message e))
                                                           :form nil :line nil :column nil))))
                                 nil)))))
           (load-report conditions loaded)))))))

(defun guard-holds-p (marker feature)
  "Whether the reader conditional #MARKER FEATURE (MARKER \"+\" or \"-\", FEATURE the feature
expression's text) lets the form behind it through in this image."
  (let ((holds (handler-case
                   (let ((*package* (find-package '#:keyword)) (*read-eval* nil))
                     (sbcl-call :featurep (read-from-string feature)))
                 (error () t))))
    (eq (and holds t) (string= marker "+"))))

(defun inactive-guards (guards)
  "The GUARDS, each (label marker feature-text), whose reader conditional does not let the form
through in this image."
  (remove-if (lambda (guard) (guard-holds-p (second guard) (third guard))) guards))

(defun dropped-count (guarded)
  "How many of GUARDED, each the guards (marker feature-text) in front of one form, the reader
skips in this image: those with a guard that does not hold."
  (count-if-not (lambda (guards) (every (lambda (guard) (apply #'guard-holds-p guard)) guards)) guarded))

(define-entry (load-source :caller :server) (file text &key guards write-date session token (max-output 65536))
  "Compiles TEXT, the octets (one per character) of the file FILE with everything but some
definitions blanked out (see the top of this file), and loads it, for load-form. GUARDS are the
reader conditionals in front of the definitions, (label marker feature-text) each. WRITE-DATE is
FILE's as the server read it. Returns a plist: :LOADED; the counts :WARNINGS :ERRORS
:STYLE-WARNINGS :NOTES; :CONDITIONS, each (:SEVERITY :MESSAGE :FORM :LINE :COLUMN) with LINE and
COLUMN in FILE; :INACTIVE, the guards that keep their definition out in this image; :STDOUT (text
dropped)."
  (let ((stdout (make-capture max-output))
        (*max-output* max-output)
        (*handles* (session-handles session))
        ;; What the loaded code starts runs as the agent's (see exit-guard.lisp).
        (*agent-session* (find-session session)))
    (let ((result
            (run-tool token
                      (lambda ()
                        (let ((report (compile-and-load (text-octets text) file write-date)))
                          (setf (getf report :inactive) (inactive-guards guards))
                          report))
                      :stdout stdout)))
      (if (getf result :failure)
          result
          (append result (list :stdout (capture-report stdout)))))))

(define-entry (load-source-file :caller :server) (file text &key write-date guarded session token (max-output 65536))
  "Compiles and loads TEXT, the octets (one per character) of the whole file FILE as the server read
it, written WRITE-DATE, for load-file. GUARDED is (forms definitions), each a list of the guards
(marker feature-text) in front of one top-level form or definition the server counted. Returns the
plist LOAD-SOURCE does, without :INACTIVE, with :DROPPED, how many of those forms and definitions
the reader skipped (after the load: the features the file itself pushes count). New
definitions are not listed in the undo journal (a file's hundreds would push out the
replacements); replaced functions and macros are."
  (let ((stdout (make-capture max-output))
        (*max-output* max-output)
        (*handles* (session-handles session))
        (*agent-session* (find-session session)))
    (let ((result (run-tool token
                            (lambda ()
                              (let ((*journal-additions* nil)
                                    (*file-octets* (make-hash-table :test 'equal)))
                                (let ((report (compile-and-load (text-octets text) file write-date)))
                                  (setf (getf report :dropped) (mapcar #'dropped-count guarded))
                                  report)))
                            :stdout stdout)))
      (if (getf result :failure)
          result
          (append result (list :stdout (capture-report stdout)))))))
