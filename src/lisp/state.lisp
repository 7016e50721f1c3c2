;;;; The helper's state: every global whose value must outlive a reload of the helper, and every
;;;; mutex, in one place, with the order the mutexes are taken in.
;;;;
;;;; What belongs here: a DEFVAR whose global value the helper changes as it serves calls (what
;;;; the sessions, the activity record, the journal, the footprint hold), and every mutex. A new
;;;; revision of the helper is loaded over the old one in a running image, and DEFVAR keeps these
;;;; values, so the new revision goes on with the old one's sessions, records and locks. What
;;;; does not belong here: a DEFPARAMETER (a limit or a table the code reads, made afresh at each
;;;; load), and a special variable that is only bound around a call (*AGENT-CALL*, *PARKED*...),
;;;; whose global value is NIL; those stay in the file that uses them. A mutex of one object (a
;;;; SESSION's, a HANDLE-TABLE's, a TRACE-LOG's, a BACKGROUND's) lives in its slot, but is in the
;;;; lock order below.
;;;;
;;;; The lock order. A thread holding a lock may take only locks listed after it, never one listed
;;;; before (found by reading every WITH-MUTEX, WITH-RECURSIVE-LOCK and WITH-LOCKED-HASH-TABLE and
;;;; what runs inside; UNINSTALL nests the most: *LOAD-LOCK*, then *SESSIONS*, a SESSION's lock,
;;;; *WIDE-TRACES-LOCK*, *BREAKPOINTS-LOCK*, *WORKERS-LOCK*, *FOOTPRINT-LOCK* with *SERVERS-LOCK*
;;;; inside it, and *JOURNAL-LOCK*, one after another).
;;;;   1. The turns, held while a tool runs the agent's code, so that anything below may be taken
;;;;      inside them: the ASDF turn's lock (*ASDF-TURN*), *PROFILE-LOCK*, *UNCHANGED-LOCK*.
;;;;      The helper never takes one while it holds a lock listed after them.
;;;;   2. *LOAD-LOCK* (bootstrap.lisp: loading the helper and INSTALL; UNINSTALL; CALL, alone).
;;;;   3. *FOOTPRINT-LOCK* (INSTALL, INSTALL-SERVER, REMOVE-FOOTPRINT).
;;;;   4. *SERVERS-LOCK* (FORGET-SERVERS, inside REMOVE-FOOTPRINT). SERVERS takes it and lets it go
;;;;      before it calls INSTALL-SERVER, which takes *FOOTPRINT-LOCK*.
;;;;   5. *TEST-HOOKS-LOCK* and *BREAKPOINTS-LOCK*, held while they encapsulate a function.
;;;;   6. A TRACE-LOG's lock, then *WIDE-TRACES-LOCK* (TAKE-WIDE-TRACE).
;;;;   7. *SESSIONS* (a synchronized table, locked to go through it), then a SESSION's lock
;;;;      (REVOKE-SESSION-ALLOWANCES) or a BACKGROUND's (NOTE-IMAGE-THREAD-STOP).
;;;;   8. The leaves, which take no other lock of the helper's while held: *REGISTRY-LOCK*,
;;;;      *ACTIVITY-LOCK*, *APPROVAL-LOCK*, *JOURNAL-LOCK*, *WORKERS-LOCK*, *HOOK-LOCK* (held
;;;;      without GC, so never around anything that can wait), *AGENT-THREADS*, a HANDLE-TABLE's
;;;;      lock, *ATTACHED-ROUTES* (held while a server hands a request to a thread's mailbox),
;;;;      and those of 6 and 7 taken alone. The servers' own locks (their mailboxes and
;;;;      thread ids, servers.lisp) and SBCL's come after all of the helper's.
;;;; Code that must take two locks the other way round releases the first before it takes the
;;;; second (REMOVE-BREAKPOINTS notes its event after it lets *BREAKPOINTS-LOCK* go; CANCEL-CALL
;;;; lets *ACTIVITY-LOCK* go before it declines approvals and interrupts evaluations).

