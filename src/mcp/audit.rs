//! `--audit-log FILE`: one JSON line per tool call (time, client, tool, arguments, outcome,
//! duration), written when the call ends, so that `tail -f FILE | jq` follows the agent. When the
//! file would pass its size limit it is renamed to `FILE.1` (replacing the previous one) and a new
//! file is started.
//!
//! Several servers may share one log: each appends under an advisory lock on the file (`flock`),
//! decides on rotation from the file's real size, and moves to the new file when another one has
//! rotated, so that no line is lost, doubled or split between them. The log holds every call's
//! arguments: it and `FILE.1` are readable by their owner alone (`0600`), and swank-mcp writes only
//! into a regular file of the server's own user, reached without following a symbolic link.
//!
//! See docs/design.md, "One call", and docs/security.md, "--audit-log".

use crate::sync::lock;
use std::fs::{File, Metadata, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde_json::Value;

use crate::pipeline::observe::{CallStart, Ending, Observation, Observer};
use crate::source::not_regular;

/// The default size at which the log is rotated.
pub const DEFAULT_MAX_BYTES: u64 = 10 * 1024 * 1024;

/// How many times one line follows the log to the file now at its path before it is given up:
/// only other servers rotating the log at each of those turns could use them all.
const MAX_TURNS: usize = 8;

/// An open audit log.
pub struct AuditLog {
    path: PathBuf,
    rotated: PathBuf,
    max_bytes: u64,
    file: Mutex<File>,
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
    /// Opens `path` for appending (creating it), to be rotated past `max_bytes`. Refuses a path
    /// that is a symbolic link, not a regular file or another user's, and a `FILE.1` that is.
    pub fn open(path: &Path, max_bytes: u64) -> io::Result<Self> {
        let mut rotated = path.as_os_str().to_owned();
        rotated.push(".1");
        let rotated = PathBuf::from(rotated);
        tighten_rotated(&rotated)?;
        let file = open_appending(path)?;
        Ok(Self { path: path.to_path_buf(), rotated, max_bytes, file: Mutex::new(file) })
    }

    /// Appends `entry`. A failure to write is logged to stderr, never fails the call it records.
    pub fn record(&self, entry: &Entry<'_>) {
        let mut line = match serde_json::to_vec(entry) {
            Ok(line) => line,
            Err(e) => return tracing::warn!(error = %e, "could not serialise an audit entry"),
        };
        line.push(b'\n');
        let mut file = lock(&self.file);
        if let Err(e) = self.append(&mut file, &line) {
            tracing::warn!(error = %e, path = %self.path.display(), "could not write to the audit log");
        }
    }

    /// Appends `line` to the file now at the log's path, which `file` becomes.
    fn append(&self, file: &mut File, line: &[u8]) -> io::Result<()> {
        for _ in 0..MAX_TURNS {
            flock(file, libc::LOCK_EX)?;
            let turn = self.append_locked(file, line);
            let unlocked = flock(file, libc::LOCK_UN);
            match turn? {
                Turn::Written => return unlocked,
                Turn::Moved(current) => *file = current,
            }
        }
        Err(io::Error::other(format!("the log was replaced {MAX_TURNS} times while this line waited for it")))
    }

    /// One turn of [`append`](Self::append), with `file` locked: every server appends and rotates
    /// only under that lock, so the size read here is the file's until the line is written.
    fn append_locked(&self, file: &mut File, line: &[u8]) -> io::Result<Turn> {
        let metadata = file.metadata()?;
        // Another server rotated the log since this one opened it (or waited for its lock): the
        // file held is FILE.1 now, and the line belongs in the new one.
        if !is_at(&metadata, &self.path)? {
            return Ok(Turn::Moved(open_appending(&self.path)?));
        }
        let size = metadata.len();
        if size > 0 && size + line.len() as u64 > self.max_bytes {
            match self.rotate() {
                Ok(()) => return Ok(Turn::Moved(open_appending(&self.path)?)),
                // The line is kept, past the limit, rather than lost.
                Err(e) => {
                    tracing::warn!(error = %e, path = %self.path.display(), "could not rotate the audit log")
                }
            }
        }
        // One write of the whole line: O_APPEND puts it at the end, and the lock keeps other
        // servers' lines out of it should the kernel take it in several parts.
        file.write_all(line)?;
        Ok(Turn::Written)
    }

    fn rotate(&self) -> io::Result<()> {
        // FILE.1 is checked again: it may have been replaced since the server started.
        check_rotated(&self.rotated)?;
        std::fs::rename(&self.path, &self.rotated)
    }
}

/// How a turn of [`AuditLog::append`] ended.
enum Turn {
    Written,
    /// The log's path holds another file now (rotated here or by another server), to try again in.
    Moved(File),
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
            Ending::Declined | Ending::TimedOut | Ending::Refused | Ending::Deferred => Outcome::NotApproved,
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
/// log that others may read (one an older swank-mcp made `0644`) is made owner-only too.
fn open_appending(path: &Path) -> io::Result<File> {
    // Checked before opening: opening a device may act on it.
    match std::fs::symlink_metadata(path) {
        Ok(metadata) => check(&metadata, "it")?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // A link or a FIFO put there since the check fails to open or is refused below, instead of
    // being followed or blocking until a reader comes. O_NONBLOCK changes nothing for a regular
    // file.
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused("it", SYMLINK),
            _ => e,
        })?;
    let metadata = file.metadata()?;
    check(&metadata, "it")?;
    make_owner_only(&file, &metadata, path)?;
    Ok(file)
}

/// Checks a `FILE.1` left from before as the next rotation would, and makes it owner-only if
/// others may read it.
fn tighten_rotated(rotated: &Path) -> io::Result<()> {
    let Some(metadata) = check_rotated(rotated)? else { return Ok(()) };
    if metadata.mode() & 0o077 == 0 {
        return Ok(());
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(rotated)?;
    let now = file.metadata()?;
    if (now.dev(), now.ino()) != (metadata.dev(), metadata.ino()) {
        return Err(io::Error::other(format!("{} was replaced while it was checked; try again", rotated.display())));
    }
    make_owner_only(&file, &now, rotated)
}

/// Refuses a `FILE.1` that rotation must not replace: renaming the log over it would replace the
/// link itself, or the other user's file, or fail on a directory. Its metadata, if it exists.
fn check_rotated(rotated: &Path) -> io::Result<Option<Metadata>> {
    match std::fs::symlink_metadata(rotated) {
        Ok(metadata) => {
            check(&metadata, &format!("{}, the file the log is rotated to,", rotated.display()))?;
            Ok(Some(metadata))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

const SYMLINK: &str = "is a symbolic link: the audit log and its rotated file are never reached through one, which \
                       could point every call's arguments at another file";

/// Refuses a file the log must not be written into: a symbolic link, what is not a regular file,
/// another user's file (the server may run as root, which could write into it). `subject` names it
/// in the error.
fn check(metadata: &Metadata, subject: &str) -> io::Result<()> {
    if metadata.file_type().is_symlink() {
        return Err(refused(subject, SYMLINK));
    }
    if let Some(kind) = not_regular(metadata) {
        return Err(refused(subject, &format!("is {kind}, not a regular file")));
    }
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if metadata.uid() != euid {
        let reason = format!(
            "belongs to another user (uid {}) than the server's (uid {euid}), and the log holds every call's arguments",
            metadata.uid()
        );
        return Err(refused(subject, &reason));
    }
    Ok(())
}

fn refused(subject: &str, reason: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{subject} {reason}; remove it, or pass --audit-log another path"),
    )
}

/// Makes `file` readable and writable by its owner alone if others may read or write it.
fn make_owner_only(file: &File, metadata: &Metadata, path: &Path) -> io::Result<()> {
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        file.set_permissions(Permissions::from_mode(mode & 0o700)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{} is open to other users (mode {mode:o}) and cannot be made readable by its owner alone: {e}",
                    path.display()
                ),
            )
        })?;
        tracing::warn!(path = %path.display(), "the audit log was open to other users (mode {mode:o}); it is now readable by its owner alone");
    }
    Ok(())
}

