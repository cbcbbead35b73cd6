"""The torch adapter's reduce-scatter: torch.distributed.reduce_scatter_tensor
(and reduce_scatter_single, torch 2.15) on the communicator of a group's
all-gather job (`DmagatherAllGather`), switched on by DMAGATHER_REDUCE_SCATTER=1.

One `ReduceScatter` per adapter (`of(adapter)`), made at the job's set-up
(`_torch_setup`), which also decides collectively whether it serves: every
rank of the group has the variable and a library with
dmagather_reduce_scatter_async. The same per-op discipline as the
all-gather's, on the same lock, sequence of ops and stream-ordered queue:

- decided before submit, from what is equal on every rank of a correct
  program (counted in stats()'s reduce_scatter_fallback_by_reason, the
  framework's reduce-scatter runs): `not_enabled` / `library_too_old` /
  `daemon_unreachable` / `join_failed` (agreed at set-up), `op_unsupported`
  (ReduceOp other than SUM and AVG: PREMUL_SUM, MAX, ...), `avg_integer` (AVG
  on an integer dtype), `dtype_unsupported`, `numel_over_max` (the output's
  numel against the agreed DMAGATHER_MAX_NUMEL), `not_world_group`,
  `multi_node` (a group across nodes: the library serves one node),
  `captured` (CUDA-graph capture). An input that is not world_size times the
  output, or of another dtype than the output, raises ValueError at once.
- memory is each rank's own: a tensor the backend cannot reach is staged
  through pooled daemon memory (host staging) or refused
  (dmagather_submit_fallback): `memory_unreachable`, the framework's
  reduce-scatter on every rank.

Numerics: the library sums each element over ranks 0..N-1 in that order
(16-bit floats in fp32, rounded once; AVG divides the sum by N), so a run
gives the same bits every time; they may differ from NCCL's or gloo's in the
last bits (another order), which is why it is a switch of its own.
"""

import collections
import ctypes

import torch
import torch.distributed as dist

from . import AVG, SUM, DmagatherError, FallbackError, Op, has_reduce_scatter
from . import _torch_entry
from ._torch_gather import (GPU_BACKENDS, _TORCH_DTYPES, _HostPool, _reason_kind, _strip_rank, add_stats_source,
                            log)
from ._torch_work import Work

ENV = "DMAGATHER_REDUCE_SCATTER"
REASONS = ("not_enabled", "library_too_old", "daemon_unreachable", "join_failed", "op_unsupported", "avg_integer",
           "dtype_unsupported", "numel_over_max", "not_world_group", "multi_node", "captured", "memory_unreachable")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.int64, torch.int8,
          torch.uint8)  # common/reduce.h: SUM for each, AVG for the floating ones
FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
OPS = ("sum", "avg")


def wanted():
    """This rank asks for the reduce-scatter: DMAGATHER_REDUCE_SCATTER is exactly 1."""
    import os
    return os.environ.get(ENV) == "1"


def rank_code(enabled=None):
    """This rank's word in the set-up's all_reduce: 0 serves, 1 not enabled
    (the variable, or init(reduce_scatter=False)), 2 a library without the
    reduce-scatter."""
    if not (wanted() if enabled is None else enabled):
        return 1
    return 0 if has_reduce_scatter() else 2


def verdict(codes, ranks=None):
    """Every rank's rank_code() (in group rank order) -> None (served) or
    (reason kind, sentence), the same on every rank."""
    which = lambda c: ",".join(str(r) for r, x in enumerate(codes) if x == c)  # noqa: E731
    if all(c == 1 for c in codes):
        return ("not_enabled", f"{ENV} is not 1")
    if any(c == 1 for c in codes):
        return ("not_enabled", f"{ENV} is not 1 on rank(s) {which(1)}")
    if any(c == 2 for c in codes):
        return ("library_too_old", f"the libdmagather.so of rank(s) {which(2)} has no dmagather_reduce_scatter_async")
    return None


