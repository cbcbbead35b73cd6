"""PyTorch adapter: torch.distributed's all_gather_into_tensor on dmagather.

Three ways in (docs/TRAINERS.md has the whole story):

    import dmagather.torch as dt
    dist.init_process_group(...)                  # any backend; WORLD on one node
    # 1. direct API, torch.distributed's semantics
    dt.all_gather_into_tensor(output, input, group=None, async_op=False)
    dt.all_gather_coalesced(outputs, inputs, async_op=True).wait()
    # 2. ZeRO-3: DMAGATHER_ALLGATHER=1 in the environment plus, once, after init_process_group:
    dt.install()                                  # routes dist.all_gather_into_tensor of WORLD
    # 3. FSDP2 (torch >= 2.11):
    for m in model.modules():
        if isinstance(m, FSDPModule): m.set_custom_all_gather(dt.FSDPAllGather())

Setup (`init()`, called by all three on first use) is collective over the WORLD
group, once: every rank says whether it is enabled (DMAGATHER_ALLGATHER), its
DMAGATHER_MAX_NUMEL, and rank 0 draws a random job key, all in one all_reduce;
then every rank joins the daemon's job with a short join timeout and a second
all_reduce tells every rank whether all joined. Any "no" anywhere disables
dmagather on every rank (rank 0 logs why, once). So the per-rank conditions
(env, daemon, join) end in one decision.

Per op, the same decision on every rank:
- decided before submit, from what is equal on every rank of a correct program:
  enabled (agreed at init), the group is WORLD, shard numel <= max_numel (the
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
import secrets
import sys
import threading

import torch
import torch.distributed as dist

from . import Comm, DmagatherError, FallbackError, DTYPES, MAX_COALESCED, Op, _Gather, load_library
from . import _fsdp_zero_copy
from . import _torch_entry
from . import _zero3_zero_copy
from ._torch_gather import (DEFAULT_MAX_NUMEL, REASONS, DmagatherAllGather, StreamOrderedError, Work,
                            _env_flag, _max_numel_from_env, log)

__all__ = ["init", "install", "uninstall", "is_installed", "get", "all_gather_into_tensor", "all_gather_coalesced",
           "synchronize", "stats", "shutdown", "Work", "FSDPAllGather", "DmagatherAllGather", "StreamOrderedError",
           "REASONS", "DEFAULT_MAX_NUMEL"]

DEFAULT_JOIN_TIMEOUT_MS = 10000      # at init; DMAGATHER_JOIN_TIMEOUT_MS overrides


def _reduce_device():
    """Where the WORLD group's all_reduce takes its tensor."""
    b = str(dist.get_backend()).lower()
    if b == "nccl" or (b.startswith("cuda:") and "cpu:" not in b):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---- the process-wide adapter ---------------------------------------------------

_adapter = None
_installed = None  # torch's all-gather (the framework path) while installed
_installed_entries = {}  # entry point name (or "deepspeed") -> what install() replaced there
_ds_backend = None  # DeepSpeed's backend whose captured all_gather_function install() replaced
_glock = threading.Lock()


def get():
    """The process's adapter, or None before init()."""
    return _adapter


def _join_all(key, world, rank, socket, join_timeout_ms, dev):
    """Every rank joins the daemon's job, then one all_reduce tells every rank
    whether all did. Returns (comm, None), or (None, (reason kind, sentence))
    on every rank when any rank could not join."""
    unavailable = None
    comm = None
    jt = join_timeout_ms
    if jt is None:
        jt = int(os.environ.get("DMAGATHER_JOIN_TIMEOUT_MS") or DEFAULT_JOIN_TIMEOUT_MS)
    code, why = 0, ""
    try:
        comm = Comm(key, world, rank, socket=socket, join_timeout_ms=jt, local_rank=rank,
                    local_world_size=world)
    except DmagatherError as e:
        code, why = (1 if e.status == "UNAVAILABLE" else 2), str(e)
    except OSError as e:  # libdmagather.so not found
        code, why = 1, str(e)
    v = torch.zeros(world, dtype=torch.int64)
    v[rank] = code
    v = v.to(dev)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    v = v.cpu().tolist()
    bad = [r for r in range(world) if v[r]]
    if bad:
        if comm is not None:
            try:
                comm.close()
            except DmagatherError:
                pass
            comm = None
        ones = [str(r) for r in bad if v[r] == 1]
        twos = [str(r) for r in bad if v[r] != 1]
        parts = ([f"daemon unreachable on rank(s) {','.join(ones)}"] if ones else []) + \
                ([f"join failed on rank(s) {','.join(twos)}"] if twos else [])
        kind = "daemon_unreachable" if ones else "join_failed"
        unavailable = (kind, "; ".join(parts) + (f" (this rank: {why})" if why else ""))
    return comm, unavailable


