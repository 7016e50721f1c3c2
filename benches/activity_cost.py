"""What the Emacs activity feed (src/lisp/activity.lisp) costs a tool call, closed and open.

Interleaves rounds of `evaluate-lisp "(+ 1 2)"` through the swank-mcp binary with the feed closed
(no Emacs watching: the image records nothing) and open (the watch lease that an open
*swank-mcp activity* buffer renews, set here over a raw swank connection), against one image. Reuses the clients of
benches/overhead_client.py. Standalone, like that script:
    python3 benches/activity_cost.py --port 4005 --server target/release/swank-mcp [--calls 1000]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_client import CODE, RawSwank, Server, percentile  # noqa: E402

import time  # noqa: E402

OPEN = "(setf mcp-agent-helper::*activity-watched-until* (+ (get-internal-real-time) (* 3600 internal-time-units-per-second)))"
CLOSED = "(setf mcp-agent-helper::*activity-watched-until* 0)"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    raw = RawSwank(args.port)
    server = Server(args.server, args.port)
    for _ in range(100):
        assert json.loads(server.evaluate(CODE))["result"]["content"][0]["text"] == "=> 3"
    times = {"closed": [], "open": []}
    for round_number in range(args.rounds):
        for state in ("closed", "open") if round_number % 2 == 0 else ("open", "closed"):
            raw.eval_and_grab_output(OPEN if state == "open" else CLOSED)
            for _ in range(args.calls):
                started = time.perf_counter()
                reply = server.evaluate(CODE)
                times[state].append(time.perf_counter() - started)
                assert json.loads(reply)["result"]["content"][0]["text"] == "=> 3", reply
    raw.eval_and_grab_output(CLOSED)
    server.close()
    closed50 = percentile(sorted(times["closed"]), 0.5)
    for state in ("closed", "open"):
        ordered = sorted(times[state])
        p50, p99 = percentile(ordered, 0.5), percentile(ordered, 0.99)
        print(f"  evaluate-lisp, feed {state:6}  p50 {p50 * 1e6:8.1f} µs   p99 {p99 * 1e6:8.1f} µs   "
              f"p50 vs closed {p50 / closed50:5.3f}x")


if __name__ == "__main__":
    main()