def redop_of(op):
    """(dmagather's SUM/AVG or None, the op's name) for a torch ReduceOp (a
    RedOpType, or a ReduceOp object such as PREMUL_SUM(factor))."""
    name = getattr(op, "name", None)
    if name is None:  # a ReduceOp object (torch 1.13's constants too): its RedOpType
        inner = getattr(op, "op", None)
        name = getattr(inner, "name", None) or str(inner if inner is not None else op).rsplit(".", 1)[-1]
    if name == "SUM":
        return SUM, "sum"
    if name == "AVG":
        return AVG, "avg"
    return None, name


class ReduceScatter:
    """The reduce-scatter of one adapter (one group's job). `off`: None when
    served, else (reason kind, sentence) agreed at set-up; `requested`: some
    rank of the group asked for it (then rank 0 says why it is off)."""

    def __init__(self, adapter, off=None, requested=True):
        self.a = adapter
        if adapter.comm is not None and off is None and not has_reduce_scatter():
            off = ("library_too_old", "this libdmagather.so has no dmagather_reduce_scatter_async")
        self.off = off
        self.requested = requested
        self.counters = collections.Counter()
        self.last_fallback_reason = None
        self._logged = set()
        self._orig = None      # torch's reduce_scatter_tensor (the framework path); found when unset
        self._native = True    # False: this torch's gloo has no reduce_scatter_tensor (torch 1.13)
        self._fn = adapter.comm._lib.dmagather_reduce_scatter_async if adapter.comm is not None and off is None \
            else None

    @property
    def serving(self):
        return self.a.comm is not None and self.off is None

    def status(self):
        if self.serving:
            return "on"
        why = self.a.unavailable if self.a.comm is None else self.off
        return f"off: {why[1] if why else 'not set up'}"

    def stats(self):
        c = self.counters
        return {"reduce_scatter": self.status(),
                "reduce_scatter_ops": c["ops"],
                "reduce_scatter_ops_by_op": {k: c["op:" + k] for k in OPS},
                "reduce_scatter_in_place_ops": c["in_place"],
                "reduce_scatter_staged_ops": c["staged"],
                "reduce_scatter_host_waited_ops": c["host_waited"],
                "reduce_scatter_stream_ordered_ops": c["stream_ordered"],
                "reduce_scatter_fallback_ops": c["fallback"],
                "reduce_scatter_fallback_by_reason": {k: c["fallback:" + k] for k in REASONS},
                "reduce_scatter_fallback_by_op": {k[len("fallback_op:"):]: v for k, v in sorted(c.items())
                                                  if k.startswith("fallback_op:")},
                "reduce_scatter_last_fallback_reason": self.last_fallback_reason}

    def describe(self, names):
        """Rank 0's line about this job's reduce-scatter, or None."""
        if self.serving:
            return f"dmagather serves {', '.join(names)} ({', '.join(OPS)})"
        if self.requested and self.a.comm is not None:
            return f"dmagather reduce_scatter not served ({self.off[1]}): using {self.a.framework_backend}'s"
        return None

    # ---- decisions ------------------------------------------------------------
    def _local_reason(self, output, input, redop, opname, group):
        a = self.a
        if a.comm is None:
            return a.unavailable
        if self.off is not None:
            return self.off
        world = a.world_size
        if output.dtype != input.dtype:
            raise ValueError(f"dmagather reduce_scatter_tensor: the output's dtype {output.dtype} is not the "
                             f"input's {input.dtype}")
        if input.numel() != output.numel() * world:
            raise ValueError(f"dmagather reduce_scatter_tensor: the input has {input.numel()} elements, not "
                             f"world_size ({world}) x the output's {output.numel()}")
        if redop is None:
            return ("op_unsupported", f"ReduceOp.{opname} is not served (SUM and AVG are)")
        if input.dtype not in DTYPES:
            return ("dtype_unsupported", f"dtype {input.dtype} is not served by the reduce-scatter")
        if redop == AVG and input.dtype not in FLOATS:
            return ("avg_integer", f"AVG on {input.dtype} is not served (floating dtypes only)")
        if output.numel() > a.max_numel:
            return ("numel_over_max", f"output of {output.numel()} elements > DMAGATHER_MAX_NUMEL={a.max_numel}")
        if not a._is_world(group):
            return ("not_world_group", "the group is not this job's group")
        if getattr(a, "nodes", 1) > 1:
            return ("multi_node", f"the group spans {a.nodes} nodes: the reduce-scatter is served within one node")
        if a.backend == "cuda" and torch.cuda.is_current_stream_capturing():
            # The library serves it (docs/REDUCE.md); not through the adapter until
            # that path has passed on a GPU.
            return ("captured", "a reduce-scatter under CUDA-graph capture is not served by the torch adapter yet")
        return None

    def _note_fallback(self, kind, reason, opname):
        c = self.counters
        c["fallback"] += 1
        c["fallback:" + kind] += 1
        if kind == "op_unsupported":
            c["fallback_op:" + opname] += 1
        self.last_fallback_reason = reason
        k = (kind, _reason_kind(reason))
        if k not in self._logged:
            self._logged.add(k)
            if self.a.rank == 0 and (kind not in ("not_enabled", "daemon_unreachable", "join_failed") or
                                     self.requested):
                log.warning("dmagather reduce_scatter fallback to %s (%s): %s", self.a.framework_backend, kind,
                            reason)

    # ---- the framework's path -------------------------------------------------
    def _framework(self, output, input, op, group, async_op):
        orig = self._orig if self._orig is not None else \
            _torch_entry.torch_original(dist, _torch_entry.RS_ENTRY_POINTS)
        if self._native:
            try:
                return orig(output, input, op=op, group=group, async_op=async_op)
            except RuntimeError as e:
                # gloo of torch 1.13 has neither _reduce_scatter_base nor
                # reduce_scatter: raised before any communication, alike on every rank.
                text = str(e)
                if "_reduce_scatter_base" not in text and "does not support reduce_scatter" not in text:
                    raise
                self._native = False
        # An all_reduce of a copy, this rank's chunk kept (the same result).
        n, r = dist.get_world_size(group), dist.get_rank(group)
        buf = input.reshape(-1).clone()
        redop, _ = redop_of(op)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM if redop == AVG else op, group=group)
        if redop == AVG:
            buf.div_(n)
        output.reshape(-1).copy_(buf.view(n, -1)[r])
        return Work() if async_op else None

    # ---- dmagather's path -----------------------------------------------------
    def _in_place(self, output, input):
        """output is this rank's chunk of input (recv == send + rank*count)."""
        size = output.element_size()
        return output.data_ptr() == input.data_ptr() + self.a.rank * output.numel() * size

    @staticmethod
    def _overlap(output, input):
        o0, i0 = output.data_ptr(), input.data_ptr()
        o1, i1 = o0 + output.numel() * output.element_size(), i0 + input.numel() * input.element_size()
        return o0 < i1 and i0 < o1

    def _stage(self, output, input, in_place):
        """Host staging: (recv, send) with each tensor the backend cannot reach
        replaced by pooled daemon memory (the input copied in; in place, the
        staged input's chunk), or None when nothing needs it (or a tensor is
        not a contiguous CPU tensor: refused as without staging)."""
        a = self.a
        if output.is_cuda or input.is_cuda or not output.is_contiguous() or not input.is_contiguous():
            return None
        send_ok = a._reachable(input)
        recv_ok = send_ok if in_place else a._reachable(output)
        if send_ok and recv_ok:
            return None
        if a._pool is None:
            a._pool = _HostPool(a.comm)
        send = input
        if not send_ok:
            send = a._pool.tensor(input.shape, input.dtype)
            send.copy_(input)
        recv = output
        if not recv_ok:
            if in_place:
                n = output.numel()
                recv = send.reshape(-1)[a.rank * n:(a.rank + 1) * n].view(output.shape)
            else:
                recv = a._pool.tensor(output.shape, output.dtype)
        return recv, send

    def _submit(self, recv, send, redop, stream, why):
        a = self.a
        comm = a.comm._handle()
        h = ctypes.c_uint64(0)
        if why is None:
            why = a._refusal_reason([recv], [send])
        if why is not None:
            code = a._lib_fallback(comm, why.encode(), ctypes.byref(h))
        else:
            code = self._fn(comm, send.data_ptr(), recv.data_ptr(), recv.numel(), _TORCH_DTYPES[send.dtype], redop,
                            stream, ctypes.byref(h))
        if h.value == 0:  # no op was created (no daemon, closed comm): a job-level failure
            a.comm._raise(code if code != 0 else 6, None if code != 0 else "no op handle returned")
        return code, Op(a.comm, h.value)

    def reduce_scatter_tensor(self, output, input, op=dist.ReduceOp.SUM, group=None, async_op=False,
                              order_now=False):
        """torch.distributed.reduce_scatter_tensor's semantics: output gets this
        rank's chunk of the reduction (SUM or AVG) of every rank's input."""
        a = self.a
        with a._lock:
            if a._broken is not None:
                raise a._broken
            if a._pending:
                a._check_pending()
            redop, opname = redop_of(op)
            local = self._local_reason(output, input, redop, opname, group)
            if local is not None:
                self._note_fallback(local[0], local[1], opname)
                return self._framework(output, input, op, group, async_op)
            in_place = self._in_place(output, input)
            why = None
            if not in_place and self._overlap(output, input):
                why = "the output overlaps the input other than as this rank's chunk"
            stream = a._stream_of([output])
            key = ("reduce_scatter", input.dtype, output.numel(), redop) if a.stream_ordered else None
            staged = self._stage(output, input, in_place) if a.host_staging and why is None else None
            recv, send = staged if staged is not None else (output, input)
            code, h = self._submit(recv, send, redop, stream, why)
            c = self.counters
            if key is None or key not in a._served:
                # The verdict on the host (every rank: the key is equal everywhere).
                try:
                    h.wait()
                except FallbackError as e:
                    self._note_fallback("memory_unreachable", str(e), opname)
                    a._served.discard(key)
                    return self._framework(output, input, op, group, async_op)
                self._count(c, opname, in_place)
                if staged is not None:
                    if recv is not output:
                        output.copy_(recv)
                    c["staged"] += 1
                c["host_waited"] += 1
                if key is not None:
                    a._served.add(key)
                return Work() if async_op else None
            # A served signature: stream-ordered, verdict read lazily.
            if code != 0:
                msg = _strip_rank(a.comm._lib.dmagather_last_error(a.comm._comm).decode() or "refused")
                raise a._poison(h, DmagatherError(code, msg))
            self._count(c, opname, in_place)
            c["stream_ordered"] += 1
            a._pending.append(h)
            if a.backend in GPU_BACKENDS:
                if async_op and not order_now:
                    return Work(a, h, stream_pending=True)
                a._order_on_stream(h, stream)
                return Work(a, h) if async_op else None
            # host backend in stream-ordered (test) mode: no stream to wait on;
            # the op keeps its tensors until it is seen done.
            h._keep = (output, input)
            return Work(a, h, host_pending=True) if async_op else None

    @staticmethod
    def _count(c, opname, in_place):
        c["ops"] += 1
        c["op:" + opname] += 1
        if in_place:
            c["in_place"] += 1


def of(adapter):
    """The adapter's ReduceScatter: the one its set-up made, else (an adapter
    made directly, not collectively) one served when this rank asks for it."""
    rs = getattr(adapter, "reduce_scatter", None)
    if rs is None:
        code = rank_code()
        rs = ReduceScatter(adapter, off=verdict([code]), requested=code != 1)
        adapter.reduce_scatter = rs
    return rs


def _stats(adapter):
    rs = getattr(adapter, "reduce_scatter", None)
    return rs.stats() if rs is not None else {}


add_stats_source(_stats)
