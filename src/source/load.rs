//! What the image compiles to load chosen definitions of a file (`load-form`, `edit-lisp-form`
//! with `load`): the file's text with everything else blanked out, so that each definition sits
//! at its own byte offset, line and top-level form number, as SBCL records them for
//! `find-definition`.
//!
//! Kept are the definitions themselves; the wrapping forms around a nested one (their operator,
//! situations, bindings and declarations, but not their other body forms), since a `macrolet` or
//! `eval-when` changes what the definition means; the reader conditionals in front of each; and
//! every top-level `in-package` and `in-readtable` before them, which decide how the text reads.
//! Every other top-level form before them becomes the number `0`, at its own end, so that the
//! compiler numbers the top-level forms and records where each begins as in the file itself.
//! Blanked bytes become spaces; line breaks stay, so lines and columns stay too.
//!
//! See docs/design.md, "Source files".

use std::ops::Range;

use super::cst::{Cst, LineIndex, LineRange, NodeId, NodeKind};
use super::find::find_target;
use super::forms::{definitions, wrapper_head_len, Query, TopForm};

/// What to compile in the image to load some definitions of a file.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// The text to compile under the file's name (see the module comment).
    pub text: Vec<u8>,
    /// The definitions it holds, in file order.
    pub targets: Vec<LoadTarget>,
    /// The argument of the last top-level `in-package` before the first of them, as written.
    pub package: Option<String>,
}

/// One definition a [`LoadPlan`] loads.
#[derive(Debug, Clone)]
pub struct LoadTarget {
    /// How messages name it: `#+sbcl defun foo`.
    pub described: String,
    /// Its lines in the file.
    pub lines: LineRange,
    /// The reader conditionals that decide whether the image reads it: (`+` or `-`, feature
    /// expression text), its wrappers' first.
    pub guards: Vec<(String, String)>,
    /// How many wrapping forms it is inside.
    pub depth: usize,
}

impl LoadPlan {
    /// The plan for the one definition `form_type` and `form_name` (and `index`) name, found as
    /// `edit-lisp-form` finds it; the error says why there is not exactly one. `shown` names the
    /// file in messages.
    pub fn for_query(
        source: &[u8],
        shown: &str,
        form_type: &str,
        form_name: &str,
        index: Option<usize>,
    ) -> Result<LoadPlan, String> {
        let query = Query::parse(form_type, form_name)?;
        let cst = Cst::parse(source).map_err(|e| {
            format!("`{shown}` does not read as Lisp: {e}. Fix that first (`lisp-check-parens` shows where).")
        })?;
        let lines = LineIndex::new(source);
        let forms = definitions(&cst);
        let wanted = format!("{} {}", form_type.trim(), form_name.trim());
        let target = find_target(&cst, &lines, &forms, &query, &wanted, index)?;
        let position = forms.iter().position(|f| f.item == target.item).unwrap_or_default();
        Ok(plan(&cst, &lines, &forms, &[position]))
    }

    /// The plan for the forms whose text lies within one of `spans` of `source` (the forms
    /// edits just wrote), nested ones loaded with the forms that hold them.
    pub fn for_spans(source: &[u8], spans: &[Range<usize>]) -> Result<LoadPlan, String> {
        let cst = Cst::parse(source).map_err(|e| format!("the edited file does not read as Lisp: {e}"))?;
        let lines = LineIndex::new(source);
        let forms = definitions(&cst);
        // The form, not its item: a replacement under `#+sbcl` leaves the conditional outside.
        let inside = |f: &TopForm| {
            let form = cst.span(f.form);
            spans.iter().any(|span| span.start <= form.start && form.end <= span.end)
        };
        let targets: Vec<usize> = (0..forms.len())
            .filter(|&i| inside(&forms[i]) && !forms[i].ancestors.iter().any(|&a| inside(&forms[a])))
            .collect();
        Ok(plan(&cst, &lines, &forms, &targets))
    }
}

fn plan(cst: &Cst, lines: &LineIndex, forms: &[TopForm], targets: &[usize]) -> LoadPlan {
    let first = targets.first().map(|&t| forms[t].ancestors.first().copied().unwrap_or(t));
    LoadPlan {
        text: load_text(cst, forms, targets),
        targets: targets
            .iter()
            .map(|&t| LoadTarget {
                described: format!("{}{}", forms[t].conditions_shown(cst), forms[t].describe(cst)),
                lines: lines.lines(cst.span(forms[t].item)),
                guards: guards(cst, forms, t),
                depth: forms[t].ancestors.len(),
            })
            .collect(),
        package: first.and_then(|f| package_at(cst, forms, cst.span(forms[f].item).start)),
    }
}

