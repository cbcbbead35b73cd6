"""PyTorch adapter: torch.distributed's all-gather on dmagather (all_gather_into_tensor;
all_gather_single on torch 2.15), for WORLD and every sub-group; with
DMAGATHER_REDUCE_SCATTER=1 its reduce-scatter too (reduce_scatter_tensor;
reduce_scatter_single on torch 2.15; _torch_reduce), on the same jobs.

Three ways in (docs/TRAINERS.md has the whole story):

    import dmagather.torch as dt
    dist.init_process_group(...)                  # any backend; one node or several
    # 1. direct API, torch.distributed's semantics
    dt.all_gather_into_tensor(output, input, group=None, async_op=False)
    dt.all_gather_coalesced(outputs, inputs, async_op=True).wait()
    dt.reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None)  # SUM, AVG (DMAGATHER_REDUCE_SCATTER=1)
    # 2. ZeRO-3: DMAGATHER_ALLGATHER=1 in the environment plus, once, after init_process_group:
    dt.install()                                  # routes torch.distributed's all-gather, every group
    # 3. FSDP2 (torch >= 2.11):
    for m in model.modules():
        if isinstance(m, FSDPModule): m.set_custom_all_gather(dt.FSDPAllGather())

Setup is collective, once per job: WORLD's (`init()`, called by all three on
first use) and each other group's (`adapter_for(group)`, at that group's first
all-gather), over the group itself (_torch_setup): every rank says whether it
is enabled (DMAGATHER_ALLGATHER), its DMAGATHER_MAX_NUMEL and its node, and the
group's first rank draws a random job key, all in one all_reduce; a group across
nodes gets a multi-node job id from its first rank; then every rank joins with
a short join timeout and a last all_reduce tells every rank whether all joined.
Any "no" anywhere disables that job on every rank of the group (rank 0 logs
why, once). So the per-rank conditions (env, daemon, join) end in one decision.

Per op, the same decision on every rank:
- decided before submit, from what is equal on every rank of a correct program:
  enabled (agreed at setup), shard numel <= max_numel (the
  numel of a collective is equal on every rank; max_numel is agreed at init),
  the dtype is supported. These go to the framework's own all-gather without
  touching the daemon (Python counters only).
- everything about memory (the backend cannot reach a tensor, it is not
  contiguous) is this rank's business: it submits a refusal
  (`Comm.submit_fallback`) or the library refuses its submit; the op then has
  the verdict FALLBACK on every rank (the daemon counts it as fallback_ops).

When is the verdict read?
- CPU (host backend): always on the host (`Op.wait()`), then FALLBACK means:
  every rank runs the framework's all-gather for this op.
- CUDA: per *signature* (each item's dtype, input numel, output numel: equal on
  every rank, pointers are deliberately not part of it). The first op of a
  signature, and every op of a signature whose last verdict was a fallback, is
  host-waited on every rank (with the collective fallback as on CPU). Once a
  signature was served, its later ops are stream-ordered: the current stream
  waits on the GPU (`Op.wait_stream`), the host does not block, and the status
  is checked lazily (`Op.test()` at the next calls, `synchronize()`, `close()`).
  A failure found that way can no longer fall back (other ranks went on), so it
  raises StreamOrderedError on every rank, and every later call raises it too:
  an error, never silently wrong data. A rank that itself refuses such an op
  (e.g. memory the backend cannot reach) submits the refusal, so nobody hangs,
  and raises at once.
"""

import os
import sys
import threading

import torch
import torch.distributed as dist

from . import DmagatherError, FallbackError  # noqa: F401  (re-exported: what a caller catches)
from . import _fsdp_zero_copy
from . import _torch_entry
from . import _torch_reduce
from . import _torch_setup
from . import _zero3_zero_copy
from ._torch_gather import (DEFAULT_MAX_NUMEL, REASONS, DmagatherAllGather, StreamOrderedError, Work,
                            _env_flag, log)

__all__ = ["init", "adapter_for", "group_adapters", "install", "uninstall", "is_installed", "get",
           "all_gather_into_tensor", "all_gather_coalesced", "reduce_scatter_tensor",
           "synchronize", "stats", "shutdown", "Work", "FSDPAllGather", "DmagatherAllGather", "StreamOrderedError",
           "REASONS", "DEFAULT_MAX_NUMEL"]

DEFAULT_JOIN_TIMEOUT_MS = _torch_setup.DEFAULT_JOIN_TIMEOUT_MS


# ---- the process-wide adapters ---------------------------------------------------

