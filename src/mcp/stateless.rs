//! Revision 2026-07-28, served beside the `initialize` handshake's revisions: a request says in its
//! own `_meta` which revision it speaks and what its client can do, and is answered on its own
//! (basic/versioning, "Backward Compatibility with Initialization-Based Versions": a request
//! carrying the per-request `_meta` is served statelessly, one starting with `initialize` gets the
//! handshake's semantics for the process).
//!
//! See docs/design.md, "Layers".

use serde::Deserialize;
use serde_json::{json, Value};

use super::protocol::{server_info, Failure, INVALID_PARAMS, SUPPORTED_VERSIONS};

/// The stateless revision served.
pub const STATELESS_VERSION: &str = "2026-07-28";

/// `UnsupportedProtocolVersionError`: the request's `_meta` names a revision not served.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// How long a client may keep `tools/list` and `server/discover` results (`ttlMs`, server/utilities/
/// caching). Both are fixed for the life of the process (the tools offered depend only on its
/// command line, and `listChanged` is false); an hour bounds what a client that keeps them across a
/// restart with other flags or a newer binary would miss.
pub const CACHE_TTL_MS: u64 = 60 * 60 * 1000;

/// `cacheScope`: the tools, their descriptions and the instructions are the same for every user.
pub const CACHE_SCOPE: &str = "public";

const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// A request's `_meta`: the per-request fields of revision 2026-07-28, and the progress token every
/// revision allows.
#[derive(Deserialize, Default)]
pub struct RequestMeta {
    #[serde(rename = "io.modelcontextprotocol/protocolVersion", default)]
    protocol_version: Option<Value>,
    #[serde(rename = "io.modelcontextprotocol/clientInfo", default)]
    client_info: Option<Value>,
    #[serde(rename = "io.modelcontextprotocol/clientCapabilities", default)]
    client_capabilities: Option<Value>,
    #[serde(rename = "progressToken", default)]
    /// Asks for `notifications/progress` about the request (every revision).
    pub progress_token: Option<Value>,
}

/// The params of a request read only for their `_meta`.
#[derive(Deserialize)]
pub struct MetaParams {
    #[serde(rename = "_meta", default)]
    /// The request's `_meta`, if it has one.
    pub meta: Option<RequestMeta>,
}

/// The client of one request of revision 2026-07-28, as its `_meta` describes it.
pub struct StatelessClient {
    /// `clientInfo.name`, which is optional in this revision.
    pub name: Option<String>,
    /// `clientCapabilities`: what this request's client can do.
    pub capabilities: Value,
}

impl RequestMeta {
    /// Whether the request speaks revision 2026-07-28 or later: it names its revision itself.
    pub fn is_stateless(meta: &Option<RequestMeta>) -> bool {
        meta.as_ref().is_some_and(|meta| meta.protocol_version.is_some())
    }
}

/// The client of a request of revision 2026-07-28 for `method`, once its `_meta` names a revision
/// served and says what the client can do; the error the specification gives it otherwise.
pub fn client_of(meta: Option<RequestMeta>, method: &str) -> Result<StatelessClient, Failure> {
    let missing = |what: &str| {
        Failure::new(
            INVALID_PARAMS,
            format!(
                "{method} needs \"_meta\" with {what} (MCP {STATELESS_VERSION}; clients of earlier revisions send \
                 initialize first)"
            ),
        )
    };
    let meta = meta.ok_or_else(|| missing(&format!("\"{PROTOCOL_VERSION}\" and \"{CLIENT_CAPABILITIES}\"")))?;
    let requested = match meta.protocol_version {
        Some(Value::String(version)) => version,
        Some(_) => return Err(missing(&format!("a string \"{PROTOCOL_VERSION}\""))),
        None => return Err(missing(&format!("\"{PROTOCOL_VERSION}\""))),
    };
    if requested != STATELESS_VERSION {
        // The handshake's revisions are listed too: the client learns it can fall back to
        // `initialize` (basic/versioning, "Protocol Version Negotiation").
        let supported: Vec<&str> = std::iter::once(STATELESS_VERSION).chain(SUPPORTED_VERSIONS).collect();
        return Err(Failure {
            code: UNSUPPORTED_PROTOCOL_VERSION,
            message: format!(
                "Unsupported protocol version {requested:?}: requests that carry their version in _meta are served in \
                 {STATELESS_VERSION}; {} through initialize",
                SUPPORTED_VERSIONS.join(", ")
            ),
            data: Some(json!({ "supported": supported, "requested": requested })),
        });
    }
    let capabilities = match meta.client_capabilities {
        Some(capabilities @ Value::Object(_)) => capabilities,
        _ => return Err(missing(&format!("a \"{CLIENT_CAPABILITIES}\" object"))),
    };
    let name = meta.client_info.as_ref().and_then(|info| info.get("name")).and_then(Value::as_str).map(str::to_string);
    Ok(StatelessClient { name, capabilities })
}

/// The result `_meta` of this revision, which names the server in every result.
pub fn result_meta() -> Value {
    json!({ "io.modelcontextprotocol/serverInfo": server_info() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(value: Value) -> Option<RequestMeta> {
        serde_json::from_value::<MetaParams>(json!({ "_meta": value })).unwrap().meta
    }

    #[test]
    fn a_request_is_stateless_when_it_names_its_revision() {
        assert!(RequestMeta::is_stateless(&meta(json!({PROTOCOL_VERSION: "2026-07-28"}))));
        assert!(RequestMeta::is_stateless(&meta(json!({PROTOCOL_VERSION: "1999-01-01"}))));
        assert!(!RequestMeta::is_stateless(&meta(json!({"progressToken": 1}))));
        assert!(!RequestMeta::is_stateless(&None));
    }

    #[test]
    fn the_version_and_the_capabilities_are_required() {
        let client = client_of(
            meta(json!({PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: {}, "io.modelcontextprotocol/clientInfo": {"name": "c", "version": "1"}})),
            "tools/list",
        )
        .ok()
        .unwrap();
        assert_eq!(client.name.as_deref(), Some("c"));
        let unsupported =
            client_of(meta(json!({PROTOCOL_VERSION: "2025-11-25", CLIENT_CAPABILITIES: {}})), "tools/list")
                .err()
                .unwrap();
        assert_eq!(unsupported.code, UNSUPPORTED_PROTOCOL_VERSION);
        let data = unsupported.data.unwrap();
        assert_eq!(data["requested"], "2025-11-25");
        assert_eq!(data["supported"][0], STATELESS_VERSION);
        assert!(data["supported"].as_array().unwrap().contains(&json!("2025-11-25")));
        for bad in [json!({PROTOCOL_VERSION: "2026-07-28"}), json!({PROTOCOL_VERSION: 7, CLIENT_CAPABILITIES: {}})] {
            assert_eq!(client_of(meta(bad), "tools/call").err().unwrap().code, INVALID_PARAMS);
        }
        assert_eq!(client_of(None, "server/discover").err().unwrap().code, INVALID_PARAMS);
    }
}
