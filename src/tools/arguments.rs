//! A tool's arguments, declared once, as the struct the tool reads them as ([`arguments!`]): that
//! declaration gives the [`Param`]s, whose list is both the `inputSchema` that `tools/list` shows
//! and the checks a call's `arguments` pass before the tool runs, and the reading of a checked
//! call as the struct (docs/design.md, "The toolbox"). So the schema, the checks and the type
//! cannot disagree: an argument the list does not name is refused, naming the nearest one it
//! does; a declared minimum, maximum or set of values is enforced where it is declared.
//!
//! Every refusal is an [`ArgumentError`] whose text tells the model exactly which argument was
//! wrong and what was expected, so a bad call can be corrected on the next try instead of
//! surfacing as a protocol error.

use serde_json::{json, Map, Value};

/// A bad `arguments` object or argument; the text is the message for the model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ArgumentError(pub String);

/// The largest integer an argument takes unless it declares less, which the schema leaves unsaid:
/// the largest every JSON client carries exactly (2^53 - 1), a fixnum in the image, and more than
/// any count, offset or number a tool takes.
const LARGEST: u64 = (1 << 53) - 1;

/// One argument of a tool: its name, the values it takes, and what the schema says of it.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    name: &'static str,
    kind: Kind,
    required: bool,
    description: &'static str,
    /// The refusal of a value of the right type that the argument does not take, when the tool
    /// explains it better than "must be from ... to ...".
    explain: Option<fn(&Value) -> String>,
}

/// What an argument takes, as its [`ArgumentType`] says.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A string.
    Text,
    /// Lisp code the image reads and may run: what no read-only tool takes.
    Code,
    /// One of these names.
    OneOf(&'static [&'static str]),
    /// True or false.
    Flag,
    /// An integer in the range.
    Integer(Range),
    /// A list of integers in the range.
    Integers(Range),
    /// A list of strings.
    Texts,
    /// An integer in the range, or a name.
    IntegerOrName(Range),
    /// A list of objects, each the arguments of its own that these declare.
    Objects(&'static [Param]),
}

/// The integers an argument takes; `max` when it declares one. The check enforces them and the
/// schema leaves them unsaid: a refusal names them, which is all an agent needs of a bound (a day
/// for a time limit, counting from 1), and the list is read in every session.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    min: u64,
    max: Option<u64>,
}

impl Range {
    /// Any integer a JSON client carries exactly.
    const FROM_ZERO: Range = Range { min: 0, max: None };

    fn holds(self, n: u64) -> bool {
        n >= self.min && n <= self.max.unwrap_or(LARGEST)
    }

    fn describe(self) -> String {
        match (self.min, self.max) {
            (min, Some(max)) => format!("an integer from {min} to {max}"),
            (min, None) => format!("an integer of {min} or more"),
        }
    }
}

impl Param {
    /// The argument `name`, read as `T`: the type says what the argument takes and whether a call
    /// must give it ([`ArgumentType`]); [`arguments!`] declares each of a tool's this way.
    pub const fn of<T: ArgumentType>(name: &'static str) -> Self {
        Param { name, kind: T::KIND, required: T::REQUIRED, description: "", explain: None }
    }

    /// What the schema says of it, beyond its name and type.
    pub const fn describe(mut self, description: &'static str) -> Self {
        self.description = description;
        self
    }

    /// The string is Lisp code, which the image reads and may run. A tool that takes some is never
    /// read-only ([`Param::is_code`]): SBCL's compiler and macroexpander run code of the request
    /// itself (constant folding calls the functions a form names), so only a tool that takes no
    /// code can promise to run none. Of another kind of argument, a declaration that does not
    /// compile (its `PARAMS` are a constant).
    pub const fn code(mut self) -> Self {
        self.kind = match self.kind {
            Kind::Text => Kind::Code,
            _ => panic!("only a string argument is Lisp code"),
        };
        self
    }

