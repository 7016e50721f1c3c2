//! Servers with a secret file (`~/.slime-secret`), against a real SBCL + swank image whose home
//! directory is pointed at a temporary one that holds the secret.

mod common;

use std::time::Duration;

use swank_mcp::swank::{ConnectOptions, Connection, Endpoint, Form, Protocol, Sexp, Thread};

const SECRET: &str = "correct horse battery staple";

fn options(secret: Option<&str>) -> ConnectOptions {
    ConnectOptions {
        connect_timeout: Duration::from_secs(5),
        secret: secret.map(str::to_string),
        protocol: Protocol::Auto,
    }
}

fn swank_mcp(home: &std::path::Path, args: &[&str]) -> (String, bool) {
    let output =
        std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp")).env("HOME", home).args(args).output().unwrap();
    (
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)),
        output.status.success(),
    )
}

/// Points the image's home directory at `home`: swank reads ~/.slime-secret at every accept, and
/// SBCL's home directory follows $HOME.
async fn move_home(endpoint: &Endpoint, home: &std::path::Path) {
    let connection = Connection::connect(endpoint.clone(), &options(None)).await.unwrap();
    let set_home = Form::call(
        "sb-posix",
        "setenv",
        [Form::string("HOME"), Form::string(home.join("").to_str().unwrap()), Form::Integer(1)],
    );
    connection
        .rex(Form::call("cl", "require", [Form::Keyword("sb-posix")]), "COMMON-LISP-USER", Thread::New)
        .await
        .unwrap();
    connection.rex(set_home, "COMMON-LISP-USER", Thread::New).await.unwrap();
}

#[tokio::test]
async fn the_secret_is_sent_first_and_its_absence_is_explained() {
    let image = common::private_image().await;
    let endpoint = Endpoint { host: "127.0.0.1".into(), port: image.port };
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join(".slime-secret"), format!("{SECRET}\nsecond line is not part of it\n")).unwrap();
    move_home(&endpoint, home.path()).await;

    let with_secret =
        Connection::connect(endpoint.clone(), &options(Some(SECRET))).await.expect("the right secret is accepted");
    let reply = with_secret
        .rex(Form::call("cl", "+", [Form::Integer(1), Form::Integer(2)]), "COMMON-LISP-USER", Thread::New)
        .await;
    assert_eq!(reply.unwrap(), Sexp::Integer(3));

    // The binary finds the secret in $HOME by itself, and takes --secret-file.
    let port = image.port.to_string();
    let (said, ok) = swank_mcp(home.path(), &["--port", &port, "eval", "(+ 2 2)"]);
    assert!(ok && said == "=> 4\n", "{said}");
    let file = home.path().join("other-secret");
    std::fs::write(&file, SECRET).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let (said, ok) =
        swank_mcp(elsewhere.path(), &["--port", &port, "--secret-file", file.to_str().unwrap(), "eval", "(+ 3 3)"]);
    assert!(ok && said == "=> 6\n", "{said}");

    // Last, because a connection without the secret leaves swank's accept thread in the debugger
    // (2.27): the error has to say what to do.
    let error = Connection::connect(endpoint, &options(None)).await.err().expect("refused without the secret");
    assert!(error.to_string().contains("--secret-file"), "{error}");
}

/// The secret is the first frame sent, and the trace-level log shows every frame sent: that one
/// must be left out.
#[tokio::test]
async fn the_secret_never_reaches_the_log_even_at_trace_level() {
    const TRACED_SECRET: &str = "trace-me-not 5f0c9e1d";
    let image = common::private_image().await;
    let endpoint = Endpoint { host: "127.0.0.1".into(), port: image.port };
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join(".slime-secret"), TRACED_SECRET).unwrap();
    move_home(&endpoint, home.path()).await;
    let file = home.path().join("secret-file");
    std::fs::write(&file, format!("{TRACED_SECRET}\n")).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .env("RUST_LOG", "trace")
        .args(["--port", &image.port.to_string(), "--secret-file", file.to_str().unwrap(), "eval", "(+ 1 2)"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(String::from_utf8_lossy(&output.stdout), "=> 3\n", "{log}");
    // The log does show the frames sent, and that the secret went first.
    assert!(log.contains("emacs-rex") && log.contains("secret sent"), "{log}");
    assert!(!log.contains("trace-me-not") && !log.contains("5f0c9e1d"), "the secret is in the log:\n{log}");
}
