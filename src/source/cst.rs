//! A lossless concrete syntax tree of Common Lisp source.
//!
//! Every byte of the input belongs to exactly one leaf (whitespace and comments included), so
//! printing the leaves in order gives the input back byte for byte. Nodes live in one arena and
//! the tree is built with an explicit stack: neither parsing nor dropping a deeply nested input
//! recurses.
//!
//! See docs/design.md, "Source files".

use std::fmt;
use std::ops::Range;

use super::lexer::{self, LexErrorKind, Lexeme};
pub use super::lexer::{NodeKind, Prefix};

/// A node of one [`Cst`], meaningful only to the tree that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u32);

impl NodeId {
    fn index(self) -> usize {
        self.0 as usize
    }
}

/// Offsets and counts are `u32` to keep nodes small (a source has about one node per four
/// bytes); [`MAX_SOURCE_LEN`] keeps them in range.
#[derive(Debug, Clone, Copy)]
struct Node {
    kind: NodeKind,
    start: u32,
    end: u32,
    first_child: u32,
    child_count: u32,
}

/// The largest source the tree can index: at most two nodes per byte must fit in a `u32`.
pub const MAX_SOURCE_LEN: usize = (u32::MAX / 2) as usize;

/// A parsed source text. Offsets are byte offsets into [`Cst::source`].
#[derive(Debug)]
pub struct Cst<'a> {
    source: &'a [u8],
    nodes: Vec<Node>,
    child_ids: Vec<NodeId>,
    top: Vec<NodeId>,
}

impl<'a> Cst<'a> {
    /// Parses a whole text, which must read as Lisp: an unbalanced or unterminated construct is
    /// an error, not a partial tree. Texts of 2 GiB or more are refused.
    pub fn parse(source: &'a [u8]) -> Result<Self, ParseError> {
        if source.len() > MAX_SOURCE_LEN {
            return Err(ParseError {
                message: format!("the text is too large to parse (over {} MiB)", MAX_SOURCE_LEN >> 20),
                at: Location { offset: 0, line: 1, column: 1 },
                opener: None,
                hint: None,
            });
        }
        Builder::new(source, true).run()
    }

    /// Whether a whole text reads as Lisp, as [`Cst::parse`] decides it, and how many top-level
    /// forms it holds, without keeping the tree: the memory used is in proportion to the largest
    /// top-level form, not to the text.
    pub fn check(source: &[u8]) -> Result<usize, ParseError> {
        if source.len() > MAX_SOURCE_LEN {
            return Cst::parse(source).map(|cst| cst.top_level_forms().count());
        }
        let mut builder = Builder::new(source, false);
        builder.scan()?;
        Ok(builder.top_forms)
    }

    /// [`Cst::check`], giving the span of each top-level form (a reader conditional with the
    /// form it guards) instead of their count: 8 bytes a form.
    pub(crate) fn top_level_spans(source: &[u8]) -> Result<Vec<(u32, u32)>, ParseError> {
        if source.len() > MAX_SOURCE_LEN {
            return Err(Cst::parse(source).err().unwrap_or_else(|| unreachable!("too large to parse")));
        }
        let mut builder = Builder::new(source, false);
        builder.spans = Some(Vec::new());
        builder.scan()?;
        Ok(builder.spans.unwrap_or_default())
    }

    /// The text the tree was parsed from.
    pub fn source(&self) -> &'a [u8] {
        self.source
    }

    /// The top-level nodes in order: forms and the trivia between them.
    pub fn top_level(&self) -> &[NodeId] {
        &self.top
    }

    /// The top-level nodes that are forms, not trivia.
    pub fn top_level_forms(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.top.iter().copied().filter(|&id| !self.kind(id).is_trivia())
    }

    /// What the node is.
    pub fn kind(&self, id: NodeId) -> NodeKind {
        self.nodes[id.index()].kind
    }

    /// The node's bytes in the source, as a range of byte offsets.
    pub fn span(&self, id: NodeId) -> Range<usize> {
        let node = &self.nodes[id.index()];
        node.start as usize..node.end as usize
    }

    /// The node's bytes: the source over its [`span`](Cst::span).
    pub fn text(&self, id: NodeId) -> &'a [u8] {
        &self.source[self.span(id)]
    }

    /// All children, delimiters, markers and trivia included.
    pub fn children(&self, id: NodeId) -> &[NodeId] {
        let node = &self.nodes[id.index()];
        let first = node.first_child as usize;
        &self.child_ids[first..first + node.child_count as usize]
    }

    /// The forms inside a list, vector or prefixed node: its children minus delimiters, markers
    /// and trivia. For a reader conditional that is the feature expression and the guarded form.
    pub fn elements(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.children(id).iter().copied().filter(|&child| {
            let kind = self.kind(child);
            !kind.is_trivia() && kind != NodeKind::Delimiter && kind != NodeKind::Marker
        })
    }

    /// The leaves under `id` (or `id` itself if it is a leaf), in source order.
    pub fn leaves(&self, id: NodeId) -> Leaves<'_, 'a> {
        Leaves { cst: self, root: Some(id), stack: Vec::new() }
    }

    /// The tree printed back to text by concatenating its leaves; equal to the input.
    pub fn print(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.source.len());
        for leaf in (Leaves { cst: self, root: None, stack: vec![&self.top[..]] }) {
            out.extend_from_slice(self.text(leaf));
        }
        out
    }
}

