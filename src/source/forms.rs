//! What each top-level form is: its operator, the name it defines and, for `defmethod`, the
//! qualifiers and specializers that tell one method from another.
//!
//! Symbols are compared as SBCL's reader reads them, package prefixes dropped: unescaped letters
//! are folded, so `CL:DEFUN` and `defun` are the same operator; escaped ones keep their case, so
//! `|defun|` is another symbol, and `|FOO|` is `foo` (the contract's `string-equal` would take
//! `|foo|` for `FOO` too). String designators (`"NAME"`) are folded as the contract allows.
//!
//! See docs/design.md, "Source files".

use super::cst::{Cst, LineIndex, LineRange, NodeId, NodeKind, ParseError};

/// The name part of a symbol token, read with the reader's escape rules: `key` is its name with
/// the case of every letter inverted (unescaped letters are upper case for the reader, so they
/// come out lower case), which tells `|foo|` from `FOO` while `defun` still reads `defun`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Symbol {
    pub key: String,
    pub keyword: bool,
}

/// Splits `pkg::name` / `:name` / `name` at unescaped colons and removes `\` and `|` escapes.
pub(crate) fn read_symbol(token: &[u8]) -> Symbol {
    // The name's bytes, each with whether it was escaped.
    let mut name: Vec<(u8, bool)> = Vec::with_capacity(token.len());
    let mut package: Option<Vec<(u8, bool)>> = None;
    let mut in_bars = false;
    let mut bytes = token.iter().copied();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => name.extend(bytes.next().map(|escaped| (escaped, true))),
            b'|' => in_bars = !in_bars,
            b':' if !in_bars => {
                // `pkg::name` has two markers; only the text before the first is the package.
                if package.is_none() {
                    package = Some(std::mem::take(&mut name));
                } else {
                    name.clear();
                }
            }
            _ => name.push((b, in_bars)),
        }
    }
    let mut key = String::with_capacity(name.len());
    for run in name.chunk_by(|a, b| a.1 == b.1) {
        let text: Vec<u8> = run.iter().map(|&(b, _)| b).collect();
        let text = String::from_utf8_lossy(&text);
        if run[0].1 {
            key.extend(text.chars().flat_map(|c| -> Vec<char> {
                if c.is_uppercase() {
                    c.to_lowercase().collect()
                } else {
                    c.to_uppercase().collect()
                }
            }));
        } else {
            key.push_str(&text.to_lowercase());
        }
    }
    Symbol { key, keyword: package.is_some_and(|p| p.is_empty()) }
}

fn fold(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_lowercase()
}

/// The contents of a string literal without its quotes and escapes.
fn read_string(literal: &[u8]) -> Vec<u8> {
    let inner = literal.get(1..literal.len().saturating_sub(1)).unwrap_or_default();
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter().copied();
    while let Some(b) = bytes.next() {
        if b == b'\\' {
            out.extend(bytes.next());
        } else {
            out.push(b);
        }
    }
    out
}

/// A string designator as `defpackage` and `defsystem` accept it: `name`, `:name`, `#:name`,
/// `"NAME"`. Returns its case-folded text.
fn designator(cst: &Cst, id: NodeId) -> Option<String> {
    let text = cst.text(id);
    match cst.kind(id) {
        NodeKind::Token => Some(read_symbol(text).key),
        NodeKind::Uninterned => Some(read_symbol(text.get(2..).unwrap_or_default()).key),
        NodeKind::String => Some(fold(&read_string(text))),
        _ => None,
    }
}

fn is_symbol(cst: &Cst, id: NodeId, key: &str) -> bool {
    cst.kind(id) == NodeKind::Token && read_symbol(cst.text(id)).key == key
}

/// The name a definition defines, case-folded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Name {
    Plain(String),
    /// `(setf name)`
    Setf(String),
}

impl Name {
    pub fn key(&self) -> &str {
        match self {
            Name::Plain(key) | Name::Setf(key) => key,
        }
    }
}

/// Reads a name element: a designator, `(setf name)`, or the `(name options...)` of `defstruct`
/// and forms like it.
pub(crate) fn read_name(cst: &Cst, id: NodeId) -> Option<Name> {
    if let Some(key) = designator(cst, id) {
        return Some(Name::Plain(key));
    }
    if cst.kind(id) != NodeKind::List {
        return None;
    }
    let elements: Vec<NodeId> = cst.elements(id).take(3).collect();
    match elements[..] {
        [setf, name] if is_symbol(cst, setf, "setf") => designator(cst, name).map(Name::Setf),
        [first, ..] if cst.kind(first) == NodeKind::Token => {
            let symbol = read_symbol(cst.text(first));
            (!symbol.keyword).then_some(Name::Plain(symbol.key))
        }
        _ => None,
    }
}

