"""The overhead bench's second client: the same comparison as benches/overhead.rs, made from
Python with the plainest calls there are (os.write and os.read on the server's pipes against
socket.sendall and recv on raw swank), interleaved against one image.

Run by `cargo bench --bench overhead`, which starts the image and passes its port, the
swank-mcp binary and the bench's own binary, which serves as the minimal relay (the floor of the
extra process hop), and, given a previous revision, that revision's binary and a second image for
it; it prints one line per measurement. Standalone:
    python3 benches/overhead_client.py --port 4005 --server target/release/swank-mcp [--calls 600] \
        [--relay target/release/deps/overhead-HASH] \
        [--baseline-server OLD/swank-mcp --baseline-port 4006]
"""

import argparse
import json
import os
import socket
import subprocess
import time

CODE = "(+ 1 2)"
# The start of the helper's reply to CODE, which the relay passes on as its text.
RELAYED_THREE = '(:return (:ok (:values (("3" 0))'


def percentile(sorted_times, p):
    return sorted_times[round((len(sorted_times) - 1) * p)]


class RawSwank:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.next_id = 1
        self.buffer = b""

    def frame(self):
        while len(self.buffer) < 6:
            self.buffer += self.sock.recv(65536)
        length = int(self.buffer[:6], 16)
        while len(self.buffer) < 6 + length:
            self.buffer += self.sock.recv(65536)
        payload, self.buffer = self.buffer[6:6 + length], self.buffer[6 + length:]
        return payload

    def eval_and_grab_output(self, code):
        request_id = self.next_id
        self.next_id += 1
        payload = f'(:emacs-rex (swank:eval-and-grab-output "{code}") "COMMON-LISP-USER" t {request_id})'.encode()
        self.sock.sendall(b"%06x" % len(payload) + payload)
        suffix = f" {request_id})".encode()
        while True:
            message = self.frame()
            if message.startswith(b"(:return") and message.endswith(suffix):
                return message


class Server:
    def __init__(self, command):
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.stdin = self.process.stdin.fileno()
        self.stdout = self.process.stdout.fileno()
        self.next_id = 1
        self.buffer = b""
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "bench.py", "version": "0"}})

    def line(self):
        while b"\n" not in self.buffer:
            chunk = os.read(self.stdout, 65536)
            if not chunk:
                raise RuntimeError("swank-mcp closed its stdout")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def request(self, method, params):
        request_id = self.next_id
        self.next_id += 1
        os.write(self.stdin, json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode() + b"\n")
        return self.line()

    def evaluate(self, code):
        """One tools/call with the request formatted in place, as the raw client formats its frame;
        the reply is parsed by the caller after the clock stops."""
        request_id = self.next_id
        self.next_id += 1
        os.write(self.stdin, b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"evaluate-lisp",'
                             b'"arguments":{"code":"%s"}}}\n' % (request_id, code.encode()))
        return self.line()

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=10)


def report(label, times):
    times = sorted(times)
    p50, p99 = percentile(times, 0.5), percentile(times, 0.99)
    print(f"  {label:<32} p50 {p50 * 1e6:8.1f} µs   p99 {p99 * 1e6:8.1f} µs")
    return p50, p99


def ratio_line(label, over, under):
    print(f"  {label:<32} p50 {over[0] / under[0]:8.2f}x     p99 {over[1] / under[1]:8.2f}x")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--relay", help="the overhead bench's binary, run as the minimal relay")
    parser.add_argument("--baseline-server", help="a previous revision's swank-mcp, measured in the same run")
    parser.add_argument("--baseline-port", type=int,
                        help="the image the previous revision talks to: an image of its own, as its helper differs")
    args = parser.parse_args()
    if bool(args.baseline_server) != bool(args.baseline_port):
        parser.error("--baseline-server and --baseline-port go together")
    raw = RawSwank(args.port)
    server = Server([args.server, "--port", str(args.port)])
    relay = Server([args.relay, "--relay", str(args.port)]) if args.relay else None
    baseline = None
    if args.baseline_server:
        baseline = (RawSwank(args.baseline_port), Server([args.baseline_server, "--port", str(args.baseline_port)]))
    for _ in range(50):
        raw.eval_and_grab_output(CODE)
        assert json.loads(server.evaluate(CODE))["result"]["content"][0]["text"] == "=> 3"
        if relay:
            assert json.loads(relay.evaluate(CODE))["result"]["content"][0]["text"].startswith(RELAYED_THREE)
        if baseline:
            baseline[0].eval_and_grab_output(CODE)
            assert json.loads(baseline[1].evaluate(CODE))["result"]["content"][0]["text"] == "=> 3"
    raw_times, mcp_times, relay_times, base_raw_times, base_times = [], [], [], [], []
    for _ in range(args.calls):
        started = time.perf_counter()
        raw.eval_and_grab_output(CODE)
        raw_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        reply = server.evaluate(CODE)
        mcp_times.append(time.perf_counter() - started)
        assert json.loads(reply)["result"]["content"][0]["text"] == "=> 3", reply
        if relay:
            started = time.perf_counter()
            reply = relay.evaluate(CODE)
            relay_times.append(time.perf_counter() - started)
            assert json.loads(reply)["result"]["content"][0]["text"].startswith(RELAYED_THREE), reply
        if baseline:
            started = time.perf_counter()
            baseline[0].eval_and_grab_output(CODE)
            base_raw_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            reply = baseline[1].evaluate(CODE)
            base_times.append(time.perf_counter() - started)
            assert json.loads(reply)["result"]["content"][0]["text"] == "=> 3", reply
    server.close()
    raw_p = report("raw swank:eval-and-grab-output", raw_times)
    mcp_p = report("evaluate-lisp through swank-mcp", mcp_times)
    ratio_line("ratio", mcp_p, raw_p)
    if relay:
        relay.close()
        relay_times.sort()
        relay50, relay99 = percentile(relay_times, 0.5), percentile(relay_times, 0.99)
        print(f"  floor: a minimal relay process   p50 {relay50 * 1e6:8.1f} µs   p99 {relay99 * 1e6:8.1f} µs"
              f"   ratio p50 {relay50 / raw_p[0]:.2f}x")
    if baseline:
        baseline[1].close()
        base_raw_p = report("baseline's image, raw swank", base_raw_times)
        base_p = report("the baseline's swank-mcp", base_times)
        ratio_line("baseline's ratio to raw swank", base_p, base_raw_p)
        ratio_line("this revision / the baseline", mcp_p, base_p)


if __name__ == "__main__":
    main()