/// Depth-first iterator over leaves; the explicit stack keeps it safe on any nesting depth.
pub struct Leaves<'c, 'a> {
    cst: &'c Cst<'a>,
    root: Option<NodeId>,
    stack: Vec<&'c [NodeId]>,
}

impl Iterator for Leaves<'_, '_> {
    type Item = NodeId;

    fn next(&mut self) -> Option<NodeId> {
        if let Some(root) = self.root.take() {
            let children = self.cst.children(root);
            if children.is_empty() {
                return Some(root);
            }
            self.stack.push(children);
        }
        loop {
            let siblings = self.stack.last_mut()?;
            let Some((&id, rest)) = siblings.split_first() else {
                self.stack.pop();
                continue;
            };
            *siblings = rest;
            let children = self.cst.children(id);
            if children.is_empty() {
                return Some(id);
            }
            self.stack.push(children);
        }
    }
}

/// A 1-based line and column (in characters) with the byte offset they stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Byte offset into the source.
    pub offset: usize,
    /// Line number, from 1.
    pub line: usize,
    /// Column in characters, from 1; a byte order mark does not count.
    pub column: usize,
}

impl Location {
    fn of(source: &[u8], offset: usize) -> Self {
        let offset = offset.min(source.len());
        let before = &source[..offset];
        let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        let mut in_line = &before[line_start..];
        if line_start == 0 {
            in_line = in_line.strip_prefix(BOM).unwrap_or(in_line);
        }
        let column = 1 + String::from_utf8_lossy(in_line).chars().count();
        Location { offset, line, column }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// Line lookups for many offsets of one text.
#[derive(Debug, Clone)]
pub(crate) struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    pub fn new(source: &[u8]) -> Self {
        let starts = std::iter::once(0)
            .chain(source.iter().enumerate().filter(|(_, &b)| b == b'\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { starts }
    }

    /// The 1-based line of a byte offset.
    pub fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset)
    }

    /// The lines a span covers (an empty span counts as the line it is on).
    pub fn lines(&self, span: Range<usize>) -> LineRange {
        LineRange { first: self.line(span.start), last: self.line(span.end.max(span.start + 1) - 1) }
    }
}

/// How many lines a text has, as an editor counts them: a final line break ends the last line
/// rather than starting a new one.
pub fn line_count(text: &[u8]) -> usize {
    let breaks = text.iter().filter(|&&b| b == b'\n').count();
    breaks + usize::from(!text.is_empty() && !text.ends_with(b"\n"))
}

/// 1-based first and last line; displayed as `line 3` or `lines 3-5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRange {
    /// The first line, 1-based.
    pub first: usize,
    /// The last line, 1-based.
    pub last: usize,
}

impl fmt::Display for LineRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "line {}", self.first)
        } else {
            write!(f, "lines {}-{}", self.first, self.last)
        }
    }
}

pub(crate) const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Why a source text does not read, where, and which opener was left open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// A reader-style message, e.g. "unmatched close parenthesis".
    pub message: String,
    /// Where reading failed.
    pub at: Location,
    /// The construct that is still open at `at`: a `(`, `"`, `#|`, `|` or a prefix like `'`.
    pub opener: Option<Opener>,
    pub(crate) hint: Option<String>,
}

