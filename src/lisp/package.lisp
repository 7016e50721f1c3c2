;;;; The swank-mcp helper: the Lisp side of the tools, put into the attached image by
;;;; bootstrap.lisp once per revision of its text. This first file makes the helper's package and
;;;; the few things every other file needs to be read (NEW, INTERNAL-CALL, DEFINE-ENTRY). Then
;;;; footprint.lisp, the one file that changes anything outside the package (INSTALL, UNINSTALL),
;;;; and servers.lisp, the one place that knows swank from slynk. What every tool shares follows,
;;;; one file per purpose: capture.lisp (output capture), calls.lisp (running a call under a token
;;;; that a timeout or cancellation can interrupt, and CALL, the server's way in),
;;;; conditions.lisp (backtraces and condition reports), sessions.lisp (the SESSION object that
;;;; owns everything a client's session keeps here), tool-calls.lisp (reading the user's code,
;;;; RUN-TOOL and FAIL) and printing.lisp. Then the tools' own files: names.lisp, handles.lisp,
;;;; observe.lisp, evaluate.lisp, debugger.lisp, introspection.lisp, compile.lisp, systems.lisp,
;;;; testing.lisp, undo.lisp, loading.lisp, activity.lisp, inspect.lisp and workers.lisp, in that
;;;; order.
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
;;;;   reason: Slynk's reader rewrites any token containing it.) The server's parts are found by
;;;;   name, in servers.lisp only: the SERVER of the request a thread serves has them.
;;;; - It is compiled into a file that replaces the previous revision's definitions, or loaded
;;;;   as source, so redefinition must be harmless: DEFCLASS rather than DEFSTRUCT, DEFVAR for
;;;;   state that must survive a reload.
;;;; - It names no SBCL internal in its source (see EXISTING-SYMBOLS): one that a future SBCL
;;;;   drops must fail the tool that needs it, not the helper's load.
;;;; - What a session makes once is made with NEW; what every call makes, with MAKE-INSTANCE of
;;;;   a quoted class (see NEW).
;;;; - A function called from outside the helper (by the swank-mcp server, through CALL, or by
;;;;   Emacs) is defined with DEFINE-ENTRY, which exports it; nothing else is exported.

(defpackage #:mcp-agent-helper
  (:use #:common-lisp))

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; The bootstrap's state (bootstrap.lisp, which loads this helper)

(defvar *version*)
(defvar *release*)
(defvar *load-lock*)
(defvar *calls-running*)

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
swank-mcp server calls (through CALL, which runs exported functions only) or Emacs does.
NAME-AND-OPTIONS is NAME or (NAME :LOOK T). A look reads the image, writes no file and never
reads, compiles or runs code the request supplies (names are parsed, not read): the only entries
LOOK runs, for a server that promised --read-only. Each definition says it afresh, so a reloaded
helper cannot keep an older revision's word for an entry."
  (destructuring-bind (name &key look) (if (consp name-and-options) name-and-options (list name-and-options))
    `(progn (export ',name)
            (setf (get ',name 'look) ,look)
            (defun ,name ,lambda-list ,@body))))

;;; ------------------------------------------------------------------------------------------
;;; SBCL internals, found by name (first in the file: INTERNAL-CALL is a macro)

(defun existing-symbols (package-name &rest names)
  "The symbols of PACKAGE-NAME named NAMES that exist in this SBCL. Internal names move between
SBCL releases; reading them as SB-IMPL::X would intern them, which the package lock forbids, and
SB-IMPL:X is a read error once X is no longer external: either way the whole helper would fail
to load. So this file names no SBCL internal in its source; it finds them here."
  (let ((package (find-package package-name)))
    (and package
         (loop for name in names
               for symbol = (find-symbol name package)
               when symbol collect symbol))))

(defun sbcl-internal (package-name name)
  "The symbol PACKAGE-NAME:NAME of SBCL's internals, or a failure of the one tool that needs it
when this SBCL lacks it."
  (or (first (existing-symbols package-name name))
      (fail "This SBCL (~A) has no ~A::~A, which this tool needs; swank-mcp is tested with SBCL 2.2.9."
            (lisp-implementation-version) package-name name)))

(defmacro internal-call (package-name name &rest arguments)
  "Calls the function PACKAGE-NAME:NAME of SBCL's internals (see SBCL-INTERNAL)."
  `(funcall (sbcl-internal ,package-name ,name) ,@arguments))
