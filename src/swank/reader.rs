//! Reads the s-expressions a swank or slynk server prints (`prin1` with `*print-case*
//! :downcase`): lists, dotted pairs, `#(...)`, strings with raw control characters, `#\x`,
//! `|Mixed Case|` and `pkg::sym` symbols, `#:g`, numbers of any syntax and unreadable `#<...>`.
//!
//! Built with `nom` for the leaves; nesting is walked by hand so that depth can be bounded and a
//! hostile peer cannot overflow the stack.
//!
//! See docs/design.md, "The swank client".

use nom::{bytes::complete::take_while, character::complete::char, IResult, Parser};

use std::borrow::Cow;

use super::sexp::{number, Sexp};

/// Deeper nesting than any real message; beyond it the input is rejected, not recursed into.
const MAX_DEPTH: usize = 512;

/// Why a text does not read as one s-expression, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read s-expression at byte {offset}: {message}")]
pub struct ReadError {
    message: String,
    /// Byte offset into the input where reading failed (always a character boundary).
    pub offset: usize,
}

/// Reads exactly one form; only whitespace may follow it.
pub fn read(input: &str) -> Result<Sexp, ReadError> {
    let (rest, value) = form(input, 0).map_err(|e| error_at(input, e))?;
    let (rest, _) = ws(rest).map_err(|e| error_at(input, e))?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(ReadError { message: "unexpected text after the form".into(), offset: input.len() - rest.len() })
    }
}

fn error_at(input: &str, err: nom::Err<nom::error::Error<&str>>) -> ReadError {
    match err {
        nom::Err::Incomplete(_) => ReadError { message: "unexpected end of input".into(), offset: input.len() },
        nom::Err::Error(e) | nom::Err::Failure(e) => {
            let offset = input.len() - e.input.len();
            let message = if e.input.is_empty() {
                "unexpected end of input".to_string()
            } else {
                format!("unexpected {:?} ({:?})", e.input.chars().next().unwrap_or(' '), e.code)
            };
            ReadError { message, offset }
        }
    }
}

fn fail<T>(input: &str, kind: nom::error::ErrorKind) -> IResult<&str, T> {
    Err(nom::Err::Failure(nom::error::Error::new(input, kind)))
}

/// Whitespace and `;` comments (servers never print comments, but a transcript may carry them).
fn ws(input: &str) -> IResult<&str, ()> {
    let bytes = input.as_bytes();
    let mut at = 0;
    loop {
        while at < bytes.len() && matches!(bytes[at], b' ' | b'\t' | b'\n' | b'\r') {
            at += 1;
        }
        if bytes.get(at) != Some(&b';') {
            // Only ASCII bytes were skipped, so `at` is a character boundary.
            return Ok((&input[at..], ()));
        }
        at = bytes[at..].iter().position(|b| *b == b'\n').map_or(bytes.len(), |i| at + i);
    }
}

fn form(input: &str, depth: usize) -> IResult<&str, Sexp> {
    if depth > MAX_DEPTH {
        return fail(input, nom::error::ErrorKind::TooLarge);
    }
    let (input, _) = ws(input)?;
    match input.as_bytes().first() {
        None => fail(input, nom::error::ErrorKind::Eof),
        Some(b'(') => list(&input[1..], depth),
        Some(b')') => fail(input, nom::error::ErrorKind::Char),
        Some(b'"') => string(input),
        Some(b'\'') => quoted(&input[1..], "QUOTE", depth),
        Some(b'`') => quoted(&input[1..], "QUASIQUOTE", depth),
        Some(b',') => match input[1..].strip_prefix('@') {
            Some(rest) => quoted(rest, "UNQUOTE-SPLICING", depth),
            None => quoted(&input[1..], "UNQUOTE", depth),
        },
        Some(b'#') => dispatch(input, depth),
        Some(_) => token(input),
    }
}

fn quoted<'a>(input: &'a str, operator: &str, depth: usize) -> IResult<&'a str, Sexp> {
    let (rest, quoted) = form(input, depth + 1)?;
    let op = Sexp::Symbol { package: None, name: operator.into(), internal: false };
    Ok((rest, Sexp::List(vec![op, quoted])))
}

