//! A tool's arguments, declared once: each tool lists its [`Param`]s, and that one list gives both
//! the `inputSchema` that `tools/list` shows and the checks a call's `arguments` pass before the
//! tool runs (docs/design.md, "The toolbox"). So the schema and the checks cannot disagree: an
//! argument the list does not name is refused, naming the nearest one it does; a declared
//! minimum, maximum or set of values is enforced where it is declared.
//!
//! Every refusal is an [`ArgumentError`] whose text tells the model exactly which argument was
//! wrong and what was expected, so a bad call can be corrected on the next try instead of
//! surfacing as a protocol error.

use serde::de::DeserializeOwned;
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
    default: Option<Shown>,
    /// The refusal of a value of the right type that the argument does not take, when the tool
    /// explains it better than "must be from ... to ...".
    explain: Option<fn(&Value) -> String>,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Text,
    /// Lisp code the image reads and may run: what no read-only tool takes.
    Code,
    OneOf(&'static [&'static str]),
    Flag,
    Integer(Range),
    Integers(Range),
    Texts,
    IntegerOrName(Range),
    /// A list of objects, each the arguments of its own that these declare.
    Objects(&'static [Param]),
}

/// The integers an argument takes; `max` when it declares one.
#[derive(Debug, Clone, Copy)]
struct Range {
    min: u64,
    max: Option<u64>,
    /// Whether the schema states the bounds: a sanity bound (a day for a time limit, counting from
    /// 1) is only checked.
    listed: bool,
}

impl Range {
    fn holds(self, n: u64) -> bool {
        n >= self.min && n <= self.max.unwrap_or(LARGEST)
    }

    fn describe(self) -> String {
        match (self.min, self.max) {
            (min, Some(max)) => format!("an integer from {min} to {max}"),
            (min, None) => format!("an integer of {min} or more"),
        }
    }

    /// A minimum of 0 goes unsaid: no count, offset or number a tool takes is negative, and the
    /// list that says it is read in every session.
    fn schema(self, schema: &mut Map<String, Value>) {
        if !self.listed {
            return;
        }
        if self.min > 0 {
            schema.insert("minimum".into(), self.min.into());
        }
        if let Some(max) = self.max {
            schema.insert("maximum".into(), max.into());
        }
    }
}

/// The default value the schema shows.
#[derive(Debug, Clone, Copy)]
enum Shown {
    Integer(u64),
    Text(&'static str),
}

impl Param {
    const fn new(name: &'static str, kind: Kind, description: &'static str) -> Self {
        Param { name, kind, required: false, description, default: None, explain: None }
    }

    /// A string.
    pub const fn text(name: &'static str, description: &'static str) -> Self {
        Self::new(name, Kind::Text, description)
    }

    /// Lisp code, a string the image reads and may run. A tool that takes one is never read-only
    /// ([`Param::is_code`]): SBCL's compiler and macroexpander run code of the request itself
    /// (constant folding calls the functions a form names), so only a tool that takes no code can
    /// promise to run none.
    pub const fn code(name: &'static str, description: &'static str) -> Self {
        Self::new(name, Kind::Code, description)
    }

    /// Whether it is Lisp code (or holds some, in each of a list of objects).
    pub fn is_code(&self) -> bool {
        match self.kind {
            Kind::Code => true,
            Kind::Objects(params) => params.iter().any(Param::is_code),
            _ => false,
        }
    }

