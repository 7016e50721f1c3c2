"""What the benches that replay a bug-fix path share (bugfix_path.py, session_cost.py, suspects.py): a
copy of a Debian-installed library with seeded bugs, registered ahead of Debian's; a swank-mcp server
on a private image that knows where it is; a definition's text read from its file; walking a path of
tool calls or of shell commands, counting the characters the agent writes and reads at each step.
"""

import json
import os
import shutil
import subprocess
import time

from mcp_stdio import Server, free_port

DEBIAN_SOURCES = "/usr/share/common-lisp/source"


def seeded_copy(library, parent, bugs):
    """A copy of Debian's `library` under `parent` with `bugs` ((file, correct, seeded) each, the
    correct text occurring once in its file) in; its directory."""
    directory = os.path.join(parent, library)
    shutil.copytree(os.path.join(DEBIAN_SOURCES, library), directory)
    for file, correct, seeded in bugs:
        path = os.path.join(directory, file)
        with open(path) as f:
            text = f.read()
        assert text.count(correct) == 1, (file, correct)
        with open(path, "w") as f:
            f.write(text.replace(correct, seeded))
    return directory


def form_at(text, start):
    """The form that begins at the first parenthesis from `start` in `text`: strings, comments and
    character names are skipped while the parentheses are counted."""
    at = text.index("(", start)
    depth, i = 0, at
    while i < len(text):
        c = text[i]
        if c == ";":
            i = text.find("\n", i)
            if i < 0:
                break
        elif c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif text.startswith("#\\", i):
            i += 2
        elif text.startswith("#|", i):
            i = text.index("|#", i) + 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return text[at : i + 1]
        i += 1
    return text[at:]


def registry_form(directory):
    """The form that makes ASDF find the systems under `directory` before Debian's."""
    return f'(asdf:initialize-source-registry (quote (:source-registry (:tree "{directory}/") :inherit-configuration)))'


def test_op(directory, system):
    """The shell command that runs `system`'s test-op on the copy in `directory`, its stderr with its
    stdout."""
    return (
        "sbcl --noinform --non-interactive --eval '(require :asdf)' "
        f"--eval '{registry_form(directory)}' --eval '(asdf:test-system \"{system}\")' 2>&1"
    )


def started(server_binary, directory, client):
    """A server on a private image that knows where the library is (not a step of the agent's)."""
    server = Server(
        [server_binary, "--launch", "--port", str(free_port()), "--root", directory, "--eval-timeout", "10m"],
        client,
    )
    registered = server.call("evaluate-lisp", {"code": f"(progn (require :asdf) {registry_form(directory)} t)"})
    assert not registered.is_error, registered.text
    return server


def tool_list_bytes(server):
    """The size of the `tools/list` response line (compact JSON), which a session reads once."""
    _, line = server.request("tools/list", {})
    return len(line.rstrip(b"\n"))


def walk(server, steps):
    """Makes the calls `steps` and closes the server; returns [(tool, request characters, reply
    text, is_error)]."""
    walked = []
    for tool, arguments in steps:
        reply = server.call(tool, arguments)
        walked.append((tool, len(json.dumps({"name": tool, "arguments": arguments})), reply.text, reply.is_error))
    server.close()
    return walked


def walk_shell(commands):
    """Runs each of `commands` with sh; returns [(command, command characters, output, exit code)]."""
    walked = []
    for index, command in enumerate(commands):
        if index:
            # File times count whole seconds: a fix written in the second the test-op compiled the
            # file would look as old as its fasl to ASDF, which would not recompile it. A person
            # takes longer than that between two commands.
            time.sleep(1.1)
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=900)
        walked.append((command, len(command), done.stdout + done.stderr, done.returncode))
    return walked


def steps_with_total(walked, name_of):
    """Each step's figures and a last one of their totals; `name_of` names a step from its first
    field (the tool, or the command)."""
    steps = [{"step": name_of(first), "request": request, "reply": len(text)} for first, request, text, _ in walked]
    steps.append({"step": "total", "request": sum(s["request"] for s in steps), "reply": sum(s["reply"] for s in steps)})
    return steps


def print_path(title, steps, walked, show):
    """The table of one path's steps; with `show`, each reply or output after it."""
    print(f"{title}: {len(walked)} calls")
    print(f"  {'request':>8} {'reply':>8}  step")
    for step in steps:
        print(f"  {step['request']:>8} {step['reply']:>8}  {step['step']}")
    if show:
        for first, _, text, _ in walked:
            print(f"\n--- {first[:100]}\n{text}")
    print()