    /// Whether it is Lisp code (or holds some, in each of a list of objects).
    pub fn is_code(&self) -> bool {
        match self.kind {
            Kind::Code => true,
            Kind::Objects(params) => params.iter().any(Param::is_code),
            _ => false,
        }
    }

    /// An integer argument takes at least `min` (0 unless it says); of another kind, a declaration
    /// that does not compile.
    pub const fn at_least(mut self, min: u64) -> Self {
        self.kind = match self.kind {
            Kind::Integer(range) => Kind::Integer(Range { min, ..range }),
            Kind::Integers(range) => Kind::Integers(Range { min, ..range }),
            Kind::IntegerOrName(range) => Kind::IntegerOrName(Range { min, ..range }),
            _ => panic!("only an integer argument has a minimum"),
        };
        self
    }

    /// An integer argument takes at most `max`; of another kind, a declaration that does not
    /// compile.
    pub const fn at_most(mut self, max: u64) -> Self {
        self.kind = match self.kind {
            Kind::Integer(range) => Kind::Integer(Range { max: Some(max), ..range }),
            Kind::Integers(range) => Kind::Integers(Range { max: Some(max), ..range }),
            Kind::IntegerOrName(range) => Kind::IntegerOrName(Range { max: Some(max), ..range }),
            _ => panic!("only an integer argument has a maximum"),
        };
        self
    }

    /// The call must give it, though its type would let it leave it out: an argument of a shared
    /// type that one tool needs and another does not.
    pub const fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// A value of the right type that the argument does not take is refused with `explain`'s text.
    pub const fn explained(mut self, explain: fn(&Value) -> String) -> Self {
        self.explain = Some(explain);
        self
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Its JSON Schema.
    fn schema(&self) -> Value {
        let mut schema = Map::new();
        let kind = match self.kind {
            // No type: an argument the schema gives none is a string, as the instructions say once
            // for the 60 of them in a list read in every session; a call giving another type is
            // refused naming the argument.
            Kind::Text | Kind::Code => None,
            // The names say it is a string.
            Kind::OneOf(choices) => {
                schema.insert("enum".into(), json!(choices));
                None
            }
            // False when absent, as any client takes a boolean it does not give: the list, read in
            // every session, does not say so sixteen times.
            Kind::Flag => Some(json!("boolean")),
            Kind::Integer(_) => Some(json!("integer")),
            Kind::Integers(_) => {
                schema.insert("items".into(), json!({"type": "integer"}));
                Some(json!("array"))
            }
            // Of strings, which take no type.
            Kind::Texts => Some(json!("array")),
            Kind::IntegerOrName(_) => Some(json!(["integer", "string"])),
            // Each element's arguments are the tool's own, which its description names; the schema
            // says which of them an element must give.
            Kind::Objects(params) => {
                let required: Vec<&str> = params.iter().filter(|p| p.required).map(|p| p.name).collect();
                let mut items = json!({"type": "object"});
                if !required.is_empty() {
                    items["required"] = json!(required);
                }
                schema.insert("items".into(), items);
                Some(json!("array"))
            }
        };
        if let Some(kind) = kind {
            schema.insert("type".into(), kind);
        }
        if !self.description.is_empty() {
            schema.insert("description".into(), self.description.into());
        }
        schema.into()
    }

    /// What it takes, for a refusal of a value of the wrong type.
    fn expected(&self) -> String {
        match self.kind {
            Kind::Text | Kind::Code => "a string".into(),
            Kind::OneOf(choices) => format!("one of {}", choices.join(", ")),
            Kind::Flag => "true or false".into(),
            Kind::Integer(range) => range.describe(),
            Kind::Integers(Range { min, max: Some(max), .. }) => format!("a list of integers from {min} to {max}"),
            Kind::Integers(Range { min, max: None, .. }) => format!("a list of integers of {min} or more"),
            Kind::Texts => "an array of strings".into(),
            Kind::IntegerOrName(range) => format!("{} or a name", range.describe()),
            Kind::Objects(_) => "an array of objects".into(),
        }
    }

    /// Checks a value the call gives; `null` counts as absent and is never checked.
    fn check(&self, value: &Value) -> Result<(), ArgumentError> {
        let wrong =
            || ArgumentError(format!("Argument `{}` must be {}, got {}.", self.name, self.expected(), describe(value)));
        let refused = || match self.explain {
            Some(explain) => ArgumentError(explain(value)),
            None => wrong(),
        };
        match (self.kind, value) {
            (Kind::Text | Kind::Code, Value::String(_)) | (Kind::Flag, Value::Bool(_)) => Ok(()),
            (Kind::OneOf(choices), Value::String(text)) if !choices.contains(&text.as_str()) => {
                Err(match self.explain {
                    Some(explain) => ArgumentError(explain(value)),
                    None => ArgumentError(format!("Unknown {} {value}: use one of {}.", self.name, choices.join(", "))),
                })
            }
            (Kind::OneOf(_), Value::String(_)) => Ok(()),
            (Kind::Integer(range) | Kind::IntegerOrName(range), Value::Number(_)) => match integer(value) {
                Some(n) if range.holds(n) => Ok(()),
                Some(_) => Err(refused()),
                None => Err(wrong()),
            },
            (Kind::IntegerOrName(_), Value::String(_)) => Ok(()),
            (Kind::Integers(range), Value::Array(items)) => {
                let numbers: Option<Vec<u64>> = items.iter().map(integer).collect();
                match numbers {
                    Some(numbers) if numbers.iter().all(|n| range.holds(*n)) => Ok(()),
                    Some(_) => Err(refused()),
                    None => Err(wrong()),
                }
            }
            (Kind::Texts, Value::Array(items)) if items.iter().all(Value::is_string) => Ok(()),
            (Kind::Objects(params), Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let each = format!("each element of `{}`", self.name);
                    match item {
                        Value::Object(_) => Arguments::read(&each, params, None, Some(item.clone()))
                            .map(drop)
                            .map_err(|e| ArgumentError(format!("In element {} of `{}`: {}", i + 1, self.name, e.0)))?,
                        _ => return Err(wrong()),
                    }
                }
                Ok(())
            }
            _ => Err(wrong()),
        }
    }
}

