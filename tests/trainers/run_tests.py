"""Runs the trainer tests (tests/trainers/*_test.py) with this interpreter (the
venv of tools/install_venv.sh) and ends with `N passed, N failed`, or
`N passed, N failed, N skipped` when something was skipped (errors count as
failed; a skip is never a pass)."""
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv):
    names = argv or sorted(f[:-3] for f in os.listdir(HERE) if f.endswith("_test.py"))
    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    for n in names:
        suite.addTests(loader.loadTestsFromName(n))
    t0 = time.monotonic()
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    # (an error in setUpClass is one failure and runs none of its class's tests)
    passed = max(0, result.testsRun - failed - skipped)
    print(f"trainer tests: {time.monotonic() - t0:.0f} s")
    # The plain closing line; ", N skipped" only when something was skipped.
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
