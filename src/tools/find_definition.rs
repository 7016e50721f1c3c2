//! `find-definition`: where each definition of one or several symbols is, as file:line:column,
//! and with `source` each definition's text as its file has it now.
//!
//! See docs/design.md, "The toolbox".

use serde::Deserialize;
use serde_json::{json, Value};

use super::image_sources::roots_holding;
use super::text_search::Search;
use super::lisp_reply::{decode, labelled_locations_json, plural, render_locations, Location};
use super::arguments::arguments;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolError, ToolOutput, ToolResult};
use std::collections::HashMap;
use std::path::Path;

use super::LARGE_FILE;
use crate::source::{locate_definition, locate_definition_by_other_definers, top_level_form_at, AllowedRoots};
use crate::image::{Entry, Request};

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "find-definition",
        arguments: Args::PARAMS,
        read_only: true,
        description: "Where symbols (space-separated) are defined, file:line:column; or the definitions holding text, \
            in system's files or the roots'. source: true gives their text. system alone lists its files.",
    },
    |context, args| Box::pin(call(context, args)),
);

/// The most definitions one reply holds.
pub const MAX_DEFINITIONS: u64 = 2_000;
/// The definitions a reply holds when the call gives no `limit`.
pub const DEFAULT_DEFINITIONS: u64 = 50;