/// An opening delimiter or prefix whose construct the text never completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opener {
    /// Where the opener starts.
    pub at: Location,
    /// The opener's line from the opener on, shortened: enough to recognise it.
    pub excerpt: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.message, self.at)?;
        if let Some(opener) = &self.opener {
            write!(f, "; it was opened at {}: `{}`", opener.at, opener.excerpt)?;
        }
        if let Some(hint) = &self.hint {
            write!(f, ". {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ParseError {}

fn excerpt(source: &[u8], offset: usize) -> String {
    const MAX_CHARS: usize = 40;
    let rest = &source[offset.min(source.len())..];
    let line = &rest[..rest.iter().position(|&b| b == b'\n' || b == b'\r').unwrap_or(rest.len())];
    let text = String::from_utf8_lossy(line);
    let mut shown: String = text.chars().take(MAX_CHARS).collect();
    if text.chars().nth(MAX_CHARS).is_some() {
        shown.push('…');
    }
    shown
}

enum FrameKind {
    /// A list or vector waiting for its `)`.
    Open(NodeKind),
    /// A prefix waiting for `forms_left` more forms.
    Prefix { prefix: Prefix, forms_left: usize },
}

struct Frame {
    kind: FrameKind,
    start: usize,
    /// Where this frame's children begin in [`Builder::pending`].
    pending_from: usize,
}

struct Builder<'a> {
    source: &'a [u8],
    nodes: Vec<Node>,
    child_ids: Vec<NodeId>,
    /// Children of every open frame, innermost last; what is left at the end is the top level.
    pending: Vec<NodeId>,
    stack: Vec<Frame>,
    /// How many frames in `stack` are lists or vectors (the rest are prefixes).
    open_lists: usize,
    /// The first list that starts at the beginning of a line while a top-level form is still
    /// open: where a missing `)` most likely belongs.
    first_nested_line_opener: Option<usize>,
    /// The span of the last complete top-level form, to explain an extra `)`.
    last_top_level: Option<Range<usize>>,
    /// Whether the tree is kept; if not ([`Cst::check`]), each complete top-level form is
    /// counted and dropped.
    keep: bool,
    /// Top-level forms completed.
    top_forms: usize,
    /// Their spans, when asked for ([`Cst::top_level_spans`]).
    spans: Option<Vec<(u32, u32)>>,
}

impl<'a> Builder<'a> {
    fn new(source: &'a [u8], keep: bool) -> Self {
        // Real code has about one node per four bytes (measured on the Debian corpus), dense code
        // up to one per two. Capacity never touched is never resident, so reserving for dense
        // code costs nothing, and a Vec that need not grow is never copied (a copy would hold
        // the old and the new buffer at once).
        let capacity = if keep { source.len() / 2 } else { 0 };
        Builder {
            source,
            nodes: Vec::with_capacity(capacity),
            child_ids: Vec::with_capacity(capacity),
            pending: Vec::new(),
            stack: Vec::new(),
            open_lists: 0,
            first_nested_line_opener: None,
            last_top_level: None,
            keep,
            top_forms: 0,
            spans: None,
        }
    }

    fn run(mut self) -> Result<Cst<'a>, ParseError> {
        self.scan()?;
        Ok(Cst { source: self.source, nodes: self.nodes, child_ids: self.child_ids, top: self.pending })
    }

    fn scan(&mut self) -> Result<(), ParseError> {
        let mut pos = 0;
        if self.source.starts_with(BOM) {
            let bom = self.leaf(NodeKind::Bom, 0, BOM.len());
            self.pending.push(bom);
            pos = BOM.len();
        }
        while pos < self.source.len() {
            let input = &self.source[pos..];
            let (rest, lexeme) = lexer::lexeme(input).map_err(|e| self.lex_error(e))?;
            let end = self.source.len() - rest.len();
            match lexeme {
                // Trivia at the top level is not needed when the tree is not kept.
                Lexeme::Trivia(_) if !self.keep && self.stack.is_empty() => {}
                Lexeme::Trivia(kind) => {
                    let id = self.leaf(kind, pos, end);
                    self.pending.push(id);
                }
                Lexeme::Atom(kind) => {
                    let id = self.leaf(kind, pos, end);
                    self.deliver(id);
                }
                Lexeme::Open(kind) => {
                    if self.first_nested_line_opener.is_none()
                        && self.open_lists > 0
                        && line_start_before(self.source, pos) == Some(pos)
                    {
                        self.first_nested_line_opener = Some(pos);
                    }
                    self.open_lists += 1;
                    self.open(FrameKind::Open(kind), NodeKind::Delimiter, pos, end);
                }
                Lexeme::Prefix(prefix) => {
                    self.open(FrameKind::Prefix { prefix, forms_left: prefix.forms() }, NodeKind::Marker, pos, end);
                }
                Lexeme::Close => self.close(pos, end)?,
            }
            pos = end;
        }
        if let Some(frame) = self.stack.last() {
            return Err(self.eof_error(frame));
        }
        Ok(())
    }

    /// Adds a node; `Cst::parse` bounds the source so every offset and count fits in a `u32`.
    fn push(&mut self, kind: NodeKind, span: Range<usize>, first_child: usize, child_count: usize) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            kind,
            start: span.start as u32,
            end: span.end as u32,
            first_child: first_child as u32,
            child_count: child_count as u32,
        });
        id
    }

    fn leaf(&mut self, kind: NodeKind, start: usize, end: usize) -> NodeId {
        self.push(kind, start..end, 0, 0)
    }

    fn open(&mut self, kind: FrameKind, opener_kind: NodeKind, start: usize, end: usize) {
        self.stack.push(Frame { kind, start, pending_from: self.pending.len() });
        let opener = self.leaf(opener_kind, start, end);
        self.pending.push(opener);
    }

    /// Turns the innermost frame into a node spanning up to `end`.
    fn finish(&mut self, frame: Frame, end: usize) -> NodeId {
        let kind = match frame.kind {
            FrameKind::Open(kind) => kind,
            FrameKind::Prefix { prefix, .. } => NodeKind::Prefixed(prefix),
        };
        let first_child = self.child_ids.len();
        self.child_ids.extend(self.pending.drain(frame.pending_from..));
        let child_count = self.child_ids.len() - first_child;
        self.push(kind, frame.start..end, first_child, child_count)
    }

    /// Hands a complete form to the enclosing frame, completing prefixes that were waiting for it.
    fn deliver(&mut self, mut id: NodeId) {
        loop {
            self.pending.push(id);
            let end = self.nodes[id.index()].end as usize;
            match self.stack.last_mut() {
                Some(Frame { kind: FrameKind::Prefix { forms_left, .. }, .. }) => {
                    *forms_left -= 1;
                    if *forms_left > 0 {
                        return;
                    }
                }
                Some(_) => return,
                None => {
                    self.last_top_level = Some(self.nodes[id.index()].start as usize..end);
                    self.first_nested_line_opener = None;
                    self.top_forms += 1;
                    if let Some(spans) = &mut self.spans {
                        spans.push((self.nodes[id.index()].start, end as u32));
                    }
                    if !self.keep {
                        // Nothing refers to the finished form any more.
                        self.nodes.clear();
                        self.child_ids.clear();
                        self.pending.clear();
                    }
                    return;
                }
            }
            let Some(frame) = self.stack.pop() else { return };
            id = self.finish(frame, end);
        }
    }

    fn close(&mut self, start: usize, end: usize) -> Result<(), ParseError> {
        match self.stack.last() {
            Some(Frame { kind: FrameKind::Open(_), .. }) => {
                let delimiter = self.leaf(NodeKind::Delimiter, start, end);
                self.pending.push(delimiter);
                self.open_lists -= 1;
                if let Some(frame) = self.stack.pop() {
                    let id = self.finish(frame, end);
                    self.deliver(id);
                }
                Ok(())
            }
            Some(frame @ Frame { kind: FrameKind::Prefix { .. }, .. }) => Err(ParseError {
                message: format!("`)` where a form must follow `{}`", self.marker_text(frame)),
                at: Location::of(self.source, start),
                opener: Some(self.opener(frame.start)),
                hint: None,
            }),
            None => Err(ParseError {
                message: "unmatched close parenthesis".into(),
                at: Location::of(self.source, start),
                opener: None,
                hint: self.last_top_level.as_ref().map(|form| {
                    format!(
                        "The top-level form before it (from {}) is already complete: remove this `)` or add the missing `(`",
                        Location::of(self.source, form.start)
                    )
                }),
            }),
        }
    }

    fn marker_text(&self, frame: &Frame) -> String {
        let marker = self.pending.get(frame.pending_from).map(|&id| self.nodes[id.index()]);
        marker.map_or_else(String::new, |m| {
            String::from_utf8_lossy(&self.source[m.start as usize..m.end as usize]).into_owned()
        })
    }

    fn opener(&self, offset: usize) -> Opener {
        Opener { at: Location::of(self.source, offset), excerpt: excerpt(self.source, offset) }
    }

    fn eof_error(&self, frame: &Frame) -> ParseError {
        let at = Location::of(self.source, self.source.len());
        match frame.kind {
            FrameKind::Prefix { .. } => ParseError {
                message: format!("end of file where a form must follow `{}`", self.marker_text(frame)),
                at,
                opener: Some(self.opener(frame.start)),
                hint: None,
            },
            FrameKind::Open(_) => {
                let mut hint = Vec::new();
                if self.open_lists > 1 {
                    hint.push(format!("{} lists are still open", self.open_lists));
                    if let Some(outer) = self.stack.first() {
                        hint.push(format!("the outermost starts at {}", Location::of(self.source, outer.start)));
                    }
                }
                if let Some(nested) = self.first_nested_line_opener {
                    let nested = Location::of(self.source, nested);
                    hint.push(format!(
                        "line {} starts with `(` inside this unfinished form, so the missing `)` probably belongs before line {}",
                        nested.line, nested.line
                    ));
                }
                ParseError {
                    message: "end of file: missing `)`".into(),
                    at,
                    opener: Some(self.opener(frame.start)),
                    hint: (!hint.is_empty()).then(|| capitalise(&hint.join("; "))),
                }
            }
        }
    }

    fn lex_error(&self, error: nom::Err<lexer::LexError<'_>>) -> ParseError {
        let error = match error {
            nom::Err::Error(e) | nom::Err::Failure(e) => e,
            // The lexer runs in complete mode; treat the impossible case as end of input.
            nom::Err::Incomplete(_) => lexer::LexError { kind: LexErrorKind::Unexpected, at: &[], opener: None },
        };
        let message = match error.kind {
            LexErrorKind::UnterminatedString => "end of file inside a string: missing `\"`",
            LexErrorKind::UnterminatedBlockComment => "end of file inside a `#|` comment: missing `|#`",
            LexErrorKind::UnterminatedEscape => "end of file inside `|...|` in a symbol: missing `|`",
            LexErrorKind::EofAfterBackslash => "end of file after the escape character `\\`",
            LexErrorKind::EofAfterHash => "end of file after `#`",
            LexErrorKind::Unexpected => "unexpected character",
        };
        let offset_of = |rest: &[u8]| self.source.len() - rest.len();
        ParseError {
            message: message.into(),
            at: Location::of(self.source, offset_of(error.at)),
            opener: error.opener.map(|o| self.opener(offset_of(o))),
            hint: None,
        }
    }
}

