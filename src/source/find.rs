//! Picks the one top-level form an edit targets, or explains why there is not exactly one.
//!
//! See docs/design.md, "Source files".

use super::cst::{Cst, LineIndex};
use super::forms::{Query, TopForm};

/// Finds the form `query` names. `index` (1-based, in file order) picks one of several matches.
/// The error text is meant for the model: it lists the candidates or the nearest misses.
pub(crate) fn find_target<'f>(
    cst: &Cst,
    lines: &LineIndex,
    forms: &'f [TopForm],
    query: &Query,
    wanted: &str,
    index: Option<usize>,
) -> Result<&'f TopForm, String> {
    let matches = query.select(forms);
    match (matches.len(), index) {
        (0, _) => Err(not_found(cst, lines, forms, query, wanted)),
        (1, None) => Ok(matches[0]),
        (n, Some(i)) if (1..=n).contains(&i) => Ok(matches[i - 1]),
        (n, index) => {
            let problem = match index {
                Some(i) => format!("`index` {i} is out of range: `{wanted}` matches {n} forms"),
                None => format!("`{wanted}` matches {n} forms"),
            };
            let mut text = format!(
                "{problem}. Pass `index` (1-based, in file order) to pick one, or make `form_name` more specific:"
            );
            for (i, form) in matches.iter().enumerate().take(MAX_LISTED) {
                text.push_str(&format!("\n  {}. {}", i + 1, located(cst, lines, form)));
            }
            push_more(&mut text, n);
            Err(text)
        }
    }
}

/// `lines 3-5: #+sbcl defun foo`
pub(crate) fn located(cst: &Cst, lines: &LineIndex, form: &TopForm) -> String {
    format!("{}: {}{}", lines.lines(cst.span(form.item)), form.conditions_shown(cst), form.describe(cst))
}

const MAX_HINTS: usize = 5;
/// Candidates listed in full before the rest are only counted.
const MAX_LISTED: usize = 30;

fn push_more(text: &mut String, total: usize) {
    if total > MAX_LISTED {
        text.push_str(&format!("\n  … and {} more", total - MAX_LISTED));
    }
}

fn not_found(cst: &Cst, lines: &LineIndex, forms: &[TopForm], query: &Query, wanted: &str) -> String {
    let mut text = format!("No `{wanted}` in this file.");
    let same_name = |f: &&TopForm| f.head.as_ref().and_then(|h| h.name.as_ref()) == Some(&query.name);
    let same_operator = |f: &&TopForm| f.head.as_ref().is_some_and(|h| h.operator == query.operator);

    if query.is_method() {
        let methods: Vec<&TopForm> = forms.iter().filter(same_name).filter(same_operator).collect();
        if !methods.is_empty() {
            text.push_str(" These methods have that name; use the part after `defmethod` as `form_name`:");
            for method in methods.iter().take(MAX_LISTED) {
                text.push_str(&format!("\n  {}", located(cst, lines, method)));
            }
            push_more(&mut text, methods.len());
            return text;
        }
    }

    let other_kinds: Vec<&TopForm> =
        forms.iter().filter(same_name).filter(|f| !same_operator(f)).take(MAX_HINTS).collect();
    let similar = similar_names(forms, query);
    for (heading, hints) in [("Same name, other operator:", &other_kinds), ("Similar names:", &similar)] {
        if !hints.is_empty() {
            text.push('\n');
            text.push_str(heading);
            for form in hints {
                text.push_str(&format!("\n  {}", located(cst, lines, form)));
            }
        }
    }

    if other_kinds.is_empty() && similar.is_empty() {
        if forms.iter().any(|f| same_operator(&f)) {
            text.push_str(" Nothing with a similar name either.");
        } else {
            text.push_str(&format!(" The file has no `{}` forms at all.", query.operator));
        }
        text.push_str(" `lisp-outline` lists the file's top-level forms.");
    }
    text
}

/// Forms whose names are a small edit away from the wanted one or contain it, nearest first;
/// forms with the wanted operator come before others at the same distance.
fn similar_names<'f>(forms: &'f [TopForm], query: &Query) -> Vec<&'f TopForm> {
    let wanted = query.name.key();
    let limit = (wanted.chars().count() / 3).max(1);
    let mut scored: Vec<(usize, bool, usize, &TopForm)> = forms
        .iter()
        .enumerate()
        .filter_map(|(position, form)| {
            let head = form.head.as_ref()?;
            let name = head.name.as_ref()?;
            if name == &query.name {
                return None;
            }
            let contains = wanted.chars().count() >= 3 && (name.key().contains(wanted) || wanted.contains(name.key()));
            // Lengths bound the distance from below; skip the full computation when that is enough.
            if !contains && wanted.chars().count().abs_diff(name.key().chars().count()) > limit {
                return None;
            }
            let distance = edit_distance(wanted, name.key())?;
            (distance <= limit || contains).then_some((distance, head.operator != query.operator, position, form))
        })
        .collect();
    scored.sort_by_key(|&(distance, other_operator, position, _)| (distance, other_operator, position));
    scored.into_iter().take(MAX_HINTS).map(|(.., form)| form).collect()
}

