//! The two s-expression types of the wire.
//!
//! [`Sexp`] is anything a swank or slynk server may print, as read by [`super::reader`].
//! [`Form`] is what this client sends. It is a separate, smaller type on purpose: Slynk's reader
//! is a small tokenizer that closes the connection on a backslash outside strings, `#\x` or
//! `|...|`, and both servers read requests in a package that uses nothing, so only qualified
//! symbols, keywords, strings, integers and lists may ever be printed. Making that a type rather
//! than a convention means no code path can send anything else.
//!
//! See docs/design.md, "The swank client".

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::sync::Arc;

use nom::{
    branch::alt,
    bytes::complete::take_while,
    character::complete::{char, digit1, one_of},
    combinator::{opt, recognize},
    sequence::pair,
    IResult, Parser,
};

/// A value read from the server. Symbol and keyword names are canonical Lisp names (the reader
/// upcases unescaped characters, as the standard readtable does), so `:return` is `"RETURN"`.
#[derive(Debug, Clone, PartialEq)]
pub enum Sexp {
    /// `nil` and `()`.
    Nil,
    /// An integer that fits in an `i64`.
    Integer(i64),
    /// Any other number (float, ratio, bignum) kept as its printed text.
    Number(String),
    /// A string, escapes resolved.
    String(String),
    /// `#\x` with the text after `#\` (a single character or a name such as `Space`).
    Character(String),
    /// The keywords of nearly every message (`:return`, `:ok`, the helper's reply keys) share
    /// static names; the reader allocates only for others.
    Keyword(Cow<'static, str>),
    /// A symbol. `package` is `None` for an unqualified one and `Some("")` for an uninterned
    /// `#:g`. `internal` is true for `pkg::sym`.
    Symbol {
        /// The package prefix in canonical case; `None` and `Some("")` as above.
        package: Option<String>,
        /// The name without its prefix, in canonical case: `foo` reads as `"FOO"`.
        name: String,
        /// True for `pkg::sym`, false for `pkg:sym`.
        internal: bool,
    },
    /// A proper list (never empty: that is `Nil`).
    List(Vec<Sexp>),
    /// `(a b . c)`: the elements before the dot and the final cdr.
    Dotted(Vec<Sexp>, Box<Sexp>),
    /// `#(...)`.
    Vector(Vec<Sexp>),
    /// Unreadable `#<...>` object text, including the `#<` and `>`.
    Unreadable(String),
}

impl Sexp {
    /// True for the keyword whose name is `name` (given as one types it: `"return"`).
    pub fn is_keyword(&self, name: &str) -> bool {
        matches!(self, Sexp::Keyword(k) if k.eq_ignore_ascii_case(name))
    }

    /// The elements of a proper list; `nil` is the empty list.
    pub fn as_list(&self) -> Option<&[Sexp]> {
        match self {
            Sexp::Nil => Some(&[]),
            Sexp::List(items) => Some(items),
            _ => None,
        }
    }

    /// The text of a [`Sexp::String`]; `None` for anything else, symbols included.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Sexp::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value of an [`Sexp::Integer`]; `None` for anything else, bignums included.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Sexp::Integer(n) => Some(*n),
            _ => None,
        }
    }

    /// Generalised boolean: everything but `nil` is true.
    pub fn is_true(&self) -> bool {
        !matches!(self, Sexp::Nil)
    }

    /// Looks up `key` (typed as `"version"`) in a property list `(:k1 v1 :k2 v2 ...)`.
    pub fn plist_get(&self, key: &str) -> Option<&Sexp> {
        self.as_list()?.chunks(2).find(|pair| pair[0].is_keyword(key)).and_then(|pair| pair.get(1))
    }

    /// A plist value that must be a string, or `None`.
    pub fn plist_str(&self, key: &str) -> Option<&str> {
        self.plist_get(key).and_then(Sexp::as_str)
    }
}

