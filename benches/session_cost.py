"""What a session costs to fix seeded bugs in three real libraries: the calls an agent makes and the
characters it reads, over MCP with swank-mcp and from a shell, measured the same way.

Each library is one Debian installs (/usr/share/common-lisp/source), with its own test suite:

- esrap (cl-esrap), a PEG parser: a FiveAM suite of 95 tests, each body run interpreted and
  compiled. Two bugs in src/evaluator.lisp: `string=` for `string-equal` in case-insensitive
  matching, `char<` for `char<=` in character ranges (CHARACTER-RANGE, PARSE.CASE-INSENSITIVE and
  an example's test fail);
- anaphora (cl-anaphora): an RT suite of 60 tests. Three bugs in anaphora.lisp: `aprog1` returns
  its last form, `acond` a clause's lone test as T, `asif`'s else branch cannot set IT (APROG.1,
  ACOND.1, ASIF.2 fail);
- parse-number (cl-parse-number): a harness of its own, which prints a table of every value
  parsed and ends with `Unexpected failures: ...`. Two bugs in parse-number.lisp: `#o` read in
  radix 10, the `f` exponent marker made a double (three values fail).

For each, two copies are made in a temporary directory, registered as their own ASDF systems ahead
of Debian's, the bugs seeded in both. On one an expert's path over MCP (swank-mcp --launch, a
private SBCL image): run-tests; find-definition of the broken functions with `source: true`; one
edit-lisp-form call patching each with `load: true`; run-tests. On the other a shell's (sbcl
--non-interactive): the test-op with its output filtered to the failures (sed or grep), the broken
definitions printed by awk, the fixes by sed followed by the test-op again, its output filtered to
its summary. Both paths know the same: which functions to read once they have seen the failures,
and the fix. Each path must end with the whole suite passing, which the bench checks.

Prints, per library and path, each step's characters of request (what the agent writes) and reply
(what it reads), and a markdown table of the totals with the ratio of the replies, MCP over shell;
the `tools/list` response (compact JSON), which an MCP session reads once before its first call, in
a column of its own. With --previous, an earlier build's MCP path too, on a third copy, and the
ratio of this build's replies to its.

    python3 benches/session_cost.py --server target/release/swank-mcp [--previous OLD-BINARY]
        [--json] [--show] [--only NAME]
"""

import argparse
import json
import os
import sys
import tempfile

from seeded_library import (
    print_path,
    seeded_copy,
    started,
    steps_with_total,
    test_op,
    tool_list_bytes,
    walk,
    walk_shell,
)

