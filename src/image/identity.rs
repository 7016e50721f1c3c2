//! What tells one process of an image from another on the same endpoint (docs/design.md, "The
//! image"), and the note a reply carries when a connection was remade: to another image than the
//! one before, where everything defined is gone, or to the same one, where this server's session
//! starts afresh.

use crate::swank::Endpoint;

/// What tells one process of an image from another on the same endpoint.
#[derive(Default)]
pub(super) struct ImageIdentity {
    /// The pid the server reported on the last connection (`Some(None)` when it reports none);
    /// `None` before the first connection.
    pid: Option<Option<i64>>,
    /// Set when a connection was remade, until the next reply says so.
    pub(super) changed: Option<String>,
}

/// What a new connection reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reached {
    /// The image, for the first time.
    First,
    /// The image the connection before it reached: the image ends a session whose connection
    /// closed, so this server's session there must start afresh.
    Same,
    /// Another image in its place (restarted).
    Other,
}

impl ImageIdentity {
    /// Records the image a new connection reached: its pid, and whether it already held a helper
    /// (an image restarted in place of the one before holds none, even with the same pid, as in
    /// a container).
    pub(super) fn connected(&mut self, endpoint: &Endpoint, pid: Option<i64>, held_helper: bool) -> Reached {
        let previous = self.pid.replace(pid);
        let Some(previous) = previous else { return Reached::First };
        if previous == pid && held_helper {
            self.changed = Some(format!(
                "[notes]\nThe connection to {endpoint} was lost and remade, so this server's session in the image \
                 starts afresh: its package is CL-USER again, and its @handles, REPL values (*, **), traces and \
                 debugger sessions are gone. What was defined or loaded in the image is still there."
            ));
            return Reached::Same;
        }
        if previous == pid {
            // The same pid, and no helper: restarted in place (a container's pid 1), or the helper
            // was uninstalled, which closes the swank-mcp servers' connections. Nothing here tells
            // the two apart, so the note says both.
            self.changed = Some(format!(
                "[notes]\nThe connection to {endpoint} was remade, and the image there{} holds no swank-mcp helper \
                 any more: its helper was uninstalled (swank-mcp uninstall), or it was restarted in place. This \
                 server's session there starts afresh: its package is CL-USER again, and its @handles and debugger \
                 sessions no longer exist; if it was restarted, everything defined or loaded in it before is gone.",
                pid.map(|pid| format!(" (the same pid, {pid})")).unwrap_or_default()
            ));
            return Reached::Other;
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
        Reached::Other
    }
}
