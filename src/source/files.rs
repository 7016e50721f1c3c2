//! Which files the source tools may touch, and how an edited file is written back.
//!
//! Every path is opened *beneath a handle on a root directory*, in one step, with Linux's
//! `openat2(2)` and `RESOLVE_BENEATH`: the kernel resolves each component below the handle and
//! fails with `EXDEV` if a `..` or a symlink would leave it. There is no moment between a check and
//! a use in which a directory swapped for a symlink could redirect the open. An edit then works
//! only through a handle on the file's own directory, itself opened beneath the root: the
//! temporary file is created there, renamed over the file there, and removed there when the write
//! fails.
//!
//! Why `openat2` through `libc` rather than a capability crate such as `cap-std`: `libc` is
//! already a dependency and has `open_how`, `RESOLVE_*` and `SYS_openat2`; the kernel then does
//! the whole confinement, where `cap-std` would add a dozen crates to emulate it component by
//! component on kernels that lack it. The price is Linux 5.6 or later (the target platform is
//! Linux); an older kernel gets a clear error instead of an unsafe fallback.
//!
//! See docs/design.md, "Source files".

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fmt;
use std::fs::{File, Metadata};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// The directories the source tools may read and edit (`--root DIR`, repeatable; by default the
/// server's working directory), canonicalised and opened once at start-up. Each path a tool is
/// given is opened beneath one of them (see the module documentation).
#[derive(Debug, Clone)]
pub struct AllowedRoots {
    roots: Vec<Root>,
}

/// One root: its canonical path, for messages and for absolute paths, and a handle on it that
/// every open goes through.
#[derive(Debug, Clone)]
struct Root {
    path: PathBuf,
    dir: Arc<OwnedFd>,
}

/// Why a path given to a source tool cannot be used; the message is written for the model.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The path resolves to a place under none of the roots.
    #[error(
        "`{path}` is outside the allowed roots{}: only files under {roots} may be used (start the server with `--root DIR` to allow another directory).",
        resolved_note(path, resolved)
    )]
    Outside {
        /// The path as given.
        path: PathBuf,
        /// Where it leads, symlinks and `..` followed.
        resolved: PathBuf,
        /// The roots it is not under.
        roots: RootList,
    },
    /// Neither the file nor the directory it would be in exists.
    #[error("`{path}` does not exist.")]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },
    /// The path is the empty string.
    #[error("The file path is empty.")]
    Empty,
    /// The path is allowed but the file could not be read.
    #[error("Cannot read `{path}`: {source}.")]
    Read {
        /// The file as messages name it (see [`AllowedRoots::display`]).
        path: String,
        /// Why reading failed.
        source: io::Error,
    },
    /// The path could not be resolved for another reason than not existing.
    #[error("Cannot resolve `{path}`: {source}.")]
    Io {
        /// The path as given.
        path: PathBuf,
        /// Why resolving failed.
        source: io::Error,
    },
    /// The path names a directory, FIFO, socket or device. Such a file is never opened for
    /// reading, so a FIFO cannot block the server.
    #[error("`{path}` is {kind}, not a regular file: the source tools only read and edit regular files.")]
    NotRegular {
        /// The file as messages name it.
        path: String,
        /// "a directory", "a FIFO (named pipe)", ...
        kind: &'static str,
    },
    /// The file is larger than the caller allowed.
    #[error("`{path}` is {}, more than the {} read without asking. {advice}", megabytes(*size), megabytes(*limit))]
    TooLarge {
        /// The file as messages name it.
        path: String,
        /// Its size in bytes.
        size: u64,
        /// The limit in bytes.
        limit: u64,
        /// What to do to read it anyway.
        advice: &'static str,
    },
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_000_000.0)
}

fn resolved_note(path: &Path, resolved: &Path) -> String {
    if path == resolved {
        String::new()
    } else {
        format!(" (it resolves to `{}`)", resolved.display())
    }
}

/// The roots, for messages.
#[derive(Debug, Clone)]
pub struct RootList(Vec<PathBuf>);

