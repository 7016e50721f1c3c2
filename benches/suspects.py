"""How often a red run-tests reply names the definition at fault among its first three suspects:
one bug at a time seeded into a copy of a Debian-installed library, its suite run once by run-tests
on a private image (swank-mcp --launch). Prints, per bug, the rank of the definition at fault (or
-), the suspects named first, and the reply's characters; then how many bugs were found among the
first three.

    python3 benches/suspects.py --server target/release/swank-mcp [--show]
"""

import argparse
import json
import tempfile

from seeded_library import seeded_copy, started

# (library, system, (file, correct, seeded), the definition at fault as the reply names it)
BUGS = [
    ("alexandria", "alexandria-tests",
     ("alexandria-1/numbers.lisp", "(%multiply-range (1+ (- n k)) n)", "(%multiply-range (- n k) n)"),
     "ALEXANDRIA:COUNT-PERMUTATIONS"),
    ("alexandria", "alexandria-tests",
     ("alexandria-1/binding.lisp", "       (when (and ,@variables)", "       (when (or ,@variables)"),
     "ALEXANDRIA:WHEN-LET"),
    ("alexandria", "alexandria-tests",
     ("alexandria-1/lists.lisp",
      "                       (traverse (car subtree))\n                       (traverse (cdr subtree)))",
      "                       (traverse (cdr subtree))\n                       (traverse (car subtree)))"),
     "ALEXANDRIA:FLATTEN"),
    ("anaphora", "anaphora",
     ("anaphora.lisp", "(anaphoric prog1 ,first ,@rest)", "(anaphoric progn ,first ,@rest)"), "ANAPHORA:APROG1"),
    ("anaphora", "anaphora",
     ("anaphora.lisp", "`(anaphoric if ,test it ,(rec rest))", "`(anaphoric if ,test t ,(rec rest))"),
     "ANAPHORA:ACOND"),
    ("anaphora", "anaphora",
     ("anaphora.lisp", "(symbolic ignore-first ,test ,else)", "(anaphoric ignore-first ,test ,else)"),
     "ANAPHORA:ASIF"),
    ("esrap", "esrap",
     ("src/evaluator.lisp", "(char<= (first range) char (second range))", "(char< (first range) char (second range))"),
     "ESRAP::EXEC-CHARACTER-RANGES"),
    ("esrap", "esrap",
     ("src/evaluator.lisp",
      "case-insensitive-p (string length text position end)\n  (and (<= (+ length position) end)\n       (string-equal",
      "case-insensitive-p (string length text position end)\n  (and (<= (+ length position) end)\n       (string="),
     "ESRAP::MATCH-TERMINAL/CASE-INSENSITIVE-P"),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--show", action="store_true")
    args = parser.parse_args()
    found = 0
    print(f"{'library':<11} {'at fault':<42} {'rank':>4} {'reply':>6}  first suspects")
    for library, system, bug, at_fault in BUGS:
        with tempfile.TemporaryDirectory() as parent:
            directory = seeded_copy(library, parent, [bug])
            server = started(args.server, directory, "suspects-bench")
            reply = server.call("run-tests", {"system": system})
            server.close()
        structured = json.loads(reply.line)["result"].get("structuredContent", {})
        names = [s["name"] for s in ((structured.get("suspects") or {}).get("suspects") or [])]
        rank = names.index(at_fault) + 1 if at_fault in names else None
        found += rank is not None and rank <= 3
        print(f"{library:<11} {at_fault:<42} {rank or '-':>4} {len(reply.text):>6}  {', '.join(names[:3])}")
        if args.show:
            print(reply.text, "\n")
    print(f"\nAmong the first three suspects: {found} of {len(BUGS)} seeded bugs.")


if __name__ == "__main__":
    main()