arguments! {
    /// The arguments as the tool reads them (and, without `symbol`, its text search).
    struct Args {
        symbol: Option<String>,
        text: Option<String>,
        system: Option<String>,
        source: bool,
        package: Option<String>,
        offset: Option<u64>,
        limit: Option<u64> => at_least(1).at_most(MAX_DEFINITIONS),
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let typed: Args = args.typed()?;
    let searching = typed.text.is_some() || typed.system.is_some();
    match &typed.symbol {
        Some(_) if searching => {
            return Err(ToolError::new(
                "Give `symbol` to find where symbols are defined, or `text` (and `system`) to find the forms \
                 holding it; not both.",
            ))
        }
        None if !searching => {
            return Err(ToolError::new(
                "Give `symbol`, `text` (the forms holding it) or `system` (its files); find-definition got none.",
            ))
        }
        None => {
            let search = Search {
                text: typed.text,
                system: typed.system,
                source: typed.source,
                offset: typed.offset.unwrap_or(0) as usize,
                limit: typed.limit.unwrap_or(DEFAULT_DEFINITIONS) as usize,
            };
            return super::text_search::call(context, args, search).await;
        }
        Some(_) => {}
    }
    let Args { symbol, source: with_source, package, offset, limit, .. } = typed;
    let (offset, limit) = (offset.unwrap_or(0), limit.unwrap_or(DEFAULT_DEFINITIONS));
    let names = symbol_names(symbol.as_deref().unwrap_or_default());
    if names.is_empty() {
        return Err(ToolError::new("Argument `symbol` names no symbol: give one, or several separated by spaces."));
    }
    // Each symbol is asked on its own: one that names nothing does not hide the others.
    let mut found: Vec<Result<Definitions, ToolError>> = Vec::new();
    for name in &names {
        let request = Request::new(Entry::FIND_DEFINITION)
            .arg(name.as_str())
            .key("package", package.as_deref())
            .key("offset", offset)
            .key("limit", limit);
        let reply = context.call_helper(args, request).await;
        found.push(reply.and_then(|reply| decode::<Definitions>("find-definition", &reply)));
    }
    // A definition's text is read where lisp-outline may read: under the roots, or in the
    // directory of a system the image knows.
    let mut system_roots = HashMap::new();
    if with_source {
        for definitions in found.iter().flatten() {
            for file in definitions.definitions.iter().filter_map(|d| d.source.file.clone()) {
                if let std::collections::hash_map::Entry::Vacant(entry) = system_roots.entry(file) {
                    let roots = roots_holding(context, entry.key()).await?;
                    entry.insert(roots);
                }
            }
        }
    }
    let found = context
        .on_files(move |roots| {
            let mut texts = CurrentTexts::new(roots);
            texts.system_roots = system_roots;
            Ok(found
                .into_iter()
                .map(|definitions| {
                    definitions.map(|mut definitions| {
                        definitions.relocate_changed(&mut texts, with_source);
                        definitions
                    })
                })
                .collect::<Vec<_>>())
        })
        .await?;
    if let [one] = found.as_slice() {
        let definitions = one.clone()?;
        return Ok(ToolOutput::success(definitions.render(offset)).with_structured(definitions.structured(offset)));
    }
    let texts: Vec<String> = found
        .iter()
        .map(|definitions| match definitions {
            Ok(definitions) => definitions.render(offset),
            Err(error) => error.0.clone(),
        })
        .collect();
    let structured: Vec<Value> = found
        .iter()
        .zip(&names)
        .map(|(definitions, name)| match definitions {
            Ok(definitions) => definitions.structured(offset),
            Err(error) => json!({"symbol": name, "error": error.0}),
        })
        .collect();
    let failed = found.iter().all(Result::is_err);
    Ok(ToolOutput::new(texts.join("\n\n"), failed).with_structured(json!({ "symbols": structured })))
}

/// The symbols `text` names, separated by blank space (inside `|...|` a blank is part of the
/// name).
fn symbol_names(text: &str) -> Vec<String> {
    let (mut in_bars, mut escaped) = (false, false);
    split_where(text, |c| {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '|' => in_bars = !in_bars,
            c if c.is_whitespace() && !in_bars => return true,
            _ => {}
        }
        false
    })
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Definitions {
    pub symbol: String,
    /// What the symbol names, for the case where SBCL recorded no definition of it.
    pub names: Vec<String>,
    /// How many definitions there are in all; `definitions` is the page asked for.
    pub total: u64,
    pub definitions: Vec<Definition>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Definition {
    /// "function", "method (CIRCLE)", ...
    pub kind: String,
    pub source: Location,
    /// With `source`: the definition's text as its file has it now, when it was found there.
    #[serde(skip)]
    pub text: Option<String>,
    /// With `source`: the file as the reply names it, relative to the first root when it is
    /// under it (as `file_path` takes it), with the text's line and column.
    #[serde(skip)]
    pub shown: Option<String>,
}

/// The note of a definition found again in the file's current text.
const RELOCATED: &str = "the file changed since this was compiled; found in its current text";

impl Definitions {
    /// Checks each definition in a file under an allowed root against the file's current text
    /// (see [`CurrentTexts::relocate`]), and with `with_source` takes its text from there.
    fn relocate_changed(&mut self, texts: &mut CurrentTexts, with_source: bool) {
        for definition in &mut self.definitions {
            let span = texts.relocate_labelled(&mut definition.source, &definition.kind, &self.symbol);
            if with_source {
                definition.text = texts.text_of(&definition.source, span);
                definition.shown = texts.shown(&definition.source);
            }
        }
    }

    fn labelled(&self) -> Vec<(&str, &Location)> {
        self.definitions.iter().map(|d| (d.kind.as_str(), &d.source)).collect()
    }

    /// Where the next page starts, if there is one.
    fn next_offset(&self, offset: u64) -> Option<u64> {
        let shown_to = offset.saturating_add(self.definitions.len() as u64);
        (shown_to < self.total).then_some(shown_to)
    }

    pub fn render(&self, offset: u64) -> String {
        if self.total == 0 {
            return match self.names.as_slice() {
                [] => format!("{} has no definitions: it names nothing.", self.symbol),
                names => {
                    format!("{} names a {}, but SBCL recorded no source for it.", self.symbol, names.join(" and a "))
                }
            };
        }
        let count = plural(self.total, "definition", "definitions");
        let next = self.next_offset(offset);
        if self.definitions.is_empty() {
            return format!("{}: {count}; none from offset {offset}.", self.symbol);
        }
        let page = if offset > 0 || next.is_some() {
            format!(", {} to {}", offset + 1, offset + self.definitions.len() as u64)
        } else {
            String::new()
        };
        let with_source = self.definitions.iter().any(|d| d.text.is_some());
        let mut text = match (with_source, self.definitions.as_slice()) {
            (false, _) => format!("{}: {count}{page}\n{}", self.symbol, render_locations(&self.labelled())),
            // One definition: its place, then its text.
            (true, [only]) if self.total == 1 => format!("{}: {}", self.symbol, only.with_source()),
            (true, definitions) => {
                let each: Vec<String> = definitions.iter().map(Definition::with_source).collect();
                format!("{}: {count}{page}\n{}", self.symbol, each.join("\n"))
            }
        };
        if let Some(next) = next {
            text.push_str(&format!("\n... {} more; use `offset: {next}` for the next page.", self.total - next));
        }
        text
    }

    pub fn structured(&self, offset: u64) -> Value {
        let mut definitions = labelled_locations_json(&self.labelled(), "kind");
        for (json, definition) in definitions.iter_mut().zip(&self.definitions) {
            if let Some(text) = &definition.text {
                json["text"] = json!(text);
            }
        }
        json!({
            "symbol": self.symbol,
            "total": self.total,
            "offset": offset,
            "next_offset": self.next_offset(offset),
            "definitions": definitions,
        })
    }
}

impl Definition {
    /// `function at /src/a.lisp:3:1`, then its text on the lines after.
    fn with_source(&self) -> String {
        match (&self.text, &self.shown) {
            (Some(text), Some(shown)) => format!("{} at {shown}\n{text}", self.kind),
            (Some(text), None) => format!("{} at {}\n{text}", self.kind, self.source),
            (None, _) if self.source.file.is_none() => format!("{}: {}", self.kind, self.source),
            (None, _) => format!("{} at {} (its text was not found there)", self.kind, self.source),
        }
    }
}

/// The current text of the files definitions are in, each read once, to find the definitions in.
pub(crate) struct CurrentTexts<'a> {
    roots: &'a AllowedRoots,
    /// Files outside `roots` that may be read, with the roots to read each under (a system's
    /// directory the image knows).
    pub(crate) system_roots: HashMap<String, AllowedRoots>,
    texts: HashMap<String, Option<Vec<u8>>>,
}

impl<'a> CurrentTexts<'a> {
    pub(crate) fn new(roots: &'a AllowedRoots) -> Self {
        CurrentTexts { roots, system_roots: HashMap::new(), texts: HashMap::new() }
    }

    /// The text of `file`, read once, or `None` when it cannot be read.
    /// Takes `text`, which the caller read from `file`, as its current text: places found in it
    /// are then places in those bytes, and the file is not read again.
    pub(crate) fn hold(&mut self, file: &str, text: Vec<u8>) {
        self.texts.insert(file.to_string(), Some(text));
    }

    fn current(&mut self, file: &str) -> Option<&[u8]> {
        let roots = self.system_roots.get(file).unwrap_or(self.roots);
        self.texts
            .entry(file.to_string())
            .or_insert_with(|| roots.read(Path::new(file), Some((LARGE_FILE, ""))).ok().map(|f| f.bytes))
            .as_deref()
    }

    /// Checks a definition made by one of `operators` and named `form_name` (as `edit-lisp-form`
    /// takes it), in a file under an allowed root, against the file's current text: SBCL records
    /// where it was when compiled (and, for one inside a `progn` or behind `#+`, the top-level
    /// form), so after an edit, or inside a wrapper, the line is found in the text as it is now.
    /// Returns where the form is in that text, start and end, when it was found there.
    pub(crate) fn relocate(
        &mut self,
        source: &mut Location,
        operators: &[&str],
        form_name: &str,
    ) -> Option<(usize, usize)> {
        let (Some(file), Some(line), Some(column)) = (source.file.clone(), source.line, source.column) else {
            return None;
        };
        // A slot accessor is made by its DEFCLASS, which SBCL records as its place.
        let class = source.made_by.as_ref().map(|made_by| made_by.class.clone());
        let (operators, form_name) = match &class {
            Some(class) => (&["defclass"][..], class.as_str()),
            None => (operators, form_name),
        };
        let text = self.current(&file)?;
        let recorded = (line as usize, column as usize);
        let mut places = locate_definition(text, operators, form_name);
        if places.is_empty() && !operators.contains(&"defmethod") {
            // Made by a defining form of its own (`define-modify-macro appendf`), which no
            // operator of its kind names.
            places = locate_definition_by_other_definers(text, form_name);
        }
        let changed = source.note.as_deref().is_some_and(|note| note.contains("changed"));
        if let Some(place) = places.iter().find(|place| place.at == recorded) {
            if changed {
                source.note = Some(RELOCATED.to_string());
            }
            Some(place.span)
        } else if let Some(place) = places.iter().find(|place| place.top_level == recorded) {
            (source.line, source.column) = (Some(place.at.0 as u64), Some(place.at.1 as u64));
            if changed {
                source.note = Some(RELOCATED.to_string());
            }
            Some(place.span)
        } else if let Some(place) = places.first().filter(|_| changed || !names_at(text, recorded, form_name)) {
            // Only a changed file moves a definition: one whose write date is the one SBCL
            // recorded (SBCL's dates count seconds) changed only if the form recorded there no
            // longer names it; a macro's form that makes the definition does, and stays.
            (source.line, source.column) = (Some(place.at.0 as u64), Some(place.at.1 as u64));
            source.note = Some(RELOCATED.to_string());
            Some(place.span)
        } else {
            // SBCL's offset read against text that changed falls wherever that text is now,
            // inside another form as often as not: that is no line of this definition. Only a
            // form at the recorded place that names it (a macro's that made it) holds it still.
            if !names_at(text, recorded, form_name) && (changed || !starts_top_level_form(text, recorded)) {
                (source.line, source.column) = (None, None);
                source.note = Some(format!(
                    "{}no definition of `{form_name}` is in the file now (by {} or another defining form; deleted \
                     or renamed?)",
                    if changed { "the file changed since this was compiled, and " } else { "" },
                    operators.iter().map(|operator| format!("`{operator}`")).collect::<Vec<_>>().join(", ")
                ));
            }
            None
        }
    }

    /// [`CurrentTexts::relocate`] for a definition of `symbol` (qualified) of `kind` as the helper
    /// labels it ("function", "method (CIRCLE)"): find-definition and describe-symbol place a
    /// definition alike.
    pub(crate) fn relocate_labelled(
        &mut self,
        source: &mut Location,
        kind: &str,
        symbol: &str,
    ) -> Option<(usize, usize)> {
        let (operators, form_name) = query_of(kind, symbol.rsplit(':').next().unwrap_or(symbol))?;
        self.relocate(source, operators, &form_name)
    }

    /// `file:line:column` of `source` with the file relative to the first root, when it is
    /// under it: what `file_path` takes, and shorter.
    fn shown(&self, source: &Location) -> Option<String> {
        let relative = Path::new(source.file.as_deref()?).strip_prefix(self.roots.paths()[0]).ok()?;
        let note = source.remark().map(|remark| format!(" ({remark})")).unwrap_or_default();
        Some(format!("{}:{}:{}{note}", relative.display(), source.line?, source.column?))
    }

    /// The text of the definition at `source`: the form [`CurrentTexts::relocate`] found
    /// (`span`), or else the top-level form that starts where SBCL recorded it (a definition a
    /// macro made, which no operator of its kind names).
    pub(crate) fn text_of(&mut self, source: &Location, span: Option<(usize, usize)>) -> Option<String> {
        let text = self.current(source.file.as_deref()?)?;
        let (start, end) = match span {
            Some(span) => span,
            None if source.note.is_none() => top_level_form_at(text, source.line? as usize, source.column? as usize)?,
            None => return None,
        };
        Some(String::from_utf8_lossy(&text[start..end]).into_owned())
    }
}

/// The byte of `text` at 1-based `line` and `column` (in characters), when the text has that line.
fn byte_at(text: &[u8], (line, column): (usize, usize)) -> Option<usize> {
    let line_start = match line {
        0 => return None,
        1 => 0,
        _ => text.iter().enumerate().filter(|&(_, &b)| b == b'\n').nth(line - 2)?.0 + 1,
    };
    let line_end = text[line_start..].iter().position(|&b| b == b'\n').map_or(text.len(), |i| line_start + i);
    Some(
        line_start
            + String::from_utf8_lossy(&text[line_start..line_end])
                .chars()
                .take(column.saturating_sub(1))
                .map(char::len_utf8)
                .sum::<usize>(),
    )
}

/// The end of the top-level form of `text` that starts at 1-based `line` and `column`, if one does.
fn top_level_form_end(text: &[u8], place: (usize, usize)) -> Option<usize> {
    let start = byte_at(text, place)?;
    let spans = crate::source::Cst::top_level_spans(text).ok()?;
    spans.iter().find(|&&(span_start, _)| span_start as usize == start).map(|&(_, end)| end as usize)
}

/// Whether a top-level form of `text` starts at 1-based `line` and `column`.
fn starts_top_level_form(text: &[u8], place: (usize, usize)) -> bool {
    top_level_form_end(text, place).is_some()
}

/// Whether the top-level form at 1-based `line` and `column` of `text` holds the symbol that
/// `form_name` (`name`, `(setf name)`, `name (specializers)`) names.
fn names_at(text: &[u8], place: (usize, usize), form_name: &str) -> bool {
    let symbol = form_name.trim_start_matches("(setf ").split([' ', ')']).next().unwrap_or_default().as_bytes();
    let (Some(start), Some(end)) = (byte_at(text, place), top_level_form_end(text, place)) else { return false };
    let form = text[start..end].to_ascii_lowercase();
    let delimiter = |b: Option<&u8>| b.is_none_or(|b| b.is_ascii_whitespace() || b"()'`,:#|\"".contains(b));
    !symbol.is_empty()
        && form.windows(symbol.len()).enumerate().any(|(i, window)| {
            window == symbol
                && delimiter(i.checked_sub(1).and_then(|j| form.get(j)))
                && delimiter(form.get(i + symbol.len()))
        })
}

/// The operators that may have made a definition of `kind` (as the helper labels it), and its
/// name as `edit-lisp-form` takes it, for the symbol named `name`.
fn query_of(kind: &str, name: &str) -> Option<(&'static [&'static str], String)> {
    let name = name.trim_matches('|').to_lowercase();
    if kind.starts_with("function (SETF ") {
        return Some((&["defun", "defgeneric"], format!("(setf {name})")));
    }
    if let Some(signature) = kind.strip_prefix("method ") {
        // `(:AROUND T)`: the qualifiers, then one specializer per required parameter.
        let inner = signature.trim().strip_prefix('(')?.strip_suffix(')')?;
        let parts = split_top_level(inner);
        let qualifiers = parts.iter().take_while(|p| p.starts_with(':')).count();
        let specializers = parts[qualifiers..].join(" ");
        let form_name = if qualifiers == 0 {
            format!("{name} ({specializers})")
        } else {
            format!("{name} {} ({specializers})", parts[..qualifiers].join(" "))
        };
        return Some((&["defmethod"], form_name.to_lowercase()));
    }
    let operators: &'static [&'static str] = match kind {
        "function" => &["defun", "defgeneric"],
        "generic function" => &["defgeneric"],
        "macro" => &["defmacro"],
        "compiler macro" => &["define-compiler-macro"],
        "variable" => &["defvar", "defparameter"],
        "constant" => &["defconstant"],
        "symbol macro" => &["define-symbol-macro"],
        "setf expander" => &["defsetf", "define-setf-expander"],
        "structure" => &["defstruct"],
        "condition" => &["define-condition"],
        "class" => &["defclass"],
        "type" => &["deftype"],
        "method combination" => &["define-method-combination"],
        _ => return None,
    };
    Some((operators, name))
}

