#!/usr/bin/env bash
# check_knobs.sh: every knob accounted for (docs/OPERATIONS.md "Knobs").
# Four cases:
#   1. every flag `dmagatherd --help` prints has a row in the table;
#   2. every flag row of the table is a flag `dmagatherd --help` prints;
#   3. every DMAGATHER_* environment variable the product reads (a string
#      literal that is exactly the name, in client/ and its Python package,
#      common/, server/ and tools/dmagatherctl.cc; what the build's
#      third_party/toolkits/*.bzl read with environ.get) has a row;
#   4. the client library's list of known variables (client/env_check.h,
#      used to name typos) is the table's variable rows, no more, no less.
# Ends with one line `N passed, N failed, N skipped`.
#
#   tools/check_knobs.sh [DMAGATHERD]   (default: builds //server:dmagatherd)
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
  if ! bazel build //server:dmagatherd >/dev/null 2>&1; then
    echo "check_knobs: bazel build //server:dmagatherd failed"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
  fi
  bin="$(bazel info bazel-bin 2>/dev/null)/server/dmagatherd"
fi
help=$("$bin" --help 2>&1)
python3 - "$help" <<'PY'
import glob, re, sys

help_text = sys.argv[1]
failed = passed = 0


def case(name, problems):
    global failed, passed
    if problems:
        failed += 1
        print(f"check_knobs: FAILED: {name}:")
        for p in problems:
            print(f"  {p}")
    else:
        passed += 1
        print(f"check_knobs: ok: {name}")


# The table: the rows of docs/OPERATIONS.md's "## Knobs" section whose first
# cell is a flag (`--name`) or a variable (`DMAGATHER_NAME`).
doc = open("docs/OPERATIONS.md", encoding="utf-8").read()
m = re.search(r"^## Knobs\n(.*?)(?=^## )", doc, re.S | re.M)
section = m.group(1) if m else ""
doc_flags, doc_vars = set(), set()
for line in section.splitlines():
    cell = re.match(r"^\|\s*`(--[a-z0-9_]+|DMAGATHER_[A-Z0-9_]+)`\s*\|", line)
    if not cell:
        continue
    name = cell.group(1)
    target = doc_flags if name.startswith("--") else doc_vars
    if name in target:
        print(f"check_knobs: {name} has two rows")
    target.add(name)

# --help: "    --name (help text); default: ...;"
help_flags = set(re.findall(r"^\s+(--[a-z0-9_]+) \(", help_text, re.M))
if not help_flags:
    print("check_knobs: no flags in `dmagatherd --help`:\n" + help_text[:2000])
if not section:
    print("check_knobs: docs/OPERATIONS.md has no `## Knobs` section")

case("every dmagatherd flag has a row", [f"{f}: in --help, not in the table" for f in sorted(help_flags - doc_flags)]
     or ([] if help_flags else ["no flags parsed from --help"]))
case("every flag row is a dmagatherd flag", [f"{f}: in the table, not in --help" for f in sorted(doc_flags - help_flags)]
     or ([] if doc_flags else ["no flag rows in the table"]))

# What the product reads: string literals that are exactly a variable's name.
sources = [p for p in glob.glob("client/**/*", recursive=True) + glob.glob("common/**/*", recursive=True)
           + glob.glob("server/**/*", recursive=True) + glob.glob("third_party/toolkits/*.bzl")
           + ["tools/dmagatherctl.cc"]
           if re.search(r"\.(cc|h|py|bzl)$", p) and p != "client/env_check.h"]
read = {}
for path in sources:
    # Starlark (the build's toolkit detection): only what it reads from the
    # environment; its other DMAGATHER_* strings are preprocessor defines.
    pattern = (r"""environ\.get\(\s*["'](DMAGATHER_[A-Z0-9_]+)["']""" if path.endswith(".bzl")
               else r"""["'](DMAGATHER_[A-Z0-9_]+)["']""")
    for name in re.findall(pattern, open(path, encoding="utf-8").read()):
        read.setdefault(name, path)
# The scan itself must still see what it is known to read.
missing_seen = [n for n in ("DMAGATHER_SOCKET", "DMAGATHER_JOIN_TIMEOUT_MS", "DMAGATHER_ALLGATHER") if n not in read]
case("every DMAGATHER_* variable read has a row",
     [f"{n} (read in {read[n]}): not in the table" for n in sorted(set(read) - doc_vars)]
     + [f"the scan no longer finds {n}: fix this script" for n in missing_seen])

# client/env_check.h's kKnownVariables.
header = open("client/env_check.h", encoding="utf-8").read()
km = re.search(r"kKnownVariables\[\] = \{(.*?)\};", header, re.S)
known = set(re.findall(r'"(DMAGATHER_[A-Z0-9_]+)"', km.group(1))) if km else set()
case("client/env_check.h knows exactly the table's variables",
     [f"{n}: in client/env_check.h, not in the table" for n in sorted(known - doc_vars)]
     + [f"{n}: in the table, not in client/env_check.h" for n in sorted(doc_vars - known)]
     + ([] if known else ["no kKnownVariables in client/env_check.h"]))

print(f"check_knobs: {len(help_flags)} flags, {len(doc_vars)} variables in the table, {len(read)} variables read")
print(f"{passed} passed, {failed} failed, 0 skipped")
sys.exit(1 if failed else 0)
PY
