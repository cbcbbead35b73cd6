#!/usr/bin/env bash
# check_clock.sh: time through one seam. Code that decides on time (op
# timeouts, sweeps, deadlines, expiry, heartbeats) reads the injected
# common::Clock (common/clock.h: RealClock() in the product, a FakeClock in
# tests), so tests move time instead of sleeping. This check fails, naming
# file:line and the function, on a direct clock read in server/, client/,
# common/ or bench/:
#
#   absl::Now()  MonotonicNs()  <any>_clock::now()  clock_gettime(
#   gettimeofday(  absl::GetCurrentTimeNanos()
#   <any>WithDeadline(  (absl::CondVar/Mutex: a wall-clock deadline, so it
#                        came from absl::Now(); a Clock's time is not one:
#                        wait WithTimeout and decide on the clock)
#
# outside the allow-list, tools/check_clock_allow.txt: one entry a line,
#
#   <path>[:<function>]  <reason>
#
# a file, a folder (ending in /) or a function of a file (as the check
# names it: Class::Method, or the enclosing top-level function for code in
# a lambda), then a one-line reason ("pure measurement: ..."). An entry
# without a reason, or one that no longer matches any read, fails the check
# (the list stays short and true). Comments and string literals are not
# code. Ends with one line `N passed, N failed, N skipped` (one case).
#
#   tools/check_clock.sh [--allow FILE] [ROOT]
#     ROOT: the tree to scan (default: this repository); FILE: the
#     allow-list (default: tools/check_clock_allow.txt of this repository).
# tools/check_clock_test.sh plants violations in small trees and checks
# that this script fails on each (a Bazel test: //tools:check_clock_test).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
allow="$here/check_clock_allow.txt"
root="$here/.."
while (($#)); do
  case "$1" in
    --allow) allow=$2; shift 2 ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) echo "usage: $0 [--allow FILE] [ROOT]" >&2; exit 2 ;;
    *) root=$1; shift ;;
  esac
done
python3 - "$root" "$allow" <<'PY'
import os, re, sys

root, allow_path = sys.argv[1], sys.argv[2]
SCANNED = ("server", "client", "common", "bench")
READS = re.compile(
    r"\babsl::Now\s*\(\s*\)|\bMonotonicNs\s*\(\s*\)|\b\w+_clock\s*::\s*now\s*\(|\bclock_gettime\s*\("
    r"|\bgettimeofday\s*\(|\bGetCurrentTimeNanos\s*\(|\b\w+WithDeadline\s*\(")
CONTROL = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof", "static_assert"}


