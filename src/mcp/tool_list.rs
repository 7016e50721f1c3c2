//! `tools/list`: the offered tools as MCP describes a tool. The tools say what they are (name,
//! description, arguments, what they do to the world); this writes it in the protocol's shape.
//!
//! See docs/design.md, "The toolbox".

use serde_json::{json, Value};

use crate::tools::{ToolDefinition, Toolbox};

/// The `tools/list` entries of the tools `toolbox` offers.
pub fn tool_list(toolbox: &Toolbox) -> Vec<Value> {
    toolbox.offered_schemas().map(|(definition, schema)| entry(definition, schema)).collect()
}

/// The `tools/list` entry of the tool `definition` describes, whose arguments `input_schema`
/// describes. Its one annotation is `readOnlyHint`, for a read-only tool: the other hints would
/// each tell a client a tool is safer than the specification's default assumes (not destructive,
/// idempotent, closed world), which is no use to the agent reading the list in every session, and
/// a client that goes without them errs on the safe side.
///
/// No `outputSchema`: every agent session carries this list in its context, and the schemas of the
/// structured results would more than double it; docs/tools.md describes them. No `title` either:
/// it is for a client's display, which shows the name without one, and the titles were 600 bytes
/// of that list.
pub fn entry(definition: &ToolDefinition, input_schema: Value) -> Value {
    let mut tool = json!({
        "name": definition.name,
        "description": definition.description,
        "inputSchema": input_schema,
    });
    if definition.read_only {
        tool["annotations"] = json!({"readOnlyHint": true});
    }
    tool
}
