//! The helper: the Lisp side of the tools, put into each image once per revision.
//!
//! A connection first asks the image which revision it holds, with a form SBCL evaluates without
//! compiling it (so it answers while another thread holds the world lock). When that is not this
//! revision, it sends the bootstrap (`lisp/bootstrap.lisp`), which loads the helper compiled in
//! the image machine's cache directory, or asks for the source, compiles it there and loads that;
//! where the cache cannot be written it loads the source as it is.
//!
//! See docs/design.md, "The helper in the image, and why it is loaded as it is".
//!
//! An image holds one revision at a time. Every call names the revision its server loaded
//! ([`Helper::call`]); the image runs it only when that is the one it holds, and otherwise answers
//! `:other-helper`: another swank-mcp (an older or newer version attached to the same image)
//! loaded its own since, or the person uninstalled the helper. The call then loads this revision
//! again and is sent once more (`retry_after_reload` in calls.rs); the image replaces another revision only
//! while none of its calls runs, and refuses otherwise, which this server reports with both
//! versions named ([`ImageError::Helper`]).

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use crate::swank::{Connection, Dialect, Form, Sexp, Thread};

use super::error::ImageError;
use super::{Entry, Image};

/// Which way into the helper a server's requests take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// `CALL`: any entry.
    Call,
    /// `LOOK`, for a server that promised `--read-only`: only the entries defined as looks, which
    /// read the image, write no file and run no code of the request; the image refuses any other
    /// (see `LOOK` in `lisp/calls.lisp`), so no tool can change that by asking for more. It holds
    /// the server's roots, the only directories besides the image's ASDF systems' where the image
    /// may read a source file for such a server.
    Look(Arc<[String]>),
}

/// Declares the helper's load manifest, [`HELPER_FILES`], and [`HELPER_SOURCE`], their text in
/// that order.
macro_rules! helper_manifest {
    ($($file:literal,)*) => {
        /// The helper's files in `src/lisp/`, in the order they are loaded: the one place that
        /// states it (package.lisp and docs/design.md point here). A file reads only what the files
        /// before it define while it loads; its functions may call any file's.
        pub const HELPER_FILES: &[&str] = &[$($file),*];

        /// The helper's text: [`HELPER_FILES`] one after another (the digest covers them all).
        /// Public for the replay tests, which recognise it in recorded requests.
        pub const HELPER_SOURCE: &str = concat!($(include_str!(concat!("../lisp/", $file))),*);
    };
}

helper_manifest! {
    "package.lisp",
    "state.lisp",
    "sbcl.lisp",
    "footprint.lisp",
    "servers.lisp",
    "capture.lisp",
    "calls.lisp",
    "conditions.lisp",
    "sessions.lisp",
    "tool-calls.lisp",
    "printing.lisp",
    "names.lisp",
    "handles.lisp",
    "trace.lisp",
    "agent-threads.lisp",
    "exit-guard.lisp",
    "threads.lisp",
    "profile.lisp",
    "evaluate.lisp",
    "debugger.lisp",
    "introspection.lisp",
    "describe-symbol.lisp",
    "apropos-search.lisp",
    "find-definition.lisp",
    "xref.lisp",
    "class-info.lisp",
    "status.lisp",
    "compile.lisp",
    "compile-form.lisp",
    "macroexpand-form.lisp",
    "systems.lisp",
    "testing.lisp",
    "suspects.lisp",
    "undo.lisp",
    "loading.lisp",
    "unload-definition.lisp",
    "system-files.lisp",
    "activity.lisp",
    "approvals.lisp",
    "inspect.lisp",
    "workers.lisp",
    "image-threads.lisp",
    "breakpoints.lisp",
}

/// Sent when the image lacks the helper's current revision; defines `ENSURE-HELPER`. Public for
/// the replay tests, like [`HELPER_SOURCE`].
pub const BOOTSTRAP_SOURCE: &str = include_str!("../lisp/bootstrap.lisp");

/// The helper's package, as the `defpackage` of `lisp/package.lisp` names it (a test in this
/// file holds the two together, and the Emacs package to them). It must not contain "swank":
/// Slynk's reader rewrites such tokens.
pub const HELPER_PACKAGE: &str = "mcp-agent-helper";

/// The name `find-package` and `find-symbol` are given for [`HELPER_PACKAGE`].
fn helper_package_name() -> String {
    HELPER_PACKAGE.to_uppercase()
}

/// The digest of a helper text: it identifies the revision, so that an image holding another one
/// loads this one, and the image's cache keeps a compiled file per revision. Computed once, when
/// the helper is first needed: at some 400 KB the text is past what the compiler evaluates as a
/// constant.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// One revision of the helper: its text, the digest that names it in the image, and the
/// swank-mcp release that sends it, which names it to people.
pub struct Helper {
    source: Cow<'static, str>,
    digest: String,
    release: Cow<'static, str>,
}

