//! The writing half of a connection: MCP messages to stdout, swank frames to the image's socket.
//!
//! A message is written the moment it is ready, by whoever produced it, when nothing is queued
//! before it and the output takes it whole, which is nearly always. Handing every message to a
//! writer task instead cost a task switch per message, and put everything the sender did after
//! sending (a finished tool call dropping its state) on the message's path. What the output does
//! not take at once (a peer slow to read) waits in a queue that the writer task drains in order.
//!
//! The queue is bounded only by the producer: [`Outbox::room`] tells it when to stop producing
//! (the MCP server stops reading requests) until the peer catches up.
//!
//! See docs/design.md, "Layers".

use crate::sync::lock;
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// Where an [`Outbox`] writes: stdout for the MCP server, a socket's writing half for swank.
pub type Output = Box<dyn AsyncWrite + Unpin + Send>;

/// Bytes of queued messages past which [`Outbox::room`] waits. A client that reads what it is
/// sent stays within a few responses of the output (its pipe alone holds 64 KiB), so only one that
/// has stopped reading gets this far behind, and more queue would only cost memory. Counted in
/// allocated bytes rather than message bytes, because that is the memory held: a small response
/// sits in a buffer sized for a typical one, 512 bytes for a 40-byte answer to a ping.
const QUEUE_LIMIT: usize = 8 * 1024 * 1024;
/// Where a full queue counts as having room again: half empty, so that a producer that has
/// stopped resumes for many messages at a time rather than for each one the peer reads.
const QUEUE_RESUME: usize = QUEUE_LIMIT / 2;

/// The writing half of one connection: shared by everything that sends on it, with one writer
/// task running [`Outbox::run_writer`] for what the output does not take at once.
pub struct Outbox {
    state: Mutex<State>,
    /// Wakes the writer task when the queue gains a message, or on close.
    queued: Notify,
}

struct State {
    output: Output,
    /// Messages not yet written, oldest first.
    queue: VecDeque<Vec<u8>>,
    /// Bytes of the first queued message already written.
    written_of_first: usize,
    /// Bytes allocated by the queued messages.
    queued_bytes: usize,
    /// Set when `queued_bytes` passes [`QUEUE_LIMIT`], cleared when it is back to [`QUEUE_RESUME`].
    full: bool,
    /// The task waiting in [`Outbox::room`] for the queue to drain.
    waiting_for_room: Option<Waker>,
    /// A write has completed that the output has not flushed yet.
    unflushed: bool,
    /// Set once writing has failed: the peer is gone, later messages are dropped.
    failed: Option<io::ErrorKind>,
    closing: bool,
}

impl Outbox {
    /// An outbox with nothing queued. What the output does not take at once waits until a task
    /// runs [`Outbox::run_writer`].
    pub fn new(output: Output) -> Self {
        Self {
            state: Mutex::new(State {
                output,
                queue: VecDeque::new(),
                written_of_first: 0,
                queued_bytes: 0,
                full: false,
                waiting_for_room: None,
                unflushed: false,
                failed: None,
                closing: false,
            }),
            queued: Notify::new(),
        }
    }

    /// Writes `message` now if the output takes it, or queues it for the writer task. Fails
    /// once the output has failed (the message is dropped) or been closed.
    pub fn send(&self, message: Vec<u8>) -> io::Result<()> {
        let mut state = self.lock();
        if let Some(kind) = state.failed {
            return Err(kind.into());
        }
        if state.closing {
            return Err(io::ErrorKind::NotConnected.into());
        }
        if state.queue.is_empty() {
            // A waker that wakes nobody: if the output is not ready, the writer task polls again
            // with its own and is woken when it is.
            let mut cx = Context::from_waker(Waker::noop());
            let written = match state.write_some(&mut cx, &message) {
                Poll::Ready(written) => written?,
                Poll::Pending => 0,
            };
            if written == message.len() {
                return match state.poll_flush(&mut cx) {
                    Poll::Ready(flushed) => flushed,
                    Poll::Pending => {
                        drop(state);
                        self.queued.notify_one();
                        Ok(())
                    }
                };
            }
            state.written_of_first = written;
        }
        state.queued_bytes += message.capacity();
        state.full |= state.queued_bytes > QUEUE_LIMIT;
        state.queue.push_back(message);
        drop(state);
        self.queued.notify_one();
        Ok(())
    }