/// A non-negative integer. Integral floats (`5.0`) count, because some clients serialise every
/// number as a float.
fn integer(value: &Value) -> Option<u64> {
    let Value::Number(n) = value else { return None };
    n.as_u64()
        .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= LARGEST as f64).map(|f| f as u64))
}

/// The `inputSchema` of a tool taking `params`, and an `image` argument naming one of `images`
/// when there is more than one to choose from. That the first is the default, the instructions say
/// once rather than each tool's schema.
pub(crate) fn input_schema(params: &[Param], images: &[&str]) -> Value {
    let mut properties: Map<String, Value> = params.iter().map(|p| (p.name.to_string(), p.schema())).collect();
    if let [_, _, ..] = images {
        properties.insert("image".into(), json!({"enum": images}));
    }
    let required: Vec<&str> = params.iter().filter(|p| p.required).map(|p| p.name).collect();
    // No `"additionalProperties": false`: the call's check refuses an unknown argument, naming the
    // nearest one the tool takes, which tells an agent more than a client's schema error; and the
    // list, read in every session, does not say it 22 times.
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}

/// A Rust type an argument is read as. The type says what the argument takes (the schema shows
/// it and the check enforces it) and whether a call must give it, so that a tool's arguments,
/// declared once as the struct it reads ([`arguments!`]), give the schema, the checks and the
/// reading alike.
pub trait ArgumentType: Sized {
    /// What the argument takes.
    const KIND: Kind;
    /// Whether a call must give it.
    const REQUIRED: bool = true;

    /// The value, which the check of [`Self::KIND`] passed; `None` when it is not one.
    fn read(value: &Value) -> Option<Self>;

    /// The value of an argument the call leaves out; `None` when it must give it.
    fn absent() -> Option<Self> {
        None
    }
}

impl ArgumentType for String {
    const KIND: Kind = Kind::Text;

