;;;; The swank-mcp helper: the Lisp side of the tools, put into the attached image by
;;;; bootstrap.lisp once per revision of its text. This first file makes the helper's package and
;;;; the few things every other file needs to be read (NEW, DEFINE-ENTRY). The files are loaded in
;;;; the order of HELPER_FILES in src/image/helper.rs, the one place that lists them; the core
;;;; (state, SBCL's internals, the footprint, the servers, what every tool shares) comes first,
;;;; then one file per tool, as docs/design.md ("The helper in the image") describes.
;;;;
;;;; Rules every helper file keeps, because it runs inside somebody else's live image:
;;;; - Everything lives in the MCP-AGENT-HELPER package; loading the helper changes nothing
;;;;   outside it (no DECLAIM, no *FEATURES* push, no changes to the readtable, the printer or the
;;;;   debugger hooks outside the dynamic extent of a call). What the helper must change in the
;;;;   image to work (encapsulations of SBCL's functions, hooks) is listed in footprint.lisp, put
;;;;   in by its INSTALL after each load and taken out by UNINSTALL; no other file installs
;;;;   anything, and everything installed is inert outside the agents' tool calls.
;;;; - It is independent of swank and slynk: the Rust side calls it through either, so it must
;;;;   not mention either package. (The package name avoids the word "swank" for the same
;;;;   reason: Slynk's reader rewrites any token containing it.) servers.lisp is the helper's
;;;;   backend, as swank/backend.lisp is swank's: the only file that names either server or
;;;;   anything of theirs, found by name for the SERVER of the request a thread serves; the
;;;;   others call its functions (tests/helper_source.rs checks).
;;;; - It is compiled into a file that replaces the previous revision's definitions, or loaded
;;;;   as source, so redefinition must be harmless: DEFCLASS rather than DEFSTRUCT, DEFVAR for
;;;;   state that must survive a reload.
;;;; - It names no SBCL internal but through sbcl.lisp, which lists them all: one that a future
;;;;   SBCL drops must fail the tool that needs it, not the helper's load.
;;;; - State that outlives a reload, and every mutex, is defined in state.lisp, whose lock order
;;;;   every file keeps.
;;;; - What a session makes once is made with NEW; what every call makes, with MAKE-INSTANCE of
;;;;   a quoted class (see NEW).
;;;; - A function called from outside the helper (by the swank-mcp server, through CALL, by Emacs,
;;;;   or by the person at their REPL) is defined with DEFINE-ENTRY, which exports it and says who
;;;;   calls it; nothing else is exported.

(defpackage #:mcp-agent-helper
  (:use #:common-lisp))

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; Instances

(defun new (class &rest initargs)
  "MAKE-INSTANCE of CLASS through the generic path, for what a session makes once. With a quoted
class SBCL compiles an optimized constructor at the first instance, some 2 ms holding the world
lock, on the first call of a fresh image; the instances it makes after that take a tenth of the
time or less (evaluate-lisp's four per call: 9 us a call instead of 18), so what every call makes
is made that way."
  (apply #'make-instance class initargs))

;;; ------------------------------------------------------------------------------------------
;;; Entries

(defmacro define-entry (name-and-options lambda-list &body body)
  "Defines the function NAME as DEFUN does, and exports it: an entry of the helper, which the
swank-mcp server calls (through CALL, which runs exported functions only), Emacs does, or the
person does at their REPL. NAME-AND-OPTIONS is (NAME :CALLER caller [:LOOK T] [:ATTACHED how]).

CALLER says who calls it, and must be given: :SERVER (a request of the Rust server names it),
:EMACS (elisp-compat/swank-mcp.el calls it), :PERSON (for the person's REPL and the tests), or a
list of these. tests/helper_source.rs checks each against the callers' sources, so an entry
nobody calls any more is seen.

A look reads the image, writes no file and never reads, compiles or runs code the request
supplies (names are parsed, not read): the only entries LOOK runs, for a server that promised
--read-only.

ATTACHED marks a debugger action that ATTACHED (image-threads.lisp) may run in a thread waiting
in a server's debugger of its own: T, or :AGENT-CODE for one that evaluates the agent's code
there, which then runs as the agent's. The only statement of which entries those are: the Rust
side's debugger actions are checked against it (src/tools/debugger.rs).

Each definition says it afresh, so a reloaded helper cannot keep an older revision's word for an
entry."
  (destructuring-bind (name &key look attached (caller (error "The entry ~S says no :CALLER." name-and-options)))
      (if (consp name-and-options) name-and-options (list name-and-options))
    (let ((callers (if (listp caller) caller (list caller))))
      (unless (and callers (subsetp callers '(:server :emacs :person)))
        (error "The entry ~S has :CALLER ~S, not :SERVER, :EMACS, :PERSON or a list of them." name caller))
      (unless (member attached '(nil t :agent-code))
        (error "The entry ~S has :ATTACHED ~S, not T or :AGENT-CODE." name attached))
      `(progn (export ',name)
              (setf (get ',name 'look) ,look
                    (get ',name 'attached) ,attached
                    (get ',name 'callers) ',callers)
              (defun ,name ,lambda-list ,@body)))))
