//! Typed decoding of s-expression replies with serde: a property list `(:forms-compiled 1 ...)`
//! becomes a struct with `#[serde(rename_all = "kebab-case")]`, a list a `Vec`, `nil` an empty
//! `Vec`, `None` or `false`.
//!
//! Every field a struct declares must be present in the plist, `Option` fields included (`nil`
//! stands for `None`): a key the Lisp side renamed or dropped is an error that names it and where
//! it was expected, instead of a silent default. Keys the struct does not declare are skipped, so
//! a reply may carry more than one reader needs.
//!
//! See docs/design.md, "The swank client".

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::Sexp;

/// Decodes `sexp` into `T`.
pub fn from_sexp<'a, T: Deserialize<'a>>(sexp: &'a Sexp) -> Result<T, DecodeError> {
    T::deserialize(SexpDeserializer(sexp))
}

/// Why a reply did not have the shape its type expects. The message says where: the keys and
/// list positions from the outside in, as in `:conditions 2 :severity: expected a string`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    path: Vec<String>,
    message: String,
}

impl DecodeError {
    fn within(mut self, step: String) -> Self {
        self.path.insert(0, step);
        self
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path.join(" "), self.message)
        }
    }
}

impl std::error::Error for DecodeError {}

impl de::Error for DecodeError {
    fn custom<M: fmt::Display>(message: M) -> Self {
        DecodeError { path: Vec::new(), message: message.to_string() }
    }
}

/// A plist key as the struct names it: `:FORMS-COMPILED` is `forms-compiled`. Made in `buffer`
/// when it fits: a reply's keys are read for every call.
fn key_name<'b>(key: &'b Sexp, buffer: &'b mut [u8; 40]) -> Option<Cow<'b, str>> {
    let Sexp::Keyword(name) = key else { return None };
    let lower = buffer.get_mut(..name.len()).filter(|_| name.is_ascii()).and_then(|lower| {
        lower.copy_from_slice(name.as_bytes());
        lower.make_ascii_lowercase();
        std::str::from_utf8(lower).ok()
    });
    Some(lower.map_or_else(|| Cow::Owned(name.to_ascii_lowercase()), Cow::Borrowed))
}

/// Whether `key` is the plist key of struct field `field`.
fn names_field(key: &Sexp, field: &str) -> bool {
    matches!(key, Sexp::Keyword(name) if name.eq_ignore_ascii_case(field))
}

fn unexpected(sexp: &Sexp, expected: &str) -> DecodeError {
    let mut shown = sexp.to_string();
    if shown.len() > 80 {
        let cut = (0..=77).rev().find(|&i| shown.is_char_boundary(i)).unwrap_or(0);
        shown.truncate(cut);
        shown.push_str("...");
    }
    de::Error::custom(format_args!("expected {expected}, found {shown}"))
}

/// The pairs of a property list, or an error saying the value is not one.
fn plist_pairs(sexp: &Sexp) -> Result<&[Sexp], DecodeError> {
    let items = sexp.as_list().ok_or_else(|| unexpected(sexp, "a property list"))?;
    if items.len() % 2 != 0 || items.chunks(2).any(|pair| !matches!(pair[0], Sexp::Keyword(_))) {
        return Err(unexpected(sexp, "a property list"));
    }
    Ok(items)
}

#[derive(Clone, Copy)]
struct SexpDeserializer<'a>(&'a Sexp);