# Each library: its Debian directory, the system whose test-op runs the suite, the bugs ((file,
# correct text, seeded text), each correct text once in its file), the tests or values the red run
# must name, the broken definitions (symbols for find-definition, operator and name for awk and
# edit-lisp-form), the fixes (as edit-lisp-form patches, and as a sed script of the shell's), how
# the shell filters the red and the green runs, and what its green run must show.
LIBRARIES = [
    {
        "name": "esrap",
        "framework": "FiveAM, 95 tests run two ways",
        "system": "esrap",
        "file": "src/evaluator.lisp",
        "bugs": [
            (
                "src/evaluator.lisp",
                "(string-equal string text :start2 position :end2 (+ position length))",
                "(string= string text :start2 position :end2 (+ position length))",
            ),
            (
                "src/evaluator.lisp",
                "(char<= (first range) char (second range))",
                "(char< (first range) char (second range))",
            ),
        ],
        "failing": ["CHARACTER-RANGE", "PARSE.CASE-INSENSITIVE"],
        "definitions": [
            ("defun", "match-terminal/case-insensitive-p", "esrap::match-terminal/case-insensitive-p"),
            ("defun", "exec-character-ranges", "esrap::exec-character-ranges"),
        ],
        "patches": [
            ("match-terminal/case-insensitive-p", "(string= string", "(string-equal string"),
            ("exec-character-ranges", "(char< (first", "(char<= (first"),
        ],
        # The same `string=` line is in the case-sensitive function just above: the fix is
        # addressed to the case-insensitive one's lines.
        "sed": "/(defun match-terminal\\/case-insensitive-p/,/^$/s/(string= /(string-equal /;"
        "s/(char< (first range)/(char<= (first range)/",
        # FiveAM's report: the counts, then each failure's details.
        "red_filter": "sed -n '/ Did .* checks/,$p'",
        "green_filter": "grep -E '^ *(Pass|Fail):'",
        "green_shows": lambda output: "Fail: 0" in output,
    },
    {
        "name": "anaphora",
        "framework": "RT, 60 tests",
        "system": "anaphora",
        "file": "anaphora.lisp",
        "bugs": [
            ("anaphora.lisp", "(anaphoric prog1 ,first ,@rest)", "(anaphoric progn ,first ,@rest)"),
            ("anaphora.lisp", "`(anaphoric if ,test it ,(rec rest))", "`(anaphoric if ,test t ,(rec rest))"),
            ("anaphora.lisp", "(symbolic ignore-first ,test ,else)", "(anaphoric ignore-first ,test ,else)"),
        ],
        "failing": ["APROG.1", "ACOND.1", "ASIF.2"],
        "definitions": [
            ("defmacro", "aprog1", "anaphora:aprog1"),
            ("defmacro", "acond", "anaphora:acond"),
            ("defmacro", "asif", "anaphora:asif"),
        ],
        "patches": [
            ("aprog1", "(anaphoric progn", "(anaphoric prog1"),
            ("acond", ",test t ,", ",test it ,"),
            ("asif", "(anaphoric ignore-first", "(symbolic ignore-first"),
        ],
        "sed": "s/(anaphoric progn ,first/(anaphoric prog1 ,first/;"
        "s/(anaphoric if ,test t ,/(anaphoric if ,test it ,/;"
        "s/(anaphoric ignore-first ,test ,else)/(symbolic ignore-first ,test ,else)/",
        # RT's report of each failure, from its header to its actual value.
        "red_filter": "sed -n '/^Test .* failed$/,/^Actual value/p'",
        "green_filter": "grep -E 'tests failed|^Test .* failed$'",
        "green_shows": lambda output: "No tests failed." in output,
    },
    {
        "name": "parse-number",
        "framework": "its own harness",
        "system": "parse-number",
        "file": "parse-number.lisp",
        "bugs": [
            ("parse-number.lisp", ":radix 8))", ":radix 10))"),
            ("parse-number.lisp", "((#\\f #\\F)\n     10.0f0)", "((#\\f #\\F)\n     10.0d0)"),
        ],
        "failing": ["#o-101/75", "21.4f2"],
        "definitions": [
            ("defun", "parse-real-number", "parse-number:parse-real-number"),
            ("defun", "base-for-exponent-marker", "org.mapcar.parse-number::base-for-exponent-marker"),
        ],
        "patches": [
            ("parse-real-number", ":radix 10))", ":radix 8))"),
            ("base-for-exponent-marker", "((#\\f #\\F)\n     10.0d0)", "((#\\f #\\F)\n     10.0f0)"),
        ],
        "sed": "s/:radix 10))/:radix 8))/;/((#\\\\f #\\\\F)/{n;s/10.0d0/10.0f0/}",
        # The harness's verdict lines (a table of every value precedes them).
        "red_filter": "grep -E 'Unexpected|Expected failures'",
        "green_filter": "grep -E 'Unexpected|Expected failures'",
        "green_shows": lambda output: output == "",
    },
]


def mcp_path(server_binary, library, directory):
    """The expert's path over MCP: [(tool, request characters, reply text, is_error)], and the size
    of the tool list the session read first."""
    server = started(server_binary, directory, "session-cost")
    tools = tool_list_bytes(server)
    edits = [
        {"form_type": form_type, "form_name": name, "operation": "patch", "old_text": old, "new_text": new}
        for (form_type, name, _), (_, old, new) in zip(library["definitions"], library["patches"])
    ]
    steps = [
        ("run-tests", {"system": library["system"]}),
        (
            "find-definition",
            {"symbol": " ".join(symbol for _, _, symbol in library["definitions"]), "source": True},
        ),
        ("edit-lisp-form", {"file_path": library["file"], "load": True, "edits": edits}),
        ("run-tests", {"system": library["system"]}),
    ]
    return walk(server, steps), tools


