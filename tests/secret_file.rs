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

/// A secret file that is not a small regular file is refused at once, with an error that names it
/// and says what it is (issue 36.4): a FIFO blocked the start for good, and `/dev/zero` was read
/// until memory ran out.
#[test]
fn a_secret_file_that_is_not_a_small_regular_file_is_refused_at_once() {
    use std::os::unix::process::CommandExt as _;
    let home = tempfile::tempdir().unwrap();
    let fifo = home.path().join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let large = home.path().join("large");
    std::fs::write(&large, format!("{SECRET}\n{}", "x".repeat(5000))).unwrap();
    let refused = |args: &[&str], what: &str| {
        let port = common::dead_port().to_string();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"));
        command.env("HOME", home.path()).args(["--port", &port]).args(args).args(["eval", "(+ 1 2)"]);
        command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        // SAFETY: setrlimit is async-signal-safe. The bound keeps a server that reads /dev/zero
        // whole from taking the machine's memory before the deadline below.
        unsafe {
            command.pre_exec(|| {
                let limit = libc::rlimit { rlim_cur: 2 << 30, rlim_max: 2 << 30 };
                match libc::setrlimit(libc::RLIMIT_AS, &limit) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
        let mut child = command.spawn().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("{args:?}: still running after 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(what), "{args:?}: {stderr}");
    };
    let fifo_path = fifo.to_str().unwrap();
    refused(
        &["--secret-file", fifo_path],
        &format!("cannot read the secret file {fifo_path}\n  caused by: it is a FIFO (named pipe), not a regular file"),
    );
    refused(
        &["--secret-file", "/dev/zero"],
        "cannot read the secret file /dev/zero\n  caused by: it is a character device, not a regular file",
    );
    refused(&["--secret-file", large.to_str().unwrap()], "more than the 4096 a secret file may hold");
    // ~/.slime-secret was skipped when it was not a regular file: the server connected without it.
    std::fs::rename(&fifo, home.path().join(".slime-secret")).unwrap();
    refused(&[], "/.slime-secret\n  caused by: it is a FIFO (named pipe), not a regular file");
}
