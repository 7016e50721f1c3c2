//! The helper is compiled once into the cache directory of the machine the image runs on and
//! loaded from there by later images; where that directory cannot be written it is loaded as
//! source. One test, in a binary of its own: it sets the cache directory in the environment the
//! images inherit.

mod common;

use std::sync::Arc;

use swank_mcp::tools::Toolbox;

/// Where the image's helper functions were compiled from: a file for a compiled helper, `NIL` for
/// source loaded from a string.
const HELPER_ORIGIN: &str = "(let ((source (sb-introspect:find-definition-source #'mcp-agent-helper:evaluate))) \
     (and (sb-introspect:definition-source-pathname source) \
          (namestring (make-pathname :name nil :type nil :defaults (sb-introspect:definition-source-pathname source)))))";

#[tokio::test]
async fn the_helper_is_compiled_into_the_cache_once_and_loaded_from_it_after() {
    let cache = tempfile::tempdir().unwrap();
    let directory = cache.path().join("helpers");
    std::env::set_var("SWANK_MCP_CACHE_DIR", &directory);

    let first = common::private_image().await;
    let toolbox = common::toolbox(first.port);
    assert_eq!(common::eval_ok(&toolbox, "(+ 1 2)").await, "=> 3");
    let compiled: Vec<_> =
        std::fs::read_dir(&directory).expect("the cache directory was made").map(|e| e.unwrap().path()).collect();
    assert_eq!(compiled.len(), 1, "one compiled helper and no temporary files: {compiled:?}");
    let fasl = &compiled[0];
    assert!(fasl.file_name().unwrap().to_string_lossy().ends_with(".fasl"), "{fasl:?}");
    let written = std::fs::metadata(fasl).unwrap().modified().unwrap();
    assert_eq!(
        common::without_handle(&common::eval_ok(&toolbox, HELPER_ORIGIN).await),
        format!("=> {:?}", format!("{}/", directory.display()))
    );
    assert_compiles_without_warnings(&toolbox).await;
    drop(first);

    // A new image of the same machine loads that file and compiles nothing.
    let second = common::private_image().await;
    let toolbox = common::toolbox(second.port);
    assert_eq!(common::eval_ok(&toolbox, "(+ 1 2)").await, "=> 3");
    assert_eq!(
        common::without_handle(&common::eval_ok(&toolbox, HELPER_ORIGIN).await),
        format!("=> {:?}", format!("{}/", directory.display()))
    );
    assert_eq!(std::fs::metadata(fasl).unwrap().modified().unwrap(), written, "the cached file was not written again");
    drop(second);

    // A file cut short (a disk that filled up) is replaced rather than failing the load.
    std::fs::write(fasl, b"not a fasl").unwrap();
    let third = common::private_image().await;
    let toolbox = common::toolbox(third.port);
    assert_eq!(common::eval_ok(&toolbox, "(+ 1 2)").await, "=> 3");
    assert!(std::fs::metadata(fasl).unwrap().len() > 100_000, "compiled again");
    drop(third);

    // Where the cache cannot be written, the source is loaded as it is.
    std::env::set_var("SWANK_MCP_CACHE_DIR", "/proc/swank-mcp-cannot-write-here");
    let fourth = common::private_image().await;
    let toolbox = common::toolbox(fourth.port);
    assert_eq!(common::eval_ok(&toolbox, "(+ 1 2)").await, "=> 3");
    assert_eq!(common::eval_ok(&toolbox, HELPER_ORIGIN).await, "=> NIL");
    drop(fourth);

    // A --read-only server writes no file, the cache included: it loads the source.
    let untouched = cache.path().join("read-only");
    std::env::set_var("SWANK_MCP_CACHE_DIR", &untouched);
    let fifth = common::private_image().await;
    let mut client = common::McpClient::start(&["--port", &fifth.port.to_string(), "--read-only"]).await;
    client.initialize().await;
    let reply = client.call_tool("describe-symbol", serde_json::json!({"symbol": "mapcar"})).await;
    assert!(!common::is_error(&reply), "{reply}");
    assert!(!untouched.exists(), "a --read-only server made {untouched:?}");
}

/// Compiling the helper's files as one file (as the cache does) warns of nothing: the bootstrap
/// muffles warnings, so one would go unseen, and some mean a fault: a macro used before its
/// definition compiles as a call to a function that never exists, and an SBCL internal that
/// sbcl.lisp does not list is one an SBCL upgrade could drop unnoticed. This image holds the helper
/// already, so SBCL's notes that a definition replaces one, or that the package is redefined, are
/// not counted.
async fn assert_compiles_without_warnings(toolbox: &Arc<Toolbox>) {
    let directory = tempfile::tempdir().unwrap();
    let source = directory.path().join("helper.lisp");
    std::fs::write(&source, swank_mcp::image::helper::HELPER_SOURCE).unwrap();
    let code = format!(
        "(let ((warnings '())) \
           (handler-bind ((warning (lambda (w) \
                                     (unless (or (typep w (find-symbol \"REDEFINITION-WARNING\" \"SB-KERNEL\")) \
                                                 (typep w (find-symbol \"PACKAGE-AT-VARIANCE\" \"SB-INT\"))) \
                                       (push (remove #\\Newline (princ-to-string w)) warnings)) \
                                     (muffle-warning w)))) \
             (let ((*standard-output* (make-broadcast-stream)) (*error-output* (make-broadcast-stream))) \
               (compile-file {:?} :output-file {:?}))) \
           warnings)",
        source.display().to_string(),
        directory.path().join("helper.fasl").display().to_string()
    );
    assert_eq!(common::eval_ok(toolbox, &code).await, "=> NIL");
}
