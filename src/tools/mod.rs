//! The tools layer: one module per tool. Each builds its request, runs it (in the attached image
//! or, for source-file tools, in this process) and formats the reply as its contract says.
//! Nothing here knows about JSON-RPC; the MCP layer hands over a name, arguments and a
//! cancellation token and gets back a [`ToolOutput`].

pub mod arguments;
pub mod edit_lisp_form;
pub mod evaluate_lisp;
pub mod image;
pub mod launch;
pub mod lisp_check_parens;
pub mod lisp_outline;
pub mod lisp_reply;
pub mod output;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::source::AllowedRoots;

pub use arguments::{ArgumentError, Arguments};
use image::Image;
pub use image::ImageSettings;
pub use output::{Annotations, ToolDefinition, ToolOutput};

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
}

impl Toolbox {
    /// `images` must not be empty; the first one is the default.
    pub fn new(settings: Settings, images: Vec<ImageSettings>, roots: AllowedRoots) -> Self {
        assert!(!images.is_empty(), "at least one image is configured");
        Self { settings, images: images.into_iter().map(|s| Arc::new(Image::new(s))).collect(), roots }
    }

    pub fn images(&self) -> &[Arc<Image>] {
        &self.images
    }

    pub fn definitions(&self) -> Vec<ToolDefinition> {
        let mut definitions = vec![
            evaluate_lisp::definition(),
            edit_lisp_form::definition(),
            lisp_check_parens::definition(),
            lisp_outline::definition(),
        ];
        if self.images.len() > 1 {
            for definition in definitions.iter_mut().filter(|d| !SOURCE_TOOLS.contains(&d.name)) {
                self.offer_image_choice(definition);
            }
        }
        definitions
    }

    /// With several images, an image tool's schema names them, so the model knows what to pass.
    fn offer_image_choice(&self, definition: &mut ToolDefinition) {
        let names: Vec<&str> = self.images.iter().map(|i| i.name()).collect();
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

    /// Runs tool `name`; `None` when there is no such tool.
    pub async fn call(self: &Arc<Self>, name: &str, arguments: Option<Value>, cancel: CancellationToken) -> Option<ToolOutput> {
        let args = match Arguments::from_value(arguments) {
            Ok(args) => args,
            Err(e) => return self.definitions().iter().any(|d| d.name == name).then(|| e.into()),
        };
        let context = ToolContext { toolbox: self.clone(), settings: self.settings.clone(), cancel };
        let output = match name {
            "evaluate-lisp" => evaluate_lisp::call(&context, &args).await,
            // Source tools read and write files on this machine only; they never wait on the
            // image, but file I/O still belongs off the async workers.
            "edit-lisp-form" => self.source_tool(edit_lisp_form::call, args).await,
            "lisp-check-parens" => self.source_tool(lisp_check_parens::call, args).await,
            "lisp-outline" => self.source_tool(lisp_outline::call, args).await,
            _ => return None,
        };
        Some(output)
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

/// What one tool call sees: the shared toolbox and the call's own cancellation.
pub struct ToolContext {
    toolbox: Arc<Toolbox>,
    pub settings: Settings,
    pub cancel: CancellationToken,
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
}
