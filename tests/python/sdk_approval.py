"""--confirm with the official MCP Python SDK as the client, answering `elicitation/create`.

Usage: python3 sdk_approval.py SWANK_MCP_BINARY PORT AUDIT_LOG

The server runs with `--confirm evaluate-lisp`. A client with an elicitation callback is asked
before each evaluate-lisp call and sees the code: declining leaves the image unchanged and the
call an error saying "declined by the user"; accepting runs it; accepting with
allow_for_session runs later calls unasked. A client without the callback is refused with a
how-to-approve error. A file that changes while the human looks at what a load would compile is
not loaded once they accept. `tests/python_sdk.rs` runs this against a real image; it prints one
line per check and exits non-zero on the first failure.
"""

import asyncio
import json
import os
import sys
import tempfile

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from sdk_checks import check, text_of


def server(binary: str, port: str, audit_log: str) -> StdioServerParameters:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "RUST_LOG") if name in os.environ}
    return StdioServerParameters(
        command=binary,
        args=["--port", port, "--confirm", "evaluate-lisp", "--audit-log", audit_log],
        env=env,
    )


class Human:
    """Answers approval requests from a script of answers, and remembers what it was shown."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.shown = []

    async def __call__(self, context, params):
        self.shown.append(params.message)
        action, content = self.answers.pop(0)
        return types.ElicitResult(action=action, content=content)


async def with_elicitation(params: StdioServerParameters) -> None:
    human = Human([("decline", None), ("accept", {"allow_for_session": False}), ("accept", {"allow_for_session": True})])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, elicitation_callback=human) as session:
            await session.initialize()
            declined = await session.call_tool("evaluate-lisp", {"code": "(defparameter *approval-test* :declined)"})
            check(declined.is_error, "a declined call is an error", text_of(declined))
            check("declined by the user" in text_of(declined), "it says declined by the user", text_of(declined))
            check("(defparameter *approval-test* :declined)" in human.shown[0], "the human saw the code", human.shown[0])
            # A read-only tool is not in --confirm: it runs unasked.
            unset = await session.call_tool("describe-symbol", {"symbol": "*approval-test*"})
            check(len(human.shown) == 1, "describe-symbol was not asked about", human.shown)
            check("no value" in text_of(unset) or "names nothing" in text_of(unset) or "not found" in text_of(unset).lower(),
                  "the declined call changed nothing in the image", text_of(unset))
            accepted = await session.call_tool("evaluate-lisp", {"code": "(defparameter *approval-test* :accepted)"})
            check(not accepted.is_error and "*APPROVAL-TEST*" in text_of(accepted), "an accepted call runs", text_of(accepted))
            value = await session.call_tool("evaluate-lisp", {"code": "*approval-test*"})
            check(text_of(value) == "=> :ACCEPTED", "accepted for the session", text_of(value))
            again = await session.call_tool("evaluate-lisp", {"code": "(+ 1 2)"})
            check(text_of(again) == "=> 3" and len(human.shown) == 3, "later calls run unasked", (text_of(again), len(human.shown)))


async def without_elicitation(params: StdioServerParameters) -> None:
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            refused = await session.call_tool("evaluate-lisp", {"code": "(defparameter *approval-test* :unasked)"})
            text = text_of(refused)
            check(refused.is_error and "cannot ask for it" in text and "elicitation" in text,
                  "a client that cannot ask is refused with how to approve", text)
            status = await session.call_tool("lisp-status", {})
            check(not status.is_error, "tools outside --confirm run", text_of(status))


async def changed_after_preview(binary: str, port: str) -> None:
    """The human accepts a load-file after the file changed under the preview they read."""
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "bound.lisp")
        with open(path, "w", encoding="utf-8") as file:
            file.write("(defun cl-user::sdk-bound-file () 1)\n")

        class ChangingHuman(Human):
            async def __call__(self, context, params):
                with open(path, "w", encoding="utf-8") as file:
                    file.write("(defun cl-user::sdk-bound-file () 2)\n")
                return await super().__call__(context, params)

        human = ChangingHuman([("accept", {"allow_for_session": False})])
        env = {name: os.environ[name] for name in ("PATH", "HOME", "RUST_LOG") if name in os.environ}
        params = StdioServerParameters(command=binary, args=["--port", port, "--confirm", "load-file", "--root", root], env=env)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, elicitation_callback=human) as session:
                await session.initialize()
                loaded = await session.call_tool("load-file", {"file_path": path})
                check("(defun cl-user::sdk-bound-file () 1)" in human.shown[0], "the human saw the file as it was", human.shown[0])
                check(loaded.is_error and "changed between the preview the user was shown and their answer" in text_of(loaded),
                      "a file changed after its preview is refused", text_of(loaded))
                defined = await session.call_tool("evaluate-lisp", {"code": "(fboundp 'cl-user::sdk-bound-file)"})
                check(text_of(defined) == "=> NIL", "nothing was loaded", text_of(defined))


async def main() -> None:
    binary, port, audit_log = sys.argv[1], sys.argv[2], sys.argv[3]
    params = server(binary, port, audit_log)
    await asyncio.wait_for(with_elicitation(params), 60)
    await asyncio.wait_for(without_elicitation(params), 60)
    await asyncio.wait_for(changed_after_preview(binary, port), 60)
    entries = [json.loads(line) for line in open(audit_log, encoding="utf-8")]
    outcomes = [(entry["tool"], entry["outcome"]) for entry in entries]
    check(outcomes[:2] == [("evaluate-lisp", "not_approved"), ("describe-symbol", "error")], "the audit log records each call", outcomes)
    check(entries[0]["client"] == "mcp" and entries[0]["arguments"]["code"].startswith("(defparameter"),
          "audit entries name the client and the arguments", entries[0])
    check(("evaluate-lisp", "not_approved") == outcomes[-2], "the refused call is audited", outcomes)


if __name__ == "__main__":
    asyncio.run(main())
