"""The torch adapter's gatherer: DmagatherAllGather - one communicator, the
per-op decision (the framework's all-gather or dmagather), submit, stream
ordering, fallback - and the Work handles it returns. dmagather.torch
(torch.py, whose docstring has the whole story) sets it up and re-exports
what is public here."""

import collections
import ctypes
import logging
import os
import re
import threading
import weakref

import torch
import torch.distributed as dist

from . import Comm, DmagatherError, FallbackError, DTYPES, MAX_COALESCED, Op, _Gather
from . import _torch_entry
from ._torch_work import StreamOrderedError, Work, _WorkList

# Daemon backends whose tensors live on torch "cuda" devices: NVIDIA (cuda) and,
# on ROCm builds of torch (which expose AMD GPUs as torch.cuda), AMD (hip).
GPU_BACKENDS = ("cuda", "hip")

log = logging.getLogger("dmagather")
# Counters of the framework patches (_fsdp_zero_copy, _zero3_zero_copy), merged
# into every adapter's stats(): each registers itself when imported.
_STATS_SOURCES = []


def add_stats_source(fn):
    """fn(adapter) -> dict of counters, merged into DmagatherAllGather.stats()."""
    if fn not in _STATS_SOURCES:
        _STATS_SOURCES.append(fn)

DEFAULT_MAX_NUMEL = 1 << 28          # elements per rank shard (DMAGATHER_MAX_NUMEL)
MAX_PENDING = 128                    # stream-ordered ops checked lazily; beyond, the oldest is host-waited

# Fallback reasons (the keys of stats()["fallback_by_reason"]).
REASONS = ("not_enabled", "not_world_group", "numel_over_max", "dtype_unsupported", "daemon_unreachable",
           "join_failed", "memory_unreachable")

_TORCH_DTYPES = {getattr(torch, name): code for name, code in DTYPES.items() if hasattr(torch, name)}


def _max_numel_from_env():
    v = os.environ.get("DMAGATHER_MAX_NUMEL")
    try:
        return int(v) if v else DEFAULT_MAX_NUMEL
    except ValueError:
        return DEFAULT_MAX_NUMEL


def _reason_kind(reason):
    """The reason without op numbers and addresses, so it is logged once."""
    return re.sub(r"#\d+|0x[0-9a-fA-F]+|\b\d{4,}\b", "N", reason)


def _strip_rank(msg):
    return re.sub(r"^(rank \d+: )+", "", msg)


def _env_flag(name):
    v = os.environ.get(name)
    if v is None:
        return None
    return v.strip().lower() not in ("", "0", "false", "no", "off")


def _nbytes(t):
    return t.numel() * t.element_size()


class _HostPool:
    """Host backend memory (shm from dmagather_alloc) handed out as tensors and
    taken back when the last tensor over it dies, so FSDP2's allocate() and
    ZeRO-style fresh outputs reuse registered memory instead of new shm."""

    def __init__(self, comm):
        self.comm = comm
        self.free = collections.defaultdict(list)
        self.allocated = 0  # dmagather_alloc calls (for tests: reuse is visible)

    def tensor(self, shape, dtype):
        import numpy as np
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        count = 1
        for n in shape:
            count *= n
        nbytes = max(1, count * torch.empty((), dtype=dtype).element_size())
        nbytes = (nbytes + 63) & ~63
        lst = self.free[nbytes]
        if lst:
            addr = lst.pop()
        else:
            addr = self.comm.alloc(nbytes)
            self.allocated += 1
        raw = (ctypes.c_char * nbytes).from_address(addr)
        arr = np.frombuffer(raw, dtype=np.uint8, count=nbytes)
        weakref.finalize(arr, lst.append, addr)  # the storage keeps arr alive; its death frees the slot
        return torch.from_numpy(arr)[:count * torch.empty((), dtype=dtype).element_size()].view(dtype).view(shape)


