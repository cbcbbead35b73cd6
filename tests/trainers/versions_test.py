"""The torch versions dmagather says it supports are the ones CI runs: the
tested versions (dmagather/_torch_entry.py's TESTED_TORCH) are the torch of the
two trainer venvs (tools/venv-requirements.txt, the oldest;
tools/venv-requirements-newest.txt, the newest), the torch running this test is
one of them, and README.md and docs/TRAINERS.md name each."""
import os
import re
import unittest

import torch

from trainers_case import REPO

from dmagather import _torch_entry


def pinned_torch(name):
    text = open(os.path.join(REPO, "tools", name)).read()
    m = re.search(r"^torch==(\S+)$", text, re.M)
    if m is None:
        raise AssertionError(f"tools/{name} pins no torch")
    return m.group(1)


class VersionsTest(unittest.TestCase):
    def test_tested_versions_are_the_venvs(self):
        venvs = tuple(_torch_entry.major_minor(pinned_torch(n))
                      for n in ("venv-requirements.txt", "venv-requirements-newest.txt"))
        self.assertEqual(_torch_entry.TESTED_TORCH, venvs)

    def test_running_torch_is_tested(self):
        self.assertIn(_torch_entry.major_minor(torch.__version__), _torch_entry.TESTED_TORCH)
        self.assertIsNone(_torch_entry.untested_note(torch.__version__, ["all_gather_into_tensor"]))

    def test_docs_name_each_tested_version(self):
        for doc in ("README.md", os.path.join("docs", "TRAINERS.md")):
            text = open(os.path.join(REPO, doc)).read()
            line = " ".join(f"torch {v}" for v in _torch_entry.TESTED_TORCH)
            for v in _torch_entry.TESTED_TORCH:
                self.assertRegex(text, rf"torch {re.escape(v)}\b", f"{doc} does not name torch {v} ({line})")

    def test_untested_version_is_named(self):
        note = _torch_entry.untested_note("2.99.1+cu999", ["all_gather_into_tensor", "all_gather_single"])
        self.assertIn("torch 2.99.1+cu999 is not a version dmagather was tested with", note)
        self.assertIn("torch.distributed.all_gather_single", note)


if __name__ == "__main__":
    unittest.main()
