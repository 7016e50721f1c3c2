//! swank-mcp: an MCP stdio server on one side, a Swank/Slynk client on the other.
//!
//! Layers, each knowing little of the others: [`swank`] (the client, no MCP), [`tools`] (one
//! module per tool, run in the image or on source files), [`mcp`] (JSON-RPC over stdio) and
//! [`source`] (a lossless CST of Lisp source for the file-editing tools; needs no image).
//! [`outbox`] is the writing half both the swank client and the MCP server use.

#![warn(missing_docs)]

pub mod emacs;
pub mod image;
pub mod mcp;
pub mod outbox;
pub mod pipeline;
pub mod source;
pub mod swank;
pub mod tools;
