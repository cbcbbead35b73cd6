"""DeepSpeed ZeRO-3 zero-copy gather: each parameter's partition gathered
straight into that parameter's own gathered storage, one coalesced dmagather op
per fetch (one item per parameter), with no flat buffer.

DeepSpeed's coalesced fetch (0.19, `partition_parameters.py`, the closure
`all_gather_coalesced` that `Init._convert_to_deepspeed_param` puts on every
parameter, and `AllGatherCoalescedHandle`) runs two copies around its one
all-gather: a `torch.cat` of this rank's partitions into its slot of a flat
buffer (the copy-in), and on `wait()` one `torch.cat` per parameter over the
ranks' slices of that buffer (the copy-out: every gathered byte again). ZeRO-3
lays a parameter out as dmagather gathers: rank r holds elements
[r*n, (r+1)*n) of the flattened parameter padded to world*n (`ds_tensor`, n =
`ds_tensor.ds_numel`). So item p of the op reads this rank's partition of
parameter p and the daemon writes rank r's part at offset r*n of a buffer of
world*n elements, whose first `ds_numel` elements, viewed as `ds_shape`, are
the gathered parameter. No copy-in, no copy-out; the own partition is copied
into its slot by the client library (a DMA engine on the GPU backends). Peak
memory is lower too: no flat buffer beside the gathered parameters.

Where it applies: the fetch path of DeepSpeed's parameter coordinator
(`param.all_gather_coalesced`, every forward and backward fetch) for groups of
two or more parameters. A single parameter (and `allgather_sequential`)
already gathers into the parameter's own buffer in DeepSpeed and is left as
it is; `GatheredParameters` (synchronous, `_all_gather`) is left as it is.

Gated:
- DeepSpeed major.minor in SUPPORTED_DEEPSPEED, and the internals it uses have
  the shape it was written against (Init._convert_to_deepspeed_param, the
  closure's signature, ZeroParamStatus, get_allgather_dtype, Init's config
  attributes); otherwise DeepSpeed is left untouched and status() says why;
- DMAGATHER_ZERO3_ZERO_COPY=0 turns it off;
- parameters converted after it is armed: the start-up hook
  (DMAGATHER_ALLGATHER=1) arms it before DeepSpeed's module loads; install()
  arms it for the parameters that deepspeed.zero.Init / deepspeed.initialize()
  convert after the call (parameters converted before keep DeepSpeed's path);
- per fetch, the same decision on every rank, from what is equal on every
  rank; a fetch that fails a rule takes DeepSpeed's own path (copy-in,
  all-gather on dmagather, copy-out), counted by reason in stats():
    quantized         ZeRO++ quantized weights (int8 on the wire, then dequantized)
    hpz               ZeRO++ hierarchical partitions (a secondary partition)
    all_reduce_fetch  use_all_reduce_for_fetch_params (an all-reduce, not a gather)
    group             the partition group is not the adapter's WORLD
    dtype             the communication dtype differs from the partition's (autocast)
    offload           partitions offloaded to the host or NVMe
    host_memory       host backend without host staging: the partitions are
                      private process memory the daemon cannot reach
    safe_mode         DeepSpeed's safe_mode checks (rank agreement) asked for
    ds_sdma           DS_SDMA_ALLGATHER=1 with AMD's mori installed: DeepSpeed's
                      SDMA path is tried first, as without this module
"""
import importlib.util
import inspect
import os
import sys

from . import _import_hook
from . import _torch_entry
from . import _torch_gather

ENV = "DMAGATHER_ZERO3_ZERO_COPY"
MODULE = _torch_entry.ZERO3_MODULE
# DeepSpeed versions (major.minor) whose ZeRO-3 internals this module was written
# against and is tested with (CI: 0.19.8 from PyPI on CPU; the H200: 0.19.8).
SUPPORTED_DEEPSPEED = ("0.19",)
REASONS = ("quantized", "hpz", "all_reduce_fetch", "group", "dtype", "offload", "host_memory", "safe_mode",
           "ds_sdma")
_CLOSURE_PARAMS = ["params", "safe_mode", "quantize"]
_INIT_ATTRS = ("use_all_reduce_for_fetch_params", "allgather_sequential", "get_partition_dp_group",
               "_partition_world_size")

_status = None       # None before enable(); "on", or "off: <why>"
_armed = False
_orig_convert = None


