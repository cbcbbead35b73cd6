"""PyTorch adapter: all_gather_into_tensor on dmagather, with explicit fallback.

    from dmagather.torch import DmagatherAllGather
    ag = DmagatherAllGather(job_key, world_size, rank)      # once per process group
    ag.all_gather_into_tensor(output, input)                 # ZeRO-3 / FSDP2 parameter gather

Where dmagather cannot serve a call (no daemon, unsupported dtype, memory the
backend cannot reach), the framework's torch.distributed.all_gather_into_tensor
runs instead and the reason is logged once, on rank 0.
"""
import logging

import torch
import torch.distributed as dist

from . import Comm, DmagatherError, FallbackError

log = logging.getLogger("dmagather")


class DmagatherAllGather:
    def __init__(self, job_key, world_size, rank, socket=None, group=None):
        self.rank, self.world_size, self.group = rank, world_size, group
        self._fallback_reasons = set()
        try:
            self.comm = Comm(job_key, world_size, rank, socket=socket)
        except DmagatherError as e:
            self.comm = None
            self._note_fallback(f"dmagather unavailable: {e}")

    def _note_fallback(self, reason):
        if reason not in self._fallback_reasons:
            self._fallback_reasons.add(reason)
            if self.rank == 0:
                log.warning("dmagather fallback to torch.distributed: %s", reason)

    def all_gather_into_tensor(self, output, input):
        if self.comm is not None:
            try:
                # Reachable memory only: FALLBACK (not an error) where the backend
                # cannot reach these tensors, e.g. private CPU memory on the host backend.
                self.comm.register(output)
                self.comm.register(input)
                stream = torch.cuda.current_stream(output.device).cuda_stream if output.is_cuda else None
                self.comm.allgather(input, output, count=input.numel(), dtype=input.dtype, stream=stream)
                if not output.is_cuda:
                    self.comm.wait()
                return
            except FallbackError as e:
                self._note_fallback(str(e))
        dist.all_gather_into_tensor(output, input, group=self.group)
