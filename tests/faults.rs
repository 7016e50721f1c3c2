//! Faults and hostile input: the server answers clearly, never panics, and the image is left
//! with no thread stuck and no thread leaked.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::McpClient;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use swank_mcp::swank::{ConnectOptions, Connection, Endpoint, Form, Protocol, Thread};
use swank_mcp::tools::{ToolOutput, Toolbox};

async fn eval(toolbox: &Arc<Toolbox>, arguments: Value) -> ToolOutput {
    toolbox.call("evaluate-lisp", Some(arguments), CancellationToken::new()).await.unwrap()
}

async fn threads(toolbox: &Arc<Toolbox>) -> i64 {
    eval(toolbox, json!({"code": "(length (sb-thread:list-all-threads))"}))
        .await
        .text
        .trim_start_matches("=> ")
        .parse()
        .unwrap()
}

#[tokio::test]
async fn storms_of_errors_timeouts_and_cancellations_leave_no_thread_behind() {
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    let baseline = threads(&tb).await;
    for i in 0..1000 {
        let output = eval(&tb, json!({"code": format!("(error \"failure ~a\" {i})")})).await;
        assert!(output.is_error && output.text.contains(&format!("failure {i}")), "{}", output.text);
    }
    for _ in 0..100 {
        let output = eval(&tb, json!({"code": "(loop)", "timeout_ms": 50})).await;
        assert!(output.text.starts_with("[ERROR] EVALUATION-TIMEOUT"), "{}", output.text);
    }
    for _ in 0..100 {
        let cancel = CancellationToken::new();
        let call = {
            let (tb, cancel) = (tb.clone(), cancel.clone());
            tokio::spawn(async move { tb.call("evaluate-lisp", Some(json!({"code": "(sleep 30)"})), cancel).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        cancel.cancel();
        call.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut now = threads(&tb).await;
    while now > baseline && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = threads(&tb).await;
    }
    // A thread parked in a debugger would still be counted here.
    assert_eq!(now, baseline, "threads leaked");
    assert_eq!(eval(&tb, json!({"code": "(hash-table-count mcp-agent-helper::*running*)"})).await.text, "=> 1");
}

#[tokio::test]
async fn hostile_lisp_gets_a_clear_error_and_the_image_lives() {
    let tb = common::toolbox(common::shared_image_port());
    // A value whose printing never ends is cut off by the time limit.
    let output = eval(
        &tb,
        json!({"code": "(defclass faults-endless () ()) (defmethod print-object ((o faults-endless) s) (loop (write-char #\\x s))) (make-instance 'faults-endless)", "timeout_ms": 1000}),
    )
    .await;
    assert!(output.text.starts_with("[ERROR] EVALUATION-TIMEOUT"), "{}", &output.text[..output.text.len().min(300)]);
    // An allocation larger than the heap.
    let output =
        eval(&tb, json!({"code": "(length (make-array (expt 10 11) :element-type '(unsigned-byte 64)))"})).await;
    assert!(output.is_error && output.text.starts_with("[ERROR] STORAGE-CONDITION"), "{}", output.text);
    // Circular and deeply nested data print within the limits.
    let output = eval(&tb, json!({"code": "(let ((l (list 1))) (setf (cdr l) l) (vector l l))"})).await;
    assert_eq!(common::without_handle(&output.text), "=> #(#1=(1 . #1#) #1#)");
    let output = eval(&tb, json!({"code": "(let ((x nil)) (dotimes (i 10000) (setf x (list x))) x)"})).await;
    assert!(!output.is_error && output.text.contains('#'), "{}", output.text);
    assert_eq!(eval(&tb, json!({"code": "(+ 1 1)"})).await.text, "=> 2");
}

#[tokio::test]
async fn an_evaluation_that_cannot_be_interrupted_says_what_it_waits_for() {
    // Its thread stays blocked after the call gives up on it: an image of its own.
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    let setup = "(defvar *faults-lock* (sb-thread:make-mutex :name \"faults test lock\")) \
                 (sb-thread:make-thread (lambda () (sb-thread:with-mutex (*faults-lock*) (sleep 6))) :name \"faults lock holder\") \
                 (sleep 0.2)";
    assert!(!eval(&tb, json!({ "code": setup })).await.is_error);
    let started = Instant::now();
    let output = eval(&tb, json!({"code": "(sb-sys:without-interrupts (sb-thread:with-mutex (*faults-lock*) :got-it))", "timeout_ms": 500})).await;
    assert!(output.is_error && output.text.contains("did not unwind within 3s"), "{}", output.text);
    assert!(
        output.text.contains(
            "The evaluation runs in thread \"swank-mcp worker\", which waits for the lock \"faults test lock\", held by thread \"faults lock holder\"."
        ),
        "{}",
        output.text
    );
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // The image goes on serving meanwhile, and once the lock is free the thread unwinds.
    assert_eq!(eval(&tb, json!({"code": "(+ 1 1)"})).await.text, "=> 2");
    let deadline = Instant::now() + Duration::from_secs(15);
    while eval(&tb, json!({"code": "(hash-table-count mcp-agent-helper::*running*)"})).await.text != "=> 1" {
        assert!(Instant::now() < deadline, "the blocked evaluation never unwound");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(image);
}

/// A fake peer that reads the client's first request, sends `bytes`, then closes. The whole
/// request is read: a socket closed with unread data is reset, which the client would see first.
async fn peer_sending(bytes: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            read_frame(&mut socket).await;
            let _ = socket.write_all(bytes).await;
        }
    });
    port
}

#[tokio::test]
async fn a_broken_peer_is_a_clear_error() {
    let options = ConnectOptions { connect_timeout: Duration::from_secs(2), secret: None, protocol: Protocol::Auto };
    for (bytes, expected) in [
        (&b"HTTP/1.1 400 Bad Request\r\n\r\n"[..], "bad frame header"),
        (&b"00zzzz(:return)"[..], "bad frame header"),
        (&b"000040(:return (:ok"[..], "in the middle of a frame"),
        (&b"000005((((("[..], "closed the connection"),
        (&b"ffffff"[..], "in the middle of a frame"),
    ] {
        let port = peer_sending(bytes).await;
        let started = Instant::now();
        let error =
            Connection::connect(Endpoint { host: "127.0.0.1".into(), port }, &options).await.err().expect("refused");
        let message = error.to_string();
        assert!(message.contains(expected) && message.contains(&format!("127.0.0.1:{port}")), "{bytes:?}: {message}");
        assert!(started.elapsed() < Duration::from_secs(8));
    }
    // The client itself refuses to send a frame over the limit.
    let connection =
        Connection::connect(Endpoint { host: "127.0.0.1".into(), port: common::shared_image_port() }, &options)
            .await
            .unwrap();
    let error =
        connection.rex(Form::string("x".repeat(0x100_0000)), "COMMON-LISP-USER", Thread::New).await.unwrap_err();
    assert!(error.to_string().contains("over the protocol's limit"), "{error}");
}

#[tokio::test]
async fn hostile_mcp_input_gets_the_right_answer_and_the_server_carries_on() {
    let mut client = McpClient::for_port(common::shared_image_port()).await;
    client.initialize().await;
    // Random bytes, one line at a time.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..50 {
        let line: Vec<u8> = (0..64)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed % 256) as u8
            })
            .filter(|b| *b != b'\n')
            .collect();
        client.send_raw(&line).await;
        assert_eq!(client.receive().await["error"]["code"], -32700);
    }
    // Ids of every JSON type: strings and integers are echoed, the rest are invalid requests.
    for (id, valid) in [
        (json!(7), true),
        (json!("seven"), true),
        (json!(1.5), false),
        (json!(true), false),
        (json!([1]), false),
        (json!({"a": 1}), false),
        (Value::Null, false),
    ] {
        client.send(&json!({"jsonrpc": "2.0", "id": id, "method": "ping"})).await;
        let reply = client.receive().await;
        if valid {
            assert_eq!((reply["id"].clone(), reply["result"].clone()), (id, json!({})));
        } else {
            assert_eq!(reply["error"]["code"], -32600, "{id}: {reply}");
        }
    }
    // Wrong JSON types for every argument of every tool: a tool error naming the argument.
    let tools = client.request("tools/list", json!({})).await;
    for tool in tools["result"]["tools"].as_array().unwrap() {
        let name = tool["name"].as_str().unwrap();
        for (argument, schema) in tool["inputSchema"]["properties"].as_object().unwrap() {
            let wrong = match schema["type"].as_str() {
                Some("string") => json!(12),
                Some("boolean") => json!("yes"),
                Some("integer") => json!("many"),
                _ => json!({"nested": []}),
            };
            let reply = client.call_tool(name, json!({ argument.clone(): wrong })).await;
            assert!(common::is_error(&reply), "{name}.{argument}: {reply}");
            let text = common::text(&reply);
            let required: Vec<&str> =
                tool["inputSchema"]["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            assert!(
                text.contains(&format!("`{argument}`")) || required.iter().any(|r| text.contains(r)),
                "{name}.{argument}: {text}"
            );
        }
        let reply = client.request("tools/call", json!({"name": name, "arguments": "not an object"})).await;
        assert!(common::is_error(&reply), "{name}: {reply}");
    }
    // A 50 MB line.
    let mut huge = b"{\"jsonrpc\":\"2.0\",\"id\":99,\"method\":\"ping\",\"params\":{\"pad\":\"".to_vec();
    huge.extend(std::iter::repeat_n(b'x', 50 * 1024 * 1024));
    huge.extend_from_slice(b"\"}}");
    client.send_raw(&huge).await;
    assert_eq!(client.receive().await["error"]["code"], -32600);
    let reply = client.call_tool("evaluate-lisp", json!({"code": "(+ 40 2)"})).await;
    assert_eq!(common::text(&reply), "=> 42");
}