(in-package #:mcp-agent-helper)

;;; ------------------------------------------------------------------------------------------
;;; The bootstrap's (bootstrap.lisp defines them, before the helper is loaded)

(defvar *version*)
(defvar *release*)
(defvar *load-lock*)
(defvar *calls-running*)

;;; ------------------------------------------------------------------------------------------
;;; The footprint (footprint.lisp)

(defvar *installed* '()
  "What INSTALL put into the image and UNINSTALL takes out, each (:ENCAPSULATION function tag) or
(:HOOK variable function), for as long as the image runs: kept across reloads, so that a later
revision of the helper takes out what an earlier one installed and it does not.")

(defvar *footprint-installed* nil
  "True between INSTALL and UNINSTALL: a server seen meanwhile gets its hook (see INSTALL-SERVER).")

(defvar *footprint-lock* (sb-thread:make-mutex :name "mcp-agent-helper footprint")
  "Guards *INSTALLED* and *FOOTPRINT-INSTALLED*: INSTALL, UNINSTALL and a new server's footprint
must not interleave.")

(defvar *fdefinition-hook* nil
  "The function this helper puts on SBCL's fdefinition hook: one closure for the life of the image,
which calls NOTE-FDEFINITION-CHANGE by name so that a reloaded helper's definition takes over.")

(defvar *uninstall-pending* nil
  "True when UNINSTALL was asked to wait for the sessions to end: the last one to end uninstalls.")

;;; ------------------------------------------------------------------------------------------
;;; The servers seen (servers.lisp)

(defvar *servers* '()
  "The SERVERs of the server packages seen so far, made when first seen.")

(defvar *servers-lock* (sb-thread:make-mutex :name "mcp-agent-helper servers")
  "Guards *SERVERS*: two calls may see a new server package at once.")

;;; ------------------------------------------------------------------------------------------
;;; Calls under way, cancellations, and the ASDF turn (calls.lisp)

(defvar *registry-lock* (sb-thread:make-mutex :name "mcp-agent-helper registry")
  "Guards *RUNNING*, *EARLY-CANCELLATIONS*, *RECENTLY-FINISHED* and *CANCELLED-CALLS*: a call
and its cancellation run in different threads.")

(defvar *running* (make-hash-table :test 'equal)
  "Token -> the EVALUATION in progress under that token.")

(defvar *early-cancellations* (make-hash-table :test 'equal)
  "Token -> (kind . reason) for cancellations that arrived before their evaluation started: the
cancel request and the evaluation run in different worker threads, in either order.")

(defvar *recently-finished* (make-hash-table :test 'equal)
  "Token -> the internal real time its evaluation finished, for the last calls only: it tells a
call whose reply never reached the client apart from one that never started.")

(defvar *cancelled-calls* (make-hash-table :test 'equal)
  "Agent's call id -> (kind . reason) for the tool calls the user cancelled in Emacs (CANCEL-CALL
in activity.lisp): an evaluation of such a call that starts later aborts at once.")

(defclass turn ()
  ((name :initarg :name :reader turn-name)
   ;; Recursive: run-tests loads the system it tests, and the system's tests may load more.
   (lock :initarg :lock :reader turn-lock)
   (holder :initform nil :accessor turn-holder :documentation "What the call that has it does.")
   (since :initform nil :accessor turn-since)))

(defvar *asdf-turn*
  (new 'turn :name "ASDF" :lock (sb-thread:make-mutex :name "mcp-agent-helper ASDF"))
  "Taken by the tools' ASDF work.")

;;; ------------------------------------------------------------------------------------------
;;; Sessions (sessions.lisp)

(defvar *sessions* (make-hash-table :test 'equal :synchronized t)
  "Session name -> its SESSION, from its first call to its end.")

;;; ------------------------------------------------------------------------------------------
;;; The activity record and the approvals (activity.lisp)

(defvar *emacs-feeds* '()
  "The Emacs channels to tell of agents' calls, each (CONNECTION CHANNEL-ID TOPIC SEND LIVE-P).
TOPIC is :ACTIVITY (an activity buffer) or :APPROVALS (approval mode). SEND queues one message for
that connection's Emacs and returns NIL once the connection has closed; LIVE-P, of no arguments,
says whether it is still open. Emacs adds and removes its entries itself
(swank-mcp--subscribe-form), with the server's names, which this file may not mention, and maybe
before any agent has loaded this helper.")

(defvar *activity-lock* (sb-thread:make-mutex :name "mcp-agent-helper activity")
  "Guards *ACTIVITY*, *ACTIVITY-BY-ID* and *ACTIVITY-VERSION*: the servers note calls and Emacs reads
the record from different threads.")

(defvar *activity* '()
  "The recorded calls, newest first.")

(defvar *activity-by-id*
  ;; A revision loaded over an older one keeps its record.
  (let ((table (make-hash-table :test 'equal)))
    (dolist (record *activity* table)
      (setf (gethash (slot-value record 'id) table) record)))
  "The records of *ACTIVITY* by id: each call is noted two or three times, and a search of the
list for a new call's id would compare it with every record.")

(defvar *activity-version* 0
  "Counts every change to a record, so that Emacs can tell which of two plists of a call is newer:
one it was told of, or one in the whole record it asked for meanwhile.")

(defvar *event-counter* (list 0)
  "The last event number given, in a cons for ATOMIC-INCF: an event's id is \"event-\" and its
number, never an id the servers give calls (\"<session>-call-<number>\").")

(defvar *approved-unsettled* '()
  "Approved calls whose server has yet to tell whether they run (SETTLE-APPROVAL), under
*APPROVAL-LOCK*.")

(defvar *approvals* '()
  "Approvals waiting for the user's answer.")

(defvar *approval-lock* (sb-thread:make-mutex :name "mcp-agent-helper approvals")
  "Guards *APPROVALS*, *APPROVED-UNSETTLED* and *NEXT-APPROVAL-ID*: an approval is asked for, answered
and settled from different threads.")

(defvar *next-approval-id* 1
  "The id the next approval gets, under *APPROVAL-LOCK*.")

(defvar *allowances-given* (list 0)
  "How many allowances were given, in a cons for ATOMIC-INCF: each is numbered, so that they are
listed in the order they were given.")

;;; ------------------------------------------------------------------------------------------
;;; The trace tool (trace.lisp)

(defvar *wide-traces* '()
  "The WIDE-TRACEs recording, newest first; changed only under *WIDE-TRACES-LOCK*.")

(defvar *wide-traces-lock* (sb-thread:make-mutex :name "mcp-agent-helper wide traces"))

;;; ------------------------------------------------------------------------------------------
;;; Threads the agents start (agent-threads.lisp)

(defvar *agent-threads* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "Thread -> the SESSION whose agent started it, until the session ends.")

;;; ------------------------------------------------------------------------------------------
;;; The exit guard (exit-guard.lisp)

(defvar *agent-callbacks* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "The functions AGENT-CALLBACK made.")

(defvar *hook-owners* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "Function (or designator) on a list of *HOOK-VARIABLES* -> whose it is: :PERSON, or for an
agent's, the AGENT-CALLBACK that SBCL calls instead (see CALL-OWNED-HOOKS). The lists themselves
are never changed while the helper is installed, so that the person's code and the agent's see
and remove exactly what they put there.")

(defvar *agent-code-runs* '()
  "One entry for each run of agent code under way in the image (see CALL-CLAIMING-HOOKS):
(lists . exit-allowed), LISTS the values of *HOOK-VARIABLES* when it began. Replaced, never
changed, under *HOOK-LOCK*, so that it is read without the lock while hooks run.")

(defvar *hook-lock* (sb-thread:make-mutex :name "mcp-agent-helper hook owners")
  "Guards *AGENT-CODE-RUNS* and *HOOK-OWNERS* against two changes noted at once (see WITH-HOOK-LOCK).")

;;; ------------------------------------------------------------------------------------------
;;; The threads tool (threads.lisp)

(defvar *thread-numbers* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "Thread -> the number the threads tool shows it by: small, and the same for the thread's life.")

(defvar *thread-number-counter* (list 0)
  "The last thread number given, in a cons for ATOMIC-INCF; kept across reloads of the helper, as
the numbers given are.")

;;; ------------------------------------------------------------------------------------------
;;; The profile tool (profile.lisp)

(defvar *profile-lock* (sb-thread:make-mutex :name "swank-mcp profile")
  "Held by a profile from loading sb-sprof to taking its rows: sb-sprof's samples and sampling are
the image's, so two profiles at once would count each other's samples.")

;;; ------------------------------------------------------------------------------------------
;;; Reading request code (compile.lisp)

(defvar *unchanged-lock* (sb-thread:make-mutex :name "mcp-agent-helper reading request code")
  "Held by a call that reads request code to leave the image unchanged: two at once that read the
same new name would each see it as its own, and the first to finish would unintern the symbol the
other still reads and prints.")

;;; ------------------------------------------------------------------------------------------
;;; run-tests (testing.lisp)

(defvar *test-hooks-lock* (sb-thread:make-mutex :name "mcp-agent-helper test hooks")
  "Guards *TEST-HOOKS-USERS* and the test frameworks' encapsulations: run-tests calls overlap.")

(defvar *test-hooks-users* 0
  "How many run-tests calls need the frameworks' encapsulations now.")

;;; ------------------------------------------------------------------------------------------
;;; Where definitions came from (introspection.lisp)

(defvar *file-compile-dates* (make-hash-table :test 'equal :synchronized t)
  "File name -> the newest write date SBCL recorded for the file with a definition compiled from
it that the helper has looked at (NOTE-COMPILE-DATE): what tells a definition SBCL keeps no date
for (a method, a class) that its file changed since, for as long as the image runs.")

;;; ------------------------------------------------------------------------------------------
;;; The undo journal (undo.lisp)

(defvar *journal* '()
  "The journal's entries, newest first.")

(defvar *journal-lock* (sb-thread:make-mutex :name "mcp-agent-helper journal")
  "Guards *JOURNAL*, *NEXT-JOURNAL-NUMBER* and *CALLS-DEFINITIONS*: any thread may define a function.")

(defvar *next-journal-number* 1
  "The number the next entry gets: entries keep their number for as long as the image runs.")

(defvar *calls-definitions* '()
  "For the latest agent calls that defined anything, newest first: (TOKEN . TABLE), where TABLE
maps each definition the call made to the call's journal entry for it, or to NIL when the call
made it anew and additions were not journaled. A call looks in its own table while it runs, and
only the last *CALLS-REMEMBERED* calls' are kept.")

;;; ------------------------------------------------------------------------------------------
;;; The image's own threads (image-threads.lisp)

(defvar *attached-routes* (make-hash-table :test 'equal :synchronized t)
  "(thread . request id) -> who sent the requests of that id to that thread not yet answered,
oldest first: the agent's connection for an ATTACHED request (its reply goes there), :OTHER for
anyone else's (the person's Emacs numbers its requests as the agent does, so ids meet). Locked
while a request is handed to the thread's mailbox, so that the order here is the thread's.")

(defvar *stop-numbers* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "Condition -> the number of the stop it made: a thread that an action moved on still shows the
stop it leaves while it unwinds, and a request sent to it then would never be read, so the
server waits for a stop of another number.")

(defvar *stop-counter* (list 0)
  "The last stop number given, in a cons for ATOMIC-INCF.")

;;; ------------------------------------------------------------------------------------------
;;; Worker threads (workers.lisp)

(defvar *workers-lock* (sb-thread:make-mutex :name "swank-mcp workers")
  "Guards *WORKERS*: workers start and connections close in different threads.")

(defvar *workers* '()
  "(connection thread server) for every worker thread alive.")

;;; ------------------------------------------------------------------------------------------
;;; Breakpoints (breakpoints.lisp)

(defvar *breakpoints* '()
  "Every breakpoint set, newest first. Changed only under *BREAKPOINTS-LOCK*.")

(defvar *breakpoints-lock* (sb-thread:make-mutex :name "mcp-agent-helper breakpoints")
  "Guards *BREAKPOINTS* and the encapsulations that carry them: two agents may set one on a
function at once.")

(defvar *breakpoint-stops* '()
  "Every thread waiting at a breakpoint now, as BREAKPOINT-STOPs (breakpoints.lisp). Changed only
under *BREAKPOINTS-LOCK*.")

(defvar *condition-watchdog* nil
  "The timer that cuts an agent's condition running past its time limit, while one may run.")

(defvar *breakpoint-counter* (list 0)
  "The last breakpoint number given, in a cons for ATOMIC-INCF.")

(defvar *debugging-functions* (make-hash-table :test 'eq :synchronized t)
  "Server package -> its SERVER-DEBUGGING-FUNCTION, made on the first stop.")
