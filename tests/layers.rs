//! The layers docs/design.md draws are the layers the code has. design.md's "Layers" section lists
//! the folders of `src/` in their order; every `crate::` path in the code of every file of `src/`
//! (its comments and strings left out) must name its own layer, a layer on a later line of that
//! list, or one of the files of `src/` any layer may use (`outbox.rs`, `sync.rs`), which in turn
//! use no layer. `main.rs` and `lib.rs` alone may use them all: they wire the layers together.
//! A breach is named by its file and line.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

/// The files of `src/` that wire the layers together, and so may use any of them.
const WIRING: [&str; 2] = ["main.rs", "lib.rs"];

#[test]
fn every_crate_path_in_src_keeps_the_order_design_md_draws() {
    let design = fs::read_to_string(repository().join("docs/design.md")).expect("docs/design.md reads");
    let order = layer_order(&design).unwrap_or_else(|why| panic!("docs/design.md: {why}"));
    let src = repository().join("src");
    let files = rust_files(&src);
    let folders: BTreeSet<String> =
        files.iter().filter_map(|(path, _)| Some(path.split_once('/')?.0.to_string())).collect();
    let named: BTreeSet<String> = order.iter().flatten().cloned().collect();
    assert_eq!(folders, named, "the folders of src/ holding Rust, and the layers docs/design.md lists");
    let breaches = breaches(&order, &files);
    assert!(breaches.is_empty(), "uses against docs/design.md's order of layers:\n{}", breaches.join("\n"));
}

/// The server's instructions and the tools' descriptions come from the tools: the MCP layer writes
/// them in the protocol's shape, and neither it nor the pipeline names a tool itself, so a tool can
/// be renamed, added or left out without them.
#[test]
fn neither_the_mcp_layer_nor_the_pipeline_names_a_tool() {
    let toolbox = common::toolbox(common::dead_port());
    let tools: Vec<&str> = toolbox.definitions().map(|tool| tool.name).collect();
    assert!(!tools.is_empty());
    let mut named = Vec::new();
    for (path, text) in rust_files(&repository().join("src")) {
        if !path.starts_with("mcp/") && !path.starts_with("pipeline/") {
            continue;
        }
        for (line, literal) in blank(&text).1 {
            named.extend(
                tools.iter().filter(|tool| names(&literal, tool)).map(|tool| format!("src/{path}:{line}: {tool}")),
            );
        }
    }
    assert!(named.is_empty(), "tools named outside the tools layer:\n{}", named.join("\n"));
}

#[test]
fn a_use_against_the_order_is_named_by_file_and_line() {
    let order = layer_order(
        "# Design\n\n## Layers\n\nThe order:\n\n1. `mcp`, `emacs`: front ends\n2. `pipeline`: one call\n3. `tools`\n\n## Next\n\n4. `image`\n",
    )
    .unwrap();
    assert_eq!(order, [vec!["mcp", "emacs"], vec!["pipeline"], vec!["tools"]]);
    let file = |path: &str, text: &str| (path.to_string(), text.to_string());
    let files = [
        file(
            "pipeline/approval.rs",
            "//! Knows [`crate::emacs`] by name only.\nuse crate::tools::Toolbox;\n\nuse crate::emacs::approval::Emacs;\n",
        ),
        file("pipeline/mod.rs", "use crate::{sync::lock, tools::{A, B}, mcp::Server};\n"),
        file("emacs/activity.rs", "fn f() -> crate::mcp::X { todo!() }\nconst S: &str = \"crate::mcp\";\n"),
        file("tools/mod.rs", "macro_rules! m { () => { $crate::pipeline::Call } }\nlet c = '\"'; use crate::image;\n"),
        file("mcp/server.rs", "use crate::pipeline::Pipeline; /* crate::emacs */ use crate::emacs::Feed;\n"),
        file("sync.rs", "use crate::tools::Toolbox;\n"),
        file("outbox.rs", "use crate::sync::lock;\n"),
        file("main.rs", "use crate::emacs::approval::Emacs;\n"),
    ];
    let found = breaches(&order, &files);
    assert_eq!(
        found,
        [
            "src/pipeline/approval.rs:4: pipeline uses emacs, which is not below it in docs/design.md's order",
            "src/pipeline/mod.rs:1: pipeline uses mcp, which is not below it in docs/design.md's order",
            "src/emacs/activity.rs:1: emacs uses mcp, which is not below it in docs/design.md's order",
            "src/tools/mod.rs:2: tools uses image, which is neither a layer docs/design.md lists nor a file of src/",
            "src/mcp/server.rs:1: mcp uses emacs, which is not below it in docs/design.md's order",
            "src/sync.rs:1: sync.rs, which any layer may use, uses the layer tools",
        ]
    );
}