/// Edit distance over characters, counting a swap of two neighbours as one edit (the optimal
/// string alignment distance), since transposed letters are a common typo; `None` for names too
/// long to be worth comparing. The one measure of "a near name" in this crate.
pub fn edit_distance(a: &str, b: &str) -> Option<usize> {
    const MAX_CHARS: usize = 100;
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len() > MAX_CHARS || b.len() > MAX_CHARS {
        return None;
    }
    // Three rows of the distance table: two rows back, the previous one and the current one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for i in 0..a.len() {
        current[0] = i + 1;
        for j in 0..b.len() {
            let substitute = previous[j] + usize::from(a[i] != b[j]);
            let mut best = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
            if i > 0 && j > 0 && a[i] == b[j - 1] && a[i - 1] == b[j] {
                best = best.min(before[j - 1] + 1);
            }
            current[j + 1] = best;
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    Some(previous[b.len()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::forms::definitions;

    fn find(source: &str, form_type: &str, form_name: &str, index: Option<usize>) -> Result<String, String> {
        let cst = Cst::parse(source.as_bytes()).expect("parses");
        let lines = LineIndex::new(source.as_bytes());
        let forms = definitions(&cst);
        let query = Query::parse(form_type, form_name).expect("query");
        let wanted = format!("{form_type} {form_name}");
        find_target(&cst, &lines, &forms, &query, &wanted, index).map(|f| located(&cst, &lines, f))
    }

    const SOURCE: &str = "\
(defgeneric draw (shape))
(defmethod draw ((s circle)) 1)
(defmethod draw ((s square)) 2)
#+sbcl
(defun string-split (s)
  s)
#-sbcl (defun string-split (s) s)
(defun string-join (s) s)
(defmacro frob (x) x)
";

    #[test]
    fn a_single_match_is_found() {
        assert_eq!(find(SOURCE, "defmethod", "draw (square)", None), Ok("line 3: defmethod draw (square)".into()));
        assert_eq!(find(SOURCE, "defgeneric", "draw", None), Ok("line 1: defgeneric draw".into()));
    }

    #[test]
    fn several_matches_are_listed_and_index_picks_one() {
        let error = find(SOURCE, "defun", "string-split", None).unwrap_err();
        assert!(error.contains("matches 2 forms"), "{error}");
        assert!(error.contains("1. lines 4-6: #+sbcl defun string-split"), "{error}");
        assert!(error.contains("2. line 7: #-sbcl defun string-split"), "{error}");
        assert_eq!(find(SOURCE, "defun", "string-split", Some(2)), Ok("line 7: #-sbcl defun string-split".into()));
        let error = find(SOURCE, "defun", "string-split", Some(3)).unwrap_err();
        assert!(error.contains("`index` 3 is out of range"), "{error}");
        let error = find(SOURCE, "defun", "string-join", Some(2)).unwrap_err();
        assert!(error.contains("out of range"), "{error}");
    }

    #[test]
    fn misses_come_with_hints() {
        let error = find(SOURCE, "defun", "strng-split", None).unwrap_err();
        assert!(error.contains("Similar names:\n  lines 4-6: #+sbcl defun string-split\n  line 7"), "{error}");

        let error = find(SOURCE, "defun", "frob", None).unwrap_err();
        assert!(error.contains("Same name, other operator:\n  line 9: defmacro frob"), "{error}");

        let error = find(SOURCE, "defmethod", "draw (hexagon)", None).unwrap_err();
        assert!(error.contains("line 2: defmethod draw (circle)"), "{error}");
        assert!(error.contains("line 3: defmethod draw (square)"), "{error}");

        let error = find(SOURCE, "defclass", "zzz", None).unwrap_err();
        assert!(error.contains("no `defclass` forms at all"), "{error}");
        assert!(error.contains("lisp-outline"), "{error}");
    }

    #[test]
    fn long_listings_are_cut() {
        let source: String = (0..40).map(|i| format!("(defmethod draw ((s shape{i})))\n")).collect();
        let error = find(&source, "defmethod", "draw", None).unwrap_err();
        assert!(error.contains("\n  30. line 30: defmethod draw (shape29)\n  … and 10 more"), "{error}");
        let error = find(&source, "defmethod", "draw (circle)", None).unwrap_err();
        assert!(error.ends_with("line 30: defmethod draw (shape29)\n  … and 10 more"), "{error}");
    }

    #[test]
    fn edit_distance_counts_characters() {
        assert_eq!(edit_distance("kitten", "sitting"), Some(3));
        assert_eq!(edit_distance("λx", "x"), Some(1));
        assert_eq!(edit_distance("", "abc"), Some(3));
        assert_eq!(edit_distance("scael", "scale"), Some(1));
        assert_eq!(edit_distance("ab", "ba"), Some(1));
    }
}
