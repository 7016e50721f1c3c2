;;; ------------------------------------------------------------------------------------------
;;; Near names: what an error offers when a package, symbol, class or system does not exist
;;;
;;; An agent's first guess at a name is usually close: the right name in the wrong package, or a
;;; letter off. Offering the few real names nearest to it saves a round of apropos-search.

(in-package #:mcp-agent-helper)

(defparameter *max-suggestions* 5)

(defun edit-distance (a b limit)
  "The Levenshtein distance of A and B, compared without case, or NIL when it is above LIMIT."
  (let ((length-a (length a)) (length-b (length b)))
    (when (> (abs (- length-a length-b)) limit)
      (return-from edit-distance nil))
    (let ((row (make-array (1+ length-b) :element-type 'fixnum)))
      (dotimes (j (1+ length-b)) (setf (aref row j) j))
      (loop for i from 1 to length-a
            do (let ((diagonal (aref row 0))
                     (row-minimum i))
                 (setf (aref row 0) i)
                 (loop for j from 1 to length-b
                       do (let ((above (aref row j)))
                            (setf (aref row j) (min (1+ above)
                                                    (1+ (aref row (1- j)))
                                                    (if (char-equal (char a (1- i)) (char b (1- j)))
                                                        diagonal
                                                        (1+ diagonal)))
                                  diagonal above
                                  row-minimum (min row-minimum (aref row j)))))
                 ;; Each later row's minimum is at least this one's.
                 (when (> row-minimum limit)
                   (return-from edit-distance nil))))
      (let ((distance (aref row length-b)))
        (and (<= distance limit) distance)))))

(defun distance-limit (name)
  "How far a real name may be from NAME to be offered: an edit per four characters, one to three."
  (max 1 (min 3 (floor (length name) 4))))

(defun nearest (name candidates key)
  "Up to *MAX-SUGGESTIONS* CANDIDATES whose KEY (a string) is within reach of NAME, nearest
first; among equals, the earlier candidate first."
  (let ((limit (distance-limit name))
        (scored '()))
    (dolist (candidate candidates)
      (let ((distance (edit-distance name (funcall key candidate) limit)))
        (when distance
          (push (cons distance candidate) scored))))
    (let ((sorted (stable-sort (nreverse scored) #'< :key #'car)))
      (mapcar #'cdr (subseq sorted 0 (min *max-suggestions* (length sorted)))))))

(defun did-you-mean (names)
  "\" Did you mean A, B or C?\", or \"\" when NAMES is empty."
  (format nil "~@[ Did you mean ~{~A~#[~; or ~:;, ~]~}?~]" names))

(defun sentence-hint (hint)
  "HINT after a message that has no full stop of its own (the contract's \"Class X not found in
package P\"): the stop comes only with a hint."
  (if (string= hint "") "" (concatenate 'string "." hint)))

(defun packages-near (name)
  "The packages whose name or nickname is near NAME, by their names."
  (let ((pairs '()))
    (dolist (package (list-all-packages))
      (dolist (text (cons (package-name package) (package-nicknames package)))
        (push (cons text package) pairs)))
    (remove-duplicates (mapcar (lambda (pair) (package-name (cdr pair)))
                               (nearest (string-upcase name) (nreverse pairs) #'car))
                       :test #'string= :from-end t)))

(defun missing-package-message (name)
  (format nil "The package ~S does not exist.~A" name (did-you-mean (packages-near name))))

(defun fail-missing-package (name)
  (fail "~A" (missing-package-message name)))

(defun user-package-p (package)
  "False for SBCL's own packages, the swank or slynk server's and this helper's, whose symbols are
no guess of a user's."
  (not (or (eql 0 (search "SB-" (package-name package)))
           (server-package-p package)
           (eq package (load-time-value (find-package '#:mcp-agent-helper))))))

(defun symbols-near (name home naming-p)
  "The symbols for which NAMING-P holds that the user may have meant by NAME, not found in HOME:
first the symbol of that very name in other packages (a wrong package guessed), then near names
accessible in HOME, then near names of the other user packages. By their qualified names."
  (let ((same-name '())
        (accessible '())
        (elsewhere '())
        (seen (make-hash-table :test #'eq)))
    (flet ((consider (symbol list-name)
             (when (and (not (gethash symbol seen)) (funcall naming-p symbol))
               (setf (gethash symbol seen) t)
               (ecase list-name
                 (:accessible (push symbol accessible))
                 (:elsewhere (push symbol elsewhere))))))
      (dolist (package (list-all-packages))
        (multiple-value-bind (symbol status) (find-symbol name package)
          (when (and status (eq (symbol-package symbol) package)
                     (or (user-package-p package) (eq status :external))
                     (funcall naming-p symbol))
            (setf (gethash symbol seen) t)
            (push symbol same-name))))
      (do-symbols (symbol home)
        (consider symbol :accessible))
      (dolist (package (list-all-packages))
        (when (user-package-p package)
          (do-symbols (symbol package)
            (when (eq (symbol-package symbol) package)
              (consider symbol :elsewhere))))))
    (let ((chosen (append (sort same-name #'string< :key #'qualified-name)
                          (nearest name (nreverse accessible) #'symbol-name)
                          (nearest name (nreverse elsewhere) #'symbol-name))))
      (mapcar #'qualified-name (subseq chosen 0 (min *max-suggestions* (length chosen)))))))

(defun names-something-p (symbol)
  "True when SYMBOL names a function, macro, variable, class or type: a symbol the agent could
have been looking for."
  (and (not (keywordp symbol))
       (or (fboundp symbol)
           (fboundp (list 'setf symbol))
           (boundp symbol)
           (find-class symbol nil)
           (variable-kind symbol)
           (type-kind symbol))))

(defun names-class-p (symbol)
  (and (not (keywordp symbol)) (find-class symbol nil) t))

(defun missing-symbol-hint (name home &optional (naming-p #'names-something-p))
  (did-you-mean (symbols-near name home naming-p)))

(defun systems-near (name)
  "The ASDF systems, loaded or in the source registry, whose names are near NAME."
  (let* ((registry (let ((symbol (find-symbol "*SOURCE-REGISTRY*" '#:asdf/source-registry)))
                     (and symbol (boundp symbol) (hash-table-p (symbol-value symbol)) (symbol-value symbol))))
         (names (remove-duplicates
                 (append (funcall (asdf-function "REGISTERED-SYSTEMS"))
                         (and registry (loop for key being the hash-keys of registry collect key)))
                 :test #'string-equal)))
    (nearest (string-downcase name) names #'identity)))

(defun unknown-name-hint (condition)
  "For an error in user code that names something that does not exist (an undefined function, an
unbound variable, a package or a symbol the reader did not find), the near names that do; else
\"\"."
  (handler-case
      (typecase condition
        (undefined-function
         (let ((name (cell-error-name condition)))
           (if (symbolp name)
               (missing-symbol-hint (symbol-name name) (or (symbol-package name) *package*)
                                    (lambda (symbol) (and (not (eq symbol name)) (fboundp symbol))))
               "")))
        (unbound-variable
         (let ((name (cell-error-name condition)))
           (missing-symbol-hint (symbol-name name) (or (symbol-package name) *package*)
                                (lambda (symbol) (and (not (eq symbol name)) (boundp symbol))))))
        (package-error
         (let ((package (package-error-package condition)))
           (cond ((stringp package) (did-you-mean (packages-near package)))
                 ;; The reader's "Symbol X not found in the P package": its first argument is X.
                 ((and (packagep package) (typep condition 'simple-condition)
                       (stringp (first (simple-condition-format-arguments condition))))
                  (let ((name (first (simple-condition-format-arguments condition))))
                    (multiple-value-bind (symbol status) (find-symbol name package)
                      (if (and (member status '(:internal :inherited)) (names-something-p symbol))
                          ;; The reader's "not external" about a symbol that names something: it
                          ;; is only not exported. One a typo once interned names nothing.
                          (format nil " ~A exists, but ~A does not export it: export it, or write ~A::~A."
                                  (qualified-name symbol) (package-name package) (package-name package) name)
                          (missing-symbol-hint name package
                                               (lambda (symbol)
                                                 (and (eq (symbol-package symbol) package)
                                                      (eq :external (nth-value 1 (find-symbol (symbol-name symbol)
                                                                                              package))))))))))
                 (t ""))))
        (t ""))
    ;; A hint must never hide the error it comments on.
    (error () "")))
