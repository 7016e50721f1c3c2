//! What the MCP revisions served define that the handshake's requests and the stateless ones
//! (`stateless.rs`) share: the revisions, the error of a request, the server's own description.
//! It uses no other file of the layer.
//!
//! See docs/design.md, "Layers".

use serde_json::{json, Value};

/// The revisions of the `initialize` handshake, newest first; an unknown requested version is
/// answered with the newest. Revision 2026-07-28 is served beside them (`stateless.rs`).
pub const SUPPORTED_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// JSON-RPC 2.0's code for a request whose parameters are wrong.
pub(super) const INVALID_PARAMS: i64 = -32602;

/// A request's JSON-RPC error.
pub(super) struct Failure {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl Failure {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Failure { code, message: message.into(), data: None }
    }
}

/// The server's name and version, as every revision gives them.
pub(super) fn server_info() -> Value {
    json!({ "name": "swank-mcp", "title": "swank-mcp", "version": env!("CARGO_PKG_VERSION") })
}
