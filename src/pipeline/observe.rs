//! What watches calls without taking part in them (docs/design.md, "One call"): the image's
//! activity record that the user's Emacs shows, and the audit log. An observer is told when a
//! call starts, when an approved call starts running, and how it ended with the text its caller
//! received; it never changes a call, and a call never waits for what an observer sends on (the
//! activity record's notes reach the image from a task of their own).

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::image::Image;

/// A call as it starts.
pub struct CallStart<'a> {
    /// Its id, unique among the calls of the servers attached to its image (the image's record
    /// and the tokens of the call's evaluations there carry it).
    pub id: &'a str,
    /// The tool called, which may not exist.
    pub tool: &'a str,
    /// Its arguments, as the caller sent them.
    pub arguments: &'a Option<Value>,
    /// Who called (see [`super::Caller`]).
    pub client: &'a str,
    /// The image it works in, if it names one that exists (or the default).
    pub image: Option<&'a Arc<Image>>,
    /// It waits for the human's approval before it runs.
    pub waiting: bool,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It ran and succeeded.
    Done,
    /// It ran, or was refused before running (a bad argument), with an error.
    Failed,
    /// The human declined it.
    Declined,
    /// Nobody answered its approval request in time.
    TimedOut,
    /// It was not run for want of approval: nobody could be asked, asking failed, or it could not
    /// be shown (an edit that cannot be made).
    Refused,
    /// The caller cancelled it.
    Cancelled,
    /// It was not run yet: its caller asks the human itself and calls it again with the answer
    /// (MCP 2026-07-28's `input_required` round).
    Deferred,
    /// There is no such tool.
    UnknownTool,
}

/// Watches calls.
pub trait Observer: Send + Sync {
    /// A call starts; what the observer keeps of it goes with the call until it ends.
    fn begin(&self, call: &CallStart<'_>) -> Box<dyn Observation>;

    /// Returns once what this observer was told has gone where it goes, for a one-shot command
    /// that exits next.
    fn finish(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}

/// One call, as one observer follows it.
pub trait Observation: Send {
    /// The human approved it: it runs now.
    fn running(&mut self) {}

    /// It ended so, and its caller received `text` (nothing, when it was cancelled).
    fn end(self: Box<Self>, ending: Ending, text: &str);
}
