//! swank-mcp: an MCP stdio server on one side, a Swank/Slynk client on the other.

pub mod source;
pub mod tools;