/// What a method is specialized on, for one required parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Specializer {
    /// A plain parameter, the same as specializing on `t`.
    Unspecialized,
    Class(String),
    /// `(eql form)`, with the form in a canonical spelling.
    Eql(String),
    /// Anything else (a reader conditional in a lambda list, ...), canonically spelled.
    Other(String),
}

impl Specializer {
    fn same_as(&self, other: &Specializer) -> bool {
        let is_t =
            |s: &Specializer| matches!(s, Specializer::Unspecialized) || matches!(s, Specializer::Class(c) if c == "t");
        self == other || (is_t(self) && is_t(other))
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Param {
    /// The parameter's variable, case-folded (absent when the lambda list is malformed).
    pub var: Option<String>,
    pub specializer: Specializer,
    /// Where the specializer is written (`circle`, `(eql :x)`); none for a plain parameter.
    written: Option<NodeId>,
}

#[derive(Debug, Clone)]
pub(crate) struct MethodSignature {
    pub qualifiers: Vec<String>,
    qualifier_nodes: Vec<NodeId>,
    pub params: Vec<Param>,
}

impl MethodSignature {
    /// `:around (circle t)`: the part of a `form_name` after the method name.
    fn shown(&self, cst: &Cst) -> String {
        let mut parts: Vec<String> = self.qualifier_nodes.iter().map(|&id| compact(cst, id, false)).collect();
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| p.written.map_or_else(|| "t".to_string(), |id| compact(cst, id, false)))
            .collect();
        parts.push(format!("({})", params.join(" ")));
        parts.join(" ")
    }
}

/// Reads `qualifiers* lambda-list` (the elements after a method's name).
fn read_method(cst: &Cst, after_name: &[NodeId]) -> Option<MethodSignature> {
    let list_at = after_name.iter().position(|&id| cst.kind(id) == NodeKind::List)?;
    let qualifiers = &after_name[..list_at];
    let params: Vec<Param> = cst
        .elements(after_name[list_at])
        .take_while(|&id| !cst.text(id).starts_with(b"&"))
        .map(|id| read_param(cst, id))
        .collect();
    Some(MethodSignature {
        qualifiers: qualifiers.iter().map(|&id| qualifier_key(cst, id)).collect(),
        qualifier_nodes: qualifiers.to_vec(),
        params,
    })
}

fn qualifier_key(cst: &Cst, id: NodeId) -> String {
    designator(cst, id).unwrap_or_else(|| compact(cst, id, true))
}

fn read_param(cst: &Cst, id: NodeId) -> Param {
    match cst.kind(id) {
        NodeKind::Token => {
            Param { var: Some(read_symbol(cst.text(id)).key), specializer: Specializer::Unspecialized, written: None }
        }
        NodeKind::List => {
            let mut parts = cst.elements(id);
            let var = parts.next().and_then(|v| designator(cst, v));
            match parts.next() {
                Some(spec) => Param { var, specializer: read_specializer(cst, spec), written: Some(spec) },
                None => Param { var, specializer: Specializer::Unspecialized, written: None },
            }
        }
        _ => Param { var: None, specializer: Specializer::Other(compact(cst, id, true)), written: Some(id) },
    }
}

fn read_specializer(cst: &Cst, id: NodeId) -> Specializer {
    if cst.kind(id) == NodeKind::Token {
        return Specializer::Class(read_symbol(cst.text(id)).key);
    }
    if cst.kind(id) == NodeKind::List {
        let parts: Vec<NodeId> = cst.elements(id).take(3).collect();
        if let [eql, object] = parts[..] {
            if is_symbol(cst, eql, "eql") {
                return Specializer::Eql(compact(cst, object, true));
            }
        }
    }
    Specializer::Other(compact(cst, id, true))
}

/// The text of a node on one line with comments dropped and single spaces between elements.
/// With `canonical`, symbols are spelled by their folded name (keywords keep their colon) so
/// that two spellings of the same form compare equal.
pub(crate) fn compact(cst: &Cst, id: NodeId, canonical: bool) -> String {
    let mut out = String::new();
    let mut glue = true;
    for leaf in cst.leaves(id) {
        let kind = cst.kind(leaf);
        if kind.is_trivia() {
            continue;
        }
        let text = cst.text(leaf);
        let closes = kind == NodeKind::Delimiter && text == b")";
        if !glue && !closes {
            out.push(' ');
        }
        if canonical && kind == NodeKind::Token {
            let symbol = read_symbol(text);
            if symbol.keyword {
                out.push(':');
            }
            out.push_str(&symbol.key);
        } else {
            out.push_str(&String::from_utf8_lossy(text));
        }
        glue = matches!(kind, NodeKind::Delimiter | NodeKind::Marker) && !closes;
    }
    out
}

/// A form that Lisp processes at top level (CLHS 3.2.3.1): a top-level form, or a form in the
/// body of a top-level `progn`, `eval-when`, `locally`, `macrolet` or `symbol-macrolet`, looked
/// through any reader conditionals in front of it.
#[derive(Debug, Clone)]
pub(crate) struct TopForm {
    /// Position among its siblings: in [`Cst::top_level`], or in the children of `container`.
    pub top_index: usize,
    /// The wrapping form (`progn`, `eval-when`, ...) whose body holds this one; none at top level.
    pub container: Option<NodeId>,
    /// The positions of the wrapping forms in the list [`definitions`] returns, outermost first.
    pub ancestors: Vec<usize>,
    /// The top-level node: the outermost reader conditional, or the form itself.
    pub item: NodeId,
    /// The form under the conditionals.
    pub form: NodeId,
    /// The `#+`/`#-` nodes in front of the form, outermost first.
    pub conditions: Vec<NodeId>,
    pub head: Option<Head>,
}

/// The operator and name of a list form whose operator is a symbol. How they are written is
/// only looked up for the few forms that end up in a message.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub operator: String,
    operator_node: NodeId,
    pub name: Option<Name>,
    name_node: Option<NodeId>,
    /// Present for `defmethod` forms.
    pub method: Option<MethodSignature>,
}