def shell_path(library, directory):
    """The expert's path from a shell: [(command, command characters, output, exit code)]."""
    tests = test_op(directory, library["system"])
    heads = "|".join(f"{form_type} {name}" for form_type, name, _ in library["definitions"]).replace("/", "\\/")
    commands = [
        f"cd {directory} && {tests} | {library['red_filter']}",
        # Each definition, headed by file:line, up to the next top-level form.
        f"cd {directory} && awk 'FNR==1{{p=0}} /^\\(/{{p=0}} /^\\(({heads}) /{{p=1; print FILENAME \":\" FNR}} p' "
        f"{library['file']}",
        f"cd {directory} && sed -i '{library['sed']}' {library['file']} && {tests} | {library['green_filter']}",
    ]
    return walk_shell(commands)


def measured(server_binary, library, parent, previous_binary=None):
    """The figures of both paths on `library`, each checked to go from red to green; with
    `previous_binary`, also the MCP path of that build, on a copy of its own."""
    copies = {}
    for path in ("mcp", "shell") + (("previous",) if previous_binary else ()):
        os.makedirs(os.path.join(parent, library["name"], path))
        copies[path] = seeded_copy(library["name"], os.path.join(parent, library["name"], path), library["bugs"])
    mcp, tools = mcp_path(server_binary, library, copies["mcp"])
    shell = shell_path(library, copies["shell"])
    previous = mcp_path(previous_binary, library, copies["previous"])[0] if previous_binary else None

    red, green = mcp[0][2], mcp[-1][2]
    # A test-op that signals when its tests fail (anaphora's does) makes the red run an error.
    assert (red.startswith("FAILED") or mcp[0][3]) and all(name in red for name in library["failing"]), red
    assert not mcp[2][3], mcp[2][2]
    assert not mcp[-1][3] and not green.startswith("FAILED"), green
    assert all(name in shell[0][2] for name in library["failing"]), shell[0][2]
    assert library["green_shows"](shell[-1][2]), shell[-1][2]
    return {
        "name": library["name"],
        "framework": library["framework"],
        "bugs": len(library["bugs"]),
        "tools_list": tools,
        "mcp": steps_with_total(mcp, lambda tool: tool),
        "shell": steps_with_total(shell, lambda command: command.split(" && ", 1)[1][:60]),
        "previous": steps_with_total(previous, lambda tool: tool) if previous else None,
        "walked": {"mcp": mcp, "shell": shell, "previous": previous},
    }


def table(results):
    rows = [
        "| library (tests, bugs) | swank-mcp calls | swank-mcp reply characters | shell calls "
        "| shell reply characters | replies, swank-mcp / shell | tools/list bytes, read once |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    with_previous = all(result["previous"] for result in results)
    if with_previous:
        rows[0] += " previous build's swank-mcp reply characters | this build / previous |"
        rows[1] += " --- | --- |"
    for result in results:
        mcp, shell = result["mcp"][-1]["reply"], result["shell"][-1]["reply"]
        row = (
            f"| {result['name']} ({result['framework']}; {result['bugs']} bugs) | {len(result['mcp']) - 1} "
            f"| {mcp:,} | {len(result['shell']) - 1} | {shell:,} | **{mcp / shell:.2f}** | {result['tools_list']:,} |"
        )
        if with_previous:
            previous = result["previous"][-1]["reply"]
            row += f" {previous:,} | **{mcp / previous:.2f}** |"
        rows.append(row)
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="the swank-mcp binary")
    parser.add_argument(
        "--previous", help="another swank-mcp binary (an earlier revision's) whose MCP path is measured too"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--show", action="store_true", help="print each reply and output too")
    parser.add_argument(
        "--only", choices=[library["name"] for library in LIBRARIES], help="measure this library alone"
    )
    options = parser.parse_args()

    server = os.path.abspath(options.server)
    libraries = [library for library in LIBRARIES if options.only in (None, library["name"])]
    with tempfile.TemporaryDirectory(prefix="session-cost-") as parent:
        previous = os.path.abspath(options.previous) if options.previous else None
        results = [measured(server, library, parent, previous) for library in libraries]

    if options.json:
        print(json.dumps([{k: v for k, v in result.items() if k != "walked"} for result in results], indent=2))
        return
    for result in results:
        for title, key in (("swank-mcp", "mcp"), ("shell", "shell"), ("previous build's swank-mcp", "previous")):
            if result[key]:
                print_path(f"{result['name']}, {title}", result[key], result["walked"][key], options.show)
    print(table(results))


if __name__ == "__main__":
    sys.exit(main())
