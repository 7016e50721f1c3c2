"""Reply sizes: the bytes an agent reads back from a fixed script of 30 typical tool calls, so that
two builds of swank-mcp can be compared (before and after a change to what replies show).

Runs the given binary as an MCP server over stdio with --launch on a free port (so each run gets
a fresh private SBCL image and the same starting state), makes the 30 calls in order, and prints
one line per call: the bytes of the reply's text (what the model reads), the bytes of the whole
JSON-RPC response line (text, structured content and framing), and the call; then the totals.
Tokens are roughly bytes / 4 for this kind of text.

    python3 benches/reply_size.py --server target/release/swank-mcp [--max-output N] [--json]

Only tools every build since 756d97c offers are called, so the figures compare like with like.
"""

import argparse
import json

from mcp_stdio import Server, free_port

SETUP = """(defpackage :shop (:use :cl))
(in-package :shop)
(defclass item () ((sku :initarg :sku :accessor item-sku) (price :initarg :price :accessor item-price)
                   (tags :initarg :tags :initform nil :accessor item-tags)))
(defvar *items* (loop for i below 5000
                      collect (make-instance 'item :sku (format nil \"SKU-~5,'0D\" i) :price (* i 3)
                                                   :tags (list :new (if (evenp i) :even :odd)))))
(defun total-price (items) (reduce #'+ items :key #'item-price))
(defun report (items) (dolist (item items) (format t \"~A ~D~%\" (item-sku item) (item-price item))))
(length *items*)"""

# (tool, arguments): what an agent does in a first session with a small program.
SCRIPT = [
    ("evaluate-lisp", {"code": "(+ 1 2)"}),
    ("evaluate-lisp", {"code": SETUP}),
    ("evaluate-lisp", {"code": "(total-price shop::*items*)", "package": "SHOP"}),
    ("evaluate-lisp", {"code": "(first shop::*items*)"}),
    ("evaluate-lisp", {"code": "shop::*items*"}),
    ("evaluate-lisp", {"code": "(mapcar #'shop::item-sku shop::*items*)"}),
    ("evaluate-lisp", {"code": "(shop::report shop::*items*)"}),
    ("evaluate-lisp", {"code": "(shop::report (subseq shop::*items* 0 20))"}),
    ("evaluate-lisp", {"code": "(print (loop for i below 20000 collect i))"}),
    ("evaluate-lisp", {"code": "(make-string 100000 :initial-element #\\x)"}),
    ("evaluate-lisp", {"code": "(let ((h (make-hash-table))) (dotimes (i 1000 h) (setf (gethash i h) (* i i))))"}),
    ("evaluate-lisp", {"code": "(floor 17 5)"}),
    ("evaluate-lisp", {"code": "(/ 1 0)"}),
    ("evaluate-lisp", {"code": "(shop::no-such-function 1)"}),
    ("evaluate-lisp", {"code": "(defun shop::f (x) (let ((y 1)) x))"}),
    ("evaluate-lisp", {"code": "(describe 'shop::item)"}),
    ("evaluate-lisp", {"code": "(list-all-packages)"}),
    ("evaluate-lisp", {"code": "(apropos-list \"ITEM\" :shop)"}),
    ("evaluate-lisp", {"code": "(format nil \"~{~A~^, ~}\" (loop for i below 3000 collect i))"}),
    ("evaluate-lisp", {"code": "(room)"}),
    ("describe-symbol", {"symbol": "shop::item-price"}),
    ("describe-symbol", {"symbol": "mapcar"}),
    ("class-info", {"class": "item", "package": "SHOP"}),
    ("apropos-search", {"query": "item", "package": "SHOP"}),
    ("apropos-search", {"query": "string"}),
    ("macroexpand-form", {"form": "(loop for i below 10 collect i)"}),
    ("compile-form", {"code": "(defun shop::g (items) (mapcar #'shop::item-sku items))"}),
    ("find-definition", {"symbol": "shop::total-price"}),
    ("xref", {"symbol": "shop::item-price", "kind": "calls"}),
    ("lisp-status", {}),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="the swank-mcp binary to measure")
    parser.add_argument("--max-output", type=int, help="pass --max-output N (default: the binary's own default)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()

    command = [args.server, "--port", str(free_port()), "--launch", "--eval-timeout", "120s"]
    if args.max_output:
        command += ["--max-output", str(args.max_output)]
    server = Server(command, "reply-size-bench")
    rows = []
    for tool, arguments in SCRIPT:
        reply = server.call(tool, arguments)
        call = f"{tool} {json.dumps(arguments)}"
        rows.append({"call": call if len(call) <= 70 else call[:67] + "...",
                     "text_bytes": len(reply.text.encode()), "response_bytes": len(reply.line),
                     "error": reply.is_error})
    server.close()

    total_text = sum(row["text_bytes"] for row in rows)
    total_response = sum(row["response_bytes"] for row in rows)
    if args.json:
        print(json.dumps({"calls": rows, "text_bytes": total_text, "response_bytes": total_response}))
        return
    print(f"{'#':>2} {'text':>9} {'response':>9}  call")
    for number, row in enumerate(rows, 1):
        print(f"{number:>2} {row['text_bytes']:>9,} {row['response_bytes']:>9,}  {row['call']}"
              + ("  (error)" if row["error"] else ""))
    print(f"   {total_text:>9,} {total_response:>9,}  total over {len(rows)} calls "
          f"(about {total_text // 4:,} tokens of text)")


if __name__ == "__main__":
    main()