impl Head {
    fn operator_shown(&self, cst: &Cst) -> String {
        String::from_utf8_lossy(cst.text(self.operator_node)).into_owned()
    }
}

impl TopForm {
    /// `#+sbcl ` for each reader conditional in front of the form.
    pub fn conditions_shown(&self, cst: &Cst) -> String {
        self.conditions
            .iter()
            .map(|&c| {
                let mut parts = cst.children(c).iter().filter(|&&id| !cst.kind(id).is_trivia());
                let marker = parts.next().map(|&id| compact(cst, id, false)).unwrap_or_default();
                let feature = parts.next().map(|&id| compact(cst, id, false)).unwrap_or_default();
                format!("{marker}{feature} ")
            })
            .collect()
    }

    /// The name as `edit-lisp-form` takes it in `form_name`: `foo`, `(setf foo)`, and for a
    /// method also its qualifiers and specializers, `draw :around (circle)`.
    pub fn form_name(&self, cst: &Cst) -> Option<String> {
        let head = self.head.as_ref()?;
        head.name.as_ref()?;
        let name = name_shown(cst, head.name_node?);
        Some(match &head.method {
            Some(method) => format!("{name} {}", method.shown(cst)),
            None => name,
        })
    }

    /// `defmethod draw :around (circle)`, `defun foo`, `(progn …)`: how messages name the form.
    pub fn describe(&self, cst: &Cst) -> String {
        match (&self.head, self.form_name(cst)) {
            (Some(head), Some(name)) => format!("{} {name}", head.operator_shown(cst)),
            (Some(head), None) if head.operator == "eval-when" => match cst.elements(self.form).nth(1) {
                Some(situations) => format!("{} {}", head.operator_shown(cst), compact(cst, situations, false)),
                None => head.operator_shown(cst),
            },
            (Some(head), None) => head.operator_shown(cst),
            (None, _) => shorten(&compact(cst, self.form, false), 60),
        }
    }
}

/// One form as `lisp-outline` lists it: a top-level form, or one in the body of a wrapping
/// `progn`, `eval-when`, `locally`, `macrolet` or `symbol-macrolet`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutlineEntry {
    pub(crate) lines: LineRange,
    /// Its bytes in the file, start and end, reader conditionals included.
    pub(crate) span: (usize, usize),
    /// How many wrapping forms it is inside: 0 for a top-level form.
    pub depth: usize,
    /// The reader conditionals in front of the form (`#+sbcl`), empty if none.
    pub conditions: String,
    /// The operator as written, for a list form whose operator is a symbol.
    pub operator: Option<String>,
    /// The name as `edit-lisp-form` takes it in `form_name`.
    pub name: Option<String>,
    /// `defun foo`, or the start of the form when it has no symbol operator.
    pub description: String,
}

/// The file's top-level forms, in order.
pub fn outline(cst: &Cst) -> Vec<OutlineEntry> {
    outline_page(cst, 0, usize::MAX).1
}

