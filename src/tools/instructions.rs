//! The instructions the server gives every agent session as it starts (MCP's `instructions`): how
//! the tools fit together and what their arguments and replies have in common. They name tools,
//! so they are the tools' to say; the MCP layer only hands them over.
//!
//! See docs/design.md, "The toolbox".

use super::Toolbox;

/// What every agent session reads once: how the tools fit together, and what the replies have in
/// common, so that no tool's description repeats it.
const INSTRUCTIONS: &str = "\
swank-mcp attaches you to a live SBCL image, often the user's own in Emacs: look before you redefine.
To fix failing tests: run-tests; find-definition with source: true; edit-lisp-form with operation \"patch\" and \
load: true (file and image at once); then run-tests again. An error comes back unwound; debug: true keeps it for \
the debugger.
Arguments of no type are strings. file_path is absolute or relative to the first --root. A symbol is name, \
pkg:name or pkg::name; package defaults to your session's. form_type and form_name as lisp-outline shows them; \
index, from 1, picks among several.
A value has a handle (@3) for inspect. Output of your threads and traced calls comes with your next evaluate-lisp \
reply.";

impl Toolbox {
    /// What every agent session is told once, before its first call.
    pub fn instructions(&self) -> &'static str {
        INSTRUCTIONS
    }
}
