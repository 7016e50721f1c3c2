"""What the MCP Python SDK clients of the test suite share: a check that says what held, and the
text of a tool result."""


def check(condition: bool, what: str, detail: object = "") -> None:
    if not condition:
        raise AssertionError(f"{what}: {detail}")
    print(f"ok: {what}")


def text_of(result) -> str:
    return "".join(block.text for block in result.content if block.type == "text")
