//! Source files the image points to: `lisp-outline` and `lisp-check-parens` may read (never
//! write) files in the directories of the ASDF systems the image knows, where `find-definition`
//! sends an agent, besides the files under `--root`.
//!
//! See docs/design.md, "The toolbox".

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;

use super::lisp_reply::decode;
use super::{Arguments, ToolContext, ToolError, ToolResult};
use crate::image::{Entry, Request};
use crate::source::{AllowedRoots, PathError};

/// How long asking the image for its systems may take; a source tool must not hang on an image.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// Image (name and endpoint) -> the directories of the ASDF systems it knew when last asked.
static SYSTEM_DIRECTORIES: Mutex<Option<HashMap<String, Vec<PathBuf>>>> = Mutex::new(None);

/// The helper's answer to `system-directories`.
#[derive(Deserialize)]
struct Directories {
    directories: Vec<String>,
}

/// Runs `tool`, a read-only source tool, off the async workers, on the roots [`reading_roots`]
/// gives for its `file_path`.
pub(crate) async fn read_seeing_images(
    context: &ToolContext,
    args: &Arguments,
    tool: fn(&Arguments, &AllowedRoots) -> ToolResult,
) -> ToolResult {
    let roots = reading_roots(context, args).await?;
    let args = args.clone();
    context.on_files(move |_| tool(&args, &roots)).await
}

/// The roots a read-only source tool reads `args`'s `file_path` under: the server's, or, for a
/// file outside them in the directory of an ASDF system an image knows, that directory. The
/// images are asked only then, in order, and each answer is kept until a file is in none of its
/// directories.
async fn reading_roots(context: &ToolContext, args: &Arguments) -> Result<AllowedRoots, ToolError> {
    match args.optional_str("file_path")? {
        Some(file_path) => roots_holding(context, file_path).await,
        None => Ok(context.roots().clone()),
    }
}

/// The roots to read `file_path` under: the server's, or, for a file outside them in the
/// directory of an ASDF system an image knows, that directory (see [`reading_roots`]).
pub(crate) async fn roots_holding(context: &ToolContext, file_path: &str) -> Result<AllowedRoots, ToolError> {
    let configured = context.roots().clone();
    let path = PathBuf::from(file_path);
    let check = configured.clone();
    let outside = context
        .on_files(move |_| {
            Ok(match check.open(&path) {
                Err(PathError::Outside { resolved, .. }) => Some(resolved),
                _ => None,
            })
        })
        .await?;
    let Some(resolved) = outside else { return Ok(configured) };
    let holding = |directories: &[PathBuf]| -> Vec<PathBuf> {
        directories.iter().filter(|dir| resolved.starts_with(dir)).cloned().collect()
    };
    let mut found = Vec::new();
    for image in context.images() {
        let key = format!("{} {:?}", image.name(), image.endpoint());
        let cached = SYSTEM_DIRECTORIES.lock().ok().and_then(|cache| cache.as_ref()?.get(&key).cloned());
        found = cached.as_deref().map(holding).unwrap_or_default();
        if found.is_empty() {
            let Some(directories) = ask(context, image.name()).await else { continue };
            found = holding(&directories);
            if let Ok(mut cache) = SYSTEM_DIRECTORIES.lock() {
                cache.get_or_insert_with(HashMap::new).insert(key, directories);
            }
        }
        if !found.is_empty() {
            break;
        }
    }
    match found.into_iter().max_by_key(|dir| dir.as_os_str().len()) {
        Some(directory) => AllowedRoots::exact(vec![directory])
            .map_err(|e| ToolError::new(format!("Cannot open the system directory holding `{file_path}`: {e}."))),
        None => Ok(configured),
    }
}

/// The image's ASDF system directories, resolved; `None` when the image cannot say.
async fn ask(context: &ToolContext, image: &str) -> Option<Vec<PathBuf>> {
    let args = Arguments::for_image(image);
    let reply =
        context.call_helper_within(&args, Request::new(Entry::SYSTEM_DIRECTORIES), ASK_TIMEOUT, "").await.ok()?;
    let directories = decode::<Directories>("system-directories", &reply).ok()?.directories;
    Some(directories.iter().filter_map(|dir| Path::new(dir).canonicalize().ok()).collect())
}
