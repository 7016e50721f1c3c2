//! The Common Lisp reader's lexical rules (standard syntax, standard readtable), written with
//! `nom` over bytes.
//!
//! Every syntax character of the standard readtable is ASCII, so working on bytes keeps every
//! boundary the lexer produces on a UTF-8 character boundary (a multi-byte character is always a
//! run of constituent bytes) and lets files in other ASCII-compatible encodings round-trip too.
//!
//! The lexer only cuts the input into lexemes; nesting is handled by the tree builder in
//! [`super::cst`] with an explicit stack, so no input can exhaust the call stack.
//!
//! See docs/design.md, "Source files".

use nom::bytes::complete::{tag, take_till, take_while, take_while1};
use nom::combinator::{recognize, value};
use nom::error::{ErrorKind, ParseError};
use nom::multi::{many0_count, many1_count};
use nom::{IResult, Parser};

// What the lexer cuts the input into, and the tree builder builds its nodes of.

/// What a node is. `List`, `Vector` and `Prefixed` have children; every other kind is a leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// A UTF-8 byte order mark at the very start of the file.
    Bom,
    /// A run of spaces, tabs, line feeds, carriage returns and form feeds.
    Whitespace,
    /// `;` up to (not including) the end of the line.
    LineComment,
    /// `#| ... |#`, nested comments included.
    BlockComment,
    /// A symbol or number, escapes included: `foo`, `pkg::bar`, `|a b|`, `1.5`, `.`.
    Token,
    /// `"..."`, escapes included.
    String,
    /// `#\a`, `#\(`, `#\Space`.
    Character,
    /// `#:foo`.
    Uninterned,
    /// `#*1011`.
    BitVector,
    /// `#b101`, `#o17`, `#xFF`, `#36rZZ`.
    Radix,
    /// `#1#`.
    LabelRef,
    /// `#` followed by a dispatch character the standard readtable does not define; kept as an
    /// opaque atom so files written for custom readers still parse.
    UnknownDispatch,
    /// The opening (`(`, `#(`, `#3(`) or closing `)` of a list or vector.
    Delimiter,
    /// The text of a prefix such as `'`, `#+` or `#2A`.
    Marker,
    /// `( ... )`: children are the delimiters, the elements and the trivia between them.
    List,
    /// `#( ... )`.
    Vector,
    /// A prefix and the form(s) it applies to: children are the marker, trivia and forms.
    Prefixed(Prefix),
}

impl NodeKind {
    pub(crate) fn is_trivia(self) -> bool {
        matches!(self, NodeKind::Bom | NodeKind::Whitespace | NodeKind::LineComment | NodeKind::BlockComment)
    }

    pub(crate) fn is_comment(self) -> bool {
        matches!(self, NodeKind::LineComment | NodeKind::BlockComment)
    }
}

/// The reader macro of a [`NodeKind::Prefixed`] node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prefix {
    /// `'`
    Quote,
    /// `` ` ``
    Backquote,
    /// `,`
    Unquote,
    /// `,@`
    UnquoteSplicing,
    /// `,.`
    UnquoteNSplicing,
    /// `#'`
    Function,
    /// `#.`
    ReadEval,
    /// `#+`: a feature expression, then the form it guards.
    FeaturePlus,
    /// `#-`
    FeatureMinus,
    /// `#1=`
    Label,
    /// `#2A`
    Array,
    /// `#C`
    Complex,
    /// `#P`
    Pathname,
    /// `#S`
    Structure,
}

impl Prefix {
    /// How many forms the prefix consumes: a reader conditional reads a feature expression and
    /// then the form it applies to.
    pub(crate) fn forms(self) -> usize {
        if self.is_reader_conditional() {
            2
        } else {
            1
        }
    }

    /// True for `#+` and `#-`, which apply to two forms: a feature expression and the form it
    /// guards.
    pub fn is_reader_conditional(self) -> bool {
        matches!(self, Prefix::FeaturePlus | Prefix::FeatureMinus)
    }
}

