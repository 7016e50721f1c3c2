//! The tools layer (docs/design.md, "Layers"): one module per tool. Each declares its arguments
//! once, builds its request, runs it (in the attached image or, for source-file tools, in this
//! process) and formats the reply as its contract says. Nothing here knows about JSON-RPC, nor
//! about approvals or records: the [`crate::pipeline`] hands over a checked call and a
//! cancellation token, and gets back a [`ToolOutput`].

pub mod arguments;
pub mod debugger_sessions;
pub(crate) mod image_sources;
mod instructions;
pub(crate) mod lisp_reply;
pub mod output;
pub mod preview;
pub mod progress;
pub(crate) mod text_search;

pub use lisp_reply::group_thousands;

use arguments::arguments;

/// Declares each tool's module and lists its `TOOL` in the order `tools/list` shows them.
macro_rules! tools {
    ($($tool:ident),* $(,)?) => {
        $(pub mod $tool;)*

        /// Every tool, in the order `tools/list` shows them.
        static TOOLS: &[Tool] = &[$($tool::TOOL),*];
    };
}

// Adding a tool is its own file and a line here.
tools! {
    evaluate_lisp,
    inspect,
    debugger,
    compile_form,
    macroexpand_form,
    class_info,
    describe_symbol,
    apropos_search,
    find_definition,
    xref,
    load_system,
    run_tests,
    trace,
    profile,
    threads,
    lisp_status,
    edit_lisp_form,
    load_form,
    load_file,
    lisp_check_parens,
    lisp_outline,
    undo,
}

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub(crate) use crate::source::parse_permit;
use crate::source::AllowedRoots;
use crate::swank::Sexp;

use crate::image::{CallLimits, Entry, Image, ImageSettings, Request};
pub use arguments::{ArgumentError, Arguments, Param};
use debugger_sessions::DebuggerSessions;
pub use output::{ToolDefinition, ToolError, ToolOutput};
pub use preview::{Fingerprint, Preview};
pub use progress::{Progress, ProgressUpdate};

/// Files larger than this are read by the source tools only when asked with `large_file`.
pub const LARGE_FILE: u64 = 64 * 1024 * 1024;

/// The size limit a source tool reads `file_path` with: [`LARGE_FILE`], unless `large_file`.
pub(crate) fn file_limit(large_file: bool) -> Option<(u64, &'static str)> {
    (!large_file).then_some((
        LARGE_FILE,
        "Pass `large_file: true` to read it anyway; that takes time and memory in proportion to its size.",
    ))
}

/// The refusal of an `index` of 0, for the tools that find a definition in a file as
/// edit-lisp-form does: an agent counting from 0 learns where counting starts.
pub(crate) fn index_from_one(_: &Value) -> String {
    "Argument `index` is 1-based: use 1 for the first match.".to_string()
}

/// What a tool's function gives back.
pub type ToolResult = Result<ToolOutput, ToolError>;

/// One tool: its definition, the one place its name is written, and how it runs.
pub struct Tool {
    /// What `tools/list` says of it.
    pub definition: ToolDefinition,
    /// The tool's function, and whether it needs an image.
    pub run: Run,
    /// What the human approving a call is shown (under `--confirm`), when the tool shows more than
    /// the code or arguments: an edit's diff, the code a load compiles, what a test run reloads.
    pub preview: Option<Previewing>,
    /// Whether a call, by its arguments, only looks, for a tool that is not read-only as a whole
    /// (`threads`' list): `--confirm mutating` does not make such a call wait.
    pub looks_only: Option<fn(Option<&Value>) -> bool>,
}

/// How a tool makes its preview of a call.
#[derive(Clone, Copy)]
pub enum Previewing {
    /// From the files under the allowed roots.
    Files(PreviewFn),
    /// By asking the image (what it would load again): looks only.
    Image(ImagePreviewFn),
}

/// A tool's preview of a call, made on the allowed roots.
pub type PreviewFn = fn(&Arguments, &AllowedRoots) -> Result<Preview, ToolError>;

