//! The helper's Lisp source keeps its own rules (src/lisp/package.lisp, state.lisp, sbcl.lisp),
//! checked without an image: every entry says who calls it and that caller names it (swank-mcp's
//! `Entry` list, Emacs or a test), and what those call is defined; SBCL's
//! internals are named in sbcl.lisp only, and every one the other files ask for is listed there;
//! every mutex of the image's life is made in state.lisp.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use swank_mcp::image::Entry;

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

/// Each `(define-entry NAME ...)` or `(define-entry (NAME options...) ...)` of `source`, outside its
/// strings and comments: its name, lowercased as Lisp reads it, and the text of its options.
fn entries_in(source: &str) -> Vec<(String, String)> {
    let code = code_only(source);
    code.match_indices("(define-entry")
        .filter_map(|(at, opener)| {
            // `(define-entry-x` is another operator.
            let rest = code[at + opener.len()..].strip_prefix(char::is_whitespace)?.trim_start();
            let (rest, with_options) = match rest.strip_prefix('(') {
                Some(inner) => (inner.trim_start(), true),
                None => (rest, false),
            };
            let name: String = rest.chars().take_while(|c| !c.is_whitespace() && !"()".contains(*c)).collect();
            let after = &rest[name.len()..];
            let options = if with_options { after[..after.find(')').unwrap_or(after.len())].trim() } else { "" };
            (!name.is_empty()).then(|| (name.to_lowercase(), options.to_string()))
        })
        .collect()
}

/// Every entry of the helper's files: the file, the name and the text of its options.
fn entries() -> Vec<(String, String, String)> {
    lisp_files()
        .into_iter()
        .flat_map(|(file, text)| {
            entries_in(&text).into_iter().map(move |(name, options)| (file.clone(), name, options)).collect::<Vec<_>>()
        })
        .collect()
}

/// The entries `elisp` asks the image for through `swank-mcp--helper-call`, lowercased.
fn emacs_calls(elisp: &str) -> BTreeSet<String> {
    let call = "swank-mcp--helper-call \"";
    elisp
        .match_indices(call)
        .filter_map(|(at, _)| {
            let rest = &elisp[at + call.len()..];
            rest.find('"').map(|end| rest[..end].to_lowercase())
        })
        .collect()
}

/// The entries a test or a page of the docs calls by their qualified name, `(mcp-agent-helper:NAME`.
fn calls_by_hand(text: &str) -> BTreeSet<String> {
    let prefix = "(mcp-agent-helper:";
    text.match_indices(prefix)
        .map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            rest.chars().take_while(|c| !c.is_whitespace() && !"()\"".contains(*c)).collect::<String>().to_lowercase()
        })
        .collect()
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

/// The text of the Emacs package's files (`elisp-compat/swank-mcp*.el`, its ERT suite left out).
fn emacs_package_text() -> String {
    let mut text = String::new();
    for entry in fs::read_dir(repository().join("elisp-compat")).expect("elisp-compat lists") {
        let path = entry.expect("elisp-compat lists").path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if name.starts_with("swank-mcp") && name.ends_with(".el") && name != "swank-mcp-tests.el" {
            text.push_str(&fs::read_to_string(&path).expect("the package's files read"));
        }
    }
    text
}

#[test]
fn every_entry_says_who_calls_it_and_that_caller_names_it() {
    let emacs = emacs_calls(&emacs_package_text());
    let server: BTreeSet<String> = Entry::ALL.iter().map(|entry| entry.name().to_string()).collect();
    assert_eq!(server.len(), Entry::ALL.len(), "Entry::ALL names an entry twice");
    let mut by_hand = String::new();
    text_of_files_under(&repository().join("tests"), "rs", &mut by_hand);
    text_of_files_under(&repository().join("docs"), "md", &mut by_hand);
    let by_hand = calls_by_hand(&by_hand);

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
                ":server" => server.contains(name),
                ":emacs" => emacs.contains(name),
                ":person" => by_hand.contains(name),
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
    // And the other way: what swank-mcp (src/image/entry.rs) and Emacs call is defined.
    let defined: BTreeSet<&String> = entries.iter().map(|(_, name, _)| name).collect();
    for (caller, called) in [("Entry (src/image/entry.rs)", &server), ("the Emacs package (elisp-compat)", &emacs)] {
        for name in called.iter().filter(|name| !defined.contains(name)) {
            wrong.push(format!("{caller} calls {name}, which no (define-entry ...) in src/lisp defines"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_entry_finder_reads_both_forms_and_the_callers() {
    let lisp = "(define-entry evaluate (code &key package)\n  \"Not (define-entry fake ...), \\\"a (define-entry quoted)\\\".\"\n\
                (run code #\\\" #\\;))\n\
                ;; (define-entry commented-out ())\n\
                #| (define-entry in-a-block-comment ()) |#\n\
                (define-entry (describe-symbol :look t :caller :emacs) (name))\n\
                (define-entry-helper not-an-entry ())\n\
                (define-entry\n    (Status :caller (:server :emacs))\n  ())\n";
    let found: Vec<(String, Vec<String>)> =
        entries_in(lisp).into_iter().map(|(name, options)| (name, callers(&options))).collect();
    assert_eq!(
        found,
        [
            ("evaluate".to_string(), vec![]),
            ("describe-symbol".to_string(), vec![":emacs".to_string()]),
            ("status".to_string(), vec![":server".to_string(), ":emacs".to_string()]),
        ]
    );
    assert_eq!(
        emacs_calls("(swank-mcp--helper-call \"ACTIVITY-REPLY\" id) (swank-mcp--helper-call function)"),
        ["activity-reply".to_string()].into()
    );
    assert_eq!(calls_by_hand("eval(\"(mcp-agent-helper:handle-count {s:?})\")"), ["handle-count".to_string()].into());
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
            '#' if chars.peek() == Some(&'|') => {
                let mut last = ' ';
                for c in chars.by_ref() {
                    if c == '\n' {
                        code.push(c);
                    }
                    if last == '|' && c == '#' {
                        break;
                    }
                    last = c;
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
