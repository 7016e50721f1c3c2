//! A Swank (SLIME) and Slynk (SLY) client. It knows nothing of MCP: it reads and prints the wire
//! s-expressions, frames them, and runs one connection as an actor that matches replies to
//! requests and answers every server event.
//!
//! See docs/design.md, "The swank client".

pub mod codec;
pub mod connection;
pub mod decode;
pub mod dialect;
pub mod reader;
pub mod sexp;

pub use connection::{
    ConnectError, ConnectOptions, Connection, DebuggableRex, DebuggerReport, Endpoint, RexError, RexEvent, Thread,
};
pub use decode::{from_sexp, DecodeError};
pub use dialect::{Dialect, Protocol, ServerInfo};
pub use reader::{read, ReadError};
pub use sexp::{Form, Sexp};
