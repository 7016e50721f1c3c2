;;;; Capped output capture: the streams a tool call's output and printed values go to, cut
;;;; inside the image.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Capped output capture
;;;
;;; Output is cut inside the image so that a 20 MB print never crosses the wire (a swank frame
;;; holds at most 16 MB and the server closes the connection beyond that). A capture shows LIMIT
;;; characters: an output stream (a log) its start and its end, where a run's verdict is; a
;;; printed value its start. It keeps more than it shows, for the agent to read through a handle:
;;; KEEP characters of the start and, for a log, a quarter as many of the end; what is written
;;; between is counted and dropped, so a program may log without end and still finish.
;;;
;;; Only the pretty printer is stopped: it holds on to some 13-25 bytes for each character of
;;; one printed object it passes on, so printing a circular list without *PRINT-CIRCLE* would
;;; exhaust a 1 GB heap after about 40 million characters.

(defvar *max-output* 65536
  "Per call: the characters kept of each section of the reply (--max-output). Condition
messages are cut to it too.")

(defparameter *runaway-output-factor* 64
  "One printed object the pretty printer passes on is stopped past this many times a capture's
limit: far more than anybody reads, far less than endless printing needs to exhaust the heap.")

(defparameter *max-kept-output* 4000000
  "The most characters a capture keeps of the start of its text (see MAKE-CAPTURE).")

(define-condition output-limit-exceeded (error)
  ((limit :initarg :limit :reader output-limit)
   (bound :initarg :bound :reader output-bound))
  (:report (lambda (condition stream)
             (format stream "The pretty printer passed on ~:D characters of one printed object (~D times ~
                             --max-output, ~:D) without reaching its end, so the evaluation was stopped: ~
                             printing without end (a circular list while *PRINT-CIRCLE* is NIL) would ~
                             exhaust the image's memory, since the pretty printer holds on to what it ~
                             prints. Print less, or bind *PRINT-CIRCLE* to T to print circular structure."
                     (output-bound condition) *runaway-output-factor* (output-limit condition)))))

(defclass capture-stream (sb-gray:fundamental-character-output-stream)
  ((buffer :initform (make-array 256 :element-type 'character :adjustable t :fill-pointer 0)
           :reader capture-buffer)
   ;; The characters shown in the reply.
   (limit :initarg :limit :reader capture-limit)
   ;; The characters of the start kept, at least LIMIT: what is kept past those shown is read
   ;; back in slices through a handle (see CAPTURE-REPORT).
   (keep :initarg :keep :reader capture-keep)
   ;; How many of a log's last characters it keeps; NIL for a value.
   (tail-size :initarg :tail-size :reader capture-tail-size)
   ;; Those characters, a ring of TAIL-SIZE that OVERFLOW indexes, made when the first
   ;; character goes past KEEP: a call that prints little must not pay for a ring of megabytes.
   (tail :initform nil :accessor capture-tail)
   ;; Characters written past KEEP: the last of them are in TAIL, the others are lost.
   (overflow :initform 0 :accessor capture-overflow)
   ;; :ANY stops whatever writes past BOUND, :PRETTY only the pretty printer's printing of one
   ;; object, NIL nothing.
   (runaway :initarg :runaway :reader capture-runaway)
   (bound :initarg :bound :reader capture-bound)
   ;; The pretty printer writes from its own buffer, one per printed object: the last string
   ;; written, and how many characters came from it in a row.
   (source :initform nil :accessor capture-source)
   (source-count :initform 0 :accessor capture-source-count)
   ;; Tracked over everything written, kept or not, so FRESH-LINE and the pretty printer
   ;; behave as on an uncapped stream.
   (column :initform 0 :accessor capture-column)))

;; A backtrace of an error in the user's printing shows this stream among their frames'
;; arguments: named for what it is, not by the helper's class.
(defmethod print-object ((stream capture-stream) out)
  (print-unreadable-object (stream out :identity t)
    (write-string "output captured by swank-mcp" out)))

(defun make-capture (limit &key (runaway :pretty) keep (tail t))
  "A capture that shows LIMIT characters and keeps KEEP of the start (by default the runaway
bound, within *MAX-KEPT-OUTPUT*) and with TAIL (a log) a quarter as many of the end. RUNAWAY (see
the class) says which writer it stops past the bound."
  (let* ((bound (* *runaway-output-factor* (max limit 1024)))
         (keep (max limit (min *max-kept-output* (or keep bound)))))
    (make-instance 'capture-stream
                   :limit limit
                   :keep keep
                   :tail-size (and tail (max limit (floor keep 4)))
                   :runaway runaway
                   :bound bound)))

(defun capture-written (stream)
  (+ (fill-pointer (capture-buffer stream)) (capture-overflow stream)))

(defun capture-lost (stream)
  "The characters written but kept neither in the start nor in the tail."
  (max 0 (- (capture-overflow stream) (or (capture-tail-size stream) 0))))

(defun capture-ring (stream)
  "STREAM's ring of a log's last characters, made now if this is its first use; NIL for a value."
  (or (capture-tail stream)
      (let ((size (capture-tail-size stream)))
        (and size (setf (capture-tail stream) (make-string size))))))

(defun pretty-printer-writing-p ()
  "True when the pretty printer is the one writing to the capture (it is among the last callers)."
  (let ((package (load-time-value (find-package "SB-PRETTY"))))
    (labels ((pretty-name-p (name)
               (typecase name
                 (symbol (eq (symbol-package name) package))
                 (cons (or (pretty-name-p (car name)) (pretty-name-p (cdr name)))))))
      (loop for frame = (sbcl-call :top-frame) then (sbcl-call :frame-down frame)
            for depth below 12
            while frame
              thereis (pretty-name-p (sbcl-call :debug-fun-name (sbcl-call :frame-debug-fun frame)))))))

(defun check-capture-bound (stream source count)
  "Stops the writer of COUNT characters from SOURCE (a string, or NIL for a character) when it is
a runaway for STREAM."
  (case (capture-runaway stream)
    (:any (when (> (capture-written stream) (capture-bound stream))
            (error 'output-limit-exceeded :limit (capture-limit stream) :bound (capture-bound stream))))
    (:pretty
     (if (and source (eq source (capture-source stream)))
         (let ((before (capture-source-count stream))
               (bound (capture-bound stream)))
           (setf (capture-source-count stream) (+ before count))
           ;; The stack is looked at once per bound's worth of characters from one string.
           (when (and (> (+ before count) bound)
                      (/= (floor before bound) (floor (+ before count) bound))
                      (pretty-printer-writing-p))
             (error 'output-limit-exceeded :limit (capture-limit stream) :bound bound)))
         (when source
           (setf (capture-source stream) source
                 (capture-source-count stream) count))))))

(defun capture-overflow-write (stream string start end)
  "Writes the characters of STRING from START to END, all past KEEP, into the tail."
  (let ((tail (capture-ring stream))
        (overflow (capture-overflow stream)))
    (when tail
      ;; Only the last SIZE characters can stay in the ring.
      (let ((size (length tail)))
        (loop for i from (max start (- end size)) below end
              do (setf (schar tail (mod (+ overflow (- i start)) size)) (char string i)))))
    (incf (capture-overflow stream) (- end start))))

(defmethod sb-gray:stream-write-char ((stream capture-stream) char)
  (let ((buffer (capture-buffer stream)))
    (if (< (fill-pointer buffer) (capture-keep stream))
        (vector-push-extend char buffer)
        (let ((tail (capture-ring stream)))
          (when tail
            (setf (schar tail (mod (capture-overflow stream) (length tail))) char))
          (incf (capture-overflow stream))
          (check-capture-bound stream nil 1))))
  (setf (capture-column stream) (if (char= char #\Newline) 0 (1+ (capture-column stream))))
  char)

(defmethod sb-gray:stream-write-string ((stream capture-stream) string &optional (start 0) end)
  (let* ((end (or end (length string)))
         (buffer (capture-buffer stream))
         (room (max 0 (- (capture-keep stream) (fill-pointer buffer))))
         (kept-end (min end (+ start room)))
         (newline (position #\Newline string :start start :end end :from-end t)))
    (when (> kept-end start)
      (let ((old (fill-pointer buffer))
            (needed (+ (fill-pointer buffer) (- kept-end start))))
        (when (> needed (array-dimension buffer 0))
          (setf buffer (adjust-array buffer (max needed (* 2 (array-dimension buffer 0))))
                (slot-value stream 'buffer) buffer))
        (setf (fill-pointer buffer) needed)
        (replace buffer string :start1 old :start2 start :end2 kept-end)))
    (when (< kept-end end)
      (capture-overflow-write stream string kept-end end))
    (setf (capture-column stream)
          (if newline (- end newline 1) (+ (capture-column stream) (- end start))))
    (check-capture-bound stream string (- end start))
    string))

(defmethod sb-gray:stream-line-column ((stream capture-stream))
  (capture-column stream))

(defmethod sb-gray:stream-start-line-p ((stream capture-stream))
  (zerop (capture-column stream)))

(defun capture-kept-text (stream)
  "Everything the capture kept: the start and, for a log, the end, in order."
  (let* ((buffer (capture-buffer stream))
         (tail (capture-tail stream))
         (overflow (capture-overflow stream))
         (in-tail (if tail (min overflow (length tail)) 0))
         (text (make-string (+ (fill-pointer buffer) in-tail))))
    (replace text buffer)
    (when (plusp in-tail)
      ;; The ring's oldest character is at OVERFLOW mod its size once it has gone round.
      (let ((oldest (if (> overflow (length tail)) (mod overflow (length tail)) 0)))
        (loop for i below in-tail
              do (setf (schar text (+ (fill-pointer buffer) i))
                       (schar tail (mod (+ oldest i) (length tail)))))))
    text))

(defun capture-shown (stream)
  "The characters of the start and of the end the reply shows."
  (let ((limit (capture-limit stream)))
    (cond ((<= (capture-written stream) limit) (values (capture-written stream) 0))
          ((capture-tail-size stream) (values (- limit (floor limit 4)) (floor limit 4)))
          (t (values limit 0)))))

(defun capture-text (stream)
  "The start shown."
  (let ((buffer (capture-buffer stream)))
    (subseq buffer 0 (min (fill-pointer buffer) (capture-shown stream)))))

(defun capture-dropped (stream)
  "The characters written but not shown."
  (multiple-value-bind (head tail) (capture-shown stream)
    (- (capture-written stream) head tail)))

(defun capture-report (stream)
  "The text shown and how many characters were not: (text dropped more offset handle tail lost).
MORE is the handle of all the text kept (when some was cut and the call keeps handles, see
HANDLES.LISP) and OFFSET where the characters not shown begin there; HANDLE is a printed value's
own (NIL here); TAIL the end shown; LOST the characters not shown that were not kept either, at the
end of the start kept (MORE's text stops there, or goes on with the end kept)."
  (let ((dropped (capture-dropped stream)))
    (if (zerop dropped)
        (list (capture-text stream) 0)
        (multiple-value-bind (head-shown tail-shown) (capture-shown stream)
          (let* ((kept (capture-kept-text stream))
                 (lost (capture-lost stream))
                 (handle (and (> (length kept) (+ head-shown tail-shown))
                              (text-handle kept lost (fill-pointer (capture-buffer stream))))))
            (list (subseq kept 0 head-shown) dropped handle head-shown nil
                  (subseq kept (- (length kept) tail-shown)) lost))))))
