//! Source files as a lossless concrete syntax tree, and the structural edits built on it.
//!
//! Everything here runs in the server process on the file's bytes; no Lisp image is involved.
//!
//! See docs/design.md, "Source files".

mod cst;
mod diff;
mod edit;
mod files;
mod find;
mod forms;
mod lexer;
mod load;
mod permit;

pub use cst::{line_count, Cst, Leaves, LineRange, Location, NodeId, NodeKind, Opener, ParseError, Prefix};
pub use diff::{compact_diff, unified_diff};
pub use edit::{
    prepare_edit, prepare_edits, BatchError, EditError, EditReport, EditRequest, FileEdit, Operation, PreparedEdit,
    PreparedEdits, RemovedForm,
};
pub use files::{not_regular, AllowedRoots, PathError, RootList, SourceFile};
pub use find::edit_distance;
pub use forms::{outline, outline_page, outline_page_of, OutlineEntry};
pub use load::{
    definition_count, locate_definition, locate_definition_by_other_definers, top_level_form_at, Counted,
    DefinitionPlace, LoadPlan, LoadTarget,
};
pub use permit::{parse_permit, ParsePermit, LARGE_PARSE, MAX_LARGE_PARSES};