/// The elements of a list after its `(`, with an optional ` . tail`.
fn list(mut input: &str, depth: usize) -> IResult<&str, Sexp> {
    // Room for the short lists most messages are made of, without regrowing.
    let mut items = Vec::with_capacity(4);
    loop {
        let (rest, _) = ws(input)?;
        if let Some(rest) = rest.strip_prefix(')') {
            let value = if items.is_empty() { Sexp::Nil } else { Sexp::List(items) };
            return Ok((rest, value));
        }
        if is_consing_dot(rest) && !items.is_empty() {
            let (rest, tail) = form(&rest[1..], depth + 1)?;
            let (rest, _) = ws(rest)?;
            let (rest, _) = char(')').parse(rest)?;
            let value = match tail {
                Sexp::Nil => Sexp::List(items),
                Sexp::List(more) => {
                    items.extend(more);
                    Sexp::List(items)
                }
                Sexp::Dotted(more, tail) => {
                    items.extend(more);
                    Sexp::Dotted(items, tail)
                }
                other => Sexp::Dotted(items, Box::new(other)),
            };
            return Ok((rest, value));
        }
        let (rest, item) = form(rest, depth + 1).map_err(unclosed)?;
        items.push(item);
        input = rest;
    }
}

/// Inside a list, running out of input is a failure (the list is unclosed), not a soft error.
fn unclosed(err: nom::Err<nom::error::Error<&str>>) -> nom::Err<nom::error::Error<&str>> {
    match err {
        nom::Err::Error(e) => nom::Err::Failure(e),
        other => other,
    }
}

fn is_consing_dot(input: &str) -> bool {
    let Some(after) = input.strip_prefix('.') else { return false };
    after.chars().next().is_none_or(|c| c.is_whitespace() || matches!(c, '(' | ')' | '"' | '\'' | ';'))
}

/// A string: only `\` escapes the next character; everything else, newlines and control
/// characters included, is literal.
fn string(input: &str) -> IResult<&str, Sexp> {
    let mut rest = &input[1..];
    let mut value = String::new();
    // Copied a run at a time: most strings have no escape at all.
    while let Some(stop) = rest.bytes().position(|b| b == b'"' || b == b'\\') {
        value.push_str(&rest[..stop]);
        if rest.as_bytes()[stop] == b'"' {
            return Ok((&rest[stop + 1..], Sexp::String(value)));
        }
        let mut escaped = rest[stop + 1..].chars();
        let Some(next) = escaped.next() else { break };
        value.push(next);
        rest = escaped.as_str();
    }
    fail(input, nom::error::ErrorKind::Eof)
}

fn dispatch(input: &str, depth: usize) -> IResult<&str, Sexp> {
    let after = &input[1..];
    match after.chars().next() {
        Some('(') => match list(&after[1..], depth)? {
            (rest, Sexp::Nil) => Ok((rest, Sexp::Vector(Vec::new()))),
            (rest, Sexp::List(items)) => Ok((rest, Sexp::Vector(items))),
            _ => fail(after, nom::error::ErrorKind::Verify),
        },
        Some('\\') => character(&after[1..]),
        Some(':') => {
            let (rest, (name, _)) = token_text(&after[1..])?;
            Ok((rest, Sexp::Symbol { package: Some(String::new()), name, internal: false }))
        }
        Some('<') => unreadable(input),
        Some('\'') => quoted(&after[1..], "FUNCTION", depth),
        _ => fail(input, nom::error::ErrorKind::Tag),
    }
}

/// `#\a`, `#\(`, `#\Space`, `#\LATIN_SMALL_LETTER_A`: the first character is always taken, then
/// any constituent characters that follow make it a name.
fn character(input: &str) -> IResult<&str, Sexp> {
    let Some(first) = input.chars().next() else {
        return fail(input, nom::error::ErrorKind::Eof);
    };
    let (rest, more) = take_while(is_constituent).parse(&input[first.len_utf8()..])?;
    let text = format!("{first}{more}");
    Ok((rest, Sexp::Character(text)))
}

