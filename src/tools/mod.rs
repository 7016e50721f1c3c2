//! The tools layer: one module per tool. Each builds its request, runs it (in the attached image or,
//! for source-file tools, in this process) and formats the reply as its contract says.

pub mod arguments;
pub mod edit_lisp_form;
pub mod lisp_check_parens;
pub mod lisp_outline;
pub mod output;

pub use arguments::{ArgumentError, Arguments};
pub use output::{Annotations, ToolDefinition, ToolOutput};
