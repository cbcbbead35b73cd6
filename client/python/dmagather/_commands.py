"""The `dmagatherd` and `dmagatherctl` commands of the installed package: each
runs the program of that name shipped inside the package (dmagather/bin/,
its libraries in dmagather.libs/ beside it), with the command's arguments;
`dmagatherctl service ...` writes the node service for it (service.py)."""
import os
import sys

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _run(name):
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        sys.exit(f"{name}: {path} is missing or not executable: this dmagather package was installed without "
                 "its programs (they come with the wheel; a source checkout builds them with Bazel)")
    os.execv(path, [path] + sys.argv[1:])


def dmagatherd():
    _run("dmagatherd")


def dmagatherctl():
    if sys.argv[1:2] == ["service"]:
        # The node service for this package's daemon (dmagather/service.py).
        from dmagather import service
        sys.exit(service.main(sys.argv[2:]))
    _run("dmagatherctl")
