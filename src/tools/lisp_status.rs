//! `lisp-status`: what swank-mcp is attached to: implementation, server, connection, the
//! session's package, threads, evaluations in flight, memory and features.
//!
//! See docs/design.md, "The toolbox".

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::debugger_sessions::DebuggerSessionSummary;
use super::lisp_reply::decode;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use crate::image::{Entry, Request};
use crate::swank::Form;

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "lisp-status",
        arguments: &[],
        read_only: true,
        description: "What swank-mcp is attached to, and your session's package, threads and evaluations.",
    },
    |context, args| Box::pin(call(context, args)),
);

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let image = context.image(args)?;
    // An attached thread's session is listed only while its thread still waits at its stop.
    if context.debugger_sessions().has_attached(&image) {
        let waiting = decode::<WaitingStops>("waiting-stops", &context.call_helper(args, Request::new(Entry::WAITING_STOPS)).await?)?;
        context.debugger_sessions().end_attached_except(&image, &waiting.stops);
    }
    let debugger_sessions = context.debugger_sessions().in_image(&image);
    // The image names each session's thread as the threads tool does, from the server's id.
    let threads = Form::list_of(debugger_sessions.iter().map(|session| session.thread));
    let request = Request::new(Entry::STATUS).key("debugger-threads", threads);
    let facts = decode::<ImageFacts>("status", &context.call_helper(args, request).await?)?;
    let Some(connection) = image.current_connection() else {
        return Err(ToolError::new(
            "The connection to the image closed while its status was read; call lisp-status again to reconnect.",
        ));
    };
    let info = connection.info();
    let launched = image.launched_pid();
    let status = Status {
        image: facts,
        server: info.dialect.name().to_string(),
        server_version: info.version.clone(),
        style: info.style.clone(),
        endpoint: connection.endpoint().to_string(),
        launched: launched.is_some(),
        pid: launched.flatten().map(i64::from).or(info.pid),
        session: image.session().to_string(),
        in_flight: connection.pending_count() as u64,
        debugger_sessions,
        images: match context.toolbox.images() {
            [_] => Vec::new(),
            all => {
                all.iter().map(|i| (i.name().to_string(), i.endpoint().to_string(), Arc::ptr_eq(i, &image))).collect()
            }
        },
    };
    Ok(ToolOutput::success(status.render()).with_structured(status.structured()))
}

/// The helper's `waiting-stops`.
#[derive(Debug, Deserialize)]
struct WaitingStops {
    stops: Vec<u64>,
}

/// What the helper reports about the image.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ImageFacts {
    pub implementation: String,
    pub version: String,
    pub machine: String,
    pub software: String,
    pub package: String,
    pub threads: u64,
    /// Tool calls running in the image besides this one, from any swank-mcp session.
    pub tool_calls: u64,
    pub heap_used: u64,
    pub heap_size: u64,
    pub asdf: Option<String>,
    pub quicklisp: bool,
    pub feature_count: u64,
    /// The notable features present, e.g. `:X86-64`, `:SB-THREAD`.
    pub features: Vec<String>,
    /// The threads tool's number of each debugger session's thread, in the order asked; `None`
    /// for one that has ended.
    pub debugger_threads: Vec<Option<u64>>,
    /// Threads of the image's own waiting in a server's debugger (the person's SLDB or nobody's),
    /// as the threads tool lists them: the debugger tool attaches to them.
    pub stopped_threads: Vec<String>,
    /// The servers' sentinel threads stuck in a debugger, as the threads tool lists them: from
    /// then on every new connection leaks two threads (docs/servers.md).
    pub stuck_sentinels: Vec<String>,
    /// SBCL internals the helper names that this SBCL lacks, each `PACKAGE::NAME (kind): why`:
    /// the tools that need them fail (see `lisp/sbcl.lisp`).
    pub missing_internals: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
struct Status {
    pub image: ImageFacts,
    pub server: String,
    pub server_version: Option<String>,
    pub style: Option<String>,
    pub endpoint: String,
    pub launched: bool,
    pub pid: Option<i64>,
    pub session: String,
    /// This server's requests waiting on the connection (not counting the status call).
    pub in_flight: u64,
    /// Evaluations stopped in the debugger.
    pub debugger_sessions: Vec<DebuggerSessionSummary>,
    /// Every image this server is configured for, when there are several: (name, endpoint, this one).
    pub images: Vec<(String, String, bool)>,
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_048_576.0)
}

