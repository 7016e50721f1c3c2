//! The concrete syntax tree of Lisp source, on any bytes. What parses must print back byte for
//! byte and be a well-formed tree over the input; what does not must be reported at a place in
//! it. The same properties as tests/source_proptest.rs, plus the shape of every node.

#![no_main]

use libfuzzer_sys::fuzz_target;
use swank_mcp::source::{outline, outline_page_of, Cst, NodeId, NodeKind};

fuzz_target!(|input: &[u8]| {
    // The check that keeps no tree decides exactly as the parse, with the same error.
    assert_eq!(Cst::check(input), Cst::parse(input).map(|cst| cst.top_level_forms().count()));
    match Cst::parse(input) {
        Ok(cst) => {
            assert_eq!(cst.print(), input);
            assert_tiles(&cst, cst.top_level(), 0..input.len());
            check_every_node(&cst);
            for &id in cst.top_level() {
                let leaves: Vec<u8> = cst.leaves(id).flat_map(|leaf| cst.text(leaf)).copied().collect();
                assert_eq!(leaves, cst.text(id));
            }
            // The outline without the whole tree is the outline of the tree.
            assert_eq!(outline_page_of(input, 0, usize::MAX), Ok((cst.top_level_forms().count(), outline(&cst))));
        }
        Err(error) => {
            assert!(error.at.offset <= input.len());
            assert!(error.at.line >= 1 && error.at.column >= 1);
            if let Some(opener) = &error.opener {
                assert!(opener.at.offset <= error.at.offset);
            }
            let _ = error.to_string();
        }
    }
});

/// `nodes`, in order, cover `span` exactly: no byte lost, none shared.
fn assert_tiles(cst: &Cst<'_>, nodes: &[NodeId], span: std::ops::Range<usize>) {
    let mut at = span.start;
    for &id in nodes {
        assert_eq!(cst.span(id).start, at, "{:?} does not start where its previous sibling ends", cst.kind(id));
        at = cst.span(id).end;
    }
    assert_eq!(at, span.end);
}

/// Walks the whole tree with an explicit stack (inputs may nest thousands deep).
fn check_every_node(cst: &Cst<'_>) {
    let mut pending: Vec<NodeId> = cst.top_level().to_vec();
    while let Some(id) = pending.pop() {
        let children = cst.children(id);
        match cst.kind(id) {
            NodeKind::List | NodeKind::Vector => {
                assert_eq!(cst.kind(children[0]), NodeKind::Delimiter);
                let close = children[children.len() - 1];
                assert_eq!((cst.kind(close), cst.text(close)), (NodeKind::Delimiter, &b")"[..]));
            }
            NodeKind::Prefixed(prefix) => {
                assert_eq!(cst.kind(children[0]), NodeKind::Marker);
                let forms = if prefix.is_reader_conditional() { 2 } else { 1 };
                assert_eq!(cst.elements(id).count(), forms, "{prefix:?}");
            }
            leaf => assert!(children.is_empty(), "{leaf:?} has children"),
        }
        if !children.is_empty() {
            assert_tiles(cst, children, cst.span(id));
        }
        pending.extend_from_slice(children);
    }
}
