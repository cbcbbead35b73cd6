"""The Python package in layers, each importing only the layers below it (the
analogue of the C++ targets' visibility rules): the library binding, the
torch entry points and the import hook, the gather adapter, its
reduce-scatter, the job setup,
the framework patches, then the switches. Every import counts, at module top
or inside a function, relative or absolute; a module may import only modules
of a strictly lower layer, so no import cycle can form. A new module must be
given its layer here.

  tests/python/layering_test.py [PACKAGE_DIR]   (default: client/python/dmagather)
"""
import ast
import os
import sys
import unittest

LAYERS = [
    ["_signatures"],                                # the C signatures and structs
    ["__init__"],                                   # the library binding (ctypes)
    ["_torch_entry", "_import_hook"],               # names and hooks; import nothing of torch
    ["_torch_work"],                                # Work objects
    ["_torch_gather"],                              # the gather adapter (DmagatherAllGather)
    ["_torch_reduce"],                              # the reduce-scatter on a gather adapter's job
    ["_torch_setup"],                               # one job per process group
    ["_fsdp_zero_copy", "_zero3_zero_copy"],        # the framework patches
    ["torch"],                                      # the switches: the module API, install()
    ["_autoload", "check", "service"],              # DMAGATHER_ALLGATHER=1; the check tool; the node service
    ["_commands"],                                  # the wheel's dmagatherd / dmagatherctl commands
]
RANK = {m: i for i, layer in enumerate(LAYERS) for m in layer}
PACKAGE = "dmagather"


def package_imports(path, module):
    """The package's modules that `module` (a file of the package) imports, with line numbers."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == PACKAGE:
                    out.append((parts[1] if len(parts) > 1 else "__init__", node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] != PACKAGE:
                continue
            if node.level > 1:
                out.append(("<outside the package>", node.lineno))
                continue
            base = (node.module or "").split(".")
            if node.level == 0:
                base = base[1:]
            if base and base[0]:
                out.append((base[0], node.lineno))
            else:  # from . import a, b  /  from dmagather import a
                for a in node.names:
                    out.append((a.name if a.name in RANK else "__init__", node.lineno))
    return [(m, line) for m, line in out if m != module]


def violations(package_dir):
    bad = []
    for f in sorted(os.listdir(package_dir)):
        if not f.endswith(".py"):
            continue
        module = f[:-3]
        if module not in RANK:
            bad.append(f"{f}: not in any layer (give it one in tests/python/layering_test.py)")
            continue
        for target, line in package_imports(os.path.join(package_dir, f), module):
            if target not in RANK:
                bad.append(f"{f}:{line}: imports {target}, which is in no layer")
            elif RANK[target] >= RANK[module]:
                bad.append(f"{f}:{line}: imports {target} (layer {RANK[target]}), not below {module} "
                           f"(layer {RANK[module]})")
    return bad


class LayeringTest(unittest.TestCase):
    def test_each_module_imports_only_lower_layers(self):
        bad = violations(PACKAGE_DIR)
        self.assertEqual(bad, [], "\n" + "\n".join(bad))

    def test_a_planted_upward_import_is_found(self):
        """The check itself: an upward import (the adapter importing a switch)
        inside a function is caught."""
        import tempfile
        import shutil
        with tempfile.TemporaryDirectory() as d:
            for f in os.listdir(PACKAGE_DIR):
                if f.endswith(".py"):
                    shutil.copy(os.path.join(PACKAGE_DIR, f), d)
            with open(os.path.join(d, "_torch_gather.py"), "a") as f:
                f.write("\n\ndef _planted():\n    from .torch import get\n    return get\n")
            bad = violations(d)
            self.assertEqual(len(bad), 1, bad)
            self.assertIn("_torch_gather.py", bad[0])
            self.assertIn("imports torch", bad[0])


PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python", PACKAGE)

if __name__ == "__main__":
    if len(sys.argv) > 1 and os.path.isdir(sys.argv[1]):
        PACKAGE_DIR = sys.argv.pop(1)
    unittest.main()
