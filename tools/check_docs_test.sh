#!/usr/bin/env bash
# check_docs_test.sh: proves tools/check_docs.sh fails on a broken link, a
# broken anchor and a tree that does not match the files, and passes docs
# whose links and tree are whole. Each case writes a small tree under a
# temporary directory (README.md, docs/*.md, a few source files), runs the
# check on it (--root) and compares the exit status and a line of its
# output. Runs as //tools:check_docs_test (so `bazel test //...` and
# tools/test.sh count it) or directly: tools/check_docs_test.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check="$here/check_docs.sh"
[ -x "$check" ] || check="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}/tools/check_docs.sh"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/check_docs_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0 n=0

# The tree every case starts from: links, anchors and a tree that hold.
ARCH='# Architecture

## Tree

```
server/engines/gpu/   gpu_engine.{h,cc} (the engine), backoff.h (how it polls)
tools/                check.sh
```

## Tree

A second heading of the same text: its anchor is #tree-1.'
GUIDE='# Guide

## The `--chunk_kib` flag (cuda, hip)

See [the tree](ARCHITECTURE.md#tree), [again](ARCHITECTURE.md#tree-1),
[this flag](#the---chunk_kib-flag-cuda-hip) and [a folder](../server/engines/).
In code, nothing is checked: `[x](missing.md#none)`.'
README='# Project

[Guide](docs/GUIDE.md#guide), [status](#project).'

# case NAME WANT_RC WANT_TEXT [FILE CONTENT]...: the base tree, then FILE
# (relative to the tree's root) replaced by CONTENT, "-" as CONTENT removes
# it. WANT_TEXT: a line the check's output must contain.
case_() {
  local name=$1 want_rc=$2 want_text=$3
  shift 3
  n=$((n + 1))
  local root="$tmp/$n"
  mkdir -p "$root/docs" "$root/server/engines/gpu" "$root/tools"
  printf '%s\n' "$README" >"$root/README.md"
  printf '%s\n' "$ARCH" >"$root/docs/ARCHITECTURE.md"
  printf '%s\n' "$GUIDE" >"$root/docs/GUIDE.md"
  touch "$root/server/engines/gpu/gpu_engine.h" "$root/server/engines/gpu/gpu_engine.cc" \
    "$root/server/engines/gpu/backoff.h" "$root/tools/check.sh"
  while (($#)); do
    if [ "$2" = "-" ]; then
      rm -f "${root:?}/$1"
    else
      mkdir -p "$(dirname "$root/$1")"
      printf '%s\n' "$2" >"$root/$1"
    fi
    shift 2
  done
  local out rc
  out=$("$check" --root "$root" 2>&1)
  rc=$?
  if [ "$rc" -eq "$want_rc" ] && grep -qF -- "$want_text" <<<"$out"; then
    passed=$((passed + 1))
    echo "ok: $name"
  else
    failed=$((failed + 1))
    echo "FAILED: $name: exit $rc (wanted $want_rc), wanted a line with: $want_text"
    sed 's/^/    /' <<<"$out"
  fi
}

case_ "whole links, anchors and tree pass" 0 "3 passed, 0 failed, 0 skipped"

case_ "an anchor that is no heading of the file it links to fails" 1 \
  "docs/GUIDE.md:5: link to ARCHITECTURE.md#trees: docs/ARCHITECTURE.md has no heading #trees" \
  docs/GUIDE.md "${GUIDE/ARCHITECTURE.md#tree)/ARCHITECTURE.md#trees)}"

case_ "a pure anchor that is no heading of its own file fails" 1 \
  "README.md:3: link to #status: README.md has no heading #status" \
  README.md "${README/\#project/\#status}"

case_ "a third heading of the same text is not there" 1 "has no heading #tree-2" \
  docs/GUIDE.md "${GUIDE/\#tree-1/\#tree-2}"

case_ "inline code keeps its text, punctuation goes: the old slug fails" 1 \
  "has no heading #the-chunk_kib-flag-cuda-hip" \
  docs/GUIDE.md "${GUIDE/\#the---chunk_kib-flag-cuda-hip/\#the-chunk_kib-flag-cuda-hip}"

case_ "a link to a file that does not exist fails" 1 "docs/GUIDE.md does not exist" \
  docs/GUIDE.md - docs/OTHER.md "[gone](GUIDE.md#guide)"

case_ "a file the tree names that does not exist fails" 1 \
  "the entry tools/ names check.sh, which does not exist" \
  tools/check.sh -

case_ "a gpu/ source file the tree leaves out fails" 1 \
  "the tree's server/engines/gpu/ entry does not name lanes.cc" \
  server/engines/gpu/lanes.cc ""

echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