/// `#<...>`, possibly with nested `#<...>` inside (for example a list printed in an object's
/// description).
fn unreadable(input: &str) -> IResult<&str, Sexp> {
    let mut nesting = 0usize;
    let mut chars = input.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '#' if chars.peek().map(|(_, c)| *c) == Some('<') => {
                chars.next();
                nesting += 1;
            }
            '>' => {
                nesting -= 1;
                if nesting == 0 {
                    return Ok((&input[i + 1..], Sexp::Unreadable(input[..=i].to_string())));
                }
            }
            _ => {}
        }
    }
    fail(input, nom::error::ErrorKind::Eof)
}

/// ASCII constituents that need no escape handling, by byte: tokens are scanned a byte at a time
/// and a table lookup is the cheapest test.
const PLAIN_CONSTITUENT: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] =
            byte.is_ascii_graphic() && !matches!(byte, b'(' | b')' | b'"' | b'\'' | b';' | b'`' | b',' | b'\\' | b'|');
        b += 1;
    }
    table
};

fn is_constituent(c: char) -> bool {
    !c.is_whitespace() && !matches!(c, '(' | ')' | '"' | '\'' | ';' | '`' | ',')
}

/// A token's canonical text (unescaped characters upcased) and whether any part was escaped.
/// Package markers are split off beforehand, in [`symbol`], so that escaped colons stay in names.
fn token_text(input: &str) -> IResult<&str, (String, bool)> {
    let (rest, raw) = recognize_token(input)?;
    // What servers print almost always: a plain ASCII token with nothing escaped.
    if raw.bytes().all(|b| b.is_ascii() && b != b'|' && b != b'\\') {
        return Ok((rest, (raw.to_ascii_uppercase(), false)));
    }
    let mut name = String::new();
    let mut escaped = false;
    let mut chars = raw.chars();
    let mut in_bars = false;
    while let Some(c) = chars.next() {
        match c {
            '|' => {
                in_bars = !in_bars;
                escaped = true;
            }
            '\\' => {
                escaped = true;
                if let Some(next) = chars.next() {
                    name.push(next);
                }
            }
            c if in_bars => name.push(c),
            c => name.extend(c.to_uppercase()),
        }
    }
    Ok((rest, (name, escaped)))
}

/// The raw text of a token: constituents, `\x` escapes and `|...|` runs (which may hold spaces
/// and parentheses).
fn recognize_token(input: &str) -> IResult<&str, &str> {
    recognize_token_noting_plain(input).map(|(rest, (raw, _))| (rest, raw))
}

/// [`recognize_token`], also saying whether the token is plain ASCII with nothing escaped.
fn recognize_token_noting_plain(input: &str) -> IResult<&str, (&str, bool)> {
    // Nearly every token a server prints is plain ASCII: take those bytes at once, and walk
    // characters only from the first escape or non-ASCII character on.
    let plain = input.bytes().position(|b| !PLAIN_CONSTITUENT[b as usize]).unwrap_or(input.len());
    match input.as_bytes().get(plain) {
        Some(b'\\' | b'|') => {}
        Some(b) if !b.is_ascii() => {}
        _ if plain > 0 => return Ok((&input[plain..], (&input[..plain], true))),
        _ => {}
    }
    let mut end = 0;
    let mut chars = input.char_indices();
    let mut in_bars = false;
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((j, next)) => end = j + next.len_utf8(),
                None => return fail(&input[i..], nom::error::ErrorKind::Eof),
            },
            '|' => {
                in_bars = !in_bars;
                end = i + 1;
            }
            c if in_bars || is_constituent(c) => end = i + c.len_utf8(),
            _ => break,
        }
    }
    if in_bars {
        return fail(input, nom::error::ErrorKind::Eof);
    }
    if end == 0 {
        return fail(input, nom::error::ErrorKind::Char);
    }
    Ok((&input[end..], (&input[..end], false)))
}

/// A number, keyword or symbol. Package markers are found in the raw text so that an escaped
/// colon (`|a:b|`) stays part of the name.
fn token(input: &str) -> IResult<&str, Sexp> {
    let (rest, (raw, plain)) = recognize_token_noting_plain(input)?;
    // Most numbers a server prints are small integers: lengths, counts, request ids.
    if raw.len() < 19 && raw.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = raw.parse::<i64>() {
            return Ok((rest, Sexp::Integer(n)));
        }
    }
    // Only these can start a number; the grammar is not tried on every symbol and keyword.
    if raw.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '.')) {
        if let Ok(("", number)) = number(raw) {
            return Ok((rest, number));
        }
    }
    if let Some(value) = plain.then(|| plain_symbol(raw)).flatten() {
        return Ok((rest, value));
    }
    Ok((rest, symbol(input, raw)?))
}

