//! JSON-RPC 2.0 messages as this server receives them: one line is read once, into a typed
//! [`Message`] or the [`Invalid`] answer it deserves. The envelope is read without building a
//! `serde_json::Value` of it (that cost more than the rest of a tool call's dispatch); the params
//! stay raw until the method's handler reads them into its own type.
//!
//! See docs/design.md, "Layers".

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// One message received.
#[derive(Debug)]
pub enum Message {
    /// A call that expects a response with the same id.
    Request(Request),
    /// A call that expects no response.
    Notification(Notification),
    /// A well-formed response to a request of ours (see [`super::client_requests`]).
    Response(Reply),
}

/// The client's response to a request this server sent.
#[derive(Debug)]
pub struct Reply {
    /// The id of the request it answers; `None` for an error response with a null id, which
    /// answers a request whose id the client could not read.
    pub id: Option<RequestId>,
    /// The `result`, still raw, or the `error`.
    pub outcome: Result<Box<RawValue>, ReplyError>,
}

/// A JSON-RPC error object in a client's response.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReplyError {
    /// The JSON-RPC error code.
    pub code: i64,
    /// The client's description of the error.
    pub message: String,
}

/// A message with an id: the client waits for a response carrying that id.
#[derive(Debug)]
pub struct Request {
    pub(crate) id: RequestId,
    pub(crate) method: String,
    /// The arguments, still raw: the method's handler reads them into its own type.
    pub params: Params,
}

/// A message without an id: nothing is sent back, whatever happens to it.
#[derive(Debug)]
pub struct Notification {
    pub(crate) method: String,
    /// The arguments, still raw: the method's handler reads them into its own type.
    pub params: Params,
}

/// A request id as JSON-RPC allows it here: a string or an integer, kept as the client wrote it
/// so that the response carries the same id.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestId(pub Value);

impl RequestId {
    fn new(id: Value) -> Option<Self> {
        (id.is_string() || id.is_i64() || id.is_u64()).then_some(RequestId(id))
    }
}

/// A message's `params`: absent, `null` or an object, as every MCP method takes them by name.
#[derive(Debug, Default)]
pub struct Params(Option<Box<RawValue>>);

impl Params {
    /// The params read as `T`; absent params read as an empty object.
    pub fn read<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.as_deref().map_or("{}", RawValue::get))
    }
}

/// Why a line is not a message this server can take, and the error to answer it with.
#[derive(Debug, PartialEq)]
pub enum Invalid {
    /// Not JSON: -32700, with a null id.
    Parse(String),
    /// Not a JSON-RPC message: -32600, with the message's id when it could be read.
    Request {
        /// The id to answer with; `None` answers with a null id.
        id: Option<RequestId>,
        /// What is wrong with it, for the error's message.
        problem: &'static str,
    },
    /// A request whose params are a list: valid JSON-RPC, but every MCP method takes its
    /// parameters by name (-32602).
    PositionalParams {
        /// The id to answer with.
        id: RequestId,
    },
    /// A notification with bad params: JSON-RPC leaves it unanswered.
    Unanswerable,
}

const JSON_RPC_2_ONLY: &str = "Only JSON-RPC 2.0 is supported: every message needs \"jsonrpc\": \"2.0\"";

/// A line as received: one message, or a batch of them (JSON-RPC batches existed in MCP
/// 2025-03-26 only, but an array is answered as JSON-RPC asks, whichever revision is spoken).
pub enum Line {
    /// A line holding one message (or something that is not one).
    Single(Result<Message, Invalid>),
    /// A non-empty JSON array: each element read as a message on its own, in order.
    Batch(Vec<Result<Message, Invalid>>),
}

impl Line {
    /// Reads one line (without its newline). Never fails: a bad line reads as the [`Invalid`]
    /// answer it deserves.
    pub fn parse(bytes: &[u8]) -> Line {
        let starts_with = |byte| bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&byte);
        if !starts_with(b'[') {
            return Line::Single(Message::parse(bytes));
        }
        match serde_json::from_slice::<Vec<&RawValue>>(bytes) {
            Err(e) => Line::Single(Err(Invalid::Parse(format!("Parse error: {e}")))),
            Ok(batch) if batch.is_empty() => Line::Single(Err(Invalid::Request { id: None, problem: "Empty batch" })),
            Ok(batch) => {
                Line::Batch(batch.into_iter().map(|message| Message::parse(message.get().as_bytes())).collect())
            }
        }
    }
}

