;;;; shapes.lisp --- a small geometry library used by the source-editor tests.

(in-package #:shapes)

;;; Classes

(defclass shape ()
  ((name :initarg :name :reader shape-name)))

(defclass circle (shape)
  ((radius :initarg :radius :accessor radius)))

(defclass rectangle (shape)
  ((width :initarg :width :accessor width)
   (height :initarg :height :accessor height)))

(defstruct (point (:conc-name pt-) (:constructor make-pt (x y)))
  (x 0 :type real)
  (y 0 :type real))

;;; Protocol

(defgeneric area (shape)
  (:documentation "The area of SHAPE."))

(defgeneric draw (shape stream))

;; Circles are round.
;; The area uses PI.
(defmethod area ((shape circle))
  (* pi (expt (radius shape) 2)))

(defmethod area ((r rectangle))
  (* (width r) (height r)))

(defmethod area :around ((s shape))
  (let ((a (call-next-method)))
    (if (minusp a) 0 a)))

(defmethod draw ((shape circle) stream)
  (format stream "(circle ~a)" (radius shape))) ; the #\( in a string

(defmethod draw ((shape rectangle) (stream t))
  (format stream "[~a x ~a]" (width shape) (height shape)))

(defmethod draw ((shape (eql :origin)) stream)
  (write-string "." stream))

(defmethod print-object ((c circle) stream)
  (print-unreadable-object (c stream :type t)
    (format stream "r=~a" (radius c))))

(defmethod (setf radius) :before (new (c circle))
  (check-type new (real 0)))

(defun (setf shape-label) (new shape)
  (setf (slot-value shape 'name) new))

(defun scale (shape factor)
  "Return a copy of SHAPE scaled by FACTOR."
  (etypecase shape
    (circle (make-instance 'circle :radius (* factor (radius shape))))
    (rectangle (make-instance 'rectangle
                              :width (* factor (width shape))
                              :height (* factor (height shape))))))

#+sbcl
(defun gc-shapes ()
  (sb-ext:gc :full t))

#-sbcl
(defun gc-shapes ()
  nil)

(defvar *unit-circle* (make-instance 'circle :radius 1))

(defparameter *table* #(1 2 3))

(defmacro with-shape ((var shape) &body body)
  `(let ((,var ,shape))
     ,@body))
