#!/usr/bin/env bash
# Runs one Python unittest file (the argument) with Debian's /usr/bin/python3,
# not the pyenv python3 first on PATH: Debian's has numpy, python3-grpcio and
# python3-protobuf (C++ implementation).
exec /usr/bin/python3 -m unittest -v "$1"
