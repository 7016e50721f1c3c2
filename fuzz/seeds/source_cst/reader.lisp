;;;; reader.lisp --- every corner of the standard reader syntax in one file.

#|
  A block comment #| with a nested one |#
  and a stray ) and " that mean nothing here.
|#

(defparameter *characters*
  (list #\( #\) #\Space #\Tab #\; #\" #\\ #\| #\a #\λ))

(defparameter *strings* '("a \"quoted\" word" "a ) paren" "λ and ;"))

(defparameter *symbols* '(|a symbol with ) and spaces| foo\ bar cl:car cl-user::x :key #:uninterned))

(defparameter *numbers* '(1 -2 3/4 5.0e3 #b101 #o17 #xFF #36rZZ #C(1 2)))

(defparameter *objects*
  (list #p"/tmp/file.lisp" #S(point :x 1 :y 2) #*10110 #(1 2 3) #2A((1 2) (3 4)) '#1=(a . #1#) #.(+ 1 2)))

(defmacro quasi (x)
  `(list ,x ,@(list x) ',x #'car))

#+(and sbcl (not win32))
;; A comment between the conditional and its form.
(defun platform () :sbcl-unix)

#-(or sbcl ccl) (defun platform () :other)

(defun tabs	(a	b)
	(+ a b))