/// A tool's preview of a call, made by asking the image.
pub type ImagePreviewFn = for<'a> fn(&'a ToolContext, &'a Arguments) -> BoxFuture<'a, Result<Preview, ToolError>>;

/// A tool's function that runs in an image.
pub type ImageFn = for<'a> fn(&'a ToolContext, &'a Arguments) -> BoxFuture<'a, ToolResult>;

impl Tool {
    /// A tool that runs `run` in an image, and shows no preview of its own: what most tools are.
    pub const fn in_image(definition: ToolDefinition, run: ImageFn) -> Tool {
        Tool { definition, run: Run::Image(run), preview: None, looks_only: None }
    }

    /// The tool, whose calls only look when `looks_only` says so of their arguments.
    pub const fn with_looking_calls(self, looks_only: fn(Option<&Value>) -> bool) -> Tool {
        Tool { looks_only: Some(looks_only), ..self }
    }

    /// The tool, showing the human approving a call `preview` rather than its arguments.
    pub const fn with_preview(self, preview: PreviewFn) -> Tool {
        Tool { preview: Some(Previewing::Files(preview)), ..self }
    }

    /// The tool, showing the human approving a call what `preview` asks the image.
    pub const fn with_image_preview(self, preview: ImagePreviewFn) -> Tool {
        Tool { preview: Some(Previewing::Image(preview)), ..self }
    }

    /// `arguments` checked against the tool's declaration, as a server with one image checks
    /// them (without the `image` argument).
    pub fn arguments(&self, arguments: Value) -> Result<Arguments, ArgumentError> {
        Arguments::read(self.definition.name, self.definition.arguments, None, Some(arguments))
    }
}

/// How a tool runs.
pub enum Run {
    /// In an attached image, through the helper.
    Image(ImageFn),
    /// On source files in this process, with a step in the image the call names when it needs
    /// one (loading what it wrote): `call` is what the server runs; `source` is the tool without
    /// that step, which needs no image.
    Source {
        /// The tool on files alone.
        source: fn(&Arguments, &AllowedRoots) -> ToolResult,
        /// The whole tool.
        call: ImageFn,
    },
    /// Reading source files in this process, under the roots or, for a file of an ASDF system an
    /// image knows, under that system's directory (read only): the images are only asked where
    /// their systems are, so the call takes no `image` argument.
    Reading(fn(&Arguments, &AllowedRoots) -> ToolResult),
}

/// A tool a [`Toolbox`] offers.
pub struct Offered {
    definition: ToolDefinition,
    tool: &'static Tool,
    /// It takes the `image` argument.
    image_argument: bool,
}

impl Offered {
    /// Its name.
    pub fn name(&self) -> &'static str {
        self.definition.name
    }

    /// Whether a call with `arguments` only looks: every call of a read-only tool does, and those
    /// the tool says so of.
    pub fn looks_only(&self, arguments: Option<&Value>) -> bool {
        self.definition.read_only || self.tool.looks_only.is_some_and(|looks| looks(arguments))
    }
}

/// Every tool's definition, in the order `tools/list` shows them, whatever a server offers: what
/// the help and the tests that tie the documentation to the tools read.
pub fn every_definition() -> impl Iterator<Item = ToolDefinition> {
    TOOLS.iter().map(|tool| tool.definition.clone())
}

/// Every tool's definition and how it runs.
fn all_tools() -> Vec<Offered> {
    TOOLS
        .iter()
        .map(|tool| Offered {
            definition: tool.definition.clone(),
            tool,
            image_argument: matches!(tool.run, Run::Image(_) | Run::Source { .. }),
        })
        .collect()
}

arguments! {
    /// The arguments of a tool that asks about one symbol.
    struct SymbolArguments {
        symbol: String,
        package: Option<String>,
    }
}

impl SymbolArguments {
    /// The request that asks `function` about the symbol: the name as a string (read in the
    /// image) and the package or nil.
    fn request(self, function: Entry) -> Request {
        Request::new(function).arg(self.symbol).key("package", self.package)
    }
}

