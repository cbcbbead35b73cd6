"""FSDP2 zero-copy unshard: each parameter's shard gathered straight into that
parameter's unsharded storage, one coalesced dmagather op per parameter group.

FSDP2's own unshard (torch 2.11 and 2.15, `_fsdp_collectives.py`) runs two SM kernels
around the all-gather: the copy-in (`all_gather_copy_in`: every shard packed
into one flat buffer) and the copy-out (`split_with_sizes_copy`: the whole
gathered buffer rearranged from rank-major into each parameter). Here item p of
the op is parameter p: its shard (after the dtype cast, where mixed precision
asks for one) in this rank's slot, and the daemon writes rank r's part at
offset r * shard_p of parameter p's unsharded storage (`FSDPParam.all_gather_outputs`,
which `init_unsharded_param` views as the parameter). No flat buffer, no
copy-in, no copy-out: on the GPU backends the only work on FSDP2's all-gather
streams is the copy engines'.

torch has no public hook for where the all-gather writes, so this replaces
`foreach_all_gather` in FSDP2's `_fsdp_param_group` module; the copy-out is
replaced too on torch 2.11 (`foreach_all_gather_copy_out`), and taken through
the seam torch 2.15 added, each parameter group's `_all_gather_output_fn`
(enable() says how). That is gated:
- torch major.minor in SUPPORTED_TORCH, and the internals it uses have the
  shape it was written against (signatures, AllGatherResult's fields, FSDPParam
  methods); anything else leaves FSDP2 untouched (status() says why);
- DMAGATHER_FSDP_ZERO_COPY=0 turns it off;
- per parameter group, the same decision on every rank, from what is equal on
  every rank; a group that fails a rule takes FSDP2's own path (copy-in,
  all-gather on dmagather, copy-out), counted by reason in stats():
    compiled     compiled autograd (FSDP2 recreates its buffers per gather there)
    group        the all-gather group is not the adapter's WORLD (e.g. the
                 post-forward mesh of reshard_after_forward=int)
    shard_dim    a parameter sharded on a dim other than 0 (FSDP2 chunk-cats it)
    extension    a tensor subclass with fsdp_pre_all_gather (e.g. float8)
    cpu_offload  CPUOffloadPolicy (shards live on the host)
    host_memory  host backend without host staging: FSDP2's storage is private
                 process memory the daemon cannot reach, while FSDPAllGather's
                 allocate() gives the flat buffer in daemon memory
    output_fn    torch 2.15 on: the group has an _all_gather_output_fn of
                 someone else's (it expects FSDP2's flat buffer)
- the all-gather comm is dmagather's: FSDPAllGather, or FSDP2's default one
  while torch.distributed's all-gather entry points are dmagather's (install()
  or the DMAGATHER_ALLGATHER=1 start-up hook, once set up).

The own shard: where its dtype is the all-gather's, the shard itself is the
item's send (out of place): the client library copies it into this rank's slot
on the all-gather stream, on a DMA engine (cuda: cudaMemcpyBatchAsync with
PreferOverlapWithCompute; hip: hipMemcpyDeviceToDeviceNoCU), together with the
group's other own shards. Under mixed precision (param_dtype differs) one
foreach copy on FSDP2's copy-in stream casts each such shard straight into its
slot - the cast FSDP2 runs with a kernel of its own anyway - and those items
are in place. So with no cast the unshard launches no kernel at all; with one,
only the cast (counted: zero_copy_cast_items).

Stream safety (CUDA/ROCm): the unsharded storage is allocated on FSDP2's
copy-in stream (as FSDP2 allocates its flat buffer) and recorded on the
compute stream and the all-gather stream, so the caching allocator reuses it
only after both are done with it.
"""
import contextlib
import inspect
import logging
import os
import sys
import threading

import torch
import torch.distributed as dist

from . import _torch_entry
from . import _torch_gather