def init(*, enabled=None, socket=None, max_numel=None, join_timeout_ms=None, job_key=None, stream_ordered=None,
         host_staging=None, _default_enabled=True, _origin=None):
    """Collective (every rank of WORLD calls it, once): agrees on enabled,
    max_numel and a job key, joins the daemon, agrees that every rank joined.
    Returns the adapter; when disabled, every op goes to the framework.

    enabled: default $DMAGATHER_ALLGATHER (install(): must be 1; the direct API
    and FSDPAllGather: on unless it is 0). socket: default $DMAGATHER_SOCKET.
    max_numel: default $DMAGATHER_MAX_NUMEL, then 2**28. join_timeout_ms: default
    $DMAGATHER_JOIN_TIMEOUT_MS, then 10 s. job_key: default a random key from
    rank 0 (every rank must pass the same one). host_staging: host backend,
    stage private CPU tensors through daemon memory (default
    $DMAGATHER_HOST_STAGING, else off; the DMAGATHER_ALLGATHER=1 start-up hook
    turns it on)."""
    global _adapter
    with _glock:
        if _adapter is not None:
            return _adapter
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("dmagather.torch.init(): call torch.distributed.init_process_group() first")
        rank, world = dist.get_rank(), dist.get_world_size()
        fw = str(dist.get_backend())
        if enabled is None:
            env = _env_flag("DMAGATHER_ALLGATHER")
            enabled = _default_enabled if env is None else env
        mine = int(max_numel) if max_numel is not None else _max_numel_from_env()
        local_world = os.environ.get("LOCAL_WORLD_SIZE")
        spans_nodes = local_world is not None and local_world.isdigit() and int(local_world) != world
        dev = _reduce_device()
        # One all_reduce(MAX): [disabled flag of each rank..., spans nodes, -max_numel, key words of rank 0].
        t = torch.zeros(world + 4, dtype=torch.int64)
        t[rank] = 0 if enabled else 1
        t[world] = 1 if spans_nodes else 0
        t[world + 1] = -max(1, mine)
        if rank == 0:
            t[world + 2] = secrets.randbits(62)
            t[world + 3] = secrets.randbits(62)
        t = t.to(dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t = t.cpu().tolist()
        disabled = [r for r in range(world) if t[r]]
        agreed_max = -t[world + 1]
        key = job_key or f"torch-{t[world + 2]:016x}{t[world + 3]:016x}"
        unavailable = None
        comm = None
        if disabled:
            which = "" if len(disabled) == world else f" on rank(s) {','.join(map(str, disabled))}"
            unavailable = ("not_enabled", f"not enabled{which}: DMAGATHER_ALLGATHER is not 1")
        elif t[world]:
            unavailable = ("join_failed", f"the job spans several nodes (LOCAL_WORLD_SIZE != {world})")
        else:
            comm, unavailable = _join_all(key, world, rank, socket, join_timeout_ms, dev)
        env_staging = _env_flag("DMAGATHER_HOST_STAGING")
        staging = env_staging if env_staging is not None else bool(host_staging)
        _adapter = DmagatherAllGather(key, world, rank, comm=comm, max_numel=agreed_max, unavailable=unavailable,
                                      backend_name=fw, stream_ordered=stream_ordered, host_staging=staging)
        if os.environ.get("DMAGATHER_STATS_FILE"):
            import atexit
            atexit.register(_write_stats, os.environ["DMAGATHER_STATS_FILE"], _adapter)
        if rank == 0:
            _torch_entry.name_untested_once(torch.__version__, _torch_entry.present(dist), log)
            extra = f", {_origin}" if _origin else ""
            if _adapter.host_staging:
                extra += ", host staging"
            if os.environ.get("DS_SDMA_ALLGATHER", "0").strip().lower() in ("1", "true", "yes", "on"):
                # DeepSpeed's TorchBackend tries its mori SDMA path before the
                # all-gather function it captured (this one); without mori it is off.
                extra += "; DS_SDMA_ALLGATHER is set: DeepSpeed's SDMA path, where mori is installed, is tried first"
            if comm is not None:
                log.warning("dmagather allgather enabled (backend=%s, max_numel=%d%s), torch %s", comm.backend,
                            agreed_max, extra, torch.__version__)
            else:
                log.warning("dmagather allgather unavailable (%s); using %s allgather%s", unavailable[1], fw,
                            f" ({extra.lstrip(', ')})" if extra else "")
        return _adapter


def _write_stats(path, a):
    """DMAGATHER_STATS_FILE=PATH: at exit each rank writes its counters (stats())
    as JSON to PATH with {rank} replaced (or PATH.RANK)."""
    import json
    path = path.replace("{rank}", str(a.rank)) if "{rank}" in path else f"{path}.{a.rank}"
    try:
        with open(path, "w") as f:
            json.dump(dict(a.stats(), rank=a.rank, world_size=a.world_size), f)
    except OSError:
        pass


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """torch.distributed.all_gather_into_tensor through dmagather (flat output:
    rank r's input lands at output[r * numel:(r + 1) * numel])."""
    a = _adapter or init()
    return a.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def all_gather_coalesced(outputs, inputs, group=None, async_op=False):
    """Many all_gather_into_tensor in one op per 64 tensors (one matching, one
    completion); items may differ in numel and dtype."""
    a = _adapter or init()
    return a.all_gather_coalesced(outputs, inputs, group=group, async_op=async_op)


def synchronize():
    if _adapter is not None:
        _adapter.synchronize()


def stats():
    return _adapter.stats() if _adapter is not None else None


def _torch_all_gather_into_tensor():
    """torch's own all_gather_into_tensor (or all_gather_single, where that is
    all there is), under install()'s patch and the DMAGATHER_ALLGATHER=1
    start-up hook's (dmagather._autoload)."""
    f = getattr(dist, _torch_entry.present(dist)[0])
    for _ in range(4):
        if f is _patched_all_gather_into_tensor and _installed is not None:
            f = _installed
        elif getattr(f, "_dmagather_original", None) is not None:
            f = f._dmagather_original
        else:
            break
    return f


def _patched_all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    return _adapter.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


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
    alone, through the start-up hook, needs no call at all.)"""
    global _installed, _ds_backend
    init_kwargs.setdefault("_default_enabled", False)
    a = init(**init_kwargs)
    with _glock:
        if _installed is None:
            originals = {n: getattr(dist, n) for n in _torch_entry.present(dist)}
            _installed = _torch_all_gather_into_tensor()
            _installed_entries.update(originals)
            a._orig = _installed
            for n in originals:
                setattr(dist, n, _patched_all_gather_into_tensor)
            cdb = _deepspeed_backend()
            if cdb is not None and getattr(cdb, "all_gather_function", None) in (_installed, *originals.values()):
                _ds_backend, _ds_original = cdb, cdb.all_gather_function
                cdb.all_gather_function = _patched_all_gather_into_tensor
                _installed_entries["deepspeed"] = _ds_original
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


def uninstall():
    global _installed, _ds_backend
    with _glock:
        if _installed is not None:
            for n, orig in _installed_entries.items():
                if n != "deepspeed" and getattr(dist, n, None) is _patched_all_gather_into_tensor:
                    setattr(dist, n, orig)
            if _ds_backend is not None and getattr(_ds_backend, "all_gather_function", None) is \
                    _patched_all_gather_into_tensor:
                _ds_backend.all_gather_function = _installed_entries["deepspeed"]
            _installed_entries.clear()
            _ds_backend = None
            _installed = None


def shutdown():
    """uninstall(), then leave the job (waits for outstanding ops)."""
    global _adapter
    uninstall()
    with _glock:
        if _adapter is not None:
            a, _adapter = _adapter, None
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
        return self.adapter.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op,
                                                   order_now=True)
