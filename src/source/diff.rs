//! Unified diffs of one edited region, for the model to review what an edit did.
//!
//! An edit changes one contiguous region, so the common prefix and suffix of the two texts are
//! found bytewise first and only the lines around the change are handed to `similar`: a one-form
//! edit of a large file stays cheap, and hunks are numbered as lines of the whole file.
//!
//! See docs/design.md, "Source files".

use std::time::Duration;

use similar::{Algorithm, ChangeTag, TextDiff};

const CONTEXT: usize = 3;
/// How long the alignment of a changed region may take before `similar` settles for a coarser
/// (still correct) diff: a pathological region must not hold up the edit's reply.
const ALIGN_BUDGET: Duration = Duration::from_millis(200);

/// A unified diff of `old` and `new` with 3 lines of context, labelled `a/{path}` and `b/{path}`.
/// Empty when the texts are equal.
pub fn unified_diff(old: &[u8], new: &[u8], path: &str) -> String {
    if old == new {
        return String::new();
    }
    format!("--- a/{path}\n+++ b/{path}\n{}", hunks(old, new, CONTEXT))
}

/// The hunks of a diff of `old` and `new` without context lines or file names, for a small
/// change the reply names the file of: `@@ -7 +7 @@`, then the lines removed and added. Empty
/// when the texts are equal.
pub fn compact_diff(old: &[u8], new: &[u8]) -> String {
    if old == new {
        return String::new();
    }
    hunks(old, new, 0)
}

/// The hunks of the diff of `old` and `new` with `context` lines around each change.
fn hunks(old: &[u8], new: &[u8], context: usize) -> String {
    let window = Window::around_change(old, new, context);
    let diff = TextDiff::configure()
        .algorithm(Algorithm::Myers)
        .timeout(ALIGN_BUDGET)
        .diff_lines(&old[window.start..window.old_end], &new[window.start..window.new_end]);
    let mut out = String::new();
    for hunk in diff.grouped_ops(context) {
        let (Some(first), Some(last)) = (hunk.first(), hunk.last()) else { continue };
        let (old_start, new_start) = (first.old_range().start, first.new_range().start);
        out.push_str(&format!(
            "@@ -{} +{} @@\n",
            range(window.first_line + old_start, last.old_range().end - old_start),
            range(window.first_line + new_start, last.new_range().end - new_start)
        ));
        for change in hunk.iter().flat_map(|op| diff.iter_changes(op)) {
            let mark = match change.tag() {
                ChangeTag::Equal => ' ',
                ChangeTag::Delete => '-',
                ChangeTag::Insert => '+',
            };
            push_line(&mut out, mark, change.value());
        }
    }
    out
}

/// The part of both texts a diff needs: whole lines from `context` lines before the first
/// difference to `context` lines after the last one. Outside it the texts are equal line by line.
#[derive(Debug, PartialEq, Eq)]
struct Window {
    /// Where the window starts in both texts (they are equal before it).
    start: usize,
    old_end: usize,
    new_end: usize,
    /// 0-based line number of `start`.
    first_line: usize,
}

impl Window {
    fn around_change(old: &[u8], new: &[u8], context: usize) -> Window {
        let same_prefix = old.iter().zip(new).take_while(|(x, y)| x == y).count();
        // The suffix may not reach into the prefix in the shorter text.
        let max_suffix = old.len().min(new.len()) - same_prefix;
        let same_suffix = old.iter().rev().zip(new.iter().rev()).take(max_suffix).take_while(|(x, y)| x == y).count();

        let mut start = line_start(old, same_prefix);
        for _ in 0..context {
            start = start.checked_sub(1).map_or(0, |before| line_start(old, before));
        }
        // The first line that starts inside the common suffix, then CONTEXT more lines.
        let mut old_end = line_end(old, old.len() - same_suffix);
        for _ in 0..context {
            old_end = line_end(old, old_end);
        }
        let new_end = old_end + new.len() - old.len();
        let first_line = old[..start].iter().filter(|&&b| b == b'\n').count();
        Window { start, old_end, new_end, first_line }
    }
}