ENV = "DMAGATHER_FSDP_ZERO_COPY"
# The torch versions (major.minor) whose FSDP2 internals this module was written
# against and is tested with (CI: the oldest and the newest, from PyPI, CPU; the
# GPU machines: 2.11). _torch_entry.TESTED_TORCH names the same versions.
SUPPORTED_TORCH = _torch_entry.TESTED_TORCH
REASONS = ("compiled", "group", "shard_dim", "extension", "cpu_offload", "host_memory", "output_fn")

_GATHER_PARAMS = ["fsdp_params", "group", "async_op", "all_gather_copy_in_stream", "all_gather_stream", "device",
                  "all_gather_comm"]
_COPY_OUT_PARAMS = ["all_gather_result", "fsdp_params", "group"]
# torch 2.15 on: the copy-out takes the parameter group's output function (the seam).
_COPY_OUT_PARAMS_SEAM = _COPY_OUT_PARAMS + ["all_gather_output_fn"]
_PARAM_GROUP_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
_RESULT_FIELDS = ("all_gather_output", "all_gather_event", "all_gather_work", "param_all_gather_input_dtypes",
                  "param_all_gather_input_numels", "all_gather_input_split_sizes")

_status = None          # None before enable(); "on", or "off: <why>"
_active = True          # set_active(False): FSDP2's own path while patched (A/B in one process)
_orig_gather = None
_orig_copy_out = None   # torch 2.11 (no seam): the copy-out this module replaced
_orig_unshard = None    # torch 2.15 on (seam): FSDPParamGroup.unshard before enable()
_default_output_fn = None  # torch 2.15 on: FSDP2's _default_all_gather_output_fn
_init_outputs_kw = {}   # init_all_gather_outputs' extra keywords (2.11: force_recreate=False)
_Result = None          # AllGatherResult subclass that marks our results
_GatherEvent = None     # CUDA: the all-gather event that makes its waiter wait for the op (_consumer_event)
_unsharding = threading.local()  # .group: the FSDPParamGroup whose unshard runs on this thread (seam)


def _modules():
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc
    from torch.distributed.fsdp._fully_shard import _fsdp_param as fp
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
    return fc, fp, pg


def _params(fn):
    return list(inspect.signature(fn).parameters)


def _gate():
    """None when this torch's FSDP2 is one the zero-copy path supports, else why not."""
    mm = _torch_entry.major_minor(torch.__version__)
    if mm not in SUPPORTED_TORCH:
        return f"torch {torch.__version__} is not one it supports ({', '.join(SUPPORTED_TORCH)})"
    try:
        fc, fp, pg = _modules()
    except Exception as e:  # noqa: BLE001
        return f"FSDP2's modules do not import: {e}"
    seam = hasattr(fc, "_default_all_gather_output_fn")
    checks = [
        (_params(fc.foreach_all_gather) == _GATHER_PARAMS, "foreach_all_gather"),
        (_params(fc.foreach_all_gather_copy_out) == (_COPY_OUT_PARAMS_SEAM if seam else _COPY_OUT_PARAMS),
         "foreach_all_gather_copy_out"),
        (tuple(fc.AllGatherResult._fields) == _RESULT_FIELDS, "AllGatherResult"),
        (all(hasattr(fp.FSDPParam, n) for n in ("init_all_gather_outputs", "alloc_all_gather_outputs")),
         "FSDPParam"),
        (hasattr(fp, "ShardedState") and hasattr(fp.ShardedState, "SHARDED"), "ShardedState"),
        (getattr(pg, "foreach_all_gather", None) in (fc.foreach_all_gather, _foreach_all_gather), "_fsdp_param_group"),
    ]
    if seam:
        unshard = getattr(getattr(pg, "FSDPParamGroup", None), "unshard", None)
        checks.append((unshard is not None and _params(unshard) == ["self", "async_op"], "FSDPParamGroup.unshard"))
    bad = [what for ok, what in checks if not ok]
    return f"FSDP2's internals differ from torch {mm}'s as tested ({', '.join(bad)})" if bad else None