pub(crate) type Input<'a> = &'a [u8];
pub(crate) type LexResult<'a, T> = IResult<Input<'a>, T, LexError<'a>>;

/// One lexical unit. Its text is the bytes the lexer consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lexeme {
    /// Whitespace or a comment: kept in the tree, never a form.
    Trivia(NodeKind),
    /// A complete form by itself: token, string, character, `#:sym`, `#*101`, `#x1F`, `#1#`, ...
    Atom(NodeKind),
    /// `(`, or `#(` / `#3(` for a vector; its kind is the kind of the node it opens.
    Open(NodeKind),
    Close,
    /// `'`, `#'`, `#+`, `#2A`, ...: the next form (or two, for a reader conditional) belongs to it.
    Prefix(Prefix),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LexErrorKind {
    UnterminatedString,
    UnterminatedBlockComment,
    UnterminatedEscape,
    EofAfterBackslash,
    EofAfterHash,
    /// Only reachable if a branch below fails without consuming; kept so the error type is total.
    Unexpected,
}

/// Where lexing failed. `at` and `opener` are the remaining input at those points, so the
/// offset in the whole source is `source.len() - remaining.len()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LexError<'a> {
    pub kind: LexErrorKind,
    pub at: Input<'a>,
    pub opener: Option<Input<'a>>,
}

impl<'a> ParseError<Input<'a>> for LexError<'a> {
    fn from_error_kind(input: Input<'a>, _: ErrorKind) -> Self {
        LexError { kind: LexErrorKind::Unexpected, at: input, opener: None }
    }

    fn append(_: Input<'a>, _: ErrorKind, other: Self) -> Self {
        other
    }
}

fn fail<'a, T>(kind: LexErrorKind, at: Input<'a>, opener: Option<Input<'a>>) -> LexResult<'a, T> {
    Err(nom::Err::Failure(LexError { kind, at, opener }))
}

/// The syntax type of every byte, looked up rather than compared: the lexer asks for each byte.
const fn syntax_table() -> [u8; 256] {
    let mut table = [CONSTITUENT; 256];
    let whitespace = [b' ', b'\t', b'\n', b'\r', 0x0c];
    let mut i = 0;
    while i < whitespace.len() {
        table[whitespace[i] as usize] = WHITESPACE;
        i += 1;
    }
    let terminating = [b'"', b'\'', b'(', b')', b',', b';', b'`'];
    let mut i = 0;
    while i < terminating.len() {
        table[terminating[i] as usize] = TERMINATING;
        i += 1;
    }
    table[b'\\' as usize] = ESCAPE;
    table[b'|' as usize] = ESCAPE;
    table
}

const CONSTITUENT: u8 = 0;
const WHITESPACE: u8 = 1;
const TERMINATING: u8 = 2;
const ESCAPE: u8 = 3;
static SYNTAX: [u8; 256] = syntax_table();

/// Tab, Newline, Linefeed, Page, Return, Space: the standard syntax's whitespace[2].
pub(crate) fn is_whitespace(b: u8) -> bool {
    SYNTAX[b as usize] == WHITESPACE
}

fn is_terminating_macro(b: u8) -> bool {
    SYNTAX[b as usize] == TERMINATING
}

/// Bytes that continue a token as themselves. `#` is a non-terminating macro character, so it
/// belongs here; `\` and `|` are escapes and handled separately.
fn is_plain_constituent(b: u8) -> bool {
    SYNTAX[b as usize] == CONSTITUENT
}