static CURRENT: LazyLock<Helper> = LazyLock::new(|| Helper {
    source: Cow::Borrowed(HELPER_SOURCE),
    digest: format!("{:016x}", fnv1a(HELPER_SOURCE.as_bytes())),
    release: Cow::Borrowed(env!("CARGO_PKG_VERSION")),
});

impl Helper {
    /// This swank-mcp's helper.
    pub fn current() -> &'static Helper {
        &CURRENT
    }

    /// The helper another swank-mcp release would send, with its own text: what the tests that
    /// attach two versions to one image load beside [`Helper::current`].
    pub fn other(source: String, release: &str) -> Helper {
        Helper {
            digest: format!("{:016x}", fnv1a(source.as_bytes())),
            source: Cow::Owned(source),
            release: Cow::Owned(release.to_string()),
        }
    }

    /// The digest that names this revision in the image.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The helper's entry `function` called with `args`, when the image holds this revision: the
    /// image answers `:other-helper` when it holds another one (see `CALL` in `lisp/calls.lisp`),
    /// and cannot read the request when it holds none, or one from before `CALL`
    /// ([`HelperAnswer`]). The request names one symbol: swank prints every request into
    /// its event history, and a guard written with `cl:if`, `cl:find-package` and `cl:find-symbol`
    /// cost the image some 25 µs a call in printing alone.
    ///
    /// `gate` is the entry the request goes through: [`Gate::Look`] runs only what looks.
    pub fn call(&self, gate: Gate, function: Entry, args: impl IntoIterator<Item = Form>) -> Form {
        let (door, readable) = match gate {
            Gate::Call => (Entry::CALL, None),
            Gate::Look(roots) => {
                (Entry::LOOK, Some(Form::call("cl", "list", roots.iter().map(|root| Form::string(root.clone())))))
            }
        };
        Form::call(
            HELPER_PACKAGE,
            door.name(),
            [Form::string(self.digest.clone()), Form::string(function.name())].into_iter().chain(readable).chain(args),
        )
    }

    /// The helper's debugger entry `function` called with `args` in a thread that waits in a
    /// server's debugger on its own, when the image holds this revision (see `ATTACHED` in
    /// `lisp/image-threads.lisp`).
    pub fn attached(&self, function: Entry, args: impl IntoIterator<Item = Form>) -> Form {
        Form::call(
            HELPER_PACKAGE,
            Entry::ATTACHED.name(),
            [Form::string(self.digest.clone()), Form::string(function.name())].into_iter().chain(args),
        )
    }

    /// Makes this revision the one the image holds. A connection to an image that has it costs
    /// one small request; the source (some 300 KB) crosses the wire only when neither the image
    /// nor its cache has this revision. Besides saving the transfer, this keeps it out of swank's
    /// event history, which swank dumps to the image's stderr (often the user's *inferior-lisp*
    /// buffer) when a connection breaks.
    ///
    /// Returns whether the image already held a helper (of any revision): one that held none has
    /// had no connection from a swank-mcp since it started (or since the helper was uninstalled).
    pub async fn load(&self, connection: &Connection) -> Result<bool, ImageError> {
        self.load_for(connection, &Gate::Call).await
    }

    /// [`Helper::load`] for a server whose requests take `gate`: through [`Gate::Look`], which
    /// promises that no file is written, the image uses a compiled helper already in its cache
    /// but compiles none into it, and loads the source instead.
    pub async fn load_for(&self, connection: &Connection, gate: &Gate) -> Result<bool, ImageError> {
        let write_cache = matches!(gate, Gate::Call);
        let started = std::time::Instant::now();
        let failed = |detail: String| ImageError::Helper { endpoint: connection.endpoint().clone(), detail };
        let request = |form: Form| async move {
            connection.rex(form, "COMMON-LISP-USER", Thread::New).await.map_err(|e| failed(e.to_string()))
        };
        let version = request(version_question()).await?;
        if version.as_str() == Some(self.digest.as_str()) {
            tracing::debug!(elapsed = ?started.elapsed(), "helper current");
            return Ok(true);
        }
        let held_one = version.as_str().is_some();
        // The bootstrap makes the helper's package, after which the server would scan every symbol.
        let mut state = request(Form::call(
            "cl",
            "progn",
            [load_bootstrap(), Dialect::seen_every_package(), self.ensure(Form::Nil, write_cache)],
        ))
        .await?;
        if state.is_keyword("need-source") {
            state = request(self.ensure(Form::string(self.source.as_ref()), write_cache)).await?;
        }
        tracing::debug!(%state, elapsed = ?started.elapsed(), "helper ready");
        match state {
            Sexp::Keyword(_) if !state.is_keyword("need-source") => Ok(held_one),
            Sexp::List(busy) if busy.first().is_some_and(|head| head.is_keyword("busy")) => {
                Err(failed(self.refusal(&busy[1..])))
            }
            other => Err(failed(format!("the bootstrap answered {other} where it reports how it loaded the helper"))),
        }
    }

    /// Why the image keeps another revision: `(release digest calls)` of the one it holds.
    fn refusal(&self, holder: &[Sexp]) -> String {
        let release = holder.first().and_then(Sexp::as_str);
        let digest = holder.get(1).and_then(Sexp::as_str).unwrap_or("?");
        let calls = holder.get(2).and_then(Sexp::as_i64).unwrap_or(0);
        let theirs = match release {
            Some(release) => format!("swank-mcp {release}"),
            None => "an earlier swank-mcp".to_string(),
        };
        format!(
            "it holds the helper of {theirs} (revision {digest}), loaded by another swank-mcp attached to the \
             image, which is running {calls} call{s} there now; this is swank-mcp {ours} (revision {our_digest}). \
             An image holds one swank-mcp helper at a time, and swank-mcp replaces another version's only \
             between its calls, never under them. Call again once those calls have ended (a call waiting in \
             the debugger ends with the debugger tool's abort), and attach one swank-mcp version to this image \
             (restart the MCP servers of the other version, or upgrade them).",
            s = if calls == 1 { "" } else { "s" },
            ours = self.release,
            our_digest = self.digest,
        )
    }

    /// The bootstrap's `ENSURE-HELPER` for this revision, with the source or nil; found by name,
    /// since the request is read before the bootstrap that defines it is loaded.
    fn ensure(&self, source: Form, write_cache: bool) -> Form {
        Form::call(
            "cl",
            "funcall",
            [
                Form::call("cl", "find-symbol", [Form::string("ENSURE-HELPER"), Form::string(helper_package_name())]),
                Form::string(self.digest.clone()),
                Form::string(self.release.as_ref()),
                source,
                Form::from(write_cache),
            ],
        )
    }
}

