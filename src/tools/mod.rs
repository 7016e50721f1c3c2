//! The tools layer: one module per tool. Each builds its request, runs it (in the attached image or,
//! for source-file tools, in this process) and formats the reply as its contract says.

pub mod arguments;
pub mod output;

pub use arguments::{ArgumentError, Arguments};
pub use output::{Annotations, ToolDefinition, ToolOutput};
