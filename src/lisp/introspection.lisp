;;;; The introspection tools, which tell what the image's names are and where they are defined:
;;;; describe-symbol, apropos-search, find-definition, xref and class-info. (lisp-status, about
;;;; the image as a whole, is status.lisp.)
;;;;
;;;; Nothing here reads user text with the Lisp
;;;; reader: symbol names are parsed by hand and looked up with FIND-SYMBOL, so asking about a
;;;; name never interns it.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Where definitions are: file, line and column
;;;
;;; SBCL records for each definition its file and either the file offset of the top-level form
;;; (functions) or that form's index in the file (everything else). Turning either into a line
;;; and column means scanning the file. It is scanned as bytes with a small skipper rather than
;;; the Lisp reader: reading would intern the file's symbols in whatever package is current, and
;;; SBCL's offsets count bytes, not characters.

(defparameter *max-source-bytes* (* 8 1024 1024)
  "Files larger than this are not scanned for line numbers.")

(defun read-file-octets (pathname)
  (with-open-file (in pathname :element-type '(unsigned-byte 8))
    (let ((length (file-length in)))
      (when (and length (<= length *max-source-bytes*))
        (let ((octets (make-array length :element-type '(unsigned-byte 8))))
          (read-sequence octets in)
          octets)))))

(defun token-end (octets i)
  "The end of the token (symbol or number) starting at I, with | and \\ escapes."
  (let ((end (length octets)))
    (loop while (< i end)
          do (let ((c (char-at octets i)))
               (cond ((eql c #\\) (incf i 2))
                     ((eql c #\|)
                      (incf i)
                      (loop while (and (< i end) (not (eql (char-at octets i) #\|)))
                            do (incf i (if (eql (char-at octets i) #\\) 2 1)))
                      (incf i))
                     ((or (layout-char-p c) (member c '(#\( #\) #\" #\' #\` #\, #\;)))
                      (return))
                     (t (incf i)))))
    (min i end)))

(defun skip-string (octets i)
  "I is just after the opening quote."
  (let ((end (length octets)))
    (loop while (< i end)
          do (case (char-at octets i)
               (#\\ (incf i 2))
               (#\" (return-from skip-string (1+ i)))
               (t (incf i))))
    end))

(defun feature-holds-p (octets start end)
  "Whether the feature expression in OCTETS between START and END holds in this image."
  (handler-case
      (let ((*package* (find-package '#:keyword))
            (*read-eval* nil))
        (sbcl-call :featurep (read-from-string (sb-ext:octets-to-string octets :start start :end end
                                                                           :external-format :utf-8))))
    (error () t)))

(defun skip-form (octets i)
  "Skips what the reader reads from I at once: a form, or a #+/#- conditional that turns out
false. Returns the position after it and whether a form was produced."
  (let* ((i (skip-layout octets i))
         (c (char-at octets i))
         (end (length octets)))
    (cond ((null c) (values end nil))
          ((eql c #\() (values (skip-list octets (1+ i)) t))
          ((eql c #\)) (values (1+ i) nil))
          ((eql c #\") (values (skip-string octets (1+ i)) t))
          ((member c '(#\' #\`)) (values (skip-produced octets (1+ i)) t))
          ((eql c #\,)
           (values (skip-produced octets (if (member (char-at octets (1+ i)) '(#\@ #\.)) (+ i 2) (1+ i))) t))
          ((eql c #\#) (skip-dispatch octets (1+ i)))
          (t (values (token-end octets i) t)))))

(defun skip-produced (octets i)
  "Skips from I past the next form that is really read (past false conditionals)."
  (loop
    (multiple-value-bind (after produced) (skip-form octets i)
      (when (or produced (>= after (length octets)) (<= after i))
        (return after))
      (setf i after))))

(defun skip-list (octets i)
  "I is just after an opening parenthesis. Returns the position after the closing one."
  (let ((end (length octets)))
    (loop
      (setf i (skip-layout octets i))
      (let ((c (char-at octets i)))
        (cond ((null c) (return end))
              ((eql c #\)) (return (1+ i)))
              (t (setf i (max (1+ i) (skip-form octets i)))))))))

(defun skip-dispatch (octets i)
  "I is just after a #. Handles the standard dispatching macros."
  (let ((j i))
    (loop for c = (char-at octets j)
          while (and c (digit-char-p c))
          do (incf j))
    (let ((c (char-at octets j)))
      (case (and c (char-downcase c))
        ((nil) (values (length octets) nil))
        (#\\ (values (token-end octets (+ j 2)) t))
        (#\( (values (skip-list octets (1+ j)) t))
        ((#\' #\=) (values (skip-produced octets (1+ j)) t))
        (#\# (values (1+ j) t))
        (#\| (values (skip-block-comment octets (1+ j)) nil))
        ((#\+ #\-)
         (let* ((feature-start (skip-layout octets (1+ j)))
                (feature-end (skip-produced octets feature-start))
                (holds (feature-holds-p octets feature-start feature-end))
                (form-end (skip-produced octets feature-end)))
           (values form-end (eq holds (char= c #\+)))))
        ((#\* #\b #\o #\x #\r #\:) (values (token-end octets (1+ j)) t))
        ;; #. #p #c #a #s and the like: the dispatch character is followed by a form.
        (t (values (skip-produced octets (1+ j)) t))))))

(defun conditional-form-start (octets start)
  "Where the form read from START begins: past a #+/#- whose feature expression holds (the
definition is the form it guards, on the line after, not the conditional's line), else START."
  (if (and (eql (char-at octets start) #\#) (member (char-at octets (1+ start)) '(#\+ #\-)))
      (read-form-start octets (skip-produced octets (skip-layout octets (+ start 2))))
      start))

(defun toplevel-form-start (octets index)
  "The byte position of the INDEX'th (from 0) top-level form in OCTETS."
  (let ((i 0) (count 0))
    (loop
      (let ((start (skip-layout octets i)))
        (when (>= start (length octets)) (return nil))
        (multiple-value-bind (after produced) (skip-form octets start)
          (when produced
            (when (= count index) (return (conditional-form-start octets start)))
            (incf count))
          (when (<= after i) (return nil))
          (setf i after))))))

(defun read-form-start (octets position)
  "Where the form that the reader reads from byte POSITION starts: past layout, past the
#+/#- forms it drops and past the #+/#- of the one it keeps. SBCL records the position a top-level form's read began at, which is
before the conditionals it dropped (and its form number counts only the forms read)."
  (loop
    (let ((start (skip-layout octets position)))
      (when (>= start (length octets))
        (return (min position (length octets))))
      (multiple-value-bind (after produced) (skip-form octets start)
        (when (or produced (<= after start))
          (return (conditional-form-start octets start)))
        (setf position after)))))

(defun octet-line-and-column (octets position)
  "1-based line and column (in characters, decoding UTF-8) of byte POSITION."
  (let* ((line-start (let ((newline (position 10 octets :end position :from-end t)))
                       (if newline (1+ newline) 0))))
    (values (1+ (count 10 octets :end position))
            (1+ (count-if-not (lambda (b) (= (logand b #xC0) #x80)) octets
                              :start line-start :end position)))))

(defun source-pathname-text (pathname)
  "PATHNAME as a file name of this machine (SBCL's own are logical: SYS:SRC;CODE;LIST.LISP)."
  (let ((pathname (or (ignore-errors (translate-logical-pathname pathname)) pathname)))
    (or (ignore-errors (sb-ext:native-namestring pathname)) (namestring pathname))))

(defvar *file-octets* nil
  "Per call, when bound: file name -> its contents, so that many definitions in one file read it
once; and (:SCANNED package) -> T once SCAN-COMPILE-DATES went through that package, so that a
call scans each package once.")

(defun under-directory-p (file directories)
  (some (lambda (directory)
          (let ((directory (string-right-trim "/" directory)))
            (and (> (length file) (length directory))
                 (string= directory file :end2 (length directory))
                 (char= #\/ (char file (length directory))))))
        directories))

(defun readable-file-p (file)
  "Whether a call may read FILE for its lines: a regular file (opening a FIFO would wait for a
writer), and, for a server that promised --read-only, one under its roots or an ASDF system's
directory (*READABLE-DIRECTORIES*), symbolic links resolved."
  (let ((true (ignore-errors (sb-ext:native-namestring (truename file)))))
    (and true
         (eq :file (sbcl-call :native-file-kind true))
         (or (eq *readable-directories* :any)
             (under-directory-p true *readable-directories*)
             (under-directory-p true (system-directories-once))))))

(defun system-directories-once ()
  "ASDF-SYSTEM-DIRECTORIES, once per call when *FILE-OCTETS* is bound."
  (if *file-octets*
      (multiple-value-bind (directories known) (gethash :system-directories *file-octets*)
        (if known
            directories
            (setf (gethash :system-directories *file-octets*) (asdf-system-directories))))
      (asdf-system-directories)))

(defun file-octets (file)
  "FILE's contents, or NIL when it cannot or may not be read (READABLE-FILE-P)."
  (flet ((read-it () (ignore-errors (and (readable-file-p file) (read-file-octets file)))))
    (if *file-octets*
        (multiple-value-bind (octets known) (gethash file *file-octets*)
          (if known octets (setf (gethash file *file-octets*) (read-it))))
        (read-it))))

(defun no-file-origin (name)
  "Why a definition of NAME has no file: SBCL's own definitions are built in; anything else was
evaluated or compiled from a REPL (or from a string)."
  (let* ((symbol (if (consp name) (second name) name))
         (package (and (symbolp symbol) (symbol-package symbol))))
    (if (and package (or (eq package (find-package '#:common-lisp))
                         (eql 0 (search "SB-" (package-name package)))))
        "built into SBCL, no source file"
        "defined at the REPL, no source file")))

(defun no-file-location (name)
  "The location plist of a definition of NAME that has no file."
  (list :file nil :line nil :column nil :note nil :made-by nil :origin (no-file-origin name)))

(defun form-start-in (octets offset form-index)
  "Where in OCTETS the definition SBCL recorded at byte OFFSET, or as top-level form FORM-INDEX,
starts; NIL when neither is known."
  (cond (offset (read-form-start octets (min offset (length octets))))
        (form-index (toplevel-form-start octets form-index))))

(defun buffer-compiled-start (plist octets offset form-index)
  "For a definition compiled from an Emacs buffer (SLIME's and SLY's C-c C-c, whose PLIST has the
buffer position :EMACS-POSITION and the text compiled, :EMACS-STRING): where it starts in the
file's OCTETS. SBCL's OFFSET and FORM-INDEX count from the start of that text, which began at that
position (a character position, from 1) of the buffer visiting the file; NIL otherwise."
  (let ((position (getf plist :emacs-position))
        (text (getf plist :emacs-string)))
    (when (and (integerp position) (plusp position) (stringp text))
      (let* ((text-octets (sb-ext:string-to-octets text :external-format :utf-8))
             (in-text (or (form-start-in text-octets offset form-index) 0))
             (characters (+ (1- position)
                            (count-if-not (lambda (b) (= (logand b #xC0) #x80)) text-octets :end in-text))))
        ;; The byte of that character in the file (UTF-8: each character starts one byte that is
        ;; no continuation byte).
        (loop for index from 0 below (length octets)
              unless (= (logand (aref octets index) #xC0) #x80)
                do (when (zerop characters) (return index))
                   (decf characters)
              finally (return (length octets)))))))

(defun note-compile-date (source)
  "Keeps the write date SBCL recorded with the SB-INTROSPECT definition SOURCE, if any, as its
file's (*FILE-COMPILE-DATES*). Not one compiled from an Emacs buffer (BUFFER-COMPILED-START),
whose date is that of the compilation."
  (let ((date (and source
                   (not (getf (ignore-errors (sb-introspect:definition-source-plist source)) :emacs-position))
                   (sb-introspect:definition-source-file-write-date source)))
        (file (and source (ignore-errors (source-pathname-text (sb-introspect:definition-source-pathname source))))))
    (when (and date file)
      (let ((known (gethash file *file-compile-dates*)))
        (when (or (null known) (> date known))
          (setf (gethash file *file-compile-dates*) date))))))

(defun scan-compile-dates (name)
  "Notes the write dates SBCL recorded with the functions and macros of NAME's package, each as
its file's (NOTE-COMPILE-DATE): once per package and call when *FILE-OCTETS* is bound (CL's 700
functions take some 16 ms)."
  (let* ((symbol (if (consp name) (second name) name))
         (package (and (symbolp symbol) (symbol-package symbol)))
         (key (list :scanned package)))
    (when (and package (not (and *file-octets* (gethash key *file-octets*))))
      (when *file-octets*
        (setf (gethash key *file-octets*) t))
      (do-symbols (other package)
        (when (and (eq (symbol-package other) package) (fboundp other) (not (special-operator-p other)))
          (let ((function (or (macro-function other) (fdefinition other))))
            (unless (typep function 'generic-function)
              (note-compile-date (ignore-errors (sb-introspect:find-definition-source function))))))))))

(defun file-compiled-date (file name current-date)
  "The write date SBCL recorded for FILE when it last compiled definitions from it, as far as
the helper knows, for a definition of NAME from FILE that SBCL records no date with (a method, a
generic function, a class, a structure, a variable): they were compiled with the file's functions,
and whether the file changed since is judged by those's date. Before it says the file changed
(the date known is not CURRENT-DATE), the functions of NAME's package are looked at, for a later
compilation."
  (let ((known (gethash file *file-compile-dates*)))
    (if (eql known current-date)
        known
        (progn (scan-compile-dates name)
               (gethash file *file-compile-dates*)))))

(defun source-location (source name)
  "Where an SB-INTROSPECT definition source of NAME is: a plist (:FILE :LINE :COLUMN :NOTE :MADE-BY
:ORIGIN), with a file and no origin, or no file and the ORIGIN text for code not compiled or loaded
from a file. :MADE-BY is NIL here; a slot accessor's location has its DEFCLASS (ACCESSOR-MADE-BY)."
  (let ((pathname (sb-introspect:definition-source-pathname source)))
    (if (null pathname)
        (no-file-location name)
        (let* ((file (source-pathname-text pathname))
               (octets (file-octets file))
               (offset (sb-introspect:definition-source-character-offset source))
               (form-index (first (sb-introspect:definition-source-form-path source)))
               (plist (ignore-errors (sb-introspect:definition-source-plist source)))
               (from-buffer (and octets (buffer-compiled-start plist octets offset form-index)))
               (start (or from-buffer (and octets (form-start-in octets offset form-index))))
               (current-date (ignore-errors (file-write-date file)))
               (recorded-date (cond ((sb-introspect:definition-source-file-write-date source)
                                     (note-compile-date source)
                                     (sb-introspect:definition-source-file-write-date source))
                                    ;; One compiled from a buffer came after its file's
                                    ;; compilation, whose date says nothing of it.
                                    ((and octets (not from-buffer))
                                     (file-compiled-date file name current-date)))))
          (multiple-value-bind (line column) (and start (octet-line-and-column octets start))
            (list :file file :line line :column column
                  :note (cond ((not (probe-file file)) "file not found")
                              ((and (null octets) (not (readable-file-p file)))
                               (if (eq *readable-directories* :any)
                                   "not a regular file, so not read for its line"
                                   (format nil "not read for its line: outside the server's roots and the ~
                                                image's ASDF systems' directories (--read-only)")))
                              ;; Compiled from a buffer, SBCL records the date of the file it
                              ;; wrote the text to: the time of the compilation, which a save of
                              ;; the file before it precedes.
                              ((and recorded-date current-date
                                    (if (getf plist :emacs-position)
                                        (> current-date recorded-date)
                                        (/= recorded-date current-date)))
                               "the file changed since this was compiled; the line may be off"))
                  :made-by nil
                  :origin nil))))))

;;; ------------------------------------------------------------------------------------------
;;; What a symbol names

(defparameter *definition-kinds*
  '((:variable "variable") (:constant "constant") (:symbol-macro "symbol macro")
    (:macro "macro") (:compiler-macro "compiler macro") (:function "function")
    (:generic-function "generic function") (:method "method") (:setf-expander "setf expander")
    (:structure "structure") (:condition "condition") (:class "class")
    (:method-combination "method combination") (:type "type"))
  "The SB-INTROSPECT definition types a user defines, in the order they are listed.")

(defun variable-kind (symbol)
  "The kind of variable SYMBOL is: :SPECIAL, :CONSTANT, :GLOBAL, :MACRO (a symbol macro) or NIL."
  (let ((kind (sbcl-call :info :variable :kind symbol)))
    (cond ((and (eq kind :unknown) (boundp symbol) (not (keywordp symbol))) :special)
          ((member kind '(:special :constant :global :macro)) kind))))

(defun type-kind (symbol)
  (let ((kind (sbcl-call :info :type :kind symbol)))
    (and (member kind '(:primitive :defined :instance)) kind)))

(defun symbol-kinds (symbol)
  "Short names of what SYMBOL names, for listings."
  (let ((kinds '()))
    (flet ((add (kind) (push kind kinds)))
      (cond ((special-operator-p symbol) (add "special operator"))
            ((macro-function symbol) (add "macro"))
            ((and (fboundp symbol) (typep (fdefinition symbol) 'generic-function)) (add "generic function"))
            ((fboundp symbol) (add "function")))
      (case (variable-kind symbol)
        (:special (add "variable"))
        (:global (add "global variable"))
        (:constant (unless (keywordp symbol) (add "constant")))
        (:macro (add "symbol macro")))
      (cond ((find-class symbol nil) (add "class"))
            ((type-kind symbol) (add "type"))))
    (nreverse kinds)))

;;; ------------------------------------------------------------------------------------------
;;; describe-symbol

(defun symbol-status-text (symbol package)
  "How SYMBOL is accessible: \"external in ALEXANDRIA\", \"internal in CL-USER\", and whether
it is also accessible in PACKAGE, where it was looked up."
  (let ((home (symbol-package symbol)))
    (if (null home)
        "uninterned"
        (format nil "~(~A~) in ~A~@[, accessible in ~A~]"
                (nth-value 1 (find-symbol (symbol-name symbol) home))
                (package-name home)
                (and (not (eq home package))
                     (eq symbol (find-symbol (symbol-name symbol) package))
                     (package-name package))))))

(defun definition-location (symbol type)
  "Where SYMBOL's first definition of TYPE is (see SOURCE-LOCATION), if SBCL knows of one.

(SYMBOL may be a (SETF NAME) function name.)"
  (let ((source (first (ignore-errors (sb-introspect:find-definition-sources-by-name symbol type)))))
    (and source (source-location source symbol))))

(defun method-text (method package)
  "A method as (NAME QUALIFIERS... (SPECIALIZERS...))."
  (let ((specializers (mapcar (lambda (specializer)
                                (typecase specializer
                                  (class (class-name specializer))
                                  (sb-mop:eql-specializer
                                   (list 'eql (sb-mop:eql-specializer-object specializer)))
                                  (t specializer)))
                              (sb-mop:method-specializers method))))
    (name-text (append (list (sb-mop:generic-function-name (sb-mop:method-generic-function method)))
                       (method-qualifiers method)
                       (list specializers))
               package)))

(defparameter *max-methods-listed* 30
  "Methods describe-symbol lists of one generic function; find-definition pages through them all.")

(defun method-location (method)
  "Where METHOD was defined, as a location plist with a file, or NIL when SBCL knows no file."
  (let ((source (ignore-errors (sb-introspect:find-definition-source method))))
    (and source
         (sb-introspect:definition-source-pathname source)
         (source-location source (sb-mop:generic-function-name (sb-mop:method-generic-function method))))))

(defun file-location-text (location)
  "FILE:LINE:COLUMN of a location plist with a file."
  (format nil "~A~@[:~D~]~@[:~D~]" (getf location :file) (getf location :line) (getf location :column)))

(defun sbcl-source-file-p (file)
  "True for a file of SBCL's own sources (its contribs, ASDF among them, included)."
  (let ((root (ignore-errors
               (let ((sources (translate-logical-pathname "SYS:SRC;")))
                 (namestring (make-pathname :directory (butlast (pathname-directory sources))
                                            :name nil :type nil :defaults sources))))))
    (and root (eql 0 (search root file)))))

(defun method-lines (function package)
  "\"Methods (N):\" and a line per method, with where it is defined: the user's methods first
(PRINT-OBJECT has some 180 of SBCL's), each group sorted; at most *MAX-METHODS-LISTED* lines."
  (let* ((methods (sb-mop:generic-function-methods function))
         (lines (mapcar #'cdr
                        (sort (mapcar (lambda (method)
                                        (let ((location (method-location method)))
                                          (cons (if (and location (sbcl-source-file-p (getf location :file))) 1 0)
                                                ;; Not found again in the file's text as the
                                                ;; definitions are: a changed file is said so.
                                                (format nil "  ~A~@[  ~A~]~@[ (~A)~]" (method-text method package)
                                                        (and location (file-location-text location))
                                                        (and location (getf location :note))))))
                                      methods)
                              (lambda (a b)
                                (or (< (car a) (car b))
                                    (and (= (car a) (car b)) (string< (cdr a) (cdr b))))))))
         (shown (subseq lines 0 (min *max-methods-listed* (length lines)))))
    (append (list (format nil "Methods (~D):" (length methods)))
            shown
            (when (> (length lines) (length shown))
              (list (format nil "  (~D more: find-definition lists them all)" (- (length lines) (length shown))))))))

(defun accessor-method-class (method)
  "The class whose DEFCLASS made METHOD, a slot reader or writer."
  (let ((specializers (sb-mop:method-specializers method)))
    (if (typep method 'sb-mop:standard-writer-method) (second specializers) (first specializers))))

(defun accessor-made-by (method package)
  "The :MADE-BY of a location of METHOD, a slot reader or writer: (:CLASS the DEFCLASS's name as
edit-lisp-form takes it :TEXT what a reply says of it). SBCL records where the DEFCLASS was as the
method's source, and the server finds that DEFCLASS again in the file's current text, where no
DEFGENERIC or DEFMETHOD of the accessor is."
  (let ((class-name (class-name (accessor-method-class method))))
    (list :class (string-downcase (symbol-name class-name))
          :text (format nil "a slot accessor made by the DEFCLASS of ~A" (name-text class-name package)))))

(defun location-remark (location)
  "The parenthesised remark on a location plist as replies show it: what made the definition and
what the file's state says of its line, or NIL."
  (let ((parts (remove nil (list (getf (getf location :made-by) :text) (getf location :note)))))
    (and parts (format nil "~{~A~^; ~}" parts))))

(defun accessor-method-described (name source)
  "The slot reader or writer of the generic function NAME that SOURCE, one of its :METHOD definition
sources, describes by its specializers' names; NIL for any other method."
  (let ((function (and (fboundp name) (fdefinition name)))
        (description (let ((accessor (sbcl-symbol :definition-source-description)))
                       (and accessor (fboundp accessor) (funcall accessor source)))))
    (when (and (typep function 'generic-function) (consp description) (every #'symbolp description))
      (let* ((classes (mapcar (lambda (name) (find-class name nil)) description))
             (method (and (every #'identity classes)
                          (ignore-errors (find-method function '() classes nil)))))
        (and (typep method 'sb-mop:standard-accessor-method) method)))))

(defun generic-function-location (function name package)
  "Where the generic function NAME is defined. A generic function made by DEFCLASS (a slot
accessor) or by a DEFMETHOD without a DEFGENERIC has no source of its own: then where the
DEFCLASS, or its earliest method, is."
  (let ((own (definition-location name :generic-function)))
    (if (getf own :file)
        own
        (let* ((methods (reverse (sb-mop:generic-function-methods function)))
               (method (find-if #'method-location methods))
               (location (and method (method-location method))))
          (cond ((null location) own)
                ((typep method 'sb-mop:standard-accessor-method)
                 (setf (getf location :made-by) (accessor-made-by method package))
                 location)
                (t (setf (getf location :note) "no DEFGENERIC: where its first method is")
                   location))))))

(defun function-entry (name package)
  "The entry of the function NAME, a symbol or (SETF symbol)."
  (let* ((setf-name (consp name))
         (function (fdefinition name))
         (generic (typep function 'generic-function))
         (macro (and (not setf-name) (macro-function name))))
    (list :kind (cond ((and (not setf-name) (special-operator-p name)) "Special operator")
                      (macro "Macro")
                      (generic (if setf-name "Setf generic function" "Generic function"))
                      (t (if setf-name "Setf function" "Function")))
          :summary (call-syntax name package)
          :documentation (documentation-text name 'function)
          :details (and generic (method-lines function package))
          ;; The kind as find-definition labels it: the server finds the definition in the
          ;; file's current text the same way for both tools.
          :label (cond ((consp name) (format nil "function ~A" (name-text name package)))
                       (macro "macro")
                       (generic "generic function")
                       (t "function"))
          :source (cond (generic (generic-function-location function name package))
                        (t (definition-location name (if macro :macro :function)))))))

(defun variable-entry (symbol package)
  (let ((kind (variable-kind symbol)))
    (list :kind (ecase kind
                  (:special "Variable")
                  (:global "Global variable")
                  (:constant "Constant")
                  (:macro "Symbol macro"))
          :summary (if (eq kind :macro)
                       (format nil "~A expands to ~A" (name-text symbol package)
                               (print-briefly (macroexpand-1 symbol) :package package))
                       (format nil "~A = ~A" (name-text symbol package)
                               (if (boundp symbol)
                                   (print-briefly (symbol-value symbol) :package package)
                                   "(unbound)")))
          :documentation (documentation-text symbol 'variable)
          :details nil
          :label (case kind (:constant "constant") (:macro "symbol macro") (t "variable"))
          :source (definition-location symbol (case kind
                                            (:constant :constant)
                                            (:macro :symbol-macro)
                                            (t :variable))))))

(defun condition-class-p (class)
  (subtypep class (find-class 'condition)))

(defun class-entry (symbol package)
  (let* ((class (find-class symbol))
         (kind (typecase class
                 (structure-class :structure)
                 ((satisfies condition-class-p) :condition)
                 (t :class))))
    (list :kind "Class"
          :summary (format nil "~A, metaclass ~A (class-info shows its slots)"
                           (name-text symbol package) (name-text (class-name (class-of class)) package))
          :documentation (documentation-text symbol 'type)
          :details nil
          :label (second (assoc kind *definition-kinds*))
          :source (definition-location symbol kind))))

(defun type-entry (symbol package)
  (multiple-value-bind (expansion expanded) (ignore-errors (sb-ext:typexpand-1 symbol))
    (list :kind "Type"
          :summary (if expanded
                       (format nil "~A = ~A" (name-text symbol package) (print-briefly expansion :package package))
                       (name-text symbol package))
          :documentation (documentation-text symbol 'type)
          :details nil
          :label "type"
          :source (definition-location symbol :type))))

(define-entry (describe-symbol :caller :server :look t) (name &key package session token)
  "Plist: :SYMBOL (qualified), :STATUS (how it is accessible), :ENTRIES, one plist per thing the
symbol names (:KIND :SUMMARY :DOCUMENTATION :DETAILS :LABEL :SOURCE), the source a location plist
and the label its kind as find-definition names it."
  (run-tool token
            (lambda ()
              (let* ((*file-octets* (make-hash-table :test 'equal))
                     (lookup-package (tool-package package session))
                     (symbol (find-existing-symbol name lookup-package))
                     ;; Names print as seen from the symbol's own package: AREA, not SHAPES:AREA.
                     (package (or (symbol-package symbol) lookup-package))
                     (entries '()))
                (when (fboundp symbol)
                  (push (function-entry symbol package) entries))
                (when (fboundp (list 'setf symbol))
                  (push (function-entry (list 'setf symbol) package) entries))
                (when (and (variable-kind symbol) (not (keywordp symbol)))
                  (push (variable-entry symbol package) entries))
                (cond ((find-class symbol nil) (push (class-entry symbol package) entries))
                      ((type-kind symbol) (push (type-entry symbol package) entries)))
                (list :symbol (qualified-name symbol)
                      :status (symbol-status-text symbol lookup-package)
                      :entries (nreverse entries))))))

;;; ------------------------------------------------------------------------------------------
;;; apropos-search

(defparameter *max-apropos* 50)

(defun implementation-symbol-p (symbol)
  (let ((package (symbol-package symbol)))
    (and package
         (or (eql 0 (search "SB-" (package-name package)))
             (server-package-p package)))))

(define-entry (apropos-search :caller :server :look t) (query &key package external-only session token)
  "Plist: :MATCHES, a list of (qualified-name kinds...) for the first *MAX-APROPOS* matching
symbols that name something, best first; :TOTAL, how many such symbols match; :UNNAMED, how
many matching symbols name nothing (not listed); :REST, the handle of every match's line and the
offset of the first not listed (see REST-LISTING)."
  (let ((*handles* (session-handles session)))
   (run-tool token
            (lambda ()
              (let* ((scope (and package
                                 (or (find-package-loosely package)
                                     (fail-missing-package package))))
                     (own (load-time-value (find-package '#:mcp-agent-helper)))
                     (query-upcase (string-upcase query))
                     (named '())
                     (unnamed 0))
                (when (string= query "")
                  (fail "The query is empty: give part of a symbol name."))
                (dolist (symbol (remove-duplicates (apropos-list query scope external-only)))
                  (unless (and (null scope) (eq (symbol-package symbol) own))
                    (let ((kinds (symbol-kinds symbol)))
                      (if kinds
                          (push (cons symbol kinds) named)
                          (incf unnamed)))))
                (flet ((rank (entry)
                         (let* ((symbol (car entry))
                                (name (symbol-name symbol)))
                           (list (cond ((string-equal name query-upcase) 0)
                                       ((eql 0 (search query-upcase name :test #'char-equal)) 1)
                                       (t 2))
                                 (if (implementation-symbol-p symbol) 1 0)
                                 (length name)))))
                  (setf named (sort named
                                    (lambda (a b)
                                      (let ((ra (rank a)) (rb (rank b)))
                                        (loop for x in ra for y in rb
                                              when (< x y) return t
                                              when (> x y) return nil
                                              finally (return (string< (qualified-name (car a))
                                                                       (qualified-name (car b))))))))))
                (list :total (length named)
                      :unnamed unnamed
                      :matches (loop for (symbol . kinds) in named
                                     repeat *max-apropos*
                                     collect (cons (qualified-name symbol) kinds))
                      :rest (rest-listing (loop for (symbol . kinds) in named
                                                collect (format nil "~A  ~{~A~^, ~}" (qualified-name symbol) kinds))
                                          *max-apropos*)))))))

;;; ------------------------------------------------------------------------------------------
;;; find-definition

(defun definition-label (kind source package)
  "A definition's kind, with a method's qualifiers and specializers."
  (let ((label (second (assoc kind *definition-kinds*)))
        (description (let ((accessor (sbcl-symbol :definition-source-description)))
                       (and accessor (fboundp accessor) (funcall accessor source)))))
    (if (and (eq kind :method) description)
        (format nil "~A ~A" label (name-text description package))
        label)))

(define-entry (find-definition :caller :server :look t) (name &key package session token (offset 0) (limit most-positive-fixnum))
  "Plist: :SYMBOL; :NAMES, what the symbol names; :TOTAL, how many definitions it has;
:DEFINITIONS, each (:KIND label :SOURCE location) from the OFFSETth on, at most LIMIT, the
location a plist as SOURCE-LOCATION gives it. Only those are located in their files, so a symbol
with a great many definitions (a generic function of 400,000 methods) costs a page's worth."
  (run-tool token
            (lambda ()
              (let* ((lookup-package (tool-package package session))
                     (symbol (find-existing-symbol name lookup-package))
                     (package (or (symbol-package symbol) lookup-package))
                     (*file-octets* (make-hash-table :test 'equal))
                     (seen (make-hash-table :test 'equal))
                     (found '()))
                ;; The same definition can come back under two kinds (a generic function as a
                ;; function too): one entry per label and place, decided without reading files.
                (flet ((add (kind name source)
                         (let ((key (list (second (assoc kind *definition-kinds*))
                                          (let ((accessor (sbcl-symbol :definition-source-description)))
                                            (and (eq kind :method) accessor (fboundp accessor) (funcall accessor source)))
                                          (consp name)
                                          (ignore-errors (namestring (sb-introspect:definition-source-pathname source)))
                                          (sb-introspect:definition-source-form-path source)
                                          (sb-introspect:definition-source-character-offset source))))
                           (unless (gethash key seen)
                             (setf (gethash key seen) t)
                             (push (list kind name source) found)))))
                  (loop for (kind) in *definition-kinds*
                        do (dolist (source (ignore-errors (sb-introspect:find-definition-sources-by-name symbol kind)))
                             (add kind symbol source)))
                  (when (fboundp (list 'setf symbol))
                    (dolist (source (ignore-errors (sb-introspect:find-definition-sources-by-name
                                                    (list 'setf symbol) :function)))
                      (add :function (list 'setf symbol) source))))
                (setf found (nreverse found))
                (list :symbol (qualified-name symbol)
                      :names (symbol-kinds symbol)
                      :total (length found)
                      :definitions
                      (loop for (kind name source) in (nthcdr offset found)
                            repeat limit
                            collect (let ((label (definition-label kind source package)))
                                      (list :kind (if (consp name)
                                                      (format nil "~A ~A" label (name-text name package))
                                                      label)
                                            :source (definition-source-location kind name source package)))))))))

(defun definition-source-location (kind name source package)
  "Where find-definition's definition of KIND, NAME, with SB-INTROSPECT's SOURCE, is: a generic
function with no file of its own (a slot accessor's, or one made by DEFMETHOD alone) is where
describe-symbol and inspect place it too (see GENERIC-FUNCTION-LOCATION); a slot accessor's
method says which DEFCLASS made it, as its generic function does."
  (cond ((and (member kind '(:generic-function :function))
              (null (sb-introspect:definition-source-pathname source))
              (fboundp name)
              (typep (fdefinition name) 'generic-function))
         (generic-function-location (fdefinition name) name package))
        ((eq kind :method)
         (let ((location (source-location source name))
               (accessor (accessor-method-described name source)))
           (when (and accessor (getf location :file))
             (setf (getf location :made-by) (accessor-made-by accessor package)))
           location))
        (t (source-location source name))))

;;; ------------------------------------------------------------------------------------------
;;; xref

(defparameter *max-xref-hits* 100)

(defun unwrapped-function (function)
  "FUNCTION, or the function it wraps when it is an encapsulation (TRACE's, a breakpoint's,
run-tests'), unwrapped to the innermost: a call to a traced function goes through its wrapper,
whose name is SB-IMPL::ENCAPSULATION and whose source is SBCL's."
  (let ((info-type (sbcl-symbol :encapsulation-info)))
    (loop
      (let ((info (and info-type
                       (sbcl-call :closurep function)
                       (loop for index below (1- (sbcl-call :get-closure-length function))
                             for value = (sbcl-call :%closure-index-ref function index)
                             when (typep value info-type) return value))))
        (if info
            (setf function (sbcl-call :encapsulation-info-definition info))
            (return function))))))

(defun function-callees (symbol)
  "(name . definition-source) of the functions SYMBOL's function (all its methods, for a generic
function) calls."
  (let* ((function (fdefinition symbol))
         (functions (if (typep function 'generic-function)
                        (mapcar #'sb-mop:method-function (sb-mop:generic-function-methods function))
                        (list function))))
    (remove-duplicates
     (loop for f in functions
           append (loop for wrapped in (ignore-errors (sb-introspect:find-function-callees f))
                        for callee = (unwrapped-function wrapped)
                        collect (cons (sbcl-call :%fun-name callee)
                                      (ignore-errors (sb-introspect:find-definition-source callee)))))
     :key #'car :test #'equal)))

(defparameter *xref-kinds* '("calls" "callees" "references" "binds" "sets" "macroexpands" "specializes"))

(defun walking-all-functions (function)
  "Calls FUNCTION, which walks every function of the image (SB-INTROSPECT's WHO-* do). The walk
signals an error when another thread redefines a function under it; a fresh walk sees the new
definition, so it is tried again before the error is let through."
  (loop repeat 2
        do (handler-case (return-from walking-all-functions (funcall function))
             (error () nil)))
  (funcall function))

(defun xref-pairs (symbol kind package)
  "(name . definition-source) of each function that stands in relation KIND to SYMBOL."
  (flet ((check (ok control)
           (unless ok (fail control (name-text symbol package))))
         (who (walker)
           (walking-all-functions (lambda () (funcall walker symbol)))))
    (cond ((string= kind "calls") (who #'sb-introspect:who-calls))
          ((string= kind "references") (who #'sb-introspect:who-references))
          ((string= kind "binds") (who #'sb-introspect:who-binds))
          ((string= kind "sets") (who #'sb-introspect:who-sets))
          ((string= kind "macroexpands")
           (check (macro-function symbol) "~A is not a macro.")
           (who #'sb-introspect:who-macroexpands))
          ((string= kind "specializes")
           (check (find-class symbol nil) "~A is not a class.")
           ;; SBCL names these methods (METHOD NAME); the qualifiers and specializers are in
           ;; the source's description.
           (loop for (name . source) in (sb-introspect:who-specializes-directly symbol)
                 collect (cons (append (if (consp name) name (list name))
                                       (let ((describe (sbcl-symbol :definition-source-description)))
                                         (and source describe (fboundp describe) (funcall describe source))))
                               source)))
          (t
           (check (and (fboundp symbol) (not (macro-function symbol)) (not (special-operator-p symbol)))
                  "~A is not a function.")
           (function-callees symbol)))))

(defun source-order-key (pair)
  "Sorts definitions by file, then by place in the file, without reading any file."
  (let ((source (cdr pair)))
    (if (and source (sb-introspect:definition-source-pathname source))
        (list 0 (namestring (sb-introspect:definition-source-pathname source))
              (or (sb-introspect:definition-source-character-offset source)
                  (first (sb-introspect:definition-source-form-path source))
                  0))
        (list 1 "" 0))))

(defun key< (a b)
  (loop for x in a for y in b
        unless (equal x y)
          return (if (stringp x) (string< x y) (< x y))))

(defun own-function-name-p (name)
  "True for this helper's own functions: they call CAR too, but are none of the user's business."
  (let ((symbol (frame-function-symbol name)))
    (and symbol (eq (symbol-package symbol) (load-time-value (find-package '#:mcp-agent-helper))))))

(defun hit-location (caller source package)
  "Where xref's hit CALLER, with its SB-INTROSPECT SOURCE, is: a slot accessor's method, which
\"specializes\" lists as (METHOD NAME SPECIALIZERS...), says which DEFCLASS made it, as
find-definition's does."
  (let ((location (source-location source caller))
        (accessor (and (consp caller) (eq (first caller) 'method) (consp (rest caller))
                       (accessor-method-described (second caller) source))))
    (when (and accessor (getf location :file))
      (setf (getf location :made-by) (accessor-made-by accessor package)))
    location))

(define-entry (xref :caller :server :look t) (name kind &key package session token)
  "Plist: :SYMBOL, :KIND, :TOTAL and :HITS, each (:NAME :SOURCE location), in file order, at most
*MAX-XREF-HITS*; :REST, the handle of every hit's line (its name and file: finding the line in
the file is what the cap spares) and the offset of the first not listed (see REST-LISTING)."
  (let ((*handles* (session-handles session)))
   (run-tool token
            (lambda ()
              (let* ((lookup-package (tool-package package session))
                     (symbol (find-existing-symbol name lookup-package))
                     (package (or (symbol-package symbol) lookup-package))
                     (kind (or (find kind *xref-kinds* :test #'string-equal)
                               (fail "Unknown xref kind ~S: use ~{~A~^, ~}." kind *xref-kinds*)))
                     (pairs (remove-duplicates
                             (remove-if #'own-function-name-p (xref-pairs symbol kind package) :key #'car)
                             :test #'equal :key (lambda (pair) (cons (car pair) (source-order-key pair)))))
                     (shown (subseq (sort (copy-list pairs) #'key< :key #'source-order-key)
                                    0 (min (length pairs) *max-xref-hits*)))
                     (*file-octets* (make-hash-table :test 'equal)))
                (list :symbol (qualified-name symbol)
                      :kind (string-downcase kind)
                      :total (length pairs)
                      :hits (loop for (caller . source) in shown
                                  collect (list :name (name-text caller package)
                                                :source (if source
                                                            (hit-location caller source package)
                                                            (no-file-location caller))))
                      :rest (rest-listing
                             (loop for pair in (sort (copy-list pairs) #'key< :key #'source-order-key)
                                   for (caller . source) = pair
                                   collect (format nil "~A  ~A" (name-text caller package)
                                                   (let ((file (and source (sb-introspect:definition-source-pathname source))))
                                                     (if file (namestring file) "no file"))))
                             *max-xref-hits*)))))))

;;; ------------------------------------------------------------------------------------------
;;; class-info

(defun structure-slot-accessors (class)
  "Slot name -> (accessor-name . read-only) for a structure class, from its defstruct
description: structure slots have no readers in the MOP."
  (destructuring-bind (&optional find-dd dd-slots dsd-name dsd-accessor dsd-read-only)
      (sbcl-symbols :find-defstruct-description :dd-slots :dsd-name :dsd-accessor-name :dsd-read-only)
    (when (and dsd-read-only (every #'fboundp (list find-dd dd-slots dsd-name dsd-accessor dsd-read-only)))
      (let ((dd (ignore-errors (funcall find-dd (class-name class) nil))))
        (and dd
             (loop for dsd in (funcall dd-slots dd)
                   collect (list (funcall dsd-name dsd)
                                 (funcall dsd-accessor dsd)
                                 (funcall dsd-read-only dsd))))))))

(defun slot-plist (slot package structure-accessors &key from effective)
  "SLOT, a direct slot, as class-info shows it; FROM names the superclass an inherited slot comes
from. EFFECTIVE, the class's effective slot of that name when it is finalized, gives the initargs,
initform and type the class has: those of every superclass defining the slot, merged."
  (let* ((name (sb-mop:slot-definition-name slot))
         (merged (or effective slot))
         (readers (sb-mop:slot-definition-readers slot))
         (writers (sb-mop:slot-definition-writers slot))
         (structure (assoc (symbol-name name) structure-accessors
                           :key #'symbol-name :test #'string=)))
    (when (and structure (second structure))
      (if (third structure)
          (push (second structure) readers)
          (setf readers (list (second structure))
                writers (list (list 'setf (second structure))))))
    (let* ((accessors (remove-if-not (lambda (r) (member (list 'setf r) writers :test #'equal)) readers))
           (readers (set-difference readers accessors))
           (writers (remove-if (lambda (w) (and (consp w) (member (second w) accessors))) writers))
           (type (sb-mop:slot-definition-type merged))
           (allocation (sb-mop:slot-definition-allocation slot)))
      (flet ((names (list) (sort (mapcar (lambda (n) (name-text n package)) list) #'string<)))
        (list :name (name-text name package)
              :type (and (not (eq type t)) (name-text type package))
              :allocation (and (not (eq allocation :instance)) (name-text allocation package))
              :initargs (mapcar (lambda (n) (name-text n package)) (sb-mop:slot-definition-initargs merged))
              :initform (and (sb-mop:slot-definition-initfunction merged)
                             (let ((*package* package))
                               (print-form-briefly (sb-mop:slot-definition-initform merged))))
              :accessors (names accessors)
              :readers (names readers)
              :writers (names writers)
              :from from)))))

(defun effective-slot (class name)
  "CLASS's effective slot NAME, when CLASS is finalized."
  (and (sb-mop:class-finalized-p class)
       (find name (sb-mop:class-slots class) :key #'sb-mop:slot-definition-name)))

(defun inherited-slot-plists (class package)
  "The slots CLASS has from its superclasses, nearest superclass first, each as SLOT-PLIST shows
the direct slot that defines it, with :FROM naming that superclass."
  (let ((own (mapcar #'sb-mop:slot-definition-name (sb-mop:class-direct-slots class)))
        (effective (mapcar #'sb-mop:slot-definition-name (sb-mop:class-slots class)))
        (plists '()))
    (dolist (superclass (rest (sb-mop:class-precedence-list class)))
      (let ((structure-accessors (and (typep superclass 'structure-class)
                                      (structure-slot-accessors superclass))))
        (dolist (slot (sb-mop:class-direct-slots superclass))
          (let ((name (sb-mop:slot-definition-name slot)))
            (when (and (member name effective) (not (member name own)))
              (push name own)
              (push (slot-plist slot package structure-accessors
                                :from (name-text (class-name superclass) package)
                                :effective (effective-slot class name))
                    plists))))))
    (nreverse plists)))

(defun finalize-if-possible (class package)
  "Finalizes CLASS (as its first MAKE-INSTANCE would) so that its precedence list and slots are
known. Returns NIL and the reason when it cannot be: a superclass is not defined yet."
  (cond ((sb-mop:class-finalized-p class) t)
        ((typep class 'sb-mop:forward-referenced-class)
         (values nil "it is a forward-referenced class: named as a superclass but not defined yet"))
        (t
         (handler-case (progn (sb-mop:finalize-inheritance class) t)
           (error ()
             (let ((missing (remove-if-not (lambda (c) (typep c 'sb-mop:forward-referenced-class))
                                           (sb-mop:class-direct-superclasses class))))
               (values nil
                       (if missing
                           (format nil "not finalized: superclass~P ~{~A~^, ~} ~:[is~;are~] not defined yet"
                                   (length missing)
                                   (mapcar (lambda (c) (name-text (class-name c) package)) missing)
                                   (rest missing))
                           "the class could not be finalized"))))))))

(defun shown-in-precedence-p (class)
  "False for classes that are SBCL internals (SB-PCL::SLOT-OBJECT, between STANDARD-OBJECT and T):
unexported names of an SB- package, which no user program refers to."
  (let* ((name (class-name class))
         (package (and (symbolp name) (symbol-package name))))
    (not (and package
              (eql 0 (search "SB-" (package-name package)))
              (not (eq :external (nth-value 1 (find-symbol (symbol-name name) package))))))))

(define-entry (class-info :caller :server :look t) (name &key package session token)
  "Plist describing the class NAME names; see the class-info contract for what is shown."
  (run-tool token
            (lambda ()
              (let* ((lookup-package (tool-package package session)))
                (multiple-value-bind (symbol found parsed-name home) (find-named-symbol name lookup-package)
                  (unless found
                    (fail "Class ~A not found in package ~A~A" parsed-name (package-display-name home)
                          (sentence-hint (missing-symbol-hint parsed-name home #'names-class-p))))
                  (let ((class (find-class symbol nil))
                        (package (or (symbol-package symbol) lookup-package)))
                    (unless class
                      (fail "~A is not a class~A" (name-text symbol lookup-package)
                            (sentence-hint (missing-symbol-hint (symbol-name symbol)
                                                                (or (symbol-package symbol) lookup-package)
                                                                #'names-class-p))))
                    (multiple-value-bind (finalized why) (finalize-if-possible class package)
                      (let* ((*package* package)
                             (names (lambda (classes) (mapcar (lambda (c) (name-text (class-name c) package)) classes)))
                             (direct-slots (sb-mop:class-direct-slots class))
                             (accessors (and (typep class 'structure-class) (structure-slot-accessors class)))
                             (inherited (and finalized (inherited-slot-plists class package))))
                        (list :name (name-text symbol package)
                              :package (and (symbol-package symbol) (package-name (symbol-package symbol)))
                              :metaclass (name-text (class-name (class-of class)) package)
                              :built-in (typep class 'built-in-class)
                              :superclasses (funcall names (sb-mop:class-direct-superclasses class))
                              :subclasses (sort (funcall names (sb-mop:class-direct-subclasses class)) #'string<)
                              :precedence (and finalized
                                               (funcall names (remove-if-not #'shown-in-precedence-p
                                                                             (sb-mop:class-precedence-list class))))
                              :not-finalized why
                              :documentation (documentation-text class t)
                              :direct-slots (mapcar (lambda (slot)
                                                      (slot-plist slot package accessors
                                                                  :effective (effective-slot
                                                                              class
                                                                              (sb-mop:slot-definition-name slot))))
                                                    direct-slots)
                              :inherited-slots inherited
                              :slot-count (and finalized (length (sb-mop:class-slots class)))
                              ;; The classes whose own slots are inherited, not the direct
                              ;; superclasses they came through.
                              :slot-sources (remove-duplicates (mapcar (lambda (slot) (getf slot :from)) inherited)
                                                               :test #'string= :from-end t))))))))))