impl fmt::Display for Sexp {
    /// Prints the value the way the server would (lower case), for logs and error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sexp::Nil => f.write_str("nil"),
            Sexp::Integer(n) => write!(f, "{n}"),
            Sexp::Number(text) | Sexp::Unreadable(text) => f.write_str(text),
            Sexp::String(s) => write_lisp_string(f, s),
            Sexp::Character(c) => write!(f, "#\\{c}"),
            Sexp::Keyword(name) => {
                f.write_char(':')?;
                write_symbol_name(f, name)
            }
            Sexp::Symbol { package, name, internal } => {
                match package.as_deref() {
                    // Bare `nil` would read back as the empty list.
                    None if name == "NIL" => return f.write_str("|NIL|"),
                    None => {}
                    Some("") => f.write_str("#:")?,
                    Some(p) => {
                        write_symbol_name(f, p)?;
                        f.write_str(if *internal { "::" } else { ":" })?;
                    }
                }
                write_symbol_name(f, name)
            }
            Sexp::List(items) => write_seq(f, "(", items, None),
            Sexp::Dotted(items, tail) => write_seq(f, "(", items, Some(tail)),
            Sexp::Vector(items) => write_seq(f, "#(", items, None),
        }
    }
}

fn write_seq(f: &mut fmt::Formatter<'_>, open: &str, items: &[Sexp], tail: Option<&Sexp>) -> fmt::Result {
    f.write_str(open)?;
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_char(' ')?;
        }
        write!(f, "{item}")?;
    }
    if let Some(tail) = tail {
        write!(f, " . {tail}")?;
    }
    f.write_char(')')
}

/// A canonical name prints bare (downcased) when the reader would give it back unchanged,
/// otherwise between bars.
fn write_symbol_name(f: &mut impl fmt::Write, name: &str) -> fmt::Result {
    if is_plain_symbol_name(name) {
        for c in name.chars() {
            f.write_char(c.to_ascii_lowercase())?;
        }
        Ok(())
    } else {
        f.write_char('|')?;
        for c in name.chars() {
            if c == '|' || c == '\\' {
                f.write_char('\\')?;
            }
            f.write_char(c)?;
        }
        f.write_char('|')
    }
}

/// Names made only of upper-case ASCII letters, digits and the constituent punctuation the
/// standard reader leaves alone, not looking like a number.
fn is_plain_symbol_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b"-*+/<>=!?%&$_.~^@[]{}".contains(&b))
        && !name.bytes().all(|b| b == b'.')
        && !looks_like_number(name)
}

fn write_lisp_string(f: &mut impl fmt::Write, s: &str) -> fmt::Result {
    f.write_char('"')?;
    let mut rest = s;
    // Written a run at a time between the characters that need a backslash.
    while let Some(special) = rest.bytes().position(|b| b == b'"' || b == b'\\') {
        f.write_str(&rest[..special])?;
        f.write_char('\\')?;
        f.write_str(&rest[special..special + 1])?;
        rest = &rest[special + 1..];
    }
    f.write_str(rest)?;
    f.write_char('"')
}