/// Reads the next lexeme. `input` must not be empty.
pub(crate) fn lexeme(input: Input) -> LexResult<Lexeme> {
    let Some(&first) = input.first() else {
        return Err(nom::Err::Error(LexError::from_error_kind(input, ErrorKind::Eof)));
    };
    match first {
        b if is_whitespace(b) => {
            value(Lexeme::Trivia(NodeKind::Whitespace), take_while1(is_whitespace)).parse_complete(input)
        }
        b';' => value(Lexeme::Trivia(NodeKind::LineComment), take_till(|b| b == b'\n')).parse_complete(input),
        b'"' => string(input).map(|(rest, ())| (rest, Lexeme::Atom(NodeKind::String))),
        b'(' => value(Lexeme::Open(NodeKind::List), tag(&b"("[..])).parse_complete(input),
        b')' => value(Lexeme::Close, tag(&b")"[..])).parse_complete(input),
        b'\'' => value(Lexeme::Prefix(Prefix::Quote), tag(&b"'"[..])).parse_complete(input),
        b'`' => value(Lexeme::Prefix(Prefix::Backquote), tag(&b"`"[..])).parse_complete(input),
        b',' => comma(input),
        b'#' => dispatch(input),
        _ => token(input).map(|(rest, ())| (rest, Lexeme::Atom(NodeKind::Token))),
    }
}

fn comma(input: Input) -> LexResult<Lexeme> {
    let (kind, len) = match input.get(1) {
        Some(b'@') => (Prefix::UnquoteSplicing, 2),
        Some(b'.') => (Prefix::UnquoteNSplicing, 2),
        _ => (Prefix::Unquote, 1),
    };
    Ok((&input[len..], Lexeme::Prefix(kind)))
}

/// `"..."` where `\` escapes any byte.
fn string(input: Input) -> LexResult<()> {
    let mut rest = &input[1..];
    loop {
        let (after, _) = take_till(|b| b == b'"' || b == b'\\').parse_complete(rest)?;
        match after.first() {
            Some(b'"') => return Ok((&after[1..], ())),
            Some(_) if after.len() >= 2 => rest = &after[2..],
            _ => return fail(LexErrorKind::UnterminatedString, after, Some(input)),
        }
    }
}

/// `\x`: the next byte is taken literally.
fn single_escape(input: Input) -> LexResult<Input> {
    let (rest, _) = tag(&b"\\"[..]).parse_complete(input)?;
    if rest.is_empty() {
        return fail(LexErrorKind::EofAfterBackslash, rest, Some(input));
    }
    Ok((&rest[1..], &input[..2]))
}

/// `|...|`: everything up to the closing bar is taken literally, except that `\` still escapes.
fn multiple_escape(input: Input) -> LexResult<Input> {
    let (mut rest, _) = tag(&b"|"[..]).parse_complete(input)?;
    loop {
        let (after, _) = take_till(|b| b == b'|' || b == b'\\').parse_complete(rest)?;
        match after.first() {
            Some(b'|') => {
                let end = input.len() - after.len() + 1;
                return Ok((&after[1..], &input[..end]));
            }
            Some(_) if after.len() >= 2 => rest = &after[2..],
            _ => return fail(LexErrorKind::UnterminatedEscape, after, Some(input)),
        }
    }
}

fn token_part(input: Input) -> LexResult<Input> {
    nom::branch::alt((take_while1(is_plain_constituent), single_escape, multiple_escape)).parse_complete(input)
}

/// A token: constituents and escapes up to whitespace or a terminating macro character.
fn token(input: Input) -> LexResult<()> {
    // Most tokens have no escapes: one scan of constituents ends them.
    if let Ok((rest, _)) = take_while1::<_, _, LexError>(is_plain_constituent).parse_complete(input) {
        if !matches!(rest.first(), Some(&b) if SYNTAX[b as usize] == ESCAPE) {
            return Ok((rest, ()));
        }
    }
    value((), many1_count(token_part)).parse_complete(input)
}

/// The rest of a token that has already started (after `#\x`, `#:`, `#*`, `#b`, ...); may be empty.
fn token_rest(input: Input) -> LexResult<()> {
    value((), many0_count(token_part)).parse_complete(input)
}

/// The body of a `#|...|#` comment, after its opener: comments nest.
fn block_comment<'a>(opener: Input<'a>, body: Input<'a>) -> LexResult<'a, ()> {
    let mut depth = 1usize;
    let mut i = 0;
    while i < body.len() {
        match (body[i], body.get(i + 1)) {
            (b'#', Some(b'|')) => {
                depth += 1;
                i += 2;
            }
            (b'|', Some(b'#')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Ok((&body[i..], ()));
                }
            }
            _ => i += 1,
        }
    }
    fail(LexErrorKind::UnterminatedBlockComment, &body[body.len()..], Some(opener))
}

