//! Standard input and output for the MCP server: pipes or sockets, as MCP clients start servers,
//! driven by the runtime's epoll directly.
//!
//! Tokio's own stdin and stdout hand every read and every write to its blocking pool, and a reader
//! and a writer thread (as rust-analyzer's `lsp-server` has) cost the same hand-off: measured
//! from a Python client, such threads made a call about 25 µs slower (the ratio to raw swank went
//! from 1.39-1.45 to 1.48-1.55). A terminal or a regular file cannot be polled, so the server
//! refuses them with an error that says what to do instead.
//!
//! See docs/design.md, "Layers".

use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// Standard input as an [`AsyncRead`], when it is a pipe or a socket.
pub fn stdin() -> std::io::Result<impl AsyncRead + Unpin + Send> {
    Pipe::new(libc::STDIN_FILENO, Interest::READABLE, "input")
}

/// Standard output as an [`AsyncWrite`], when it is a pipe or a socket.
pub fn stdout() -> std::io::Result<impl AsyncWrite + Unpin + Send> {
    Pipe::new(libc::STDOUT_FILENO, Interest::WRITABLE, "output")
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
    fn new(fd: RawFd, interest: Interest, which: &str) -> std::io::Result<Self> {
        let refused = |what: &str| {
            std::io::Error::other(format!(
                "standard {which} is {what}: swank-mcp speaks MCP with the client that starts it, over pipes. Configure \
                 it in an MCP client (see the README), pipe requests in (`cat requests.jsonl | swank-mcp`), or use \
                 `swank-mcp eval CODE` from a shell"
            ))
        };
        // SAFETY: fstat and fcntl only inspect and set the flags of a standard descriptor, which
        // stays open for the life of the process; a zeroed stat is a valid output buffer.
        unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut stat) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            match stat.st_mode & libc::S_IFMT {
                libc::S_IFIFO | libc::S_IFSOCK => {}
                // Never made non-blocking: the flag would be shared with the shell.
                libc::S_IFCHR if libc::isatty(fd) == 1 => return Err(refused("a terminal")),
                libc::S_IFREG => return Err(refused("a file")),
                _ => return Err(refused("neither a pipe nor a socket")),
            }
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // SAFETY: standard descriptors stay open and unchanged for the life of the process, and
        // nothing else in it reads stdin or writes stdout (logs go to stderr).
        let fd = unsafe { AsyncFd::register_with_interest(StandardFd(fd), interest) }?;
        Ok(Pipe { fd })
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
