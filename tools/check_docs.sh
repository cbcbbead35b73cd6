#!/usr/bin/env bash
# check_docs.sh: keeps the way in short and the docs' links whole. Fails when
# README.md has more than 200 lines or docs/PERFORMANCE.md more than 400, or
# when a relative markdown link in README.md or docs/*.md ([text](path),
# [text](path#anchor)) names a file or folder that does not exist. Links
# with a scheme (https:, mailto:) and pure anchors (#...) are not checked;
# neither are links inside code blocks or inline code. Ends with one line
# `N passed, N failed, N skipped` (one case).
#
#   tools/check_docs.sh [FILE.md...]   (default: README.md and docs/*.md)
set -uo pipefail
cd "$(dirname "$0")/.."
if (($#)); then
  files=("$@")
else
  files=(README.md docs/*.md)
fi
python3 - "${files[@]}" <<'PY'
import os, re, sys

LIMITS = {"README.md": 200, "docs/PERFORMANCE.md": 400}
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")

bad = 0
checked = 0
for path in sys.argv[1:]:
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        print(f"check_docs: {path}: {e}")
        bad += 1
        continue
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    limit = LIMITS.get(os.path.normpath(path))
    if limit is not None and len(lines) > limit:
        print(f"{path}: {len(lines)} lines (limit {limit}): move detail to a doc of its own and link it")
        bad += 1
    in_fence = False
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                continue
            file_part = target.split("#", 1)[0].split("?", 1)[0]
            if not file_part:
                continue
            checked += 1
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(resolved):
                print(f"{path}:{n}: link to {target}: {resolved} does not exist")
                bad += 1
if bad:
    print(f"check_docs: FAILED: {bad} problem(s) in {len(sys.argv) - 1} file(s)")
    print("0 passed, 1 failed, 0 skipped")
    sys.exit(1)
print(f"check_docs: OK ({len(sys.argv) - 1} files, {checked} relative links; README at most "
      f"{LIMITS['README.md']} lines, docs/PERFORMANCE.md at most {LIMITS['docs/PERFORMANCE.md']})")
print("1 passed, 0 failed, 0 skipped")
PY