    /// One of `choices`.
    pub const fn one_of(name: &'static str, choices: &'static [&'static str], description: &'static str) -> Self {
        Self::new(name, Kind::OneOf(choices), description)
    }

    /// True or false; false when absent.
    pub const fn flag(name: &'static str, description: &'static str) -> Self {
        Self::new(name, Kind::Flag, description)
    }

    /// An integer from `min`.
    pub const fn integer(name: &'static str, min: u64, description: &'static str) -> Self {
        Self::new(name, Kind::Integer(Range { min, max: None, listed: true }), description)
    }

    /// A list of integers from `min`.
    pub const fn integers(name: &'static str, min: u64, description: &'static str) -> Self {
        Self::new(name, Kind::Integers(Range { min, max: None, listed: true }), description)
    }

    /// A list of strings.
    pub const fn texts(name: &'static str, description: &'static str) -> Self {
        Self::new(name, Kind::Texts, description)
    }

    /// A list of objects, each checked as the arguments `params` declare (the edits of one call).
    pub const fn objects(name: &'static str, params: &'static [Param], description: &'static str) -> Self {
        Self::new(name, Kind::Objects(params), description)
    }

    /// An integer from 0, or a name.
    pub const fn integer_or_name(name: &'static str, description: &'static str) -> Self {
        Self::new(name, Kind::IntegerOrName(Range { min: 0, max: None, listed: true }), description)
    }

    /// The call must give it.
    pub const fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// An integer argument takes at most `max`.
    pub const fn at_most(mut self, max: u64) -> Self {
        self.kind = match self.kind {
            Kind::Integer(range) => Kind::Integer(Range { max: Some(max), ..range }),
            Kind::Integers(range) => Kind::Integers(Range { max: Some(max), ..range }),
            Kind::IntegerOrName(range) => Kind::IntegerOrName(Range { max: Some(max), ..range }),
            other => other,
        };
        self
    }

    /// The schema leaves an integer argument's bounds unsaid: they are sanity bounds no agent needs
    /// to choose a value (a day for a time limit, counting from 1), and the list is read in every
    /// session. A call past them is refused with the bounds named.
    pub const fn bounds_unlisted(mut self) -> Self {
        self.kind = match self.kind {
            Kind::Integer(range) => Kind::Integer(Range { listed: false, ..range }),
            Kind::Integers(range) => Kind::Integers(Range { listed: false, ..range }),
            Kind::IntegerOrName(range) => Kind::IntegerOrName(Range { listed: false, ..range }),
            other => other,
        };
        self
    }

    /// The schema shows this integer as the default.
    pub const fn default_integer(mut self, default: u64) -> Self {
        self.default = Some(Shown::Integer(default));
        self
    }

    /// The schema shows this string as the default.
    pub const fn default_text(mut self, default: &'static str) -> Self {
        self.default = Some(Shown::Text(default));
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
        let (kind, range) = match self.kind {
            Kind::Text | Kind::Code => ("string", None),
            Kind::OneOf(choices) => {
                schema.insert("enum".into(), json!(choices));
                ("string", None)
            }
            // False when absent, as any client takes a boolean it does not give: the list, read in
            // every session, does not say so sixteen times.
            Kind::Flag => ("boolean", None),
            Kind::Integer(range) => ("integer", Some(range)),
            Kind::Integers(range) => {
                let mut items = Map::new();
                items.insert("type".into(), "integer".into());
                range.schema(&mut items);
                schema.insert("items".into(), items.into());
                ("array", None)
            }
            Kind::Texts => {
                schema.insert("items".into(), json!({"type": "string"}));
                ("array", None)
            }
            Kind::IntegerOrName(range) => {
                schema.insert("type".into(), json!(["integer", "string"]));
                range.schema(&mut schema);
                ("", None)
            }
            // Each element's arguments are the tool's own, which its description names; the schema
            // says which of them an element must give.
            Kind::Objects(params) => {
                let required: Vec<&str> = params.iter().filter(|p| p.required).map(|p| p.name).collect();
                let mut items = json!({"type": "object"});
                if !required.is_empty() {
                    items["required"] = json!(required);
                }
                schema.insert("items".into(), items);
                ("array", None)
            }
        };
        if !kind.is_empty() {
            schema.insert("type".into(), kind.into());
        }
        if let Some(range) = range {
            range.schema(&mut schema);
        }
        match self.default {
            Some(Shown::Integer(n)) => schema.insert("default".into(), n.into()),
            Some(Shown::Text(text)) => schema.insert("default".into(), text.into()),
            None => None,
        };
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
        properties.insert("image".into(), json!({"type": "string", "enum": images}));
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

/// A tool's arguments as a Rust type (`#[derive(Deserialize)] #[serde(deny_unknown_fields)]`,
/// an `Option` or `#[serde(default)]` field for each argument a call may leave out), which the
/// tool reads its checked [`Arguments`] as ([`Arguments::typed`]). The type is the tool's second
/// word on its arguments, beside its [`Param`]s: [`Typed::fits`] holds the two together, and a
/// test holds every tool to it.
#[derive(Clone, Copy)]
pub struct Typed {
    read: fn(&Arguments) -> Result<(), ArgumentError>,
    fields: fn() -> Option<&'static [&'static str]>,
}

impl Typed {
    /// The tool reads its arguments as `A`.
    pub const fn of<A: DeserializeOwned>() -> Self {
        Typed { read: read_as::<A>, fields: field_names::<A> }
    }

    /// Whether the type takes what `params` declare, and only that: each of its fields is a
    /// declared argument, and a call giving only the required arguments, and calls giving every
    /// argument (each choice of a `one_of`, each bound of an integer, a number and a name), read
    /// as it. The error says what disagrees.
    pub fn fits(&self, params: &'static [Param]) -> Result<(), String> {
        let fields = (self.fields)().ok_or("the type is not a struct with named fields")?;
        if let Some(field) = fields.iter().find(|field| !params.iter().any(|param| param.name == **field)) {
            return Err(format!("field `{field}` is no declared argument"));
        }
        for sample in samples(params) {
            let arguments = Arguments::read("the sample", params, None, Some(sample.clone()))
                .map_err(|e| format!("the sample {sample} fails the declaration's check: {e}"))?;
            (self.read)(&arguments).map_err(|e| format!("the sample {sample} does not read as the type: {e}"))?;
        }
        Ok(())
    }
}

fn read_as<A: DeserializeOwned>(arguments: &Arguments) -> Result<(), ArgumentError> {
    arguments.typed::<A>().map(drop)
}

/// The names of the fields of the struct `A`, as serde reads them; `None` for another type.
fn field_names<A: DeserializeOwned>() -> Option<&'static [&'static str]> {
    use serde::de::{Error, Visitor};
    use serde::Deserializer;

    /// A deserializer that keeps the fields a struct asks for, and gives nothing.
    struct FieldNames(Option<&'static [&'static str]>);