/// Where a definition is in a text: 1-based line and column (in characters) of the form itself,
/// and of the top-level form that holds it (the form itself, or its reader conditional or
/// wrapper), which is where SBCL records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefinitionPlace {
    /// The form itself, past any reader conditional.
    pub at: (usize, usize),
    /// The top-level form that holds it, past its reader conditionals (where the helper places
    /// what SBCL records).
    pub top_level: (usize, usize),
    /// The form's bytes, start and end.
    pub span: (usize, usize),
}

/// Every place in `source` of the definition `form_name` made by one of `operators` (`defun`,
/// `defmethod`, ...), found as `edit-lisp-form` finds it, in file order; empty when none matches
/// or the text does not read.
pub fn locate_definition(source: &[u8], operators: &[&str], form_name: &str) -> Vec<DefinitionPlace> {
    let Ok(cst) = Cst::parse(source) else { return Vec::new() };
    let forms = definitions(&cst);
    places(source, &cst, &forms, operators, form_name)
}

/// The operators of the definitions the helper labels with a kind (find-definition's and undo's
/// `defun`, `defvar`, `defclass`, ...), and `defpackage`: a form of one of them defines a name of
/// its own kind, never one another kind's search for the name fell back to.
const LABELLED_DEFINERS: &[&str] = &[
    "defun",
    "defgeneric",
    "defmacro",
    "defmethod",
    "define-compiler-macro",
    "defvar",
    "defparameter",
    "defconstant",
    "define-symbol-macro",
    "defsetf",
    "define-setf-expander",
    "defstruct",
    "define-condition",
    "defclass",
    "deftype",
    "define-method-combination",
    "defpackage",
];

/// Every place in `source` of the definition of `form_name` (a name, or `(setf name)`) made by a
/// defining form of another operator than those of [`LABELLED_DEFINERS`]: one whose name starts
/// with `def` and whose second element is the name, such as `(define-modify-macro appendf ...)`,
/// which defines the macro `appendf`, or a library's own `define-...` or `defun*`. In file order.
pub fn locate_definition_by_other_definers(source: &[u8], form_name: &str) -> Vec<DefinitionPlace> {
    let Ok(cst) = Cst::parse(source) else { return Vec::new() };
    let forms = definitions(&cst);
    let mut operators: Vec<&str> = forms
        .iter()
        .filter_map(|form| form.head.as_ref())
        .map(|head| head.operator.as_str())
        .filter(|operator| operator.starts_with("def") && !LABELLED_DEFINERS.contains(operator))
        .collect();
    operators.sort_unstable();
    operators.dedup();
    let mut found = places(source, &cst, &forms, &operators, form_name);
    found.sort_by_key(|place| place.span.0);
    found
}

