//! The helper's Lisp source keeps its own rules (src/lisp/package.lisp, state.lisp, sbcl.lisp),
//! checked without an image: every entry says who calls it and that caller names it (swank-mcp's
//! `Entry` list, Emacs or a test), and what those call is defined; SBCL's
//! internals are named in sbcl.lisp only, and every one the other files ask for is listed there;
//! every mutex of the image's life is made in state.lisp.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use swank_mcp::image::helper::{BOOTSTRAP_SOURCE, HELPER_FILES, HELPER_PACKAGE};
use swank_mcp::image::Entry;

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The helper's files, as its load manifest lists them: not the bootstrap, which is sent on its
/// own before the helper exists, nor launch.lisp, the script that starts an image for `--launch`.
fn lisp_files() -> Vec<(String, String)> {
    HELPER_FILES
        .iter()
        .map(|name| {
            let path = repository().join("src/lisp").join(name);
            (name.to_string(), fs::read_to_string(&path).expect("a helper file reads"))
        })
        .collect()
}

/// The manifest is the one statement of the load order: every helper file of src/lisp is in it,
/// and no file states its place in the order again.
#[test]
fn every_helper_file_is_in_the_manifest_and_none_repeats_the_order() {
    let on_disk: BTreeSet<String> = fs::read_dir(repository().join("src/lisp"))
        .expect("src/lisp lists")
        .map(|entry| entry.expect("an entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".lisp") && name != "bootstrap.lisp" && name != "launch.lisp")
        .collect();
    let listed: BTreeSet<String> = HELPER_FILES.iter().map(|name| name.to_string()).collect();
    assert_eq!(listed.len(), HELPER_FILES.len(), "HELPER_FILES lists a file twice");
    assert_eq!(on_disk, listed, "src/lisp's helper files and HELPER_FILES (src/image/helper.rs) differ");
    let restating: Vec<String> =
        lisp_files().into_iter().filter(|(_, text)| text.contains("Loaded after")).map(|(name, _)| name).collect();
    assert!(
        restating.is_empty(),
        "these files state their place in the load order, which HELPER_FILES holds: {restating:?}"
    );
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
            let by_name = code.contains("(find-symbol \"") && (code.contains("\"sb-") || code.contains("'#:sb-"));
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

/// servers.lisp's ways to a server's insides by name, and the raw parts they find: the other
/// files ask servers.lisp's functions instead.
const SERVER_LOOKUPS: &[&str] = &[
    "server-symbol",
    "server-function",
    "backend-function",
    "found-function",
    "mailbox-registry",
    "server-backend",
    "server-implementation",
    "server-connection-variable",
    "server-send-counter",
    "server-reader-thread",
    "server-mailboxes",
    "*server-kinds*",
    "*server-encapsulations*",
];

/// Whether a piece of a symbol (between its colons and slashes) names swank, slynk or their
/// front ends, but for swank-mcp itself.
fn names_a_server(piece: &str) -> bool {
    let piece = piece.replace("swank-mcp", "");
    ["swank", "slynk", "slime"].iter().any(|name| piece.contains(name))
        || piece == "sly"
        || piece.starts_with("sly-")
        || piece.contains("-sly-")
        || piece.ends_with("-sly")
}

/// The symbol names servers.lisp looks up in the servers: its upper-case string literals.
fn names_looked_up(servers: &str) -> BTreeSet<String> {
    let code = code_only(servers);
    code.split('"')
        .skip(1)
        .step_by(2)
        .filter(|literal| {
            literal.len() > 2
                && literal.chars().any(|c| c.is_ascii_uppercase())
                && literal.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || "-*%./".contains(c))
        })
        .map(str::to_lowercase)
        .collect()
}

/// The lines of `text` (a helper file other than servers.lisp) that name a server or something of
/// theirs: the servers' names, servers.lisp's lookups by name (`SERVER_LOOKUPS`) or a name it looks
/// up, written as a string.
fn server_names_in(text: &str, looked_up: &BTreeSet<String>) -> Vec<String> {
    let symbol_char = |c: char| c.is_ascii_alphanumeric() || "-*%.+<>=!?&$:/".contains(c);
    code_only(text)
        .to_lowercase()
        .lines()
        .enumerate()
        .filter(|(_, code)| {
            let tokens: Vec<&str> = code.split(|c: char| !symbol_char(c)).filter(|t| !t.is_empty()).collect();
            let names_server = tokens.iter().flat_map(|token| token.split([':', '/'])).any(names_a_server);
            let looks_up = tokens.iter().any(|token| SERVER_LOOKUPS.contains(token));
            let literal = code.split('"').skip(1).step_by(2).any(|literal| looked_up.contains(literal));
            names_server || looks_up || literal
        })
        .map(|(number, code)| format!("{}: {}", number + 1, code.trim()))
        .collect()
}

#[test]
fn servers_lisp_alone_names_the_servers_and_their_insides() {
    let files = lisp_files();
    let servers = &files.iter().find(|(name, _)| name == "servers.lisp").expect("servers.lisp exists").1;
    let looked_up = names_looked_up(servers);
    assert!(
        looked_up.contains("*connections*") && looked_up.contains("compute-backtrace") && looked_up.contains("swank"),
        "{looked_up:?}"
    );
    let mut wrong = Vec::new();
    for (file, text) in files.iter().filter(|(name, _)| name != "servers.lisp") {
        wrong.extend(server_names_in(text, &looked_up).into_iter().map(|line| format!("{file}:{line}")));
    }
    assert!(
        wrong.is_empty(),
        "named outside servers.lisp, which is the only file to name the servers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_server_name_finder_sees_each_way_of_naming_them() {
    let looked_up: BTreeSet<String> = ["*connections*".to_string()].into();
    let lisp = "(find-package \"SWANK\")\n\
                (funcall 'slynk-backend:thread-id thread)\n\
                (server-function server \"ANYTHING\")\n\
                (find-symbol \"*CONNECTIONS*\" package)\n\
                (sb-thread:make-thread f :name \"swank-mcp worker\")\n\
                (defun person-first-connection (package default-connection))\n\
                ;; swank's own, in a comment\n\
                \"A docstring that names swank and SLY-DB.\"\n\
                (server-connections package)\n";
    assert_eq!(
        server_names_in(lisp, &looked_up),
        [
            "1: (find-package \"swank\")",
            "2: (funcall 'slynk-backend:thread-id thread)",
            "3: (server-function server \"anything\")",
            "4: (find-symbol \"*connections*\" package)",
        ]
    );
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

/// The text of every file of the Emacs package, `elisp-compat/*.el`.
fn emacs_sources() -> String {
    let mut text = String::new();
    text_of_files_under(&repository().join("elisp-compat"), "el", &mut text);
    assert!(text.contains("(provide 'swank-mcp)"), "elisp-compat/*.el were not read");
    text
}

/// The string literals of `text`, as written (Lisp and Emacs Lisp escape alike).
fn string_literals(text: &str) -> Vec<String> {
    let mut literals = Vec::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            ';' => {
                chars.by_ref().find(|c| *c == '\n');
            }
            '"' => {
                let mut literal = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => literal.extend(chars.next()),
                        '"' => break,
                        _ => literal.push(c),
                    }
                }
                literals.push(literal);
            }
            _ => {}
        }
    }
    literals
}