/// A form this client sends. Symbols carry their package (both dialects read requests in a
/// package that uses nothing) and come from `&'static str` because every symbol we send is a
/// name we chose, never user text: user text travels only inside [`Form::String`].
#[derive(Debug, Clone, PartialEq)]
pub enum Form {
    /// `nil`.
    Nil,
    /// `t`.
    T,
    /// Printed in decimal.
    Integer(i64),
    /// Any text, printed as a Lisp string with `"` and `\` escaped.
    String(String),
    /// A keyword, named without the colon: `Keyword("ok")` prints `:ok`.
    Keyword(&'static str),
    /// `package:name`, printed in lower case.
    Symbol(&'static str, &'static str),
    /// A proper list; an empty one prints `()`.
    List(Vec<Form>),
    /// A form printed already ([`Form::printed`]): one sent again (a request retried after a
    /// reload, or to a new thread) costs neither its copying nor its printing again.
    Printed(Arc<str>),
}

/// A string.
impl From<&str> for Form {
    fn from(text: &str) -> Self {
        Form::String(text.to_string())
    }
}

/// A string.
impl From<String> for Form {
    fn from(text: String) -> Self {
        Form::String(text)
    }
}

/// `t` or `nil`.
impl From<bool> for Form {
    fn from(flag: bool) -> Self {
        if flag {
            Form::T
        } else {
            Form::Nil
        }
    }
}

/// An integer.
impl From<i64> for Form {
    fn from(n: i64) -> Self {
        Form::Integer(n)
    }
}

/// An integer; one past the largest the wire carries is sent as that largest.
impl From<u64> for Form {
    fn from(n: u64) -> Self {
        Form::Integer(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// An integer; one past the largest the wire carries is sent as that largest.
impl From<usize> for Form {
    fn from(n: usize) -> Self {
        Form::Integer(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// The value, or `nil` when there is none.
impl<T: Into<Form>> From<Option<T>> for Form {
    fn from(value: Option<T>) -> Self {
        value.map_or(Form::Nil, Into::into)
    }
}

impl Form {
    /// Shorthand for [`Form::String`].
    pub fn string(s: impl Into<String>) -> Self {
        Form::String(s.into())
    }

    /// `(cl:list items...)`: in a request, which the server evaluates, a list of the items'
    /// values.
    pub fn list_of<T: Into<Form>>(items: impl IntoIterator<Item = T>) -> Self {
        Form::call("cl", "list", items.into_iter().map(Into::into))
    }

    /// `form`, printed once for all the requests it goes into.
    pub fn printed(form: &Form) -> Self {
        Form::Printed(form.to_wire().into())
    }

    /// `(package:function args...)`.
    pub fn call(package: &'static str, function: &'static str, args: impl IntoIterator<Item = Form>) -> Self {
        Form::List(std::iter::once(Form::Symbol(package, function)).chain(args).collect())
    }

    /// Prints the form for the wire. Names are lower-cased the way SLIME prints them; both
    /// readers upcase them back.
    pub fn to_wire(&self) -> String {
        // Most requests fit; growing from empty would reallocate several times for each.
        let mut out = String::with_capacity(256);
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Form::Nil => out.push_str("nil"),
            Form::T => out.push('t'),
            Form::Integer(n) => {
                let _ = write!(out, "{n}");
            }
            Form::String(s) => {
                let _ = write_lisp_string(out, s);
            }
            Form::Keyword(name) => {
                out.push(':');
                push_static_name(out, name);
            }
            Form::Symbol(package, name) => {
                push_static_name(out, package);
                out.push(':');
                push_static_name(out, name);
            }
            Form::List(items) => {
                out.push('(');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    item.write(out);
                }
                out.push(')');
            }
            Form::Printed(text) => out.push_str(text),
        }
    }

    /// What the server's reader yields for this form, for tests that print and read back.
    #[cfg(test)]
    pub fn to_sexp(&self) -> Sexp {
        match self {
            Form::Nil => Sexp::Nil,
            Form::T => Sexp::Symbol { package: None, name: "T".into(), internal: false },
            Form::Integer(n) => Sexp::Integer(*n),
            Form::String(s) => Sexp::String(s.clone()),
            Form::Keyword(name) => Sexp::Keyword(name.to_ascii_uppercase().into()),
            Form::Symbol(package, name) => Sexp::Symbol {
                package: Some(package.to_ascii_uppercase()),
                name: name.to_ascii_uppercase(),
                internal: false,
            },
            Form::List(items) if items.is_empty() => Sexp::Nil,
            Form::List(items) => Sexp::List(items.iter().map(Form::to_sexp).collect()),
            Form::Printed(text) => super::read(text).expect("a printed form reads back"),
        }
    }
}

/// Static names are ours; a name that would need escaping would close a Slynk connection, so it
/// is a programming error caught by the tests that print every form we build.
fn push_static_name(out: &mut String, name: &str) {
    debug_assert!(is_plain_symbol_name(&name.to_ascii_uppercase()), "symbol name {name:?} cannot be sent unescaped");
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        out.push_str(&name.to_ascii_lowercase());
    } else {
        out.push_str(name);
    }
}

impl fmt::Display for Form {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_wire())
    }
}

// The syntax of numbers, which the reader reads and the printer must not give a symbol's name.

fn digits(input: &str) -> IResult<&str, &str> {
    take_while(|c: char| c.is_ascii_digit()).parse(input)
}

fn sign(input: &str) -> IResult<&str, Option<char>> {
    opt(alt((char('+'), char('-')))).parse(input)
}

/// Decimal integers (`12`, `-3`, `12.`), ratios (`1/3`) and floats (`1.5`, `.5`, `1e10`,
/// `1.0d0`). Integers that fit in an `i64` become [`Sexp::Integer`].
pub(crate) fn number(input: &str) -> IResult<&str, Sexp> {
    let exponent = || pair(one_of("eEsSfFdDlL"), pair(sign, digit1));
    let mut float = recognize((
        sign,
        alt((
            recognize((digits, char('.'), digit1, opt(exponent()))),
            recognize((digit1, opt(pair(char('.'), digits)), exponent())),
        )),
    ));
    if let Ok(("", text)) = float.parse(input) {
        return Ok(("", Sexp::Number(text.to_string())));
    }
    let mut ratio = recognize((sign, digit1, char('/'), digit1));
    if let Ok(("", text)) = ratio.parse(input) {
        return Ok(("", Sexp::Number(text.to_string())));
    }
    let (rest, text) = recognize((sign, digit1, opt(char('.')))).parse(input)?;
    let integer = text.trim_end_matches('.');
    let value = integer.parse::<i64>().map(Sexp::Integer).unwrap_or_else(|_| Sexp::Number(integer.to_string()));
    Ok((rest, value))
}

/// Whether a symbol name would be read back as a number, so the printer must bar-quote it.
fn looks_like_number(token: &str) -> bool {
    matches!(number(token), Ok(("", _)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::reader::read;
    use proptest::prelude::*;

    const PACKAGES: &[&str] = &["swank", "slynk", "cl", "swank-repl", "mcp-agent-helper"];
    const NAMES: &[&str] =
        &["connection-info", "list", "*print-case*", "eval-and-grab-output", "1+", "throw-to-toplevel"];

    fn form() -> impl Strategy<Value = Form> {
        let leaf = prop_oneof![
            Just(Form::Nil),
            Just(Form::T),
            any::<i64>().prop_map(Form::Integer),
            any::<String>().prop_map(Form::String),
            proptest::sample::select(NAMES).prop_map(Form::Keyword),
            (proptest::sample::select(PACKAGES), proptest::sample::select(NAMES)).prop_map(|(p, n)| Form::Symbol(p, n)),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..8).prop_map(Form::List),
                inner.prop_map(|form| Form::printed(&form)),
            ]
        })
    }