/// The symbols servers print nearly always: `name`, `:name` and `pkg:name` or `pkg::name` in
/// plain ASCII, read with one pass and one allocation per name. Anything else (no name after the
/// marker, more markers, escapes) is left to [`symbol`], which this must agree with.
fn plain_symbol(raw: &str) -> Option<Sexp> {
    let colon = raw.bytes().position(|b| b == b':');
    let Some(colon) = colon else {
        return Some(if raw.eq_ignore_ascii_case("nil") {
            Sexp::Nil
        } else {
            Sexp::Symbol { package: None, name: raw.to_ascii_uppercase(), internal: false }
        });
    };
    let (package, after) = (&raw[..colon], &raw[colon + 1..]);
    let (internal, name) = match after.strip_prefix(':') {
        Some(name) if !package.is_empty() => (true, name),
        Some(_) => return None,
        None => (false, after),
    };
    if name.is_empty() || name.bytes().any(|b| b == b':') {
        return None;
    }
    Some(if package.is_empty() {
        Sexp::Keyword(keyword_name(name))
    } else {
        Sexp::Symbol { package: Some(package.to_ascii_uppercase()), name: name.to_ascii_uppercase(), internal }
    })
}

/// Keywords in nearly every message: the protocol's and the helper's reply keys, sorted, none
/// longer than [`COMMON_KEYWORD_MAX_LEN`].
const COMMON_KEYWORDS: [&str; 32] = [
    "ABORT",
    "BACKGROUND",
    "BACKTRACE",
    "CLASS",
    "DEBUG",
    "DEBUG-ACTIVATE",
    "DEBUG-RETURN",
    "ERROR",
    "ERRORS",
    "ERRORS-DROPPED",
    "FAILURE",
    "INDENTATION-UPDATE",
    "KIND",
    "MESSAGE",
    "NEW-FEATURES",
    "NEW-PACKAGE",
    "NOTES",
    "OK",
    "OUTPUT",
    "PACKAGE",
    "PING",
    "RECORDED",
    "RETURN",
    "STDERR",
    "STDOUT",
    "TRACE",
    "TYPE",
    "VALUES",
    "WARNINGS",
    "WARNINGS-DROPPED",
    "WARNINGS-LOST",
    "WARNINGS-REST",
];

const COMMON_KEYWORD_MAX_LEN: usize = 24;

/// The canonical name of the plain keyword `name`, shared when it is a common one: a reply's
/// dozen keywords were a dozen allocations, and as many frees, per message.
fn keyword_name(name: &str) -> Cow<'static, str> {
    let mut buffer = [0u8; COMMON_KEYWORD_MAX_LEN];
    if let Some(upper) = buffer.get_mut(..name.len()) {
        upper.copy_from_slice(name.as_bytes());
        upper.make_ascii_uppercase();
        if let Ok(i) = COMMON_KEYWORDS.binary_search_by(|keyword| keyword.as_bytes().cmp(upper)) {
            return Cow::Borrowed(COMMON_KEYWORDS[i]);
        }
    }
    Cow::Owned(name.to_ascii_uppercase())
}

/// Any symbol or keyword, from the raw text of its token (`input` is where it starts, for
/// errors).
fn symbol<'a>(input: &'a str, raw: &'a str) -> Result<Sexp, nom::Err<nom::error::Error<&'a str>>> {
    let value = match split_package(raw) {
        Some((package_raw, internal, name_raw)) => {
            let (_, (name, _)) = token_text(name_raw).map_err(|_| fail_err(input))?;
            if package_raw.is_empty() {
                Sexp::Keyword(name.into())
            } else {
                let (_, (package, _)) = token_text(package_raw).map_err(|_| fail_err(input))?;
                // An empty package name is how `Sexp` spells `#:`, which has no internal form,
                // so `||::x` reads as `||:x` and `#:x` do.
                let internal = internal && !package.is_empty();
                Sexp::Symbol { package: Some(package), name, internal }
            }
        }
        None => {
            let (_, (name, escaped)) = token_text(raw)?;
            if name == "NIL" && !escaped {
                Sexp::Nil
            } else {
                Sexp::Symbol { package: None, name, internal: false }
            }
        }
    };
    Ok(value)
}