/// Makes this swank-mcp's helper the one the image holds (see [`Helper::load`]).
pub(crate) async fn load_helper(connection: &Connection, gate: &Gate) -> Result<bool, ImageError> {
    Helper::current().load_for(connection, gate).await
}

/// Takes the helper out of `image` for `swank-mcp uninstall` (see `UNINSTALL` in
/// `lisp/footprint.lisp`), over a connection of its own that loads nothing: at once, or with
/// `when_sessions_end` once the last session of a swank-mcp attached to it has ended. Returns
/// what was done, in words for the person who asked; an error when nothing could be done.
pub async fn uninstall(image: &Image, when_sessions_end: bool) -> Result<String, ImageError> {
    let endpoint = image.endpoint().clone();
    let failed = |detail: String| ImageError::Helper { endpoint: endpoint.clone(), detail };
    let connection = Connection::connect(endpoint.clone(), &image.settings.connect)
        .await
        .map_err(|e| ImageError::Connect(e.to_string()))?;
    let arguments = [Form::Keyword("when-sessions-end"), if when_sessions_end { Form::T } else { Form::Nil }];
    let request = if_helper_symbol(
        &Entry::UNINSTALL.name().to_uppercase(),
        "fboundp",
        |entry| Form::call("cl", "funcall", [entry].into_iter().chain(arguments)),
        Form::Keyword("no-uninstall"),
        Form::Keyword("not-installed"),
    );
    let reply = connection.rex(request, "COMMON-LISP-USER", Thread::New).await.map_err(|e| failed(e.to_string()))?;
    let count = |key: &str| reply.plist_get(key).and_then(Sexp::as_i64).unwrap_or(0);
    let plural = |n: i64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    match reply.as_list().and_then(<[Sexp]>::first) {
        _ if reply.is_keyword("not-installed") => {
            Ok(format!("The image at {endpoint} holds no swank-mcp helper: there is nothing to uninstall."))
        }
        _ if reply.is_keyword("no-uninstall") => Err(failed(
            "it holds the helper of an earlier swank-mcp, which cannot take itself out; restart the image to be rid \
             of it, or attach this swank-mcp once (which replaces it) and uninstall again"
                .to_string(),
        )),
        Some(head) if head.is_keyword("uninstalled") => {
            let removed: Vec<&str> = reply
                .plist_get("uninstalled")
                .and_then(Sexp::as_list)
                .unwrap_or_default()
                .iter()
                .filter_map(Sexp::as_str)
                .collect();
            Ok(format!(
                "Uninstalled swank-mcp's helper from the image at {endpoint}.\nTook out: {}.\nEnded {} of swank-mcp \
                 servers and {}. The package {} was {}.\nThe modules sb-cltl2 and sb-introspect stay \
                 loaded (a module cannot be unloaded). The next call of a swank-mcp attached to the image installs the \
                 helper again.",
                if removed.is_empty() {
                    "nothing (the footprint was not in the image)".to_string()
                } else {
                    removed.join("; ")
                },
                plural(count("sessions"), "session", "sessions"),
                plural(count("workers"), "worker thread", "worker threads"),
                helper_package_name(),
                reply.plist_str("package").unwrap_or("?"),
            ))
        }
        Some(head) if head.is_keyword("pending") => Ok(format!(
            "The helper in the image at {endpoint} will be uninstalled when the last of the {} attached to it ends.",
            plural(count("pending"), "swank-mcp session", "swank-mcp sessions")
        )),
        Some(head) if head.is_keyword("busy") => Err(failed(format!(
            "{} running in the image, so nothing was changed (uninstalling under a call would pull the helper \
             from under it). Run it again once they have ended, or with --when-sessions-end to uninstall when the \
             last swank-mcp session attached to the image ends.",
            plural(count("busy"), "swank-mcp call is", "swank-mcp calls are")
        ))),
        _ => Err(failed(format!("UNINSTALL answered {reply}, which this swank-mcp does not understand"))),
    }
}

