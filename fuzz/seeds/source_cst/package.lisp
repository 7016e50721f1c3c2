;;;; package.lisp

(defpackage #:shapes
  (:use #:cl)
  (:export #:shape #:circle #:rectangle #:area #:draw #:scale))

(defpackage :shapes-test
  (:use :cl :shapes))

(defpackage "SHAPES-USER"
  (:use "CL" "SHAPES"))

(define-condition shape-error (error)
  ((shape :initarg :shape :reader shape-error-shape))
  (:report (lambda (c s) (format s "Bad shape: ~a" (shape-error-shape c)))))
