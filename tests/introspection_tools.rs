//! class-info (every example of its contract), describe-symbol, apropos-search, find-definition,
//! xref and lisp-status against a real SBCL + cl-swank image, on code compiled from a real file.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};

use swank_mcp::tools::Toolbox;

async fn ok(toolbox: &Arc<Toolbox>, tool: &str, arguments: Value) -> String {
    let output = common::call(toolbox, tool, arguments.clone()).await;
    assert!(!output.is_error, "{tool} {arguments}: {}", output.text);
    output.text
}

const SOURCE: &str = "\
(defpackage :introspect-test (:use :cl) (:export #:area #:shape))
(in-package :introspect-test)

;;; Shapes, with a comment before the first definition: ünïcödé λ.
(defvar *count* 0 \"How many shapes were made.\")

(defun target (x)
  \"Doubles X.\"
  (* x 2))

(defun caller-1 (y)
  (let ((*count* 1))
    (setf *count* (target y))))

(defmacro twice (form) `(progn ,form ,form))

(defun uses-macro () (twice (target 1)))

(defclass shape () ((name :initarg :name :reader shape-name)))
(defgeneric area (shape) (:documentation \"The area of SHAPE.\"))
(defmethod area ((s shape)) 0)
#+(or) (defun not-read () 1)
(defmethod area :around ((s shape)) (call-next-method))
#| a block comment |# (defun reads-count () *count*)
";

/// The test file, compiled and loaded into the shared image once per test run.
async fn loaded_source(toolbox: &Arc<Toolbox>) -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    static LOADED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let path = PATH
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("tempdir").keep();
            let path = dir.join("introspect-test.lisp");
            std::fs::write(&path, SOURCE).expect("write the test source");
            path
        })
        .clone();
    LOADED
        .get_or_init(|| async {
            common::eval_ok(toolbox, &format!("(load (compile-file {:?}))", path.display().to_string())).await;
        })
        .await;
    path
}

#[tokio::test]
async fn class_info_contract_examples() {
    // The examples define PERSON in MY-APP and the vehicle classes in VEHICLES: an image of
    // their own keeps those names to this test.
    let image = common::private_image().await;
    let tb = common::toolbox(image.port);
    common::eval_ok(
        &tb,
        "(defpackage :my-app (:use :cl)) (in-package :my-app) \
         (defclass person () ((name :initarg :name :accessor person-name) (age :initarg :age :initform 0 :accessor person-age))) \
         (defpackage :vehicles (:use :cl) (:shadow #:car)) (in-package :vehicles) \
         (defclass vehicle () ((name :initarg :name) (max-speed :initarg :max-speed))) \
         (defclass car (vehicle) ((doors :initarg :doors) (fuel :initarg :fuel) (seats :initarg :seats))) \
         (defclass aircraft (vehicle) ((wingspan :initarg :wingspan) (ceiling :initarg :ceiling))) \
         (defclass flying-car (car aircraft) ((vtol-capable :type boolean :initarg :vtol-capable :initform t :accessor flying-car-vtol-capable))) \
         (in-package :cl-user)",
    )
    .await;
    assert_eq!(
        ok(&tb, "class-info", json!({"class": "person", "package": "MY-APP"})).await,
        "Class: PERSON\n  Metaclass: STANDARD-CLASS\n  Package: MY-APP\n\nDirect Superclasses:\n  - STANDARD-OBJECT\n\n\
         Direct Subclasses: (none)\n\nClass Precedence List:\n  PERSON → STANDARD-OBJECT → T\n\nDirect Slots (2):\n  NAME\n    \
         Initarg: :NAME\n    Accessor: PERSON-NAME\n\n  AGE\n    Initarg: :AGE\n    Initform: 0\n    Accessor: PERSON-AGE"
    );
    // The contract's example leaves out Package and Direct Subclasses here; every class has them.
    assert_eq!(
        ok(&tb, "class-info", json!({"class": "flying-car", "package": "VEHICLES"})).await,
        "Class: FLYING-CAR\n  Metaclass: STANDARD-CLASS\n  Package: VEHICLES\n\nDirect Superclasses:\n  - CAR\n  - AIRCRAFT\n\n\
         Direct Subclasses: (none)\n\nClass Precedence List:\n  FLYING-CAR → CAR → AIRCRAFT → VEHICLE → STANDARD-OBJECT → T\n\n\
         Direct Slots (1):\n  VTOL-CAPABLE\n    Type: BOOLEAN\n    Initarg: :VTOL-CAPABLE\n    Initform: T\n    \
         Accessor: FLYING-CAR-VTOL-CAPABLE\n\nAll Slots (inherited included): 8\n  (includes slots from CAR, AIRCRAFT and VEHICLE)\n\n\
         Inherited Slots (7):\n  DOORS (from CAR)\n    Initarg: :DOORS\n  FUEL (from CAR)\n    Initarg: :FUEL\n  \
         SEATS (from CAR)\n    Initarg: :SEATS\n  WINGSPAN (from AIRCRAFT)\n    Initarg: :WINGSPAN\n  \
         CEILING (from AIRCRAFT)\n    Initarg: :CEILING\n  NAME (from VEHICLE)\n    Initarg: :NAME\n  \
         MAX-SPEED (from VEHICLE)\n    Initarg: :MAX-SPEED"
    );
    assert_eq!(
        ok(&tb, "class-info", json!({"class": "integer", "package": "CL"})).await,
        "Class: INTEGER\n  Metaclass: BUILT-IN-CLASS\n  Package: COMMON-LISP\n\nDirect Superclasses:\n  - RATIONAL\n\n\
         Direct Subclasses:\n  - BIGNUM\n  - FIXNUM\n\nClass Precedence List:\n  INTEGER → RATIONAL → REAL → NUMBER → T\n\n\
         Direct Slots: (none)\n  (Built-in classes typically have no inspectable slots)"
    );
    let output = common::call(&tb, "class-info", json!({"class": "nonexistent-class"})).await;
    assert!(output.is_error);
    assert_eq!(output.text, "Class NONEXISTENT-CLASS not found in package CL-USER");
    // Asking interned nothing.
    assert_eq!(common::eval_ok(&tb, "(find-symbol \"NONEXISTENT-CLASS\")").await, "=> NIL\n=> NIL");
    let output = common::call(&tb, "class-info", json!({"class": "person-name", "package": "MY-APP"})).await;
    assert!(output.is_error);
    assert_eq!(output.text, "PERSON-NAME is not a class");
    let structured =
        common::call(&tb, "class-info", json!({"class": "my-app::person"})).await.structured_value().unwrap();
    assert_eq!(structured["precedence_list"], json!(["PERSON", "STANDARD-OBJECT", "T"]));
    assert_eq!(structured["direct_slots"][1]["initform"], "0");
    drop(image);
}

#[tokio::test]
async fn class_info_handles_every_kind_of_class() {
    let tb = common::toolbox(common::shared_image_port());
    common::eval_ok(
        &tb,
        "(defpackage :class-info-test (:use :cl)) (in-package :class-info-test) \
         (defclass waiting (not-defined-yet) ((a :initarg :a :reader waiting-a :writer set-waiting-a))) \
         (defstruct (point (:conc-name pt-)) (x 0 :type fixnum) (y 0 :read-only t)) \
         (define-condition oops (error) ((detail :initarg :detail :reader oops-detail))) \
         (defclass counter () ((total :allocation :class :initform 0 :accessor counter-total)) \
           (:documentation \"Counts things.
Shared by every instance.\")) \
         (defclass tally (counter) ((total :initform 1) (label :initarg :label)))",
    )
    .await;
    let info = |class: &'static str| {
        let tb = tb.clone();
        async move { ok(&tb, "class-info", json!({"class": class, "package": "class-info-test"})).await }
    };
    let text = info("waiting").await;
    assert!(
        text.contains(
            "Class Precedence List: unknown\n  (not finalized: superclass NOT-DEFINED-YET is not defined yet)"
        ),
        "{text}"
    );
    assert!(text.contains("  A\n    Initarg: :A\n    Reader: WAITING-A\n    Writer: SET-WAITING-A"), "{text}");
    let text = info("not-defined-yet").await;
    assert!(text.contains("Metaclass: SB-MOP:FORWARD-REFERENCED-CLASS"), "{text}");
    assert!(text.contains("Direct Subclasses:\n  - WAITING"), "{text}");
    let text = info("point").await;
    assert!(text.contains("Metaclass: STRUCTURE-CLASS"), "{text}");
    assert!(
        text.contains(
            "  X\n    Type: FIXNUM\n    Initform: 0\n    Accessor: PT-X\n\n  Y\n    Initform: 0\n    Reader: PT-Y"
        ),
        "{text}"
    );
    let text = info("oops").await;
    assert!(text.contains("Class Precedence List:\n  OOPS → ERROR → SERIOUS-CONDITION → CONDITION → T"), "{text}");
    assert!(text.contains("  DETAIL\n    Initarg: :DETAIL\n    Reader: OOPS-DETAIL"), "{text}");
    let text = info("counter").await;
    assert!(text.contains("  TOTAL\n    Allocation: :CLASS\n    Initform: 0\n    Accessor: COUNTER-TOTAL"), "{text}");
    assert!(
        text.contains("  Package: CLASS-INFO-TEST\n  Documentation: Counts things.\n    Shared by every instance.\n\n"),
        "{text}"
    );
    // A slot the subclass redefines is its own, not inherited.
    let text = info("tally").await;
    assert!(!text.contains("Inherited Slots"), "{text}");
    let structured = common::call(&tb, "class-info", json!({"class": "oops", "package": "class-info-test"}))
        .await
        .structured_value()
        .unwrap();
    assert_eq!(structured["documentation"], Value::Null);
    assert_eq!(structured["inherited_slots"], json!([]));
    let output = common::call(&tb, "class-info", json!({"class": "x", "package": "CLASS-INFO-NOPE"})).await;
    assert_eq!((output.is_error, output.text.as_str()), (true, "The package \"CLASS-INFO-NOPE\" does not exist."));
}

#[tokio::test]
async fn describe_symbol_says_what_a_symbol_names_and_where() {
    let tb = common::toolbox(common::shared_image_port());
    let path = loaded_source(&tb).await.display().to_string();
    let describe = |symbol: &'static str| {
        let tb = tb.clone();
        async move { ok(&tb, "describe-symbol", json!({"symbol": symbol, "package": "introspect-test"})).await }
    };
    assert_eq!(
        describe("target").await,
        format!("INTROSPECT-TEST::TARGET (internal in INTROSPECT-TEST)\n\nFunction: (TARGET X)\n  Doubles X.\n  Source: {path}:7:1")
    );
    assert_eq!(
        describe("area").await,
        format!(
            "INTROSPECT-TEST:AREA (external in INTROSPECT-TEST)\n\nGeneric function: (AREA SHAPE)\n  The area of SHAPE.\n  Methods (2):\n    \
             (AREA (SHAPE))  {path}:21:1\n    (AREA :AROUND (SHAPE))  {path}:23:1\n  Source: {path}:20:1"
        )
    );
    // A reader made by DEFCLASS has no source of its own: the DEFCLASS is where it is defined.
    assert_eq!(
        describe("shape-name").await,
        format!(
            "INTROSPECT-TEST::SHAPE-NAME (internal in INTROSPECT-TEST)\n\nGeneric function: (SHAPE-NAME OBJECT)\n  \
             Methods (1):\n    (SHAPE-NAME (SHAPE))  {path}:19:1\n  \
             Source: {path}:19:1 (a slot accessor made by the DEFCLASS of SHAPE)"
        )
    );
    assert_eq!(
        describe("*count*").await,
        format!("INTROSPECT-TEST::*COUNT* (internal in INTROSPECT-TEST)\n\nVariable: *COUNT* = 0\n  How many shapes were made.\n  Source: {path}:5:1")
    );
    // The symbol as one would type it: quoted, escaped, qualified.
    for spelling in ["'target", "|TARGET|", "introspect-test::target", "#'Target"] {
        assert!(
            describe(spelling).await.starts_with("INTROSPECT-TEST::TARGET (internal in INTROSPECT-TEST)\n\nFunction:"),
            "{spelling}"
        );
    }
    assert_eq!(
        describe("twice").await,
        format!("INTROSPECT-TEST::TWICE (internal in INTROSPECT-TEST)\n\nMacro: (TWICE FORM)\n  Source: {path}:15:1")
    );
    let text = describe("introspect-test:shape").await;
    assert!(
        text.starts_with(
            "INTROSPECT-TEST:SHAPE (external in INTROSPECT-TEST)\n\nClass: SHAPE, metaclass STANDARD-CLASS"
        ),
        "{text}"
    );
    assert!(text.ends_with(&format!("Source: {path}:19:1")), "{text}");
    // Definitions made by evaluation have no file.
    common::eval_ok(&tb, "(defun describe-test-repl (a &key (b 2)) \"From the REPL.\" (list a b))").await;
    assert_eq!(
        ok(&tb, "describe-symbol", json!({"symbol": "describe-test-repl"})).await,
        "COMMON-LISP-USER::DESCRIBE-TEST-REPL (internal in COMMON-LISP-USER)\n\nFunction: (DESCRIBE-TEST-REPL A &KEY (B 2))\n  From the REPL.\n  \
         Source: defined at the REPL, no source file"
    );
    // Lambda-list variables are shown by name, whatever their package.
    let text = ok(&tb, "describe-symbol", json!({"symbol": "if"})).await;
    assert!(text.starts_with("COMMON-LISP:IF (external in COMMON-LISP, accessible in COMMON-LISP-USER)\n\nSpecial operator: (IF TEST THEN &OPTIONAL ELSE)"), "{text}");
    let output = common::call(&tb, "describe-symbol", json!({"symbol": "describe-test-nowhere"})).await;
    assert_eq!(
        (output.is_error, output.text.as_str()),
        (true, "Symbol DESCRIBE-TEST-NOWHERE not found in package CL-USER.")
    );
    common::eval_ok(&tb, "(intern \"DESCRIBE-TEST-BARE\")").await;
    let text = ok(&tb, "describe-symbol", json!({"symbol": "describe-test-bare"})).await;
    assert_eq!(text, "COMMON-LISP-USER::DESCRIBE-TEST-BARE (internal in COMMON-LISP-USER) names nothing: no function, macro, variable, class or type.");
    let output = common::call(&tb, "describe-symbol", json!({"symbol": "(not a symbol"})).await;
    assert_eq!(output.text, "\"(not a symbol\" is not a symbol name.");
}

#[tokio::test]
async fn find_definition_gives_file_line_and_column() {
    let tb = common::toolbox(common::shared_image_port());
    let path = loaded_source(&tb).await.display().to_string();
    assert_eq!(
        ok(&tb, "find-definition", json!({"symbol": "area", "package": "introspect-test"})).await,
        format!(
            "INTROSPECT-TEST:AREA: 3 definitions\n  generic function        {path}:20:1\n  method (:AROUND SHAPE)  {path}:23:1\n  \
             method (SHAPE)          {path}:21:1"
        )
    );
    // After a block comment on the same line.
    assert_eq!(
        ok(&tb, "find-definition", json!({"symbol": "introspect-test::reads-count"})).await,
        format!("INTROSPECT-TEST::READS-COUNT: 1 definition\n  function  {path}:24:23")
    );
    let structured = common::call(&tb, "find-definition", json!({"symbol": "introspect-test::target"}))
        .await
        .structured_value()
        .unwrap();
    assert_eq!(
        structured["definitions"],
        json!([{"kind": "function", "file": path, "line": 7, "column": 1, "note": null}])
    );
    common::eval_ok(&tb, "(defun find-definition-test-repl () 1)").await;
    assert_eq!(
        ok(&tb, "find-definition", json!({"symbol": "find-definition-test-repl"})).await,
        "COMMON-LISP-USER::FIND-DEFINITION-TEST-REPL: 1 definition\n  function  defined at the REPL, no source file"
    );
    let text = ok(&tb, "find-definition", json!({"symbol": "cl:car"})).await;
    assert!(text.starts_with("COMMON-LISP:CAR: "), "{text}");
    assert!(text.contains("list.lisp"), "{text}");
}

#[tokio::test]
async fn a_changed_file_is_noted() {
    let tb = common::toolbox(common::shared_image_port());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("changing.lisp");
    std::fs::write(&path, "(defun find-definition-test-changing () 1)\n").unwrap();
    common::eval_ok(&tb, &format!("(load (compile-file {:?}))", path.display().to_string())).await;
    // File times have a resolution of a second here.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    std::fs::write(&path, "\n\n(defun find-definition-test-changing () 2)\n").unwrap();
    let text = ok(&tb, "find-definition", json!({"symbol": "find-definition-test-changing"})).await;
    assert!(text.ends_with("(the file changed since this was compiled; the line may be off)"), "{text}");
}

#[tokio::test]
async fn xref_lists_every_kind_of_reference() {
    let tb = common::toolbox(common::shared_image_port());
    let path = loaded_source(&tb).await.display().to_string();
    let xref = |symbol: &'static str, kind: &'static str| {
        let tb = tb.clone();
        async move { ok(&tb, "xref", json!({"symbol": symbol, "kind": kind, "package": "introspect-test"})).await }
    };
    assert_eq!(
        xref("target", "calls").await,
        format!("Who calls INTROSPECT-TEST::TARGET: 2 functions\n  CALLER-1    {path}:11:1\n  USES-MACRO  {path}:17:1")
    );
    assert_eq!(
        xref("caller-1", "callees").await,
        format!("What INTROSPECT-TEST::CALLER-1 calls: 1 function\n  TARGET  {path}:7:1")
    );
    assert_eq!(
        xref("*count*", "references").await,
        format!("Who references INTROSPECT-TEST::*COUNT*: 1 function\n  READS-COUNT  {path}:24:23")
    );
    assert_eq!(
        xref("*count*", "binds").await,
        format!("Who binds INTROSPECT-TEST::*COUNT*: 1 function\n  CALLER-1  {path}:11:1")
    );
    assert_eq!(
        xref("*count*", "sets").await,
        format!("Who sets INTROSPECT-TEST::*COUNT*: 1 function\n  CALLER-1  {path}:11:1")
    );
    assert_eq!(
        xref("twice", "macroexpands").await,
        format!("Who uses the macro INTROSPECT-TEST::TWICE: 1 function\n  USES-MACRO  {path}:17:1")
    );
    assert_eq!(
        xref("shape", "specializes").await,
        format!(
            "Methods specializing on INTROSPECT-TEST:SHAPE: 3 methods\n  (METHOD SHAPE-NAME SHAPE)    {path}:19:1 \
             (a slot accessor made by the DEFCLASS of SHAPE)\n  \
             (METHOD AREA SHAPE)          {path}:21:1\n  (METHOD AREA :AROUND SHAPE)  {path}:23:1"
        )
    );
    // Calls from code evaluated at the REPL are recorded too.
    common::eval_ok(&tb, "(defun xref-test-repl-caller () (introspect-test::target 3))").await;
    let text = ok(&tb, "xref", json!({"symbol": "introspect-test::target", "kind": "calls"})).await;
    assert!(
        text.ends_with("\n  COMMON-LISP-USER::XREF-TEST-REPL-CALLER  defined at the REPL, no source file"),
        "{text}"
    );
    let output =
        common::call(&tb, "xref", json!({"symbol": "target", "kind": "callers", "package": "introspect-test"})).await;
    assert!(output.is_error);
    assert_eq!(
        output.text,
        "Unknown xref kind \"callers\": use calls, callees, references, binds, sets, macroexpands, specializes."
    );
    let output =
        common::call(&tb, "xref", json!({"symbol": "*count*", "kind": "callees", "package": "introspect-test"})).await;
    assert_eq!(output.text, "*COUNT* is not a function.");
    // Big answers are capped, and the helper's own functions are not listed.
    let output = common::call(&tb, "xref", json!({"symbol": "car", "kind": "calls"})).await;
    let structured = output.structured_value().unwrap();
    assert!(structured["total"].as_u64().unwrap() > 1000, "{structured}");
    assert_eq!(structured["hits"].as_array().unwrap().len(), 100);
    assert!(output.text.contains("\n  ... and ") && !output.text.contains("MCP-AGENT-HELPER"), "{}", output.text);
}

#[tokio::test]
async fn apropos_search_finds_symbols_and_says_what_they_name() {
    let tb = common::toolbox(common::shared_image_port());
    loaded_source(&tb).await;
    assert_eq!(
        ok(&tb, "apropos-search", json!({"query": "caller-1"})).await,
        "1 symbol matches \"caller-1\" in any package:\n  INTROSPECT-TEST::CALLER-1  function"
    );
    assert_eq!(
        ok(&tb, "apropos-search", json!({"query": "a", "package": "introspect-test", "external_only": true})).await,
        "2 symbols match \"a\" in introspect-test:\n  INTROSPECT-TEST:AREA   generic function\n  INTROSPECT-TEST:SHAPE  class"
    );
    let output = common::call(&tb, "apropos-search", json!({"query": "hash-table"})).await;
    // Exact matches first.
    let (count, rest) = output.text.split_once(' ').unwrap();
    assert!(count.parse::<u64>().unwrap() > 50, "{}", output.text);
    assert!(
        rest.starts_with("symbols match \"hash-table\" in any package:\n  COMMON-LISP:HASH-TABLE  "),
        "{}",
        output.text
    );
    assert!(output.text.contains("\n  ... and "), "{}", output.text);
    let structured = output.structured_value().unwrap();
    assert_eq!(structured["matches"].as_array().unwrap().len(), 50);
    let output = common::call(&tb, "apropos-search", json!({"query": "x", "package": "APROPOS-NOPE"})).await;
    assert_eq!((output.is_error, output.text.as_str()), (true, "The package \"APROPOS-NOPE\" does not exist."));
    assert_eq!(
        ok(&tb, "apropos-search", json!({"query": "apropos-test-matches-nothing-at-all"})).await,
        "No symbol that names something matches \"apropos-test-matches-nothing-at-all\" in any package."
    );
}

#[tokio::test]
async fn lisp_status_describes_the_image_and_the_connection() {
    let port = common::shared_image_port();
    let tb = common::toolbox(port);
    common::eval_ok(&tb, "(defpackage :status-test (:use :cl)) (in-package :status-test)").await;
    let output = common::call(&tb, "lisp-status", json!({})).await;
    assert!(!output.is_error, "{}", output.text);
    let lines: Vec<&str> = output.text.lines().collect();
    assert!(lines[0].starts_with("Lisp: SBCL 2.2.9"), "{}", output.text);
    assert!(lines[1].starts_with("Server: swank 2.27, communication style spawn"), "{}", output.text);
    assert!(lines[2].starts_with(&format!("Connection: 127.0.0.1:{port} (attached, pid ")), "{}", output.text);
    assert_eq!(lines[3], "Session package: STATUS-TEST");
    assert!(lines[4].starts_with("Threads: "), "{}", output.text);
    assert!(lines[5].starts_with("Evaluations in flight: "), "{}", output.text);
    assert!(output.text.contains(":SB-THREAD"), "{}", output.text);
    let structured = output.structured_value().unwrap();
    assert_eq!(structured["server"], "swank");
    assert_eq!(structured["launched"], false);
    assert!(structured["threads"].as_u64().unwrap() >= 2);
    let pid = common::eval_ok(&tb, "(sb-posix:getpid)").await;
    assert_eq!(format!("=> {}", structured["pid"]), pid);
}

#[tokio::test]
async fn find_definition_pages_a_generic_function_of_many_methods() {
    let tb = common::toolbox(common::shared_image_port());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many-methods.lisp");
    let mut source = String::from(
        "(defpackage :find-definition-many (:use :cl))\n(in-package :find-definition-many)\n(defgeneric m (x))\n",
    );
    for i in 0..2500 {
        source.push_str(&format!("(defmethod m ((x (eql {i}))) {i})\n"));
    }
    std::fs::write(&path, source).unwrap();
    common::eval_ok(&tb, &format!("(load (compile-file {:?}))", path.display().to_string())).await;
    // 50 a reply unless asked for more.
    let default = ok(&tb, "find-definition", json!({"symbol": "find-definition-many::m"})).await;
    assert!(default.starts_with("FIND-DEFINITION-MANY::M: 2501 definitions, 1 to 50\n"), "{}", &default[..100]);
    assert!(default.ends_with("\n... 2451 more; use `offset: 50` for the next page."), "{default}");
    let first = common::call(&tb, "find-definition", json!({"symbol": "find-definition-many::m", "limit": 2000})).await;
    assert!(!first.is_error, "{}", first.text);
    assert!(first.text.starts_with("FIND-DEFINITION-MANY::M: 2501 definitions, 1 to 2000\n"), "{}", &first.text[..100]);
    assert!(
        first.text.ends_with("\n... 501 more; use `offset: 2000` for the next page."),
        "{}",
        &first.text[first.text.len() - 100..]
    );
    assert_eq!(first.text.lines().count(), 2002);
    let structured = first.structured_value().unwrap();
    assert_eq!((structured["total"].as_u64(), structured["next_offset"].as_u64()), (Some(2501), Some(2000)));
    let next =
        ok(&tb, "find-definition", json!({"symbol": "find-definition-many::m", "offset": 2000, "limit": 2000})).await;
    assert!(next.starts_with("FIND-DEFINITION-MANY::M: 2501 definitions, 2001 to 2501\n"), "{}", &next[..100]);
    assert_eq!(next.lines().count(), 502);
    let page = ok(&tb, "find-definition", json!({"symbol": "find-definition-many::m", "offset": 10, "limit": 3})).await;
    assert_eq!(page.lines().count(), 5, "{page}");
}

#[tokio::test]
async fn a_name_that_does_not_exist_gets_the_near_names_that_do() {
    let tb = common::toolbox(common::shared_image_port());
    common::eval_ok(
        &tb,
        "(defpackage :near-names-test (:use :cl) (:export #:item-price #:item #:*stock-level*)) \
         (in-package :near-names-test) \
         (defclass item () ((price :initarg :price :accessor item-price))) \
         (defvar *stock-level* 3) \
         (in-package :cl-user)",
    )
    .await;
    let error = |tool: &'static str, arguments: Value| {
        let tb = tb.clone();
        async move {
            let output = common::call(&tb, tool, arguments).await;
            assert!(output.is_error, "{tool}: {}", output.text);
            output.text
        }
    };
    // A letter off, in the package it was looked up in.
    assert_eq!(
        error("describe-symbol", json!({"symbol": "near-names-test:item-prise"})).await,
        "Symbol ITEM-PRISE not found in package NEAR-NAMES-TEST. Did you mean NEAR-NAMES-TEST:ITEM-PRICE?"
    );
    // The right name in the wrong package.
    let text = error("describe-symbol", json!({"symbol": "item-price"})).await;
    assert!(text.starts_with("Symbol ITEM-PRICE not found in package CL-USER. Did you mean "), "{text}");
    assert!(text.contains("NEAR-NAMES-TEST:ITEM-PRICE"), "{text}");
    assert_eq!(
        error("class-info", json!({"class": "itm", "package": "near-names-test"})).await,
        "Class ITM not found in package NEAR-NAMES-TEST. Did you mean NEAR-NAMES-TEST:ITEM?"
    );
    assert_eq!(
        error("describe-symbol", json!({"symbol": "x", "package": "near-names-tset"})).await,
        "The package \"near-names-tset\" does not exist. Did you mean NEAR-NAMES-TEST?"
    );
    // A package as Lisp code writes it.
    for package in [":near-names-test", "#:near-names-test", "\"near-names-test\"", "NEAR-NAMES-TEST"] {
        let text = ok(&tb, "describe-symbol", json!({"symbol": "item-price", "package": package})).await;
        assert!(text.starts_with("NEAR-NAMES-TEST:ITEM-PRICE (external in NEAR-NAMES-TEST)"), "{package}: {text}");
    }
    // In evaluated code: an undefined function, an unbound variable, the reader's missing symbol
    // and package.
    let text = error("evaluate-lisp", json!({"code": "(near-names-test::item-prise 1)"})).await;
    assert!(
        text.contains(
            "The function NEAR-NAMES-TEST::ITEM-PRISE is undefined. Did you mean NEAR-NAMES-TEST:ITEM-PRICE?\n"
        ),
        "{text}"
    );
    let text = error("evaluate-lisp", json!({"code": "near-names-test::*stock-levle*"})).await;
    assert!(
        text.contains(
            "The variable NEAR-NAMES-TEST::*STOCK-LEVLE* is unbound. Did you mean NEAR-NAMES-TEST:*STOCK-LEVEL*?"
        ),
        "{text}"
    );
    let text = error("evaluate-lisp", json!({"code": "near-names-test:item-prise"})).await;
    assert!(text.contains("Did you mean NEAR-NAMES-TEST:ITEM-PRICE? (reading the form at line 1, column 1)"), "{text}");
    let text = error("evaluate-lisp", json!({"code": "(near-names-tset::f)"})).await;
    assert!(text.contains("Package NEAR-NAMES-TSET does not exist. Did you mean NEAR-NAMES-TEST?"), "{text}");
    // The contract's undefined function has no near name: its text is unchanged.
    let text = error("evaluate-lisp", json!({"code": "(foo 42)"})).await;
    assert!(
        text.starts_with("[ERROR] UNDEFINED-FUNCTION\nThe function COMMON-LISP-USER::FOO is undefined.\n\n"),
        "{text}"
    );
    let text = error("load-system", json!({"system": "alexandira"})).await;
    assert!(text.ends_with("Did you mean alexandria?"), "{text}");
    // The setf accessor of a class is described with its method.
    let text = ok(&tb, "describe-symbol", json!({"symbol": "near-names-test:item-price"})).await;
    assert!(
        text.contains(
            "Setf generic function: ((SETF ITEM-PRICE) NEW-VALUE OBJECT)\n  Methods (1):\n    ((SETF ITEM-PRICE) (T ITEM))\n"
        ),
        "{text}"
    );
}

/// A slot accessor has no source of its own: find-definition, describe-symbol and inspect all
/// place it at the DEFCLASS that made it, none of them "at the REPL".
#[tokio::test]
async fn a_slot_accessor_is_where_its_defclass_is_in_every_tool() {
    let tb = common::toolbox(common::shared_image_port());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("item.lisp");
    std::fs::write(
        &path,
        "(defpackage :accessor-test (:use :cl))\n(in-package :accessor-test)\n\n;; Items.\n\
         (defclass item ()\n  ((name :initarg :name :accessor item-name)\n   (qty :initarg :qty :reader item-qty)))\n",
    )
    .unwrap();
    common::eval_ok(&tb, &format!("(load (compile-file {:?}))", path.display().to_string())).await;
    let place = format!("{}:5:1", path.display());
    let found = ok(&tb, "find-definition", json!({"symbol": "accessor-test::item-qty"})).await;
    assert!(!found.contains("REPL"), "{found}");
    assert!(
        found.contains(&format!("generic function  {place} (a slot accessor made by the DEFCLASS of ITEM)")),
        "{found}"
    );
    let described = ok(&tb, "describe-symbol", json!({"symbol": "accessor-test::item-qty"})).await;
    assert!(described.contains(&place), "{described}");
    let inspected = ok(&tb, "inspect", json!({"code": "#'accessor-test::item-qty"})).await;
    assert!(
        inspected.contains(&format!("Source: {place} (a slot accessor made by the DEFCLASS of ACCESSOR-TEST::ITEM)")),
        "{inspected}"
    );
    let accessor = ok(&tb, "find-definition", json!({"symbol": "accessor-test::item-name"})).await;
    assert!(!accessor.contains("REPL"), "{accessor}");
}

/// After an edit moves definitions (without a reload), xref's lines are found again in the
/// file's current text, as find-definition's are.
#[tokio::test]
async fn xref_hits_are_found_again_after_an_edit() {
    let dir = tempfile::tempdir().unwrap();
    let tb = Arc::new(Toolbox::new(
        common::settings(),
        vec![common::image_settings(common::shared_image_port())],
        swank_mcp::source::AllowedRoots::new(vec![dir.path().to_path_buf()]).unwrap(),
    ));
    let path = dir.path().join("moved.lisp");
    std::fs::write(
        &path,
        "(defpackage :xref-moved (:use :cl))\n(in-package :xref-moved)\n\n(defun target (x) (* x 2))\n\n\
         (defun caller (y) (target y))\n\n(defmethod measure ((s string)) (target (length s)))\n",
    )
    .unwrap();
    common::eval_ok(&tb, &format!("(load (compile-file {:?}))", path.display().to_string())).await;
    let file = path.canonicalize().unwrap().display().to_string();
    let before = ok(&tb, "xref", json!({"symbol": "xref-moved::target", "kind": "calls"})).await;
    let line_of = |text: &str, name: &str| -> String {
        let line = text.lines().find(|line| line.trim_start().starts_with(name)).unwrap_or_else(|| panic!("{text}"));
        line.rsplit(' ').next().unwrap().to_string()
    };
    assert_eq!(line_of(&before, "CALLER"), format!("{file}:6:1"), "{before}");
    ok(
        &tb,
        "edit-lisp-form",
        json!({"file_path": file, "form_type": "defun", "form_name": "caller", "operation": "insert_before",
               "content": "(defun helper ()\n  ;; two lines\n  0)"}),
    )
    .await;
    let after = ok(&tb, "xref", json!({"symbol": "xref-moved::target", "kind": "calls"})).await;
    assert!(after.contains("(the file changed since this was compiled; found in its current text)"), "{after}");
    let after = after.replace(" (the file changed since this was compiled; found in its current text)", "");
    assert_eq!(line_of(&after, "CALLER"), format!("{file}:10:1"), "{after}");
    assert_eq!(line_of(&after, "(SB-PCL::FAST-METHOD MEASURE"), format!("{file}:12:1"), "{after}");
    let found = ok(&tb, "find-definition", json!({"symbol": "xref-moved::caller"})).await;
    assert!(found.contains(&format!("{file}:10:1")), "{found}");
}

/// A slot accessor's methods are made by its DEFCLASS: after lines are added above the class,
/// find-definition and describe-symbol place the accessor and its method where the DEFCLASS is
/// now, and after a reload they show its text (issue 49.1: the method was "deleted or renamed?"
/// at the line of another form, and after a reload the generic function's text "was not found
/// there").
#[tokio::test]
async fn a_slot_accessor_follows_its_defclass_after_an_edit_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let tb = Arc::new(Toolbox::new(
        common::settings(),
        vec![common::image_settings(common::shared_image_port())],
        swank_mcp::source::AllowedRoots::new(vec![dir.path().to_path_buf()]).unwrap(),
    ));
    let path = dir.path().join("stock.lisp");
    let class = "(defclass stock ()\n  ((level :initarg :level :reader stock-level)))\n";
    let original = format!(
        "(defpackage :accessor-moved (:use :cl))\n(in-package :accessor-moved)\n\n(defun restock (s) s)\n\n{class}"
    );
    std::fs::write(&path, &original).unwrap();
    let load = format!("(load (compile-file {:?}))", path.display().to_string());
    common::eval_ok(&tb, &load).await;
    let file = path.canonicalize().unwrap().display().to_string();
    let found = ok(&tb, "find-definition", json!({"symbol": "accessor-moved::stock-level"})).await;
    assert!(
        found.contains(&format!("generic function  {file}:6:1 (a slot accessor made by the DEFCLASS of STOCK)")),
        "{found}"
    );
    // SBCL's dates count seconds: the edit must come in a later one to be seen as a change.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let edited = original.replace("(defun restock", "(defun audit ()\n  ;; three\n  ;; lines\n  0)\n\n(defun restock");
    std::fs::write(&path, &edited).unwrap();
    let found = ok(&tb, "find-definition", json!({"symbol": "accessor-moved::stock-level"})).await;
    assert!(!found.contains("deleted or renamed"), "{found}");
    assert!(!found.contains("not found there"), "{found}");
    let relocated = "the file changed since this was compiled; found in its current text";
    assert!(
        found.contains(&format!(
            "generic function  {file}:11:1 (a slot accessor made by the DEFCLASS of STOCK; {relocated})"
        )),
        "{found}"
    );
    assert!(
        found.contains(&format!(
            "method (STOCK)    {file}:11:1 (a slot accessor made by the DEFCLASS of STOCK; {relocated})"
        )),
        "{found}"
    );
    let specializing = ok(&tb, "xref", json!({"symbol": "accessor-moved::stock", "kind": "specializes"})).await;
    assert!(
        specializing.contains(&format!("{file}:11:1 (a slot accessor made by the DEFCLASS of STOCK; {relocated})")),
        "{specializing}"
    );
    let described = ok(&tb, "describe-symbol", json!({"symbol": "accessor-moved::stock-level"})).await;
    assert!(
        described
            .contains(&format!("Source: {file}:11:1 (a slot accessor made by the DEFCLASS of STOCK; {relocated})")),
        "{described}"
    );
    // The methods' lines are the places SBCL recorded, which the changed file may have moved.
    assert!(
        described.contains(&format!(
            "(STOCK-LEVEL (STOCK))  {file}:9:1 (the file changed since this was compiled; the line may be off)"
        )),
        "{described}"
    );
    common::eval_ok(&tb, &load).await;
    let shown = ok(&tb, "find-definition", json!({"symbol": "accessor-moved::stock-level", "source": true})).await;
    assert!(!shown.contains("not found there"), "{shown}");
    assert_eq!(shown.matches(class.trim_end()).count(), 2, "{shown}");
    assert!(shown.contains("stock.lisp:11:1 (a slot accessor made by the DEFCLASS of STOCK)"), "{shown}");
}

/// A traced callee is wrapped in an encapsulation, which xref's callees named
/// SB-IMPL::ENCAPSULATION (issue 49.3): they name the function the caller calls, wrapped or not.
#[tokio::test]
async fn xref_names_a_traced_callee_by_its_own_name() {
    let tb = common::toolbox(common::shared_image_port());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traced.lisp");
    std::fs::write(
        &path,
        "(defpackage :xref-traced (:use :cl))\n(in-package :xref-traced)\n\n(defun wrapped (x) (1+ x))\n\n\
         (defun plain (x) (1- x))\n\n(defun caller (y) (plain (wrapped y)))\n",
    )
    .unwrap();
    common::eval_ok(&tb, &format!("(load (compile-file {:?}))", path.display().to_string())).await;
    common::eval_ok(&tb, "(trace xref-traced::wrapped)").await;
    let callees = ok(&tb, "xref", json!({"symbol": "xref-traced::caller", "kind": "callees"})).await;
    common::eval_ok(&tb, "(untrace xref-traced::wrapped)").await;
    assert!(!callees.contains("ENCAPSULATION"), "{callees}");
    assert!(callees.contains("WRAPPED"), "{callees}");
    assert!(callees.contains("PLAIN"), "{callees}");
    assert!(callees.contains(&format!("{}:4:1", path.canonicalize().unwrap().display())), "{callees}");
}