/// The helper's package is named by package.lisp's `defpackage`: every file of the helper and the
/// bootstrap works in it, swank-mcp sends its requests there (`HELPER_PACKAGE`), and Emacs asks for
/// it by that name.
#[test]
fn the_helper_s_package_has_one_name_in_lisp_rust_and_emacs() {
    let files = lisp_files();
    let package = &files.iter().find(|(name, _)| name == "package.lisp").expect("package.lisp exists").1;
    let defined = package
        .split("(defpackage #:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == ')').next())
        .expect("package.lisp defines the package")
        .to_uppercase();
    assert_eq!(HELPER_PACKAGE.to_uppercase(), defined, "HELPER_PACKAGE (src/image/helper.rs)");

    let mut wrong = Vec::new();
    let bootstrap = ("bootstrap.lisp".to_string(), BOOTSTRAP_SOURCE.to_string());
    for (file, text) in files.iter().chain([&bootstrap]) {
        // The files' own IN-PACKAGE, at the start of a line (systems.lisp reads those of ASDF's files).
        for rest in text.split("\n(in-package ").skip(1) {
            let named = rest.split(')').next().unwrap_or_default().trim_start_matches("#:").trim_matches('"');
            if named.to_uppercase() != defined {
                wrong.push(format!("{file} works in package {named}"));
            }
        }
    }
    let emacs: Vec<String> = string_literals(&emacs_sources())
        .into_iter()
        // Names, not the documentation's sentences.
        .filter(|literal| !literal.contains(char::is_whitespace))
        .filter(|literal| literal.to_uppercase().contains("AGENT-HELPER") || literal.eq_ignore_ascii_case(&defined))
        .collect();
    assert!(!emacs.is_empty(), "elisp-compat/*.el never names the helper's package {defined}");
    wrong.extend(emacs.iter().filter(|named| **named != defined).map(|named| format!("Emacs names {named:?}")));
    assert!(wrong.is_empty(), "the helper's package is {defined}, but:\n{}", wrong.join("\n"));
}
