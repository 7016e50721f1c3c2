//! Which files the source tools may touch, and how an edited file is written back.

use std::fmt;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// The directories the source tools may read and edit (`--root DIR`, repeatable; by default the
/// server's working directory), canonicalised once at start-up.
#[derive(Debug, Clone)]
pub struct AllowedRoots {
    roots: Vec<PathBuf>,
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

impl AllowedRoots {
    /// Canonicalises each root; no roots means the current directory.
    pub fn new(roots: Vec<PathBuf>) -> io::Result<Self> {
        let roots = if roots.is_empty() { vec![std::env::current_dir()?] } else { roots };
        let roots = roots
            .into_iter()
            .map(|root| {
                root.canonicalize()
                    .map_err(|e| io::Error::new(e.kind(), format!("root directory `{}`: {e}", root.display())))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(AllowedRoots { roots })
    }

    #[cfg(test)]
    fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Resolves `path` (a relative path is taken from the first root) with symlinks and `..`
    /// followed, and returns it if it lies under a root. A file that does not exist yet is
    /// resolved through its parent directory.
    pub fn check(&self, path: &Path) -> Result<PathBuf, PathError> {
        if path.as_os_str().is_empty() {
            return Err(PathError::Empty);
        }
        let joined = match &self.roots[..] {
            [first, ..] if path.is_relative() => first.join(path),
            _ => path.to_path_buf(),
        };
        let resolved = match joined.canonicalize() {
            Ok(resolved) => resolved,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let parent = joined.parent().map(Path::canonicalize);
                match (parent, joined.file_name()) {
                    (Some(Ok(parent)), Some(name)) => parent.join(name),
                    _ => return Err(PathError::NotFound { path: path.to_path_buf() }),
                }
            }
            Err(source) => return Err(PathError::Io { path: path.to_path_buf(), source }),
        };
        if self.roots.iter().any(|root| resolved.starts_with(root)) {
            Ok(resolved)
        } else {
            Err(PathError::Outside { path: path.to_path_buf(), resolved, roots: RootList(self.roots.clone()) })
        }
    }

    /// Checks `path` and reads the file, for tools that only look at it.
    pub fn read(&self, path: &Path) -> Result<SourceFile, PathError> {
        let path = self.check(path)?;
        let shown = self.display(&path);
        match fs::read(&path) {
            Ok(bytes) => Ok(SourceFile { shown, bytes }),
            Err(source) => Err(PathError::Read { path: shown, source }),
        }
    }

    /// How to name a checked path in messages and diffs: relative to its root when possible.
    pub fn display(&self, resolved: &Path) -> String {
        self.roots
            .iter()
            .find_map(|root| resolved.strip_prefix(root).ok().filter(|rel| !rel.as_os_str().is_empty()))
            .unwrap_or(resolved)
            .display()
            .to_string()
    }
}

/// A file read through [`AllowedRoots::read`].
#[derive(Debug)]
pub struct SourceFile {
    /// The path for messages: relative to its root when possible.
    pub shown: String,
    pub(crate) bytes: Vec<u8>,
}

/// A file as it was read, to write an edit of it back only if nobody changed it meanwhile.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    modified: Option<SystemTime>,
    permissions: Permissions,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    #[error("file changed while editing; nothing written")]
    Changed,
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl Snapshot {
    pub fn read(path: &Path) -> io::Result<Self> {
        let mut file = File::open(path)?;
        let metadata = file.metadata()?;
        if metadata.is_dir() {
            return Err(io::Error::other("it is a directory"));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
        file.read_to_end(&mut bytes)?;
        Ok(Snapshot {
            path: path.to_path_buf(),
            bytes,
            modified: metadata.modified().ok(),
            permissions: metadata.permissions(),
        })
    }

    /// Size, modification time and content are all as they were read. The content comparison
    /// catches a rewrite within the file system's timestamp granularity.
    fn unchanged(&self) -> io::Result<bool> {
        let now = match Snapshot::read(&self.path) {
            Ok(now) => now,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        Ok(now.modified == self.modified && now.bytes == self.bytes)
    }

    /// Replaces the file with `bytes` atomically: a temporary file in the same directory gets the
    /// content and the original permissions, is synced, and is renamed over the file, but only
    /// if the file still holds what was read.
    pub fn write_atomically(&self, bytes: &[u8]) -> Result<(), WriteError> {
        let (temp_path, mut temp) = create_temp_beside(&self.path)?;
        let result = (|| {
            temp.write_all(bytes)?;
            temp.set_permissions(self.permissions.clone())?;
            temp.sync_all()?;
            drop(temp);
            if !self.unchanged()? {
                return Err(WriteError::Changed);
            }
            fs::rename(&temp_path, &self.path)?;
            sync_parent(&self.path);
            Ok(())
        })();
        if result.is_err() {
            // Best effort: the temporary file is hidden and harmless if this fails too.
            let _ = fs::remove_file(&temp_path);
        }
        result
    }
}

fn create_temp_beside(path: &Path) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp_path = dir.join(format!(".{name}.{}.{n}.swank-mcp.tmp", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&temp_path) {
            Ok(file) => return Ok((temp_path, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Makes the rename durable. Best effort: not every platform can sync a directory.
fn sync_parent(path: &Path) {
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_resolve_against_the_first_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let roots = AllowedRoots::new(vec![dir.path().to_path_buf()]).expect("roots");
        fs::write(dir.path().join("a.lisp"), "()").expect("write");
        let resolved = roots.check(Path::new("a.lisp")).expect("inside");
        assert_eq!(resolved, roots.roots()[0].join("a.lisp"));
        assert_eq!(roots.display(&resolved), "a.lisp");
        // Not there yet: resolved through its parent.
        assert!(roots.check(Path::new("new.lisp")).is_ok());
        assert!(matches!(roots.check(Path::new("no/such/dir.lisp")), Err(PathError::NotFound { .. })));
    }

    #[test]
    fn dot_dot_cannot_leave_the_roots() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir(dir.path().join("root")).expect("mkdir");
        fs::write(dir.path().join("outside.lisp"), "()").expect("write");
        let roots = AllowedRoots::new(vec![dir.path().join("root")]).expect("roots");
        let error = roots.check(Path::new("../outside.lisp")).unwrap_err();
        assert!(matches!(error, PathError::Outside { .. }));
        let message = error.to_string();
        assert!(message.contains("outside the allowed roots"), "{message}");
        assert!(message.contains("--root"), "{message}");
    }

    #[test]
    fn no_roots_means_the_working_directory() {
        let roots = AllowedRoots::new(Vec::new()).expect("roots");
        assert_eq!(roots.roots(), [std::env::current_dir().expect("cwd").canonicalize().expect("canonical")]);
    }
}