def enable():
    """Puts FSDP2's unshard on the zero-copy path where the gate allows it
    (idempotent, process-wide). Returns status().

    torch 2.11: replaces foreach_all_gather and foreach_all_gather_copy_out in
    _fsdp_param_group. torch 2.15 on: replaces foreach_all_gather there (the
    gather into the parameters has no seam) and takes the copy-out through the
    seam torch offers, each parameter group's `_all_gather_output_fn`: while a
    group unshards (FSDPParamGroup.unshard, wrapped), a group with FSDP2's
    default output function gets `_output_fn`, which copies nothing for a
    zero-copy result and runs FSDP2's default for any other; a group with
    someone else's output function keeps it, and its gathers take FSDP2's path
    (reason output_fn)."""
    global _status, _orig_gather, _orig_copy_out, _orig_unshard, _default_output_fn, _init_outputs_kw, _Result
    global _GatherEvent
    if _status is not None:
        return _status
    if os.environ.get(ENV, "").strip() == "0":
        _status = f"off: {ENV}=0"
        return _status
    fsdp2_in_use = _PARAM_GROUP_MODULE in sys.modules  # before _gate() imports it
    why = _gate()
    if why is not None:
        _status = f"off: {why}"
        if fsdp2_in_use and dist.is_initialized() and dist.get_rank() == 0:
            logging.getLogger("dmagather").warning(
                "dmagather: FSDP2's zero-copy unshard is off (%s): FSDP2 copies in and out around dmagather's "
                "all-gather", why)
        return _status
    fc, fp, pg = _modules()

    class ZeroCopyResult(fc.AllGatherResult):
        __slots__ = ()

    _Result = ZeroCopyResult
    _GatherEvent = _consumer_event()
    if "force_recreate" in _params(fp.FSDPParam.init_all_gather_outputs):
        _init_outputs_kw = {"force_recreate": False}
    _orig_gather = pg.foreach_all_gather
    pg.foreach_all_gather = _foreach_all_gather
    if hasattr(fc, "_default_all_gather_output_fn"):
        _default_output_fn = fc._default_all_gather_output_fn
        _orig_unshard = pg.FSDPParamGroup.unshard
        pg.FSDPParamGroup.unshard = _unshard
    else:
        _orig_copy_out = pg.foreach_all_gather_copy_out
        pg.foreach_all_gather_copy_out = _foreach_all_gather_copy_out
    _status = "on"
    return _status


def _consumer_event():
    """The class of a zero-copy result's all_gather_event on CUDA, or None
    where this torch's streams would not call it (then the op is ordered on
    the all-gather stream at submit, as before).

    Why: FSDP2 unshards the next parameter group ahead (prefetch) on its
    all-gather stream and consumes it later (the copy-out in wait_for_unshard,
    on the compute stream). A dmagather op's done-wait parked on the
    all-gather stream at submit holds up, where a trainer sets
    CUDA_DEVICE_MAX_CONNECTIONS=1 (every stream of the process feeding one
    hardware queue), all compute enqueued after it until the gather is done:
    the overlap lost (docs/perf/h100-groups-1205). So the op is submitted
    with no wait, and this event carries it: FSDP2 waits for the result
    only through `stream.wait_event(all_gather_event)` (the copy-out, its
    iteration reset), which torch.cuda.Stream turns into `event.wait(stream)`;
    there the consumer's stream first waits for the op, then for the event.
    query() and synchronize() also see the op."""
    try:
        if "event.wait(self)" not in inspect.getsource(torch.cuda.Stream.wait_event):
            return None
    except (OSError, TypeError):
        return None

    class GatherEvent(torch.cuda.Event):
        def __new__(cls, work):
            self = super().__new__(cls)
            self._dmagather_work = work
            return self

        def wait(self, stream=None):
            if stream is None:
                stream = torch.cuda.current_stream()
            self._dmagather_work.wait_on(stream.cuda_stream)
            super().wait(stream)

        def query(self):
            return self._dmagather_work.is_completed() and super().query()

        def synchronize(self):
            self._dmagather_work.host_wait()
            super().synchronize()

    return GatherEvent


def status():
    return _status or "off: not enabled"


