//! The tools layer: one module per tool. Each builds its request, runs it (in the attached image
//! or, for source-file tools, in this process) and formats the reply as its contract says.
//! Nothing here knows about JSON-RPC; the MCP layer hands over a name, arguments and a
//! cancellation token and gets back a [`ToolOutput`].

pub mod apropos_search;
pub mod arguments;
pub mod class_info;
pub mod compile_form;
pub mod describe_symbol;
pub mod edit_lisp_form;
pub mod evaluate_lisp;
pub mod find_definition;
pub mod image;
pub mod launch;
pub mod lisp_check_parens;
pub mod lisp_outline;
pub mod lisp_reply;
pub mod lisp_status;
pub mod load_system;
pub mod macroexpand_form;
pub mod output;
pub mod progress;
pub mod xref;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::source::AllowedRoots;
use crate::swank::{Form, Sexp};

pub use arguments::{ArgumentError, Arguments};
use image::{CallLimits, Image};
pub use image::ImageSettings;
pub use output::{Annotations, ToolDefinition, ToolOutput};
pub use progress::{Progress, ProgressUpdate};

/// Every tool, with an `image` argument offered in the image tools' schemas when there are several.
fn all_definitions(images: &[Arc<Image>]) -> Vec<ToolDefinition> {
    let mut definitions = vec![
        evaluate_lisp::definition(),
        compile_form::definition(),
        macroexpand_form::definition(),
        class_info::definition(),
        describe_symbol::definition(),
        apropos_search::definition(),
        find_definition::definition(),
        xref::definition(),
        load_system::definition(),
        lisp_status::definition(),
        edit_lisp_form::definition(),
        lisp_check_parens::definition(),
        lisp_outline::definition(),
    ];
    if images.len() > 1 {
        let names: Vec<&str> = images.iter().map(|i| i.name()).collect();
        for definition in definitions.iter_mut().filter(|d| !SOURCE_TOOLS.contains(&d.name)) {
            if let Some(properties) = definition.input_schema.get_mut("properties").and_then(Value::as_object_mut) {
                properties.insert(
                    "image".into(),
                    serde_json::json!({
                        "type": "string",
                        "enum": names,
                        "description": format!("The Lisp image to work in (default: {}).", names[0]),
                    }),
                );
            }
        }
    }
    definitions
}

/// The optional `package` argument as the helper takes it: its name, or nil for the session's.
fn package_argument(args: &Arguments) -> Result<crate::swank::Form, ArgumentError> {
    use crate::swank::Form;
    Ok(args.optional_str("package")?.map_or(Form::Nil, Form::string))
}

/// The helper arguments of a tool that asks about one symbol, `{symbol, package?}`: the name as a
/// string (read in the image) and the package or nil.
fn symbol_request(args: &Arguments) -> Result<Vec<crate::swank::Form>, ArgumentError> {
    use crate::swank::Form;
    Ok(vec![
        Form::string(args.required_str("symbol")?),
        Form::Keyword("package"),
        package_argument(args)?,
    ])
}

/// Tools that work on files in this process and never touch an image.
const SOURCE_TOOLS: [&str; 3] = ["edit-lisp-form", "lisp-check-parens", "lisp-outline"];

/// Server-wide settings the tools read.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The time limit of an evaluation when the call gives none.
    pub eval_timeout: Duration,
    /// Characters kept of each output section; the image cuts the rest.
    pub max_output: usize,
}