impl<'de> de::Deserializer<'de> for SexpDeserializer<'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.0 {
            Sexp::Nil => visitor.visit_none(),
            Sexp::Integer(n) => visitor.visit_i64(*n),
            Sexp::String(s) => visitor.visit_borrowed_str(s),
            Sexp::Symbol { package: None, name, .. } if name == "T" => visitor.visit_bool(true),
            Sexp::List(_) | Sexp::Vector(_) => self.deserialize_seq(visitor),
            other => visitor.visit_string(other.to_string()),
        }
    }

    /// A generalised boolean: everything but `nil` is true.
    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_bool(self.0.is_true())
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.0 {
            Sexp::Integer(n) => visitor.visit_i64(*n),
            other => Err(unexpected(other, "an integer")),
        }
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.0 {
            Sexp::Integer(n) => match u64::try_from(*n) {
                Ok(n) => visitor.visit_u64(n),
                Err(_) => Err(unexpected(self.0, "a non-negative integer")),
            },
            other => Err(unexpected(other, "a non-negative integer")),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.0 {
            Sexp::String(s) => visitor.visit_borrowed_str(s),
            other => Err(unexpected(other, "a string")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.0 {
            Sexp::Nil => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.0 {
            Sexp::Nil => visitor.visit_unit(),
            other => Err(unexpected(other, "nil")),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.0 {
            Sexp::Nil => visitor.visit_seq(Elements { items: [].iter(), index: 0 }),
            Sexp::List(items) | Sexp::Vector(items) => visitor.visit_seq(Elements { items: items.iter(), index: 0 }),
            other => Err(unexpected(other, "a list")),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, length: usize, visitor: V) -> Result<V::Value, DecodeError> {
        match self.0.as_list() {
            Some(items) if items.len() == length => visitor.visit_seq(Elements { items: items.iter(), index: 0 }),
            _ => Err(unexpected(self.0, &format!("a list of {length}"))),
        }
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        length: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_tuple(length, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_map(Pairs { items: plist_pairs(self.0)?.chunks(2), value: None })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        let items = plist_pairs(self.0)?;
        if let Some(missing) = fields.iter().find(|field| !items.chunks(2).any(|pair| names_field(&pair[0], field))) {
            return Err(de::Error::custom(format_args!("the reply has no :{missing}")));
        }
        visitor.visit_map(Pairs { items: items.chunks(2), value: None })
    }

    /// A keyword names a unit variant by its lower-case name: `:error` is `Kind::Error` with
    /// `rename_all = "lowercase"`.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        match self.0 {
            Sexp::Keyword(name) => visitor.visit_enum(name.to_ascii_lowercase().into_deserializer()),
            Sexp::String(name) => visitor.visit_enum(name.as_str().into_deserializer()),
            other => Err(unexpected(other, "a keyword")),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i128 u8 u16 u32 u128 f32 f64 char bytes byte_buf unit_struct newtype_struct identifier
    }
}

struct Elements<'a> {
    items: std::slice::Iter<'a, Sexp>,
    index: usize,
}

impl<'de> SeqAccess<'de> for Elements<'de> {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DecodeError> {
        let Some(item) = self.items.next() else { return Ok(None) };
        let index = self.index;
        self.index += 1;
        seed.deserialize(SexpDeserializer(item)).map(Some).map_err(|e| e.within(index.to_string()))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Pairs<'a> {
    items: std::slice::Chunks<'a, Sexp>,
    /// The key and value of the pair whose key was read last.
    value: Option<(&'a Sexp, &'a Sexp)>,
}

impl<'de> MapAccess<'de> for Pairs<'de> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DecodeError> {
        let Some(pair) = self.items.next() else { return Ok(None) };
        let mut buffer = [0; 40];
        let key = key_name(&pair[0], &mut buffer).unwrap_or_default();
        let decoded = seed.deserialize(key.as_ref().into_deserializer())?;
        self.value = Some((&pair[0], &pair[1]));
        Ok(Some(decoded))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, DecodeError> {
        let (key, value) =
            self.value.take().ok_or_else(|| de::Error::custom("a value was asked for before its key"))?;
        seed.deserialize(SexpDeserializer(value)).map_err(|e| {
            let mut buffer = [0; 40];
            e.within(format!(":{}", key_name(key, &mut buffer).unwrap_or_default()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "kebab-case")]
    struct Condition {
        severity: String,
        line: Option<u64>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        Error,
        Timeout,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "kebab-case")]
    struct Report {
        forms_compiled: u64,
        conditions: Vec<Condition>,
        read_error: Option<String>,
        kind: Kind,
        success: bool,
        captured: (String, u64),
    }

    fn decode<T: for<'a> Deserialize<'a>>(text: &str) -> Result<T, String> {
        from_sexp(&read(text).unwrap()).map_err(|e| e.to_string())
    }

    #[test]
    fn plists_lists_nil_keywords_and_pairs_decode() {
        let report: Report = decode(
            "(:forms-compiled 2 :conditions ((:severity \"WARNING\" :line nil) (:severity \"NOTE\" :line 3)) \
             :read-error nil :kind :timeout :success t :captured (\"out\" 7) :extra (ignored . too))",
        )
        .unwrap();
        assert_eq!(
            report,
            Report {
                forms_compiled: 2,
                conditions: vec![
                    Condition { severity: "WARNING".into(), line: None },
                    Condition { severity: "NOTE".into(), line: Some(3) }
                ],
                read_error: None,
                kind: Kind::Timeout,
                success: true,
                captured: ("out".into(), 7),
            }
        );
        let empty: Report = decode(
            "(:forms-compiled 0 :conditions nil :read-error \"eof\" :kind :error :success nil :captured (\"\" 0))",
        )
        .unwrap();
        assert_eq!((empty.conditions.len(), empty.read_error.as_deref(), empty.success), (0, Some("eof"), false));
    }

    #[test]
    fn a_missing_key_is_an_error_that_names_it_and_where() {
        assert_eq!(decode::<Condition>("(:severity \"NOTE\")").unwrap_err(), "the reply has no :line");
        assert_eq!(
            decode::<Report>("(:forms-compiled 1 :conditions ((:line 1)) :read-error nil :kind :error :success t :captured (\"\" 0))")
                .unwrap_err(),
            ":conditions 0: the reply has no :severity"
        );
    }

    #[test]
    fn a_value_of_the_wrong_shape_is_an_error_that_says_what_was_found() {
        assert_eq!(
            decode::<Condition>("(:severity 3 :line nil)").unwrap_err(),
            ":severity: expected a string, found 3"
        );
        assert_eq!(
            decode::<Condition>("(:severity \"x\" :line -1)").unwrap_err(),
            ":line: expected a non-negative integer, found -1"
        );
        assert_eq!(
            decode::<Condition>("(\"not\" \"a plist\")").unwrap_err(),
            "expected a property list, found (\"not\" \"a plist\")"
        );
        assert!(decode::<Report>(
            "(:forms-compiled 1 :conditions nil :read-error nil :kind :other :success t :captured (\"\" 0))"
        )
        .unwrap_err()
        .starts_with(":kind: unknown variant `other`"));
    }
}
