;;;; shapes.asd

(asdf:defsystem "shapes"
  :description "Geometry for the source-editor tests."
  :components ((:file "package")
               (:file "shapes" :depends-on ("package"))))

(defsystem #:shapes/test
  :depends-on ("shapes")
  :components ((:file "tests")))
