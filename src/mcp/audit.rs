//! `--audit-log FILE`: one JSON line per tool call (time, client, tool, arguments, outcome,
//! duration), written and flushed when the call ends, so that `tail -f FILE | jq` follows the
//! agent. When the file would pass its size limit it is renamed to `FILE.1` (replacing the
//! previous one) and a new file is started. The log holds every call's arguments, so it is
//! readable by its owner alone (`0600`), the rotated file too.
//!
//! See docs/design.md, "One call".

use std::fs::{File, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde_json::Value;

use crate::pipeline::observe::{CallStart, Ending, Observation, Observer};

/// The default size at which the log is rotated.
pub const DEFAULT_MAX_BYTES: u64 = 10 * 1024 * 1024;

/// An open audit log.
pub struct AuditLog {
    path: PathBuf,
    max_bytes: u64,
    file: Mutex<Open>,
}

struct Open {
    file: File,
    size: u64,
}

/// How a call ended, as the log records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The tool ran and succeeded.
    Ok,
    /// The tool ran (or could not run) and reported an error.
    Error,
    /// The human declined the call, or it was not approved (see `--confirm`).
    NotApproved,
    /// The client cancelled it.
    Cancelled,
    /// No such tool.
    UnknownTool,
}

/// One line of the log.
#[derive(Debug, Serialize)]
pub struct Entry<'a> {
    /// When the call ended, RFC 3339 in UTC.
    pub time: String,
    /// The client's `clientInfo.name`.
    pub client: &'a str,
    /// The tool called.
    pub tool: &'a str,
    /// The call's arguments, as the client sent them.
    pub arguments: &'a Option<Value>,
    /// How it ended.
    pub outcome: Outcome,
    /// The first line of the reply (the value, or the error).
    pub summary: String,
    /// How long the call took, approval included.
    pub duration_ms: u64,
}

impl Entry<'_> {
    /// The summary of a reply: its first line, cut to 200 characters.
    pub fn summarize(text: &str) -> String {
        let line = text.lines().find(|line| !line.trim().is_empty()).unwrap_or("").trim();
        match line.char_indices().nth(200) {
            Some((cut, _)) => format!("{}…", &line[..cut]),
            None => line.to_string(),
        }
    }

    /// The current time, as the log writes it.
    pub fn now() -> String {
        humantime::format_rfc3339_millis(SystemTime::now()).to_string()
    }

    /// A duration in whole milliseconds.
    pub fn millis(duration: Duration) -> u64 {
        u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
    }
}

impl AuditLog {
    /// Opens `path` for appending (creating it), to be rotated past `max_bytes`.
    pub fn open(path: &Path, max_bytes: u64) -> std::io::Result<Self> {
        let open = open_appending(path)?;
        Ok(Self { path: path.to_path_buf(), max_bytes, file: Mutex::new(open) })
    }

    /// Appends `entry` and flushes it. A failure to write is logged to stderr, never fails the
    /// call it records.
    pub fn record(&self, entry: &Entry<'_>) {
        let mut line = match serde_json::to_vec(entry) {
            Ok(line) => line,
            Err(e) => return tracing::warn!(error = %e, "could not serialise an audit entry"),
        };
        line.push(b'\n');
        let mut open = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if open.size > 0 && open.size + line.len() as u64 > self.max_bytes {
            if let Err(e) = self.rotate(&mut open) {
                tracing::warn!(error = %e, path = %self.path.display(), "could not rotate the audit log");
            }
        }
        match open.file.write_all(&line).and_then(|()| open.file.flush()) {
            Ok(()) => open.size += line.len() as u64,
            Err(e) => tracing::warn!(error = %e, path = %self.path.display(), "could not write to the audit log"),
        }
    }

    fn rotate(&self, open: &mut Open) -> std::io::Result<()> {
        let mut rotated = self.path.clone().into_os_string();
        rotated.push(".1");
        std::fs::rename(&self.path, &rotated)?;
        *open = open_appending(&self.path)?;
        Ok(())
    }
}

/// The log as an observer of calls: each call's line is written when it ends, before its caller
/// gets the reply, so that the log never lags what an agent was told.
impl Observer for Arc<AuditLog> {
    fn begin(&self, call: &CallStart<'_>) -> Box<dyn Observation> {
        Box::new(Audited {
            log: self.clone(),
            client: call.client.to_string(),
            tool: call.tool.to_string(),
            arguments: call.arguments.clone(),
            started: Instant::now(),
        })
    }
}

/// A call the log will record.
struct Audited {
    log: Arc<AuditLog>,
    client: String,
    tool: String,
    arguments: Option<Value>,
    started: Instant,
}

impl Observation for Audited {
    fn end(self: Box<Self>, ending: Ending, text: &str) {
        let outcome = match ending {
            Ending::Done => Outcome::Ok,
            Ending::Failed => Outcome::Error,
            Ending::Declined | Ending::TimedOut | Ending::Refused => Outcome::NotApproved,
            Ending::Cancelled => Outcome::Cancelled,
            Ending::UnknownTool => Outcome::UnknownTool,
        };
        self.log.record(&Entry {
            time: Entry::now(),
            client: &self.client,
            tool: &self.tool,
            arguments: &self.arguments,
            outcome,
            summary: Entry::summarize(text),
            duration_ms: Entry::millis(self.started.elapsed()),
        });
    }
}

/// Opens `path` for appending, creating it readable and writable by its owner alone. An existing
/// log that others may read (one an older swank-mcp made `0644`) is made owner-only too, or not
/// used.
fn open_appending(path: &Path) -> std::io::Result<Open> {
    let file = OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
    let metadata = file.metadata()?;
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        file.set_permissions(Permissions::from_mode(mode & 0o700)).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "it is open to other users (mode {mode:o}) and cannot be made readable by its owner alone: {e}"
                ),
            )
        })?;
        tracing::warn!(path = %path.display(), "the audit log was open to other users (mode {mode:o}); it is now readable by its owner alone");
    }
    Ok(Open { file, size: metadata.len() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_are_json_and_the_file_rotates_past_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, 600).unwrap();
        let arguments = Some(json!({"code": "(+ 1 2)"}));
        for i in 0..10 {
            log.record(&Entry {
                time: Entry::now(),
                client: "tests",
                tool: "evaluate-lisp",
                arguments: &arguments,
                outcome: Outcome::Ok,
                summary: Entry::summarize(&format!("\n=> {i}\nmore")),
                duration_ms: 3,
            });
        }
        let current = std::fs::read_to_string(&path).unwrap();
        let rotated = std::fs::read_to_string(dir.path().join("audit.jsonl.1")).unwrap();
        assert!(current.len() <= 600 && rotated.len() <= 600, "{current}\n{rotated}");
        let last: Value = serde_json::from_str(current.lines().last().unwrap()).unwrap();
        assert_eq!(last["summary"], "=> 9");
        assert_eq!(last["outcome"], "ok");
        assert_eq!(last["arguments"]["code"], "(+ 1 2)");
        for line in current.lines().chain(rotated.lines()) {
            serde_json::from_str::<Value>(line).unwrap();
        }
    }
}