/// The places of `form_name` made by one of `operators` among `forms`, the definitions of `cst`.
fn places(source: &[u8], cst: &Cst, forms: &[TopForm], operators: &[&str], form_name: &str) -> Vec<DefinitionPlace> {
    let lines = LineIndex::new(source);
    let place = |offset: usize| {
        let line_start = source[..offset].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        (lines.line(offset), String::from_utf8_lossy(&source[line_start..offset]).chars().count() + 1)
    };
    operators
        .iter()
        .filter_map(|operator| Query::parse(operator, form_name).ok())
        .flat_map(|query| {
            query
                .select(forms)
                .into_iter()
                .map(|form| {
                    let outermost = form.ancestors.first().map_or(form, |&a| &forms[a]);
                    let span = cst.span(form.form);
                    DefinitionPlace {
                        at: place(span.start),
                        top_level: place(cst.span(outermost.form).start),
                        span: (span.start, span.end),
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The bytes, start and end, of the top-level form of `source` that starts at `line` and
/// `column` (1-based, the column in characters), as SBCL records a definition that no operator
/// names (one a macro made); `None` when none starts there or the text does not read.
pub fn top_level_form_at(source: &[u8], line: usize, column: usize) -> Option<(usize, usize)> {
    let lines = LineIndex::new(source);
    Cst::top_level_spans(source).ok()?.into_iter().map(|(start, end)| (start as usize, end as usize)).find(
        |&(start, _)| {
            let line_start = source[..start].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            lines.line(start) == line
                && String::from_utf8_lossy(&source[line_start..start]).chars().count() + 1 == column
        },
    )
}

/// The top-level forms of a file and its definitions (forms processed at top level whose operator
/// starts with `def` or `define-`, nested ones included), each with the reader conditionals in
/// front of it and of its wrappers (see [`guards`]): only the image knows which of those it reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Counted {
    /// The conditionals of each top-level form.
    pub forms: Vec<Vec<(String, String)>>,
    /// The conditionals of each definition.
    pub definitions: Vec<Vec<(String, String)>>,
}

/// The top-level forms and definitions of `source`; `None` when it does not read.
pub fn definition_count(source: &[u8]) -> Option<Counted> {
    let cst = Cst::parse(source).ok()?;
    let forms = definitions(&cst);
    let mut counted = Counted::default();
    for (position, form) in forms.iter().enumerate() {
        let top_level = form.ancestors.is_empty();
        let defining = form.head.as_ref().is_some_and(|h| h.operator.starts_with("def"));
        if top_level || defining {
            let guards = guards(&cst, &forms, position);
            if top_level {
                counted.forms.push(guards.clone());
            }
            if defining {
                counted.definitions.push(guards);
            }
        }
    }
    Some(counted)
}

/// The operators of top-level forms that change how the rest of the file reads.
const READING_CONTEXT: [&str; 2] = ["in-package", "in-readtable"];

/// The text to compile for `targets`, positions in `forms` (from [`super::forms::definitions`]
/// of `cst`): the file up to the end of the last top-level form holding one of them.
pub(crate) fn load_text(cst: &Cst, forms: &[TopForm], targets: &[usize]) -> Vec<u8> {
    let source = cst.source();
    let outermost = |i: usize| forms[i].ancestors.first().copied().unwrap_or(i);
    let end = targets.iter().map(|&i| cst.span(forms[outermost(i)].item).end).max().unwrap_or(0);
    let mut text: Vec<u8> = source[..end].iter().map(|&b| if b == b'\n' || b == b'\r' { b } else { b' ' }).collect();
    let mut keep = |range: Range<usize>| text[range.clone()].copy_from_slice(&source[range]);

    let mut kept: Vec<Range<usize>> = Vec::new();
    let mut zeros: Vec<usize> = Vec::new();
    for (position, form) in forms.iter().enumerate() {
        let item = cst.span(form.item);
        if !form.ancestors.is_empty() || item.end > end {
            continue;
        }
        let holds_target = targets.iter().any(|&t| outermost(t) == position);
        let operator = form.head.as_ref().map(|h| h.operator.as_str());
        if holds_target {
            skeleton(cst, forms, targets, position, &mut kept);
        } else if operator.is_some_and(|op| READING_CONTEXT.contains(&op)) {
            kept.push(item);
        } else {
            kept.push(item.start..cst.span(form.form).start);
            zeros.push(item.end - 1);
        }
    }
    for range in kept {
        keep(range);
    }
    for at in zeros {
        text[at] = b'0';
    }
    text
}

/// Keeps the parts of `forms[position]` that loading its targets needs (see the module comment).
fn skeleton(cst: &Cst, forms: &[TopForm], targets: &[usize], position: usize, kept: &mut Vec<Range<usize>>) {
    let form = &forms[position];
    let item = cst.span(form.item);
    if targets.contains(&position) {
        kept.push(item);
        return;
    }
    kept.push(item.start..cst.span(form.form).start);
    let head_len = wrapper_head_len(cst, form.form, form.head.as_ref()).unwrap_or(usize::MAX);
    let mut elements = 0;
    for (index, &child) in cst.children(form.form).iter().enumerate() {
        let kind = cst.kind(child);
        if kind.is_trivia() {
            continue;
        }
        if kind == NodeKind::Delimiter || kind == NodeKind::Marker {
            kept.push(cst.span(child));
            continue;
        }
        elements += 1;
        if elements <= head_len {
            kept.push(cst.span(child));
            continue;
        }
        let inner = forms.iter().position(|f| f.container == Some(form.form) && f.top_index == index);
        if let Some(inner) = inner.filter(|&i| holds(forms, targets, i)) {
            skeleton(cst, forms, targets, inner, kept);
        }
    }
}

/// Whether `forms[position]` is one of `targets` or wraps one.
fn holds(forms: &[TopForm], targets: &[usize], position: usize) -> bool {
    targets.iter().any(|&t| t == position || forms[t].ancestors.contains(&position))
}

/// The reader conditionals in front of `form` and of the forms wrapping it, outermost first, as
/// (`+` or `-`, feature expression text): the image decides whether they hold.
pub(crate) fn guards(cst: &Cst, forms: &[TopForm], position: usize) -> Vec<(String, String)> {
    let form = &forms[position];
    form.ancestors
        .iter()
        .map(|&a| &forms[a])
        .chain(std::iter::once(form))
        .flat_map(|f| f.conditions.iter().copied())
        .map(|condition| guard(cst, condition))
        .collect()
}

fn guard(cst: &Cst, condition: NodeId) -> (String, String) {
    let mut parts = cst.children(condition).iter().filter(|&&id| !cst.kind(id).is_trivia());
    let marker = parts.next().map(|&id| String::from_utf8_lossy(cst.text(id)).into_owned()).unwrap_or_default();
    let feature = parts.next().map(|&id| String::from_utf8_lossy(cst.text(id)).into_owned()).unwrap_or_default();
    (marker.trim_start_matches('#').to_string(), feature)
}

/// The argument of the last top-level `in-package` before byte `before`, as written: the
/// package the file's forms there are read in.
pub(crate) fn package_at(cst: &Cst, forms: &[TopForm], before: usize) -> Option<String> {
    forms
        .iter()
        .filter(|f| f.ancestors.is_empty() && f.conditions.is_empty() && cst.span(f.item).end <= before)
        .filter(|f| f.head.as_ref().is_some_and(|h| h.operator == "in-package"))
        .filter_map(|f| cst.elements(f.form).nth(1))
        .map(|name| String::from_utf8_lossy(cst.text(name)).into_owned())
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::forms::definitions;

    fn text_for(source: &str, names: &[&str]) -> String {
        let cst = Cst::parse(source.as_bytes()).unwrap();
        let forms = definitions(&cst);
        let targets: Vec<usize> = names
            .iter()
            .map(|name| forms.iter().position(|f| f.form_name(&cst).as_deref() == Some(*name)).unwrap())
            .collect();
        String::from_utf8(load_text(&cst, &forms, &targets)).unwrap()
    }

    #[test]
    fn other_forms_become_zeros_at_their_end_and_in_package_stays() {
        let source = "(in-package :app)\n\n(defvar *x* 1)\n#+ccl (foo)\n(defun f (x)\n  x)\n(defun g ())\n";
        let text = text_for(source, &["f"]);
        assert_eq!(text, "(in-package :app)\n\n             0\n#+ccl     0\n(defun f (x)\n  x)");
        assert_eq!(text.len(), source.find("\n(defun g").unwrap());
    }

    #[test]
    fn nested_definitions_keep_their_wrappers_heads() {
        let source =
            "(a)\n#+sbcl\n(macrolet ((m () 1))\n  (declare (optimize speed))\n  (defun f () (m))\n  (defun g () 2))\n";
        let text = text_for(source, &["f"]);
        assert_eq!(
            text,
            "  0\n#+sbcl\n(macrolet ((m () 1))\n  (declare (optimize speed))\n  (defun f () (m))\n                )"
        );
        let source = "(eval-when (:compile-toplevel :load-toplevel :execute)\n  (progn (defvar *a* 1) (defun h ())))";
        assert_eq!(
            text_for(source, &["h"]),
            "(eval-when (:compile-toplevel :load-toplevel :execute)\n  (progn                (defun h ())))"
        );
    }

    #[test]
    fn an_edited_form_behind_a_conditional_is_loaded_with_it() {
        let source = b"(in-package :app)\n#+sbcl\n(defun f () 2)\n(defun g () (progn 3))\n";
        let start = 25;
        let plan = LoadPlan::for_spans(source, std::slice::from_ref(&(start..start + 14))).unwrap();
        assert_eq!(plan.targets.len(), 1);
        assert_eq!(plan.targets[0].described, "#+sbcl defun f");
        assert_eq!(plan.targets[0].guards, [("+".to_string(), "sbcl".to_string())]);
        assert_eq!(String::from_utf8(plan.text).unwrap(), "(in-package :app)\n#+sbcl\n(defun f () 2)");
    }

    #[test]
    fn a_definition_made_by_a_defining_form_of_its_own_is_found_by_its_name() {
        let source = b"(defvar appendf 1)\n\n(define-modify-macro appendf (&rest lists) append)\n\
                       (eval-when (:execute)\n  (define-modify-macro nconcf (&rest lists) nconc))\n(defun* appendf ())\n";
        let found = |name: &str| {
            locate_definition_by_other_definers(source, name).iter().map(|place| place.at).collect::<Vec<_>>()
        };
        // Not the variable of that name; `defun*`, a library's own definer, is one too.
        assert_eq!(found("appendf"), [(3, 1), (6, 1)]);
        assert_eq!(found("nconcf"), [(5, 3)]);
        assert!(found("append").is_empty());
        assert!(locate_definition(source, &["defun", "defgeneric", "defmacro"], "appendf").is_empty());
    }

    #[test]
    fn guards_and_package_are_read_from_the_text() {
        let source = "(in-package #:one)\n(in-package \"TWO\")\n#+sbcl (progn #-(or ccl) (defun f ()))";
        let cst = Cst::parse(source.as_bytes()).unwrap();
        let forms = definitions(&cst);
        let f = forms.iter().position(|f| f.form_name(&cst).as_deref() == Some("f")).unwrap();
        assert_eq!(guards(&cst, &forms, f), [("+".into(), "sbcl".into()), ("-".into(), "(or ccl)".into())]);
        assert_eq!(package_at(&cst, &forms, cst.span(forms[f].item).start).as_deref(), Some("\"TWO\""));
    }
}
