//! Typed access to a tool call's `arguments` object.
//!
//! Every accessor returns an [`ArgumentError`] whose text tells the model exactly which argument
//! was wrong and what was expected, so a bad call can be corrected on the next try instead of
//! surfacing as a protocol error.

use serde_json::{Map, Value};

/// A bad `arguments` object or argument; the text is the message for the model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ArgumentError(pub String);

/// A tool call's `arguments`: a JSON object, read one argument at a time.
#[derive(Debug, Clone, Default)]
pub struct Arguments(Map<String, Value>);

impl Arguments {
    /// Accepts the `arguments` member of `tools/call`; absent or `null` means "no arguments".
    pub fn from_value(value: Option<Value>) -> Result<Self, ArgumentError> {
        match value {
            None | Some(Value::Null) => Ok(Self(Map::new())),
            Some(Value::Object(map)) => Ok(Self(map)),
            Some(other) => Err(ArgumentError(format!("`arguments` must be a JSON object, got {}.", describe(&other)))),
        }
    }

    pub(crate) fn required_str(&self, name: &str) -> Result<&str, ArgumentError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Err(ArgumentError(format!("Missing required argument `{name}` (a string)."))),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(wrong_type(name, "a string", other)),
        }
    }

    pub(crate) fn optional_str(&self, name: &str) -> Result<Option<&str>, ArgumentError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(name, "a string", other)),
        }
    }

    pub(crate) fn optional_bool(&self, name: &str) -> Result<Option<bool>, ArgumentError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(wrong_type(name, "true or false", other)),
        }
    }

    /// A non-negative integer no larger than `max`. Integral floats (`5.0`) are accepted because
    /// some clients serialise every number as a float.
    pub fn optional_u64(&self, name: &str, max: u64) -> Result<Option<u64>, ArgumentError> {
        let value = match self.0.get(name) {
            None | Some(Value::Null) => return Ok(None),
            Some(value) => value,
        };
        let expected = format!("an integer from 0 to {max}");
        let number = match value {
            Value::Number(n) => {
                n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
            }
            _ => None,
        };
        match number {
            Some(n) if n <= max => Ok(Some(n)),
            _ => Err(wrong_type(name, &expected, value)),
        }
    }

    /// A list of integers from 0 to `max`, or `None` when absent; an empty list
    /// counts as absent.
    pub fn optional_u64_list(&self, name: &str, max: u64) -> Result<Option<Vec<u64>>, ArgumentError> {
        let items = match self.0.get(name) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(items)) => items,
            Some(other) => return Err(wrong_type(name, &format!("a list of integers from 0 to {max}"), other)),
        };
        let mut numbers = Vec::with_capacity(items.len());
        for item in items {
            let single = Arguments(Map::from_iter([(name.to_string(), item.clone())]));
            match single.optional_u64(name, max) {
                Ok(Some(n)) => numbers.push(n),
                _ => {
                    return Err(wrong_type(name, &format!("a list of integers from 0 to {max}"), &items.clone().into()))
                }
            }
        }
        Ok((!numbers.is_empty()).then_some(numbers))
    }
    /// A list of strings; absent means none.
    pub(crate) fn optional_str_list(&self, name: &str) -> Result<Vec<&str>, ArgumentError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
                Ok(items.iter().filter_map(Value::as_str).collect())
            }
            Some(other) => Err(wrong_type(name, "an array of strings", other)),
        }
    }

    /// Whether the call gives `name` (a null counts as not given).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.0.get(name).is_some_and(|value| !value.is_null())
    }

    /// The names of the arguments given.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    /// A list of objects, each read as the arguments of its own; absent means none.
    pub(crate) fn optional_object_list(&self, name: &str) -> Result<Option<Vec<Arguments>>, ArgumentError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) if items.iter().all(Value::is_object) => {
                Ok(Some(items.iter().filter_map(Value::as_object).map(|object| Arguments(object.clone())).collect()))
            }
            Some(other) => Err(wrong_type(name, "an array of objects", other)),
        }
    }

    /// A number from 0 to `max`, or a name.
    pub(crate) fn optional_number_or_name(
        &self,
        name: &str,
        max: u64,
    ) -> Result<Option<NumberOrName<'_>>, ArgumentError> {
        match self.0.get(name) {
            Some(Value::String(text)) => Ok(Some(NumberOrName::Name(text))),
            Some(Value::Number(_)) => Ok(self.optional_u64(name, max)?.map(NumberOrName::Number)),
            None | Some(Value::Null) => Ok(None),
            Some(other) => Err(wrong_type(name, &format!("an integer from 0 to {max} or a name"), other)),
        }
    }
}

/// An argument that takes a number or a name, such as a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberOrName<'a> {
    /// Given as a number.
    Number(u64),
    /// Given as a string.
    Name(&'a str),
}

fn wrong_type(name: &str, expected: &str, got: &Value) -> ArgumentError {
    ArgumentError(format!("Argument `{name}` must be {expected}, got {}.", describe(got)))
}

fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => return "null".into(),
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let mut shown = value.to_string();
    if shown.len() > 60 {
        let cut = (0..=60).rev().find(|&i| shown.is_char_boundary(i)).unwrap_or(0);
        shown.truncate(cut);
        shown.push('…');
    }
    format!("{kind} {shown}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Arguments {
        Arguments::from_value(Some(v)).unwrap()
    }

    #[test]
    fn wrong_types_name_the_argument_and_the_value() {
        let a = args(json!({"code": 5, "flag": "yes", "n": -1}));
        assert_eq!(a.required_str("code").unwrap_err().0, "Argument `code` must be a string, got number 5.");
        assert!(a.optional_bool("flag").unwrap_err().0.contains("true or false"));
        assert!(a.optional_u64("n", 10).unwrap_err().0.contains("from 0 to 10"));
        assert!(a.required_str("missing").unwrap_err().0.contains("Missing required"));
    }

    #[test]
    fn integral_floats_count_as_integers() {
        let a = args(json!({"n": 5.0, "m": 5.5}));
        assert_eq!(a.optional_u64("n", 10).unwrap(), Some(5));
        assert!(a.optional_u64("m", 10).is_err());
    }

    #[test]
    fn integer_lists_are_read_whole_or_refused() {
        let a = args(json!({"ok": [3, 1.0], "empty": [], "bad": [1, "2"], "scalar": 4}));
        assert_eq!(a.optional_u64_list("ok", 10).unwrap(), Some(vec![3, 1]));
        assert_eq!(a.optional_u64_list("empty", 10).unwrap(), None);
        assert_eq!(a.optional_u64_list("absent", 10).unwrap(), None);
        assert!(a.optional_u64_list("bad", 10).unwrap_err().0.contains("a list of integers"));
        assert!(a.optional_u64_list("scalar", 10).unwrap_err().0.contains("got number 4"));
    }

    #[test]
    fn non_object_arguments_are_rejected() {
        assert!(Arguments::from_value(Some(json!([1]))).is_err());
        assert!(Arguments::from_value(None).is_ok());
    }
}
