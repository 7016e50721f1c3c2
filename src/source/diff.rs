//! Unified diffs of one edited region, for the model to review what an edit did.
//!
//! An edit changes one contiguous region, so the lines before and after it are trimmed as common
//! prefix and suffix first; only the lines in between are aligned, with a longest common
//! subsequence when that region is small enough to afford it.

const CONTEXT: usize = 3;
/// Largest region (old lines × new lines) aligned line by line; beyond it the region is shown as
/// removed and added, which is still a correct diff.
const MAX_ALIGN_CELLS: usize = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equal,
    Delete,
    Insert,
}

/// Lines with their terminators, so a missing final newline is visible.
fn split_lines(text: &[u8]) -> Vec<&[u8]> {
    text.split_inclusive(|&b| b == b'\n').collect()
}

/// A unified diff of `old` and `new` with 3 lines of context, labelled `a/{path}` and `b/{path}`.
/// Empty when the texts are equal.
pub fn unified_diff(old: &[u8], new: &[u8], path: &str) -> String {
    // Only the changed region and its context are split into lines: the common prefix and
    // suffix are found bytewise, which keeps a one-form edit cheap on a large file.
    let window = Window::around_change(old, new);
    let a = split_lines(&old[window.start..window.old_end]);
    let b = split_lines(&new[window.start..window.new_end]);
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..].iter().rev().zip(b[prefix..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (a_mid, b_mid) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    if a_mid.is_empty() && b_mid.is_empty() {
        return String::new();
    }

    // The edit script, from CONTEXT lines before the region to CONTEXT lines after it.
    let lead = prefix.min(CONTEXT);
    let mut ops = vec![Op::Equal; lead];
    ops.extend(align(a_mid, b_mid));
    ops.extend(std::iter::repeat_n(Op::Equal, suffix.min(CONTEXT)));
    let from = prefix - lead;
    let a_last = window.old_end == old.len();
    let b_last = window.new_end == new.len();

    let mut out = format!("--- a/{path}\n+++ b/{path}\n");
    for (first, last) in hunk_ranges(&ops) {
        // Positions within the window at the start of the hunk.
        let skipped = &ops[..first];
        let mut ai = from + skipped.iter().filter(|&&op| op != Op::Insert).count();
        let mut bi = from + skipped.iter().filter(|&&op| op != Op::Delete).count();
        let hunk = &ops[first..=last];
        let a_len = hunk.iter().filter(|&&op| op != Op::Insert).count();
        let b_len = hunk.iter().filter(|&&op| op != Op::Delete).count();
        out.push_str(&format!(
            "@@ -{} +{} @@\n",
            range(window.first_line + ai, a_len),
            range(window.first_line + bi, b_len)
        ));
        for &op in hunk {
            let (mark, line, last_of_file) = match op {
                Op::Equal => (' ', a[ai], a_last && b_last && ai + 1 == a.len() && bi + 1 == b.len()),
                Op::Delete => ('-', a[ai], a_last && ai + 1 == a.len()),
                Op::Insert => ('+', b[bi], b_last && bi + 1 == b.len()),
            };
            push_line(&mut out, mark, line, last_of_file);
            match op {
                Op::Equal => {
                    ai += 1;
                    bi += 1;
                }
                Op::Delete => ai += 1,
                Op::Insert => bi += 1,
            }
        }
    }
    out
}

/// The part of both texts a diff needs: whole lines from CONTEXT lines before the first
/// difference to CONTEXT lines after the last one. Outside it the texts are equal line by line.
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
    fn around_change(old: &[u8], new: &[u8]) -> Window {
        let same_prefix = old.iter().zip(new).take_while(|(x, y)| x == y).count();
        // The suffix may not reach into the prefix in the shorter text.
        let max_suffix = old.len().min(new.len()) - same_prefix;
        let same_suffix = old.iter().rev().zip(new.iter().rev()).take(max_suffix).take_while(|(x, y)| x == y).count();

        let mut start = line_start(old, same_prefix);
        for _ in 0..CONTEXT {
            start = start.checked_sub(1).map_or(0, |before| line_start(old, before));
        }
        // The first line that starts inside the common suffix, then CONTEXT more lines.
        let mut old_end = line_end(old, old.len() - same_suffix);
        for _ in 0..CONTEXT {
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

fn push_line(out: &mut String, mark: char, line: &[u8], last_of_file: bool) {
    let text = line.strip_suffix(b"\n").map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    out.push(mark);
    out.push_str(&String::from_utf8_lossy(text.unwrap_or(line)));
    out.push('\n');
    if last_of_file && text.is_none() {
        out.push_str("\\ No newline at end of file\n");
    }
}

/// Groups changed lines into hunks: inclusive op ranges with up to CONTEXT equal lines around
/// them, merging changes closer than 2 × CONTEXT lines.
fn hunk_ranges(ops: &[Op]) -> Vec<(usize, usize)> {
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    let changes = ops.iter().enumerate().filter(|(_, &op)| op != Op::Equal).map(|(i, _)| i);
    for change in changes {
        let first = change.saturating_sub(CONTEXT);
        let last = (change + CONTEXT).min(ops.len() - 1);
        match hunks.last_mut() {
            Some((_, end)) if first <= *end + 1 => *end = last,
            _ => hunks.push((first, last)),
        }
    }
    hunks
}

/// An edit script turning `a` into `b`.
fn align(a: &[&[u8]], b: &[&[u8]]) -> Vec<Op> {
    let (n, m) = (a.len(), b.len());
    if n.saturating_mul(m) > MAX_ALIGN_CELLS {
        let mut ops = vec![Op::Delete; n];
        ops.extend(std::iter::repeat_n(Op::Insert, m));
        return ops;
    }
    // lcs[i * (m + 1) + j]: length of the longest common subsequence of a[i..] and b[j..].
    let width = m + 1;
    let mut lcs = vec![0u32; (n + 1) * width];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * width + j] = if a[i] == b[j] {
                lcs[(i + 1) * width + j + 1] + 1
            } else {
                lcs[(i + 1) * width + j].max(lcs[i * width + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::with_capacity(n + m);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push(Op::Equal);
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[(i + 1) * width + j] >= lcs[i * width + j + 1]) {
            ops.push(Op::Delete);
            i += 1;
        } else {
            ops.push(Op::Insert);
            j += 1;
        }
    }
    ops
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
    fn huge_regions_fall_back_to_remove_and_add() {
        let old: String = (0..2000).map(|i| format!("a{i}\n")).collect();
        let new: String = (0..2000).map(|i| format!("b{i}\n")).collect();
        let diff = unified_diff(old.as_bytes(), new.as_bytes(), "f");
        assert!(diff.starts_with("--- a/f\n+++ b/f\n@@ -1,2000 +1,2000 @@\n-a0\n"));
    }
}