#[test]
fn a_tool_is_named_only_as_a_word_of_its_own() {
    assert!(names("run evaluate-lisp again", "evaluate-lisp"));
    assert!(names("\"inspect\"", "inspect"));
    assert!(!names("the inspector", "inspect"));
    assert!(!names("load-file-list", "load-file"));
    assert!(!names("my_undo", "undo"));
}

#[test]
fn design_md_without_the_order_is_an_error() {
    assert!(layer_order("## Layers\n\nNo list here.\n\n## One call\n\n1. `mcp`\n").is_err());
    assert!(layer_order("## One call\n\n1. `mcp`\n").is_err());
    assert!(layer_order("## Layers\n\n1. `mcp`\n2. `mcp`\n").is_err());
}

/// The numbered list of design.md's "Layers" section: each line's layers, in order.
fn layer_order(design: &str) -> Result<Vec<Vec<String>>, String> {
    let design = format!("\n{design}");
    let section =
        design.split("\n## ").find(|section| section.starts_with("Layers\n")).ok_or("no \"## Layers\" section")?;
    let mut order: Vec<Vec<String>> = Vec::new();
    for line in section.lines() {
        let Some((number, rest)) = line.split_once(". ") else { continue };
        if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let names = rest.split_once(':').map_or(rest, |(names, _)| names);
        let layers: Vec<String> =
            names.split(',').map(|name| name.trim().trim_matches('`').to_string()).filter(|n| !n.is_empty()).collect();
        if let Some(twice) = layers.iter().find(|layer| order.iter().flatten().any(|seen| seen == *layer)) {
            return Err(format!("the layer {twice} is listed twice"));
        }
        order.push(layers);
    }
    if order.is_empty() {
        return Err("the \"Layers\" section has no numbered list of the layers".to_string());
    }
    Ok(order)
}

/// Every `crate::` path of `files` (paths under `src/`, with their text) that goes against
/// `order`, as `src/FILE:LINE: what`.
fn breaches(order: &[Vec<String>], files: &[(String, String)]) -> Vec<String> {
    let rank: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .flat_map(|(rank, layers)| layers.iter().map(move |layer| (layer.as_str(), rank)))
        .collect();
    // The files of `src/` beside the layers, which any layer may use, as modules.
    let shared: BTreeSet<&str> = files
        .iter()
        .filter(|(path, _)| !path.contains('/') && !WIRING.contains(&path.as_str()))
        .filter_map(|(path, _)| path.strip_suffix(".rs"))
        .collect();
    let mut found = Vec::new();
    for (path, text) in files {
        if WIRING.contains(&path.as_str()) {
            continue;
        }
        let layer = path.split_once('/').map(|(layer, _)| layer);
        for (line, used) in crate_paths(&blank(text).0) {
            let breach = match (layer, rank.get(used.as_str())) {
                (Some(layer), _) if layer == used => None,
                (_, None) if shared.contains(used.as_str()) => None,
                (Some(layer), Some(&used_rank)) => match rank.get(layer) {
                    Some(&own) if own < used_rank => None,
                    _ => Some(format!("{layer} uses {used}, which is not below it in docs/design.md's order")),
                },
                (Some(layer), None) => Some(format!(
                    "{layer} uses {used}, which is neither a layer docs/design.md lists nor a file of src/"
                )),
                (None, _) => Some(format!("{path}, which any layer may use, uses the layer {used}")),
            };
            found.extend(breach.map(|breach| format!("src/{path}:{line}: {breach}")));
        }
    }
    found
}

