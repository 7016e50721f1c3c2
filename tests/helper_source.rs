//! The helper's Lisp source keeps its own rules (src/lisp/package.lisp, state.lisp, sbcl.lisp),
//! checked without an image: every entry says who calls it and that caller names it; SBCL's
//! internals are named in sbcl.lisp only, and every one the other files ask for is listed there;
//! every mutex of the image's life is made in state.lisp.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The helper's files, but the bootstrap, which is sent on its own before the helper exists.
fn lisp_files() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = fs::read_dir(repository().join("src/lisp"))
        .expect("src/lisp lists")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "lisp"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read_to_string(&path).expect("a helper file reads"))
        })
        .filter(|(name, _)| name != "bootstrap.lisp")
        .collect();
    files.sort();
    files
}

fn text_of_files_under(directory: &Path, extension: &str, into: &mut String) {
    for entry in fs::read_dir(directory).expect("the directory lists") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            text_of_files_under(&path, extension, into);
        } else if path.extension().is_some_and(|e| e == extension) {
            into.push_str(&fs::read_to_string(&path).expect("a source file reads"));
        }
    }
}

/// Each `(define-entry NAME ...` or `(define-entry (NAME options...) ...`: its name and the text
/// of its options.
fn entries() -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for (file, text) in lisp_files() {
        for (at, _) in text.match_indices("(define-entry ") {
            let rest = &text[at + "(define-entry ".len()..];
            if file == "package.lisp" && !rest.starts_with('(') {
                continue; // the macro's own definition
            }
            let (name, options) = match rest.strip_prefix('(') {
                Some(inner) => {
                    let inner = &inner[..inner.find(')').expect("the options close")];
                    let (name, options) = inner.split_once(' ').unwrap_or((inner, ""));
                    (name.to_string(), options.to_string())
                }
                None => (rest.split_whitespace().next().unwrap_or_default().to_string(), String::new()),
            };
            found.push((file.clone(), name, options));
        }
    }
    found
}

/// The callers an entry's options declare: `:caller :server` or `:caller (:server :emacs)`.
fn callers(options: &str) -> Vec<String> {
    let Some(after) = options.split(":caller ").nth(1) else { return Vec::new() };
    let value = if let Some(list) = after.strip_prefix('(') {
        &list[..list.find(')').unwrap_or(list.len())]
    } else {
        after.split_whitespace().next().unwrap_or_default()
    };
    value.split_whitespace().map(str::to_string).collect()
}

#[test]
fn every_entry_says_who_calls_it_and_that_caller_names_it() {
    let emacs = fs::read_to_string(repository().join("elisp-compat/swank-mcp.el")).expect("swank-mcp.el reads");
    let mut rust = String::new();
    text_of_files_under(&repository().join("src"), "rs", &mut rust);
    let rust = rust.to_lowercase();
    let mut by_hand = String::new();
    text_of_files_under(&repository().join("tests"), "rs", &mut by_hand);
    text_of_files_under(&repository().join("docs"), "md", &mut by_hand);

    let entries = entries();
    assert!(entries.len() > 50, "the entries were not found: {entries:?}");
    let mut wrong = Vec::new();
    for (file, name, options) in &entries {
        let callers = callers(options);
        if callers.is_empty() {
            wrong.push(format!("{file}: {name} says no :caller"));
        }
        for caller in &callers {
            let named = match caller.as_str() {
                ":server" => rust.contains(&format!("\"{name}\"")),
                ":emacs" => emacs.contains(&format!("\"{}\"", name.to_uppercase())),
                ":person" => by_hand.contains(&format!("mcp-agent-helper:{name}")),
                other => {
                    wrong.push(format!("{file}: {name} has the unknown caller {other}"));
                    continue;
                }
            };
            if !named {
                wrong.push(format!("{file}: {name} is marked {caller}, which never names it"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_entry_finder_reads_both_forms_and_the_callers() {
    assert_eq!(callers(":caller :server :look t"), [":server"]);
    assert_eq!(callers(":caller (:server :emacs)"), [":server", ":emacs"]);
    assert!(callers(":look t").is_empty());
}

/// The keywords sbcl.lisp's table lists: each entry starts `(:name "SB-`.
fn listed_internals(sbcl: &str) -> BTreeSet<String> {
    sbcl.lines()
        .filter_map(|line| line.trim_start().strip_prefix("(:"))
        .filter_map(|rest| rest.split_once(" \"SB-"))
        .map(|(name, _)| format!(":{name}"))
        .collect()
}

/// TEXT with its strings and comments blanked (newlines kept, so lines keep their numbers): what
/// the code names, not what its documentation mentions. The strings a lookup by name is given are
/// kept, since they name what the code finds.
fn code_only(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '#' if chars.peek() == Some(&'\\') => {
                code.push(c);
                code.extend(chars.next());
                code.extend(chars.next());
            }
            ';' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        code.push(c);
                        break;
                    }
                }
            }
            '"' => {
                let mut literal = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => literal.push(c),
                    }
                }
                let short = !literal.contains(char::is_whitespace);
                code.push('"');
                code.extend(literal.chars().map(|c| if c == '\n' || short { c } else { ' ' }));
                code.push('"');
            }
            _ => code.push(c),
        }
    }
    code
}

#[test]
fn sbcl_internals_are_named_in_sbcl_lisp_only_and_all_listed_there() {
    let files = lisp_files();
    let sbcl = &files.iter().find(|(name, _)| name == "sbcl.lisp").expect("sbcl.lisp exists").1;
    let listed = listed_internals(sbcl);
    assert!(listed.len() > 60 && listed.contains(":top-frame"), "{listed:?}");

    let mut wrong = Vec::new();
    for (file, text) in files.iter().filter(|(name, _)| name != "sbcl.lisp") {
        let lower = code_only(text).to_lowercase();
        for (number, code) in lower.lines().enumerate() {
            let internal = code.match_indices("sb-").any(|(at, _)| {
                let rest = &code[at..];
                let package_end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(rest.len());
                rest[package_end..].starts_with("::")
            });
            let by_name = code.contains("(existing-symbols \"sb-")
                || (code.contains("(find-symbol \"") && (code.contains("\"sb-") || code.contains("'#:sb-")));
            if internal || by_name {
                wrong.push(format!("{file}:{}: {}", number + 1, code.trim()));
            }
        }
        for asker in ["(sbcl-call ", "(sbcl-symbol ", "(needed-internal ", "(sbcl-symbols ", "(context-slot context "] {
            for (at, _) in text.match_indices(asker) {
                let names = &text[at + asker.len()..];
                let names = &names[..names.find(')').unwrap_or(names.len())];
                let keywords = names.split_whitespace().take_while(|word| word.starts_with(':'));
                for keyword in keywords.take(if asker == "(sbcl-symbols " { usize::MAX } else { 1 }) {
                    if !listed.contains(keyword) {
                        wrong.push(format!("{file}: {keyword} is not in sbcl.lisp's *SBCL-INTERNALS*"));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "SBCL internals named outside sbcl.lisp:\n{}", wrong.join("\n"));
}

#[test]
fn every_mutex_of_the_image_s_life_is_made_in_state_lisp() {
    let mut wrong = Vec::new();
    for (file, text) in lisp_files().iter().filter(|(name, _)| name != "state.lisp") {
        for (number, line) in text.lines().enumerate() {
            // An object's own mutex is made with it, as its slot's initform.
            if line.contains("make-mutex") && !line.contains(":initform (sb-thread:make-mutex") {
                wrong.push(format!("{file}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    assert!(wrong.is_empty(), "mutexes made outside state.lisp:\n{}", wrong.join("\n"));
}
