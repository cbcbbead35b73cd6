#!/usr/bin/env bash
# check_format.sh: every C/C++ source (tracked or new, less third_party/) is
# laid out as .clang-format says (Google style, 120 columns), checked with
# Debian's clang-format 14 so the answer does not depend on who runs it.
# Ends with one line `N passed, N failed, N skipped` (one case; skipped,
# exit 77, where clang-format-14 is missing).
#
#   tools/check_format.sh          check; names each file that differs
#   tools/check_format.sh --fix    rewrite those files in place
set -uo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$CF" >/dev/null; then
  echo "check_format: $CF not found (tools/install_deps.sh installs clang-format-14): skipped"
  echo "0 passed, 0 failed, 1 skipped"
  exit 77
fi
mapfile -t files < <(git ls-files --cached --others --exclude-standard |
  grep -E '\.(h|hpp|cc|cpp|c|cu)$' | grep -v '^third_party/')
case "${1:-}" in
  --fix) printf '%s\0' "${files[@]}" | xargs -0 "$CF" -i; echo "check_format: rewrote ${#files[@]} files"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--fix]" >&2; exit 2 ;;
esac
out=$(printf '%s\0' "${files[@]}" | xargs -0 "$CF" --dry-run 2>&1)
bad=$(printf '%s\n' "$out" | sed -nE 's/^([^:]+):[0-9]+:[0-9]+: (warning|error): code should be clang-formatted.*/\1/p' | sort -u)
if [ -n "$bad" ]; then
  printf '%s\n' "$bad" | sed 's/^/check_format: not formatted: /'
  echo "check_format: FAILED: $(printf '%s\n' "$bad" | wc -l) file(s); tools/check_format.sh --fix rewrites them"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
echo "check_format: OK (${#files[@]} files, $("$CF" --version | sed -E 's/.*version ([0-9.]+).*/\1/'))"
echo "1 passed, 0 failed, 0 skipped"