/// Reads one frame from `socket`; false when the peer closed it first.
async fn read_frame(socket: &mut tokio::net::TcpStream) -> bool {
    let mut header = [0u8; 6];
    if socket.read_exact(&mut header).await.is_err() {
        return false;
    }
    let length = std::str::from_utf8(&header).ok().and_then(|h| usize::from_str_radix(h, 16).ok()).unwrap_or(0);
    socket.read_exact(&mut vec![0u8; length]).await.is_ok()
}

#[tokio::test]
async fn a_connection_born_dead_is_replaced_by_a_second_one() {
    // As Slynk 1.0.43 sometimes makes one: it reads the handshake and never answers anything,
    // while the next connection to the same port works.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (dead_closed_tx, dead_closed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut dead, _) = listener.accept().await.unwrap();
        assert!(read_frame(&mut dead).await, "the client sends its handshake");
        tokio::spawn(async move {
            // Whatever else comes, until the client closes it.
            while read_frame(&mut dead).await {}
            let _ = dead_closed_tx.send(());
        });
        let (mut live, _) = listener.accept().await.unwrap();
        assert!(read_frame(&mut live).await);
        let reply = "(:return (:ok ((:pid 4242 :style :spawn :lisp-implementation (:type \"SBCL\" :version \"2.2.9\") \
                     :version \"2.27\") \"SWANK\" nil)) 1)";
        live.write_all(format!("{:06x}{reply}", reply.len()).as_bytes()).await.unwrap();
        // Kept open for as long as the client wants it.
        while read_frame(&mut live).await {}
    });
    let options = ConnectOptions { connect_timeout: Duration::from_secs(5), secret: None, protocol: Protocol::Auto };
    let started = Instant::now();
    let connection = Connection::connect(Endpoint { host: "127.0.0.1".into(), port }, &options).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(4), "answered by the second connection, not at the time limit");
    assert_eq!(connection.info().pid, Some(4242));
    // The dead connection is closed, so that the server can end its threads.
    tokio::time::timeout(Duration::from_secs(5), dead_closed).await.expect("the dead connection is closed").unwrap();
}

#[tokio::test]
async fn a_server_that_never_answers_fails_at_the_time_limit_with_both_connections_tried() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = accepted_tx.send(());
            tokio::spawn(async move { while read_frame(&mut socket).await {} });
        }
    });
    let options = ConnectOptions { connect_timeout: Duration::from_secs(2), secret: None, protocol: Protocol::Auto };
    let started = Instant::now();
    let error = Connection::connect(Endpoint { host: "127.0.0.1".into(), port }, &options).await.err().unwrap();
    let elapsed = started.elapsed();
    assert!(error.to_string().contains("no answer to connection-info"), "{error}");
    // The first connection's limit (5 s for the handshake), not the second's.
    assert!(elapsed >= Duration::from_secs(5) && elapsed < Duration::from_secs(8), "{elapsed:?}");
    let mut connections = 0;
    while accepted.try_recv().is_ok() {
        connections += 1;
    }
    assert_eq!(connections, 2);
}