/// Server-wide settings the tools read.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The time limit of an evaluation when the call gives none.
    pub eval_timeout: Duration,
    /// Characters kept of each output section; the image cuts the rest.
    pub max_output: usize,
    /// How long an evaluation stopped in the debugger waits for the debugger tool.
    pub debug_timeout: Duration,
    /// Whether an evaluation may end an image this server did not start (`--allow-exit`).
    pub allow_exit: bool,
    /// Whether values get handles for `inspect`: not for a one-shot `swank-mcp eval`, whose
    /// session ends before anyone could use them.
    pub value_handles: bool,
}

/// Everything the tools share: settings, the images they work in, and the directories the
/// source tools may touch.
pub struct Toolbox {
    settings: Settings,
    images: Vec<Arc<Image>>,
    roots: AllowedRoots,
    /// The tools offered and how each runs.
    offered: Vec<Offered>,
    /// Evaluations stopped in an image's debugger, for the debugger tool.
    debugger_sessions: DebuggerSessions,
}

/// Which tools a server offers, from `--tools` and `--read-only`.
#[derive(Debug, Clone, Default)]
pub struct ToolSelection {
    /// Only these tools (all when empty).
    pub only: Vec<String>,
    /// Leave out every tool that changes the image or files.
    pub read_only: bool,
}

impl Toolbox {
    /// `images` must not be empty; the first one is the default.
    pub fn new(settings: Settings, images: Vec<ImageSettings>, roots: AllowedRoots) -> Self {
        assert!(!images.is_empty(), "at least one image is configured");
        let images: Vec<Arc<Image>> = images.into_iter().map(|s| Arc::new(Image::new(s))).collect();
        Self { settings, images, roots, offered: all_tools(), debugger_sessions: DebuggerSessions::default() }
    }

    /// Offers only the selected tools. An unknown name is an error that lists the known ones, and
    /// so is a tool `--read-only` leaves out: `--tools` narrows the read-only set, never widens it.
    /// Under `--read-only` the images are told too, and run only the helper's entries that look
    /// ([`Image::look_only`]), whatever a tool asks of them.
    pub fn select(mut self, selection: &ToolSelection) -> Result<Self, String> {
        if let Some(unknown) = selection.only.iter().find(|name| !self.definitions().any(|d| d.name == name.as_str())) {
            let known: Vec<&str> = self.definitions().map(|d| d.name).collect();
            return Err(format!("unknown tool {unknown:?} in --tools; the tools are: {}", known.join(", ")));
        }
        if selection.read_only {
            let changing: Vec<&str> = selection
                .only
                .iter()
                .filter_map(|name| self.definitions().find(|d| d.name == name.as_str()))
                .filter(|d| !d.read_only)
                .map(|d| d.name)
                .collect();
            if !changing.is_empty() {
                let looking: Vec<&str> = self.definitions().filter(|d| d.read_only).map(|d| d.name).collect();
                return Err(format!(
                    "--tools names {}, which --read-only leaves out: it runs code or changes the image or files. \
                     Drop --read-only to offer it, or choose among the read-only tools: {}",
                    changing.join(", "),
                    looking.join(", ")
                ));
            }
            let roots: Vec<String> = self.roots.paths().iter().map(|root| root.display().to_string()).collect();
            for image in &self.images {
                image.look_only(roots.clone());
            }
        }
        self.offered.retain(|Offered { definition: d, .. }| {
            (selection.only.is_empty() || selection.only.iter().any(|name| name == d.name))
                && (!selection.read_only || d.read_only)
        });
        Ok(self)
    }

    /// The configured images, the default first.
    pub fn images(&self) -> &[Arc<Image>] {
        &self.images
    }

    /// Aborts the evaluations stopped in the debugger of every image, for a server that exits.
    pub async fn abort_debugger_sessions(&self) {
        self.debugger_sessions.abort_all().await;
    }

    /// Ends this server's session in every image it is connected to, for a server that exits:
    /// its traces are untraced, its handles released, its REPL state and background buffer dropped.
    pub async fn end_sessions(&self) {
        for image in &self.images {
            image.end_session().await;
        }
    }