/// The module each `crate::` path of `code` starts with, and its line (from 1). `crate::{a::X,
/// b}` is a path into `a` and one into `b`; a macro's `$crate::` is not a path of this file's.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut paths = Vec::new();
    for (at, _) in code.match_indices("crate") {
        if code[..at].ends_with(|c: char| ident(c) || c == '$') {
            continue;
        }
        let Some(rest) = code[at + "crate".len()..].trim_start().strip_prefix("::") else { continue };
        let rest = rest.trim_start();
        let start = code.len() - rest.len();
        match rest.strip_prefix('{') {
            Some(group) => {
                let mut depth = 0;
                let mut item_start = true;
                for (offset, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => item_start = true,
                        c if item_start && ident(c) => {
                            let name: String = group[offset..].chars().take_while(|&c| ident(c)).collect();
                            paths.push((line_of(start + 1 + offset), name));
                            item_start = false;
                        }
                        _ => {}
                    }
                }
            }
            None => {
                let name: String = rest.chars().take_while(|&c| ident(c)).collect();
                if !name.is_empty() {
                    paths.push((line_of(start), name));
                }
            }
        }
    }
    paths
}

/// `source` with its comments and the insides of its string and character literals blanked
/// (lines kept), and the string literals with their lines.
fn blank(source: &str) -> (String, Vec<(usize, String)>) {
    let chars: Vec<char> = source.chars().collect();
    let mut code = String::with_capacity(source.len());
    let mut literals = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Keeps line breaks, so that lines keep their numbers.
    fn skip(code: &mut String, line: &mut usize, c: char) {
        if c == '\n' {
            *line += 1;
            code.push('\n');
        } else {
            code.push(' ');
        }
    }
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    skip(&mut code, &mut line, chars[i]);
                    i += 1;
                }
            }
        } else if c == '"'
            || (c == 'r' && raw_string_at(&chars, i) && (i == 0 || !ident(chars[i - 1]) || chars[i - 1] == 'b'))
        {
            let (start_line, mut text) = (line, String::new());
            let hashes = if c == 'r' {
                let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
                i += 1 + hashes;
                Some(hashes)
            } else {
                None
            };
            code.push('"');
            i += 1;
            while i < chars.len() {
                let c = chars[i];
                if c == '\\' && hashes.is_none() {
                    text.push(c);
                    skip(&mut code, &mut line, c);
                    if let Some(&escaped) = chars.get(i + 1) {
                        text.push(escaped);
                        skip(&mut code, &mut line, escaped);
                    }
                    i += 2;
                    continue;
                }
                if c == '"' && chars[i + 1..].iter().take_while(|&&c| c == '#').count() >= hashes.unwrap_or(0) {
                    i += 1 + hashes.unwrap_or(0);
                    break;
                }
                text.push(c);
                skip(&mut code, &mut line, c);
                i += 1;
            }
            code.push('"');
            literals.push((start_line, text));
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character literal; otherwise a lifetime, which is code.
            code.push('\'');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
                code.push(' ');
            }
            code.push('\'');
            i += 1;
        } else {
            if c == '\n' {
                line += 1;
            }
            code.push(c);
            i += 1;
        }
    }
    (code, literals)
}

/// Whether a raw string (`r"`, `r#"`, ...) starts at `chars[at]`, which is `r`.
fn raw_string_at(chars: &[char], at: usize) -> bool {
    let hashes = chars[at + 1..].iter().take_while(|&&c| c == '#').count();
    chars.get(at + 1 + hashes) == Some(&'"')
}

/// Whether `text` names the tool `tool`: as a word of its own, not inside a longer name.
fn names(text: &str, tool: &str) -> bool {
    let part_of_a_name = |c: char| c.is_alphanumeric() || c == '-' || c == '_';
    text.match_indices(tool)
        .any(|(at, _)| !text[..at].ends_with(part_of_a_name) && !text[at + tool.len()..].starts_with(part_of_a_name))
}

/// Every `.rs` file under `dir`, as its path from `dir` (with `/`) and its text.
fn rust_files(dir: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in fs::read_dir(&folder).expect("src/ reads") {
            let path = entry.expect("src/ reads").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let relative = path.strip_prefix(dir).expect("under src/").to_string_lossy().replace('\\', "/");
                files.push((relative, fs::read_to_string(&path).expect("a source file reads")));
            }
        }
    }
    files.sort();
    files
}

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
