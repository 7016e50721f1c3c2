"""The session bench's blind path: what fixing a seeded bug costs an agent that does not know
where the bug is and reads only what the replies (or the shell's output) name, over MCP with
swank-mcp and from a shell, counted the same way: calls, and the characters the agent reads.

One bug at a time (suspects.py's BUGS: Alexandria, anaphora, esrap, split-sequence, iterate,
ieee-floats, nibbles, each with a suite of its own) is seeded into a copy of the Debian library.

- MCP: the tool list and the instructions, read once; run-tests (red); find-definition with
  `source` of each suspect the reply names, in its order, down to the definition at fault; when
  none of them is it, the system's files listed (find-definition `system`) and each read with
  lisp-outline `source`, page by page, alphabetically, down to the file at fault; edit-lisp-form patching it with `load`;
  run-tests (green).
- Shell: the test-op with its output's last 60 lines (`| tail -n 60`), and again whole (as far as
  a shell tool shows it, 30,000 characters) when those name no failing test; the definition of each
  failing test that output names (at most 5; `sed -n` of the form's lines); the definitions of the
  system's code those tests' forms name; when none of them is at fault, the files listed (`find`)
  and each read whole (`cat`) in the same order down to the file at fault; the fix (`sed -i`, which prints
  nothing); the test-op again with its last 20 lines.

Both paths stop reading at the definition (or the file) that holds the seeded change, which is
where an agent that reads it sees the bug. Prints a row per bug, then per library the calls and
characters of each path, their ratio (MCP over shell, the tool list included) and how often the
definition at fault was among the first three suspects.

    python3 benches/blind_session.py --server target/release/swank-mcp [--only LIBRARY] [--show]
"""

import json
import os
import re
import subprocess
import tempfile
import time

from seeded_library import seeded_copy, started, test_op, tool_list_bytes
from suspects import (
    arguments_and_bugs,
    code_definitions,
    failing_tests,
    lisp_files,
    names_in,
    rank_of,
    suspect_names,
    test_form,
)

# The definition at fault as edit-lisp-form names it: (form type, form name), by the name the
# reply gives it; a clause iterate's DEFCLAUSE makes is named by its template.
FORMS = {
    "ALEXANDRIA:COUNT-PERMUTATIONS": ("defun", "count-permutations"),
    "ALEXANDRIA:WHEN-LET": ("defmacro", "when-let"),
    "ALEXANDRIA:FLATTEN": ("defun", "flatten"),
    "ANAPHORA:APROG1": ("defmacro", "aprog1"),
    "ANAPHORA:ACOND": ("defmacro", "acond"),
    "ANAPHORA:ASIF": ("defmacro", "asif"),
    "ESRAP::EXEC-CHARACTER-RANGES": ("defun", "exec-character-ranges"),
    "ESRAP::MATCH-TERMINAL/CASE-INSENSITIVE-P": ("defun", "match-terminal/case-insensitive-p"),
    "SPLIT-SEQUENCE::SPLIT-VECTOR-FROM-START": ("defun", "split-vector-from-start"),
    "SPLIT-SEQUENCE::SPLIT-LIST-FROM-END": ("defun", "split-list-from-end"),
    "ITERATE::CLAUSE-MULTIPLY-24": ("defclause", "(multiply expr &optional into var)"),
    "ITERATE::RETURN-REDUCTION-CODE": ("defun", "return-reduction-code"),
    "ITERATE::CLAUSE-THEREIS-32": ("defclause", "(thereis expr)"),
    "IEEE-FLOATS:MAKE-FLOAT-CONVERTERS": ("defmacro", "make-float-converters"),
    "NIBBLES::READ-FRESH-SEQUENCE": ("defun", "read-fresh-sequence"),
    "NIBBLES::WRITE-SEQUENCE-WITH-WRITER": ("defun", "write-sequence-with-writer"),
}


# The characters a shell tool shows of one command's output (Claude Code's bash tool cuts there).
SHELL_TOOL_LIMIT = 30_000


def code_files(files):
    """The library's code files of `files` ({path: text}), in the order both paths read them when no
    reply names the definition at fault: alphabetical, the tests left out."""
    return sorted(path for path in files if "test" not in path.lower())


def initialize_bytes(server):
    """The tool list's response line and the instructions, which a session reads once."""
    return tool_list_bytes(server) + len(server.initialized["result"].get("instructions", ""))


def mcp_path(server, directory, system, bug, at_fault):
    """[(step, characters read)] of the MCP path, the rank of the definition at fault among the
    suspects (None when not named), and the replies."""
    file, correct, seeded = bug
    steps, replies = [("tools/list + instructions", initialize_bytes(server))], []

    def call(tool, arguments):
        reply = server.call(tool, arguments)
        steps.append((f"{tool} {json.dumps(arguments)[:70]}", len(reply.text)))
        replies.append(reply.text)
        return reply

    red = call("run-tests", {"system": system})
    named = suspect_names(red.text)
    rank = rank_of(named, at_fault)
    for _, name in named:
        call("find-definition", {"symbol": name, "source": True})
        if name == at_fault:
            break
    if rank is None:
        call("find-definition", {"system": system})
        for path in code_files(lisp_files(directory)):
            offset = 0
            while offset is not None:
                page = call("lisp-outline", {"file_path": os.path.join(directory, path), "source": True, "offset": offset})
                more = re.search(r"`offset: (\d+)`", page.text)
                offset = int(more.group(1)) if more else None
            if path == file:
                break
    form_type, form_name = FORMS[at_fault]
    edit = call(
        "edit-lisp-form",
        {"file_path": os.path.join(directory, file), "form_type": form_type, "form_name": form_name,
         "operation": "patch", "old_text": seeded, "new_text": correct, "load": True},
    )
    green = call("run-tests", {"system": system})
    return steps, rank, replies, not edit.is_error and green.text.startswith("PASSED")