impl fmt::Display for RootList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<String> = self.0.iter().map(|r| format!("`{}`", r.display())).collect();
        f.write_str(&shown.join(", "))
    }
}

/// A regular file opened beneath a root, with what [`AllowedRoots::open`] learnt about it.
#[derive(Debug)]
pub struct OpenedFile {
    /// The path for messages: relative to its root when possible.
    pub shown: String,
    /// Where the file is, symlinks followed (under a root).
    pub path: PathBuf,
    /// Open for reading.
    pub file: File,
    /// Its metadata at the time it was opened.
    pub metadata: Metadata,
    /// Index of the root it was opened beneath.
    root: usize,
}

impl AllowedRoots {
    /// Canonicalises and opens each root; no roots means the current directory.
    pub fn new(roots: Vec<PathBuf>) -> io::Result<Self> {
        let roots = if roots.is_empty() { vec![std::env::current_dir()?] } else { roots };
        let roots = roots
            .into_iter()
            .map(|root| {
                let context =
                    |e: io::Error| io::Error::new(e.kind(), format!("root directory `{}`: {e}", root.display()));
                let path = root.canonicalize().map_err(context)?;
                let dir = open_path(&path, libc::O_PATH | libc::O_DIRECTORY).map_err(context)?;
                Ok(Root { path, dir: Arc::new(dir) })
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(AllowedRoots { roots })
    }

    /// Opens each of `directories`, canonical paths, as a root, refusing any that is no longer
    /// reached without a symlink: a path resolved earlier (for example an ASDF system's
    /// directory) that now leads elsewhere would make the root elsewhere too.
    pub fn exact(directories: Vec<PathBuf>) -> io::Result<Self> {
        let roots = directories
            .into_iter()
            .map(|path| {
                let flags = libc::O_PATH | libc::O_DIRECTORY;
                let dir =
                    openat2(libc::AT_FDCWD, &path, flags, libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS)
                        .map_err(|e| io::Error::new(e.kind(), format!("directory `{}`: {e}", path.display())))?;
                Ok(Root { path, dir: Arc::new(dir) })
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(AllowedRoots { roots })
    }

    /// The roots' canonical paths, first root first.
    pub fn paths(&self) -> Vec<&Path> {
        self.roots.iter().map(|r| r.path.as_path()).collect()
    }

    fn root_list(&self) -> RootList {
        RootList(self.roots.iter().map(|r| r.path.clone()).collect())
    }

    /// Which root `path` is to be opened beneath, and the path relative to it. A relative path
    /// is taken from the first root; an absolute one from the root it starts with, or, if it
    /// starts with none (it goes through a symlink from outside), from the root its resolved
    /// form starts with. The resolving here decides nothing about safety: the open beneath the
    /// root does.
    fn locate(&self, path: &Path) -> Result<(usize, PathBuf), PathError> {
        if path.as_os_str().is_empty() {
            return Err(PathError::Empty);
        }
        if path.as_os_str().as_bytes().contains(&0) {
            let source = io::Error::new(io::ErrorKind::InvalidInput, "file name contained an unexpected NUL byte");
            return Err(PathError::Io { path: path.to_path_buf(), source });
        }
        if path.is_relative() {
            return Ok((0, path.to_path_buf()));
        }
        if let Some(found) = self.beneath(path) {
            return Ok(found);
        }
        let resolved = resolve(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => PathError::NotFound { path: path.to_path_buf() },
            _ => PathError::Io { path: path.to_path_buf(), source: e },
        })?;
        self.beneath(&resolved).ok_or_else(|| PathError::Outside {
            path: path.to_path_buf(),
            resolved,
            roots: self.root_list(),
        })
    }

    /// The root `absolute` starts with (the longest, when roots nest) and the rest of it.
    fn beneath(&self, absolute: &Path) -> Option<(usize, PathBuf)> {
        self.roots
            .iter()
            .enumerate()
            .filter_map(|(i, root)| absolute.strip_prefix(&root.path).ok().map(|rel| (i, rel.to_path_buf())))
            .max_by_key(|(i, _)| self.roots[*i].path.as_os_str().len())
    }

    /// Opens `path` (see `AllowedRoots::locate`) beneath its root in one step, and checks
    /// that it is a regular file. It is never opened for reading before that check, so a FIFO
    /// cannot block and a device is not touched. A symlink may lead anywhere under the roots.
    pub fn open(&self, path: &Path) -> Result<OpenedFile, PathError> {
        let (root, rel) = self.locate(path)?;
        let (root, rel, handle) = match open_beneath(&self.roots[root].dir, &rel, libc::O_PATH, RESOLVE) {
            Ok(handle) => (root, rel, handle),
            // A `..` or a symlink leads out of this root: perhaps into another one.
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                let resolved =
                    resolve(&self.roots[root].path.join(&rel)).unwrap_or_else(|_| self.roots[root].path.join(&rel));
                let outside = || PathError::Outside {
                    path: path.to_path_buf(),
                    resolved: resolved.clone(),
                    roots: self.root_list(),
                };
                let (other, other_rel) = self.beneath(&resolved).ok_or_else(outside)?;
                match open_beneath(&self.roots[other].dir, &other_rel, libc::O_PATH, RESOLVE) {
                    Ok(handle) => (other, other_rel, handle),
                    Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return Err(outside()),
                    Err(e) => return Err(self.open_error(path, other, &other_rel, e)),
                }
            }
            Err(e) => return Err(self.open_error(path, root, &rel, e)),
        };
        let handle = File::from(handle);
        let real = real_path(handle.as_fd()).unwrap_or_else(|| self.roots[root].path.join(&rel));
        let shown = self.display(&real);
        let metadata = handle.metadata().map_err(|source| PathError::Read { path: shown.clone(), source })?;
        if let Some(kind) = not_regular(&metadata) {
            return Err(PathError::NotRegular { path: shown, kind });
        }
        // Now for reading, the same way; the file must be the one just checked.
        let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
        let file = open_beneath(&self.roots[root].dir, &rel, flags, RESOLVE)
            .map(File::from)
            .map_err(|source| PathError::Read { path: shown.clone(), source })?;
        let now = file.metadata().map_err(|source| PathError::Read { path: shown.clone(), source })?;
        if (now.dev(), now.ino()) != (metadata.dev(), metadata.ino()) {
            let source = io::Error::other("it was replaced while being opened; try again");
            return Err(PathError::Read { path: shown, source });
        }
        Ok(OpenedFile { shown, path: real, file, metadata: now, root })
    }

    fn open_error(&self, path: &Path, root: usize, rel: &Path, e: io::Error) -> PathError {
        match e.raw_os_error() {
            Some(libc::ENOENT) => {
                // A missing file in a directory that exists is worth naming as a read failure.
                let parent = rel.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                match open_beneath(&self.roots[root].dir, parent, libc::O_PATH | libc::O_DIRECTORY, RESOLVE) {
                    Ok(_) => PathError::Read { path: self.display(&self.roots[root].path.join(rel)), source: e },
                    Err(_) => PathError::NotFound { path: path.to_path_buf() },
                }
            }
            _ => PathError::Io { path: path.to_path_buf(), source: e },
        }
    }

    /// Opens `path` beneath a root and reads it, for tools that only look at it. A file larger
    /// than `limit` bytes is refused with `advice` (what to pass to read it anyway).
    pub fn read(&self, path: &Path, limit: Option<(u64, &'static str)>) -> Result<SourceFile, PathError> {
        let OpenedFile { shown, path, mut file, metadata, .. } = self.open(path)?;
        check_size(&shown, &metadata, limit)?;
        match read_all(&mut file, &metadata) {
            Ok(bytes) => Ok(SourceFile { shown, path, bytes, modified: metadata.modified().ok() }),
            Err(source) => Err(PathError::Read { path: shown, source }),
        }
    }

    /// Opens `path` for an edit: reads it, and keeps a handle on its directory, opened beneath
    /// the same root, through which [`Snapshot::write_atomically`] writes it back.
    pub(crate) fn snapshot(&self, path: &Path, limit: Option<(u64, &'static str)>) -> Result<Snapshot, PathError> {
        let OpenedFile { shown, path: real, mut file, metadata, root } = self.open(path)?;
        check_size(&shown, &metadata, limit)?;
        let read_error = |source: io::Error| PathError::Read { path: shown.clone(), source };
        let bytes = read_all(&mut file, &metadata).map_err(read_error)?;
        // The file's own entry: its directory beneath the root, with no symlink on the way (the
        // real path has none), and the name there, which must still be this file.
        let root_path = &self.roots[root].path;
        let (dir, name) = match (real.strip_prefix(root_path), real.file_name()) {
            (Ok(rel), Some(name)) => {
                let parent = rel.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                let flags = libc::O_RDONLY | libc::O_DIRECTORY;
                let dir = open_beneath(&self.roots[root].dir, parent, flags, RESOLVE | libc::RESOLVE_NO_SYMLINKS)
                    .map_err(read_error)?;
                (dir, name.to_os_string())
            }
            _ => return Err(read_error(io::Error::other("cannot tell which directory it is in"))),
        };
        match stat_at(dir.as_fd(), &name) {
            Ok(entry) if (entry.st_dev, entry.st_ino) == (metadata.dev(), metadata.ino()) => {}
            _ => return Err(read_error(io::Error::other("it was moved while being opened; try again"))),
        }
        Ok(Snapshot {
            shown,
            path: real,
            bytes,
            dir,
            name,
            id: (metadata.dev(), metadata.ino()),
            modified: metadata.modified().ok(),
            mode: metadata.mode(),
            uid: metadata.uid(),
        })
    }

    /// How to name a checked path in messages and diffs: relative to its root when possible.
    pub fn display(&self, resolved: &Path) -> String {
        self.roots
            .iter()
            .find_map(|root| resolved.strip_prefix(&root.path).ok().filter(|rel| !rel.as_os_str().is_empty()))
            .unwrap_or(resolved)
            .display()
            .to_string()
    }
}

/// How `openat2` resolves beneath a root: never above it, and never through `/proc` magic links.
const RESOLVE: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;

/// `openat2(dir, rel, flags | O_CLOEXEC, resolve)` (see [`openat2`]).
fn open_beneath(dir: &OwnedFd, rel: &Path, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    openat2(dir.as_raw_fd(), rel, flags, resolve)
}

/// `openat2(dir, path, flags | O_CLOEXEC, resolve)`, retried on `EAGAIN` (a concurrent rename
/// the kernel could not rule out) and `EINTR`.
fn openat2(dir: RawFd, path: &Path, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    let name = c_path(path.as_os_str())?;
    // SAFETY: open_how is plain data; zeroed is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    for _ in 0..64 {
        // SAFETY: a valid descriptor (or AT_FDCWD), NUL-terminated path and an open_how of the size passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                name.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel just gave us this descriptor.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => continue,
            Some(libc::ENOSYS) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "this kernel has no openat2 (Linux 5.6 or later is needed), which the source tools need to open files safely beneath the allowed roots",
                ))
            }
            _ => return Err(e),
        }
    }
    Err(io::Error::other("the path kept changing while it was being opened; try again"))
}

