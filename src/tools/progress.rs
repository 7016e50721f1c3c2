//! Progress reports of one tool call. The MCP layer turns them into `notifications/progress` when
//! the client asked for them with a `progressToken`; the tools only say how far they are.
//!
//! See docs/design.md, "The toolbox".

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One report: `progress` increases with every report of a call, as MCP requires.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressUpdate {
    pub(crate) progress: u64,
    pub(crate) message: String,
}

type Sink = dyn Fn(ProgressUpdate) + Send + Sync;

/// Where a tool call's progress goes: nowhere unless the client gave a progress token.
#[derive(Clone, Default)]
pub struct Progress {
    sink: Option<Arc<Sink>>,
    reported: Arc<AtomicU64>,
}

impl Progress {
    /// Reports go nowhere.
    pub fn none() -> Self {
        Self::default()
    }

    pub(crate) fn new(sink: impl Fn(ProgressUpdate) + Send + Sync + 'static) -> Self {
        Self { sink: Some(Arc::new(sink)), reported: Arc::default() }
    }

    /// Whether anyone listens: work done only to describe progress can be skipped otherwise.
    pub fn is_enabled(&self) -> bool {
        self.sink.is_some()
    }

    pub(crate) fn report(&self, message: impl Into<String>) {
        if let Some(sink) = &self.sink {
            let progress = self.reported.fetch_add(1, Ordering::Relaxed) + 1;
            sink(ProgressUpdate { progress, message: message.into() });
        }
    }
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress").field("enabled", &self.is_enabled()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn progress_increases_and_goes_nowhere_without_a_listener() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let progress = Progress::new(move |update| sink.lock().unwrap().push(update));
        progress.report("one");
        progress.clone().report("two");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.iter().map(|u| u.progress).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(seen[1].message, "two");
        assert!(!Progress::none().is_enabled());
        Progress::none().report("ignored");
    }
}
