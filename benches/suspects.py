"""How often a red run-tests reply names the definition at fault among its first three suspects:
one bug at a time seeded into a copy of a Debian-installed library, its suite run once by run-tests
on a private image (swank-mcp --launch). Prints, per bug, the rank of the definition at fault (or
-), the suspects named first, and the reply's characters; then how many bugs were found among the
first three, per library.

Beside it, what an agent reads on each path to the definition at fault when it reads only what it
is pointed to: after the reply, the suspects' definitions at the places the reply names, in order,
down to the one at fault; after the shell's test-op output filtered to its failures as
session_cost.py filters it (RT's failure blocks, FiveAM's report from `Did N checks` on), the definitions of the failing tests
the output names, then the definitions of the system's code those tests' forms name (the first
definition of each name in a file of the copy whose path has no "test"). The ratio is the first
path's characters to the second's; the shell path may not reach the definition at fault at all
(`reaches`).

    python3 benches/suspects.py --server target/release/swank-mcp [--show]
"""

import argparse
import os
import re
import subprocess
import tempfile

from seeded_library import form_at, seeded_copy, started, test_op

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
    ("cl-split-sequence", "split-sequence",
     ("vector.lisp", ":return (values subseqs left)", ":return (values subseqs right)"),
     "SPLIT-SEQUENCE::SPLIT-VECTOR-FROM-START"),
    ("cl-split-sequence", "split-sequence",
     ("list.lisp", "(values (nreverse result) (- length index))", "(values (nreverse result) (- length index 1))"),
     "SPLIT-SEQUENCE::SPLIT-LIST-FROM-END"),
    ("iterate", "iterate",
     ("iterate.lisp", ":identity 1\n\t\t\t :operation '*", ":identity 0\n\t\t\t :operation '*"),
     "ITERATE::CLAUSE-MULTIPLY-24"),
    ("iterate", "iterate",
     ("iterate.lisp", "`((if ,test-expr ,update-code ,var))", "`((if ,test-expr ,var ,update-code))"),
     "ITERATE::RETURN-REDUCTION-CODE"),
    ("iterate", "iterate",
     ("iterate.lisp", "(return-from ,*loop-name* ,var))))))", "(return-from ,*loop-name* t))))))"),
     "ITERATE::CLAUSE-THEREIS-32"),
    ("ieee-floats", "ieee-floats",
     ("ieee-floats.lisp", "(sign (if (= sign 1.0) 0 1))", "(sign (if (= sign 1.0) 1 0))"),
     "IEEE-FLOATS:MAKE-FLOAT-CONVERTERS"),
    ("nibbles", "nibbles",
     ("streams.lisp", "(let ((list (make-list count)))", "(let ((list (make-list (1+ count))))"),
     "NIBBLES::READ-FRESH-SEQUENCE"),
    ("nibbles", "nibbles",
     ("streams.lisp", "for i from start below end\n\t   do (funcall writer", "for i from (1+ start) below end\n\t   do (funcall writer"),
     "NIBBLES::WRITE-SEQUENCE-WITH-WRITER"),
]


# The shell's test-op output filtered to the failures, per library (session_cost.py's filters).
FAILURES_FILTER = {
    "alexandria": "sed -n '/^Test .* failed$/,/^Actual value/p'",
    "anaphora": "sed -n '/^Test .* failed$/,/^Actual value/p'",
    "esrap": "sed -n '/ Did .* checks/,$p'",
    "cl-split-sequence": "sed -n '/ Did .* checks/,$p'",
    "ieee-floats": "sed -n '/ Did .* checks/,$p'",
    "iterate": "sed -n '/^Test .* failed$/,/^Actual value/p'",
    "nibbles": "sed -n '/^Test .* failed$/,/^Actual value/p'",
}


def lisp_files(directory):
    """{path relative to `directory`: text} of the Lisp files under it."""
    files = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            if name.endswith(".lisp"):
                path = os.path.join(parent, name)
                with open(path, errors="replace") as f:
                    files[os.path.relpath(path, directory)] = f.read()
    return files


def bare(name):
    """A symbol's name without its package, upper case, as the reply prints names."""
    return name.rsplit(":", 1)[-1].upper()


def failing_tests(output):
    """The failing tests a shell's test-op output names: RT's `Test NAME failed` lines, and FiveAM's
    failure details (`NAME in SUITE [description]:`)."""
    names = re.findall(r"^Test (\S+) failed$", output, re.M)
    names += re.findall(r"^ (\S+) in \S+(?: \[.*\])?: *$", output, re.M)
    return list(dict.fromkeys(bare(name) for name in names))


def code_definitions(files, pattern):
    """{name: (path, form)}: the first definition of each name that `pattern` (the name its first
    group) finds in `files` ({path: text}), those whose path has no "test"."""
    code = {}
    for path, text in files.items():
        if "test" not in path.lower():
            for found in re.finditer(pattern, text, re.M | re.I):
                code.setdefault(bare(found.group(1)), (path, form_at(text, found.start())))
    return code