    /// The tools this server offers.
    pub fn definitions(&self) -> impl Iterator<Item = &ToolDefinition> {
        self.offered.iter().map(|offered| &offered.definition)
    }

    /// The tools this server offers, each with the JSON Schema of its arguments: an image tool
    /// takes an `image` argument when there are several images.
    pub fn offered_schemas(&self) -> impl Iterator<Item = (&ToolDefinition, Value)> {
        let names = self.image_names();
        self.offered.iter().map(move |offered| {
            let images: &[&str] = if offered.image_argument { &names } else { &[] };
            (&offered.definition, arguments::input_schema(offered.definition.arguments, images))
        })
    }

    /// The tool `name`, if this toolbox offers it: a tool left out by --tools or --read-only does
    /// not exist for the client.
    pub fn tool(&self, name: &str) -> Option<&Offered> {
        self.offered.iter().find(|offered| offered.definition.name == name)
    }

    /// Checks a call's `arguments` for `tool` against its declaration.
    pub fn check_arguments(&self, tool: &Offered, arguments: &Option<Value>) -> Result<(), ArgumentError> {
        let names = self.image_names();
        let images = tool.image_argument.then_some(names.as_slice());
        Arguments::check(tool.name(), tool.definition.arguments, images, arguments)
    }

    /// A call's `arguments`, which [`Toolbox::check_arguments`] passed.
    pub(crate) fn accept_arguments(arguments: Option<Value>) -> Arguments {
        Arguments::accept(arguments)
    }

    /// The image a call with `arguments` works in: the one its `image` argument names, or the
    /// default; `None` when it names none that is configured.
    pub fn image_for(&self, arguments: &Option<Value>) -> Option<Arc<Image>> {
        match arguments.as_ref().and_then(|arguments| arguments.get("image")).and_then(Value::as_str) {
            Some(name) => self.images.iter().find(|image| image.name() == name).cloned(),
            None => self.images.first().cloned(),
        }
    }

    fn image_names(&self) -> Vec<&str> {
        self.images.iter().map(|image| image.name()).collect()
    }

    /// Runs tool `name`, its arguments checked first but never approved nor observed (the
    /// [`crate::pipeline`] does that for a server's calls); `None` when there is no such tool.
    pub async fn call(
        self: &Arc<Self>,
        name: &str,
        arguments: Option<Value>,
        cancel: CancellationToken,
    ) -> Option<ToolOutput> {
        self.call_with_progress(name, arguments, cancel, Progress::none()).await
    }

    /// [`Toolbox::call`] for a client that wants progress reports of long calls.
    pub async fn call_with_progress(
        self: &Arc<Self>,
        name: &str,
        arguments: Option<Value>,
        cancel: CancellationToken,
        progress: Progress,
    ) -> Option<ToolOutput> {
        let tool = self.tool(name)?;
        if let Err(error) = self.check_arguments(tool, &arguments) {
            return Some(ToolError::from(error).into());
        }
        let args = Self::accept_arguments(arguments);
        Some(self.run(tool, &args, cancel, progress, None).await)
    }

    /// What the human approving a call of `tool` with `args` is shown: the tool's own preview, or
    /// the call's code or arguments.
    pub(crate) async fn preview(self: &Arc<Self>, tool: &Offered, args: &Arguments) -> Result<Preview, ToolError> {
        match tool.tool.preview {
            None => Ok(preview::of_arguments(args)),
            Some(Previewing::Files(preview)) => {
                let (toolbox, args) = (self.clone(), args.clone());
                tokio::task::spawn_blocking(move || preview(&args, &toolbox.roots))
                    .await
                    .unwrap_or_else(|e| Err(ToolError::new(format!("The tool failed unexpectedly: {e}"))))
            }
            Some(Previewing::Image(preview)) => {
                preview(&self.context(CancellationToken::new(), Progress::none(), None), args).await
            }
        }
    }