def set_active(flag):
    """Benchmarks and tests: compare both paths in one process (enable() stays)."""
    global _active
    _active = bool(flag)


def _adapter_for(all_gather_comm, group):
    """dmagather's adapter for this group when this all-gather comm is
    dmagather's (dmagather.torch.FSDPAllGather, which says so with its
    `dmagather_adapter_for`; or FSDP2's default one while torch's entry points
    are dmagather's) and the group's job is set up, else None."""
    own = getattr(all_gather_comm, "dmagather_adapter_for", None)
    if own is not None:
        return own(group)
    fc, _, _ = _modules()
    if type(all_gather_comm) not in (fc.DefaultAllGather, fc.ProcessGroupAllocAllGather):
        return None  # someone else's custom all-gather
    return _torch_entry.serving(group)


def _rule(adapter, fsdp_params, group):
    """Why this group takes FSDP2's own path, or None. Equal on every rank."""
    if _compiled_autograd():
        return "compiled"
    if not adapter._is_world(group):
        return "group"
    if _default_output_fn is not None:
        unsharding = getattr(_unsharding, "group", None)
        if unsharding is None or unsharding._all_gather_output_fn is not _output_fn:
            return "output_fn"  # someone else's output function, or a gather outside FSDPParamGroup.unshard
    for p in fsdp_params:
        if p.fsdp_placement.dim != 0:
            return "shard_dim"
        if hasattr(p._sharded_local_tensor, "fsdp_pre_all_gather"):
            return "extension"
        if p.offload_to_cpu:
            return "cpu_offload"
    if adapter.backend == "host" and not adapter.host_staging:
        return "host_memory"
    return None


def _record(tensors, stream):
    for t in tensors:
        if t.is_cuda:
            t.record_stream(stream)


def _keep_versions(outs):
    """FSDP2's rule for its all-gather outputs: writing them bumps no version
    counter (the unsharded parameters are views of them)."""
    live = tuple(o for o in outs if not o.is_inference())
    return torch.autograd._unsafe_preserve_version_counter(live) if live else contextlib.nullcontext()


@torch.no_grad()
def _foreach_all_gather(fsdp_params, group, async_op, all_gather_copy_in_stream, all_gather_stream, device,
                        all_gather_comm):
    a = _adapter_for(all_gather_comm, group) if _active else None
    if a is None or a.comm is None:
        return _orig_gather(fsdp_params, group, async_op, all_gather_copy_in_stream, all_gather_stream, device,
                            all_gather_comm)
    why = _rule(a, fsdp_params, group)
    if why is not None:
        a.counters["zero_copy_fallback:" + why] += 1
        return _orig_gather(fsdp_params, group, async_op, all_gather_copy_in_stream, all_gather_stream, device,
                            all_gather_comm)
    from torch.distributed.device_mesh import _get_device_handle
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState
    world, rank = group.size(), group.rank()
    handle = _get_device_handle(device.type)
    gpu = device.type == "cuda"
    compute = handle.current_stream() if gpu else None
    dtypes, numels, outs, sends, cast_slots, cast_shards = [], [], [], [], [], []
    with handle.stream(all_gather_copy_in_stream):
        for p in fsdp_params:
            shard = p._sharded_param_data if p.sharded_state == ShardedState.SHARDED else \
                p._sharded_post_forward_param_data
            dtype = p.param_dtype or shard.dtype
            n = shard.numel()  # padded: equal on every rank
            p.init_all_gather_outputs([n], [dtype], world, device, **_init_outputs_kw)
            p.alloc_all_gather_outputs()
            dtypes.append([dtype])
            numels.append([n])
            if n:
                out = p.all_gather_outputs[0]
                outs.append(out)
                if shard.dtype == dtype:
                    sends.append(shard)  # The library copies it into its slot (a DMA engine).
                else:
                    slot = out.narrow(0, rank * n, n)
                    sends.append(slot)  # Cast into its slot here; the gather is in place for it.
                    cast_slots.append(slot)
                    cast_shards.append(shard)
        if gpu:
            _record(outs, compute)
            _record(outs, all_gather_stream)
        if cast_slots:
            # Mixed precision: the cast FSDP2 runs anyway, written straight into
            # this rank's slot of each parameter (one kernel for the group).
            with _keep_versions(outs):
                torch._foreach_copy_(cast_slots, cast_shards)
    all_gather_stream.wait_stream(all_gather_copy_in_stream)
    with handle.stream(all_gather_stream):
        work = None
        # On the GPU the op's done-wait goes on the stream that consumes the
        # gather, not on the all-gather stream (see _consumer_event).
        lazy = gpu and _GatherEvent is not None
        if outs:
            # Writes through the daemon bump no version counter on the GPU; host
            # staging copies back with torch.
            with _keep_versions(outs):
                work = a.all_gather_coalesced(outs, sends, group=group, async_op=async_op or lazy,
                                              order_now=not lazy)
        if lazy and work is not None:
            event = _GatherEvent(work)
            event.record(all_gather_stream)
            a.counters["zero_copy_consumer_waits"] += 1
        else:
            event = all_gather_stream.record_event()
    a.counters["zero_copy_unshards"] += 1
    a.counters["zero_copy_items"] += len(outs)
    a.counters["zero_copy_cast_items"] += len(cast_slots)
    return _Result(torch.empty(0, device=device), event, work if async_op else None, dtypes, numels, [])


