;;;; Where the image's ASDF systems and their files are: the directories the source tools may read
;;;; under besides the roots, and a system's files for find-definition's `system` (no .asd is
;;;; loaded, so this is a look, --read-only's too).

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Where the image's systems are, for the source tools that may read them

(defun asdf-system-directories ()
  "The native names of the directories of the ASDF systems registered in the image; empty when
ASDF is not loaded."
  (flet ((asdf (name)
           (let ((symbol (and (find-package '#:asdf) (find-symbol name '#:asdf))))
             (and symbol (fboundp symbol) (symbol-function symbol)))))
    ;; REGISTERED-SYSTEM, not FIND-SYSTEM: this is a look, and FIND-SYSTEM loads a system's .asd
    ;; file again when it changed on disk.
    (let ((registered (asdf "REGISTERED-SYSTEMS"))
          (find (asdf "REGISTERED-SYSTEM"))
          (pathname-of (asdf "COMPONENT-PATHNAME")))
      (and registered find pathname-of
           (remove-duplicates
            (loop for name in (funcall registered)
                  for system = (ignore-errors (funcall find name))
                  for directory = (and system (ignore-errors (funcall pathname-of system)))
                  when directory
                    collect (sb-ext:native-namestring directory))
            :test #'string=)))))

(define-entry (system-directories :caller :server :look t) (&key session token)
  "(:DIRECTORIES names): the directories of the ASDF systems registered in the image, where
lisp-outline and lisp-check-parens may read files. Empty when ASDF is not loaded."
  (declare (ignore session))
  (run-tool token
            (lambda () (list :directories (asdf-system-directories)))
            :turn (list *asdf-turn* "system-directories")))

(define-entry (system-files :caller :server :look t) (name &key session token)
  "(:SYSTEM name :DIRECTORY native :FILES natives): the files of the ASDF system NAME registered in
the image, its .asd file first, then its source files in the order the system lists them, for
find-definition. Fails when no system of that name is registered."
  (declare (ignore session))
  (run-tool token
            (lambda ()
              (flet ((asdf (name)
                       (let ((symbol (and (find-package '#:asdf) (find-symbol name '#:asdf))))
                         (or (and symbol (fboundp symbol) (symbol-function symbol))
                             (fail "ASDF is not loaded in the image, so it knows no system.")))))
                ;; REGISTERED-SYSTEM, as in SYSTEM-DIRECTORIES: a look loads no .asd file.
                (let* ((system (or (funcall (asdf "REGISTERED-SYSTEM") name)
                                   (funcall (asdf "REGISTERED-SYSTEM") (string-downcase name))
                                   (fail "No system ~S is registered in the image. load-system loads it; ~
                                          this look reads no .asd file." name)))
                       (source-file (find-class (find-symbol "SOURCE-FILE" '#:asdf)))
                       (parent (find-class (find-symbol "PARENT-COMPONENT" '#:asdf)))
                       (pathname-of (asdf "COMPONENT-PATHNAME"))
                       (files '()))
                  (labels ((walk (component)
                             (cond ((typep component source-file)
                                    (let ((pathname (funcall pathname-of component)))
                                      (when pathname (push (sb-ext:native-namestring pathname) files))))
                                   ((typep component parent)
                                    (mapc #'walk (funcall (asdf "COMPONENT-CHILDREN") component))))))
                    (walk system))
                  (let ((asd (ignore-errors (funcall (asdf "SYSTEM-SOURCE-FILE") system)))
                        (directory (funcall pathname-of system)))
                    (list :system (funcall (asdf "COMPONENT-NAME") system)
                          :directory (and directory (sb-ext:native-namestring directory))
                          :files (append (and asd (list (sb-ext:native-namestring asd))) (nreverse files)))))))
            :turn (list *asdf-turn* "system-files")))
