//! Swank (SLIME) and Slynk (SLY) speak the same protocol under different package names. The
//! rest of the code asks [`Dialect`] for the names and never checks which server it talks to.
//!
//! See docs/design.md, "The swank client".

use std::str::FromStr;

use super::sexp::{Form, Sexp};

/// Which server a connection talks to, as detected (or forced with `--protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SLIME's server.
    Swank,
    /// SLY's server.
    Slynk,
}

impl Dialect {
    /// The package that holds the server's RPC functions.
    pub fn package(self) -> &'static str {
        match self {
            Dialect::Swank => "swank",
            Dialect::Slynk => "slynk",
        }
    }

    /// The RPC that leaves the innermost level of the server's debugger for the one below it.
    pub fn debugger_abort_function(self) -> &'static str {
        match self {
            Dialect::Swank => "sldb-abort",
            Dialect::Slynk => "sly-db-abort",
        }
    }

    /// The server's name for people: `swank` or `slynk`.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Swank => "swank",
            Dialect::Slynk => "slynk",
        }
    }

    /// Asks for `connection-info` and for the name of the package its function lives in. Both
    /// servers can answer: Slynk's reader rewrites `swank:` to `slynk:` for exactly this kind of
    /// bootstrap, and the package name then tells which server evaluated it, even in an image
    /// that has loaded both. The third element tells the server that this client has seen every
    /// package ([`Dialect::seen_every_package`]) and is always nil.
    pub(crate) fn identification_request() -> Form {
        Form::call(
            "cl",
            "list",
            [
                Form::call("swank", "connection-info", []),
                Form::call("cl", "package-name", [server_package()]),
                Form::call("cl", "progn", [Dialect::seen_every_package(), Form::Nil]),
            ],
        )
    }

    /// Sets this connection's list of the packages its client has seen to every package. After
    /// each request, the server compares that list with the image's packages and, when they
    /// differ, scans every symbol to tell Emacs how to indent macros (some 15 ms of a fresh image's
    /// CPU and a 44 KB message, more in a big image), starting with the first request; a client
    /// that indents nothing spares the image that, in its first request and in any that makes a
    /// package. Written with no macro, so that the server evaluates it without compiling, and
    /// with the connection's accessor found by name in the server's package (`connection.` in
    /// swank, `connection-` in slynk): a server without them gets `list` called instead.
    pub(crate) fn seen_every_package() -> Form {
        let named = |name: &str| Form::call("cl", "find-symbol", [Form::string(name), server_package()]);
        let setter = |accessor: &str| Form::call("cl", "list", [quote(Form::Symbol("cl", "setf")), named(accessor)]);
        let either = |accessor: &str, otherwise: Form| {
            Form::call(
                "cl",
                "if",
                [
                    Form::call("cl", "fboundp", [setter(accessor)]),
                    Form::call("cl", "fdefinition", [setter(accessor)]),
                    otherwise,
                ],
            )
        };
        let connection = named("*EMACS-CONNECTION*");
        Form::call(
            "cl",
            "if",
            [
                connection.clone(),
                Form::call(
                    "cl",
                    "funcall",
                    [
                        either(
                            "CONNECTION.INDENTATION-CACHE-PACKAGES",
                            either("CONNECTION-INDENTATION-CACHE-PACKAGES", quote(Form::Symbol("cl", "list"))),
                        ),
                        Form::call("cl", "list-all-packages", []),
                        Form::call("cl", "symbol-value", [connection]),
                    ],
                ),
                Form::Nil,
            ],
        )
    }
}

/// The package of the server that reads the request: `swank:` is read as `slynk:` by Slynk.
fn server_package() -> Form {
    Form::call("cl", "symbol-package", [quote(Form::Symbol("swank", "connection-info"))])
}

fn quote(form: Form) -> Form {
    Form::call("cl", "quote", [form])
}

/// What the user asked for with `--protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Detect the server from its answer to the first request.
    #[default]
    Auto,
    /// Talk to the server as Swank, whatever it looks like.
    Swank,
    /// Talk to the server as Slynk, whatever it looks like.
    Slynk,
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Protocol::Auto),
            "swank" | "slime" => Ok(Protocol::Swank),
            "slynk" | "sly" => Ok(Protocol::Slynk),
            _ => Err(format!("unknown protocol {s:?}: expected swank, slynk or auto")),
        }
    }
}