impl Message {
    /// Reads one message (not a batch).
    pub fn parse(bytes: &[u8]) -> Result<Message, Invalid> {
        let envelope = match serde_json::from_slice::<Envelope>(bytes) {
            Ok(envelope) => envelope,
            // Valid JSON of another shape is an invalid request, anything else a parse error. A
            // line can fail on its shape before the reader reaches its bad syntax (`3 garbage`),
            // so only a line that reads as JSON in full is the former.
            Err(e) if e.is_data() && serde_json::from_slice::<IgnoredAny>(bytes).is_ok() => {
                return Err(Invalid::Request { id: None, problem: "A JSON-RPC message must be an object" })
            }
            Err(e) => return Err(Invalid::Parse(format!("Parse error: {e}"))),
        };
        envelope.into_message()
    }
}

/// The members of a message, each as the last occurrence of its name gave it (as a
/// `serde_json::Value` would keep it), and no others.
#[derive(Default)]
struct Envelope {
    jsonrpc: Option<Value>,
    /// `Some(Value::Null)` for `"id": null`, which is not the same as no id.
    id: Option<Value>,
    method: Option<Value>,
    params: Option<Box<RawValue>>,
    result: Option<Box<RawValue>>,
    error: Option<Value>,
}

impl Envelope {
    fn into_message(self) -> Result<Message, Invalid> {
        if self.method.is_none() && (self.result.is_some() || self.error.is_some()) {
            return self.into_response();
        }
        let id = match self.id {
            None => None,
            Some(id) => Some(
                RequestId::new(id)
                    .ok_or(Invalid::Request { id: None, problem: "The id must be a string or an integer" })?,
            ),
        };
        let invalid = |problem| Invalid::Request { id: id.clone(), problem };
        if self.jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
            return Err(invalid(JSON_RPC_2_ONLY));
        }
        let method = match self.method {
            Some(Value::String(method)) => method,
            Some(_) => return Err(invalid("\"method\" must be a string")),
            None => return Err(invalid("Missing \"method\": requests and notifications need one")),
        };
        let params = match self.params.as_deref().map(|raw| raw.get().as_bytes()[0]) {
            None | Some(b'n') => Params(None),
            Some(b'{') => Params(self.params),
            Some(b'[') => {
                return Err(match id {
                    Some(id) => Invalid::PositionalParams { id },
                    None => Invalid::Unanswerable,
                })
            }
            Some(_) => return Err(invalid("\"params\" must be an object")),
        };
        Ok(match id {
            Some(id) => Message::Request(Request { id, method, params }),
            None => Message::Notification(Notification { method, params }),
        })
    }

    /// Checks a message with a `result` or an `error` and no `method` against JSON-RPC's
    /// response.
    fn into_response(self) -> Result<Message, Invalid> {
        let readable_id = self.id.clone().and_then(RequestId::new);
        let invalid = |problem| Err(Invalid::Request { id: readable_id.clone(), problem });
        if self.jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
            return invalid(JSON_RPC_2_ONLY);
        }
        match (self.result, self.error) {
            (Some(_), Some(_)) => invalid("A response has a \"result\" or an \"error\", not both"),
            (Some(result), None) if readable_id.is_some() => {
                Ok(Message::Response(Reply { id: readable_id, outcome: Ok(result) }))
            }
            // An error answering a message whose id could not be read has a null id.
            (None, Some(error)) if readable_id.is_some() || self.id == Some(Value::Null) => {
                match serde_json::from_value::<ReplyError>(error) {
                    Ok(error) => Ok(Message::Response(Reply { id: readable_id, outcome: Err(error) })),
                    Err(_) => {
                        invalid("An error response's \"error\" needs an integer \"code\" and a string \"message\"")
                    }
                }
            }
            _ => invalid("A response needs the id of the request it answers, a string or an integer"),
        }
    }
}

impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EnvelopeVisitor)
    }
}

struct EnvelopeVisitor;

