"""PyTorch adapter: all_gather_into_tensor on dmagather, with collective fallback.

    from dmagather.torch import DmagatherAllGather
    ag = DmagatherAllGather(job_key, world_size, rank)      # once per process group
    ag.all_gather_into_tensor(output, input)                 # ZeRO-3 / FSDP2 parameter gather

One decision per op, the same on every rank. Each call is one dmagather op on
every rank, also on a rank that cannot take part:

1. the rank registers `output` and `input`; if its backend cannot reach them
   (FallbackError, e.g. private CPU memory on the host backend) it submits
   `comm.submit_fallback(reason)`, otherwise `comm.allgather_async(...)` (CUDA:
   on the current stream);
2. every rank reads the op's verdict with `op.wait()` on the host. When any
   rank refused, the op is FALLBACK on every rank, and every rank, also those
   whose own tensors were fine, runs torch.distributed's all-gather on
   `group` instead. The reason is logged once (per kind of reason) on rank 0.

So no rank ever runs the framework's collective while another waits in
dmagather. A failure that is not a fallback (ranks disagree on sizes, a peer
died, ...) is raised as DmagatherError on every rank.

Host blocking: the adapter blocks on the host for the verdict of every op,
also on CUDA tensors. There the data is stream-ordered (`op.wait_stream` makes
the current stream wait on the GPU), but deciding whether the framework's
collective must run needs the verdict first. A later version may cache the
verdict per tensor signature (pointer, size, dtype) and skip the host wait.

With async_op=True a small Work-like object is returned (`wait()`,
`is_completed()`); the dmagather path has already completed on the host by
then, the fallback path wraps torch.distributed's own work.

If the comm cannot be created (no daemon), every call goes to
torch.distributed: the join is collective, so the other ranks' joins time out
and they take the same path.

torch 1.13's gloo has no all_gather_into_tensor (_allgather_base); there the
fallback uses dist.all_gather into views of `output` (the same bytes).
"""
import logging
import re

import torch
import torch.distributed as dist

from . import Comm, DmagatherError, FallbackError

log = logging.getLogger("dmagather")

__all__ = ["DmagatherAllGather"]


class _Work:
    """What async_op=True returns: done already (dmagather) or torch's work."""

    def __init__(self, work=None):
        self._work = work

    def wait(self, timeout=None):
        if self._work is not None:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        return True

    def is_completed(self):
        return self._work is None or self._work.is_completed()


def _reason_kind(reason):
    """The reason without op numbers and addresses, so it is logged once."""
    return re.sub(r"#\d+|0x[0-9a-fA-F]+|\b\d{4,}\b", "N", reason)


class DmagatherAllGather:
    def __init__(self, job_key, world_size, rank, socket=None, group=None, **comm_options):
        self.rank, self.world_size, self.group = rank, world_size, group
        self._fallback_reasons = set()
        self._into_tensor = True  # torch.distributed.all_gather_into_tensor works on `group`
        self.dmagather_ops = 0    # ops dmagather served
        self.fallback_ops = 0     # ops that went to torch.distributed
        self.last_fallback_reason = None
        try:
            self.comm = Comm(job_key, world_size, rank, socket=socket, **comm_options)
        except DmagatherError as e:
            self.comm = None
            self._note_fallback(f"dmagather unavailable: {e}")

    def empty(self, shape, dtype=torch.float32):
        """A CPU tensor in memory the daemon can reach (host backend): gathers
        of such tensors are served by dmagather. Without a comm: torch.empty."""
        if isinstance(shape, int):
            shape = (shape,)
        if self.comm is None:
            return torch.empty(shape, dtype=dtype)
        count = 1
        for n in shape:
            count *= n
        name = str(dtype).replace("torch.", "")
        if name == "bfloat16":
            return torch.from_numpy(self.comm.empty(count, "int16")).view(torch.bfloat16).view(shape)
        return torch.from_numpy(self.comm.empty(count, name)).view(shape)

    def _note_fallback(self, reason):
        self.last_fallback_reason = reason
        kind = _reason_kind(reason)
        if kind not in self._fallback_reasons:
            self._fallback_reasons.add(kind)
            if self.rank == 0:
                log.warning("dmagather fallback to torch.distributed: %s", reason)

    def _submit(self, output, input, stream):
        """Submits this rank's part of the op: a real AllGather, or a refusal."""
        try:
            # Reachable memory only: FALLBACK (not an error) where the backend
            # cannot reach these tensors, e.g. private CPU memory on the host backend.
            self.comm.register(output)
            self.comm.register(input)
        except FallbackError as e:
            # The library prefixes the reason with "rank N: " itself.
            return self.comm.submit_fallback(re.sub(r"^(rank \d+: )+", "", e.message))
        except DmagatherError:
            # Not a fallback (e.g. a bad pointer): submit anyway; the library
            # refuses the op with the right status on every rank, or raises
            # here when no op can be created at all (destroyed comm).
            pass
        return self.comm.allgather_async(input, output, count=input.numel(), dtype=input.dtype, stream=stream)

    def _framework(self, output, input, async_op):
        if self._into_tensor:
            try:
                return dist.all_gather_into_tensor(output, input, group=self.group, async_op=async_op)
            except RuntimeError as e:
                # Raised before any communication, alike on every rank.
                if "_allgather_base" not in str(e) and "all_gather_into_tensor" not in str(e):
                    raise
                self._into_tensor = False
        chunks = list(output.view(-1).chunk(self.world_size))
        return dist.all_gather(chunks, input.reshape(-1), group=self.group, async_op=async_op)

    def all_gather_into_tensor(self, output, input, async_op=False):
        if self.comm is not None:
            stream = torch.cuda.current_stream(output.device).cuda_stream if output.is_cuda else None
            op = self._submit(output, input, stream)
            try:
                if stream is not None:
                    op.wait_stream(stream)  # data ordering on the GPU
                op.wait()                   # the verdict, on the host
                self.dmagather_ops += 1
                return _Work() if async_op else None
            except FallbackError as e:
                self._note_fallback(str(e))
        self.fallback_ops += 1
        work = self._framework(output, input, async_op)
        return _Work(work) if async_op else None

    def close(self):
        if self.comm is not None:
            self.comm.close()
            self.comm = None
