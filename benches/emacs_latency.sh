#!/bin/sh
# The time from an agent's call to its line in the Emacs activity buffer and to its approval
# prompt, in a real Emacs session (SLIME, or SLY with SWANK_MCP_TEST_BACKEND=sly and
# SWANK_MCP_SLY_DIR=/path/to/sly): ten calls of each, after one that loads the helper.
#   sh benches/emacs_latency.sh [path/to/swank-mcp]
set -e
cd "$(dirname "$0")/.."
SWANK_MCP_BIN="$(realpath "${1:-target/debug/swank-mcp}")"
export SWANK_MCP_BIN
cd elisp-compat
emacs --batch -L . -l swank-mcp-tests.el \
      --eval '(ert-run-tests-batch-and-exit "swank-mcp-latency-of-the-activity-line-and-the-prompt")' 2>&1 \
    | grep -E '^swank-mcp latency|unexpected'