    /// The context a tool's function (or its preview) runs in.
    fn context(
        self: &Arc<Self>,
        cancel: CancellationToken,
        progress: Progress,
        approved: Option<Fingerprint>,
    ) -> ToolContext {
        ToolContext { toolbox: self.clone(), settings: self.settings.clone(), cancel, progress, approved }
    }

    /// Runs `tool` with `args`, which [`Toolbox::check_arguments`] passed; `approved` is the
    /// fingerprint of what the human approved, which the tool checks before it acts.
    pub(crate) async fn run(
        self: &Arc<Self>,
        tool: &Offered,
        args: &Arguments,
        cancel: CancellationToken,
        progress: Progress,
        approved: Option<Fingerprint>,
    ) -> ToolOutput {
        let context = self.context(cancel, progress, approved);
        let result = match tool.tool.run {
            Run::Image(function) | Run::Source { call: function, .. } => function(&context, args).await,
            Run::Reading(source) => image_sources::read_seeing_images(&context, args, source).await,
        };
        // A fresh image in place of one that ended is news the agent must not miss: its earlier
        // definitions are gone.
        let result = match context.image(args).ok().and_then(|image| image.take_replacement_note()) {
            Some(note) => match result {
                Ok(mut output) => {
                    output.text = format!("{note}\n\n{}", output.text);
                    Ok(output)
                }
                Err(error) => Err(ToolError::new(format!("{note}\n\n{}", error.0))),
            },
            None => result,
        };
        result.unwrap_or_else(ToolOutput::from)
    }
}

/// The helper's answer to an activity question (`load-activity`, `test-activity`): what a long
/// call is at, if it can say.
#[derive(serde::Deserialize)]
struct Activity {
    activity: Option<String>,
}

/// What one tool call sees: the shared toolbox, the call's own cancellation and where its
/// progress reports go.
pub struct ToolContext {
    toolbox: Arc<Toolbox>,
    pub(crate) settings: Settings,
    pub(crate) cancel: CancellationToken,
    pub(crate) progress: Progress,
    /// The fingerprint of what the human approved, when the call was approved with one.
    pub(crate) approved: Option<Fingerprint>,
}

impl ToolContext {
    /// Every configured image, the default first.
    pub fn images(&self) -> &[Arc<Image>] {
        &self.toolbox.images
    }

    /// The directories the source tools may read and write.
    pub fn roots(&self) -> &AllowedRoots {
        &self.toolbox.roots
    }

    /// Whether the agent's code may end `image`: `--allow-exit`, or an image this server started.
    pub fn exit_allowed(&self, image: &Image) -> bool {
        self.settings.allow_exit || image.launched_pid().is_some()
    }

    /// The evaluations stopped in an image's debugger.
    pub(crate) fn debugger_sessions(&self) -> &DebuggerSessions {
        &self.toolbox.debugger_sessions
    }