/// The facts `connection-info` gives about the server and its image.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerInfo {
    /// The dialect spoken: the detected one unless `--protocol` forces another.
    pub dialect: Dialect,
    /// The server's protocol version (`"2.27"` for Debian's SLIME).
    pub version: Option<String>,
    /// The image's process id, when the server reports one.
    pub pid: Option<i64>,
    /// The implementation's type, e.g. `"SBCL"`.
    pub lisp_type: Option<String>,
    /// The implementation's version as it prints it.
    pub lisp_version: Option<String>,
    /// `:spawn` means a thread per request, which concurrent tool calls rely on.
    pub style: Option<String>,
    pub(crate) features: Vec<String>,
}

impl ServerInfo {
    pub(crate) fn from_identification(reply: &Sexp, protocol: Protocol) -> Result<Self, String> {
        let parts = reply.as_list().ok_or_else(|| format!("unexpected connection-info reply {reply}"))?;
        let [info, package, _seen_every_package] = parts else {
            return Err(format!("unexpected connection-info reply {reply}"));
        };
        let detected = match package.as_str() {
            Some(name) if name.eq_ignore_ascii_case("SLYNK") => Dialect::Slynk,
            _ => Dialect::Swank,
        };
        let dialect = match protocol {
            Protocol::Auto => detected,
            Protocol::Swank => Dialect::Swank,
            Protocol::Slynk => Dialect::Slynk,
        };
        if dialect != detected {
            tracing::warn!(?detected, forced = ?dialect, "--protocol overrides the detected server dialect");
        }
        let implementation = info.plist_get("lisp-implementation");
        let style = match info.plist_get("style") {
            Some(Sexp::Keyword(k)) => Some(k.to_ascii_lowercase()),
            _ => None,
        };
        Ok(ServerInfo {
            dialect,
            version: info.plist_str("version").map(str::to_string),
            pid: info.plist_get("pid").and_then(Sexp::as_i64),
            lisp_type: implementation.and_then(|i| i.plist_str("type")).map(str::to_string),
            lisp_version: implementation.and_then(|i| i.plist_str("version")).map(str::to_string),
            style,
            features: info
                .plist_get("features")
                .and_then(Sexp::as_list)
                .unwrap_or_default()
                .iter()
                .filter_map(|f| match f {
                    Sexp::Keyword(k) => Some(k.to_ascii_lowercase()),
                    _ => None,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::reader::read;

    /// Every operator in the first request is a function or one of the special operators SBCL
    /// evaluates without compiling: a macro there would make the handshake wait for the world
    /// lock, which the user's compilation may hold for seconds.
    #[test]
    fn identification_request_is_plain_enough_for_slynk_and_compiles_nothing() {
        const PLAIN: [&str; 13] = [
            "cl:list",
            "swank:connection-info",
            "cl:package-name",
            "cl:symbol-package",
            "cl:quote",
            "cl:progn",
            "cl:if",
            "cl:funcall",
            "cl:fboundp",
            "cl:fdefinition",
            "cl:find-symbol",
            "cl:list-all-packages",
            "cl:symbol-value",
        ];
        fn operators(form: &Form, found: &mut Vec<String>) {
            if let Form::List(items) = form {
                if let Some(Form::Symbol(package, name)) = items.first() {
                    found.push(format!("{package}:{name}"));
                    if *name == "quote" {
                        return;
                    }
                }
                items.iter().for_each(|item| operators(item, found));
            }
        }
        let request = Dialect::identification_request();
        let mut found = Vec::new();
        operators(&request, &mut found);
        assert!(found.iter().all(|operator| PLAIN.contains(&operator.as_str())), "{found:?}");
        assert!(request.to_wire().starts_with(
            "(cl:list (swank:connection-info) (cl:package-name (cl:symbol-package (cl:quote swank:connection-info))) (cl:progn"
        ));
    }

    #[test]
    fn dialect_comes_from_the_package_that_answered() {
        let reply = read("((:pid 42 :style :spawn :lisp-implementation (:type \"SBCL\" :version \"2.2.9\") :features (:swank :sbcl) :version \"1.0.43\") \"SLYNK\" nil)").unwrap();
        let info = ServerInfo::from_identification(&reply, Protocol::Auto).unwrap();
        assert_eq!(info.dialect, Dialect::Slynk);
        assert_eq!(info.pid, Some(42));
        assert_eq!(info.lisp_type.as_deref(), Some("SBCL"));
        assert_eq!(info.style.as_deref(), Some("spawn"));
        assert_eq!(info.features, vec!["swank", "sbcl"]);
        let forced = ServerInfo::from_identification(&reply, Protocol::Swank).unwrap();
        assert_eq!(forced.dialect, Dialect::Swank);
    }
}
