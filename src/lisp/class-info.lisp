;;;; The class-info tool: a class's superclasses, subclasses, precedence list and slots.

(in-package #:mcp-agent-helper)

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
