//! What tells one process of an image from another on the same endpoint (docs/design.md, "The
//! image"), and the note a reply carries when a connection reached another image than the one
//! before: everything defined there is gone.

use crate::swank::Endpoint;

/// What tells one process of an image from another on the same endpoint.
#[derive(Default)]
pub(super) struct ImageIdentity {
    /// The pid the server reported on the last connection (`Some(None)` when it reports none);
    /// `None` before the first connection.
    pid: Option<Option<i64>>,
    /// Set when a connection reached another image than the one before, until the next reply
    /// says so.
    pub(super) changed: Option<String>,
}

impl ImageIdentity {
    /// Records the image a new connection reached: its pid, and whether it already held a helper
    /// (an image restarted in place of the one before holds none, even with the same pid, as in
    /// a container).
    pub(super) fn connected(&mut self, endpoint: &Endpoint, pid: Option<i64>, held_helper: bool) {
        let previous = self.pid.replace(pid);
        let Some(previous) = previous else { return };
        if previous == pid && held_helper {
            return;
        }
        let pids = match (previous, pid) {
            (Some(before), Some(now)) if before != now => format!(" (pid {before} before, {now} now)"),
            (_, Some(now)) => format!(" (pid {now})"),
            _ => String::new(),
        };
        self.changed = Some(format!(
            "[notes]\nThe connection to {endpoint} was remade, and the image there is not the one this server was \
             attached to before{pids}: it was restarted. Everything defined or loaded in the earlier image is gone, \
             and so is this server's session there: its package is CL-USER again, and its @handles and debugger \
             sessions no longer exist."
        ));
    }
}