/// [`outline_page`] of a whole text without its tree: one pass keeps only the span of each
/// top-level form, and only the forms of the page are parsed, each on its own. Memory is in
/// proportion to the number of lines and forms, not to the nodes of the text. A text that does
/// not read gives the same error as [`Cst::parse`].
pub fn outline_page_of(source: &[u8], offset: usize, limit: usize) -> Result<(usize, Vec<OutlineEntry>), ParseError> {
    let spans = Cst::top_level_spans(source)?;
    let lines = LineIndex::new(source);
    let mut entries = Vec::new();
    let page = spans.iter().enumerate().skip(offset).take(limit);
    for (i, &(start, end)) in page {
        let (start, end) = (start as usize, end as usize);
        // A top-level form reads the same on its own, with the blank space and comments up to
        // the next form: the reader carries nothing from one top-level form to the next, and
        // the text after it decides where its last token ends just as in the whole file.
        let next = spans.get(i + 1).map_or(source.len(), |&(next, _)| next as usize);
        let alone = Cst::parse(&source[start..next]).ok();
        let forms = alone.as_ref().map(|cst| (cst, definitions(cst)));
        match forms {
            Some((cst, forms)) if forms.first().is_some_and(|form| cst.span(form.item) == (0..end - start)) => {
                entries.extend(forms.iter().map(|form| outline_entry(cst, &lines, start, form)));
            }
            // Not so after all: an unknown `#` dispatch can read differently at the end of the
            // text (`#\`##`, `#""(`); never in real code, but then the whole tree, as
            // outline_page does.
            _ => return Ok(outline_page(&Cst::parse(source)?, offset, limit)),
        }
    }
    Ok((spans.len(), entries))
}

/// How many top-level forms `cst` has, and the outline entries of at most `limit` of them from
/// the `offset`th (0-based) on: only those are described, however long the file.
/// Nested forms come with the top-level form that wraps them and do not count towards `limit`.
pub fn outline_page(cst: &Cst, offset: usize, limit: usize) -> (usize, Vec<OutlineEntry>) {
    let lines = LineIndex::new(cst.source());
    let forms = definitions(cst);
    let total = forms.iter().filter(|form| form.ancestors.is_empty()).count();
    let mut top_level_seen = 0;
    let entries = forms
        .iter()
        .filter(|form| {
            if form.ancestors.is_empty() {
                top_level_seen += 1;
            }
            (offset + 1..=offset.saturating_add(limit)).contains(&top_level_seen)
        })
        .map(|form| outline_entry(cst, &lines, 0, form))
        .collect();
    (total, entries)
}

/// The entry of `form` of `cst`, which starts at byte `base` of the text `lines` indexes.
fn outline_entry(cst: &Cst, lines: &LineIndex, base: usize, form: &TopForm) -> OutlineEntry {
    let span = cst.span(form.item);
    OutlineEntry {
        lines: lines.lines(base + span.start..base + span.end),
        span: (base + span.start, base + span.end),
        depth: form.ancestors.len(),
        conditions: form.conditions_shown(cst).trim_end().to_string(),
        operator: form.head.as_ref().map(|h| h.operator_shown(cst)),
        name: form.form_name(cst),
        description: form.describe(cst),
    }
}

fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut short: String = text.chars().take(max_chars - 1).collect();
    short.push('…');
    short
}

/// Every form Lisp processes at top level, in file order: each top-level form, followed by the
/// forms in its body when it is a `progn`, `eval-when`, `locally`, `macrolet` or
/// `symbol-macrolet` (and so on down, as deep as they nest).
pub(crate) fn definitions(cst: &Cst) -> Vec<TopForm> {
    // One form at a time, with no list of the top-level ones beside: a big file has hundreds of
    // thousands.
    let mut forms = Vec::new();
    for (top_index, &item) in cst.top_level().iter().enumerate() {
        if !cst.kind(item).is_trivia() {
            push_with_body(cst, looked_through(cst, item, top_index, None, Vec::new()), &mut forms);
        }
    }
    forms
}

/// The operators whose body forms are processed at top level, with how many elements after the
/// operator come before the body (`eval-when`'s situations, `macrolet`'s bindings).
const WRAPPERS: [(&str, usize); 5] =
    [("progn", 0), ("eval-when", 1), ("locally", 0), ("macrolet", 1), ("symbol-macrolet", 1)];