_adapter = None    # WORLD's (init())
_groups = {}       # process group -> the adapter that serves it: WORLD's, or the group's own job
_group_settings = {}  # init()'s socket, max_numel, join timeout, stream_ordered: every group's job takes them
_installed = None  # torch's all-gather (the framework path) while installed
_installed_entries = {}  # entry point name (or "deepspeed", "deepspeed_rs") -> what install() replaced there
_ds_backend = None  # DeepSpeed's backend whose captured all_gather_function install() replaced
_glock = threading.RLock()


def get():
    """The process's WORLD adapter, or None before init()."""
    return _adapter


def _enabled(enabled, default):
    if enabled is None:
        env = _env_flag("DMAGATHER_ALLGATHER")
        enabled = default if env is None else env
    return enabled


def init(*, enabled=None, socket=None, max_numel=None, join_timeout_ms=None, job_key=None, stream_ordered=None,
         host_staging=None, reduce_scatter=None, _default_enabled=True, _origin=None):
    """Collective (every rank of WORLD calls it, once): agrees on enabled,
    max_numel and a job key, joins the daemon (or, when WORLD spans nodes, the
    daemons' multi-node job), agrees that every rank joined (_torch_setup).
    Returns the adapter; when disabled, every op goes to the framework.

    enabled: default $DMAGATHER_ALLGATHER (install(): must be 1; the direct API
    and FSDPAllGather: on unless it is 0). socket: default $DMAGATHER_SOCKET.
    max_numel: default $DMAGATHER_MAX_NUMEL, then 2**28. join_timeout_ms: default
    $DMAGATHER_JOIN_TIMEOUT_MS, then 10 s. job_key: default a random key from
    rank 0 (every rank must pass the same one). host_staging: host backend,
    stage private CPU tensors through daemon memory (default
    $DMAGATHER_HOST_STAGING, else off; the DMAGATHER_ALLGATHER=1 start-up hook
    turns it on). reduce_scatter: serve reduce_scatter_tensor too, in every
    group's job (default $DMAGATHER_REDUCE_SCATTER == 1; agreed like enabled)."""
    global _adapter
    with _glock:
        if _adapter is not None:
            return _adapter
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("dmagather.torch.init(): call torch.distributed.init_process_group() first")
        _group_settings.update(socket=socket, max_numel=max_numel, join_timeout_ms=join_timeout_ms,
                               stream_ordered=stream_ordered, reduce_scatter=reduce_scatter)
        a = _torch_setup.setup(None, enabled=_enabled(enabled, _default_enabled), job_key=job_key,
                               host_staging=host_staging, **_group_settings)
        a.group = None
        _adapter = a
        _register_stats_file()
        if a.rank == 0:
            _torch_entry.name_untested_once(torch.__version__, _torch_entry.present(dist), log)
            _log_start(a, "", _origin)
        return a


def _log_start(a, what, origin):
    """The one line of a job's first rank: enabled, or unavailable and why."""
    extra = f", {origin}" if origin else ""
    if a.host_staging:
        extra += ", host staging"
    if a.nodes > 1:
        extra += f", {a.nodes} nodes"
    if os.environ.get("DS_SDMA_ALLGATHER", "0").strip().lower() in ("1", "true", "yes", "on"):
        # DeepSpeed's TorchBackend tries its mori SDMA path before the
        # all-gather function it captured (this one); without mori it is off.
        extra += "; DS_SDMA_ALLGATHER is set: DeepSpeed's SDMA path, where mori is installed, is tried first"
    if a.comm is not None:
        log.warning("dmagather allgather enabled%s (backend=%s, max_numel=%d%s), torch %s", what, a.comm.backend,
                    a.max_numel, extra, torch.__version__)
    else:
        log.warning("dmagather allgather unavailable%s (%s); using %s allgather%s", what, a.unavailable[1],
                    a.framework_backend, f" ({extra.lstrip(', ')})" if extra else "")
    rs = getattr(a, "reduce_scatter", None)
    line = rs.describe(_torch_entry.present_rs(dist)) if rs is not None else None
    if line is not None:
        where = what.strip() or "for WORLD"
        if rs.serving:
            log.warning("%s %s on the %s backend", line, where, a.comm.backend)
        else:
            log.warning("%s %s", line, where)


def _world_like(group):
    """WORLD, or a group of every rank in rank order (FSDP2's 1-D mesh): WORLD's job."""
    if group is None or group is dist.group.WORLD:
        return True
    try:
        if group is dist.distributed_c10d._get_default_group():
            return True
        return dist.get_process_group_ranks(group) == list(range(dist.get_world_size()))
    except Exception:  # noqa: BLE001
        return False


