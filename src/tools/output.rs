//! What a tool hands back to its caller, and how it describes itself: its name, description,
//! arguments and hints, which the MCP layer writes into `tools/list`.
//!
//! See docs/design.md, "The toolbox".

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::arguments::{input_schema, Param};

/// How a tool describes itself to its callers (in MCP's `tools/list`).
#[derive(Debug, Clone)]
pub struct ToolDefinition {
    /// The name clients call it by, e.g. `evaluate-lisp`.
    pub name: &'static str,
    /// What the model reads to decide when and how to use the tool.
    pub description: &'static str,
    /// Its arguments: the one declaration that gives both the schema and the checks.
    pub arguments: &'static [Param],
    /// True when the tool changes neither the image nor any file, and takes no Lisp code: the tools
    /// `--read-only` offers, and MCP's `readOnlyHint`. A tool that takes code is never read-only
    /// (a test holds every tool to it), since SBCL's compiler and macroexpander can run code of the
    /// request itself.
    pub read_only: bool,
}

impl ToolDefinition {
    /// JSON Schema of the `arguments` object, without the `image` argument.
    pub fn input_schema(&self) -> Value {
        input_schema(self.arguments, &[])
    }
}

/// A finished tool call: the contract's text, whether it is an error the model should react to,
/// and optionally the same facts as structured data.
#[derive(Debug, Clone)]
pub struct ToolOutput {
    /// What the model reads: the reply as the tool's contract writes it.
    pub text: String,
    /// True when the call failed in a way the model should react to (`isError` in MCP).
    pub is_error: bool,
    /// Already serialised: a tool writes its facts straight from its own types, and the response
    /// carries the text as it is, with no `serde_json::Value` built, copied and dropped between.
    pub structured: Option<Box<RawValue>>,
}

impl ToolOutput {
    /// A result whose error flag the caller has computed.
    pub fn new(text: impl Into<String>, is_error: bool) -> Self {
        Self { text: text.into(), is_error, structured: None }
    }

    pub(crate) fn success(text: impl Into<String>) -> Self {
        Self { text: text.into(), is_error: false, structured: None }
    }

    pub(crate) fn error(text: impl Into<String>) -> Self {
        Self { text: text.into(), is_error: true, structured: None }
    }

    pub(crate) fn with_structured(mut self, structured: impl Serialize) -> Self {
        // Serialising plain data (string keys, finite numbers) cannot fail.
        self.structured = serde_json::value::to_raw_value(&structured).ok();
        self
    }

    /// The structured content as a JSON value, for callers that look inside it.
    pub fn structured_value(&self) -> Option<Value> {
        self.structured.as_ref().and_then(|raw| serde_json::from_str(raw.get()).ok())
    }
}

/// A tool call that failed, as the model reads it: the text of a result with `isError: true`.
/// Tools return `Result<ToolOutput, ToolError>`, so that `?` carries a bad argument, a lost image
/// or a failure the helper reports out of the tool with its text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    pub(crate) fn new(text: impl Into<String>) -> Self {
        ToolError(text.into())
    }
}

impl From<ToolError> for ToolOutput {
    fn from(error: ToolError) -> Self {
        ToolOutput::error(error.0)
    }
}

impl From<super::arguments::ArgumentError> for ToolError {
    fn from(error: super::arguments::ArgumentError) -> Self {
        ToolError(error.0)
    }
}

impl From<crate::source::PathError> for ToolError {
    fn from(error: crate::source::PathError) -> Self {
        ToolError(error.to_string())
    }
}

impl From<crate::source::EditError> for ToolError {
    fn from(error: crate::source::EditError) -> Self {
        ToolError(error.to_string())
    }
}

impl From<crate::image::CallError> for ToolError {
    fn from(error: crate::image::CallError) -> Self {
        ToolError(error.to_string())
    }
}
