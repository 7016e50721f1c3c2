;;;; What the introspection tools share (describe-symbol, apropos-search, find-definition, xref,
;;;; class-info and inspect, a file each): where a definition is, file, line and column, found
;;;; again in the file's current text, and where a generic function and its methods are.
;;;;
;;;; Nothing here reads user text with the Lisp reader: symbol names are parsed by hand and
;;;; looked up with FIND-SYMBOL, so asking about a name never interns it.

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
;;; Where a generic function and its methods are, for the tools that name them

(defun definition-location (symbol type)
  "Where SYMBOL's first definition of TYPE is (see SOURCE-LOCATION), if SBCL knows of one.

(SYMBOL may be a (SETF NAME) function name.)"
  (let ((source (first (ignore-errors (sb-introspect:find-definition-sources-by-name symbol type)))))
    (and source (source-location source symbol))))

(defun method-location (method)
  "Where METHOD was defined, as a location plist with a file, or NIL when SBCL knows no file."
  (let ((source (ignore-errors (sb-introspect:find-definition-source method))))
    (and source
         (sb-introspect:definition-source-pathname source)
         (source-location source (sb-mop:generic-function-name (sb-mop:method-generic-function method))))))

(defun file-location-text (location)
  "FILE:LINE:COLUMN of a location plist with a file."
  (format nil "~A~@[:~D~]~@[:~D~]" (getf location :file) (getf location :line) (getf location :column)))

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