def arm():
    """Enables the path as soon as DeepSpeed's ZeRO-3 module is loaded (now, if
    it is). Cheap: imports nothing."""
    global _armed
    if _armed:
        return
    _armed = True
    _import_hook.after_import(MODULE, lambda _m: enable())


def _gate(pp):
    """None when this DeepSpeed is one the zero-copy gather supports, else why not."""
    # The installed distribution's version: when the hook runs, deepspeed's
    # own __init__ is still importing (no __version__ yet).
    from importlib import metadata
    try:
        ver = metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        ver = getattr(sys.modules.get("deepspeed"), "__version__", "?")
    mm = ".".join(ver.split("+")[0].split(".")[:2])
    if mm not in SUPPORTED_DEEPSPEED:
        return f"DeepSpeed {ver} is not one it supports ({', '.join(SUPPORTED_DEEPSPEED)})"
    status = getattr(pp, "ZeroParamStatus", None)
    checks = [
        (callable(getattr(getattr(pp, "Init", None), "_convert_to_deepspeed_param", None)),
         "Init._convert_to_deepspeed_param"),
        (all(hasattr(status, s) for s in ("NOT_AVAILABLE", "INFLIGHT", "AVAILABLE")), "ZeroParamStatus"),
        (callable(getattr(pp, "get_allgather_dtype", None)), "get_allgather_dtype"),
    ]
    bad = [what for ok, what in checks if not ok]
    return f"DeepSpeed's ZeRO-3 internals differ from {SUPPORTED_DEEPSPEED[-1]}'s ({', '.join(bad)})" if bad else None


def enable():
    """Wraps the coalesced fetch of every parameter DeepSpeed converts from now
    on (idempotent, process-wide). Returns status()."""
    global _status, _orig_convert
    if _status is not None:
        return _status
    if os.environ.get(ENV, "").strip() == "0":
        _status = f"off: {ENV}=0"
        return _status
    pp = sys.modules.get(MODULE)
    if pp is None:
        return status()
    why = _gate(pp)
    if why is not None:
        _status = f"off: {why}"
        return _status
    _orig_convert = pp.Init._convert_to_deepspeed_param

    def _convert_to_deepspeed_param(init, param):
        _orig_convert(init, param)
        _wrap(init, param)

    pp.Init._convert_to_deepspeed_param = _convert_to_deepspeed_param
    _status = "on"
    return _status


def status():
    return _status or "off: not enabled"


def _wrap(init, param):
    global _status
    orig = getattr(param, "all_gather_coalesced", None)
    if orig is None or getattr(orig, "_dmagather_original", None) is not None:
        return
    inner = _undecorated(orig)
    try:
        same = inner.__name__ == "all_gather_coalesced" and list(inspect.signature(inner).parameters) == _CLOSURE_PARAMS
    except (AttributeError, TypeError, ValueError):
        same = False
    missing = [n for n in _INIT_ATTRS if not hasattr(init, n)]
    if not same or missing:
        what = ", ".join((["all_gather_coalesced's signature"] if not same else []) + missing)
        _status = f"off: DeepSpeed's ZeRO-3 internals differ from {SUPPORTED_DEEPSPEED[-1]}'s ({what})"
        return

    def all_gather_coalesced(params, safe_mode=False, quantize=False):
        return _fetch(init, orig, params, safe_mode, quantize)

    all_gather_coalesced._dmagather_original = orig
    param.all_gather_coalesced = all_gather_coalesced


def _undecorated(f):
    """The function under DeepSpeed's NVTX decorator (instrument_w_nvtx keeps
    it in its closure, without functools.wraps)."""
    f = inspect.unwrap(f)
    code = getattr(f, "__code__", None)
    if code is not None and code.co_name == "wrapped_fn":
        for cell in f.__closure__ or ():
            if inspect.isfunction(cell.cell_contents):
                return cell.cell_contents
    return f


def _adapter():
    """dmagather's WORLD adapter when DeepSpeed's all-gathers are dmagather's, else None."""
    return _torch_entry.serving(None)