/// The offset where `pos`'s line starts, if only spaces and tabs stand between them.
pub(crate) fn line_start_before(source: &[u8], pos: usize) -> Option<usize> {
    let before = &source[..pos];
    let indent = before.iter().rev().take_while(|&&b| b == b' ' || b == b'\t').count();
    let start = pos - indent;
    match start.checked_sub(1).map(|i| source[i]) {
        None | Some(b'\n') => Some(start),
        _ if start == BOM.len() && source.starts_with(BOM) => Some(start),
        _ => None,
    }
}

fn capitalise(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(s: &str) -> Cst<'_> {
        let cst = Cst::parse(s.as_bytes()).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"));
        assert_eq!(String::from_utf8_lossy(&cst.print()), s);
        cst
    }

    fn error(s: &str) -> ParseError {
        match Cst::parse(s.as_bytes()) {
            Ok(_) => panic!("{s:?} should not parse"),
            Err(e) => e,
        }
    }

    #[test]
    fn everything_a_lisp_file_may_hold_round_trips() {
        let samples = [
            "",
            "\u{feff}(defun f () 1)",
            "(defun f (x)\r\n  ;; c\r\n  (g x))\r\n",
            "(a #| outer #| inner |# |# b) ; tail",
            "(list #\\( #\\) #\\Space #\\; #\\\" #\\\\ #\\a)",
            "'(|a ) b| \\( c) `(,a ,@b ,.c) #'f",
            "#+(and sbcl (not win32)) (defun f ()) #-sbcl\n;; c\n(defun g ())",
            "#.(+ 1 2) #p\"/tmp/\" #*101 #(1 2) #2A((1 2) (3 4)) #C(1 2) #S(point :x 1)",
            "#1=(a . #1#) #:sym cl:car cl-user::x :key #x1F #b101 #36rZZ",
            "\t(a\tb)\n(no-trailing-newline)",
            "#?\"interp ${x}\" #<unreadable> #[1 2]",
            "(\"a \\\" b\" \"λ\")",
        ];
        for sample in samples {
            round_trip(sample);
        }
    }

    #[test]
    fn structure_is_recorded() {
        let cst = round_trip("; c\n#+sbcl (defun f (x) 'x)");
        let forms: Vec<_> = cst.top_level_forms().collect();
        assert_eq!(forms.len(), 1);
        assert_eq!(cst.kind(forms[0]), NodeKind::Prefixed(Prefix::FeaturePlus));
        let parts: Vec<_> = cst.elements(forms[0]).collect();
        assert_eq!(cst.text(parts[0]), b"sbcl");
        assert_eq!(cst.kind(parts[1]), NodeKind::List);
        let defun: Vec<_> = cst.elements(parts[1]).map(|id| cst.text(id)).collect();
        assert_eq!(defun, [&b"defun"[..], b"f", b"(x)", b"'x"]);
    }

    #[test]
    fn reader_conditionals_skip_comments_before_their_form() {
        let cst = round_trip("#-sbcl ; why\n #| more |# (f)\n(g)");
        assert_eq!(cst.top_level_forms().count(), 2);
    }

    #[test]
    fn errors_name_the_problem_and_the_opener() {
        let e = error("(defun f ()\n  (g)\n");
        assert_eq!(e.message, "end of file: missing `)`");
        assert_eq!((e.at.line, e.at.column), (3, 1));
        let opener = e.opener.expect("opener");
        assert_eq!((opener.at.line, opener.at.column), (1, 1));
        assert_eq!(opener.excerpt, "(defun f ()");

        let e = error("(a)\n(b))\n");
        assert_eq!(e.message, "unmatched close parenthesis");
        assert_eq!((e.at.line, e.at.column), (2, 4));

        let e = error("(a \"b)\n");
        assert!(e.message.contains("string"), "{e}");
        assert_eq!(e.opener.map(|o| (o.at.line, o.at.column)), Some((1, 4)));

        let e = error("(a '");
        assert!(e.message.contains("`'`"), "{e}");
        let e = error("(a #+sbcl)");
        assert!(e.message.contains("`#+`"), "{e}");
    }

    #[test]
    fn a_missing_paren_is_located_by_the_next_line_that_starts_a_form() {
        let e = error("(defun f ()\n  (g)\n\n(defun h ()\n  1)\n");
        let hint = e.hint.expect("hint");
        assert!(hint.contains("before line 4"), "{hint}");
    }

    #[test]
    fn columns_count_characters_and_skip_the_bom() {
        let e = error("\u{feff}(λ \"x");
        assert_eq!((e.at.line, e.at.column), (1, 6));
        assert_eq!(e.opener.map(|o| o.at.column), Some(4));
    }

    #[test]
    fn line_index() {
        let index = LineIndex::new(b"a\nbc\n\nd");
        assert_eq!([0, 1, 2, 4, 5, 6, 7].map(|o| index.line(o)), [1, 1, 2, 2, 3, 4, 4]);
        assert_eq!(index.lines(2..5).to_string(), "line 2");
        assert_eq!(index.lines(2..7), LineRange { first: 2, last: 4 });
        assert_eq!([&b""[..], b"a", b"a\n", b"a\nb"].map(line_count), [0, 1, 1, 2]);
    }

    #[test]
    fn long_prefix_chains_stay_linear() {
        let depth = 100_000;
        let text = format!("{}{}a{}", "'".repeat(depth), "(".repeat(depth), ")".repeat(depth));
        let started = std::time::Instant::now();
        round_trip(&text);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "took {:?}", started.elapsed());
    }

    #[test]
    fn deep_nesting_neither_recurses_nor_overflows() {
        let depth = 200_000;
        let text = format!("{}{}", "(".repeat(depth), ")".repeat(depth));
        let cst = round_trip(&text);
        assert_eq!(cst.top_level_forms().count(), 1);
        let quotes = format!("{}a", "'".repeat(depth));
        round_trip(&quotes);
    }
}