/// `#` with an optional decimal argument and a dispatch character.
fn dispatch(input: Input) -> LexResult<Lexeme> {
    let (after_digits, _) =
        recognize((tag(&b"#"[..]), take_while(|b: u8| b.is_ascii_digit()))).parse_complete(input)?;
    let Some(&sub) = after_digits.first() else {
        return fail(LexErrorKind::EofAfterHash, after_digits, Some(input));
    };
    let after_sub = &after_digits[1..];
    let prefix = |p| Ok((after_sub, Lexeme::Prefix(p)));
    let atom_with_rest = |kind| token_rest(after_sub).map(|(rest, ())| (rest, Lexeme::Atom(kind)));
    match sub {
        b'|' => block_comment(input, after_sub).map(|(rest, ())| (rest, Lexeme::Trivia(NodeKind::BlockComment))),
        b'(' => Ok((after_sub, Lexeme::Open(NodeKind::Vector))),
        b'\\' => {
            if after_sub.is_empty() {
                return fail(LexErrorKind::EofAfterBackslash, after_sub, Some(input));
            }
            // The character itself may be a macro character (`#\(`) and is taken as is; the
            // constituents after it make up a name such as `Space`.
            token_rest(&after_sub[1..]).map(|(rest, ())| (rest, Lexeme::Atom(NodeKind::Character)))
        }
        b'\'' => prefix(Prefix::Function),
        b'.' => prefix(Prefix::ReadEval),
        b'+' => prefix(Prefix::FeaturePlus),
        b'-' => prefix(Prefix::FeatureMinus),
        b'=' => prefix(Prefix::Label),
        b'a' | b'A' => prefix(Prefix::Array),
        b'c' | b'C' => prefix(Prefix::Complex),
        b'p' | b'P' => prefix(Prefix::Pathname),
        b's' | b'S' => prefix(Prefix::Structure),
        b'#' => Ok((after_sub, Lexeme::Atom(NodeKind::LabelRef))),
        b':' => atom_with_rest(NodeKind::Uninterned),
        b'*' => atom_with_rest(NodeKind::BitVector),
        b'b' | b'B' | b'o' | b'O' | b'x' | b'X' | b'r' | b'R' => atom_with_rest(NodeKind::Radix),
        // A dispatch character this reader does not know (a custom reader macro, or `#<`): keep
        // the text as an opaque atom. A terminating character or whitespace is left for the
        // next lexeme, so `#"..."` or `#)` cannot swallow a delimiter.
        b if is_whitespace(b) || is_terminating_macro(b) => Ok((after_digits, Lexeme::Atom(NodeKind::UnknownDispatch))),
        _ => atom_with_rest(NodeKind::UnknownDispatch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lex(s: &str) -> (Lexeme, &str) {
        let (rest, lexeme) = lexeme(s.as_bytes()).expect("lexes");
        (lexeme, &s[..s.len() - rest.len()])
    }

    fn lex_error(s: &str) -> LexErrorKind {
        match lexeme(s.as_bytes()) {
            Err(nom::Err::Failure(e)) => e.kind,
            other => panic!("expected a failure for {s:?}, got {other:?}"),
        }
    }

    #[test]
    fn tokens_run_to_terminators_and_keep_escapes() {
        assert_eq!(lex("foo-bar)"), (Lexeme::Atom(NodeKind::Token), "foo-bar"));
        assert_eq!(lex("|a ) b|x y"), (Lexeme::Atom(NodeKind::Token), "|a ) b|x"));
        assert_eq!(lex("a\\ b c"), (Lexeme::Atom(NodeKind::Token), "a\\ b"));
        assert_eq!(lex("cl-user::foo#bar'x"), (Lexeme::Atom(NodeKind::Token), "cl-user::foo#bar"));
        assert_eq!(lex("λx(y"), (Lexeme::Atom(NodeKind::Token), "λx"));
    }

    #[test]
    fn strings_and_comments() {
        assert_eq!(lex(r#""a \" ) b" c"#), (Lexeme::Atom(NodeKind::String), r#""a \" ) b""#));
        assert_eq!(lex("; hi (\r\nx"), (Lexeme::Trivia(NodeKind::LineComment), "; hi (\r"));
        assert_eq!(lex("#| a #| b |# c |#d"), (Lexeme::Trivia(NodeKind::BlockComment), "#| a #| b |# c |#"));
        assert_eq!(lex("#||#"), (Lexeme::Trivia(NodeKind::BlockComment), "#||#"));
    }

    #[test]
    fn dispatch_macros() {
        assert_eq!(lex("#\\( x"), (Lexeme::Atom(NodeKind::Character), "#\\("));
        assert_eq!(lex("#\\Space)"), (Lexeme::Atom(NodeKind::Character), "#\\Space"));
        assert_eq!(lex("#\\) "), (Lexeme::Atom(NodeKind::Character), "#\\)"));
        assert_eq!(lex("#\\λ)"), (Lexeme::Atom(NodeKind::Character), "#\\λ"));
        assert_eq!(lex("#:foo)"), (Lexeme::Atom(NodeKind::Uninterned), "#:foo"));
        assert_eq!(lex("#*1011 "), (Lexeme::Atom(NodeKind::BitVector), "#*1011"));
        assert_eq!(lex("#x1F)"), (Lexeme::Atom(NodeKind::Radix), "#x1F"));
        assert_eq!(lex("#36rZZ "), (Lexeme::Atom(NodeKind::Radix), "#36rZZ"));
        assert_eq!(lex("#12# "), (Lexeme::Atom(NodeKind::LabelRef), "#12#"));
        assert_eq!(lex("#12=(a)"), (Lexeme::Prefix(Prefix::Label), "#12="));
        assert_eq!(lex("#2A((1))"), (Lexeme::Prefix(Prefix::Array), "#2A"));
        assert_eq!(lex("#(1 2)"), (Lexeme::Open(NodeKind::Vector), "#("));
        assert_eq!(lex("#3(1)"), (Lexeme::Open(NodeKind::Vector), "#3("));
        assert_eq!(lex("#+sbcl"), (Lexeme::Prefix(Prefix::FeaturePlus), "#+"));
        assert_eq!(lex("#p\"/tmp\""), (Lexeme::Prefix(Prefix::Pathname), "#p"));
        assert_eq!(lex(",@x"), (Lexeme::Prefix(Prefix::UnquoteSplicing), ",@"));
    }

    #[test]
    fn unknown_dispatch_is_an_opaque_atom() {
        assert_eq!(lex("#?\"x\""), (Lexeme::Atom(NodeKind::UnknownDispatch), "#?"));
        assert_eq!(lex("#<foo bar>"), (Lexeme::Atom(NodeKind::UnknownDispatch), "#<foo"));
        assert_eq!(lex("#\"x\""), (Lexeme::Atom(NodeKind::UnknownDispatch), "#"));
        assert_eq!(lex("#)"), (Lexeme::Atom(NodeKind::UnknownDispatch), "#"));
        assert_eq!(lex("#é)"), (Lexeme::Atom(NodeKind::UnknownDispatch), "#é"));
    }

    #[test]
    fn unterminated_constructs_fail() {
        assert_eq!(lex_error("\"abc"), LexErrorKind::UnterminatedString);
        assert_eq!(lex_error("\"abc\\"), LexErrorKind::UnterminatedString);
        assert_eq!(lex_error("#| #| |#"), LexErrorKind::UnterminatedBlockComment);
        assert_eq!(lex_error("|abc"), LexErrorKind::UnterminatedEscape);
        assert_eq!(lex_error("abc\\"), LexErrorKind::EofAfterBackslash);
        assert_eq!(lex_error("#\\"), LexErrorKind::EofAfterBackslash);
        assert_eq!(lex_error("#12"), LexErrorKind::EofAfterHash);
    }
}
