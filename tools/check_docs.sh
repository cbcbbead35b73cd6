#!/usr/bin/env bash
# check_docs.sh: keeps the way in short and the docs' links and tree whole.
# Three cases:
#   1. files: README.md has at most 200 lines and docs/PERFORMANCE.md at most
#      400, and every relative markdown link in README.md and docs/*.md
#      ([text](path), [text](path#anchor)) names a file or folder that exists;
#   2. anchors: every link's anchor (file.md#anchor, or #anchor in the same
#      file) is a heading of that markdown file, by GitHub's rules: the text
#      lowercased, inline code's backticks dropped (its text kept), every
#      character other than a letter, digit, space, hyphen or underscore
#      dropped, spaces turned to hyphens; a repeated heading gets -1, -2, ...
#      (an HTML id="..." or name="..." counts too);
#   3. tree: in docs/ARCHITECTURE.md's "## Tree" block, every file it names
#      (a word with an extension, braces expanded: comm.{h,cc}) exists under
#      the folder of its entry, every folder an entry starts with exists, and
#      every source file of server/engines/gpu/ is named (skipped when
#      docs/ARCHITECTURE.md is not among the files checked).
# Links with a scheme (https:, mailto:), links inside code blocks or inline
# code, and anchors into files other than markdown are not checked. Ends with
# one line `N passed, N failed, N skipped`.
#
#   tools/check_docs.sh [--root DIR] [FILE.md...]
#     (default: README.md and docs/*.md; --root: check the tree at DIR instead
#     of this repository, as tools/check_docs_test.sh does)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
if [ "${1:-}" = "--root" ]; then
  cd "$2" || exit 2
  shift 2
fi
if (($#)); then
  files=("$@")
else
  files=(README.md docs/*.md)
fi
python3 - "${files[@]}" <<'PY'
import glob, os, re, sys

LIMITS = {"README.md": 200, "docs/PERFORMANCE.md": 400}
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"""<[^>]+\s(?:id|name)\s*=\s*["']([^"']+)["']""")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    in_fence = False
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield n, line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    s = re.sub(r"`([^`]*)`", r"\1", heading)  # Inline code: the text stays.
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", s)  # Links: their text.
    s = re.sub(r"<[^>]+>", "", s)  # HTML tags.
    s = s.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


_anchors = {}


def anchors(path):
    """Every anchor of a markdown file (None when it cannot be read)."""
    path = os.path.normpath(path)
    if path not in _anchors:
        try:
            text = open(path, encoding="utf-8").read()
        except OSError:
            _anchors[path] = None
            return None
        seen, out = {}, set()
        for _, line in prose_lines(text):
            out.update(HTML_ID.findall(line))
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
        _anchors[path] = out
    return _anchors[path]


problems = {"files": [], "anchors": [], "tree": []}
checked = anchored = 0
for path in sys.argv[1:]:
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        problems["files"].append(f"{path}: {e}")
        continue
    nlines = len(text.split("\n")) - (1 if text.endswith("\n") else 0)
    limit = LIMITS.get(os.path.normpath(path))
    if limit is not None and nlines > limit:
        problems["files"].append(f"{path}: {nlines} lines (limit {limit}): move detail to a doc of its own and link it")
    for n, line in prose_lines(text):
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue
            file_part, _, anchor = target.partition("#")
            file_part = file_part.split("?", 1)[0]
            resolved = path
            if file_part:
                checked += 1
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                if not os.path.exists(resolved):
                    problems["files"].append(f"{path}:{n}: link to {target}: {resolved} does not exist")
                    continue
            if not anchor or not resolved.endswith(".md"):
                continue
            anchored += 1
            have = anchors(resolved)
            if have is not None and anchor not in have:
                near = sorted(a for a in have if a[:12] == anchor[:12])
                hint = f" (headings starting alike: {', '.join(near[:3])})" if near else ""
                problems["anchors"].append(f"{path}:{n}: link to {target}: {resolved} has no heading #{anchor}{hint}")

# The tree of docs/ARCHITECTURE.md.
EXT = r"(?:h|hpp|cc|cu|c|sh|py|proto|md|txt|lds|yaml|yml|bzl|json|service|conf|toml|cfg)"
FILE_WORD = re.compile(r"(?<![\w./{},-])([\w.+-]*(?:/[\w.+-]+)*/?[\w+-]*(?:\{[\w,.]+\})?[\w-]*\." + EXT +
                       r"(?:\{[\w,]+\})?|[\w.+-]*(?:/[\w.+-]+)*/?[\w+-]+\.\{[\w,]+\})(?![\w/])")


def expand(word):
    m = re.search(r"\{([^}]*)\}", word)
    if not m:
        return [word]
    return [x for alt in m.group(1).split(",") for x in expand(word[:m.start()] + alt + word[m.end():])]


def exists_under(folder, name):
    if os.path.exists(os.path.join(folder, name)):
        return True
    if os.path.exists(name) and "/" in name:
        return True
    return bool(glob.glob(os.path.join(folder, "**", name), recursive=True))


arch = "docs/ARCHITECTURE.md"
tree_checked = arch in [os.path.normpath(p) for p in sys.argv[1:]]
named_files = 0
if tree_checked:
    text = open(arch, encoding="utf-8").read()
    m = re.search(r"^## Tree\n.*?^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    if not m:
        problems["tree"].append(f"{arch}: no fenced block under '## Tree'")
    else:
        start = text[:m.start(1)].count("\n") + 1
        entries = []  # [folder, first line number, text]
        for i, line in enumerate(m.group(1).split("\n")):
            if not line.strip():
                continue
            if line[0] != " ":
                head = line.split()[0]
                folder = head if head.endswith("/") else ("." if i == 0 else os.path.dirname(head) or ".")
                entries.append([folder, start + i, line])
                if head.endswith("/") and "(ignored)" not in line and not os.path.isdir(head):
                    problems["tree"].append(f"{arch}:{start + i}: folder {head} does not exist")
            elif entries:
                entries[-1][2] += "\n" + line
        gpu_entry = ""
        for folder, n, body in entries:
            if folder.rstrip("/") == "server/engines/gpu":
                gpu_entry += body
            for word in FILE_WORD.findall(re.sub(r"`", "", body)):
                for name in expand(word.rstrip("/")):
                    named_files += 1
                    if not exists_under(folder, name):
                        problems["tree"].append(f"{arch}:{n}: the entry {folder} names {name}, which does not exist")
        for src in sorted(glob.glob("server/engines/gpu/*.h") + glob.glob("server/engines/gpu/*.cc")):
            base = os.path.basename(src)
            if not any(base in expand(w) for w in FILE_WORD.findall(gpu_entry)):
                problems["tree"].append(f"{arch}: the tree's server/engines/gpu/ entry does not name {base}")

passed = failed = skipped = 0
for case, what in (("files", f"{checked} relative links to files and folders; README at most "
                             f"{LIMITS['README.md']} lines, docs/PERFORMANCE.md at most {LIMITS['docs/PERFORMANCE.md']}"),
                   ("anchors", f"{anchored} anchors into markdown files"),
                   ("tree", f"{arch}'s tree: {named_files} files named, server/engines/gpu/ complete")):
    if case == "tree" and not tree_checked:
        skipped += 1
        print(f"check_docs: skipped: tree ({arch} not among the files)")
    elif problems[case]:
        failed += 1
        for p in problems[case]:
            print(p)
        print(f"check_docs: FAILED: {case}: {len(problems[case])} problem(s)")
    else:
        passed += 1
        print(f"check_docs: ok: {case} ({what})")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
PY
