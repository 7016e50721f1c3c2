//! The helper: the Lisp side of the tools, put into each image once per revision.
//!
//! A connection first asks the image which revision it holds, with a form SBCL evaluates without
//! compiling it (so it answers while another thread holds the world lock). When that is not this
//! revision, it sends the bootstrap (`lisp/bootstrap.lisp`), which loads the helper compiled in
//! the image machine's cache directory, or asks for the source, compiles it there and loads that;
//! where the cache cannot be written it loads the source as it is.
//!
//! See docs/design.md, "The helper in the image, and why it is loaded as it is".

use crate::swank::{Connection, Dialect, Form, Sexp, Thread};

use super::ImageError;

/// The helper's files in load order (the digest covers them all). Public for the replay tests,
/// which recognise it in recorded requests.
pub const HELPER_SOURCE: &str = concat!(
    include_str!("../lisp/package.lisp"),
    include_str!("../lisp/capture.lisp"),
    include_str!("../lisp/calls.lisp"),
    include_str!("../lisp/conditions.lisp"),
    include_str!("../lisp/sessions.lisp"),
    include_str!("../lisp/tool-calls.lisp"),
    include_str!("../lisp/printing.lisp"),
    include_str!("../lisp/names.lisp"),
    include_str!("../lisp/handles.lisp"),
    include_str!("../lisp/observe.lisp"),
    include_str!("../lisp/evaluate.lisp"),
    include_str!("../lisp/debugger.lisp"),
    include_str!("../lisp/introspection.lisp"),
    include_str!("../lisp/compile.lisp"),
    include_str!("../lisp/systems.lisp"),
    include_str!("../lisp/testing.lisp"),
    include_str!("../lisp/undo.lisp"),
    include_str!("../lisp/loading.lisp"),
    include_str!("../lisp/activity.lisp"),
    include_str!("../lisp/inspect.lisp"),
    include_str!("../lisp/workers.lisp"),
);

/// Sent when the image lacks the helper's current revision; defines `ENSURE-HELPER`. Public for
/// the replay tests, like [`HELPER_SOURCE`].
pub const BOOTSTRAP_SOURCE: &str = include_str!("../lisp/bootstrap.lisp");

/// The helper's package. It must not contain "swank": Slynk's reader rewrites such tokens.
pub const HELPER_PACKAGE: &str = "mcp-agent-helper";

/// Identifies this revision of the helper text: an image holding another one loads this one, and
/// the image's cache keeps a compiled file per revision.
const HELPER_DIGEST: u64 = fnv1a(HELPER_SOURCE.as_bytes());

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// Makes the helper's current revision the one the image holds. A connection to an image that
/// has it costs one small request; the source (some 300 KB) crosses the wire only when neither the
/// image nor its cache has this revision. Besides saving the transfer, this keeps it out of
/// swank's event history, which swank dumps to the image's stderr (often the user's
/// *inferior-lisp* buffer) when a connection breaks.
///
/// Returns whether the image already held a helper (of any revision): one that held none has
/// had no connection from a swank-mcp since it started.
pub(crate) async fn load_helper(connection: &Connection) -> Result<bool, ImageError> {
    let digest = format!("{HELPER_DIGEST:016x}");
    let started = std::time::Instant::now();
    let request = |form: Form| async move {
        connection
            .rex(form, "COMMON-LISP-USER", Thread::New)
            .await
            .map_err(|e| ImageError::Helper { endpoint: connection.endpoint().clone(), detail: e.to_string() })
    };
    let version = request(version_question()).await?;
    if version.as_str() == Some(digest.as_str()) {
        tracing::debug!(elapsed = ?started.elapsed(), "helper current");
        return Ok(true);
    }
    let held_one = version.as_str().is_some();
    // The bootstrap makes the helper's package, after which the server would scan every symbol.
    let mut state = request(Form::call(
        "cl",
        "progn",
        [load_bootstrap(), Dialect::seen_every_package(), ensure_helper(&digest, Form::Nil)],
    ))
    .await?;
    if state.is_keyword("need-source") {
        state = request(ensure_helper(&digest, Form::string(HELPER_SOURCE))).await?;
    }
    tracing::debug!(%state, elapsed = ?started.elapsed(), "helper ready");
    match state {
        Sexp::Keyword(_) if !state.is_keyword("need-source") => Ok(held_one),
        other => Err(ImageError::Helper {
            endpoint: connection.endpoint().clone(),
            detail: format!("the bootstrap answered {other} where it reports how it loaded the helper"),
        }),
    }
}

/// `*VERSION*` of the helper's package, or nil, asked with nothing SBCL would compile: a macro
/// such as `ignore-errors` would make it wait for the world lock.
fn version_question() -> Form {
    let version_symbol =
        || Form::call("cl", "find-symbol", [Form::string("*VERSION*"), Form::string("MCP-AGENT-HELPER")]);
    Form::call(
        "cl",
        "if",
        [
            Form::call("cl", "find-package", [Form::string("MCP-AGENT-HELPER")]),
            Form::call(
                "cl",
                "if",
                [
                    Form::call("cl", "boundp", [version_symbol()]),
                    Form::call("cl", "symbol-value", [version_symbol()]),
                    Form::Nil,
                ],
            ),
            Form::Nil,
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

/// The bootstrap's `ENSURE-HELPER` for this revision, with the source or nil; found by name, since
/// the request is read before the bootstrap that defines it is loaded.
fn ensure_helper(digest: &str, source: Form) -> Form {
    Form::call(
        "cl",
        "funcall",
        [
            Form::call("cl", "find-symbol", [Form::string("ENSURE-HELPER"), Form::string("MCP-AGENT-HELPER")]),
            Form::string(digest),
            source,
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
                let rest = ["(defun ", "(defmacro ", "(defvar ", "(defparameter ", "(defgeneric ", "(defclass "]
                    .iter()
                    .find_map(|prefix| line.strip_prefix(prefix))?;
                rest.split([' ', ')']).next()
            })
            .filter(|name| !seen.insert(*name))
            .collect();
        assert!(duplicates.is_empty(), "defined twice: {duplicates:?}");
    }
}