/// `*VERSION*` of the helper's package, or nil, asked with nothing SBCL would compile: a macro
/// such as `ignore-errors` would make it wait for the world lock.
fn version_question() -> Form {
    if_helper_symbol("*VERSION*", "boundp", |symbol| Form::call("cl", "symbol-value", [symbol]), Form::Nil, Form::Nil)
}

/// `(if (find-package "MCP-AGENT-HELPER") (if (TEST symbol) THEN NOT-SO) NO-HELPER)`, where
/// `symbol` is the form that finds `name` in the helper's package and `then` is made from it: a
/// question about the helper that reads in any image, with or without it, and interns nothing.
fn if_helper_symbol(
    name: &str,
    test: &'static str,
    then: impl FnOnce(Form) -> Form,
    not_so: Form,
    no_helper: Form,
) -> Form {
    let symbol = || Form::call("cl", "find-symbol", [Form::string(name), Form::string(helper_package_name())]);
    Form::call(
        "cl",
        "if",
        [
            Form::call("cl", "find-package", [Form::string(helper_package_name())]),
            Form::call("cl", "if", [Form::call("cl", test, [symbol()]), then(symbol()), not_so]),
            no_helper,
        ],
    )
}

/// Loads the bootstrap with the standard readtable (the user's may have been changed by their
/// libraries), and interpreted where SBCL has an interpreter: compiling its functions took some
/// 28 ms of a first call's 100, for code that runs once. Swank has already bound `*package*` to
/// CL-USER, the request's package.
fn load_bootstrap() -> Form {
    let binding = |package: &'static str, symbol: &'static str, value: Form| {
        Form::List(vec![Form::Symbol(package, symbol), value])
    };
    let interpreter = Form::call(
        "cl",
        "or",
        [
            Form::call("cl", "find-package", [Form::string("SB-EVAL")]),
            Form::call("cl", "find-package", [Form::string("SB-INTERPRETER")]),
        ],
    );
    Form::call(
        "cl",
        "let",
        [
            Form::List(vec![
                binding("cl", "*readtable*", Form::call("cl", "copy-readtable", [Form::Nil])),
                binding(
                    "sb-ext",
                    "*evaluator-mode*",
                    Form::call(
                        "cl",
                        "if",
                        [interpreter, Form::Keyword("interpret"), Form::Symbol("sb-ext", "*evaluator-mode*")],
                    ),
                ),
            ]),
            Form::call(
                "cl",
                "load",
                [
                    Form::call("cl", "make-string-input-stream", [Form::string(BOOTSTRAP_SOURCE)]),
                    Form::Keyword("verbose"),
                    Form::Nil,
                    Form::Keyword("print"),
                    Form::Nil,
                ],
            ),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::HELPER_SOURCE;

    /// The helper's files are one compilation unit: a second top-level definition of a name would
    /// silently replace the first file's (both files' tests would then see only the later one).
    #[test]
    fn no_name_is_defined_twice_across_the_helper_files() {
        let mut seen = std::collections::HashSet::new();
        let duplicates: Vec<&str> = HELPER_SOURCE
            .lines()
            .filter_map(|line| {
                let rest = [
                    "(defun ",
                    "(define-entry ",
                    "(defmacro ",
                    "(defvar ",
                    "(defparameter ",
                    "(defgeneric ",
                    "(defclass ",
                ]
                .iter()
                .find_map(|prefix| line.strip_prefix(prefix))?;
                rest.split([' ', ')']).next()
            })
            .filter(|name| !seen.insert(*name))
            .collect();
        assert!(duplicates.is_empty(), "defined twice: {duplicates:?}");
    }
}
