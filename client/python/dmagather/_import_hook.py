"""Runs a function right after a module's body, whenever that module is first
imported (now, if it is loaded): a sys.meta_path finder that finds nothing
itself, wraps the hooked module's loader, and steps aside once every hook ran.
Imports nothing heavy. The start-up hook (`_autoload`) waits for
torch.distributed with it, the ZeRO-3 patch (`_zero3_zero_copy`) for
DeepSpeed's ZeRO-3 module."""
import importlib.abc
import sys
import threading

_lock = threading.RLock()  # an import inside a callback may reach the finder


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, callbacks):
        self.inner = inner
        self.callbacks = callbacks

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        for fn in self.callbacks:
            fn(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ... of the real loader
        return getattr(self.inner, name)


_hooks = {}      # module name -> what runs right after its module body
_finder = None


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of a hooked module so that its
    callbacks run right after the module body, then steps aside for it."""

    def find_spec(self, fullname, path, target=None):
        with _lock:
            callbacks = _hooks.pop(fullname, None)
            if callbacks is None:
                return None
            if not _hooks:
                _remove_finder()
        for f in sys.meta_path:
            find = getattr(f, "find_spec", None)
            if f is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, callbacks)
                return spec
        return None


def _remove_finder():
    global _finder
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None


def after_import(name, fn):
    """fn(module) right after module `name`'s body runs (now, if it is loaded)."""
    global _finder
    m = sys.modules.get(name)
    if m is not None:
        fn(m)
        return
    with _lock:
        _hooks.setdefault(name, []).append(fn)
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)