/// The start of the line holding `pos`.
fn line_start(text: &[u8], pos: usize) -> usize {
    text[..pos].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

/// The end of the line holding `pos` (past its line break), or the end of the text.
fn line_end(text: &[u8], pos: usize) -> usize {
    text[pos..].iter().position(|&b| b == b'\n').map_or(text.len(), |i| pos + i + 1)
}

/// `start,count` as unified diffs write it: 1-based, `,count` left out when it is 1, and the
/// line before the hunk when it is empty.
fn range(start: usize, count: usize) -> String {
    match count {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        _ => format!("{},{count}", start + 1),
    }
}

/// One line of a hunk. Only the file's last line can lack a line break, so a line without one
/// gets the marker that says the file ends there.
fn push_line(out: &mut String, mark: char, line: &[u8]) {
    let text = line.strip_suffix(b"\n").map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    out.push(mark);
    out.push_str(&String::from_utf8_lossy(text.unwrap_or(line)));
    out.push('\n');
    if text.is_none() {
        out.push_str("\\ No newline at end of file\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(unified_diff(b"a\nb\n", b"a\nb\n", "f"), "");
    }

    #[test]
    fn one_changed_line_in_the_middle() {
        let old = b"1\n2\n3\n4\n5\n6\n7\n8\n9\n";
        let new = b"1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
        assert_eq!(
            unified_diff(old, new, "x.lisp"),
            "--- a/x.lisp\n+++ b/x.lisp\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
        );
    }

    #[test]
    fn distant_changes_make_separate_hunks_and_near_ones_merge() {
        let old: String = (1..=30).map(|i| format!("{i}\n")).collect();
        let new = old.replace("\n5\n", "\nfive\n").replace("\n25\n", "\nx\n").replace("\n28\n", "\ny\n");
        let diff = unified_diff(old.as_bytes(), new.as_bytes(), "f");
        let headers: Vec<&str> = diff.lines().filter(|l| l.starts_with("@@")).collect();
        assert_eq!(headers, ["@@ -2,7 +2,7 @@", "@@ -22,9 +22,9 @@"]);
    }

    #[test]
    fn insertion_at_the_start_and_crlf_lines() {
        let diff = unified_diff(b"(a)\r\n", b"(new)\r\n\r\n(a)\r\n", "f");
        assert_eq!(diff, "--- a/f\n+++ b/f\n@@ -1 +1,3 @@\n+(new)\n+\n (a)\n");
    }

    #[test]
    fn missing_final_newline_is_marked() {
        let diff = unified_diff(b"(a)\n(b)", b"(a)\n(c)", "f");
        assert_eq!(
            diff,
            "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n (a)\n-(b)\n\\ No newline at end of file\n+(c)\n\\ No newline at end of file\n"
        );
        let diff = unified_diff(b"(a)", b"(a)\n\n(b)", "f");
        assert_eq!(diff, "--- a/f\n+++ b/f\n@@ -1 +1,3 @@\n-(a)\n\\ No newline at end of file\n+(a)\n+\n+(b)\n\\ No newline at end of file\n");
    }

    /// Applies a unified diff of LF text, the way `patch` would.
    fn apply(old: &str, diff: &str) -> String {
        let old: Vec<&str> = old.split_inclusive('\n').collect();
        let mut out = String::new();
        let mut next = 0; // index of the next old line not yet copied
        let mut lines = diff.lines().skip(2).peekable();
        while let Some(header) = lines.next() {
            let start: usize = header[4..].split([',', ' ']).next().and_then(|n| n.parse().ok()).expect("header");
            let count_is_zero = header.split(' ').nth(1).is_some_and(|r| r.ends_with(",0"));
            let first = if count_is_zero { start } else { start - 1 };
            out.extend(old[next..first].iter().copied());
            next = first;
            while let Some(line) = lines.next_if(|l| !l.starts_with("@@")) {
                let no_newline = lines.next_if(|l| l.starts_with('\\')).is_some();
                let text = format!("{}{}", &line[1..], if no_newline { "" } else { "\n" });
                match &line[..1] {
                    " " => {
                        out.push_str(&text);
                        next += 1;
                    }
                    "-" => next += 1,
                    _ => out.push_str(&text),
                }
            }
        }
        out.extend(old[next..].iter().copied());
        out
    }

    proptest::proptest! {
        #[test]
        fn the_diff_turns_old_into_new(
            lines in proptest::collection::vec("[abc]{0,3}", 0..40),
            from in 0usize..40,
            removed in 0usize..8,
            added in proptest::collection::vec("[abcx]{0,3}", 0..8),
            final_newline in proptest::bool::ANY,
        ) {
            let join = |lines: &[String]| {
                let mut text = lines.join("\n");
                if final_newline && !text.is_empty() {
                    text.push('\n');
                }
                text
            };
            let from = from.min(lines.len());
            let to = (from + removed).min(lines.len());
            let mut edited = lines.clone();
            edited.splice(from..to, added);
            let (old, new) = (join(&lines), join(&edited));
            let diff = unified_diff(old.as_bytes(), new.as_bytes(), "f");
            proptest::prop_assert_eq!(diff.is_empty(), old == new);
            proptest::prop_assert_eq!(apply(&old, &diff), new, "{}", diff);
        }
    }

    #[test]
    fn a_region_with_no_line_in_common_is_removed_and_added() {
        let old: String = (0..2000).map(|i| format!("a{i}\n")).collect();
        let new: String = (0..2000).map(|i| format!("b{i}\n")).collect();
        let diff = unified_diff(old.as_bytes(), new.as_bytes(), "f");
        assert!(diff.starts_with("--- a/f\n+++ b/f\n@@ -1,2000 +1,2000 @@\n-a0\n"));
    }
}