    fn read(value: &Value) -> Option<Self> {
        value.as_str().map(str::to_string)
    }
}

/// False when absent, as a client takes a boolean it does not give.
impl ArgumentType for bool {
    const KIND: Kind = Kind::Flag;
    const REQUIRED: bool = false;

    fn read(value: &Value) -> Option<Self> {
        value.as_bool()
    }

    fn absent() -> Option<Self> {
        Some(false)
    }
}

impl ArgumentType for u64 {
    const KIND: Kind = Kind::Integer(Range::FROM_ZERO);

    fn read(value: &Value) -> Option<Self> {
        integer(value)
    }
}

/// Empty when absent.
impl ArgumentType for Vec<String> {
    const KIND: Kind = Kind::Texts;
    const REQUIRED: bool = false;

    fn read(value: &Value) -> Option<Self> {
        value.as_array()?.iter().map(String::read).collect()
    }

    fn absent() -> Option<Self> {
        Some(Vec::new())
    }
}

/// Empty when absent.
impl ArgumentType for Vec<u64> {
    const KIND: Kind = Kind::Integers(Range::FROM_ZERO);
    const REQUIRED: bool = false;

    fn read(value: &Value) -> Option<Self> {
        value.as_array()?.iter().map(integer).collect()
    }

    fn absent() -> Option<Self> {
        Some(Vec::new())
    }
}

impl ArgumentType for Designator {
    const KIND: Kind = Kind::IntegerOrName(Range::FROM_ZERO);

    fn read(value: &Value) -> Option<Self> {
        match value {
            Value::String(name) => Some(Designator::Name(name.clone())),
            number => integer(number).map(Designator::Number),
        }
    }
}

/// A list of objects, each the arguments `T` declares (the edits of one call).
impl<T: ToolArguments> ArgumentType for Vec<T> {
    const KIND: Kind = Kind::Objects(T::PARAMS);

    fn read(value: &Value) -> Option<Self> {
        value.as_array()?.iter().map(|item| T::from_members(item.as_object()?).ok()).collect()
    }
}

impl<T: ArgumentType> ArgumentType for Option<T> {
    const KIND: Kind = T::KIND;
    const REQUIRED: bool = false;

    fn read(value: &Value) -> Option<Self> {
        T::read(value).map(Some)
    }

    fn absent() -> Option<Self> {
        Some(None)
    }
}

/// A tool's arguments as the struct it reads them as, declared by [`arguments!`]: its fields are
/// the arguments, in the order the schema lists them.
pub trait ToolArguments: Sized {
    /// The arguments: the schema and the checks.
    const PARAMS: &'static [Param];

    /// The arguments from a call's members, which [`Arguments::check`] passed against
    /// [`Self::PARAMS`].
    fn from_members(members: &Map<String, Value>) -> Result<Self, ArgumentError>;
}

/// Argument `name` of checked `members`, as `T`; `null` counts as absent. A failure is a bug:
/// the check let through what the type does not read.
pub fn member<T: ArgumentType>(members: &Map<String, Value>, name: &str) -> Result<T, ArgumentError> {
    let read = match members.get(name).filter(|value| !value.is_null()) {
        Some(value) => T::read(value),
        None => T::absent(),
    };
    read.ok_or_else(|| {
        ArgumentError(format!(
            "swank-mcp failed: argument `{name}` passed its check but does not read as its type; a bug."
        ))
    })
}

