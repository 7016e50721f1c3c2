//! The JSON-RPC message reader on any bytes: it never panics, and the params of every request and
//! notification it takes are a whole JSON value. Reading them can still fail on what serde_json
//! checks only when it reads a value (a number out of its range, a lone surrogate escape), which
//! the server answers as invalid params; never by ending early.

#![no_main]

use libfuzzer_sys::fuzz_target;
use swank_mcp::mcp::message::{Line, Message};

fuzz_target!(|data: &[u8]| {
    let messages = match Line::parse(data) {
        Line::Single(message) => vec![message],
        Line::Batch(messages) => messages,
    };
    for message in messages.into_iter().flatten() {
        let params = match &message {
            Message::Request(request) => &request.params,
            Message::Notification(notification) => &notification.params,
            Message::Response(_) => continue,
        };
        if let Err(error) = params.read::<serde_json::Map<String, serde_json::Value>>() {
            assert!(!error.is_eof(), "params taken as a whole value end early: {error}");
        }
    }
});
