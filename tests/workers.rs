//! Worker threads: a connection's calls run in threads the helper keeps for it, not in a thread
//! spawned per request; a worker that ends is replaced by new threads; closing the connection ends
//! its workers. Against a real SBCL + cl-swank image of its own (the thread counts are its own).

mod common;

use std::time::Duration;

use serde_json::json;

/// The worker threads alive in the image other than the one this count runs in (the worker of
/// the observer's own connection).
async fn workers_alive(port: u16) -> String {
    let observer = common::toolbox(port);
    common::eval_ok(
        &observer,
        "(count-if (lambda (thread) (and (equal (sb-thread:thread-name thread) \"swank-mcp worker\") \
                                        (not (eq thread sb-thread:*current-thread*)))) \
                   (sb-thread:list-all-threads))",
    )
    .await
}

/// The thread the call ran in, as `=> "#<THREAD ...>"` without the value's handle.
async fn current_thread(toolbox: &std::sync::Arc<swank_mcp::tools::Toolbox>) -> String {
    common::without_handle(&common::eval_ok(toolbox, "(princ-to-string sb-thread:*current-thread*)").await).to_string()
}

#[tokio::test]
async fn calls_run_in_a_kept_worker_that_ends_with_its_connection() {
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    let first = current_thread(&tb).await;
    assert!(first.contains("swank-mcp worker"), "{first}");
    // One call at a time: the same thread serves them all.
    for _ in 0..3 {
        assert_eq!(current_thread(&tb).await, first);
    }
    // A call that ends its thread: the worker is not lent again, and the next call still runs.
    let output = common::call(&tb, "evaluate-lisp", json!({"code": "(sb-thread:abort-thread)"})).await;
    assert!(output.is_error && output.text.starts_with("The evaluation ended without a value"), "{}", output.text);
    let after = current_thread(&tb).await;
    assert_ne!(after, first);
    assert_eq!(common::eval_ok(&tb, "(+ 1 2)").await, "=> 3");
    drop(tb);
    // The connection's workers end with it.
    let mut alive = String::new();
    for _ in 0..50 {
        alive = workers_alive(image.port).await;
        if alive == "=> 0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(alive, "=> 0");
    drop(image);
}

#[tokio::test]
async fn a_worker_killed_from_outside_is_answered_thread_not_found_and_the_call_runs_anyway() {
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    let worker = current_thread(&tb).await;
    // The user (or the threads tool with force) ends the idle worker from another thread.
    let other = common::toolbox(image.port);
    common::eval_ok(
        &other,
        "(let ((worker (find-if (lambda (thread) (and (equal (sb-thread:thread-name thread) \"swank-mcp worker\") \
                                                       (not (eq thread sb-thread:*current-thread*)))) \
                                (sb-thread:list-all-threads)))) \
           (sb-thread:terminate-thread worker) (sb-thread:join-thread worker :default nil))",
    )
    .await;
    let started = std::time::Instant::now();
    let next = current_thread(&tb).await;
    assert_ne!(next, worker);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    drop(image);
}

/// swank-mcp indents nothing, so it spares the image swank's indentation work: the handshake
/// tells the server the client has seen every package (else the server scans every symbol of the
/// image after the first request), and worker threads ask for no updates at all (else it scans
/// the request package's symbols after every call). And the bootstrap, which runs once, ran
/// interpreted rather than compiled.
#[tokio::test]
async fn the_connection_spares_the_image_indentation_scans_and_compiling_the_bootstrap() {
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    assert_eq!(common::eval_ok(&tb, "swank::*configure-emacs-indentation*").await, "=> NIL");
    // A scan runs in a thread of its own after a request; one started by the first request would
    // have finished within this wait and cached the indentation of swank's own macros.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let scanned = common::eval_ok(
        &tb,
        "(loop for symbol being the hash-keys of (swank::connection.indentation-cache swank::*emacs-connection*) \
               thereis (eq (symbol-package symbol) (find-package \"SWANK\")))",
    )
    .await;
    assert_eq!(scanned, "=> NIL");
    let interpreted = common::eval_ok(
        &tb,
        "(typep (fdefinition (find-symbol \"ENSURE-HELPER\" \"MCP-AGENT-HELPER\")) 'sb-eval::interpreted-function)",
    )
    .await;
    assert_eq!(interpreted, "=> T");
    drop(image);
}