def _rule(a, init, params, safe_mode, quantize, pp, group, device):
    """Why this fetch takes DeepSpeed's own path, or None. Equal on every rank."""
    if quantize or any(hasattr(p.ds_tensor, "ds_quant_scale") for p in params):
        return "quantized"
    if any(getattr(p, "ds_secondary_tensor", None) is not None for p in params):
        return "hpz"
    if init.use_all_reduce_for_fetch_params:
        return "all_reduce_fetch"
    if safe_mode:
        return "safe_mode"
    if os.environ.get("DS_SDMA_ALLGATHER") == "1" and importlib.util.find_spec("mori") is not None:
        return "ds_sdma"
    if any(init.get_partition_dp_group(p) is not group for p in params) or not a._is_world(group):
        return "group"
    for p in params:
        t = p.ds_tensor
        if pp.get_allgather_dtype(p, t) != t.dtype:
            return "dtype"
        loc = getattr(t, "final_location", None)
        if t.device.type != device.type or getattr(loc, "value", loc) == "nvme":
            return "offload"
    if a.backend == "host" and not a.host_staging:
        return "host_memory"
    return None


def _fetch(init, orig, params, safe_mode, quantize):
    pp = sys.modules[MODULE]
    a = _adapter()
    params = list(params)
    status = pp.ZeroParamStatus
    if (a is None or a.comm is None or len(params) < 2 or init.allgather_sequential
            or any(p.ds_status != status.NOT_AVAILABLE for p in params)
            or any(init._partition_world_size(p) == 1 for p in params)):
        # Not ours: no dmagather, DeepSpeed gathers into the parameter's own
        # buffer already (one parameter, allgather_sequential), nothing to
        # gather, or DeepSpeed's own error for a parameter not partitioned.
        return orig(params, safe_mode=safe_mode, quantize=quantize)
    import torch
    from deepspeed.accelerator import get_accelerator
    group = init.get_partition_dp_group(params[0])
    device = torch.device(get_accelerator().current_device_name())
    why = _rule(a, init, params, safe_mode, quantize, pp, group, device)
    if why is not None:
        a.counters["zero3_zero_copy_fallback:" + why] += 1
        return orig(params, safe_mode=safe_mode, quantize=quantize)
    world = init._partition_world_size(params[0])
    # Every rank fetches the same parameters, not always in the same order (a
    # set in the coordinator): DeepSpeed's order, by id.
    params = sorted(params, key=lambda p: p.ds_id)
    outs, sends = [], []
    for p in params:
        p.ds_status = status.INFLIGHT
        t = p.ds_tensor
        n = t.ds_numel
        outs.append(a.empty((n * world,), dtype=t.dtype, device=device))
        sends.append(t)
    with torch.no_grad():
        # No wait at submit: the done-wait goes on the stream that calls the
        # handle's wait(), where the coordinator consumes the parameters (a
        # prefetch parked on the all-gather stream would hold up, under
        # CUDA_DEVICE_MAX_CONNECTIONS=1, all compute enqueued after it).
        work = a.all_gather_coalesced(outs, sends, group=group, async_op=True, order_now=False)
    a.counters["zero3_zero_copy_fetches"] += 1
    a.counters["zero3_zero_copy_items"] += len(outs)
    a.counters["zero3_zero_copy_bytes"] += sum(o.numel() * o.element_size() for o in outs)
    return _Handle(work, params, outs, status)


class _Handle:
    """What the coordinator waits on (AllGatherCoalescedHandle's wait())."""

    def __init__(self, work, params, outs, status):
        self._work, self._params, self._outs, self._status = work, params, outs, status
        self.complete = False

    def wait(self, handle_dependency=True):
        if self.complete:
            return
        from deepspeed.accelerator import get_accelerator
        acc = get_accelerator()
        if self._work is not None:
            self._work.wait()  # GPU: the current stream waits (no host block); host: done
        for p, out in zip(self._params, self._outs):
            if p.ds_status != self._status.INFLIGHT:
                raise RuntimeError(f"expected param {p.ds_summary()} to be inflight")
            p.data = out.narrow(0, 0, p.ds_numel).view(p.ds_shape)
            p.ds_status = self._status.AVAILABLE
            if handle_dependency and not acc.is_synchronized_device() and acc.on_accelerator(out):
                out.record_stream(acc.current_stream())
        self._work = None
        self.complete = True


def stats(adapter):
    c = adapter.counters
    return {"zero3_zero_copy": status(), "zero3_zero_copy_fetches": c["zero3_zero_copy_fetches"],
            "zero3_zero_copy_items": c["zero3_zero_copy_items"], "zero3_zero_copy_bytes": c["zero3_zero_copy_bytes"],
            "zero3_zero_copy_fallback_by_reason": {k: c["zero3_zero_copy_fallback:" + k] for k in REASONS}}


_torch_gather.add_stats_source(stats)