impl<'de> Visitor<'de> for EnvelopeVisitor {
    type Value = Envelope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Envelope, A::Error> {
        let mut envelope = Envelope::default();
        while let Some(name) = members.next_key::<std::borrow::Cow<'de, str>>()? {
            match name.as_ref() {
                "jsonrpc" => envelope.jsonrpc = Some(members.next_value()?),
                "id" => envelope.id = Some(members.next_value()?),
                "method" => envelope.method = Some(members.next_value()?),
                "params" => envelope.params = Some(members.next_value()?),
                "result" => envelope.result = Some(members.next_value()?),
                "error" => envelope.error = Some(members.next_value()?),
                _ => {
                    members.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(envelope)
    }

    // Any other JSON value is a data error, answered as an invalid request.
    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Envelope, A::Error> {
        Err(de::Error::invalid_type(de::Unexpected::Seq, &self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Message, Invalid> {
        Message::parse(text.as_bytes())
    }

    #[test]
    fn requests_notifications_and_responses_are_told_apart() {
        let Ok(Message::Request(request)) =
            parse(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}"#)
        else {
            panic!("a request")
        };
        assert_eq!((request.id, request.method.as_str()), (RequestId(7.into()), "tools/call"));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Message::Notification(_))
        ));
        let Ok(Message::Response(reply)) = parse(r#"{"jsonrpc":"2.0","id":"a","result":{"action":"accept"}}"#) else {
            panic!("a response")
        };
        assert_eq!(reply.id, Some(RequestId("a".into())));
        assert_eq!(reply.outcome.unwrap().get(), r#"{"action":"accept"}"#);
        let Ok(Message::Response(reply)) = parse(r#"{"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m"}}"#)
        else {
            panic!("a response")
        };
        assert_eq!((reply.id, reply.outcome.unwrap_err()), (None, ReplyError { code: 1, message: "m".into() }));
    }

    #[test]
    fn the_last_of_duplicate_members_counts_and_unknown_ones_are_ignored() {
        let Ok(Message::Request(request)) =
            parse(r#"{"id":1,"method":"ping","method":"tools\/call","jsonrpc":"2.0","extra":[1]}"#)
        else {
            panic!("a request")
        };
        assert_eq!(request.method, "tools/call");
    }

    #[test]
    fn mistakes_get_the_answer_json_rpc_asks_for() {
        assert!(matches!(parse("{not json").err(), Some(Invalid::Parse(_))));
        assert_eq!(
            parse("42").err(),
            Some(Invalid::Request { id: None, problem: "A JSON-RPC message must be an object" })
        );
        assert_eq!(parse("{}").err(), Some(Invalid::Request { id: None, problem: JSON_RPC_2_ONLY }));
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":3}"#).err(),
            Some(Invalid::Request {
                id: Some(RequestId(3.into())),
                problem: "Missing \"method\": requests and notifications need one"
            })
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":{"an":"object"},"method":"ping"}"#).err(),
            Some(Invalid::Request { id: None, problem: "The id must be a string or an integer" })
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":4,"method":"ping","params":[1]}"#).err(),
            Some(Invalid::PositionalParams { id: RequestId(4.into()) })
        );
        assert_eq!(parse(r#"{"jsonrpc":"2.0","method":"ping","params":[1]}"#).err(), Some(Invalid::Unanswerable));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":5,"result":1,"error":{}}"#).err(),
            Some(Invalid::Request { id: Some(_), .. })
        ));
    }

    #[test]
    fn params_are_read_by_the_method_into_its_own_type() {
        #[derive(Deserialize)]
        struct Call {
            name: String,
        }
        let Ok(Message::Request(request)) =
            parse(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e"}}"#)
        else {
            panic!("a request")
        };
        assert_eq!(request.params.read::<Call>().unwrap().name, "e");
        let Ok(Message::Request(request)) = parse(r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":null}"#) else {
            panic!("a request")
        };
        assert!(request.params.read::<serde_json::Map<String, Value>>().unwrap().is_empty());
    }

    #[test]
    fn batches_are_read_element_by_element() {
        let Line::Batch(batch) = Line::parse(br#" [{"jsonrpc":"2.0","id":1,"method":"ping"}, 5]"#) else {
            panic!("a batch")
        };
        assert!(matches!(batch[0], Ok(Message::Request(_))));
        assert!(matches!(batch[1], Err(Invalid::Request { id: None, .. })));
        assert!(matches!(Line::parse(b"[]"), Line::Single(Err(Invalid::Request { problem: "Empty batch", .. }))));
    }
}