    /// Runs `work` on the allowed roots off the async workers, as the source tools run.
    pub(crate) async fn on_files<T: Send + 'static>(
        &self,
        work: impl FnOnce(&AllowedRoots) -> Result<T, ToolError> + Send + 'static,
    ) -> Result<T, ToolError> {
        let toolbox = self.toolbox.clone();
        tokio::task::spawn_blocking(move || work(&toolbox.roots))
            .await
            .unwrap_or_else(|e| Err(ToolError::new(format!("The tool failed unexpectedly: {e}"))))
    }

    /// The image named by the optional `image` argument, or the default image.
    pub fn image(&self, args: &Arguments) -> Result<Arc<Image>, ToolError> {
        let images = &self.toolbox.images;
        match args.optional_str("image")? {
            None => Ok(images[0].clone()),
            Some(name) => images.iter().find(|i| i.name() == name).cloned().ok_or_else(|| {
                let known: Vec<&str> = images.iter().map(|i| i.name()).collect();
                arguments::unknown_image(name, &known).into()
            }),
        }
    }

    /// Calls `function` of the helper in the image `args` names, within the server's evaluation
    /// time limit and with this call's cancellation, and checks the reply: a failure the helper
    /// reports (no such package, a Lisp error, a timeout) comes back as the output to return.
    pub async fn call_helper(&self, args: &Arguments, request: Request) -> Result<Sexp, ToolError> {
        let advice = "Start swank-mcp with a larger --eval-timeout if this needs longer.";
        self.call_helper_within(args, request, self.settings.eval_timeout, advice).await
    }

    /// [`ToolContext::call_helper_within`] for a long call (a load, a test run), reporting
    /// progress as [`ToolContext::reporting`] does, with what the helper's `activity_function`
    /// says it is at (`Testing inventory (3 s): 12 checks done`).
    pub(crate) async fn call_helper_reporting(
        &self,
        args: &Arguments,
        call: (Request, Duration, &'static str),
        activity_function: Entry,
        doing: &str,
    ) -> Result<Sexp, ToolError> {
        let (request, timeout, timeout_advice) = call;
        let run = self.call_helper_within(args, request, timeout, timeout_advice);
        self.reporting(args, run, Some(activity_function), doing).await
    }

    /// Runs `work`, reporting progress every second while the client listens, so that a client
    /// that gives up on a silent call after a while does not give up on a long one: `doing` and
    /// the elapsed seconds, with what the helper's `activity_function`, if any, says it is at.
    pub(crate) async fn reporting<T>(
        &self,
        args: &Arguments,
        work: impl Future<Output = T>,
        activity_function: Option<Entry>,
        doing: &str,
    ) -> T {
        const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
        const ACTIVITY_TIMEOUT: Duration = Duration::from_secs(5);
        tokio::pin!(work);
        let started = tokio::time::Instant::now();
        let mut ticker = tokio::time::interval_at(started + PROGRESS_INTERVAL, PROGRESS_INTERVAL);
        loop {
            tokio::select! {
                done = &mut work => return done,
                _ = ticker.tick(), if self.progress.is_enabled() => {
                    // A report without the activity is still progress: any failure to get it is ignored.
                    let activity = match activity_function {
                        Some(function) => self
                            .call_helper_within(args, Request::new(function), ACTIVITY_TIMEOUT, "")
                            .await
                            .ok()
                            .and_then(|reply| crate::swank::from_sexp::<Activity>(&reply).ok())
                            .and_then(|found| found.activity),
                        None => None,
                    };
                    let elapsed = started.elapsed().as_secs();
                    self.progress.report(match activity {
                        Some(activity) => format!("{doing} ({elapsed} s): {activity}"),
                        None => format!("{doing} ({elapsed} s)"),
                    });
                }
            }
        }
    }

    /// [`ToolContext::call_helper`] with a time limit of the tool's own.
    pub async fn call_helper_within(
        &self,
        args: &Arguments,
        request: Request,
        timeout: Duration,
        timeout_advice: &'static str,
    ) -> Result<Sexp, ToolError> {
        let image = self.image(args)?;
        let limits = CallLimits { timeout, timeout_advice, cancel: self.cancel.clone() };
        let reply = image.call_helper(request, &limits).await?;
        lisp_reply::check_failure(&reply)?;
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::{Activity, TOOLS};
    use crate::swank::{from_sexp, read};

    #[test]
    fn no_read_only_tool_takes_lisp_code() {
        for tool in TOOLS {
            let definition = &tool.definition;
            let code: Vec<&str> = definition.arguments.iter().filter(|p| p.is_code()).map(|p| p.name()).collect();
            assert!(
                !definition.read_only || code.is_empty(),
                "{} is read-only but takes Lisp code in {code:?}",
                definition.name
            );
        }
    }

    #[test]
    fn an_activity_reply_decodes_with_or_without_an_activity() {
        let at = |reply: &str| from_sexp::<Activity>(&read(reply).unwrap()).unwrap().activity;
        assert_eq!(at("(:activity \"compiling /a.lisp\")").as_deref(), Some("compiling /a.lisp"));
        assert_eq!(at("(:activity nil)"), None);
        assert!(from_sexp::<Activity>(&read("(:doing nil)").unwrap()).is_err());
    }
}