class DmagatherAllGather:
    """The engine behind the module-level API (one per process, made by init()).

    Also usable on its own, as before: DmagatherAllGather(job_key, world_size,
    rank, socket=...) joins at once (not collective: use init() for that)."""

    def __init__(self, job_key=None, world_size=None, rank=None, socket=None, group=None, *, comm=None,
                 max_numel=None, unavailable=None, backend_name=None, stream_ordered=None, host_staging=False,
                 **comm_options):
        self.group = group
        self.rank = dist.get_rank() if rank is None and dist.is_initialized() else (rank or 0)
        self.world_size = (dist.get_world_size() if world_size is None and dist.is_initialized() else
                           (world_size or 1))
        self.max_numel = int(max_numel) if max_numel is not None else _max_numel_from_env()
        self.framework_backend = backend_name or (str(dist.get_backend()) if dist.is_initialized() else "torch")
        self.unavailable = unavailable  # (kind, sentence) when disabled at init
        self.job_key = job_key
        self.comm = comm
        self._lock = threading.RLock()
        self._logged = set()
        self._into_tensor = True
        self._orig = None  # the original dist.all_gather_into_tensor (install() sets it)
        self._served = set()
        self._pending = collections.deque()
        self._broken = None
        self._pool = None
        self.counters = collections.Counter()
        self.last_fallback_reason = None
        if comm is None and unavailable is None and job_key is not None:
            try:
                self.comm = Comm(job_key, self.world_size, self.rank, socket=socket, **comm_options)
            except (DmagatherError, OSError) as e:
                self.unavailable = ("daemon_unreachable", f"dmagather unavailable: {e}")
        if self.comm is None and self.unavailable is None:
            self.unavailable = ("not_enabled", "no communicator")
        self.backend = self.comm.backend if self.comm is not None else None
        # Stream-ordered mode with the signature cache: the GPU backends (cuda,
        # and hip: ROCm torch exposes its GPUs as torch.cuda). On the
        # host backend only for tests (stream_ordered=True): there "the stream
        # waits" is nothing and Work.wait()/synchronize() wait on the host.
        self.stream_ordered = (self.backend in GPU_BACKENDS) if stream_ordered is None else bool(stream_ordered)
        # Host backend only: private CPU tensors (what an unmodified trainer
        # gathers) are copied into pooled daemon memory and the gathered
        # result copied back, instead of a memory_unreachable fallback. Each
        # rank's own business (no effect on the op's agreement).
        self.host_staging = bool(host_staging) and self.backend == "host" and not self.stream_ordered
        if self.comm is not None:
            lib = self.comm._lib
            self._lib_async = lib.dmagather_allgather_async
            self._lib_coalesced = lib.dmagather_allgather_coalesced
            self._lib_fallback = lib.dmagather_submit_fallback

    # ---- compatibility counters ------------------------------------------------
    @property
    def dmagather_ops(self):
        return self.counters["dmagather_ops"]

    @property
    def fallback_ops(self):
        return self.counters["fallback_ops"]

    @property
    def enabled(self):
        return self.comm is not None

    def stats(self):
        c = self.counters
        return {"enabled": self.enabled, "backend": self.backend, "job_key": self.job_key,
                "max_numel": self.max_numel, "unavailable": self.unavailable[1] if self.unavailable else None,
                "dmagather_ops": c["dmagather_ops"], "fallback_ops": c["fallback_ops"],
                "host_waited_ops": c["host_waited_ops"], "stream_ordered_ops": c["stream_ordered_ops"],
                "captured_ops": c["captured_ops"], "staged_ops": c["staged_ops"],
                "fallback_by_reason": {k: c["fallback:" + k] for k in REASONS},
                "last_fallback_reason": self.last_fallback_reason,
                "host_buffers_allocated": self._pool.allocated if self._pool else 0,
                **{k: v for source in _STATS_SOURCES for k, v in source(self).items()}}

    # ---- memory ---------------------------------------------------------------
    def empty(self, shape, dtype=torch.float32, device=None):
        """A tensor the backend can reach: host backend, shm from the daemon
        (pooled: reused once every tensor over it is gone); CUDA, the caching
        allocator (the cuda backend registers any cudaMalloc'd block by its base).
        Without a comm: torch.empty."""
        if isinstance(shape, int):
            shape = (shape,)
        dev = torch.device(device) if device is not None else None
        if self.comm is None or self.backend != "host" or (dev is not None and dev.type != "cpu"):
            if dev is None and self.backend in GPU_BACKENDS:
                dev = torch.device("cuda", torch.cuda.current_device())
            return torch.empty(tuple(shape), dtype=dtype, device=dev)
        if self._pool is None:
            self._pool = _HostPool(self.comm)
        return self._pool.tensor(shape, dtype)

    # ---- decisions ------------------------------------------------------------
    def _is_world(self, group):
        if group is None or group is dist.group.WORLD:
            return True
        if self.group is not None and group is self.group:
            return True
        try:
            if group is dist.distributed_c10d._get_default_group():
                return True
            # A group of all ranks in rank order is the same job (e.g. FSDP2's
            # 1-D DeviceMesh over every rank). Equal on every rank of the group.
            return dist.get_process_group_ranks(group) == list(range(self.world_size))
        except Exception:  # noqa: BLE001
            return False

    def _local_reason(self, outs, ins, group):
        """Reasons decided identically on every rank, before any submit."""
        if self.comm is None:
            return self.unavailable
        if not self._is_world(group):
            return ("not_world_group", "the group is not the WORLD group")
        for o, i in zip(outs, ins):
            if i.numel() > self.max_numel:
                return ("numel_over_max", f"shard of {i.numel()} elements > DMAGATHER_MAX_NUMEL={self.max_numel}")
            if i.dtype not in _TORCH_DTYPES:
                return ("dtype_unsupported", f"dtype {i.dtype} is not supported by dmagather")
            if o.dtype != i.dtype or o.numel() != i.numel() * self.world_size:
                # torch raises for this; let it, with its own message.
                return ("shape", f"output {tuple(o.shape)} {o.dtype} does not fit input {tuple(i.shape)} {i.dtype}")
        return None

    def _note_fallback(self, kind, reason):
        self.counters["fallback_ops"] += 1
        self.counters["fallback:" + kind] += 1
        self.last_fallback_reason = reason
        k = (kind, _reason_kind(reason))
        if k not in self._logged:
            self._logged.add(k)
            if self.rank == 0:
                log.warning("dmagather allgather fallback to %s (%s): %s", self.framework_backend, kind, reason)

    # ---- the framework's path -------------------------------------------------
    def _framework_one(self, out, inp, group, async_op):
        orig = self._orig if self._orig is not None else _torch_entry.torch_original(dist)
        if self._into_tensor:
            try:
                return orig(out, inp, group=group, async_op=async_op)
            except RuntimeError as e:
                # gloo of torch 1.13 has no _allgather_base: raised before any
                # communication, alike on every rank.
                if "_allgather_base" not in str(e) and "all_gather_into_tensor" not in str(e):
                    raise
                self._into_tensor = False
        n = dist.get_world_size(group)
        chunks = list(out.view(-1).chunk(n))
        return dist.all_gather(chunks, inp.reshape(-1), group=group, async_op=async_op)

    def _framework(self, outs, ins, group, async_op):
        works = [self._framework_one(o, i, group, async_op) for o, i in zip(outs, ins)]
        return Work(torch_works=works) if async_op else None

    # ---- dmagather's path -----------------------------------------------------
    def _stream_of(self, outs):
        if self.backend not in GPU_BACKENDS:
            return None
        o = outs[0]
        dev = o.device if o.is_cuda else torch.device("cuda", torch.cuda.current_device())
        return torch.cuda.current_stream(dev).cuda_stream

    def _refusal_reason(self, outs, ins):
        """This rank's reason to refuse the op (memory), or None."""
        for t in list(ins) + list(outs):
            if not t.is_contiguous():
                return "a tensor is not contiguous"
            if self.backend == "host" and t.is_cuda:
                return f"a tensor on {t.device} and the daemon's backend is host"
            if self.backend in GPU_BACKENDS and not t.is_cuda:
                return f"a CPU tensor and the daemon's backend is {self.backend}"
        if self.backend == "host":
            for t in list(ins) + list(outs):
                try:
                    self.comm.register(t)
                except FallbackError as e:
                    return _strip_rank(e.message)
                except DmagatherError:
                    pass  # not a fallback: the submit fails the op on every rank with the right status
        return None

    def _reachable(self, t):
        try:
            self.comm.register(t)
            return True
        except FallbackError:
            return False
        except DmagatherError:
            return True  # not about memory: the submit reports it on every rank

    def _stage(self, outs, ins):
        """Host staging: (outs, ins) with every private CPU tensor replaced by
        pooled daemon memory (inputs copied in), or None when nothing needs it
        or a tensor is not a contiguous CPU tensor (then the op is refused as
        without staging)."""
        ts = list(ins) + list(outs)
        if any(t.is_cuda or not t.is_contiguous() for t in ts):
            return None
        if self._pool is None:
            self._pool = _HostPool(self.comm)
        new_outs, new_ins, any_staged = [], [], False
        for o, i in zip(outs, ins):
            if self._reachable(o) and self._reachable(i):
                new_outs.append(o)
                new_ins.append(i)
                continue
            so = self._pool.tensor(o.shape, o.dtype)
            si = self._pool.tensor(i.shape, i.dtype)
            si.copy_(i)
            new_outs.append(so)
            new_ins.append(si)
            any_staged = True
        return (new_outs, new_ins) if any_staged else None

    def _submit(self, outs, ins, stream):
        """Submits this rank's part: returns (code, Op). code != 0: this rank refused."""
        comm = self.comm._handle()
        h = ctypes.c_uint64(0)
        why = self._refusal_reason(outs, ins)
        if why is not None:
            code = self._lib_fallback(comm, why.encode(), ctypes.byref(h))
        elif len(outs) == 1:
            i = ins[0]
            code = self._lib_async(comm, i.data_ptr(), outs[0].data_ptr(), i.numel(), _TORCH_DTYPES[i.dtype], stream,
                                   ctypes.byref(h))
        else:
            items = (_Gather * len(outs))()
            for k, (o, i) in enumerate(zip(outs, ins)):
                items[k] = _Gather(i.data_ptr(), o.data_ptr(), i.numel(), _TORCH_DTYPES[i.dtype])
            code = self._lib_coalesced(comm, items, len(outs), stream, ctypes.byref(h))
        if h.value == 0:  # no op was created (no daemon, closed comm): a job-level failure
            self.comm._raise(code if code != 0 else 6, None if code != 0 else "no op handle returned")
        return code, Op(self.comm, h.value)

    def _poison(self, op, e):
        if self._broken is None:
            self._broken = StreamOrderedError(
                e.code, f"stream-ordered all-gather op {op.handle} failed after the caller went on "
                        f"({e.status}: {e.message}); its output is not valid and this adapter raises from now on")
        return self._broken

    def _order_on_stream(self, op, stream):
        if self.backend in GPU_BACKENDS:
            try:
                op.wait_stream(stream)
            except DmagatherError as e:
                raise self._poison(op, e)

    def _host_wait_pending(self, op):
        try:
            op.wait()
        except DmagatherError as e:
            raise self._poison(op, e)

    def _check_pending(self):
        """Reads the status of finished stream-ordered ops (never blocks, unless
        more than MAX_PENDING are outstanding). Raises when one failed."""
        if self._broken is not None:
            raise self._broken
        p = self._pending
        while p:
            op = p[0]
            try:
                done = op.test()
                if not done and len(p) > MAX_PENDING:
                    op.wait()
                    done = True
            except DmagatherError as e:
                raise self._poison(op, e)
            if not done:
                break
            p.popleft()

    def synchronize(self):
        """Host-waits for every stream-ordered op; raises if one failed."""
        with self._lock:
            if self._broken is not None:
                raise self._broken
            while self._pending:
                self._host_wait_pending(self._pending[0])
                self._pending.popleft()

    def gather(self, outs, ins, group=None, async_op=False, order_now=False):
        """One collective op over (outs[k], ins[k]) pairs (1..MAX_COALESCED)."""
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._pending:
                self._check_pending()
            local = self._local_reason(outs, ins, group)
            if local is not None:
                if local[0] != "shape":
                    self._note_fallback(*local)
                return self._framework(outs, ins, group, async_op)
            stream = self._stream_of(outs)
            key = tuple((i.dtype, i.numel(), o.numel()) for o, i in zip(outs, ins)) if self.stream_ordered else None
            # Captured into a CUDA graph: the library defines a persistent op and
            # has its verdict (every rank's) before the submit returns; the graph
            # then waits for each replay on the stream.
            capturing = self.backend == "cuda" and torch.cuda.is_current_stream_capturing()
            staged = self._stage(outs, ins) if self.host_staging else None
            if staged is not None:
                code, op = self._submit(staged[0], staged[1], stream)
            else:
                code, op = self._submit(outs, ins, stream)
            if key is None or key not in self._served or capturing:
                # The verdict on the host (every rank: the key is equal everywhere).
                try:
                    op.wait()
                except FallbackError as e:
                    self._note_fallback("memory_unreachable", str(e))
                    self._served.discard(key)
                    return self._framework(outs, ins, group, async_op)
                self.counters["dmagather_ops"] += 1
                if staged is not None:
                    for o, so in zip(outs, staged[0]):
                        if so is not o:
                            o.copy_(so)
                    self.counters["staged_ops"] += 1
                if capturing:
                    self.counters["captured_ops"] += 1
                    if async_op and not order_now:
                        return Work(self, op, stream_pending=True)
                    self._order_on_stream(op, stream)
                    return Work(self, op) if async_op else None
                self.counters["host_waited_ops"] += 1
                if key is not None:
                    self._served.add(key)
                return Work() if async_op else None
            # A served signature: stream-ordered, verdict read lazily.
            if code != 0:
                msg = _strip_rank(self.comm._lib.dmagather_last_error(self.comm._comm).decode() or "refused")
                err = DmagatherError(code, msg)
                raise self._poison(op, err)
            self.counters["dmagather_ops"] += 1
            self.counters["stream_ordered_ops"] += 1
            self._pending.append(op)
            if self.backend in GPU_BACKENDS:
                if async_op and not order_now:
                    return Work(self, op, stream_pending=True)
                self._order_on_stream(op, stream)
                return Work(self, op) if async_op else None
            # host backend in stream-ordered (test) mode: no stream to wait on;
            # the op keeps its tensors until it is seen done.
            op._keep = (outs, ins)
            return Work(self, op, host_pending=True) if async_op else None

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False, order_now=False):
        return self.gather([output_tensor], [input_tensor], group, async_op, order_now)

    def all_gather_coalesced(self, outputs, inputs, group=None, async_op=False, order_now=False):
        outputs, inputs = list(outputs), list(inputs)
        if len(outputs) != len(inputs):
            raise ValueError(f"{len(outputs)} outputs for {len(inputs)} inputs")
        works = []
        for s in range(0, len(outputs), MAX_COALESCED):  # one op per 64 items, alike on every rank
            works.append(self.gather(outputs[s:s + MAX_COALESCED], inputs[s:s + MAX_COALESCED], group, async_op,
                                     order_now))
        if not async_op:
            return None
        return works[0] if len(works) == 1 else _WorkList(works)

    def close(self):
        with self._lock:
            try:
                if self._broken is None and self.comm is not None:
                    self.synchronize()
            finally:
                if self.comm is not None:
                    self.comm.close()
                    self.comm = None
                    self.unavailable = ("not_enabled", "closed")
