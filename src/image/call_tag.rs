//! Which agent's tool call a helper evaluation belongs to. The MCP server runs each call inside
//! [`for_call`], and the tokens the image registers its evaluations under then begin with the
//! call's id in the activity record and its tool (`CALL-ID/TOOL/N`): the image can name the
//! thread after the call, and the user can cancel the call from Emacs (`M-x
//! swank-mcp-cancel-call`, `lisp/activity.lisp`), which interrupts every evaluation of it.
//!
//! See docs/design.md, "The image".

use std::future::Future;

tokio::task_local! {
    static CALL_TAG: String;
}

/// Runs `work` as the call `id` (its id in the activity record) of `tool`.
pub async fn for_call<F: Future>(id: &str, tool: &str, work: F) -> F::Output {
    CALL_TAG.scope(format!("{id}/{tool}"), work).await
}

/// The token of the `number`th evaluation of `session`: tagged with the call it runs for, if any.
pub fn token(session: &str, number: u64) -> String {
    CALL_TAG.try_with(|tag| format!("{tag}/{number}")).unwrap_or_else(|_| format!("{session}-{number}"))
}

#[cfg(test)]
mod tests {
    use super::{for_call, token};

    #[tokio::test]
    async fn a_token_names_the_call_it_runs_for() {
        assert_eq!(token("s", 3), "s-3");
        assert_eq!(for_call("s-call-7", "evaluate-lisp", async { token("s", 4) }).await, "s-call-7/evaluate-lisp/4");
    }
}