fn fail_err(input: &str) -> nom::Err<nom::error::Error<&str>> {
    nom::Err::Failure(nom::error::Error::new(input, nom::error::ErrorKind::Verify))
}

/// Splits `pkg:name` / `pkg::name` / `:name` at the first unescaped colon.
fn split_package(raw: &str) -> Option<(&str, bool, &str)> {
    let mut in_bars = false;
    let mut chars = raw.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '|' => in_bars = !in_bars,
            ':' if !in_bars => {
                let after = &raw[i + 1..];
                return Some(match after.strip_prefix(':') {
                    Some(name) => (&raw[..i], true, name),
                    None => (&raw[..i], false, after),
                });
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str) -> Sexp {
        Sexp::Symbol { package: None, name: name.into(), internal: false }
    }

    #[test]
    fn reads_what_servers_print() {
        let text = "(:return (:ok (\"a\\\"b\" |Mixed Case| swank-io-package::foo #:g123 #\\a #\\Space #\\( #(1 2) (1 . 2) 1.5d0 -7 1/3 #<FUNCTION (LAMBDA ()) {1001}> nil t)) 12)";
        let value = read(text).unwrap();
        let items = value.as_list().unwrap();
        assert!(items[0].is_keyword("return"));
        assert_eq!(items[2], Sexp::Integer(12));
        let ok = items[1].as_list().unwrap();
        let values = ok[1].as_list().unwrap();
        assert_eq!(values[0], Sexp::String("a\"b".into()));
        assert_eq!(values[1], sym("Mixed Case"));
        assert_eq!(
            values[2],
            Sexp::Symbol { package: Some("SWANK-IO-PACKAGE".into()), name: "FOO".into(), internal: true }
        );
        assert_eq!(values[3], Sexp::Symbol { package: Some(String::new()), name: "G123".into(), internal: false });
        assert_eq!(values[4], Sexp::Character("a".into()));
        assert_eq!(values[5], Sexp::Character("Space".into()));
        assert_eq!(values[6], Sexp::Character("(".into()));
        assert_eq!(values[7], Sexp::Vector(vec![Sexp::Integer(1), Sexp::Integer(2)]));
        assert_eq!(values[8], Sexp::Dotted(vec![Sexp::Integer(1)], Box::new(Sexp::Integer(2))));
        assert_eq!(values[9], Sexp::Number("1.5d0".into()));
        assert_eq!(values[10], Sexp::Integer(-7));
        assert_eq!(values[11], Sexp::Number("1/3".into()));
        assert_eq!(values[12], Sexp::Unreadable("#<FUNCTION (LAMBDA ()) {1001}>".into()));
        assert_eq!(values[13], Sexp::Nil);
        assert_eq!(values[14], sym("T"));
    }

    #[test]
    fn strings_keep_raw_control_characters_and_unicode() {
        let value = read("\"line1\nline2\ttab\u{1}ctl λ 🎉\"").unwrap();
        assert_eq!(value, Sexp::String("line1\nline2\ttab\u{1}ctl λ 🎉".into()));
    }

    #[test]
    fn escaped_colons_and_bars_stay_in_names() {
        assert_eq!(read("|a:b|").unwrap(), sym("a:b"));
        assert_eq!(read("a\\:b").unwrap(), sym("A:B"));
        assert_eq!(
            read("|x|::|y z|").unwrap(),
            Sexp::Symbol { package: Some("x".into()), name: "y z".into(), internal: true }
        );
        assert_eq!(read(":|Key|").unwrap(), Sexp::Keyword("Key".into()));
        assert_eq!(read("|NIL|").unwrap(), sym("NIL"));
        assert_eq!(read("()").unwrap(), Sexp::Nil);
    }

    /// Found by the `sexp_reader` fuzz target: `||::<` was internal, printed as `#:<`, and read
    /// back as another value.
    #[test]
    fn an_empty_package_name_reads_as_uninterned_and_prints_back() {
        for (text, name) in [("||::<", "<"), ("||::foo", "FOO"), ("||:foo", "FOO"), ("#:foo", "FOO")] {
            let value = read(text).unwrap();
            assert_eq!(
                value,
                Sexp::Symbol { package: Some(String::new()), name: name.into(), internal: false },
                "{text}"
            );
            assert_eq!(read(&value.to_string()).unwrap(), value, "{text}");
        }
    }

    #[test]
    fn numbers_and_number_like_symbols() {
        assert_eq!(read("12.").unwrap(), Sexp::Integer(12));
        assert_eq!(read("99999999999999999999").unwrap(), Sexp::Number("99999999999999999999".into()));
        assert_eq!(read(".5").unwrap(), Sexp::Number(".5".into()));
        assert_eq!(read("1e10").unwrap(), Sexp::Number("1e10".into()));
        assert_eq!(read("1+").unwrap(), sym("1+"));
        assert_eq!(read("-").unwrap(), sym("-"));
        assert_eq!(read("...x").unwrap(), sym("...X"));
    }

    #[test]
    fn nested_unreadable_objects() {
        let value = read("(#<A #<B> c> 1)").unwrap();
        assert_eq!(value.as_list().unwrap()[0], Sexp::Unreadable("#<A #<B> c>".into()));
    }

    #[test]
    fn quote_forms() {
        let value = read("'x").unwrap();
        assert_eq!(value, Sexp::List(vec![sym("QUOTE"), sym("X")]));
        let value = read("#'car").unwrap();
        assert_eq!(value, Sexp::List(vec![sym("FUNCTION"), sym("CAR")]));
    }

    #[test]
    fn common_keywords_are_shared_and_read_like_any_other() {
        assert!(COMMON_KEYWORDS.windows(2).all(|pair| pair[0] < pair[1]), "sorted for the binary search");
        assert!(COMMON_KEYWORDS.iter().all(|k| k.len() <= COMMON_KEYWORD_MAX_LEN && *k == k.to_ascii_uppercase()));
        for keyword in COMMON_KEYWORDS {
            let text = format!(":{}", keyword.to_ascii_lowercase());
            assert!(matches!(read(&text).unwrap(), Sexp::Keyword(Cow::Borrowed(name)) if name == keyword), "{text}");
        }
        assert!(
            matches!(read(":warnings-droppedx").unwrap(), Sexp::Keyword(Cow::Owned(name)) if name == "WARNINGS-DROPPEDX")
        );
        assert_eq!(
            read(":A-KEYWORD-LONGER-THAN-THE-BUFFER-HOLDS").unwrap(),
            Sexp::Keyword("A-KEYWORD-LONGER-THAN-THE-BUFFER-HOLDS".into())
        );
        assert_eq!(read(":|ok|").unwrap(), Sexp::Keyword("ok".into()));
    }

    proptest::proptest! {
        /// The one-pass reading of plain tokens agrees with the general one wherever it applies.
        #[test]
        fn plain_symbols_read_as_the_general_reader_reads_them(raw in "[a-zA-Z0-9:+*<>=.-]{1,12}") {
            if let Some(fast) = plain_symbol(&raw) {
                proptest::prop_assert_eq!(fast, symbol(&raw, &raw).unwrap());
            }
        }

        /// Small integers skip the number grammar and must read as it reads them.
        #[test]
        fn digit_runs_read_as_the_number_grammar_reads_them(raw in "[0-9]{1,25}") {
            let (_, general) = number(&raw).unwrap();
            proptest::prop_assert_eq!(read(&raw).unwrap(), general);
        }
    }

    #[test]
    fn errors_are_reported_not_panicked() {
        for bad in ["(", "(1 2", "\"abc", ")", "#<abc", "|abc", "#\\", "(1 . )", "#z", "", "(a) b", "a\\"] {
            assert!(read(bad).is_err(), "{bad:?} should not read");
        }
        let deep = "(".repeat(100_000);
        assert!(read(&deep).is_err());
    }
}
