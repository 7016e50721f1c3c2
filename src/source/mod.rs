//! Source files as a lossless concrete syntax tree, and the structural edits built on it.
//!
//! Everything here runs in the server process on the file's bytes; no Lisp image is involved.

mod cst;
mod lexer;

pub use cst::{Cst, Leaves, Location, NodeId, NodeKind, Opener, ParseError, Prefix};
