"""DMAGATHER_ALLGATHER=1 as the only switch: no import or call in the script.

`dmagather_autoload.pth` (installed next to the package in site-packages)
imports this module at interpreter start-up only when DMAGATHER_ALLGATHER is
exactly "1"; otherwise the .pth costs one environment look-up. This module
imports nothing heavy: it waits for `torch.distributed` to be imported (a
sys.meta_path hook that runs once, right after torch.distributed's module
body), then replaces each all-gather entry point of `torch.distributed`
(`all_gather_into_tensor`, and `all_gather_single` from torch 2.15 on, which
FSDP2 calls there: `_torch_entry`) by a thin function. Anything that takes the function afterwards — DeepSpeed's
TorchBackend captures it once, when it is built; `from torch.distributed
import all_gather_into_tensor` — gets that function, whenever the script
calls init_process_group or deepspeed.initialize. It also arms DeepSpeed
ZeRO-3's zero-copy fetch (`_zero3_zero_copy`) for when DeepSpeed's ZeRO-3
module loads, so that every parameter DeepSpeed converts gathers into its own
storage. With DMAGATHER_REDUCE_SCATTER=1 too, it replaces the reduce-scatter's
entry points alike (`reduce_scatter_tensor`; `reduce_scatter_single` on torch
2.15: what DeepSpeed ZeRO-3 and FSDP2 call for their gradients); those are
served on a group's job once its first all-gather has set it up, where every
rank of the group asked for it (dmagather.torch.serve_reduce_scatter).

The collective setup happens at a group's first all-gather, which every rank
of the group makes at the same point of the program: WORLD's job
(dmagather.torch.init(): the WORLD group, or a group of every rank in rank
order) or a job of the group's own (dmagather.torch.adapter_for: an HSDP shard
group, a mesh dimension, a DeepSpeed group). Rank 0 logs one line per job it
is part of: `dmagather allgather enabled (...)` or `dmagather allgather
unavailable (...)`.

Set the variable on every rank (launchers pass the environment to every rank):
a rank without it never takes part in the setup.
"""
import os
import sys
import threading

from . import _import_hook
from . import _torch_entry

ENV = "DMAGATHER_ALLGATHER"
RS_ENV = "DMAGATHER_REDUCE_SCATTER"
TARGET = "torch.distributed"

_lock = threading.RLock()  # an import inside the set-up may reach the finder
_orig = None        # torch's all-gather (the framework path of every op not served)
_adapter = None     # WORLD's adapter (dmagather.torch's) once a call on WORLD set it up
_by_group = {}      # process group (None: WORLD) -> the adapter that serves it
_patched = {}       # entry point name -> our function in its place (to tell whether it still is)


def _setup(group):
    """Collective over `group`: the first call of every rank of a group comes
    here (WORLD's job, or the group's own: dmagather.torch.adapter_for).
    None for a group of one rank (torch's function serves it)."""
    global _adapter
    import dmagather.torch as dt
    a = dt.adapter_for(group, _default_enabled=False, _origin="DMAGATHER_ALLGATHER=1", host_staging=True)
    if a is None:
        return None
    a._orig = _orig
    if a.backend == "host" and not a.stream_ordered and dt._env_flag("DMAGATHER_HOST_STAGING") is not False:
        a.host_staging = True  # also when a script's own init() made the adapter first
    if a is dt.get():
        _adapter = a
    if a.comm is not None:
        dt._fsdp_zero_copy.enable()  # FSDP2's unshard without copy-in/out from its next all-gather on
    return a


