"""The MCP client of the benches that count what replies hold (reply_size.py, bugfix_path.py, session_cost.py): the
swank-mcp binary over stdio, one request at a time, each response kept as the line it came in.
"""

import json
import socket
import subprocess
from collections import namedtuple

# A tool's reply: the text the agent reads, whether it is an error, and the whole response line.
Reply = namedtuple("Reply", "text is_error line")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """swank-mcp run as `command`, initialized as the MCP client named `client`."""

    def __init__(self, command, client):
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.next_id = 1
        # The response to initialize: its instructions are read once, as the tool list is.
        self.initialized, _ = self.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": client, "version": "0"}},
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message):
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def request(self, method, params):
        """The response to `method` and its line."""
        request_id = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the server exited during {method}")
            response = json.loads(line)
            if response.get("id") == request_id:
                return response, line

    def call(self, tool, arguments):
        response, line = self.request("tools/call", {"name": tool, "arguments": arguments})
        if "result" not in response:
            raise RuntimeError(f"{tool} was answered {response}")
        result = response["result"]
        text = "".join(part.get("text", "") for part in result["content"])
        return Reply(text, bool(result.get("isError")), line)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)
