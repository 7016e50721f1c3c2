"""Drives the swank-mcp binary with the official MCP Python SDK (`pip install mcp`).

Usage: python3 sdk_e2e.py SWANK_MCP_BINARY PORT

Both client styles: `ClientSession` (the `initialize` handshake), and `mcp.Client` pinned to
revision 2026-07-28 (no handshake: every request carries its version and capabilities in `_meta`)
and in its auto mode, which probes `server/discover` and must now stay on 2026-07-28 instead of
falling back to `initialize`. `tests/python_sdk.rs` runs this against a real image; it prints one
line per check and exits non-zero on the first failure.
"""

import asyncio
import os
import sys

import anyio
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from sdk_checks import check, text_of

# Ours: the negotiated revision must be one swank-mcp implements.
HANDSHAKE_VERSIONS = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"}
STATELESS_VERSION = "2026-07-28"
TOOLS = {"evaluate-lisp", "edit-lisp-form", "lisp-check-parens", "lisp-outline"}


def server(binary: str, port: str) -> StdioServerParameters:
    # The SDK gives the child an allow-listed environment; say what it needs.
    env = {name: os.environ[name] for name in ("PATH", "HOME", "RUST_LOG") if name in os.environ}
    return StdioServerParameters(command=binary, args=["--port", port, "--structured-content"], env=env)


async def with_client_session(params: StdioServerParameters) -> None:
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check(init.server_info.name == "swank-mcp", "ClientSession: initialize names the server", init.server_info)
            check(init.protocol_version in HANDSHAKE_VERSIONS, "ClientSession: a supported version", init.protocol_version)
            tools = await session.list_tools()
            names = {tool.name for tool in tools.tools}
            check(TOOLS <= names, "ClientSession: tools/list has every tool", names)
            result = await session.call_tool(
                "evaluate-lisp", {"code": '(progn (format t "from the sdk~%") (values 3 :three))'}
            )
            text = text_of(result)
            check(not result.is_error, "ClientSession: evaluate-lisp succeeds", text)
            check(text == "[stdout]\nfrom the sdk\n\n=> 3\n=> :THREE", "ClientSession: output and values", text)
            check(result.structured_content["values"] == ["3", ":THREE"], "ClientSession: structuredContent", result.structured_content)
            failure = await session.call_tool("evaluate-lisp", {"code": "(car 42)"})
            check(failure.is_error and text_of(failure).startswith("[ERROR] TYPE-ERROR"), "ClientSession: a Lisp error is a tool error", text_of(failure))
            await session.send_ping()
            print("ok: ClientSession: ping")


async def with_client(params: StdioServerParameters) -> None:
    # mode "auto": server/discover first, which the server answers, so no initialize follows.
    async with Client(params) as client:
        check(client.protocol_version == STATELESS_VERSION, "auto Client: chose 2026-07-28", client.protocol_version)
        check(client.server_info.name == "swank-mcp", "auto Client: server info from server/discover", client.server_info)
        result = await client.call_tool("evaluate-lisp", {"code": "(* 6 7)"})
        check(not result.is_error and text_of(result) == "=> 42", "auto Client: evaluate-lisp", text_of(result))
        outline = await client.call_tool("lisp-check-parens", {"code": "(defun f (x)"})
        check("missing" in text_of(outline), "auto Client: a source tool", text_of(outline))


async def with_pinned_client(params: StdioServerParameters) -> None:
    async with Client(params, mode=STATELESS_VERSION) as client:
        check(client.protocol_version == STATELESS_VERSION, "pinned Client: 2026-07-28", client.protocol_version)
        tools = await client.list_tools()
        names = {tool.name for tool in tools.tools}
        check(TOOLS <= names, "pinned Client: tools/list has every tool", names)
        check(tools.ttl_ms > 0 and tools.cache_scope == "public", "pinned Client: tools/list cache hints", (tools.ttl_ms, tools.cache_scope))
        result = await client.call_tool("evaluate-lisp", {"code": '(progn (format t "stateless~%") (values 3 :three))'})
        check(text_of(result) == "[stdout]\nstateless\n\n=> 3\n=> :THREE", "pinned Client: evaluate-lisp", text_of(result))
        check(result.structured_content["values"] == ["3", ":THREE"], "pinned Client: structuredContent", result.structured_content)
        failure = await client.call_tool("evaluate-lisp", {"code": "(car 42)"})
        check(failure.is_error, "pinned Client: a Lisp error is a tool error", text_of(failure))
        # Cancelling the caller sends notifications/cancelled; the evaluation unwinds.
        await client.call_tool("evaluate-lisp", {"code": "(defvar cl-user::*sdk-cancel-state* :idle)"})
        slow = "(unwind-protect (progn (setf cl-user::*sdk-cancel-state* :running) (sleep 60)) (setf cl-user::*sdk-cancel-state* :unwound))"
        with anyio.move_on_after(1.5) as scope:
            await client.call_tool("evaluate-lisp", {"code": slow})
        check(scope.cancelled_caught, "pinned Client: the slow call was cancelled", scope)
        state = ""
        for _ in range(50):
            state = text_of(await client.call_tool("evaluate-lisp", {"code": "cl-user::*sdk-cancel-state*"}))
            if state == "=> :UNWOUND":
                break
            await anyio.sleep(0.1)
        check(state == "=> :UNWOUND", "pinned Client: cancelling stopped the evaluation", state)


async def main(binary: str, port: str) -> None:
    params = server(binary, port)
    # Bounded: a server that hangs on the probe must fail the test, not stall it.
    await asyncio.wait_for(with_client_session(params), timeout=60)
    await asyncio.wait_for(with_client(params), timeout=60)
    await asyncio.wait_for(with_pinned_client(params), timeout=60)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