def test_form(files, name, lead=r"^\("):
    """The form that defines the test `name` (deftest, test, test-both-modes) in `files`, where a
    line begins with `lead` and the definer; None when there is none."""
    for text in files.values():
        found = re.search(
            rf"{lead}(?:[\w-]+:+)?(?:deftest|test|test-both-modes)\s+\(?{re.escape(name)}[\s)]", text, re.M | re.I
        )
        if found:
            return form_at(text, found.start())
    return None


def names_in(form, code):
    """The names of `code` ({name: ...}) that `form`'s tokens are, in order."""
    return [bare(token) for token in re.findall(r"[^\s()'`,\"#;|]+", form) if bare(token) in code]


def shell_path(library, directory, system, at_fault):
    """The characters an agent reads on the shell path (see the module's doc), and whether it reaches
    the definition at fault."""
    command = f"{test_op(directory, system)} | {FAILURES_FILTER[library]}"
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=900).stdout
    files = lisp_files(directory)
    code = code_definitions(files, r"^\((?:[\w-]+:+)?def(?:un|macro|generic|method|ine-compiler-macro)\s+([^\s()]+)")
    read, named = len(output), set()
    for test in failing_tests(output):
        # A FiveAM test that esrap defines in both modes is named with the mode after its name.
        form = test_form(files, re.sub(r"\.(COMPILED|INTERPRETED)$", "", test))
        if form:
            read += len(form)
            named |= set(names_in(form, code))
    read += sum(len(code[name][1]) for name in named)
    return read, bare(at_fault) in named


def suspect_names(reply):
    """The definitions the reply's [suspects] section names, in order, each with the number of the
    suspect it is or, for the macro that defined one (`defined there by the macro NAME`), belongs to."""
    section = reply.split("\n[suspects] ", 1)[-1]
    named, number = [], 0
    for found in re.finditer(r"^(\d+)\. (\S+) |^   defined there by the macro (\S+) ", section, re.M):
        if found.group(1):
            number = int(found.group(1))
        named.append((number, found.group(2) or found.group(3)))
    return named


def rank_of(named, at_fault):
    """The number of the suspect that is the definition at fault, or that a macro at fault wrote."""
    return next((number for number, name in named if name == at_fault), None)


def reply_path(directory, reply, count):
    """The characters an agent reads on the reply's path (see the module's doc): the reply, and the
    first `count` definitions it names."""
    places = re.findall(r"^(?:\d+\. |   defined there by the macro )\S+ (\S+):(\d+)", reply, re.M)
    read = len(reply)
    for path, line in places[:count]:
        with open(os.path.join(directory, path), errors="replace") as f:
            text = f.read()
        start = sum(len(line_text) for line_text in text.splitlines(keepends=True)[: int(line) - 1])
        read += len(form_at(text, start))
    return read


def arguments_and_bugs():
    """The command line's arguments (--server, --show, --only) and the BUGS they choose."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--show", action="store_true")
    parser.add_argument("--only", help="the bugs of one library")
    args = parser.parse_args()
    return args, [bug for bug in BUGS if not args.only or bug[0] == args.only]


def main():
    args, bugs = arguments_and_bugs()
    found = {}
    totals = [0, 0]
    print(
        f"{'library':<11} {'at fault':<42} {'rank':>4} {'reply':>6} {'read':>6} {'shell':>6} {'reaches':>7} {'ratio':>5}"
        "  first suspects"
    )
    for library, system, bug, at_fault in bugs:
        with tempfile.TemporaryDirectory() as parent:
            directory = seeded_copy(library, parent, [bug])
            server = started(args.server, directory, "suspects-bench")
            reply = server.call("run-tests", {"system": system})
            server.close()
            # The text is what the agent reads; structured content is sent only under
            # --structured-content.
            names = suspect_names(reply.text)
            rank = rank_of(names, at_fault)
            # The definitions the reply names, read in order down to the one at fault.
            read_up_to = next((i + 1 for i, (_, name) in enumerate(names) if name == at_fault), len(names))
            read = reply_path(directory, reply.text, read_up_to)
            names = [name for _, name in names]
            shell, reaches = shell_path(library, directory, system, at_fault)
        found.setdefault(library, [0, 0])
        found[library][0] += rank is not None and rank <= 3
        found[library][1] += 1
        if rank and reaches:
            totals[0] += read
            totals[1] += shell
        print(
            f"{library:<11} {at_fault:<42} {rank or '-':>4} {len(reply.text):>6} {read:>6} {shell:>6} "
            f"{'yes' if reaches else 'no':>7} {read / max(shell, 1):>5.2f}  {', '.join(names[:3])}"
        )
        if args.show:
            print(reply.text, "\n")
    print()
    for library, (among, of) in found.items():
        print(f"{library}: among the first three suspects for {among} of {of} seeded bugs.")
    if totals[1]:
        print(f"Where both paths reach the definition at fault: {totals[0]} / {totals[1]} = {totals[0] / totals[1]:.2f}.")


if __name__ == "__main__":
    main()
