"""--confirm with the official MCP Python SDK as the client, answering `elicitation/create`.

Usage: python3 sdk_approval.py SWANK_MCP_BINARY PORT AUDIT_LOG

The server runs with `--confirm evaluate-lisp`. A client with an elicitation callback is asked
before each evaluate-lisp call and sees the code, through `elicitation/create` after the
`initialize` handshake and through an `input_required` round in revision 2026-07-28: declining leaves the image unchanged and the
call an error saying "declined by the user"; accepting runs it; accepting with
allow_for_session runs later calls unasked. A client without the callback is refused with a
how-to-approve error. A file that changes while the human looks at what a load would compile is
not loaded once they accept. In 2026-07-28 an answer approves the call it was asked about, once:
brought to another call, or again, it runs nothing. `tests/python_sdk.rs` runs this against a real image; it prints one
line per check and exits non-zero on the first failure.
"""

import asyncio
import contextlib
import json
import os
import sys
import tempfile

from mcp import Client, ClientSession, StdioServerParameters, types
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


async def changed_after_preview(binary: str, port: str, stateless: bool) -> None:
    """The human accepts a load-file after the file changed under the preview they read: through
    `elicitation/create` after the handshake, or through an input_required round in 2026-07-28."""
    era = "2026-07-28: " if stateless else ""
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
        async with contextlib.AsyncExitStack() as stack:
            if stateless:
                client = await stack.enter_async_context(Client(params, mode="2026-07-28", elicitation_callback=human))
            else:
                read, write = await stack.enter_async_context(stdio_client(params))
                client = await stack.enter_async_context(ClientSession(read, write, elicitation_callback=human))
                await client.initialize()
            loaded = await client.call_tool("load-file", {"file_path": path})
            check("(defun cl-user::sdk-bound-file () 1)" in human.shown[0], era + "the human saw the file as it was", human.shown[0])
            check(loaded.is_error and "changed between the preview the user was shown and their answer" in text_of(loaded),
                  era + "a file changed after its preview is refused", text_of(loaded))
            defined = await client.call_tool("evaluate-lisp", {"code": "(fboundp 'cl-user::sdk-bound-file)"})
            check(text_of(defined) == "=> NIL", era + "nothing was loaded", text_of(defined))


async def stateless_rounds(params: StdioServerParameters) -> None:
    """The same approvals in revision 2026-07-28: the SDK answers each input_required round."""
    human = Human([("decline", None), ("accept", None)])
    async with Client(params, mode="2026-07-28", elicitation_callback=human) as client:
        declined = await client.call_tool("evaluate-lisp", {"code": "(defparameter *stateless-approval* :declined)"})
        check(declined.is_error and "declined by the user" in text_of(declined), "2026-07-28: a declined call is an error", text_of(declined))
        check("(defparameter *stateless-approval* :declined)" in human.shown[0], "2026-07-28: the human saw the code", human.shown)
        accepted = await client.call_tool("evaluate-lisp", {"code": "(defparameter *stateless-approval* :accepted)"})
        check(not accepted.is_error and "*STATELESS-APPROVAL*" in text_of(accepted), "2026-07-28: an accepted call runs", text_of(accepted))
        # Driven by hand: the answer to one call's round, brought to another call or brought twice.
        session = client.session
        first = await session.call_tool("evaluate-lisp", {"code": "(defparameter *stateless-approval* :first)"}, allow_input_required=True)
        check(isinstance(first, types.InputRequiredResult) and first.request_state, "2026-07-28: a round asks", first)
        key = next(iter(first.input_requests))
        yes = {key: types.ElicitResult(action="accept", content={})}
        other = await session.call_tool("evaluate-lisp", {"code": "(defparameter *stateless-approval* :other)"},
                                        input_responses=yes, request_state=first.request_state, allow_input_required=True)
        check(other.is_error and "given for another call" in text_of(other), "2026-07-28: an answer approves no other call", text_of(other))
        ran = await session.call_tool("evaluate-lisp", {"code": "(defparameter *stateless-approval* :first)"},
                                      input_responses=yes, request_state=first.request_state, allow_input_required=True)
        check(not ran.is_error, "2026-07-28: the call answered runs", text_of(ran))
        again = await session.call_tool("evaluate-lisp", {"code": "(defparameter *stateless-approval* :first)"},
                                        input_responses=yes, request_state=first.request_state, allow_input_required=True)
        check(again.is_error and "already used" in text_of(again), "2026-07-28: an answer is used once", text_of(again))
        forged = first.request_state[:-3] + "xyz"
        try:
            await session.call_tool("evaluate-lisp", {"code": "(defparameter *stateless-approval* :first)"},
                                    input_responses=yes, request_state=forged, allow_input_required=True)
            check(False, "2026-07-28: an altered requestState is refused")
        except Exception as error:  # MCPError
            check(getattr(error, "code", None) == -32602, "2026-07-28: an altered requestState is invalid params", error)
        value = await client.call_tool("describe-symbol", {"symbol": "*stateless-approval*"})
        check(":OTHER" not in text_of(value), "2026-07-28: the other call did not run", text_of(value))


async def main() -> None:
    binary, port, audit_log = sys.argv[1], sys.argv[2], sys.argv[3]
    params = server(binary, port, audit_log)
    await asyncio.wait_for(with_elicitation(params), 60)
    await asyncio.wait_for(without_elicitation(params), 60)
    await asyncio.wait_for(changed_after_preview(binary, port, stateless=False), 60)
    entries = [json.loads(line) for line in open(audit_log, encoding="utf-8")]
    outcomes = [(entry["tool"], entry["outcome"]) for entry in entries]
    check(outcomes[:2] == [("evaluate-lisp", "not_approved"), ("describe-symbol", "error")], "the audit log records each call", outcomes)
    check(entries[0]["client"] == "mcp" and entries[0]["arguments"]["code"].startswith("(defparameter"),
          "audit entries name the client and the arguments", entries[0])
    check(("evaluate-lisp", "not_approved") == outcomes[-2], "the refused call is audited", outcomes)
    await asyncio.wait_for(stateless_rounds(params), 60)
    await asyncio.wait_for(changed_after_preview(binary, port, stateless=True), 60)


if __name__ == "__main__":
    asyncio.run(main())