fn open_path(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let name = c_path(path.as_os_str())?;
    // SAFETY: NUL-terminated path.
    let fd = unsafe { libc::open(name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn c_path(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file name contained an unexpected NUL byte"))
}

/// Where an open descriptor's file is, as the kernel names it; `None` without `/proc`.
fn real_path(fd: BorrowedFd<'_>) -> Option<PathBuf> {
    let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    path.is_absolute().then_some(path)
}

/// `path` with symlinks and `..` followed, for messages and for finding a root; a file that does
/// not exist yet is resolved through its parent directory.
fn resolve(path: &Path) -> io::Result<PathBuf> {
    match path.canonicalize() {
        Ok(resolved) => Ok(resolved),
        Err(e) if e.kind() == io::ErrorKind::NotFound => match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => Ok(parent.canonicalize()?.join(name)),
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// What a file that is not a regular file is ("a FIFO (named pipe)", ...), for a refusal; `None`
/// for a regular file.
pub fn not_regular(metadata: &Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let kind = metadata.file_type();
    if kind.is_file() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else {
        Some("not a regular file")
    }
}

fn check_size(shown: &str, metadata: &Metadata, limit: Option<(u64, &'static str)>) -> Result<(), PathError> {
    match limit {
        Some((limit, advice)) if metadata.len() > limit => {
            Err(PathError::TooLarge { path: shown.to_string(), size: metadata.len(), limit, advice })
        }
        _ => Ok(()),
    }
}

fn read_all(file: &mut File, metadata: &Metadata) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<libc::stat> {
    let name = c_path(name)?;
    // SAFETY: zeroed stat is valid; the kernel fills it.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated name, writable stat.
    if unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut stat, libc::AT_SYMLINK_NOFOLLOW) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat)
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC, mode)` of one name in a directory.
fn open_at(dir: BorrowedFd<'_>, name: &OsStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<File> {
    let name = c_path(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    let fd = unsafe {
        libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC, mode as libc::c_uint)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let name = c_path(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn rename_at(dir: BorrowedFd<'_>, from: &OsStr, to: &OsStr) -> io::Result<()> {
    let (from, to) = (c_path(from)?, c_path(to)?);
    // SAFETY: valid descriptor and NUL-terminated names.
    if unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The names in a directory, read through its handle.
fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    // SAFETY: fdopendir takes over the duplicate, closedir closes it.
    let dup = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: dup is an open directory descriptor we own.
    let stream = unsafe { libc::fdopendir(dup) };
    if stream.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so dup is still ours.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    // SAFETY: the stream reads from the start even if the descriptor was read before.
    unsafe { libc::rewinddir(stream) };
    let mut names = Vec::new();
    loop {
        // SAFETY: stream is open; the entry is valid until the next readdir.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        names.push(OsStr::from_bytes(name.to_bytes()).to_os_string());
    }
    // SAFETY: stream is open and closed once.
    unsafe { libc::closedir(stream) };
    Ok(names)
}

/// A file read through [`AllowedRoots::read`].
#[derive(Debug)]
pub struct SourceFile {
    /// The path for messages: relative to its root when possible.
    pub shown: String,
    /// The file's real path, with no symbolic link in it.
    pub path: PathBuf,
    pub(crate) bytes: Vec<u8>,
    /// When the file read was last modified.
    pub(crate) modified: Option<SystemTime>,
}

/// A file as it was read for an edit (see [`AllowedRoots::snapshot`]), to write the edit back
/// only if nobody changed it meanwhile.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub shown: String,
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    /// The file's directory, opened beneath its root.
    dir: OwnedFd,
    /// The file's name in `dir`.
    name: OsString,
    id: (u64, u64),
    modified: Option<SystemTime>,
    mode: u32,
    uid: u32,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    #[error("file changed while editing; nothing written")]
    Changed,
    /// The file may not be replaced: read-only, or someone else's. The text says which.
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A temporary file beside the edited one, removed when dropped unless it was renamed.
struct Temp<'a> {
    dir: BorrowedFd<'a>,
    name: OsString,
    armed: bool,
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the temporary file is hidden, and the next edit here removes it.
            let _ = unlink_at(self.dir, &self.name);
        }
    }
}

/// A file's new text written beside it, to rename into its place (see [`Snapshot::stage`]).
pub(crate) struct Staged<'a> {
    snapshot: &'a Snapshot,
    temp: Temp<'a>,
}

impl Staged<'_> {
    /// Whether the file still holds what was read.
    pub(crate) fn check(&self) -> Result<(), WriteError> {
        if self.snapshot.unchanged()? {
            Ok(())
        } else {
            Err(WriteError::Changed)
        }
    }

    /// Renames the new text into the file's place.
    pub(crate) fn commit(mut self) -> Result<(), WriteError> {
        rename_at(self.snapshot.dir.as_fd(), &self.temp.name, &self.snapshot.name)?;
        self.temp.armed = false;
        // Makes the rename durable; best effort.
        let _ = File::from(self.snapshot.dir.try_clone()?).sync_all();
        Ok(())
    }
}

/// The start of the second after `before`'s when `now` falls in the same whole second: a file
/// rewritten then gets that date instead of `now`. SBCL and ASDF compare file dates in whole
/// seconds, so otherwise an edit made in the second of a load (whose date the image recorded)
/// would look, to the image, like the text it compiled.
fn next_second_if_same(before: SystemTime, now: SystemTime) -> Option<SystemTime> {
    let seconds = |time: SystemTime| time.duration_since(SystemTime::UNIX_EPOCH).ok().map(|d| d.as_secs());
    let before_seconds = seconds(before)?;
    (seconds(now)? <= before_seconds)
        .then(|| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(before_seconds + 1))
}

/// Temporary files are named `.NAME.PID.N.swank-mcp.tmp`.
const TEMP_SUFFIX: &str = ".swank-mcp.tmp";

impl Snapshot {
    /// Whether the server's user may replace the file, decided as an editor without `!` would
    /// from the mode bits and the owner (the server may run as root, which ignores them).
    fn check_writable(&self) -> Result<(), WriteError> {
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        if self.uid != euid {
            return Err(WriteError::Refused(format!(
                "`{}` belongs to another user (uid {}; the server runs as uid {euid}): an edit would replace it with a file the server's user owns, so it is refused. Nothing written.",
                self.shown, self.uid
            )));
        }
        if self.mode & 0o200 == 0 {
            return Err(WriteError::Refused(format!(
                "`{}` is read-only (mode {}): it is not replaced, as an editor would not without being forced. Make it writable first if it should change. Nothing written.",
                self.shown,
                mode_string(self.mode)
            )));
        }
        Ok(())
    }

    /// Size, modification time, identity and content are all as they were read. The content
    /// comparison catches a rewrite within the file system's timestamp granularity.
    fn unchanged(&self) -> io::Result<bool> {
        let mut file =
            match open_at(self.dir.as_fd(), &self.name, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, 0) {
                Ok(file) => file,
                // Gone, or a symlink now.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ELOOP)) => return Ok(false),
                Err(e) => return Err(e),
            };
        let metadata = file.metadata()?;
        if !metadata.is_file()
            || (metadata.dev(), metadata.ino()) != self.id
            || metadata.modified().ok() != self.modified
        {
            return Ok(false);
        }
        Ok(read_all(&mut file, &metadata)? == self.bytes)
    }

    /// Replaces the file with `bytes` atomically: a temporary file in the same directory (through
    /// the directory's handle) gets the content and the original permissions, is synced, and is
    /// renamed over the file, but only if the file still holds what was read. The temporary file
    /// is removed on every way out but success. An edit replaces the directory entry, so a hard
    /// link elsewhere keeps the old text.
    pub fn write_atomically(&self, bytes: &[u8]) -> Result<(), WriteError> {
        let staged = self.stage(bytes)?;
        staged.check()?;
        staged.commit()
    }

    /// The first half of [`Snapshot::write_atomically`]: the temporary file beside this one,
    /// with `bytes` and the original permissions, synced; removed when dropped uncommitted.
    pub(crate) fn stage(&self, bytes: &[u8]) -> Result<Staged<'_>, WriteError> {
        self.check_writable()?;
        remove_stale_temps(self.dir.as_fd());
        let (temp, mut file) = self.create_temp()?;
        file.write_all(bytes)?;
        file.set_permissions(std::fs::Permissions::from_mode(self.mode & 0o7777))?;
        if let Some(later) = self.modified.and_then(|before| next_second_if_same(before, SystemTime::now())) {
            file.set_modified(later)?;
        }
        file.sync_all()?;
        Ok(Staged { snapshot: self, temp })
    }

    fn create_temp(&self) -> io::Result<(Temp<'_>, File)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = self.name.to_string_lossy();
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let temp = OsString::from(format!(".{name}.{}.{n}{TEMP_SUFFIX}", std::process::id()));
            match open_at(self.dir.as_fd(), &temp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600) {
                Ok(file) => return Ok((Temp { dir: self.dir.as_fd(), name: temp, armed: true }, file)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Removes temporary files a server that no longer runs left in `dir` (killed in the middle of
/// a write). Best effort.
fn remove_stale_temps(dir: BorrowedFd<'_>) {
    let Ok(names) = list_dir(dir) else { return };
    let own = std::process::id();
    for name in names {
        let Some(pid) = temp_owner(name.as_bytes()) else { continue };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = pid != own
            && unsafe { libc::kill(pid as libc::pid_t, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        let regular = stat_at(dir, &name).is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFREG);
        if gone && regular {
            let _ = unlink_at(dir, &name);
        }
    }
}

/// The process id in a temporary file's name `.NAME.PID.N.swank-mcp.tmp`.
fn temp_owner(name: &[u8]) -> Option<u32> {
    let rest = name.strip_prefix(b".")?.strip_suffix(TEMP_SUFFIX.as_bytes())?;
    let mut fields = rest.rsplit(|&b| b == b'.');
    let n = fields.next()?;
    let pid = fields.next()?;
    fields.next()?;
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    (digits(n) && digits(pid)).then(|| std::str::from_utf8(pid).ok()?.parse().ok()).flatten()
}

/// `rw-r--r--` and the like.
fn mode_string(mode: u32) -> String {
    let bits = ['r', 'w', 'x'];
    (0..9).map(|i| if mode & (0o400 >> i) != 0 { bits[i % 3] } else { '-' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn relative_paths_resolve_against_the_first_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let roots = AllowedRoots::new(vec![dir.path().to_path_buf()]).expect("roots");
        fs::write(dir.path().join("a.lisp"), "()").expect("write");
        let opened = roots.open(Path::new("a.lisp")).expect("inside");
        assert_eq!(opened.path, roots.paths()[0].join("a.lisp"));
        assert_eq!(opened.shown, "a.lisp");
        // Not there: a read failure when the directory exists, otherwise it does not exist.
        assert!(matches!(roots.open(Path::new("new.lisp")), Err(PathError::Read { .. })));
        assert!(matches!(roots.open(Path::new("no/such/dir.lisp")), Err(PathError::NotFound { .. })));
    }

    #[test]
    fn dot_dot_cannot_leave_the_roots() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir(dir.path().join("root")).expect("mkdir");
        fs::write(dir.path().join("outside.lisp"), "()").expect("write");
        let roots = AllowedRoots::new(vec![dir.path().join("root")]).expect("roots");
        let error = roots.open(Path::new("../outside.lisp")).unwrap_err();
        assert!(matches!(error, PathError::Outside { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("outside the allowed roots"), "{message}");
        assert!(message.contains("--root"), "{message}");
    }

    #[test]
    fn no_roots_means_the_working_directory() {
        let roots = AllowedRoots::new(Vec::new()).expect("roots");
        assert_eq!(roots.paths(), [std::env::current_dir().expect("cwd").canonicalize().expect("canonical")]);
    }

    #[test]
    fn temporary_file_names_give_their_owner() {
        assert_eq!(temp_owner(b".b.lisp.1234.7.swank-mcp.tmp"), Some(1234));
        assert_eq!(temp_owner(b"..lisp.1.0.swank-mcp.tmp"), Some(1));
        assert_eq!(temp_owner(b".b.lisp.x.7.swank-mcp.tmp"), None);
        assert_eq!(temp_owner(b"b.lisp.1234.7.swank-mcp.tmp"), None);
        assert_eq!(mode_string(0o100444), "r--r--r--");
        assert_eq!(mode_string(0o640), "rw-r-----");
    }
}