    fn sexp() -> impl Strategy<Value = Sexp> {
        let name = "[A-Za-z0-9 :|\\\\().*+-]{1,12}";
        let leaf = prop_oneof![
            Just(Sexp::Nil),
            any::<i64>().prop_map(Sexp::Integer),
            any::<String>().prop_map(Sexp::String),
            name.prop_map(|name| Sexp::Keyword(name.into())),
            (proptest::option::of(name), name, any::<bool>()).prop_map(|(package, name, internal)| {
                let internal = internal && package.as_deref().is_some_and(|p| !p.is_empty());
                Sexp::Symbol { package, name, internal }
            }),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 1..6).prop_map(Sexp::List),
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Sexp::Vector),
                (proptest::collection::vec(inner.clone(), 1..4), inner)
                    .prop_filter("a dotted tail is an atom", |(_, t)| !matches!(
                        t,
                        Sexp::Nil | Sexp::List(_) | Sexp::Dotted(..)
                    ))
                    .prop_map(|(items, tail)| Sexp::Dotted(items, Box::new(tail))),
            ]
        })
    }

    proptest! {
        #[test]
        fn every_form_we_send_reads_back_as_itself(form in form()) {
            prop_assert_eq!(read(&form.to_wire()).unwrap(), form.to_sexp());
        }

        #[test]
        fn sent_forms_stay_within_what_slynk_can_read(form in form()) {
            let wire = form.to_wire();
            // Outside strings: no backslash, no bars, no character syntax.
            let mut in_string = false;
            let mut escaped = false;
            for c in wire.chars() {
                if in_string {
                    if escaped { escaped = false } else if c == '\\' { escaped = true } else if c == '"' { in_string = false }
                } else {
                    prop_assert!(!matches!(c, '\\' | '|' | '#'), "{} in {}", c, wire);
                    in_string = c == '"';
                }
            }
        }

        #[test]
        fn printed_values_read_back(value in sexp()) {
            prop_assert_eq!(read(&value.to_string()).unwrap(), value);
        }

        #[test]
        fn arbitrary_text_never_panics(text in any::<String>()) {
            let _ = read(&text);
        }
    }

    #[test]
    fn emacs_rex_prints_as_slime_does() {
        let request = Form::List(vec![
            Form::Keyword("emacs-rex"),
            Form::call("swank", "connection-info", []),
            Form::string("COMMON-LISP-USER"),
            Form::T,
            Form::Integer(1),
        ]);
        assert_eq!(request.to_wire(), "(:emacs-rex (swank:connection-info) \"COMMON-LISP-USER\" t 1)");
        assert_eq!(Form::string("a\"b\\c\nd").to_wire(), "\"a\\\"b\\\\c\nd\"");
    }
}