/// Everything the tools share: settings, the images they work in, and the directories the
/// source tools may touch.
pub struct Toolbox {
    pub settings: Settings,
    images: Vec<Arc<Image>>,
    roots: AllowedRoots,
    /// The tools offered, built once: their schemas are too big to rebuild for every call.
    definitions: Vec<ToolDefinition>,
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
        let definitions = all_definitions(&images);
        Self { settings, images, roots, definitions }
    }

    /// Offers only the selected tools. An unknown name is an error that lists the known ones.
    pub fn select(mut self, selection: &ToolSelection) -> Result<Self, String> {
        if let Some(unknown) = selection.only.iter().find(|name| !self.definitions.iter().any(|d| d.name == name.as_str())) {
            let known: Vec<&str> = self.definitions.iter().map(|d| d.name).collect();
            return Err(format!("unknown tool {unknown:?} in --tools; the tools are: {}", known.join(", ")));
        }
        self.definitions.retain(|d| {
            (selection.only.is_empty() || selection.only.iter().any(|name| name == d.name))
                && (!selection.read_only || d.annotations.read_only)
        });
        Ok(self)
    }

    pub fn images(&self) -> &[Arc<Image>] {
        &self.images
    }

    /// The tools this server offers.
    pub fn definitions(&self) -> &[ToolDefinition] {
        &self.definitions
    }

    /// Runs tool `name`; `None` when there is no such tool.
    pub async fn call(self: &Arc<Self>, name: &str, arguments: Option<Value>, cancel: CancellationToken) -> Option<ToolOutput> {
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
        // A tool left out by --tools or --read-only does not exist for the client.
        if !self.definitions.iter().any(|d| d.name == name) {
            return None;
        }
        let args = match Arguments::from_value(arguments) {
            Ok(args) => args,
            Err(e) => return Some(e.into()),
        };
        // Source tools read and write files on this machine only; they never wait on the image,
        // but file I/O still belongs off the async workers.
        let source_tool: Option<fn(&Arguments, &AllowedRoots) -> ToolOutput> = match name {
            "edit-lisp-form" => Some(edit_lisp_form::call),
            "lisp-check-parens" => Some(lisp_check_parens::call),
            "lisp-outline" => Some(lisp_outline::call),
            _ => None,
        };
        if let Some(tool) = source_tool {
            return Some(self.source_tool(tool, args).await);
        }
        let context = ToolContext { toolbox: self.clone(), settings: self.settings.clone(), cancel, progress };
        // Each tool's future lives on the heap: inline, the call's future would be as large as
        // the largest tool's (some kilobytes), copied whenever a call is spawned or moved.
        let running: Pin<Box<dyn Future<Output = ToolOutput> + Send + '_>> = match name {
            "evaluate-lisp" => Box::pin(evaluate_lisp::call(&context, &args)),
            "compile-form" => Box::pin(compile_form::call(&context, &args)),
            "macroexpand-form" => Box::pin(macroexpand_form::call(&context, &args)),
            "class-info" => Box::pin(class_info::call(&context, &args)),
            "describe-symbol" => Box::pin(describe_symbol::call(&context, &args)),
            "apropos-search" => Box::pin(apropos_search::call(&context, &args)),
            "find-definition" => Box::pin(find_definition::call(&context, &args)),
            "xref" => Box::pin(xref::call(&context, &args)),
            "load-system" => Box::pin(load_system::call(&context, &args)),
            "lisp-status" => Box::pin(lisp_status::call(&context, &args)),
            _ => return None,
        };
        Some(running.await)
    }
}

impl Toolbox {
    async fn source_tool(self: &Arc<Self>, tool: fn(&Arguments, &AllowedRoots) -> ToolOutput, args: Arguments) -> ToolOutput {
        let toolbox = self.clone();
        tokio::task::spawn_blocking(move || tool(&args, &toolbox.roots))
            .await
            .unwrap_or_else(|e| ToolOutput::error(format!("The tool failed unexpectedly: {e}")))
    }
}

/// What one tool call sees: the shared toolbox, the call's own cancellation and where its
/// progress reports go.
pub struct ToolContext {
    toolbox: Arc<Toolbox>,
    pub settings: Settings,
    pub cancel: CancellationToken,
    pub progress: Progress,
}

impl ToolContext {
    /// The image named by the optional `image` argument, or the default image.
    pub fn image(&self, args: &Arguments) -> Result<Arc<Image>, ToolOutput> {
        let images = &self.toolbox.images;
        match args.optional_str("image")? {
            None => Ok(images[0].clone()),
            Some(name) => images.iter().find(|i| i.name() == name).cloned().ok_or_else(|| {
                let known: Vec<&str> = images.iter().map(|i| i.name()).collect();
                ToolOutput::error(format!("Unknown image {name:?}; the configured images are: {}.", known.join(", ")))
            }),
        }
    }

    /// Calls `function` of the helper in the image `args` names, within the server's evaluation
    /// time limit and with this call's cancellation, and checks the reply: a failure the helper
    /// reports (no such package, a Lisp error, a timeout) comes back as the output to return.
    pub async fn call_helper(&self, args: &Arguments, function: &'static str, request: Vec<Form>) -> Result<Sexp, ToolOutput> {
        let advice = "Start swank-mcp with a larger --eval-timeout if this needs longer.";
        self.call_helper_within(args, function, request, self.settings.eval_timeout, advice).await
    }

    /// [`ToolContext::call_helper`] with a time limit of the tool's own.
    pub async fn call_helper_within(
        &self,
        args: &Arguments,
        function: &'static str,
        request: Vec<Form>,
        timeout: Duration,
        timeout_advice: &'static str,
    ) -> Result<Sexp, ToolOutput> {
        let image = self.image(args)?;
        let limits = CallLimits { timeout, timeout_advice, cancel: self.cancel.clone() };
        let reply = image.call_helper(function, request, &limits).await.map_err(|e| ToolOutput::error(e.to_string()))?;
        lisp_reply::check_failure(&reply)?;
        Ok(reply)
    }
}