def shell_path(directory, system, bug, at_fault):
    """[(step, characters read)] of the shell path, and whether it reached the definition at fault
    from what the output named."""
    file, correct, seeded = bug
    steps = []

    def run(command, label):
        output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=900).stdout
        steps.append((label, len(output)))
        return output

    red = run(f"{test_op(directory, system)} | tail -n 60", "test-op | tail -n 60")
    if not failing_tests(red):
        # A backtrace filled the last lines: the whole output, as far as a shell tool shows it.
        red = run(f"{test_op(directory, system)} | head -c {SHELL_TOOL_LIMIT}", "test-op (the whole output)")
    files = lisp_files(directory)
    code = code_definitions(files, r"^\((?:[\w-]+:+)?def[\w-]*\s+\(?([^\s()]+)")
    named = []
    for test in failing_tests(red)[:5]:
        form = test_form(files, re.sub(r"\.(COMPILED|INTERPRETED|VECTOR|LIST|EXTENDED-SEQUENCE)$", "", test), r"^\s*\(")
        if form:
            steps.append((f"sed -n (test {test})", len(form)))
            named += names_in(form, code)
    reached = False
    for name in dict.fromkeys(named):
        path, form = code[name]
        steps.append((f"sed -n ({name.lower()})", len(form)))
        if seeded in form:
            reached = True
            break
    if not reached:
        run(f"cd {directory} && find . -name '*.lisp'", "find . -name '*.lisp'")
        for path in code_files(files):
            steps.append((f"cat {path}", len(files[path])))
            if path == file:
                break
    with open(os.path.join(directory, file)) as f:
        text = f.read()
    with open(os.path.join(directory, file), "w") as f:
        f.write(text.replace(seeded, correct))
    steps.append(("sed -i (the fix)", 0))
    # File times count whole seconds: a fix in the second the test-op compiled the file would look
    # as old as its fasl to ASDF.
    time.sleep(1.1)
    run(f"{test_op(directory, system)} | tail -n 20", "test-op | tail -n 20")
    return steps, reached


def main():
    args, bugs = arguments_and_bugs()
    per_library = {}
    print(f"{'library':<18} {'at fault':<42} {'rank':>4} {'mcp calls':>9} {'mcp chars':>9} "
          f"{'sh calls':>8} {'sh chars':>8} {'reached':>7} {'ratio':>5}")
    for library, system, bug, at_fault in bugs:
        with tempfile.TemporaryDirectory() as parent:
            mcp_copy = seeded_copy(library, os.path.join(parent, "mcp"), [bug])
            shell_copy = seeded_copy(library, os.path.join(parent, "shell"), [bug])
            server = started(args.server, mcp_copy, "blind-session-bench")
            mcp_steps, rank, replies, mcp_green = mcp_path(server, mcp_copy, system, bug, at_fault)
            server.close()
            shell_steps, reached = shell_path(shell_copy, system, bug, at_fault)
        mcp_chars = sum(chars for _, chars in mcp_steps)
        shell_chars = sum(chars for _, chars in shell_steps)
        # The tool list is read once, not a call.
        mcp_calls, shell_calls = len(mcp_steps) - 1, len(shell_steps)
        totals = per_library.setdefault(library, [0, 0, 0, 0, 0, 0])
        for i, value in enumerate([mcp_calls, mcp_chars, shell_calls, shell_chars, rank is not None and rank <= 3, 1]):
            totals[i] += value
        print(f"{library:<18} {at_fault:<42} {rank or '-':>4} {mcp_calls:>9} {mcp_chars:>9} {shell_calls:>8} "
              f"{shell_chars:>8} {'yes' if reached else 'no':>7} {mcp_chars / shell_chars:>5.2f}"
              f"{'' if mcp_green else '  (the MCP path did not end green)'}")
        if args.show:
            for (step, chars), text in zip(mcp_steps[1:], replies):
                print(f"--- mcp {step} ({chars})\n{text}")
            for step, chars in shell_steps:
                print(f"--- shell {step} ({chars})")
    print()
    print("| library | bugs | at fault among the first 3 suspects | MCP calls | MCP characters | shell calls "
          "| shell characters | MCP / shell |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for library, (mc, mch, sc, sch, among, bugs) in per_library.items():
        print(f"| {library} | {bugs} | {among} | {mc} | {mch:,} | {sc} | {sch:,} | {mch / sch:.2f} |")
    all_mcp = sum(t[1] for t in per_library.values())
    all_shell = sum(t[3] for t in per_library.values())
    print(f"\nAll bugs: MCP {all_mcp:,} characters, shell {all_shell:,}: {all_mcp / all_shell:.2f}.")


if __name__ == "__main__":
    main()