/// Declares a tool's arguments once, as the struct the tool reads: each field is an argument of
/// its name, whose type says what it takes ([`ArgumentType`]: `Option` for one a call may leave
/// out), followed by what the schema says of it and the [`Param`] modifiers that narrow it:
///
/// ```ignore
/// arguments! {
///     struct Args {
///         code: String = "The forms to run." => code(),
///         timeout_ms: Option<u64> => at_least(1),
///     }
/// }
/// ```
///
/// gives the struct, and its [`ToolArguments`]: the [`Param`]s that `tools/list` shows and calls
/// are checked against, and the reading of checked arguments as the struct.
macro_rules! arguments {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field:ident : $type:ty $(= $description:literal)? $(=> $($modifier:ident($($argument:expr),*)).+)?
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$field_meta])* $field: $type,)*
        }

        impl $name {
            /// The arguments: the schema and the checks.
            pub(crate) const PARAMS: &'static [$crate::tools::arguments::Param] = &[$(
                $crate::tools::arguments::Param::of::<$type>(stringify!($field))
                    $(.describe($description))?
                    $($(.$modifier($($argument),*))+)?
            ),*];
        }

        impl $crate::tools::arguments::ToolArguments for $name {
            const PARAMS: &'static [$crate::tools::arguments::Param] = $name::PARAMS;

            fn from_members(
                #[allow(unused_variables)] members: &serde_json::Map<String, serde_json::Value>,
            ) -> Result<Self, $crate::tools::arguments::ArgumentError> {
                Ok($name { $($field: $crate::tools::arguments::member(members, stringify!($field))?,)* })
            }
        }
    };
}
pub(crate) use arguments;

