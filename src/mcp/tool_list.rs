//! `tools/list`: the offered tools as MCP describes a tool. The tools say what they are (name,
//! description, arguments, what they do to the world); this writes it in the protocol's shape.
//!
//! See docs/design.md, "The toolbox".

use serde_json::{json, Map, Value};

use crate::tools::{ToolDefinition, Toolbox};

/// The `tools/list` entries of the tools `toolbox` offers.
pub fn tool_list(toolbox: &Toolbox) -> Vec<Value> {
    toolbox.offered_schemas().map(|(definition, schema)| entry(definition, schema)).collect()
}

/// The `tools/list` entry of the tool `definition` describes, whose arguments `input_schema`
/// describes. A hint is left out where it says what the specification's default says (not
/// read-only, destructive, not idempotent, open world), and so are the destructive and idempotent
/// hints of a read-only tool, which the specification gives a meaning only when it is not
/// read-only; no hint left, no `annotations`.
///
/// No `outputSchema`: every agent session carries this list in its context, and the schemas of the
/// structured results would more than double it; docs/tools.md describes them. No `title` either:
/// it is for a client's display, which shows the name without one, and the titles were 600 bytes
/// of that list.
pub fn entry(definition: &ToolDefinition, input_schema: Value) -> Value {
    let hints = &definition.annotations;
    let mut annotations = Map::new();
    for (hint, value, default) in [
        ("readOnlyHint", hints.read_only, false),
        ("destructiveHint", hints.destructive, true),
        ("idempotentHint", hints.idempotent, false),
        ("openWorldHint", hints.open_world, true),
    ] {
        let meaningless = hints.read_only && matches!(hint, "destructiveHint" | "idempotentHint");
        if value != default && !meaningless {
            annotations.insert(hint.into(), value.into());
        }
    }
    let mut tool = json!({
        "name": definition.name,
        "description": definition.description,
        "inputSchema": input_schema,
    });
    if !annotations.is_empty() {
        tool["annotations"] = annotations.into();
    }
    tool
}
