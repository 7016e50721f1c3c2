#+(and sbcl (not win32)) (defun f ()) #-sbcl
;; c
(defun g ())