def strip(text):
    """The source with comments, string/char literals and preprocessor lines
    blanked (same length, same lines)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and re.match(r'R"([^(\s]*)\(', text[i:i + 20]) and (i == 0 or not text[i - 1].isalnum()):
            delim = re.match(r'R"([^(\s]*)\(', text[i:]).group(1)
            j = text.find(")" + delim + '"', i)
            j = n if j < 0 else j + len(delim) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
        elif c == "#" and (i == 0 or text[i - 1] == "\n" or text[text.rfind("\n", 0, i) + 1:i].strip() == ""):
            j = i
            while True:  # A directive, with its continuation lines.
                k = text.find("\n", j)
                k = n if k < 0 else k
                if k > 0 and text[k - 1] == "\\" and k < n:
                    j = k + 1
                    continue
                break
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(code):
    """For each offset of `code`, the name of the function it lies in ("" at
    namespace or class scope): a block opened at namespace or class scope
    whose head has a parameter list is a function, named by the identifier
    before its first '(' and qualified by the classes around it. Blocks
    inside a function (lambdas, loops) belong to that function."""
    spans, stack, head_start = [], [], 0  # stack: (kind, name, open offset)
    for m in re.finditer(r"[{};]", code):
        ch, at = m.group(), m.start()
        in_func = any(k == "func" for k, _, _ in stack)
        if ch == ";":
            if not in_func:
                head_start = at + 1
            continue
        if ch == "}":
            if stack:
                kind, name, opened = stack.pop()
                if kind == "func" and not any(k == "func" for k, _, _ in stack):
                    spans.append((opened, at, name))
            if not any(k == "func" for k, _, _ in stack):
                head_start = at + 1
            continue
        if in_func:
            stack.append(("block", "", at))
            continue
        head = " ".join(code[head_start:at].split())
        head_start = at + 1
        head = re.sub(r"^(public|private|protected)\s*:\s*", "", head)
        cls = re.match(r"^(template\s*<.*>\s*)?(class|struct|union)\s+(?:\w+\s+)*?(\w+(?:::\w+)*)\s*(final\s*)?(:(?!:)[^(]*)?$",
                       head)
        if cls:
            stack.append(("class", cls.group(3), at))
            continue
        first = head.find("(")
        before = head[:first].rstrip() if first >= 0 else ""
        name_m = re.search(r"(~?[A-Za-z_]\w*(?:\s*::\s*~?[A-Za-z_]\w*)*|operator\s*\S+)$", before)
        if first >= 0 and "=" not in before and name_m and name_m.group(1) not in CONTROL:
            name = re.sub(r"\s+", "", name_m.group(1))
            outer = [nm for k, nm, _ in stack if k == "class"]
            stack.append(("func", "::".join(outer + [name]), at))
        else:
            stack.append(("scope", "", at))
    return spans


def function_at(spans, offset):
    for a, b, name in spans:
        if a <= offset <= b:
            return name
    return ""


# The allow-list.
entries, problems = {}, []
try:
    for number, line in enumerate(open(allow_path, encoding="utf-8"), 1):
        line = line.rstrip("\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) < 2 or not re.search(r"\w", parts[1]):
            problems.append(f"{allow_path}:{number}: `{parts[0]}` has no reason (write one line: why this may read the time directly)")
            continue
        entries[parts[0]] = [parts[1].strip(), 0]
except OSError as e:
    problems.append(f"{allow_path}: {e}")

scanned = 0
for top in SCANNED:
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
        dirnames.sort()
        for fn in sorted(filenames):
            if not re.search(r"\.(h|hpp|cc|cpp|c|cu)$", fn):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            scanned += 1
            code = strip(open(path, encoding="utf-8", errors="replace").read())
            spans = None
            for m in READS.finditer(code):
                if code[m.end():].lstrip().startswith("{"):
                    continue  # The definition of MonotonicNs itself, not a read.
                if spans is None:
                    spans = functions(code)
                line_no = code.count("\n", 0, m.start()) + 1
                func = function_at(spans, m.start())
                keys = [rel, f"{rel}:{func}"] + [rel[:i + 1] for i, c in enumerate(rel) if c == "/"]
                hit = next((k for k in keys if k in entries), None)
                if hit is not None:
                    entries[hit][1] += 1
                    continue
                what = re.sub(r"\s+", "", m.group())
                problems.append(f"{rel}:{line_no}: direct clock read `{what}` in {func or '(file scope)'}: decide on the "
                                f"injected common::Clock (common/clock.h), or, if it only measures, allow-list "
                                f"`{rel}:{func}` in tools/check_clock_allow.txt with a one-line reason")
for key, (reason, used) in entries.items():
    if used == 0:
        problems.append(f"{allow_path}: `{key}` matches no direct clock read any more: take it off the list")
for p in problems:
    print(f"check_clock: {p}")
if problems:
    print(f"check_clock: FAILED: {len(problems)} problem(s) in {scanned} files")
    print("0 passed, 1 failed, 0 skipped")
    sys.exit(1)
print(f"check_clock: OK ({scanned} files under {', '.join(SCANNED)}; {len(entries)} allow-list entries, each used)")
print("1 passed, 0 failed, 0 skipped")
PY
