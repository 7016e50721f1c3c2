//! The instructions the server gives every agent session as it starts (MCP's `instructions`): how
//! the tools fit together and what their arguments and replies have in common. They name tools,
//! so they are the tools' to say; the MCP layer only hands them over.
//!
//! See docs/design.md, "The toolbox".

use super::Toolbox;

/// What every agent session reads once: how the tools fit together, and what the replies have in
/// common, so that no tool's description repeats it.
const INSTRUCTIONS: &str = "\
swank-mcp attaches you to a live Common Lisp (SBCL) image through swank/slynk, usually the one the user works in \
from Emacs: what you define there is theirs too, so look before you redefine.
To fix failing tests, loop: run-tests gives each failing test's form, expected and actual values; find-definition \
with source: true gives the current text of the definitions involved (several symbols in one call); edit-lisp-form \
with operation \"patch\" (old_text, new_text) and load: true fixes the file and the image at once (edits: [...] makes \
several edits, all or none); then run-tests again.
The tools:
1. Find your way: lisp-outline lists a file's forms; find-definition, describe-symbol, apropos-search, xref and \
class-info ask the image, changing nothing; find-definition with text greps a system's files for the forms holding it.
2. Change code in its file: edit-lisp-form with load: true edits the file and compiles the change into the image, \
so the image runs what the file says and find-definition points at it. load-form and load-file compile what a file \
already says, load-system an ASDF system. compile-form checks code without defining anything; macroexpand-form \
shows what a macro makes.
3. Run it: evaluate-lisp in your own REPL session (its package and *, ** persist; the user's REPL is untouched), \
run-tests for tests.
4. Debug: an error comes back with its backtrace and restarts, unwound; run it again with debug: true to keep the \
failing state for the debugger tool, which also attaches to any thread waiting in a debugger (the user's SLDB too): \
fix the function, then restart_frame. trace, profile, threads and inspect look closer.
5. undo lists what your calls defined or replaced, and puts back what was there.
Arguments: file_path is absolute or relative to the first --root; files are read under allowed roots or an ASDF \
system's directory, written only under allowed roots; large_file: true reads one over 64 MiB. A definition in a \
file is its form_type (e.g. defun) and form_name as lisp-outline shows it (e.g. \"area :around (shape)\"); index, \
from 1, picks among several. A symbol is name, pkg:name or pkg::name; package defaults to your session's \
(initially CL-USER). timeout_ms defaults to --eval-timeout; offset and limit page through a long list; source: \
true adds each form's text. With several images, image picks one (default: the first).
Replies: evaluate-lisp's has [stdout], [stderr], [warnings] and => value lines; an error, [ERROR] TYPE, message, \
backtrace and restarts. Compiler messages come at file:line:column. A value other than a number, character or \
symbol has a handle (@3) for inspect; a note under a cut section names the handle and offset where inspect reads \
the rest. Threads you start report output and errors in a [background] section of your next evaluate-lisp reply; \
traced calls, in a [trace] section. Interactive input reads end of file. An exit (sb-ext:exit, uiop:quit) is \
refused in an image swank-mcp did not start.";

impl Toolbox {
    /// What every agent session is told once, before its first call.
    pub fn instructions(&self) -> &'static str {
        INSTRUCTIONS
    }
}
