//! What the user's Emacs is offered through the image (docs/design.md, "Emacs"): the approval of
//! calls (`swank-mcp-approval-mode`) and the record of every call (`M-x swank-mcp-activity`),
//! both kept in the image by `lisp/activity.lisp` and pushed from there to the Emacs connections
//! that subscribe (elisp-compat/swank-mcp-approval.el, swank-mcp-activity.el). Not tools: the server asks these of the image on
//! its own, for the calls it makes.

pub mod activity;
pub mod approval;