def _compiled_autograd():
    """Compiled autograd is on (FSDP2 then recreates its buffers per gather)."""
    try:  # torch 2.11
        from torch.distributed.fsdp._fully_shard._fsdp_common import compiled_autograd_enabled
        return compiled_autograd_enabled()
    except ImportError:  # torch 2.15: FSDP2 no longer tracks it; torch's own flag
        ca = sys.modules.get("torch._dynamo.compiled_autograd")
        return bool(ca is not None and getattr(ca, "compiled_autograd_enabled", False))


def _unshard(self, async_op=False):
    """FSDPParamGroup.unshard (torch 2.15 on): the group takes the zero-copy
    output function where it has FSDP2's default, and is visible to
    _foreach_all_gather's rule while it unshards."""
    if getattr(self, "_all_gather_output_fn", None) is _default_output_fn:
        self._all_gather_output_fn = _output_fn
    prev = getattr(_unsharding, "group", None)
    _unsharding.group = self
    try:
        return _orig_unshard(self, async_op)
    finally:
        _unsharding.group = prev


def _output_fn(fsdp_params, all_gather_result, world_size):
    """A parameter group's _all_gather_output_fn (torch 2.15 on): FSDP2's copy-out
    has waited for the all-gather; a zero-copy result has nothing to copy."""
    if _Result is None or not isinstance(all_gather_result, _Result):
        return _default_output_fn(fsdp_params, all_gather_result, world_size)
    return None


@torch.no_grad()
def _foreach_all_gather_copy_out(all_gather_result, fsdp_params, group):
    if _Result is None or not isinstance(all_gather_result, _Result):
        return _orig_copy_out(all_gather_result, fsdp_params, group)
    from torch.distributed.device_mesh import _get_device_handle
    handle = _get_device_handle(all_gather_result.all_gather_output.device.type)
    if all_gather_result.all_gather_event is not None:
        handle.current_stream().wait_event(all_gather_result.all_gather_event)
    if all_gather_result.all_gather_work is not None:
        all_gather_result.all_gather_work.wait()
    # Nothing to copy: the gather wrote every parameter's unsharded storage.


def stats(adapter):
    """This path's counters (merged into every adapter's stats())."""
    c = adapter.counters
    return {"zero_copy": status(), "zero_copy_unshards": c["zero_copy_unshards"],
            "zero_copy_items": c["zero_copy_items"], "zero_copy_cast_items": c["zero_copy_cast_items"],
            "zero_copy_consumer_waits": c["zero_copy_consumer_waits"],
            "zero_copy_fallback_by_reason": {k: c["zero_copy_fallback:" + k] for k in REASONS}}


_torch_gather.add_stats_source(stats)
