;;;; Handles: @N names for the values a session's agent has seen (every evaluate-lisp value,
;;;; every part the inspect tool shows) and for the whole text of output cut in a reply, so that
;;;; the agent can walk into an object or read the rest of a text in slices.
;;;;
;;;; A handle keeps its object alive, so each session's handles are bounded (*MAX-HANDLES*, and
;;;; *MAX-KEPT-CHARACTERS* of kept text), the oldest released first, and all of them released
;;;; with the rest of the session when it ends (sessions.lisp), which owns its HANDLE-TABLE.

(in-package #:mcp-agent-helper)

(defparameter *max-handles* 1000
  "Handles a session keeps; past that the oldest are released.")

(defparameter *max-kept-characters* 8000000
  "Characters of cut output a session keeps behind handles; past that the oldest are released.")

(defclass kept-text ()
  ((text :initarg :text :reader kept-text)
   (lost :initarg :lost :reader kept-text-lost
         :documentation "Characters written but not kept, which were at GAP in TEXT.")
   (gap :initarg :gap :reader kept-text-gap
        :documentation "Where in TEXT the characters not kept were: its end for a printed value,
the end of the start kept for a log, whose end kept follows."))
  (:documentation "The whole text of an output section or a printed value that a reply cut."))

(defclass handle-table ()
  ((lock :initform (sb-thread:make-mutex :name "mcp-agent-helper handles") :reader handle-table-lock)
   (next :initform 1 :accessor handle-table-next)
   (oldest :initform 1 :accessor handle-table-oldest)
   (objects :initform (make-hash-table) :reader handle-table-objects
            :documentation "Number -> object.")
   (numbers :initform (make-hash-table :test 'eq) :reader handle-table-numbers
            :documentation "Object -> number, so that an object seen again keeps its handle.")
   (characters :initform 0 :accessor handle-table-characters)))

(defvar *handles* nil
  "The HANDLE-TABLE of the session the current call serves, while a call that hands out handles
runs; NIL elsewhere, where no handle is made.")

(defun session-handles (session)
  "The handle table of SESSION (its name)."
  (session-handle-table (find-session session)))

(defun handle-name (number)
  (format nil "@~D" number))

(defun release-oldest (table)
  "Releases TABLE's oldest handles while it is over its bounds. Called with its lock held."
  ;; The newest handle stays whatever its size: it is the one the reply names.
  (loop while (and (< (handle-table-oldest table) (1- (handle-table-next table)))
                   (or (> (hash-table-count (handle-table-objects table)) *max-handles*)
                       (> (handle-table-characters table) *max-kept-characters*)))
        do (let* ((number (handle-table-oldest table))
                  (object (gethash number (handle-table-objects table))))
             (incf (handle-table-oldest table))
             (when (remhash number (handle-table-objects table))
               (if (typep object 'kept-text)
                   (decf (handle-table-characters table) (length (kept-text object)))
                   (remhash object (handle-table-numbers table)))))))

(defun add-handle (table object)
  "A new handle of OBJECT in TABLE. Called with its lock held."
  (let ((number (handle-table-next table)))
    (incf (handle-table-next table))
    (setf (gethash number (handle-table-objects table)) object)
    (if (typep object 'kept-text)
        (incf (handle-table-characters table) (length (kept-text object)))
        (setf (gethash object (handle-table-numbers table)) number))
    (release-oldest table)
    (handle-name number)))

(defun self-evident-p (object)
  "True for a value its printed text says all about: a number, a character or a symbol. Such a
value gets no handle (the agent types it again instead)."
  (typep object '(or number character symbol)))

(defun value-handle (object)
  "The handle of OBJECT in the current session (the same one each time it is seen), or NIL when
the call keeps no handles or OBJECT is self-evident."
  (let ((table *handles*))
    (when (and table (not (self-evident-p object)))
      (sb-thread:with-mutex ((handle-table-lock table))
        (let ((number (gethash object (handle-table-numbers table))))
          (if number (handle-name number) (add-handle table object)))))))

(defun text-handle (text lost gap)
  "A handle of TEXT, the kept part of a text that a reply cut (LOST characters that were at GAP in
it were not kept), or NIL when the call keeps no handles."
  (let ((table *handles*))
    (when table
      (sb-thread:with-mutex ((handle-table-lock table))
        (add-handle table (make-instance 'kept-text :text text :lost lost :gap gap))))))

(defun rest-listing (lines shown)
  "The handle of LINES, a listing cut to its first SHOWN lines, as one text, and the offset where
the lines not shown begin in it: (handle offset), or NIL when nothing was cut or the call keeps
no handles."
  (when (> (length lines) shown)
    (let* ((text (format nil "~{~A~%~}" lines))
           (offset (loop for line in lines repeat shown sum (1+ (length line))))
           (handle (text-handle text 0 (length text))))
      (and handle (list handle offset)))))

(defun handle-object (name)
  "The object the handle NAME (\"@3\", or \"3\") stands for in the current session, or a failure
saying why there is none."
  (let* ((table *handles*)
         (digits (string-left-trim "@" (string-trim " " name)))
         (number (and (plusp (length digits)) (every #'digit-char-p digits) (parse-integer digits))))
    (unless number
      (fail "~S is not a handle: handles are written @ and a number, like @3, as replies show them." name))
    (sb-thread:with-mutex ((handle-table-lock table))
      (multiple-value-bind (object found) (gethash number (handle-table-objects table))
        (cond (found object)
              ((>= number (handle-table-next table))
               (fail "There is no handle @~D yet in this session: the newest is @~D." number
                     (1- (handle-table-next table))))
              (t
               (fail "Handle @~D was released: a session keeps its newest ~:D handles and ~:D characters of ~
                      cut output, releasing the oldest first. Evaluate the value again to get a new one."
                     number *max-handles* *max-kept-characters*)))))))

(define-entry (handle-count :caller :person) (&optional session)
  "Handles kept by SESSION (its name), or by every session: for tests and the curious."
  (flet ((count-of (session)
           (let ((table (session-handle-table session)))
             (if table (hash-table-count (handle-table-objects table)) 0))))
    (if session
        (let ((found (gethash session *sessions*)))
          (if found (count-of found) 0))
        (let ((count 0))
          (sb-ext:with-locked-hash-table (*sessions*)
            (maphash (lambda (name session)
                       (declare (ignore name))
                       (incf count (count-of session)))
                     *sessions*))
          count))))
