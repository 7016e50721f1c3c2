//! The helper's entries swank-mcp calls, by name: each is a `(define-entry NAME ...)` of
//! `src/lisp/`, and a name the helper lacks fails only when a call reaches the image. So the names
//! are written once, here, and a [`Request`](super::Request) takes an [`Entry`], never a string;
//! `tests/helper_source.rs` ties this list to the Lisp's definitions (and the entries only Emacs
//! calls, to the Emacs package's files `elisp-compat/swank-mcp*.el`), so a missing or misspelt entry fails `cargo test`.

/// An entry of the helper, an exported function of package `MCP-AGENT-HELPER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry(&'static str);

impl Entry {
    /// Its name, as the helper's source writes it.
    pub const fn name(self) -> &'static str {
        self.0
    }
}

/// Declares each entry as an associated constant of [`Entry`], and [`Entry::ALL`].
macro_rules! entries {
    ($($(#[$doc:meta])* $constant:ident = $name:literal,)*) => {
        impl Entry {
            $(
                #[doc = concat!("The helper's `", $name, "`: its `(define-entry ", $name, " ...)` in `src/lisp/` says what it does.")]
                $(#[$doc])*
                pub const $constant: Entry = Entry($name);
            )*

            /// Every entry swank-mcp calls.
            pub const ALL: &'static [Entry] = &[$(Entry::$constant),*];
        }
    };
}

entries! {
    /// The door of every request a server makes, for a helper of one revision.
    CALL = "call",
    /// The door of a `--read-only` server's requests: runs only the entries that look.
    LOOK = "look",
    /// The door of a request run in a thread waiting in a server's debugger of its own.
    ATTACHED = "attached",
    CANCEL = "cancel",
    STUCK_REPORT = "stuck-report",
    START_WORKER = "start-worker",
    END_SESSION = "end-session",
    UNINSTALL = "uninstall",
    NOTE_ACTIVITIES = "note-activities",
    REQUEST_APPROVAL = "request-approval",
    SETTLE_APPROVAL = "settle-approval",
    ALLOW_FOR_SESSION = "allow-for-session",
    SESSION_ALLOWED_P = "session-allowed-p",
    EVALUATE = "evaluate",
    INSPECT_VALUE = "inspect-value",
    COMPILE_CODE = "compile-code",
    EXPAND_FORM = "expand-form",
    CLASS_INFO = "class-info",
    DESCRIBE_SYMBOL = "describe-symbol",
    APROPOS_SEARCH = "apropos-search",
    FIND_DEFINITION = "find-definition",
    XREF = "xref",
    STATUS = "status",
    LOAD_SYSTEM = "load-system",
    LOAD_ACTIVITY = "load-activity",
    SYSTEM_DIRECTORIES = "system-directories",
    SYSTEM_FILES = "system-files",
    RUN_TESTS = "run-tests",
    TEST_ACTIVITY = "test-activity",
    TEST_RELOAD_PLAN = "test-reload-plan",
    TRACE_FUNCTIONS = "trace-functions",
    PROFILE_CODE = "profile-code",
    THREADS = "threads",
    LOAD_SOURCE = "load-source",
    LOAD_SOURCE_FILE = "load-source-file",
    UNLOAD_DEFINITION = "unload-definition",
    UNDO_JOURNAL = "undo-journal",
    SET_BREAKPOINT = "set-breakpoint",
    LIST_BREAKPOINTS = "list-breakpoints",
    REMOVE_BREAKPOINT = "remove-breakpoint",
    RECOMPILE_FOR_STEPPING = "recompile-for-stepping",
    ATTACH_THREAD = "attach-thread",
    AWAIT_THREAD_STOP = "await-thread-stop",
    WAITING_STOPS = "waiting-stops",
    DEBUGGER_REPORT = "debugger-report",
    DEBUGGER_FRAME = "debugger-frame",
    DEBUGGER_EVAL_IN_FRAME = "debugger-eval-in-frame",
    DEBUGGER_INVOKE_RESTART = "debugger-invoke-restart",
    DEBUGGER_RETURN_FROM_FRAME = "debugger-return-from-frame",
    DEBUGGER_RESTART_FRAME = "debugger-restart-frame",
    DEBUGGER_ABORT = "debugger-abort",
    DEBUGGER_STEP = "debugger-step",
}