    /// Once more than `QUEUE_LIMIT` bytes have been queued, waits until the queue is down to
    /// `QUEUE_RESUME` (or the output fails, dropping it). Made for one waiting task at a time.
    pub async fn room(&self) {
        std::future::poll_fn(|cx| {
            let mut state = self.lock();
            if !state.full {
                return Poll::Ready(());
            }
            state.waiting_for_room = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Ends the writer task once everything queued is written.
    pub fn close(&self) {
        self.lock().closing = true;
        self.queued.notify_one();
    }

    /// Drains the queue whenever it fills until [`Outbox::close`], then shuts the output down;
    /// returns the write error that ended the output, if one did.
    pub async fn run_writer(&self) -> io::Result<()> {
        loop {
            std::future::poll_fn(|cx| self.lock().poll_drain(cx)).await?;
            if self.lock().closing {
                break;
            }
            self.queued.notified().await;
        }
        std::future::poll_fn(|cx| Pin::new(&mut self.lock().output).poll_shutdown(cx)).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl State {
    /// Writes as much of `data` as the output takes now.
    fn write_some(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let mut written = 0;
        while written < data.len() {
            match Pin::new(&mut self.output).poll_write(cx, &data[written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(self.fail(io::ErrorKind::WriteZero))),
                Poll::Ready(Ok(n)) => {
                    written += n;
                    self.unflushed = true;
                }
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(self.fail(e.kind()))),
                Poll::Pending if written == 0 => return Poll::Pending,
                Poll::Pending => break,
            }
        }
        Poll::Ready(Ok(written))
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.unflushed {
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut self.output).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                self.unflushed = false;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(self.fail(e.kind()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(kind) = self.failed {
            return Poll::Ready(Err(kind.into()));
        }
        while let Some(first) = self.queue.pop_front() {
            match self.write_some(cx, &first[self.written_of_first..]) {
                Poll::Ready(Ok(n)) if self.written_of_first + n == first.len() => {
                    self.written_of_first = 0;
                    self.queued_bytes -= first.capacity();
                }
                Poll::Ready(Ok(n)) => {
                    self.written_of_first += n;
                    self.queue.push_front(first);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    self.queue.push_front(first);
                    self.wake_if_room();
                    return Poll::Pending;
                }
            }
        }
        self.wake_if_room();
        self.poll_flush(cx)
    }

    fn wake_if_room(&mut self) {
        if self.full && self.queued_bytes <= QUEUE_RESUME {
            self.full = false;
            if let Some(waiting) = self.waiting_for_room.take() {
                waiting.wake();
            }
        }
    }

    fn fail(&mut self, kind: io::ErrorKind) -> io::Error {
        self.failed = Some(kind);
        self.queue.clear();
        self.queued_bytes = 0;
        self.wake_if_room();
        kind.into()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::FutureExt;
    use tokio::io::AsyncReadExt;

    use super::*;

    fn start(output: Output) -> (Arc<Outbox>, tokio::task::JoinHandle<io::Result<()>>) {
        let outbox = Arc::new(Outbox::new(output));
        let writer = tokio::spawn({
            let outbox = outbox.clone();
            async move { outbox.run_writer().await }
        });
        (outbox, writer)
    }

    #[tokio::test]
    async fn messages_arrive_whole_and_in_order_through_a_narrow_pipe() {
        // Room for 7 bytes: nearly every message is queued, most part-written.
        let (pipe_in, mut pipe_out) = tokio::io::duplex(7);
        let (outbox, writer) = start(Box::new(pipe_in));
        let messages: Vec<Vec<u8>> = (0..200).map(|i| format!("{{\"message\":{i}}}\n").into_bytes()).collect();
        let reader = tokio::spawn(async move {
            let mut received = Vec::new();
            pipe_out.read_to_end(&mut received).await.map(|_| received)
        });
        for (i, message) in messages.iter().enumerate() {
            outbox.send(message.clone()).unwrap();
            if i % 10 == 0 {
                tokio::task::yield_now().await;
            }
        }
        outbox.close();
        drop(outbox);
        writer.await.unwrap().unwrap();
        assert_eq!(reader.await.unwrap().unwrap(), messages.concat());
    }

    #[tokio::test]
    async fn a_message_stdout_takes_at_once_needs_no_writer_task() {
        let (pipe_in, mut pipe_out) = tokio::io::duplex(1024);
        let outbox = Outbox::new(Box::new(pipe_in));
        outbox.send(b"{}\n".to_vec()).unwrap();
        let mut received = [0u8; 3];
        pipe_out.read_exact(&mut received).await.unwrap();
        assert_eq!(&received, b"{}\n");
    }

    #[tokio::test]
    async fn room_waits_once_the_queue_passes_the_limit_until_it_is_down_to_half() {
        let (pipe_in, mut pipe_out) = tokio::io::duplex(1024);
        let (outbox, _writer) = start(Box::new(pipe_in));
        let message = vec![b'x'; 64 * 1024];
        let mut queued = 0;
        while outbox.room().now_or_never().is_some() {
            outbox.send(message.clone()).unwrap();
            queued += message.len();
        }
        assert!(queued > QUEUE_LIMIT && queued <= QUEUE_LIMIT + 2 * message.len(), "{queued}");
        let mut room = std::pin::pin!(outbox.room());
        // Back under the limit, but not yet down to half of it: still waiting.
        let mut received = vec![0u8; queued / 4];
        pipe_out.read_exact(&mut received).await.unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(room.as_mut().now_or_never().is_none());
        let mut rest = vec![0u8; queued - queued / 4];
        let drained = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            tokio::join!(pipe_out.read_exact(&mut rest), room)
        });
        drained.await.expect("room once the queue drains").0.unwrap();
        assert!(rest.iter().all(|b| *b == b'x'));
    }

    #[tokio::test]
    async fn a_failed_output_frees_a_full_queue_and_its_waiter() {
        let (pipe_in, pipe_out) = tokio::io::duplex(1024);
        let (outbox, writer) = start(Box::new(pipe_in));
        while outbox.room().now_or_never().is_some() {
            outbox.send(vec![b'x'; 64 * 1024]).unwrap();
        }
        let room = outbox.room();
        drop(pipe_out);
        tokio::time::timeout(std::time::Duration::from_secs(10), room).await.expect("room once the output fails");
        assert_eq!(writer.await.unwrap().unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn a_closed_output_ends_the_writer_with_its_error_and_later_messages_are_dropped() {
        let (pipe_in, pipe_out) = tokio::io::duplex(16);
        let (outbox, writer) = start(Box::new(pipe_in));
        drop(pipe_out);
        assert_eq!(outbox.send(b"lost\n".to_vec()).unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(outbox.send(b"also lost\n".to_vec()).unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        let error = writer.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
        assert!(outbox.lock().queue.is_empty());
    }
}
