(defun f (x)
  ;; c
  (g x))
