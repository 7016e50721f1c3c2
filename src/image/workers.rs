//! The worker threads a connection keeps in the image (docs/design.md, "The image"): server
//! threads that each serve this client's requests one at a time, as SLIME's REPL thread serves
//! SLIME's (`lisp/workers.lisp`), sparing a small call the thread swank would spawn for it. A
//! call goes to an idle worker, or to a new thread when none is idle (one more worker is then
//! started in the background, up to [`MAX_WORKERS`]).

use std::sync::{Arc, Mutex};

use super::request::Request;
use super::{lock, Entry};
use crate::swank::{Connection, Form, RexError, Sexp, Thread};

/// Worker threads kept per connection; calls beyond them run in new threads.
const MAX_WORKERS: usize = 4;

/// One connection's workers.
#[derive(Default)]
pub(crate) struct Workers {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    idle: Vec<i64>,
    /// Idle or lent to a request.
    count: usize,
    /// Being started.
    starting: usize,
}

impl Workers {
    /// Asks the helper for a worker thread serving `connection`'s requests and keeps it for later
    /// calls. A server that cannot keep one answers nil; calls then run in a thread each.
    pub(crate) async fn start(&self, connection: &Connection) {
        match connection.rex(Request::new(Entry::START_WORKER).form(), "COMMON-LISP-USER", Thread::New).await {
            Ok(reply) => match reply.as_i64() {
                Some(thread) => {
                    let mut state = lock(&self.state);
                    state.idle.push(thread);
                    state.count += 1;
                }
                None => tracing::debug!(%reply, "the server keeps no worker threads"),
            },
            Err(e) => tracing::debug!(error = %e, "starting a worker thread failed"),
        }
    }

    /// Starts one more worker in the background when none is idle, up to [`MAX_WORKERS`]: the
    /// call at hand goes to a new thread, later ones to the worker.
    pub(crate) fn keep(self: &Arc<Self>, connection: &Connection) {
        {
            let mut state = lock(&self.state);
            if !state.idle.is_empty() || state.count + state.starting >= MAX_WORKERS {
                return;
            }
            state.starting += 1;
        }
        let (workers, connection) = (self.clone(), connection.clone());
        tokio::spawn(async move {
            workers.start(&connection).await;
            lock(&workers.state).starting -= 1;
        });
    }

    /// [`Connection::rex`] in an idle worker, else in a new thread. The worker serves only this
    /// request until its value comes back. After anything else (the request aborted, perhaps with
    /// the thread, or this future dropped while the thread may still run it) it is never sent
    /// another. A worker that has ended meanwhile is answered "thread not found"; the request
    /// then goes to a new thread.
    pub(crate) async fn rex(&self, connection: &Connection, form: Form, package: &str) -> Result<Sexp, RexError> {
        let Some(lease) = self.lend() else { return connection.rex(form, package, Thread::New).await };
        match connection.rex(form.clone(), package, Thread::Id(lease.thread)).await {
            Ok(value) => {
                lease.give_back();
                Ok(value)
            }
            Err(RexError::InvalidRpc(reason)) => {
                tracing::debug!(thread = lease.thread, %reason, "a worker thread has ended");
                drop(lease);
                connection.rex(form, package, Thread::New).await
            }
            Err(e) => Err(e),
        }
    }

    fn lend(&self) -> Option<Lease<'_>> {
        let thread = lock(&self.state).idle.pop()?;
        Some(Lease { workers: self, thread, given_back: false })
    }
}

/// A worker lent to one request. Given back when its value came; dropped otherwise, when the
/// worker is forgotten.
struct Lease<'a> {
    workers: &'a Workers,
    thread: i64,
    given_back: bool,
}

impl Lease<'_> {
    fn give_back(mut self) {
        self.given_back = true;
        lock(&self.workers.state).idle.push(self.thread);
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.given_back {
            lock(&self.workers.state).count -= 1;
        }
    }
}
