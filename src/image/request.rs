//! A request to a function of the helper (docs/design.md, "Layers"): the function, its arguments
//! in order, then its keyword arguments. Every tool and service builds what it asks of the image
//! with it, and the image layer adds the session and the call's token.

use super::helper::{Gate, Helper, HELPER_PACKAGE};
use super::Entry;
use crate::swank::Form;

/// A call of a function of the helper, `(mcp-agent-helper:FUNCTION ARG... :KEY VALUE...)`.
#[derive(Debug, Clone)]
pub struct Request {
    function: Entry,
    args: Vec<Form>,
}

impl Request {
    /// A call of `function`, with no arguments yet.
    pub fn new(function: Entry) -> Self {
        Self { function, args: Vec::new() }
    }

    /// The next positional argument.
    pub fn arg(mut self, value: impl Into<Form>) -> Self {
        self.args.push(value.into());
        self
    }

    /// Keyword argument `:key value`.
    pub fn key(mut self, key: &'static str, value: impl Into<Form>) -> Self {
        self.args.extend([Form::Keyword(key), value.into()]);
        self
    }

    /// Keyword argument `:key value` when there is a value: a request without it is the same as
    /// one made before the argument existed.
    pub fn key_if(self, key: &'static str, value: Option<impl Into<Form>>) -> Self {
        match value {
            Some(value) => self.key(key, value),
            None => self,
        }
    }

    /// The form that makes the call, for a thread already running in the helper.
    pub(crate) fn form(self) -> Form {
        Form::call(HELPER_PACKAGE, self.function.name(), self.args)
    }

    /// The form that makes the call in a thread waiting in a server's debugger of its own, through
    /// the helper's `ATTACHED`, only in an image that holds this swank-mcp's helper revision: as
    /// `session`'s agent code under `token`, which may end the image only with `allow_exit`,
    /// when the thread still waits in stop number `stop`.
    pub(crate) fn attached_form(self, session: &str, token: &str, allow_exit: bool, stop: u64) -> Form {
        let agent = [Form::string(session), Form::string(token), Form::from(allow_exit), Form::from(stop)];
        Helper::current().attached(self.function, agent.into_iter().chain(self.args))
    }

    /// The form that makes the call through `gate`, only in an image that holds this swank-mcp's
    /// helper revision, which answers `:other-helper` otherwise ([`Helper::call`]).
    pub(crate) fn checked_form(self, gate: Gate) -> Form {
        Helper::current().call(gate, self.function, self.args)
    }
}

#[cfg(test)]
mod tests {
    use super::{Entry, Request};

    #[test]
    fn a_request_prints_its_arguments_then_its_keys() {
        let request = Request::new(Entry::EVALUATE)
            .arg("(+ 1 2)")
            .key("package", None::<&str>)
            .key("max-output", 100_u64)
            .key_if("print-length", None::<u64>)
            .key_if("debug", Some(true));
        assert_eq!(
            request.form().to_wire(),
            "(mcp-agent-helper:evaluate \"(+ 1 2)\" :package nil :max-output 100 :debug t)"
        );
    }
}