/// How many elements of a wrapper (its operator included) precede its body, or `None` when
/// `head` is no wrapper. Declarations at the start of a body are part of the head.
pub(crate) fn wrapper_head_len(cst: &Cst, form: NodeId, head: Option<&Head>) -> Option<usize> {
    let operator = head?.operator.as_str();
    let (_, arguments) = WRAPPERS.iter().find(|(name, _)| *name == operator)?;
    let declarations = cst
        .elements(form)
        .skip(1 + arguments)
        .take_while(|&id| read_head(cst, id).is_some_and(|h| h.operator == "declare"))
        .count();
    Some(1 + arguments + declarations)
}

fn push_with_body(cst: &Cst, form: TopForm, forms: &mut Vec<TopForm>) {
    let position = forms.len();
    let head_len = wrapper_head_len(cst, form.form, form.head.as_ref());
    let (wrapper, mut ancestors) = (form.form, form.ancestors.clone());
    forms.push(form);
    let Some(head_len) = head_len else { return };
    ancestors.push(position);
    let mut seen = 0;
    for (index, &child) in cst.children(wrapper).iter().enumerate() {
        let kind = cst.kind(child);
        if kind.is_trivia() || kind == NodeKind::Delimiter || kind == NodeKind::Marker {
            continue;
        }
        seen += 1;
        if seen > head_len {
            let inner = looked_through(cst, child, index, Some(wrapper), ancestors.clone());
            push_with_body(cst, inner, forms);
        }
    }
}

/// The form at `item`, seen through the reader conditionals in front of it.
fn looked_through(
    cst: &Cst,
    item: NodeId,
    top_index: usize,
    container: Option<NodeId>,
    ancestors: Vec<usize>,
) -> TopForm {
    let mut form = item;
    let mut conditions = Vec::new();
    while matches!(cst.kind(form), NodeKind::Prefixed(p) if p.is_reader_conditional()) {
        conditions.push(form);
        match cst.elements(form).nth(1) {
            Some(guarded) => form = guarded,
            None => break,
        }
    }
    TopForm { top_index, container, ancestors, item, form, conditions, head: read_head(cst, form) }
}

fn read_head(cst: &Cst, form: NodeId) -> Option<Head> {
    if cst.kind(form) != NodeKind::List {
        return None;
    }
    let mut elements = cst.elements(form);
    let operator = elements.next()?;
    if cst.kind(operator) != NodeKind::Token {
        return None;
    }
    let operator_key = read_symbol(cst.text(operator)).key;
    // A wrapper names nothing: what follows its operator is its situations, bindings or body.
    let name_node = elements.next().filter(|_| !WRAPPERS.iter().any(|(wrapper, _)| *wrapper == operator_key));
    let name = name_node.and_then(|id| read_name(cst, id));
    let method = match (operator_key.as_str(), name.is_some()) {
        ("defmethod", true) => read_method(cst, &elements.collect::<Vec<_>>()),
        _ => None,
    };
    Some(Head { operator: operator_key, operator_node: operator, name, name_node, method })
}

/// The name as written, without the options of a `(name options...)`. Never shortened: it must
/// work as a `form_name`.
fn name_shown(cst: &Cst, id: NodeId) -> String {
    let is_setf = matches!(read_name(cst, id), Some(Name::Setf(_)));
    let shown = match (cst.kind(id), is_setf) {
        (NodeKind::List, false) => cst.elements(id).next().unwrap_or(id),
        _ => id,
    };
    compact(cst, shown, false)
}

/// One element of the specializer list in a `form_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum QuerySpec {
    /// A bare symbol: a class name, `t`, or the name of an unspecialized parameter.
    Symbol(String),
    /// `(var class)`, `(var (eql x))` or `(eql x)`.
    Specializer(Specializer),
}

/// What the caller is looking for, read from `form_type` and `form_name`.
#[derive(Debug, Clone)]
pub(crate) struct Query {
    pub operator: String,
    pub name: Name,
    method: Option<MethodQuery>,
}

#[derive(Debug, Clone)]
struct MethodQuery {
    qualifiers: Vec<String>,
    specializers: Option<Vec<QuerySpec>>,
}

/// How well a form matches a query. Loose matches only count when nothing matches exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Match {
    No,
    Loose,
    Exact,
}

