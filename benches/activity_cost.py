"""What an open Emacs activity buffer (src/lisp/activity.lisp) costs a tool call.

Interleaves rounds of `evaluate-lisp "(+ 1 2)"` through the swank-mcp binary with the feed closed
(no Emacs subscribed: the server's notes go into the image's record, which tells nobody) and open
(a raw swank connection subscribed with the form an *swank-mcp activity* buffer sends, printed by
elisp-compat/swank-mcp.el in a batch Emacs, and told of every change), against one image. Reuses the clients of
benches/overhead_client.py. Standalone, like that script:
    python3 benches/activity_cost.py --port 4005 --server target/release/swank-mcp [--calls 1000]
"""

import argparse
import json
import os
import queue
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_client import CODE, RawSwank, Server, percentile  # noqa: E402

import time  # noqa: E402

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "elisp-compat", "swank-mcp.el")


def subscription_form(function, *arguments):
    """The form FUNCTION of swank-mcp.el makes for channel 1, as Lisp text in a Lisp string."""
    printed = subprocess.run(
        ["emacs", "--batch", "-Q", "-l", PACKAGE, "--eval",
         f"(princ (prin1-to-string ({function} swank-mcp--slime 1 {' '.join(arguments)})))"],
        check=True, capture_output=True, text=True).stdout
    return printed.replace("\\", "\\\\").replace('"', '\\"')


class DrainedSwank(RawSwank):
    """A raw swank connection whose messages a thread reads as they come, so that the image's
    messages to the subscribed channel never fill the socket."""

    def __init__(self, port):
        super().__init__(port)
        self.frames = queue.Queue()
        threading.Thread(target=self.drain, daemon=True).start()

    def drain(self):
        while True:
            self.frames.put(RawSwank.frame(self))

    def frame(self):
        return self.frames.get()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    raw = DrainedSwank(args.port)
    subscribe = subscription_form("swank-mcp--subscribe-form", ":activity")
    unsubscribe = subscription_form("swank-mcp--unsubscribe-form")
    server = Server([args.server, "--port", str(args.port)])
    for _ in range(100):
        assert json.loads(server.evaluate(CODE))["result"]["content"][0]["text"] == "=> 3"
    times = {"closed": [], "open": []}
    for round_number in range(args.rounds):
        for state in ("closed", "open") if round_number % 2 == 0 else ("open", "closed"):
            raw.eval_and_grab_output(subscribe if state == "open" else unsubscribe)
            for _ in range(args.calls):
                started = time.perf_counter()
                reply = server.evaluate(CODE)
                times[state].append(time.perf_counter() - started)
                assert json.loads(reply)["result"]["content"][0]["text"] == "=> 3", reply
    raw.eval_and_grab_output(unsubscribe)
    server.close()
    closed50 = percentile(sorted(times["closed"]), 0.5)
    for state in ("closed", "open"):
        ordered = sorted(times[state])
        p50, p99 = percentile(ordered, 0.5), percentile(ordered, 0.99)
        print(f"  evaluate-lisp, feed {state:6}  p50 {p50 * 1e6:8.1f} µs   p99 {p99 * 1e6:8.1f} µs   "
              f"p50 vs closed {p50 / closed50:5.3f}x")


if __name__ == "__main__":
    main()
