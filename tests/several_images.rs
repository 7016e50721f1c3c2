//! Several images registered with --connect: each tool call goes to the image it names, and one
//! slow or dead image never holds up another.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::McpClient;
use serde_json::json;
use swank_mcp::source::AllowedRoots;
use swank_mcp::tools::{ToolOutput, Toolbox};

fn toolbox(images: &[(&str, u16)]) -> Arc<Toolbox> {
    let settings = images
        .iter()
        .map(|(name, port)| swank_mcp::image::ImageSettings { name: name.to_string(), ..common::image_settings(*port) })
        .collect();
    Arc::new(Toolbox::new(common::settings(), settings, AllowedRoots::new(Vec::new()).unwrap()))
}

async fn eval(toolbox: &Arc<Toolbox>, image: Option<&str>, code: &str) -> ToolOutput {
    let mut arguments = json!({ "code": code });
    if let Some(image) = image {
        arguments["image"] = image.into();
    }
    toolbox.call("evaluate-lisp", Some(arguments), Default::default()).await.unwrap()
}

#[tokio::test]
async fn calls_go_to_the_image_they_name() {
    let (a, b) = (common::private_image().await, common::private_image().await);
    let tb = toolbox(&[("first", a.port), ("second", b.port)]);
    assert_eq!(eval(&tb, Some("second"), "(defvar *which* :second)").await.text, "=> *WHICH*");
    assert_eq!(eval(&tb, Some("second"), "*which*").await.text, "=> :SECOND");
    // The first image is the default and never saw the definition.
    assert_eq!(eval(&tb, None, "(boundp '*which*)").await.text, "=> NIL");
    assert_eq!(eval(&tb, Some("first"), "(boundp '*which*)").await.text, "=> NIL");
    let status = tb.call("lisp-status", Some(json!({"image": "second"})), Default::default()).await.unwrap();
    assert!(
        status.text.contains(&format!(
            "Images: first at 127.0.0.1:{} (default); second at 127.0.0.1:{} (this one)",
            a.port, b.port
        )),
        "{}",
        status.text
    );
    let unknown = eval(&tb, Some("third"), "1").await;
    assert!(unknown.is_error && unknown.text.contains("first, second"), "{}", unknown.text);
}

#[tokio::test]
async fn a_slow_or_dead_image_does_not_hold_up_another() {
    let live = common::private_image().await;
    let slow = common::private_image().await;
    let tb = toolbox(&[("slow", slow.port), ("dead", common::dead_port()), ("live", live.port)]);
    let sleeping = {
        let tb = tb.clone();
        tokio::spawn(async move { eval(&tb, Some("slow"), "(progn (sleep 3) :slept)").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let dead = eval(&tb, Some("dead"), "1").await;
    assert!(dead.is_error && dead.text.contains("No Lisp image is answering"), "{}", dead.text);
    assert_eq!(eval(&tb, Some("live"), "(+ 1 2)").await.text, "=> 3");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(sleeping.await.unwrap().text, "=> :SLEPT");
}

#[tokio::test]
async fn the_binary_offers_the_images_by_name() {
    let (a, b) = (common::private_image().await, common::private_image().await);
    let (first, second) = (format!("one=127.0.0.1:{}", a.port), format!("two=127.0.0.1:{}", b.port));
    let mut client = McpClient::start(&["--connect", &first, "--connect", &second]).await;
    client.initialize().await;
    let tools = client.request("tools/list", json!({})).await;
    let tools = tools["result"]["tools"].as_array().unwrap();
    let evaluate = tools.iter().find(|t| t["name"] == "evaluate-lisp").unwrap();
    assert_eq!(evaluate["inputSchema"]["properties"]["image"]["enum"], json!(["one", "two"]));
    let outline = tools.iter().find(|t| t["name"] == "lisp-outline").unwrap();
    assert!(outline["inputSchema"]["properties"].get("image").is_none(), "source tools need no image");
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(sb-posix:getpid)", "image": "two"})).await;
    let pid_two = common::text(&reply).to_string();
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(sb-posix:getpid)"})).await;
    assert_ne!(common::text(&reply), pid_two, "the default is the first image");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .args(["--connect", &first, "--connect", &second, "status"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(said.contains("one: connected") && said.contains("two: connected"), "{said}");
}