impl Status {
    /// Each debugger session's thread as the threads tool numbers it.
    fn listed_threads(&self) -> impl Iterator<Item = Option<u64>> + '_ {
        self.image.debugger_threads.iter().copied().chain(std::iter::repeat(None))
    }

    pub fn render(&self) -> String {
        let image = &self.image;
        let attachment = if self.launched { "launched by swank-mcp" } else { "attached" };
        let pid = self.pid.map_or_else(String::new, |pid| format!(", pid {pid}"));
        let others = if image.tool_calls > 0 {
            format!(" ({} tool calls running in the image)", image.tool_calls)
        } else {
            String::new()
        };
        let extras =
            [image.asdf.as_ref().map(|v| format!("ASDF {v}")), image.quicklisp.then(|| "Quicklisp".to_string())];
        let libraries: Vec<String> = extras.into_iter().flatten().collect();
        let mut lines = vec![
            format!("Lisp: {} {} ({}, {})", image.implementation, image.version, image.machine, image.software),
            format!(
                "Server: {} {}{}",
                self.server,
                self.server_version.as_deref().unwrap_or("(version unknown)"),
                self.style.as_ref().map_or_else(String::new, |style| format!(", communication style {style}"))
            ),
            format!("Connection: {} ({attachment}{pid})", self.endpoint),
            format!("Session package: {}", image.package),
            format!("Threads: {}", image.threads),
            format!("Evaluations in flight: {}{others}", self.in_flight),
            format!("Heap: {} used of {}", megabytes(image.heap_used), megabytes(image.heap_size)),
        ];
        if !libraries.is_empty() {
            lines.push(format!("Loaded: {}", libraries.join(", ")));
        }
        for (session, thread) in self.debugger_sessions.iter().zip(self.listed_threads()) {
            lines.push(if session.busy {
                format!("Debugger session D{}: a debugger call is acting on it", session.number)
            } else {
                format!(
                    "Debugger session D{}: {}, {}, waiting {}",
                    session.number,
                    thread.map_or_else(|| "its thread has ended".to_string(), |n| format!("thread {n}")),
                    session.condition,
                    humantime::format_duration(Duration::from_secs(session.age.as_secs()))
                )
            });
        }
        for thread in &image.stopped_threads {
            lines.push(format!("Stopped thread {thread}: the debugger tool's attach opens it"));
        }
        for sentinel in &image.stuck_sentinels {
            lines.push(format!(
                "Stuck server sentinel {sentinel}: it no longer closes connections, so every new connection leaks \
                 two threads. Attach to it with the debugger tool and invoke ABORT, then start the server again \
                 on another port, or restart the image (see swank-mcp's docs/servers.md)"
            ));
        }
        if !image.missing_internals.is_empty() {
            lines.push(format!(
                "This SBCL lacks internals swank-mcp's helper names (the tools that need them fail; swank-mcp is \
                 tested with SBCL 2.2.9): {}",
                image.missing_internals.join("; ")
            ));
        }
        if !self.images.is_empty() {
            let images: Vec<String> = self
                .images
                .iter()
                .enumerate()
                .map(|(i, (name, endpoint, this))| {
                    let notes: Vec<&str> =
                        [(i == 0).then_some("default"), this.then_some("this one")].into_iter().flatten().collect();
                    let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join(", ")) };
                    format!("{name} at {endpoint}{notes}")
                })
                .collect();
            lines.push(format!("Images: {}", images.join("; ")));
        }
        lines.push(format!("Features ({}): {} ...", image.feature_count, image.features.join(" ")));
        lines.join("\n")
    }

    pub fn structured(&self) -> Value {
        let image = &self.image;
        json!({
            "implementation": image.implementation,
            "version": image.version,
            "machine": image.machine,
            "software": image.software,
            "server": self.server,
            "server_version": self.server_version,
            "style": self.style,
            "endpoint": self.endpoint,
            "launched": self.launched,
            "pid": self.pid,
            "session": self.session,
            "package": image.package,
            "threads": image.threads,
            "in_flight": self.in_flight,
            "debugger_sessions": self.debugger_sessions.iter().zip(self.listed_threads()).map(|(s, thread)| json!({"session": format!("D{}", s.number), "thread": thread, "condition": s.condition, "age_seconds": s.age.as_secs(), "busy": s.busy})).collect::<Vec<_>>(),
            "tool_calls_in_image": image.tool_calls,
            "stopped_threads": image.stopped_threads,
            "stuck_sentinels": image.stuck_sentinels,
            "missing_internals": image.missing_internals,
            "heap_used": image.heap_used,
            "heap_size": image.heap_size,
            "asdf": image.asdf,
            "quicklisp": image.quicklisp,
            "feature_count": image.feature_count,
            "features": image.features,
            "images": self.images.iter().map(|(name, endpoint, this)| json!({"name": name, "endpoint": endpoint, "current": this})).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    const FACTS: &str = "(:threads 4 :package \"COMMON-LISP-USER\" :implementation \"SBCL\" :version \"2.2.9.debian\" :machine \"X86-64\" \
         :software \"Linux 6.1\" :features (\":X86-64\" \":SB-THREAD\") :feature-count 60 :heap-used 52428800 \
         :heap-size 8589934592 :asdf \"3.3.5\" :quicklisp nil :tool-calls 0 :debugger-threads (6) :stopped-threads (\"9 \\\"shop-worker\\\" waits in the SLIME debugger, level 1 (TYPE-ERROR: bad)\") \
         :stuck-sentinels () :missing-internals ())";

    #[test]
    fn status_lines() {
        let image: ImageFacts = decode("status", &read(FACTS).unwrap()).unwrap();
        let status = Status {
            image,
            server: "swank".into(),
            server_version: Some("2.27".into()),
            style: Some("spawn".into()),
            endpoint: "127.0.0.1:4005".into(),
            launched: false,
            pid: Some(1234),
            session: "default-1".into(),
            in_flight: 0,
            debugger_sessions: vec![DebuggerSessionSummary {
                number: 2,
                thread: 17,
                condition: "SIMPLE-ERROR: disk full".into(),
                age: Duration::from_millis(95_500),
                busy: false,
            }],
            images: Vec::new(),
        };
        assert_eq!(
            status.render(),
            "Lisp: SBCL 2.2.9.debian (X86-64, Linux 6.1)\nServer: swank 2.27, communication style spawn\n\
             Connection: 127.0.0.1:4005 (attached, pid 1234)\nSession package: COMMON-LISP-USER\nThreads: 4\n\
             Evaluations in flight: 0\nHeap: 50.0 MB used of 8192.0 MB\nLoaded: ASDF 3.3.5\n\
             Debugger session D2: thread 6, SIMPLE-ERROR: disk full, waiting 1m 35s\n\
             Stopped thread 9 \"shop-worker\" waits in the SLIME debugger, level 1 (TYPE-ERROR: bad): the debugger \
             tool's attach opens it\nFeatures (60): :X86-64 :SB-THREAD ..."
        );
    }

    #[test]
    fn a_stuck_sentinel_and_missing_internals_are_said_with_what_to_do() {
        let facts = FACTS.replace(
            ":stuck-sentinels () :missing-internals ()",
            ":stuck-sentinels (\"3 \\\"Swank Sentinel\\\" waits in the SLIME debugger, level 1\") \
             :missing-internals (\"SB-DI::TOP-FRAME (function): walks a stack\")",
        );
        let image: ImageFacts = decode("status", &read(&facts).unwrap()).unwrap();
        let status = Status {
            image,
            server: "swank".into(),
            server_version: None,
            style: None,
            endpoint: "127.0.0.1:4005".into(),
            launched: false,
            pid: None,
            session: "default-1".into(),
            in_flight: 0,
            debugger_sessions: Vec::new(),
            images: Vec::new(),
        };
        let text = status.render();
        assert!(
            text.contains(
                "Stuck server sentinel 3 \"Swank Sentinel\" waits in the SLIME debugger, level 1: it no longer \
                 closes connections, so every new connection leaks two threads. Attach to it with the debugger \
                 tool and invoke ABORT"
            ),
            "{text}"
        );
        assert!(text.contains("(see swank-mcp's docs/servers.md)"), "{text}");
        assert!(text.contains("SBCL 2.2.9): SB-DI::TOP-FRAME (function): walks a stack"), "{text}");
        assert_eq!(status.structured()["stuck_sentinels"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let error = decode::<ImageFacts>("status", &read(&FACTS.replace(" :tool-calls 0", "")).unwrap()).unwrap_err();
        assert!(
            error.0.contains("reply to status is not what this server expects (the reply has no :tool-calls)"),
            "{}",
            error.0
        );
    }
}
