# The package tests' case bookkeeping (tests/packaging/run.sh, upgrade.sh).
# Sourced, not run; the sourcing script sets `name` (its log prefix) first.
#
#   ok CASE / bad CASE WHY / skip CASE WHY   count a case and print its line
#   finish                                   `N passed, N failed, N skipped`; exits
#   work_new PREFIX GIB AVAIL_GIB            sets work: a fresh directory, a tmpfs
#                                            of GIB where AVAIL_GIB are available
#   work_remove                              removes it (kept with DMAGATHER_KEEP_LOGS=1)

passed=0 failed=0 skipped=0
t_case=$SECONDS
ok() { passed=$((passed + 1)); echo "PASSED $1 ($((SECONDS - t_case)) s)"; t_case=$SECONDS; }
bad() { failed=$((failed + 1)); echo "FAILED $1: $2"; t_case=$SECONDS; }
skip() { skipped=$((skipped + 1)); echo "SKIPPED $1: $2"; t_case=$SECONDS; }
finish() {
  echo "$name: $((SECONDS)) s in all"
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
  exit $?
}

work_new() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  # In memory where there is room: unpacking is faster and the clean-up is
  # an unmount (the mount is private to this run).
  if [ "${DMAGATHER_KEEP_LOGS:-}" != 1 ] &&
     [ "$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)" -ge "$3" ]; then
    mount -t tmpfs -o size="$2"g,mode=0700 tmpfs "$work" && echo "$name: working in a tmpfs at $work"
  fi
}

work_remove() {
  if [ "${DMAGATHER_KEEP_LOGS:-}" = 1 ]; then
    echo "$name: kept $work"
  elif mountpoint -q "$work"; then
    umount -l "$work" && rmdir "$work"
  else
    rm -rf "$work"
  fi
}