def adapter_for(group, *, setup=True, enabled=None, host_staging=None, _default_enabled=True, _origin=None):
    """The adapter that serves `group`: WORLD's (init()) for WORLD or a group of
    every rank in rank order; for any other group of two or more ranks its own
    job, set up collectively over that group at its first call (every rank of
    the group calls this at the same point: its first all-gather). None for a
    group of one rank, or (setup=False) a group not set up yet."""
    a = _groups.get(group)
    if a is not None:
        return a
    if _world_like(group):
        if _adapter is None and not setup:
            return None
        a = _adapter or init(enabled=enabled, host_staging=host_staging, _default_enabled=_default_enabled,
                             _origin=_origin)
    else:
        if not setup or dist.get_world_size(group) < 2:
            return None
        with _glock:
            a = _groups.get(group)
            if a is None:
                a = _torch_setup.setup(group, enabled=_enabled(enabled, _default_enabled),
                                       host_staging=host_staging, **_group_settings)
                _register_stats_file()
                if dist.get_rank() == 0:
                    r = a.ranks
                    _log_start(a, f" for a group of {len(r)} ranks ({','.join(map(str, r[:16]))}"
                                  f"{',...' if len(r) > 16 else ''})", _origin)
    _groups[group] = a
    return a


def group_adapters():
    """The adapters of the groups that have their own job (not WORLD's)."""
    return [a for g, a in list(_groups.items()) if a is not _adapter]


_stats_registered = False


def _register_stats_file():
    """DMAGATHER_STATS_FILE=PATH: at exit each rank writes its counters as JSON
    to PATH with {rank} replaced (or PATH.RANK): WORLD's (stats()) at the top
    level, each group's own job under "groups"."""
    global _stats_registered
    path = os.environ.get("DMAGATHER_STATS_FILE")
    if path and not _stats_registered:
        import atexit
        _stats_registered = True
        atexit.register(_write_stats, path, dist.get_rank(), dist.get_world_size())


def _write_stats(path, rank, world):
    import json
    path = path.replace("{rank}", str(rank)) if "{rank}" in path else f"{path}.{rank}"
    groups = [dict(a.stats(), group_rank=a.rank, group_size=a.world_size, ranks=a.ranks) for a in group_adapters()]
    top = _adapter.stats() if _adapter is not None else {}
    try:
        with open(path, "w") as f:
            json.dump(dict(top, rank=rank, world_size=world, groups=groups), f)
    except OSError:
        pass


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """torch.distributed.all_gather_into_tensor through dmagather (flat output:
    rank r's input lands at output[r * numel:(r + 1) * numel]), on WORLD's job
    or the group's own (adapter_for)."""
    a = adapter_for(group)
    if a is None:  # a group of one rank
        return _torch_all_gather_into_tensor()(output_tensor, input_tensor, group=group, async_op=async_op)
    return a.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def all_gather_coalesced(outputs, inputs, group=None, async_op=False):
    """Many all_gather_into_tensor in one op per 64 tensors (one matching, one
    completion); items may differ in numel and dtype."""
    a = adapter_for(group)
    if a is None:  # a group of one rank
        works = [all_gather_into_tensor(o, i, group=group, async_op=async_op) for o, i in zip(outputs, inputs)]
        return Work(torch_works=works) if async_op else None
    return a.all_gather_coalesced(outputs, inputs, group=group, async_op=async_op)


def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """torch.distributed.reduce_scatter_tensor through dmagather (input: every
    rank's chunk in rank order; output: this rank's chunk of the SUM or AVG),
    on WORLD's job or the group's own (adapter_for), where the job's set-up
    agreed on it (DMAGATHER_REDUCE_SCATTER=1 or init(reduce_scatter=True) on
    every rank); else, and for other ops, torch's."""
    a = adapter_for(group)
    if a is None:  # a group of one rank
        return _torch_reduce_scatter()(output, input, op=op, group=group, async_op=async_op)
    return _torch_reduce.of(a).reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)


def _torch_reduce_scatter():
    """torch's own reduce_scatter_tensor under dmagather's replacements."""
    return _torch_entry.torch_original(dist, _torch_entry.RS_ENTRY_POINTS)