/// Declares an argument that takes one of a few names, once: the enum, each variant's name as a
/// call gives it, and its [`ArgumentType`], whose schema lists the names. A call giving another
/// name is refused listing them, before the tool runs.
macro_rules! choices {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $text:literal),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$variant_meta])* $variant,)+
        }

        impl $name {
            /// The names a call gives, in the order the schema lists them.
            pub(crate) const NAMES: &'static [&'static str] = &[$($text),+];

            /// Its name, as a call gives it: for the choices a tool sends on by name (a tool that
            /// only matches on them has no use for it).
            #[allow(dead_code)]
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl $crate::tools::arguments::ArgumentType for $name {
            const KIND: $crate::tools::arguments::Kind = $crate::tools::arguments::Kind::OneOf(Self::NAMES);

            fn read(value: &serde_json::Value) -> Option<Self> {
                match value.as_str()? {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}
pub(crate) use choices;

/// A tool call's `arguments`: a JSON object whose every member the tool declares and whose every
/// value it takes, which the tool reads as its type ([`Arguments::typed`]).
#[derive(Debug, Clone, Default)]
pub struct Arguments {
    values: Map<String, Value>,
}

impl Arguments {
    /// Checks the `arguments` member of a call of `tool`, which takes `params` and, when `images`
    /// is given, an `image` argument naming one of them. Absent or `null` means no arguments.
    pub fn read(
        tool: &str,
        params: &'static [Param],
        images: Option<&[&str]>,
        value: Option<Value>,
    ) -> Result<Self, ArgumentError> {
        Self::check(tool, params, images, &value)?;
        Ok(Self::accept(value))
    }

    /// What [`Arguments::read`] checks, without taking the value.
    pub fn check(
        tool: &str,
        params: &'static [Param],
        images: Option<&[&str]>,
        value: &Option<Value>,
    ) -> Result<(), ArgumentError> {
        let values = match value {
            None | Some(Value::Null) => return Self::check_required(params, &Map::new()),
            Some(Value::Object(map)) => map,
            Some(other) => {
                return Err(ArgumentError(format!("`arguments` must be a JSON object, got {}.", describe(other))))
            }
        };
        for (name, value) in values {
            match (params.iter().find(|p| p.name == name), images) {
                (Some(param), _) if !value.is_null() => param.check(value)?,
                (Some(_), _) => {}
                (None, Some(images)) if name == "image" => check_image(value, images)?,
                (None, _) => return Err(unknown(tool, name, params, images.is_some_and(|images| images.len() > 1))),
            }
        }
        Self::check_required(params, values)
    }

    fn check_required(params: &[Param], values: &Map<String, Value>) -> Result<(), ArgumentError> {
        match params.iter().find(|p| p.required && values.get(p.name).is_none_or(Value::is_null)) {
            Some(missing) => Err(missing_argument(missing.name, &missing.expected())),
            None => Ok(()),
        }
    }

    /// Arguments [`Arguments::check`] passed.
    pub(crate) fn accept(value: Option<Value>) -> Self {
        let values = match value {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        Self { values }
    }

    /// Arguments that only name the image to work in, for a request the server makes on its own.
    pub(crate) fn for_image(image: &str) -> Self {
        Self { values: Map::from_iter([("image".to_string(), Value::from(image))]) }
    }

    /// The arguments as the tool's type `A`, which declares them ([`arguments!`]); `image`, which
    /// the image layer reads, is no field of it.
    pub(crate) fn typed<A: ToolArguments>(&self) -> Result<A, ArgumentError> {
        A::from_members(&self.values)
    }

    /// The value of argument `name`, if the call gives it (`null` counts as not given).
    pub(crate) fn value(&self, name: &str) -> Option<&Value> {
        self.values.get(name).filter(|value| !value.is_null())
    }

    /// Every argument the call gives.
    pub(crate) fn values(&self) -> &Map<String, Value> {
        &self.values
    }

    /// A string the call gives, by name: for the `image` argument, which no tool declares.
    pub(crate) fn optional_str(&self, name: &str) -> Result<Option<&str>, ArgumentError> {
        match self.value(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(name, "a string", other)),
        }
    }
}

/// What a call names by its number or its name, in typed arguments: a thread as the threads tool
/// lists it, a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Designator {
    /// Given as a number.
    Number(u64),
    /// Given as a string.
    Name(String),
}

impl Designator {
    /// A thread's, as the text the helper's FIND-THREAD reads.
    pub(crate) fn into_text(self) -> String {
        match self {
            Designator::Number(n) => n.to_string(),
            Designator::Name(name) => name,
        }
    }

    /// Borrowed.
    pub(crate) fn as_number_or_name(&self) -> NumberOrName<'_> {
        match self {
            Designator::Number(n) => NumberOrName::Number(*n),
            Designator::Name(name) => NumberOrName::Name(name),
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

/// The refusal of an `image` argument that names none of `images`.
pub(crate) fn unknown_image(name: &str, images: &[&str]) -> ArgumentError {
    ArgumentError(format!("Unknown image {name:?}; the configured images are: {}.", images.join(", ")))
}

fn check_image(value: &Value, images: &[&str]) -> Result<(), ArgumentError> {
    match value {
        Value::Null => Ok(()),
        Value::String(name) if images.contains(&name.as_str()) => Ok(()),
        Value::String(name) => Err(unknown_image(name, images)),
        other => Err(wrong_type("image", "a string", other)),
    }
}

/// The refusal of an argument `tool` does not take: the nearest one it does, and all of them, as
/// its schema lists them (`image` only when there are images to choose from).
fn unknown(tool: &str, name: &str, params: &[Param], image_listed: bool) -> ArgumentError {
    let mut names: Vec<&str> = params.iter().map(|p| p.name).collect();
    if image_listed {
        names.push("image");
    }
    let guess = nearest(name, &names).map(|near| format!(": did you mean `{near}`?")).unwrap_or_else(|| ".".into());
    let takes = match names.as_slice() {
        [] => format!("{tool} takes no arguments"),
        names => format!("{tool} takes {}", names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")),
    };
    ArgumentError(format!("Unknown argument `{name}`{guess} {takes}; the call was not run."))
}

/// The name in `names` that `name` most likely misspells: the same but for case, `_` and `-`, or
/// a prefix of it, or within a few edits.
fn nearest<'a>(name: &str, names: &[&'a str]) -> Option<&'a str> {
    let plain =
        |text: &str| text.chars().filter(|c| !matches!(c, '_' | '-')).flat_map(char::to_lowercase).collect::<String>();
    let wanted = plain(name);
    let distance = |candidate: &str| {
        let candidate = plain(candidate);
        if candidate == wanted {
            0
        } else if !wanted.is_empty() && (candidate.starts_with(&wanted) || wanted.starts_with(&candidate)) {
            1
        } else {
            crate::source::edit_distance(&wanted, &candidate).unwrap_or(usize::MAX)
        }
    };
    let (best, score) = names.iter().map(|n| (*n, distance(n))).min_by_key(|(_, score)| *score)?;
    (score <= (wanted.chars().count() / 3).max(2)).then_some(best)
}

fn missing_argument(name: &str, expected: &str) -> ArgumentError {
    ArgumentError(format!("Missing required argument `{name}` ({expected})."))
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

    choices! {
        /// A sample choice.
        enum Mode {
            Cpu = "cpu",
            Time = "time",
        }
    }

    arguments! {
        /// A sample tool's arguments.
        #[derive(Debug)]
        struct Sample {
            code: String,
            dry_run: bool,
            n: Option<u64> => at_most(10),
            timeout_ms: Option<u64> => at_least(1).at_most(100),
            entries: Option<Vec<u64>> => at_least(1).explained(|_| "Entries count from 1.".into()),
            mode: Option<Mode>,
            restart: Option<Designator> => at_most(9),
            functions: Vec<String> = "Some functions.",
        }
    }

    const PARAMS: &[Param] = Sample::PARAMS;

    fn read(value: Value) -> Result<Arguments, String> {
        Arguments::read("tool", PARAMS, None, Some(value)).map_err(|e| e.0)
    }

    #[test]
    fn wrong_types_name_the_argument_and_the_value() {
        assert_eq!(read(json!({"code": 5})).unwrap_err(), "Argument `code` must be a string, got number 5.");
        assert!(read(json!({"code": "x", "dry_run": "yes"})).unwrap_err().contains("true or false"));
        assert!(read(json!({"code": "x", "n": -1})).unwrap_err().contains("from 0 to 10"));
        assert_eq!(read(json!({})).unwrap_err(), "Missing required argument `code` (a string).");
        assert!(read(json!({"code": "x", "restart": true})).unwrap_err().contains("from 0 to 9 or a name"));
        assert!(read(json!({"code": "x", "functions": [1]})).unwrap_err().contains("an array of strings"));
    }

    #[test]
    fn declared_bounds_and_choices_are_enforced() {
        assert!(read(json!({"code": "x", "timeout_ms": 0})).unwrap_err().contains("from 1 to 100, got number 0"));
        assert!(read(json!({"code": "x", "timeout_ms": 101})).is_err());
        assert_eq!(read(json!({"code": "x", "entries": [2, 0]})).unwrap_err(), "Entries count from 1.");
        assert!(read(json!({"code": "x", "entries": "3"})).unwrap_err().contains("a list of integers of 1 or more"));
        assert_eq!(
            read(json!({"code": "x", "mode": "fast"})).unwrap_err(),
            "Unknown mode \"fast\": use one of cpu, time."
        );
        assert!(read(json!({"code": "x", "restart": 10})).is_err());
        assert!(read(json!({"code": "x", "n": 5.5})).is_err());
    }

    #[test]
    fn an_unknown_argument_is_refused_naming_the_nearest() {
        let error = read(json!({"code": "x", "dryrun": true})).unwrap_err();
        assert!(error.starts_with("Unknown argument `dryrun`: did you mean `dry_run`? tool takes `code`, "), "{error}");
        assert!(read(json!({"code": "x", "timeout": 5})).unwrap_err().contains("did you mean `timeout_ms`?"));
        assert!(read(json!({"code": "x", "dryRun": true})).unwrap_err().contains("did you mean `dry_run`?"));
        let error = read(json!({"code": "x", "zzzzzz": 1})).unwrap_err();
        assert!(error.starts_with("Unknown argument `zzzzzz`. tool takes"), "{error}");
        // Even as null.
        assert!(read(json!({"code": "x", "dryrun": null})).is_err());
        let error = Arguments::read("status", &[], None, Some(json!({"verbose": true}))).unwrap_err().0;
        assert_eq!(error, "Unknown argument `verbose`. status takes no arguments; the call was not run.");
    }

    #[test]
    fn the_image_argument_names_a_configured_image() {
        let read = |value| Arguments::read("tool", PARAMS, Some(&["one", "two"]), Some(value)).map_err(|e| e.0);
        assert!(read(json!({"code": "x", "image": "two"})).is_ok());
        assert_eq!(
            read(json!({"code": "x", "image": "three"})).unwrap_err(),
            "Unknown image \"three\"; the configured images are: one, two."
        );
        assert!(Arguments::read("tool", PARAMS, None, Some(json!({"code": "x", "image": "one"}))).is_err());
    }

    #[test]
    fn the_schema_says_what_the_checks_take() {
        let schema = input_schema(PARAMS, &["only"]);
        assert_eq!(schema["required"], json!(["code"]));
        assert!(schema.get("additionalProperties").is_none());
        // Bounds are checked, not listed; a string is an argument of no type.
        assert_eq!(schema["properties"]["timeout_ms"], json!({"type": "integer"}));
        assert_eq!(schema["properties"]["code"], json!({}));
        assert_eq!(schema["properties"]["dry_run"], json!({"type": "boolean"}));
        assert_eq!(schema["properties"]["mode"], json!({"enum": ["cpu", "time"]}));
        assert_eq!(schema["properties"]["entries"]["items"], json!({"type": "integer"}));
        assert_eq!(schema["properties"]["restart"], json!({"type": ["integer", "string"]}));
        assert!(schema["properties"].get("image").is_none());
        let several = input_schema(PARAMS, &["one", "two"]);
        assert_eq!(several["properties"]["image"], json!({"enum": ["one", "two"]}));
    }

    #[test]
    fn non_object_arguments_are_rejected() {
        assert!(Arguments::read("tool", &[], None, Some(json!([1]))).is_err());
        assert!(Arguments::read("tool", &[], None, None).is_ok());
    }

    #[test]
    fn checked_arguments_read_as_the_declared_type() {
        let args =
            read(json!({"code": "x", "n": 5.0, "restart": "USE-VALUE", "entries": [3, 1.0], "mode": "time"})).unwrap();
        let typed: Sample = args.typed().unwrap();
        assert_eq!((typed.code.as_str(), typed.dry_run, typed.n, typed.timeout_ms), ("x", false, Some(5), None));
        assert_eq!(typed.restart.as_ref().map(Designator::as_number_or_name), Some(NumberOrName::Name("USE-VALUE")));
        assert_eq!((typed.entries, typed.mode, typed.functions), (Some(vec![3, 1]), Some(Mode::Time), vec![]));
        let typed: Sample =
            read(json!({"code": "y", "dry_run": true, "restart": 4, "functions": ["f"]})).unwrap().typed().unwrap();
        assert_eq!(
            (typed.dry_run, typed.restart, typed.functions),
            (true, Some(Designator::Number(4)), vec!["f".into()])
        );
        assert_eq!(Mode::NAMES, ["cpu", "time"]);
        assert_eq!(Mode::Time.name(), "time");
    }

    #[test]
    fn the_declaration_gives_each_field_its_kind_and_whether_it_is_required() {
        let names: Vec<&str> = PARAMS.iter().map(Param::name).collect();
        assert_eq!(names, ["code", "dry_run", "n", "timeout_ms", "entries", "mode", "restart", "functions"]);
        let required: Vec<&str> = PARAMS.iter().filter(|p| p.required).map(Param::name).collect();
        assert_eq!(required, ["code"]);
        assert!(!PARAMS.iter().any(Param::is_code));
        assert!(Param::of::<String>("form").code().is_code());
        assert!(!Param::of::<String>("name").is_code());
        assert_eq!(input_schema(PARAMS, &[])["properties"]["functions"]["description"], "Some functions.");
    }

    #[test]
    fn reading_what_the_check_did_not_pass_is_an_error_not_a_panic() {
        let error = Arguments::accept(Some(json!({"code": 5}))).typed::<Sample>().unwrap_err().0;
        assert!(error.contains("argument `code`") && error.contains("a bug"), "{error}");
    }
}