/// The elements of a list's printed contents, split at top-level spaces.
pub(crate) fn split_top_level(text: &str) -> Vec<String> {
    let mut depth = 0i32;
    split_where(text, |c| {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ' ' => return depth == 0,
            _ => {}
        }
        false
    })
}

/// The non-empty parts of `text` between the characters `separates` says separate them; it sees
/// every character in turn, and may keep state (a depth, a quote) to decide.
fn split_where(text: &str, mut separates: impl FnMut(char) -> bool) -> Vec<String> {
    let (mut parts, mut current) = (Vec::new(), String::new());
    for c in text.chars() {
        if separates(c) {
            if !current.is_empty() {
                parts.push(std::mem::take(&mut current));
            }
        } else {
            current.push(c);
        }
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;
    use crate::tools::ToolError;

    const AREA: &str = "(:symbol \"S::AREA\" :names (\"generic function\") :total 2 :definitions \
         ((:kind \"generic function\" :source (:file \"/s.lisp\" :line 3 :column 1 :note nil :made-by nil :origin nil)) \
          (:kind \"method (CIRCLE)\" :source (:file nil :line nil :column nil :note nil :made-by nil :origin \"defined at the REPL, no source file\"))))";

    fn found(reply: &str) -> Result<Definitions, ToolError> {
        decode("find-definition", &read(reply).unwrap())
    }

    #[test]
    fn kinds_become_queries() {
        let query = |kind: &str| query_of(kind, "AREA").map(|(operators, name)| (operators[0], name));
        assert_eq!(query("method (:AROUND T)"), Some(("defmethod", "area :around (t)".into())));
        assert_eq!(query("method ((EQL :X) INTEGER)"), Some(("defmethod", "area ((eql :x) integer)".into())));
        assert_eq!(query("function (SETF AREA)"), Some(("defun", "(setf area)".into())));
        assert_eq!(query("variable"), Some(("defvar", "area".into())));
        let source = b"(in-package :x)\n\n#+sbcl\n(progn\n  (defmethod area :around ((s t)) 1))\n";
        let (operators, name) = query_of("method (:AROUND T)", "AREA").unwrap();
        let places = locate_definition(source, operators, &name);
        assert_eq!(places.iter().map(|p| (p.at, p.top_level)).collect::<Vec<_>>(), [((5, 3), (4, 1))]);
    }

    #[test]
    fn several_symbols_are_separated_by_blanks() {
        assert_eq!(symbol_names(" a:b  c::d\te "), ["a:b", "c::d", "e"]);
        assert_eq!(symbol_names("|two words| x"), ["|two words|", "x"]);
        assert_eq!(symbol_names("a\\ b"), ["a\\ b"]);
        assert!(symbol_names("  ").is_empty());
    }

    #[test]
    fn a_list_splits_at_its_top_level_spaces() {
        assert_eq!(split_top_level("A (B C)  (D (E F)) G"), ["A", "(B C)", "(D (E F))", "G"]);
        assert!(split_top_level("").is_empty());
    }

    #[test]
    fn with_source_each_definition_comes_with_its_text() {
        let mut one = found(
            "(:symbol \"S::F\" :names (\"function\") :total 1 :definitions \
             ((:kind \"function\" :source (:file \"/s.lisp\" :line 3 :column 1 :note nil :made-by nil :origin nil))))",
        )
        .unwrap();
        one.definitions[0].text = Some("(defun f ()\n  1)".into());
        assert_eq!(one.render(0), "S::F: function at /s.lisp:3:1\n(defun f ()\n  1)");
        let mut area = found(AREA).unwrap();
        area.definitions[0].text = Some("(defgeneric area (s))".into());
        assert_eq!(
            area.render(0),
            "S::AREA: 2 definitions\ngeneric function at /s.lisp:3:1\n(defgeneric area (s))\nmethod (CIRCLE): defined at \
             the REPL, no source file"
        );
        assert_eq!(area.structured(0)["definitions"][0]["text"], "(defgeneric area (s))");
    }

    #[test]
    fn definitions_line_up() {
        assert_eq!(
            found(AREA).unwrap().render(0),
            "S::AREA: 2 definitions\n  generic function  /s.lisp:3:1\n  method (CIRCLE)   defined at the REPL, no source file"
        );
    }

    #[test]
    fn a_page_of_many_says_where_the_next_one_starts() {
        let entry = "(:kind \"method ((EQL 1))\" :source (:file \"/m.lisp\" :line 1 :column 1 :note nil :made-by nil :origin nil))";
        let reply = format!(
            "(:symbol \"S::M\" :names (\"generic function\") :total 400000 :definitions ({}))",
            vec![entry; 2000].join(" ")
        );
        let found = found(&reply).unwrap();
        let text = found.render(4000);
        assert!(text.starts_with("S::M: 400000 definitions, 4001 to 6000\n"), "{}", &text[..80]);
        assert!(
            text.ends_with("\n... 394000 more; use `offset: 6000` for the next page."),
            "{}",
            &text[text.len() - 80..]
        );
        assert_eq!(text.lines().count(), 2002);
        let structured = found.structured(4000);
        assert_eq!((structured["total"].as_u64(), structured["next_offset"].as_u64()), (Some(400000), Some(6000)));
        // The last page has no next one.
        let last = found.render(398000);
        assert!(!last.contains("more; use"), "{}", &last[last.len() - 80..]);
        assert_eq!(found.structured(398000)["next_offset"], serde_json::Value::Null);
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let error = found(&AREA.replace(":names (\"generic function\") ", "")).unwrap_err();
        assert!(
            error.0.contains("reply to find-definition is not what this server expects (the reply has no :names)"),
            "{}",
            error.0
        );
        let error = found(&AREA.replace(":line 3 ", "")).unwrap_err();
        assert!(error.0.contains("(:definitions 0 :source: the reply has no :line)"), "{}", error.0);
    }
}
