"""How soon a tool call is in the image's activity record (src/mcp/activity.rs,
src/lisp/activity.lisp), which the Emacs activity buffer shows.

Sends calls of `(sleep 0.3)` through the swank-mcp binary and polls the image over a raw swank
connection until the record says the call is running: the time from sending the call to its line
being in the image. (What the record costs a call: benches/overhead_client.py on a fresh image,
against a binary from before it on another; two helper versions must not share one image.)
Reuses the clients of benches/overhead_client.py. Standalone, like that script:
    python3 benches/activity_cost.py --port 4005 --server target/release/swank-mcp [--starts 50]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_client import RawSwank, Server, percentile  # noqa: E402


def p50_p99(times):
    ordered = sorted(times)
    return percentile(ordered, 0.5), percentile(ordered, 0.99)


def start_to_record(args):
    raw = RawSwank(args.port)
    server = Server([args.server, "--port", str(args.port)])
    delays = []
    for number in range(args.starts):
        marker = f"record-start-{os.getpid()}-{number}"
        code = f'(progn (quote {marker}) (sleep 0.3))'
        request_id = server.next_id
        server.next_id += 1
        started = time.perf_counter()
        os.write(server.stdin, json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                           "params": {"name": "evaluate-lisp", "arguments": {"code": code}}})
                 .encode() + b"\n")
        probe = (f'(let ((since (find-symbol \\"ACTIVITY-SINCE\\" \\"MCP-AGENT-HELPER\\"))) '
                 f'(and since (find-if (lambda (r) (and (search \\"{marker}\\" (getf r :input)) '
                 f'(eq (getf r :state) :running))) (second (funcall since 0))) t))')
        while b'"T"' not in raw.eval_and_grab_output(probe):
            pass
        delays.append(time.perf_counter() - started)
        server.line()
    server.close()
    p50, p99 = p50_p99(delays)
    print(f"  call sent -> running in the image's record   p50 {p50 * 1e3:6.2f} ms   p99 {p99 * 1e3:6.2f} ms"
          f"   ({args.starts} calls)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--starts", type=int, default=50)
    args = parser.parse_args()
    start_to_record(args)


if __name__ == "__main__":
    main()
