//! Property tests: no input makes the source tools panic, and whatever parses prints back
//! byte for byte.

use std::path::Path;

use proptest::prelude::*;
use swank_mcp::source::{outline, outline_page_of, prepare_edit, AllowedRoots, Cst, EditRequest, Operation};

/// Checks everything that must hold for any input, parsed or not.
fn check_any(input: &[u8]) -> Result<(), TestCaseError> {
    // The check that keeps no tree decides exactly as the parse, with the same error.
    prop_assert_eq!(Cst::check(input), Cst::parse(input).map(|cst| cst.top_level_forms().count()));
    match Cst::parse(input) {
        Ok(cst) => {
            prop_assert_eq!(cst.print(), input);
            // The top-level nodes tile the input: no byte is lost or shared.
            let mut at = 0;
            for &id in cst.top_level() {
                prop_assert_eq!(cst.span(id).start, at);
                at = cst.span(id).end;
            }
            prop_assert_eq!(at, input.len());
            // The outline without the whole tree is the outline of the tree.
            prop_assert_eq!(outline_page_of(input, 0, usize::MAX), Ok((cst.top_level_forms().count(), outline(&cst))));
        }
        Err(error) => {
            prop_assert!(error.at.offset <= input.len());
            prop_assert!(error.at.line >= 1 && error.at.column >= 1);
            if let Some(opener) = &error.opener {
                prop_assert!(opener.at.offset <= error.at.offset);
            }
            let _ = error.to_string();
        }
    }
    Ok(())
}

/// Text made mostly of the characters that matter to the reader, so that many cases parse and
/// many fail in interesting places.
fn lispish() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => Just("(".to_string()),
        4 => Just(")".to_string()),
        3 => Just(" ".to_string()),
        2 => Just("\n".to_string()),
        1 => Just("\r\n".to_string()),
        1 => Just("\t".to_string()),
        2 => Just("\"".to_string()),
        2 => Just("\\".to_string()),
        2 => Just("|".to_string()),
        3 => Just("#".to_string()),
        2 => Just(";".to_string()),
        2 => Just("'".to_string()),
        1 => Just("`".to_string()),
        1 => Just(",".to_string()),
        1 => Just("@".to_string()),
        1 => Just(":".to_string()),
        1 => Just("+".to_string()),
        1 => Just("-".to_string()),
        1 => Just("λ".to_string()),
        1 => Just("\u{feff}".to_string()),
        6 => "[a-z0-9*.=]{1,4}",
        1 => prop::sample::select(vec!["defun", "defmethod", "setf", "eql", "#+sbcl", "#\\", "#|", "|#", "#:"])
            .prop_map(str::to_string),
    ];
    prop::collection::vec(piece, 0..80).prop_map(|pieces| pieces.concat())
}

/// A well-formed form, and how many top-level forms it counts as (always one).
fn form() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        "[a-z][a-z0-9-]{0,6}",
        "[a-z]{1,4}:[a-z]{1,4}",
        ":[a-z]{1,5}",
        "-?[0-9]{1,4}",
        Just("|a ) b|".to_string()),
        Just("a\\ b".to_string()),
        Just("\"str \\\" ) ;\"".to_string()),
        prop::sample::select(vec!["#\\(", "#\\)", "#\\Space", "#\\;", "#\\\"", "#\\λ"]).prop_map(str::to_string),
        Just("#:sym".to_string()),
        Just("#*1011".to_string()),
        Just("#x1F".to_string()),
        Just("#1#".to_string()),
        Just("#?custom".to_string()),
    ];
    atom.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec((inner.clone(), separator()), 0..6).prop_map(|items| {
                let body: String = items.iter().map(|(item, sep)| format!("{item}{sep}")).collect();
                format!("({body})")
            }),
            prop::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("#({})", items.join(" "))),
            (
                prop::sample::select(vec!["'", "`", ",", ",@", "#'", "#.", "#1=", "#2A", "#p", "#S", "#C"]),
                separator(),
                inner.clone()
            )
                .prop_map(|(prefix, sep, item)| format!("{prefix}{sep}{item}")),
            (prop::sample::select(vec!["#+sbcl", "#-(or ccl ecl)", "#+(and)"]), separator(), inner)
                .prop_map(|(condition, sep, item)| format!("{condition}{sep}{item}")),
        ]
    })
}

/// Whitespace or comments between elements; never empty, so tokens stay apart.
fn separator() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just(" ".to_string()),
        1 => Just("\n  ".to_string()),
        1 => Just("\r\n".to_string()),
        1 => Just(" ; comment ) \" |\n".to_string()),
        1 => Just(" #| block #| nested |# ) |# ".to_string()),
    ]
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..2048)) {
        check_any(&input)?;
    }

    #[test]
    fn reader_heavy_text_never_panics_and_round_trips(input in lispish()) {
        check_any(input.as_bytes())?;
    }

    #[test]
    fn well_formed_code_always_parses(forms in prop::collection::vec((form(), separator()), 0..8)) {
        let text: String = forms.iter().map(|(form, sep)| format!("{form}{sep}")).collect();
        let cst = Cst::parse(text.as_bytes());
        prop_assert!(cst.is_ok(), "{:?} did not parse: {}", text, cst.err().map(|e| e.to_string()).unwrap_or_default());
        if let Ok(cst) = cst {
            prop_assert_eq!(cst.top_level_forms().count(), forms.len());
            prop_assert_eq!(cst.print(), text.as_bytes());
        }
    }

    #[test]
    fn edits_with_arbitrary_arguments_never_panic(
        form_type in prop_oneof![lispish(), Just("defun".to_string()), Just("defmethod".to_string())],
        form_name in prop_oneof![lispish(), Just("scale".to_string()), Just("draw (circle)".to_string())],
        content in prop_oneof![lispish(), form()],
        operation in prop::sample::select(vec![Operation::Replace, Operation::InsertBefore, Operation::InsertAfter]),
        index in prop::option::of(0usize..4),
    ) {
        let roots = AllowedRoots::new(vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/source")]).expect("roots");
        let request =
            EditRequest { form_type: &form_type, form_name: &form_name, operation, content: &content, old_text: "", index };
        if let Ok(prepared) = prepare_edit(&roots, Path::new("shapes.lisp"), None, &request) {
            prop_assert!(Cst::parse(prepared.new_text()).is_ok());
            prop_assert!(prepared.report().diff.starts_with("--- a/shapes.lisp\n"));
        }
    }
}
