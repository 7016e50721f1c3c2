"""The bug-fix path: what an agent reads to fix three bugs in a real library, over MCP with
swank-mcp and from a shell, on copies of the same seeded library.

Copies Alexandria (Debian's cl-alexandria, /usr/share/common-lisp/source/alexandria) into a
temporary directory, where it is registered as its own ASDF system (ahead of Debian's), and
seeds three bugs that make its RT suite fail 3 of its 249 tests: an off-by-one
(COUNT-PERMUTATIONS), a wrong `and`/`or` (the macro WHEN-LET) and a traversal order (FLATTEN).
Then walks an expert's path twice, on two such copies:

- over MCP (swank-mcp --launch, a private SBCL image): run-tests, find-definition with source of
  the three failing tests' functions, one edit-lisp-form call patching the three of them with
  load: true, run-tests again;
- from a shell (sbcl --non-interactive, grep, sed): the test-op with its output filtered to the
  failures, grep of the three definitions, sed of the three fixes followed by the test-op again.

With --previous BINARY, also the path a revision before find-definition's `source` and
edit-lisp-form's `patch` and `edits` allowed, on a third copy, with that binary: run-tests, one
evaluate-lisp snippet printing the three definitions from their files, three edit-lisp-form calls
replacing each definition whole with load: true, run-tests.

Prints, per step, the characters of the request the agent writes and of the reply it reads, and
the totals; checks that each path ends with the whole suite passing. The shell path leaves
nothing loaded in any image; the MCP paths leave the fixes loaded in the image they worked in.

    python3 benches/bugfix_path.py --server target/release/swank-mcp [--previous OLD-BINARY] [--json]
"""

import argparse
import json
import os
import sys
import tempfile

from seeded_library import (
    DEBIAN_SOURCES,
    form_at,
    print_path,
    seeded_copy,
    started,
    steps_with_total,
    test_op,
    walk,
    walk_shell,
)

ALEXANDRIA = os.path.join(DEBIAN_SOURCES, "alexandria")

# (file, correct text, seeded text): each bug makes one test fail, in both of the test-op's runs.
BUGS = [
    ("alexandria-1/numbers.lisp", "(%multiply-range (1+ (- n k)) n)", "(%multiply-range (- n k) n)"),
    ("alexandria-1/binding.lisp", "       (when (and ,@variables)", "       (when (or ,@variables)"),
    (
        "alexandria-1/lists.lisp",
        "                       (traverse (car subtree))\n                       (traverse (cdr subtree)))",
        "                       (traverse (cdr subtree))\n                       (traverse (car subtree)))",
    ),
]

FAILING = ["COUNT-PERMUTATIONS.1", "WHEN-LET.2", "FLATTEN.1"]


def alexandria_copy(parent):
    return seeded_copy("alexandria", parent, BUGS)


def mcp_path(server_binary, directory):
    """The expert's path over MCP; returns [(step, request characters, reply text, is_error)]."""
    server = started(server_binary, directory, "bugfix-path")
    patches = [
        ("alexandria-1/numbers.lisp", "defun", "count-permutations", "(- n k) n)", "(1+ (- n k)) n)"),
        ("alexandria-1/binding.lisp", "defmacro", "when-let", "(when (or", "(when (and"),
        (
            "alexandria-1/lists.lisp",
            "defun",
            "flatten",
            "(traverse (cdr subtree))\n                       (traverse (car subtree))",
            "(traverse (car subtree))\n                       (traverse (cdr subtree))",
        ),
    ]
    steps = [
        ("run-tests", {"system": "alexandria-tests"}),
        (
            "find-definition",
            {"symbol": "alexandria:count-permutations alexandria:when-let alexandria:flatten", "source": True},
        ),
        (
            "edit-lisp-form",
            {
                "edits": [
                    {
                        "file_path": os.path.join(directory, file),
                        "form_type": form_type,
                        "form_name": form_name,
                        "operation": "patch",
                        "old_text": old,
                        "new_text": new,
                    }
                    for file, form_type, form_name, old, new in patches
                ],
                "load": True,
            },
        ),
        ("run-tests", {"system": "alexandria-tests"}),
    ]
    return walk(server, steps)


# Prints each definition's text from its file, as an agent wrote it before find-definition took
# `source`.
READ_DEFINITIONS = """(dolist (name '(alexandria:count-permutations alexandria:when-let alexandria:flatten))
  (let* ((source (first (sb-introspect:find-definition-sources-by-name
                         name (if (macro-function name) :macro :function))))
         (file (sb-introspect:definition-source-pathname source))
         (text (uiop:read-file-string file))
         (start (sb-introspect:definition-source-character-offset source)))
    (format t "~A~%~A~%~%" file (subseq text start (nth-value 1 (read-from-string text t nil :start start))))))"""


