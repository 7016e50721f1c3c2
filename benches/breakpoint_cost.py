"""What a breakpoint whose condition is false costs each call of its function (issue 37).

Through the swank-mcp binary with --launch (a private image on a free port): defines a small
function, then times a loop of calls of it in a thread of the image (the agent's own tool calls
never stop at a breakpoint, so the loop runs where the person's threads do), in rounds that
alternate between no breakpoint and a breakpoint whose condition never holds. Prints each round's
nanoseconds per call, the medians, and their ratio; both are measured in the same run.
    python3 benches/breakpoint_cost.py --server target/release/swank-mcp [--calls 200000] [--rounds 5]
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcp_stdio import Server, free_port  # noqa: E402

SETUP = """(progn
  (defpackage :bp-bench (:use :cl))
  (in-package :bp-bench))"""

DEFINITIONS = """(progn
  (defun target (x) (1+ x))
  (defun time-calls (n)
    (let ((thread (sb-thread:make-thread
                   (lambda ()
                     (let ((start (get-internal-real-time)))
                       (dotimes (i n) (target i))
                       (- (get-internal-real-time) start))))))
      (round (* (sb-thread:join-thread thread) (/ 1000000000 internal-time-units-per-second) 10) n))))"""


def value(reply):
    """Nanoseconds per call: the image answers tenths of them."""
    if reply.is_error:
        raise RuntimeError(reply.text)
    return int(reply.text.split()[1]) / 10


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="target/release/swank-mcp")
    parser.add_argument("--calls", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    server = Server([arguments.server, "--launch", "--port", str(free_port())], "breakpoint-bench")
    try:
        server.call("evaluate-lisp", {"code": SETUP})
        defined = server.call("evaluate-lisp", {"code": DEFINITIONS, "package": "BP-BENCH"})
        if defined.is_error:
            raise RuntimeError(defined.text)
        timing = {"code": f"(time-calls {arguments.calls})", "package": "BP-BENCH"}
        value(server.call("evaluate-lisp", timing))  # warm up
        plain, broken = [], []
        for _ in range(arguments.rounds):
            plain.append(value(server.call("evaluate-lisp", timing)))
            set_reply = server.call("debugger", {"action": "break", "function": "bp-bench::target", "condition": "(< x 0)"})
            if set_reply.is_error:
                raise RuntimeError(set_reply.text)
            broken.append(value(server.call("evaluate-lisp", timing)))
            server.call("debugger", {"action": "unbreak"})
        print(f"{arguments.calls:,} calls of (target i) in a thread of the image, {arguments.rounds} rounds")
        print(f"  without a breakpoint:            {plain} ns/call, median {statistics.median(plain)}")
        print(f"  with one whose condition fails:  {broken} ns/call, median {statistics.median(broken)}")
        print(f"  ratio: {statistics.median(broken) / max(statistics.median(plain), 1):.1f}x")
    finally:
        server.close()


if __name__ == "__main__":
    main()