impl Query {
    pub fn parse(form_type: &str, form_name: &str) -> Result<Query, String> {
        let operator = match Cst::parse(form_type.trim().as_bytes()) {
            Ok(cst) => match cst.top_level_forms().collect::<Vec<_>>()[..] {
                [op] if cst.kind(op) == NodeKind::Token => read_symbol(cst.text(op)).key,
                _ => String::new(),
            },
            Err(_) => String::new(),
        };
        if operator.is_empty() {
            return Err(format!(
                "`form_type` must be the operator symbol of the form, such as `defun` or `defmethod`; got `{form_type}`."
            ));
        }
        let cst = Cst::parse(form_name.as_bytes()).map_err(|e| format!("`form_name` is not readable Lisp: {e}."))?;
        let parts: Vec<NodeId> = cst.top_level_forms().collect();
        let name = parts.first().and_then(|&id| read_name(&cst, id)).ok_or_else(|| {
            format!("`form_name` must start with the name the form defines, such as `foo`, `(setf foo)`, `#:foo` or `\"FOO\"`; got `{form_name}`.")
        })?;
        let method = if operator == "defmethod" {
            Some(read_method_query(&cst, &parts[1..], form_name)?)
        } else if parts.len() > 1 {
            return Err(format!(
                "`form_name` for `{form_type}` is just the name, such as `{}`; qualifiers and specializers only apply to `defmethod`.",
                compact(&cst, parts[0], false)
            ));
        } else {
            None
        };
        Ok(Query { operator, name, method })
    }

    /// Whether `form` is what the query asks for.
    pub fn matches(&self, form: &TopForm) -> Match {
        let Some(head) = &form.head else { return Match::No };
        if head.operator != self.operator || head.name.as_ref() != Some(&self.name) {
            return Match::No;
        }
        match (&self.method, &head.method) {
            (None, _) => Match::Exact,
            (Some(query), Some(method)) => query.matches(method),
            (Some(query), None) if query.qualifiers.is_empty() && query.specializers.is_none() => Match::Exact,
            (Some(_), None) => Match::No,
        }
    }

    pub fn is_method(&self) -> bool {
        self.method.is_some()
    }

    /// The forms that match best, in file order: exact matches if there are any, else loose ones.
    pub fn select<'f>(&self, forms: &'f [TopForm]) -> Vec<&'f TopForm> {
        let scored: Vec<(Match, &TopForm)> = forms.iter().map(|f| (self.matches(f), f)).collect();
        let best = scored.iter().map(|(m, _)| *m).max().unwrap_or(Match::No);
        if best == Match::No {
            return Vec::new();
        }
        scored.into_iter().filter(|(m, _)| *m == best).map(|(_, f)| f).collect()
    }
}

fn read_method_query(cst: &Cst, after_name: &[NodeId], form_name: &str) -> Result<MethodQuery, String> {
    let list_at = after_name.iter().position(|&id| cst.kind(id) == NodeKind::List);
    let qualifiers_end = list_at.unwrap_or(after_name.len());
    if list_at.is_some_and(|at| at + 1 != after_name.len()) {
        return Err(format!(
            "`form_name` for a method is `name [qualifiers] (specializers)`, such as `draw ((s circle))` or `area :around (shape)`; nothing may follow the specializer list in `{form_name}`."
        ));
    }
    let specializers = list_at.map(|at| cst.elements(after_name[at]).map(|id| read_query_spec(cst, id)).collect());
    Ok(MethodQuery {
        qualifiers: after_name[..qualifiers_end].iter().map(|&id| qualifier_key(cst, id)).collect(),
        specializers,
    })
}

fn read_query_spec(cst: &Cst, id: NodeId) -> QuerySpec {
    if cst.kind(id) == NodeKind::Token {
        return QuerySpec::Symbol(read_symbol(cst.text(id)).key);
    }
    if cst.kind(id) == NodeKind::List {
        let parts: Vec<NodeId> = cst.elements(id).take(3).collect();
        match parts[..] {
            [eql, _] if is_symbol(cst, eql, "eql") => return QuerySpec::Specializer(read_specializer(cst, id)),
            [_, spec] => return QuerySpec::Specializer(read_specializer(cst, spec)),
            [_] => return QuerySpec::Specializer(Specializer::Unspecialized),
            _ => {}
        }
    }
    QuerySpec::Specializer(Specializer::Other(compact(cst, id, true)))
}

impl MethodQuery {
    fn matches(&self, method: &MethodSignature) -> Match {
        let Some(specializers) = &self.specializers else {
            // `draw` alone names every `draw` method; `draw :around` every around method.
            return if self.qualifiers.is_empty() || self.qualifiers == method.qualifiers {
                Match::Exact
            } else {
                Match::No
            };
        };
        if self.qualifiers != method.qualifiers {
            return Match::No;
        }
        if specs_match(specializers, &method.params, false) {
            return Match::Exact;
        }
        // `calculate-area (shape rectangle)` may mean one parameter written without its outer
        // parentheses: `((shape rectangle))`.
        let one_param = match &specializers[..] {
            [QuerySpec::Symbol(_), QuerySpec::Symbol(class)] => {
                Some(vec![QuerySpec::Specializer(Specializer::Class(class.clone()))])
            }
            _ => None,
        };
        if specs_match(specializers, &method.params, true)
            || one_param.is_some_and(|q| specs_match(&q, &method.params, false))
        {
            Match::Loose
        } else {
            Match::No
        }
    }
}