def serve_reduce_scatter(orig, output, input, op, group, async_op):
    """The replaced reduce-scatter entry points (install()'s and the start-up
    hook's): served on the group's job once it is set up (its first
    all-gather: no collective of its own here, so a rank decides alone and
    every rank alike); before that, and for a group of one rank, torch's."""
    a = adapter_for(group, setup=False)
    if a is None:
        return orig(output, input, op=op, group=group, async_op=async_op)
    rs = _torch_reduce.of(a)
    if rs._orig is None:
        rs._orig = orig
    # order_now: the current stream is ordered at the call (FSDP2 records its
    # event right after the call; DeepSpeed waits at once).
    return rs.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op, order_now=True)


def synchronize():
    for a in ([_adapter] if _adapter is not None else []) + group_adapters():
        a.synchronize()


def stats():
    """WORLD's counters, with each group's own job under "groups"."""
    if _adapter is None:
        return None
    return dict(_adapter.stats(), groups=[dict(a.stats(), ranks=a.ranks) for a in group_adapters()])


def _torch_all_gather_into_tensor():
    """torch's own all_gather_into_tensor (or all_gather_single, where that is
    all there is), under install()'s patch and the DMAGATHER_ALLGATHER=1
    start-up hook's (dmagather._autoload)."""
    return _torch_entry.torch_original(dist)


def _serving(group):
    """_torch_entry.serving: the adapter of `group` while torch's entry points
    are dmagather's (install() or the start-up hook) and the group's job is set
    up, else None (the framework patches ask this)."""
    return adapter_for(group, setup=False) if _torch_entry.is_dmagather(dist) else None


_torch_entry.set_serving(_serving)


def _patched_all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    a = adapter_for(group, _default_enabled=False, host_staging=_adapter.host_staging if _adapter else None)
    if a is None:  # a group of one rank
        return _installed(output_tensor, input_tensor, group=group, async_op=async_op)
    return a.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def _patched_reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    return serve_reduce_scatter(_patched_reduce_scatter_tensor._dmagather_original, output, input, op, group,
                                async_op)


_patched_reduce_scatter_tensor._dmagather_original = None  # install() sets torch's function here


def install(**init_kwargs):
    """ZeRO-3 opt-in: with DMAGATHER_ALLGATHER=1 on every rank, routes
    torch.distributed's all-gather entry points (all_gather_into_tensor, what
    DeepSpeed ZeRO-3 calls; all_gather_single on torch >= 2.15, what FSDP2
    calls there) of the WORLD group through dmagather. Collective (calls
    init()). Every call that dmagather does not serve goes to the original
    function and is counted in stats() by reason. Returns the adapter.

    DeepSpeed's TorchBackend takes torch.distributed.all_gather_into_tensor
    once, when deepspeed.init_distributed() (or deepspeed.initialize()) builds
    it, and calls that function from then on: when DeepSpeed's backend already
    exists, install() replaces the function it holds too. (DMAGATHER_ALLGATHER=1
    alone, through the start-up hook, needs no call at all.) Where the job
    serves the reduce-scatter (DMAGATHER_REDUCE_SCATTER=1), its entry points
    (reduce_scatter_tensor; reduce_scatter_single on torch 2.15) and
    DeepSpeed's captured reduce_scatter_function are replaced alike."""
    global _installed, _ds_backend
    init_kwargs.setdefault("_default_enabled", False)
    a = init(**init_kwargs)
    with _glock:
        if _installed is None:
            originals = {n: getattr(dist, n) for n in _torch_entry.present(dist)}
            _installed = _torch_all_gather_into_tensor()
            _installed_entries.update(originals)
            _patched_all_gather_into_tensor._dmagather_original = _installed
            a._orig = _installed
            for n in originals:
                setattr(dist, n, _patched_all_gather_into_tensor)
            cdb = _deepspeed_backend()
            if cdb is not None and getattr(cdb, "all_gather_function", None) in (_installed, *originals.values()):
                _ds_backend, _ds_original = cdb, cdb.all_gather_function
                cdb.all_gather_function = _patched_all_gather_into_tensor
                _installed_entries["deepspeed"] = _ds_original
            rs = getattr(a, "reduce_scatter", None)
            if rs is not None and rs.serving:
                rs_originals = {n: getattr(dist, n) for n in _torch_entry.present_rs(dist)}
                if rs_originals:
                    _patched_reduce_scatter_tensor._dmagather_original = _torch_reduce_scatter()
                    _installed_entries.update(rs_originals)
                    for n in rs_originals:
                        setattr(dist, n, _patched_reduce_scatter_tensor)
                    if cdb is not None and getattr(cdb, "reduce_scatter_function", None) in \
                            (_patched_reduce_scatter_tensor._dmagather_original, *rs_originals.values()):
                        _installed_entries["deepspeed_rs"] = cdb.reduce_scatter_function
                        _ds_backend = cdb
                        cdb.reduce_scatter_function = _patched_reduce_scatter_tensor
    if a.comm is not None:
        _fsdp_zero_copy.enable()  # FSDP2's default all-gather is ours now: unshard without copy-in/out
        _zero3_zero_copy.arm()  # ZeRO-3's fetches of parameters converted from now on: no flat buffer
    return a