/// Whether the file `metadata` describes is the one at `path` (not a link to it).
fn is_at(metadata: &Metadata, path: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(there) => Ok((there.dev(), there.ino()) == (metadata.dev(), metadata.ino())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// `flock(2)`, retried when a signal interrupts it.
fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: `file` keeps the descriptor open for the call.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
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
                tool: "some-tool",
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

    /// Two handles on one file, as two servers have: the one that did not rotate moves to the new
    /// file instead of writing into FILE.1 or rotating it again, which lost the first file.
    #[test]
    fn two_handles_on_one_log_rotate_it_once_between_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let seed = "{\"seed\":true}\n".repeat(300);
        std::fs::write(&path, &seed).unwrap();
        // Full enough to rotate at the first line, with room for all ten after.
        let max = seed.len() as u64 + 10;
        let logs = [AuditLog::open(&path, max).unwrap(), AuditLog::open(&path, max).unwrap()];
        let arguments = Some(json!({}));
        std::thread::scope(|scope| {
            for (n, log) in logs.iter().enumerate() {
                let arguments = &arguments;
                scope.spawn(move || {
                    for i in 0..5 {
                        log.record(&Entry {
                            time: Entry::now(),
                            client: "tests",
                            tool: "some-tool",
                            arguments,
                            outcome: Outcome::Ok,
                            summary: format!("{n} {i}"),
                            duration_ms: 1,
                        });
                    }
                });
            }
        });
        assert_eq!(std::fs::read_to_string(dir.path().join("audit.jsonl.1")).unwrap(), seed);
        let mut summaries: Vec<String> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap()["summary"].as_str().unwrap().to_string())
            .collect();
        summaries.sort();
        let expected: Vec<String> = (0..2).flat_map(|n| (0..5).map(move |i| format!("{n} {i}"))).collect();
        assert_eq!(summaries, expected);
    }
}