def _entry(name, orig):
    """dmagather's function for torch.distributed.<name> (same signature as
    torch's all_gather_into_tensor / all_gather_single)."""
    def entry(output_tensor, input_tensor, group=None, async_op=False):
        a = _adapter if group is None else _by_group.get(group)
        if a is None:
            import torch.distributed as dist
            if not dist.is_initialized():
                return orig(output_tensor, input_tensor, group=group, async_op=async_op)
            with _lock:
                a = _by_group.get(group) or _setup(group)
            if a is None:  # a group of one rank
                return orig(output_tensor, input_tensor, group=group, async_op=async_op)
            _by_group[group] = a
        # order_now: the current stream is ordered at the call, also with
        # async_op=True, so callers that record an event right after the call
        # (FSDP2's default all-gather) and callers that wait on the Work (ZeRO-3)
        # are both correct.
        return a.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op,
                                        order_now=True)

    try:
        import functools
        functools.update_wrapper(entry, orig)
    except Exception:  # noqa: BLE001
        pass
    entry._dmagather_original = orig  # dmagather.torch finds torch's function through it
    entry._dmagather_entry = name
    return entry


def _rs_entry(name, orig, sum_op):
    """dmagather's function for torch.distributed.<name> (reduce_scatter_tensor /
    reduce_scatter_single's signature)."""
    def entry(output, input, op=sum_op, group=None, async_op=False):
        if _adapter is None and not _by_group:  # no job set up yet: nothing to serve it
            return orig(output, input, op=op, group=group, async_op=async_op)
        import dmagather.torch as dt
        return dt.serve_reduce_scatter(orig, output, input, op, group, async_op)

    try:
        import functools
        functools.update_wrapper(entry, orig)
    except Exception:  # noqa: BLE001
        pass
    entry._dmagather_original = orig
    entry._dmagather_entry = name
    return entry


def _patch_reduce_scatter(dist_module):
    """DMAGATHER_REDUCE_SCATTER=1: the reduce-scatter's entry points too (the
    job's set-up decides, collectively, whether they are served)."""
    if os.environ.get(RS_ENV) != "1":
        return
    for n in _torch_entry.present_rs(dist_module):
        _patched[n] = _rs_entry(n, getattr(dist_module, n), dist_module.ReduceOp.SUM)
        setattr(dist_module, n, _patched[n])


def patch(dist_module):
    """Puts every all-gather entry point this torch has (_torch_entry) on
    dmagather in torch.distributed (idempotent). Rank 0 of a torch outside the
    tested versions says so, once, here: before any all-gather."""
    global _orig
    with _lock:
        if is_patched(dist_module):
            return
        names = _torch_entry.present(dist_module)
        if not names:  # torch without the collective: nothing to serve
            return
        originals = {n: getattr(dist_module, n) for n in names}
        # The framework path: torch's own function (all_gather_into_tensor where
        # it exists: on 2.15 an alias of all_gather_single).
        _orig = originals[names[0]]
        for n in names:
            _patched[n] = _entry(n, originals[n])
            setattr(dist_module, n, _patched[n])
        _patch_reduce_scatter(dist_module)
        _name_untested_torch(names)


def _name_untested_torch(names):
    if os.environ.get("RANK", "0") == "0":
        import logging
        from torch.version import __version__  # torch itself may still be importing
        _torch_entry.name_untested_once(__version__, names, logging.getLogger("dmagather"))


def is_patched(m=None):
    """Every entry point of this torch.distributed is dmagather's."""
    m = m if m is not None else sys.modules.get(TARGET)
    if m is None or not _patched:
        return False
    names = _torch_entry.present(m)
    return bool(names) and all(getattr(m, n) is _patched.get(n) for n in names)


def activate():
    """Called at start-up when DMAGATHER_ALLGATHER=1."""
    m = sys.modules.get(TARGET)
    if m is not None and _torch_entry.present(m):
        patch(m)
    else:
        _import_hook.after_import(TARGET, patch)
    # DeepSpeed ZeRO-3's fetches gather into the parameters (no flat buffer),
    # for every parameter DeepSpeed converts: armed before its module loads.
    _import_hook.after_import(_torch_entry.ZERO3_MODULE, _arm_zero3)


def _arm_zero3(_module):
    from . import _zero3_zero_copy
    _zero3_zero_copy.arm()


if os.environ.get(ENV) == "1":
    activate()
