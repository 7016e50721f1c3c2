//! swank-mcp: an MCP stdio server on one side, a Swank/Slynk client on the other.
//!
//! Layers, each knowing only those after it (docs/design.md, "Layers", which tests/layers.rs holds
//! the code to): the front ends [`mcp`] (JSON-RPC over stdio) and [`emacs`] (what the user's Emacs
//! is offered through the image), which know nothing of each other; [`pipeline`] (one call: check
//! the arguments, approve, observe, run); [`tools`] (one module per tool, run in the image or on
//! source files); [`image`] (the images: connections, calls, the helper); and [`swank`] (the
//! client, no MCP) beside [`source`] (a lossless CST of Lisp source for the file-editing tools; it
//! needs no image). [`outbox`] is the writing half both the swank client and the MCP server use.
//! `main.rs` alone wires them together.

#![warn(missing_docs)]

pub mod emacs;
pub mod image;
pub mod mcp;
pub mod outbox;
pub mod pipeline;
pub mod source;
pub mod swank;
mod sync;
pub mod tools;
