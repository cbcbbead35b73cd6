"""What the torch adapter's ops return (torch.distributed.Work's calls) and
the error a stream-ordered failure raises (dmagather.torch re-exports
both)."""

import torch

from . import DmagatherError


class StreamOrderedError(DmagatherError):
    """A stream-ordered op (CUDA, signature already served) failed after the
    caller went on: its output is not valid, and the adapter raises from now on."""


class Work:
    """What async_op=True returns (torch.distributed.Work's calls).

    dmagather op on CUDA: wait() makes the *current* stream wait on the GPU
    (no host block), then checks finished ops' status. dmagather op on CPU:
    wait() blocks until the op completed. Fallback: torch's own work(s)."""

    def __init__(self, adapter=None, op=None, stream_pending=False, torch_works=None, host_pending=False):
        self._adapter = adapter
        self._op = op
        self._stream_pending = stream_pending  # the current stream has not waited yet
        self._host_pending = host_pending      # host backend, not waited yet
        self._torch_works = [w for w in (torch_works or []) if w is not None]

    def wait_on(self, stream):
        """Makes `stream` (a cudaStream_t handle) wait for the op on the GPU,
        with no host block: the consumer's stream, where the op's output is
        used. May be called for several streams; the first call settles
        wait()'s own."""
        a = self._adapter
        if self._op is not None and a is not None:
            a._order_on_stream(self._op, stream)
            self._stream_pending = False

    def host_wait(self):
        """Blocks the host until the op is done (raises if it failed)."""
        for w in self._torch_works:
            w.wait()
        a = self._adapter
        if self._op is not None and a is not None:
            a._host_wait_pending(self._op)

    def wait(self, timeout=None):
        for w in self._torch_works:
            w.wait() if timeout is None else w.wait(timeout)
        a = self._adapter
        if self._op is not None and a is not None:
            if self._stream_pending:
                a._order_on_stream(self._op, torch.cuda.current_stream().cuda_stream)
                self._stream_pending = False
            if self._host_pending:
                a._host_wait_pending(self._op)
                self._host_pending = False
            a._check_pending()
        return True

    def is_completed(self):
        if self._torch_works:
            return all(w.is_completed() for w in self._torch_works)
        if self._op is None:
            return True
        try:
            return self._op.test()
        except DmagatherError as e:
            self._adapter._poison(self._op, e)
            raise self._adapter._broken

    def is_success(self):
        return self.is_completed()

    def exception(self):
        return None

    def synchronize(self):
        self.wait()


class _WorkList(Work):
    def __init__(self, works):
        super().__init__()
        self._works = works

    def wait(self, timeout=None):
        for w in self._works:
            w.wait(timeout)
        return True

    def wait_on(self, stream):
        for w in self._works:
            w.wait_on(stream)

    def host_wait(self):
        for w in self._works:
            w.host_wait()

    def is_completed(self):
        return all(w.is_completed() for w in self._works)
