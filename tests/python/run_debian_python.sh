#!/usr/bin/env bash
# Runs one Python unittest file (the argument) with Debian's /usr/bin/python3,
# not the pyenv python3 first on PATH: Debian's has numpy, python3-grpcio and
# python3-protobuf (C++ implementation).
#
# Under --config=asan (tools/test_asan.sh) libdmagather.so and dmagatherd are
# built with AddressSanitizer, whose runtime must be the first library of the
# process: DMAGATHER_ASAN_PRELOAD names it, and it is preloaded into the
# interpreter (and so into the daemon and ranks it starts). libstdc++ is
# preloaded right after it: python3 itself does not link libstdc++, and ASan
# must find the real __cxa_throw when it starts, or the first C++ exception
# (torch throws them in normal operation) aborts with "CHECK failed:
# real___cxa_throw". CPython's own allocations at exit are not ours: no
# leak check in the Python process.
if [ -n "${DMAGATHER_ASAN_PRELOAD:-}" ]; then
  export LD_PRELOAD="$DMAGATHER_ASAN_PRELOAD:libstdc++.so.6${LD_PRELOAD:+:$LD_PRELOAD}"
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fi
exec /usr/bin/python3 -m unittest -v "$1"