/// Compares a specializer list with a method's required parameters. Missing trailing entries on
/// either side count as `t`, so `print-object (point)` finds `((p point) stream)`. `loose` also
/// lets a bare symbol name an unspecialized parameter (`(shape stream)` for `((s shape) stream)`).
fn specs_match(query: &[QuerySpec], params: &[Param], loose: bool) -> bool {
    let t = QuerySpec::Symbol("t".into());
    let unspecialized = Param { var: None, specializer: Specializer::Unspecialized, written: None };
    (0..query.len().max(params.len())).all(|i| {
        let q = query.get(i).unwrap_or(&t);
        let p = params.get(i).unwrap_or(&unspecialized);
        match q {
            QuerySpec::Specializer(spec) => spec.same_as(&p.specializer),
            QuerySpec::Symbol(symbol) => {
                Specializer::Class(symbol.clone()).same_as(&p.specializer)
                    || (loose && p.specializer == Specializer::Unspecialized && p.var.as_ref() == Some(symbol))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forms(source: &str) -> (Cst<'_>, Vec<TopForm>) {
        let cst = Cst::parse(source.as_bytes()).expect("parses");
        let forms = definitions(&cst);
        (cst, forms)
    }

    /// The selected forms' positions among the top-level forms, with how well they matched.
    fn matching(source: &str, form_type: &str, form_name: &str) -> Vec<(usize, Match)> {
        let (_, forms) = forms(source);
        let query = Query::parse(form_type, form_name).expect("query");
        let selected = query.select(&forms);
        selected
            .iter()
            .map(|f| (forms.iter().position(|g| g.item == f.item).unwrap_or(usize::MAX), query.matches(f)))
            .collect()
    }

    #[test]
    fn symbols_are_read_like_the_reader_reads_them() {
        assert_eq!(read_symbol(b"CL:DEFUN").key, "defun");
        assert_eq!(read_symbol(b"asdf::defsystem").key, "defsystem");
        // Escaped letters keep their case, as SBCL reads them: `|foo|` is not `FOO`, `|FOO|` is.
        assert_eq!(read_symbol(b"|Foo Bar|").key, "fOO bAR");
        assert_ne!(read_symbol(b"|foo|").key, read_symbol(b"foo").key);
        assert_eq!(read_symbol(b"|FOO|").key, read_symbol(b"foo").key);
        assert_eq!(read_symbol(b"f\\oo").key, read_symbol(b"F|o|O").key);
        assert_eq!(read_symbol(b"a\\:b").key, "a:b");
        assert!(read_symbol(b":key").keyword);
        assert!(!read_symbol(b"pkg:key").keyword);
    }

    #[test]
    fn names_in_all_their_spellings() {
        let (cst, forms) = forms(
            "(defun (setf foo) (v x))\n(defpackage #:my-pkg)\n(defsystem \"My-Sys\")\n(defstruct (point (:conc-name p-)) x)\n(in-package :my-pkg)",
        );
        let names: Vec<_> = forms.iter().map(|f| f.head.as_ref().and_then(|h| h.name.clone())).collect();
        assert_eq!(
            names,
            [
                Some(Name::Setf("foo".into())),
                Some(Name::Plain("my-pkg".into())),
                Some(Name::Plain("my-sys".into())),
                Some(Name::Plain("point".into())),
                Some(Name::Plain("my-pkg".into())),
            ]
        );
        assert_eq!(forms[3].describe(&cst), "defstruct point");
        assert_eq!(forms[0].describe(&cst), "defun (setf foo)");
    }

    #[test]
    fn operators_and_names_ignore_case_and_packages() {
        let source = "(CL:DEFUN Foo ())\n(defpackage :bar)\n(asdf:defsystem \"baz\")";
        assert_eq!(matching(source, "defun", "foo").len(), 1);
        assert_eq!(matching(source, "cl:defun", "FOO").len(), 1);
        assert_eq!(matching(source, "defpackage", "#:bar").len(), 1);
        assert_eq!(matching(source, "defpackage", "\"BAR\"").len(), 1);
        assert_eq!(matching(source, "defsystem", ":baz").len(), 1);
        assert_eq!(matching(source, "defun", "bar").len(), 0);
    }

    #[test]
    fn methods_are_told_apart_by_specializers_and_qualifiers() {
        let source = "\
(defmethod draw ((shape circle)) 1)
(defmethod draw ((s square) stream) 2)
(defmethod area :around ((s shape)) 3)
(defmethod print-object ((o my-class) stream) 4)
(defmethod handle ((x (eql :quit))) 5)
(defmethod (setf size) (v (s box)) 6)
(defmethod calculate-area ((shape rectangle)) 7)
(defmethod draw (thing) 8)";
        let exact = |name| matching(source, "defmethod", name);
        assert_eq!(exact("draw ((shape circle))"), [(0, Match::Exact)]);
        assert_eq!(exact("draw ((c circle))"), [(0, Match::Exact)]);
        assert_eq!(exact("draw (circle)"), [(0, Match::Exact)]);
        assert_eq!(exact("draw (square t)"), [(1, Match::Exact)]);
        assert_eq!(exact("draw (square)"), [(1, Match::Exact)]);
        assert_eq!(exact("draw (t)"), [(7, Match::Exact)]);
        assert_eq!(exact("draw"), [(0, Match::Exact), (1, Match::Exact), (7, Match::Exact)]);
        assert_eq!(exact("area :around ((s shape))"), [(2, Match::Exact)]);
        assert_eq!(exact("area :around"), [(2, Match::Exact)]);
        assert_eq!(exact("area (shape)"), []);
        assert_eq!(exact("print-object (my-class t)"), [(3, Match::Exact)]);
        assert_eq!(exact("print-object (my-class stream)"), [(3, Match::Loose)]);
        assert_eq!(exact("handle ((eql :quit))"), [(4, Match::Exact)]);
        assert_eq!(exact("handle ((x (eql :QUIT)))"), [(4, Match::Exact)]);
        assert_eq!(exact("handle ((eql quit))"), []);
        assert_eq!(exact("(setf size) (t box)"), [(5, Match::Exact)]);
        assert_eq!(exact("calculate-area (shape rectangle)"), [(6, Match::Loose)]);
        assert_eq!(exact("draw (thing)"), [(7, Match::Loose)]);
    }

    #[test]
    fn forms_behind_reader_conditionals_are_seen() {
        let (cst, forms) = forms("#+sbcl (defun f () 1)\n#-(or ccl ecl) #+unix (defun g ())");
        assert_eq!(forms[0].conditions.len(), 1);
        assert_eq!(forms[0].conditions_shown(&cst), "#+sbcl ");
        assert_eq!(forms[1].conditions_shown(&cst), "#-(or ccl ecl) #+unix ");
        assert_eq!(forms[1].describe(&cst), "defun g");
    }

    #[test]
    fn method_descriptions_can_be_used_as_form_names() {
        let (cst, forms) = forms("(defmethod area :around ((s shape) (x (eql :big)) y &optional z) 1)");
        let shown = forms[0].describe(&cst);
        assert_eq!(shown, "defmethod area :around (shape (eql :big) t)");
        let query = Query::parse("defmethod", shown.trim_start_matches("defmethod ")).expect("query");
        assert_eq!(query.matches(&forms[0]), Match::Exact);
    }

    #[test]
    fn outline_lists_every_top_level_form() {
        let source = "; header\n(in-package :app)\n\n#+sbcl\n(defun f (x)\n  x)\n(defmethod draw ((c circle)) c)\n42\n";
        let cst = Cst::parse(source.as_bytes()).expect("parses");
        let entries = outline(&cst);
        let shown: Vec<(usize, usize, &str, &str)> = entries
            .iter()
            .map(|e| (e.lines.first, e.lines.last, e.conditions.as_str(), e.description.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                (2, 2, "", "in-package :app"),
                (4, 6, "#+sbcl", "defun f"),
                (7, 7, "", "defmethod draw (circle)"),
                (8, 8, "", "42"),
            ]
        );
        assert_eq!(entries[2].name.as_deref(), Some("draw (circle)"));
        assert_eq!(entries[3].operator, None);
    }

    #[test]
    fn bad_queries_are_explained() {
        assert!(Query::parse("(defun", "foo").unwrap_err().contains("form_type"));
        assert!(Query::parse("defun", "(foo").unwrap_err().contains("not readable"));
        assert!(Query::parse("defun", "foo (bar)").unwrap_err().contains("only apply to `defmethod`"));
        assert!(Query::parse("defmethod", "foo (a) b").unwrap_err().contains("nothing may follow"));
        assert!(Query::parse("defun", "").unwrap_err().contains("must start with the name"));
    }
}
