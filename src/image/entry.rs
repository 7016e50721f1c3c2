//! The helper's entries swank-mcp calls, by name: each is a `(define-entry NAME ...)` of
//! `src/lisp/`, and a name the helper lacks fails only when a call reaches the image. So the names
//! are written once, here, and a [`Request`](super::Request) takes an [`Entry`], never a string;
//! a test ties this list to the Lisp's definitions (and the entries only Emacs calls, to
//! `elisp-compat/swank-mcp.el`), so a missing or misspelt entry fails `cargo test`.

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
                #[doc = concat!("`", $name, "`.")]
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
    DEBUGGER_REPORT = "debugger-report",
    DEBUGGER_FRAME = "debugger-frame",
    DEBUGGER_EVAL_IN_FRAME = "debugger-eval-in-frame",
    DEBUGGER_INVOKE_RESTART = "debugger-invoke-restart",
    DEBUGGER_RETURN_FROM_FRAME = "debugger-return-from-frame",
    DEBUGGER_RESTART_FRAME = "debugger-restart-frame",
    DEBUGGER_ABORT = "debugger-abort",
    DEBUGGER_STEP = "debugger-step",
}

#[cfg(test)]
mod tests {
    use super::Entry;
    use std::collections::BTreeSet;
    use std::path::Path;

    /// `source` with its strings, comments and character literals blanked out: what mentions
    /// `(define-entry` in a docstring or a comment defines nothing.
    fn code_only(source: &str) -> String {
        let mut code = String::with_capacity(source.len());
        let mut chars = source.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '"' => {
                    while let Some(c) = chars.next() {
                        match c {
                            '\\' => {
                                chars.next();
                            }
                            '"' => break,
                            _ => {}
                        }
                    }
                    code.push_str("\"\"");
                }
                ';' => {
                    chars.by_ref().take_while(|c| *c != '\n').for_each(|_| ());
                    code.push('\n');
                }
                '#' if chars.peek() == Some(&'|') => {
                    let mut last = ' ';
                    for c in chars.by_ref() {
                        if last == '|' && c == '#' {
                            break;
                        }
                        last = c;
                    }
                }
                '#' if chars.peek() == Some(&'\\') => {
                    chars.next();
                    chars.next();
                    code.push_str("#\\x");
                }
                c => code.push(c),
            }
        }
        code
    }

    /// The names `(define-entry NAME ...)` and `(define-entry (NAME :OPTION VALUE...) ...)` define
    /// in `source`, lowercased as Lisp reads them.
    fn defined_entries(source: &str) -> BTreeSet<String> {
        let code = code_only(source);
        code.match_indices("(define-entry")
            .filter_map(|(at, opener)| {
                let rest = &code[at + opener.len()..];
                // `(define-entry-x` is another operator.
                let rest = rest.strip_prefix(char::is_whitespace)?.trim_start();
                let rest = rest.strip_prefix('(').unwrap_or(rest).trim_start();
                let name: String = rest.chars().take_while(|c| !c.is_whitespace() && !"()".contains(*c)).collect();
                (!name.is_empty()).then(|| name.to_lowercase())
            })
            .collect()
    }

    /// The entries `elisp` asks the image for through `swank-mcp--helper-call`, lowercased.
    fn emacs_calls(elisp: &str) -> BTreeSet<String> {
        let call = "swank-mcp--helper-call \"";
        elisp
            .match_indices(call)
            .filter_map(|(at, _)| {
                let rest = &elisp[at + call.len()..];
                rest.find('"').map(|end| rest[..end].to_lowercase())
            })
            .collect()
    }

    /// The entries the tests call by their qualified name, `(mcp-agent-helper:NAME ...)`.
    fn test_calls(text: &str) -> BTreeSet<String> {
        let prefix = "(mcp-agent-helper:";
        text.match_indices(prefix)
            .map(|(at, _)| {
                let rest = &text[at + prefix.len()..];
                rest.chars()
                    .take_while(|c| !c.is_whitespace() && !"()\"".contains(*c))
                    .collect::<String>()
                    .to_lowercase()
            })
            .collect()
    }

    /// What disagrees between the entries the Lisp defines and those called: the names called
    /// that no `define-entry` defines, and the entries nobody calls (dead, or called by a name
    /// this check cannot see).
    fn disagreements(defined: &BTreeSet<String>, called: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
        (called.difference(defined).cloned().collect(), defined.difference(called).cloned().collect())
    }

    fn read_all(directory: &Path, extension: &str) -> String {
        let mut paths: Vec<_> = std::fs::read_dir(directory)
            .unwrap_or_else(|e| panic!("{} reads: {e}", directory.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == extension))
            .collect();
        paths.sort();
        paths.iter().map(|path| std::fs::read_to_string(path).expect("the file reads")).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn every_entry_called_is_defined_by_the_helper_and_every_entry_is_called() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let defined = defined_entries(&read_all(&root.join("src/lisp"), "lisp"));
        let rust: BTreeSet<String> = Entry::ALL.iter().map(|entry| entry.name().to_string()).collect();
        assert_eq!(rust.len(), Entry::ALL.len(), "Entry::ALL names an entry twice");
        let emacs = emacs_calls(&read_all(&root.join("elisp-compat"), "el"));
        let tests = test_calls(&read_all(&root.join("tests"), "rs"));
        let (missing, _) = disagreements(&defined, &rust);
        assert!(missing.is_empty(), "Entry names entries no (define-entry ...) in src/lisp defines: {missing:?}");
        let (missing, _) = disagreements(&defined, &emacs);
        assert!(missing.is_empty(), "swank-mcp.el calls entries no (define-entry ...) defines: {missing:?}");
        let called = rust.iter().chain(&emacs).chain(&tests).cloned().collect();
        let (_, uncalled) = disagreements(&defined, &called);
        assert!(
            uncalled.is_empty(),
            "entries neither swank-mcp (Entry in src/image/entry.rs), Emacs (swank-mcp--helper-call) nor a test \
             calls: {uncalled:?}; declare the Rust caller's Entry, or make it a plain defun"
        );
    }

    #[test]
    fn the_check_finds_an_entry_called_but_not_defined_and_one_defined_but_not_called() {
        let lisp = "(define-entry evaluate (code &key package)\n  \"Not (define-entry fake ...), \\\"a (define-entry quoted)\\\".\"\n\
                    (run code #\\\" #\\;))\n\
                    ;; (define-entry commented-out ())\n\
                    #| (define-entry in-a-block-comment ()) |#\n\
                    (define-entry (describe-symbol :look t :caller :emacs) (name))\n\
                    (define-entry-helper not-an-entry ())\n\
                    (define-entry\n    (Status :look t)\n  ())\n\
                    (define-entry unused ())\n";
        let defined = defined_entries(lisp);
        let expected: BTreeSet<String> = ["describe-symbol", "evaluate", "status", "unused"].map(String::from).into();
        assert_eq!(defined, expected);
        let called: BTreeSet<String> =
            ["evaluate", "describe-symbol", "status", "load-system"].map(String::from).into();
        let (missing, uncalled) = disagreements(&defined, &called);
        assert_eq!(missing, ["load-system"]);
        assert_eq!(uncalled, ["unused"]);
        assert_eq!(
            emacs_calls("(swank-mcp--helper-call \"ACTIVITY-REPLY\" id) (swank-mcp--helper-call function)"),
            ["activity-reply".to_string()].into()
        );
        assert_eq!(test_calls("eval(\"(mcp-agent-helper:handle-count {s:?})\")"), ["handle-count".to_string()].into());
    }
}