    impl<'de> Deserializer<'de> for &mut FieldNames {
        type Error = serde::de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Error::custom("only a struct's field names are read"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = Some(fields);
            Err(Error::custom("only a struct's field names are read"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    let mut names = FieldNames(None);
    let _ = A::deserialize(&mut names);
    names.0
}

/// Calls `params` take: the required arguments alone, then every argument, as many times as it
/// takes to give each choice of a `one_of`, and each integer at its bounds, as a number and as a
/// name.
fn samples(params: &'static [Param]) -> Vec<Value> {
    let choices = params
        .iter()
        .map(|param| match param.kind {
            Kind::OneOf(choices) => choices.len(),
            _ => 2,
        })
        .max()
        .unwrap_or(2);
    let required = Value::Object(
        params.iter().filter(|param| param.required).map(|param| (param.name.to_string(), sample(param, 0))).collect(),
    );
    std::iter::once(required)
        .chain((0..choices).map(|variant| {
            Value::Object(params.iter().map(|param| (param.name.to_string(), sample(param, variant))).collect())
        }))
        .collect()
}

/// A value `param` takes; `variant` picks among its choices, bounds and shapes.
fn sample(param: &Param, variant: usize) -> Value {
    let bound = |range: Range| if variant % 2 == 0 { range.min } else { range.max.unwrap_or(range.min + 1) };
    match param.kind {
        Kind::Text => json!(["some-name", "other-name"][variant % 2]),
        Kind::Code => json!("(list 1 2)"),
        Kind::OneOf(choices) => json!(choices[variant % choices.len()]),
        Kind::Flag => json!(variant % 2 == 0),
        Kind::Integer(range) => json!(bound(range)),
        Kind::Integers(range) => json!([bound(range)]),
        Kind::Texts => json!(["some-name"]),
        Kind::IntegerOrName(range) if variant % 2 == 0 => json!(range.min),
        Kind::IntegerOrName(_) => json!("some-name"),
        Kind::Objects(params) => {
            json!([Value::Object(params.iter().map(|p| (p.name.to_string(), sample(p, variant))).collect())])
        }
    }
}

/// A value [`Param::check`] passed, as the typed arguments read it: an integral float
/// (`5.0`) as the integer it is, in a list and in a list's objects too.
fn normalized(param: &Param, value: &Value) -> Value {
    match (param.kind, value) {
        (Kind::Integer(_) | Kind::IntegerOrName(_), Value::Number(_)) => {
            integer(value).map_or(value.clone(), Value::from)
        }
        (Kind::Integers(_), Value::Array(items)) => {
            items.iter().map(|item| integer(item).map_or(item.clone(), Value::from)).collect()
        }
        (Kind::Objects(params), Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::Object(members) => Value::Object(normalized_members(params, members)),
                other => other.clone(),
            })
            .collect(),
        _ => value.clone(),
    }
}

/// The members `params` declare, `null` ones left out as absent, each [`normalized`].
fn normalized_members(params: &[Param], members: &Map<String, Value>) -> Map<String, Value> {
    params
        .iter()
        .filter_map(|param| {
            let value = members.get(param.name).filter(|value| !value.is_null())?;
            Some((param.name.to_string(), normalized(param, value)))
        })
        .collect()
}

/// A tool call's `arguments`: a JSON object whose every member the tool declares and whose every
/// value it takes, which the tool reads as its type ([`Arguments::typed`]).
#[derive(Debug, Clone, Default)]
pub struct Arguments {
    values: Map<String, Value>,
    params: &'static [Param],
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
        Ok(Self::accept(params, value))
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
    pub(crate) fn accept(params: &'static [Param], value: Option<Value>) -> Self {
        let values = match value {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        Self { values, params }
    }

    /// Arguments that only name the image to work in, for a request the server makes on its own.
    pub(crate) fn for_image(image: &str) -> Self {
        Self { values: Map::from_iter([("image".to_string(), Value::from(image))]), params: &[] }
    }

    /// The arguments as the tool's type `A` ([`Typed`]): the declared ones, without `image`
    /// (which the image layer reads) and without those given as `null`. A failure is a bug of the
    /// tool's, whose type disagrees with its declaration.
    pub(crate) fn typed<A: DeserializeOwned>(&self) -> Result<A, ArgumentError> {
        serde_json::from_value(Value::Object(normalized_members(self.params, &self.values))).map_err(|e| {
            ArgumentError(format!(
                "swank-mcp failed: the tool reads its arguments otherwise than it declares them ({e}); a bug."
            ))
        })
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
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

    const PARAMS: &[Param] = &[
        Param::text("code", "").required(),
        Param::flag("dry_run", ""),
        Param::integer("n", 0, "").at_most(10),
        Param::integer("timeout_ms", 1, "").at_most(100),
        Param::integers("entries", 1, "").explained(|_| "Entries count from 1.".into()),
        Param::one_of("mode", &["cpu", "time"], "").default_text("cpu"),
        Param::integer_or_name("restart", "").at_most(9),
        Param::texts("functions", ""),
    ];

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
        let args = read(json!({"code": "x", "n": 5.0, "restart": "USE-VALUE", "entries": [3, 1.0]})).unwrap();
        let typed: Sample = args.typed().unwrap();
        assert_eq!(typed.n, Some(5));
        assert_eq!(typed.restart.as_ref().map(Designator::as_number_or_name), Some(NumberOrName::Name("USE-VALUE")));
        assert_eq!(typed.entries, Some(vec![3, 1]));
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
        assert_eq!(schema["properties"]["timeout_ms"], json!({"type": "integer", "minimum": 1, "maximum": 100}));
        assert_eq!(schema["properties"]["dry_run"], json!({"type": "boolean"}));
        assert_eq!(schema["properties"]["mode"], json!({"type": "string", "enum": ["cpu", "time"], "default": "cpu"}));
        assert_eq!(schema["properties"]["entries"]["items"], json!({"type": "integer", "minimum": 1}));
        assert!(schema["properties"].get("image").is_none());
        let several = input_schema(PARAMS, &["one", "two"]);
        assert_eq!(several["properties"]["image"], json!({"type": "string", "enum": ["one", "two"]}));
    }

    #[test]
    fn non_object_arguments_are_rejected() {
        assert!(Arguments::read("tool", &[], None, Some(json!([1]))).is_err());
        assert!(Arguments::read("tool", &[], None, None).is_ok());
    }

    /// `PARAMS` as a tool's type.
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Sample {
        code: String,
        #[serde(default)]
        dry_run: bool,
        n: Option<u64>,
        timeout_ms: Option<u64>,
        entries: Option<Vec<u64>>,
        mode: Option<Mode>,
        restart: Option<Designator>,
        #[serde(default)]
        functions: Vec<String>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        Cpu,
        Time,
    }

    #[test]
    fn a_type_fits_the_declaration_that_takes_what_it_takes() {
        assert_eq!(Typed::of::<Sample>().fits(PARAMS), Ok(()));
        assert_eq!(field_names::<Sample>().map(<[_]>::len), Some(8));
    }

    #[test]
    fn a_type_that_disagrees_with_its_declaration_is_found_out() {
        /// Reads an argument the declaration lacks.
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Undeclared {
            code: String,
            verbose: Option<bool>,
        }
        let error = Typed::of::<Undeclared>().fits(PARAMS).unwrap_err();
        assert_eq!(error, "field `verbose` is no declared argument");

        /// Lacks declared arguments, which `deny_unknown_fields` refuses.
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Missing {
            code: String,
        }
        let error = Typed::of::<Missing>().fits(PARAMS).unwrap_err();
        assert!(error.contains("does not read as the type") && error.contains("unknown field"), "{error}");

        /// Takes an optional argument as one every call gives.
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Required {
            code: String,
            n: u64,
        }
        let error = Typed::of::<Required>().fits(&PARAMS[..3]).unwrap_err();
        assert!(error.contains("missing field `n`"), "{error}");

        /// Takes fewer choices than the declaration gives.
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct FewerChoices {
            mode: Option<OnlyCpu>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "lowercase")]
        enum OnlyCpu {
            Cpu,
        }
        const MODE: &[Param] = &[Param::one_of("mode", &["cpu", "time"], "")];
        let error = Typed::of::<FewerChoices>().fits(MODE).unwrap_err();
        assert!(error.contains("unknown variant `time`"), "{error}");

        assert_eq!(Typed::of::<u64>().fits(PARAMS).unwrap_err(), "the type is not a struct with named fields");
    }

    #[test]
    fn reading_a_type_the_declaration_does_not_fit_is_an_error_not_a_panic() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Undeclared {
            undeclared: u64,
        }
        let args = read(json!({"code": "x"})).unwrap();
        assert!(args.typed::<Undeclared>().unwrap_err().0.contains("a bug"));
    }
}