def _deepspeed_backend():
    """DeepSpeed's communication backend object, if DeepSpeed built one."""
    m = sys.modules.get("deepspeed.comm.comm")
    return getattr(m, "cdb", None) if m is not None else None


def is_installed():
    names = _torch_entry.present(dist)
    return _installed is not None and all(getattr(dist, n) is _patched_all_gather_into_tensor for n in names)


_patched_all_gather_into_tensor._dmagather_original = None  # install() sets torch's function here


def uninstall():
    global _installed, _ds_backend
    with _glock:
        if _installed is not None:
            for n, orig in _installed_entries.items():
                if getattr(dist, n, None) in (_patched_all_gather_into_tensor, _patched_reduce_scatter_tensor):
                    setattr(dist, n, orig)
            if _ds_backend is not None and getattr(_ds_backend, "all_gather_function", None) is \
                    _patched_all_gather_into_tensor:
                _ds_backend.all_gather_function = _installed_entries["deepspeed"]
            if _ds_backend is not None and getattr(_ds_backend, "reduce_scatter_function", None) is \
                    _patched_reduce_scatter_tensor:
                _ds_backend.reduce_scatter_function = _installed_entries["deepspeed_rs"]
            _patched_reduce_scatter_tensor._dmagather_original = None
            _installed_entries.clear()
            _patched_all_gather_into_tensor._dmagather_original = None
            _ds_backend = None
            _installed = None


def shutdown():
    """uninstall(), then leave the jobs, WORLD's and the groups' (waits for
    outstanding ops)."""
    global _adapter
    uninstall()
    with _glock:
        adapters = group_adapters() + ([_adapter] if _adapter is not None else [])
        _adapter = None
        _groups.clear()
        for a in adapters:
            a.close()


# ---- FSDP2 ------------------------------------------------------------------------

def _fsdp_allgather_base():
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather
        return AllGather
    except Exception:  # noqa: BLE001  (torch without FSDP2's comm API)
        return object


class FSDPAllGather(_fsdp_allgather_base()):
    """FSDP2's custom all-gather (torch 2.11: FSDPModule.set_custom_all_gather),
    protocol of torch/distributed/fsdp/_fully_shard/_fsdp_api.py.

    allocate(): CUDA, the caching allocator (the cuda backend registers each
    cudaMalloc block once by its base, cached by buffer id, so reused blocks
    cost no registration); CPU on the host backend, pooled daemon shm.
    __call__: the adapter's op on the current stream (FSDP2's all-gather
    stream); the stream is ordered before returning, also with async_op=True,
    because FSDP2 only waits on torch's own Work objects and otherwise on the
    event it records right after this call. Set it on every FSDPModule
    (set_custom_all_gather is per module, not recursive)."""

    def __init__(self, adapter=None):
        self._adapter = adapter
        _fsdp_zero_copy.enable()  # the unshard gathers into the parameters (docs/TRAINERS.md)

    @property
    def adapter(self):
        if self._adapter is None:
            self._adapter = _adapter or init()
        return self._adapter

    def allocate(self, size, *, dtype, device):
        device = torch.device(device)
        a = self.adapter
        if device.type == "cpu" and a.backend == "host":
            return a.empty(tuple(int(s) for s in size), dtype=dtype)
        return torch.empty(tuple(int(s) for s in size), dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group=None, async_op=False):
        a = self.adapter_for(group)
        if a is None:  # a group of one rank
            return _torch_all_gather_into_tensor()(output_tensor, input_tensor, group=group, async_op=async_op)
        return a.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op, order_now=True)

    def dmagather_adapter_for(self, group):
        """The zero-copy unshard's question (_fsdp_zero_copy): this comm's
        adapter for the group, once its job is set up."""
        return self.adapter_for(group, setup=False)

    def adapter_for(self, group, setup=True):
        """The adapter given to the constructor for its group, else WORLD's or
        the group's own (dmagather.torch.adapter_for)."""
        if self._adapter is not None and self._adapter._is_world(group):
            return self._adapter
        return adapter_for(group, setup=setup)
