//! The MCP layer: newline-delimited JSON-RPC 2.0 on stdio, the handshake's lifecycle and the
//! stateless requests of revision 2026-07-28, `tools/list`, `tools/call` and cancellation. It names no tool: a call goes to the [`crate::pipeline`], which
//! knows tools only through [`crate::tools::Toolbox`], and the instructions and the tools'
//! descriptions come from there.
//!
//! See docs/design.md, "Layers".

pub mod audit;
pub mod client_requests;
pub mod elicitation;
pub mod message;
mod protocol;
mod rounds;
pub mod server;
mod stateless;
pub mod stdio;
pub mod tool_list;
pub mod transport;

pub use server::{serve, ServeOptions};