def previous_path(server_binary, directory):
    """The path before `source`, `patch` and `edits`: each definition replaced whole."""
    server = started(server_binary, directory, "bugfix-path")
    replacements = []
    for file, form_type, form_name in [
        ("alexandria-1/numbers.lisp", "defun", "count-permutations"),
        ("alexandria-1/binding.lisp", "defmacro", "when-let"),
        ("alexandria-1/lists.lisp", "defun", "flatten"),
    ]:
        with open(os.path.join(ALEXANDRIA, file)) as f:
            text = f.read()
        fixed = form_at(text, text.index(f"({form_type} {form_name} "))
        replacements.append(
            (
                "edit-lisp-form",
                {
                    "file_path": os.path.join(directory, file),
                    "form_type": form_type,
                    "form_name": form_name,
                    "operation": "replace",
                    "content": fixed,
                    "load": True,
                },
            )
        )
    steps = [
        ("run-tests", {"system": "alexandria-tests"}),
        ("evaluate-lisp", {"code": READ_DEFINITIONS}),
        *replacements,
        ("run-tests", {"system": "alexandria-tests"}),
    ]
    return walk(server, steps)


def shell_path(directory):
    """The expert's path from a shell; returns [(command, command characters, output, exit code)]."""
    tests = test_op(directory, "alexandria-tests")
    sed = " && ".join(
        [
            "sed -i 's/(%multiply-range (- n k) n)/(%multiply-range (1+ (- n k)) n)/' alexandria-1/numbers.lisp",
            "sed -i 's/(when (or ,@variables)/(when (and ,@variables)/' alexandria-1/binding.lisp",
            "sed -i '/(defun flatten/,/nreverse/{s/(traverse (cdr subtree))/(traverse (TMP subtree))/;"
            "s/(traverse (car subtree))/(traverse (cdr subtree))/;s/(traverse (TMP subtree))/(traverse (car subtree))/}' "
            "alexandria-1/lists.lisp",
        ]
    )
    commands = [
        f"cd {directory} && {tests} | grep -E -A7 '^Test .* failed$|total tests failed'",
        # Each definition, headed by file:line, up to the next top-level form.
        f"cd {directory} && awk 'FNR==1{{p=0}} /^\\(/{{p=0}} "
        "/^\\((defun count-permutations|defmacro when-let|defun flatten) /{p=1; print FILENAME \":\" FNR} p' "
        "alexandria-1/*.lisp",
        f"cd {directory} && {sed} && {tests} | grep -E 'tests failed|^Test .* failed$'",
    ]
    return walk_shell(commands)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="the swank-mcp binary")
    parser.add_argument("--previous", help="a swank-mcp binary of a revision before source, patch and edits")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--show", action="store_true", help="print each reply and output too")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bugfix-path-") as parent:
        os.makedirs(os.path.join(parent, "mcp"))
        os.makedirs(os.path.join(parent, "shell"))
        mcp = mcp_path(os.path.abspath(options.server), alexandria_copy(os.path.join(parent, "mcp")))
        shell = shell_path(alexandria_copy(os.path.join(parent, "shell")))
        previous = None
        if options.previous:
            os.makedirs(os.path.join(parent, "previous"))
            previous = previous_path(os.path.abspath(options.previous), alexandria_copy(os.path.join(parent, "previous")))

    red, green = mcp[0][2], mcp[-1][2]
    assert red.startswith("FAILED") and all(test in red for test in FAILING), red
    assert not mcp[-1][3] and "all passed" in green, green
    assert all(test in shell[0][2] for test in FAILING), shell[0][2]
    assert "No tests failed." in shell[-1][2] and "tests failed:" not in shell[-1][2], shell[-1][2]

    figures = {
        "mcp": steps_with_total(mcp, lambda tool: tool),
        "shell": steps_with_total(shell, lambda command: command.split(" && ", 1)[1][:60]),
    }
    walks = [("swank-mcp", "mcp", mcp), ("shell", "shell", shell)]
    if previous:
        assert not previous[-1][3] and "No tests failed." in previous[-1][2], previous[-1][2]
        figures["previous"] = steps_with_total(previous, lambda tool: tool)
        walks.append(("swank-mcp, previous revision", "previous", previous))
    if options.json:
        print(json.dumps(figures, indent=2))
        return
    for name, key, walked in walks:
        print_path(name, figures[key], walked, options.show)
    mcp_total, shell_total = figures["mcp"][-1]["reply"], figures["shell"][-1]["reply"]
    print(f"reply characters, swank-mcp / shell: {mcp_total / shell_total:.2f}")
    if previous:
        previous_total = figures["previous"][-1]["reply"]
        print(f"reply characters, swank-mcp / previous revision: {mcp_total / previous_total:.2f}")


if __name__ == "__main__":
    sys.exit(main())
