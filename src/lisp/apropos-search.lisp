;;;; The apropos-search tool: symbols whose names contain a string and that name something.

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; apropos-search

(defparameter *max-apropos* 50)

(defun implementation-symbol-p (symbol)
  (let ((package (symbol-package symbol)))
    (and package
         (or (eql 0 (search "SB-" (package-name package)))
             (server-package-p package)))))

(define-entry (apropos-search :caller :server :look t) (query &key package external-only session token)
  "Plist: :MATCHES, a list of (qualified-name kinds...) for the first *MAX-APROPOS* matching
symbols that name something, best first; :TOTAL, how many such symbols match; :UNNAMED, how
many matching symbols name nothing (not listed); :REST, the handle of every match's line and the
offset of the first not listed (see REST-LISTING)."
  (let ((*handles* (session-handles session)))
   (run-tool token
            (lambda ()
              (let* ((scope (and package
                                 (or (find-package-loosely package)
                                     (fail-missing-package package))))
                     (own (load-time-value (find-package '#:mcp-agent-helper)))
                     (query-upcase (string-upcase query))
                     (named '())
                     (unnamed 0))
                (when (string= query "")
                  (fail "The query is empty: give part of a symbol name."))
                (dolist (symbol (remove-duplicates (apropos-list query scope external-only)))
                  (unless (and (null scope) (eq (symbol-package symbol) own))
                    (let ((kinds (symbol-kinds symbol)))
                      (if kinds
                          (push (cons symbol kinds) named)
                          (incf unnamed)))))
                (flet ((rank (entry)
                         (let* ((symbol (car entry))
                                (name (symbol-name symbol)))
                           (list (cond ((string-equal name query-upcase) 0)
                                       ((eql 0 (search query-upcase name :test #'char-equal)) 1)
                                       (t 2))
                                 (if (implementation-symbol-p symbol) 1 0)
                                 (length name)))))
                  (setf named (sort named
                                    (lambda (a b)
                                      (let ((ra (rank a)) (rb (rank b)))
                                        (loop for x in ra for y in rb
                                              when (< x y) return t
                                              when (> x y) return nil
                                              finally (return (string< (qualified-name (car a))
                                                                       (qualified-name (car b))))))))))
                (list :total (length named)
                      :unnamed unnamed
                      :matches (loop for (symbol . kinds) in named
                                     repeat *max-apropos*
                                     collect (cons (qualified-name symbol) kinds))
                      :rest (rest-listing (loop for (symbol . kinds) in named
                                                collect (format nil "~A  ~{~A~^, ~}" (qualified-name symbol) kinds))
                                          *max-apropos*)))))))
