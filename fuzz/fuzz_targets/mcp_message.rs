//! The JSON-RPC message reader on any bytes: it never panics, and every line it takes as a single
//! request or notification has a method and params that read as a JSON object.

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
            Message::Response => continue,
        };
        if let Err(error) = params.read::<serde_json::Map<String, serde_json::Value>>() {
            panic!("params taken as an object do not read as one: {error}");
        }
    }
});
