#!/usr/bin/env bash
# Runs the Python package's tests with Debian's python3 (which has numpy).
exec /usr/bin/python3 -m unittest -v tests/python/ctypes_test.py
