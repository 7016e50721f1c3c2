//! Standard input and output for the MCP server.
//!
//! Tokio's own stdin and stdout hand every read and every write to its blocking pool: a thread
//! hand-off in each direction of every message, which is most of the server's own latency. When
//! stdin and stdout are pipes or sockets (as MCP clients start servers), they are driven by the
//! runtime's epoll directly, with no other thread involved. Otherwise (a terminal, a file) they
//! get a dedicated reader thread and writer thread, as rust-analyzer's `lsp-server` does.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::io::StreamReader;

/// Standard input as an [`AsyncRead`].
pub fn stdin() -> Box<dyn AsyncRead + Unpin + Send> {
    match Pipe::new(libc::STDIN_FILENO, Interest::READABLE) {
        Some(pipe) => Box::new(pipe),
        None => Box::new(stdin_thread()),
    }
}

/// Standard output as an [`AsyncWrite`], and a thread to join (when one writes it) so that
/// every response is out before the process exits.
pub fn stdout() -> (Box<dyn AsyncWrite + Unpin + Send>, Option<std::thread::JoinHandle<std::io::Result<()>>>) {
    match Pipe::new(libc::STDOUT_FILENO, Interest::WRITABLE) {
        Some(pipe) => (Box::new(pipe), None),
        None => {
            let (writer, thread) = stdout_thread();
            (Box::new(writer), Some(thread))
        }
    }
}

/// One of this process's standard descriptors, borrowed for the life of the process (it is
/// never closed here).
struct StandardFd(RawFd);

impl AsRawFd for StandardFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A pipe or socket on a standard descriptor, in non-blocking mode and registered with the
/// runtime's epoll.
struct Pipe {
    fd: AsyncFd<StandardFd>,
}

impl Pipe {
    fn new(fd: RawFd, interest: Interest) -> Option<Self> {
        // SAFETY: fstat and fcntl only inspect and set the flags of a standard descriptor, which
        // stays open for the life of the process; a zeroed stat is a valid output buffer.
        unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut stat) != 0 {
                return None;
            }
            let kind = stat.st_mode & libc::S_IFMT;
            // Never on a terminal: the non-blocking flag would be shared with the shell.
            if kind != libc::S_IFIFO && kind != libc::S_IFSOCK {
                return None;
            }
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return None;
            }
        }
        // SAFETY: standard descriptors stay open and unchanged for the life of the process, and
        // nothing else in it reads stdin or writes stdout (logs go to stderr).
        unsafe { AsyncFd::register_with_interest(StandardFd(fd), interest) }.ok().map(|fd| Pipe { fd })
    }

    /// Reads into possibly uninitialised memory: read(2) only writes, so the buffer need not be
    /// zeroed first (zeroing 8 KB before every read was a measurable part of a call's cost).
    fn read(&self, buf: &mut [std::mem::MaybeUninit<u8>]) -> std::io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes, and read(2) never reads it.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn write(&self, data: &[u8]) -> std::io::Result<usize> {
        // SAFETY: `data` is valid for `data.len()` bytes of reads.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl AsyncRead for Pipe {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            // SAFETY: the unfilled part is only ever written, by read(2).
            let unfilled = unsafe { buf.unfilled_mut() };
            let wanted = unfilled.len();
            match guard.try_io(|_| self.read(unfilled)) {
                Ok(Ok(n)) => {
                    // A short read drained the pipe: the next read would only fail with EAGAIN,
                    // a wasted system call per message. The runtime's epoll says when more comes.
                    if n > 0 && n < wanted {
                        guard.clear_ready();
                    }
                    // SAFETY: read(2) wrote these `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Pipe {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|_| self.write(data)) {
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Writes go straight to the descriptor; there is no buffer to flush.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Chunks of standard input as a thread reads them.
fn stdin_thread() -> impl AsyncRead + Unpin {
    let (chunks, mut received) = mpsc::channel::<std::io::Result<Bytes>>(16);
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let mut input = std::io::stdin().lock();
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                match input.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(n) => {
                        if chunks.blocking_send(Ok(Bytes::copy_from_slice(&buffer[..n]))).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let _ = chunks.blocking_send(Err(e));
                        break;
                    }
                }
            }
        })
        .expect("spawning the stdin thread");
    StreamReader::new(futures::stream::poll_fn(move |cx| received.poll_recv(cx)))
}

/// An [`AsyncWrite`] whose bytes a thread writes to standard output. Each `write` is written and
/// flushed as a whole, so a message written in one call reaches stdout in one piece.
struct Stdout {
    lines: std::sync::mpsc::Sender<Vec<u8>>,
}

/// Dropping the [`Stdout`] lets the thread finish; join the handle to wait for the output.
fn stdout_thread() -> (Stdout, std::thread::JoinHandle<std::io::Result<()>>) {
    let (lines, received) = std::sync::mpsc::channel::<Vec<u8>>();
    let writer = std::thread::Builder::new()
        .name("stdout".into())
        .spawn(move || {
            let mut output = std::io::stdout().lock();
            for line in received {
                output.write_all(&line)?;
                output.flush()?;
            }
            Ok(())
        })
        .expect("spawning the stdout thread");
    (Stdout { lines }, writer)
}

impl AsyncWrite for Stdout {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.lines.send(buf.to_vec()) {
            Ok(()) => Poll::Ready(Ok(buf.len())),
            Err(_) => Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout is closed"))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
