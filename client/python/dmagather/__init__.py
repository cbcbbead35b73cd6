"""dmagather: AllGather served by the node's dmagatherd (ctypes over libdmagather.so).

    import dmagather
    with dmagather.Comm("job-42", world_size=4, rank=r) as comm:
        out = comm.empty(4 * 1024, "float32")        # memory the daemon can reach
        mine = out[r * 1024:(r + 1) * 1024]          # in place: send = recv + rank*count
        mine[:] = ...
        comm.allgather(mine, out)
        comm.wait()                                  # raises DmagatherError with the reason

Per-op handles (every rank of a job gets the same verdict for the same op):

    op = comm.allgather_async(mine, out)            # or allgather_coalesced([(s, r), ...])
    op = comm.reduce_scatter_async(send, recv, op=dmagather.SUM)  # recv: the sum of every rank's chunk `rank`
    op.wait()                                        # FallbackError / DmagatherError with the op's reason
    op = comm.submit_fallback("tensor not reachable")  # this rank opts out: the op fails everywhere

Submit calls return an Op also when this rank refused the op (memory the
backend cannot reach, bad arguments): the op still took its sequence number,
every rank learns the refusal, and Op.wait() raises it on every rank. They
raise at once only when no op was created (no daemon, destroyed comm, ...).

The library is found through $DMAGATHER_LIB, next to this package (the
wheel), in the Bazel output tree (bazel-bin/client/libdmagather.so), or else
by its SONAME through the dynamic linker (libdmagather.so.0: the Debian
package libdmagather0, which python3-dmagather depends on).
"""
import ctypes
import os

from . import _signatures
from ._signatures import _Config, _Gather  # noqa: F401 (the adapters import _Gather from here)

__all__ = ["Comm", "Op", "DmagatherError", "FallbackError", "DTYPES", "load_library", "STATUS",
           "MAX_COALESCED", "library_version", "SUM", "AVG", "REDOPS", "has_reduce_scatter"]

STATUS = {0: "OK", 1: "FALLBACK", 2: "INVALID_ARGUMENT", 3: "UNAVAILABLE", 4: "PEER_FAILED",
          5: "TIMEOUT", 6: "INTERNAL"}
# dmagather_dtype_t by name (numpy / torch spellings).
DTYPES = {"uint8": 0, "int8": 1, "int32": 2, "int64": 3, "float16": 4, "bfloat16": 5,
          "float32": 6, "float64": 7}
_SIZES = {0: 1, 1: 1, 2: 4, 3: 8, 4: 2, 5: 2, 6: 4, 7: 8}
MAX_COALESCED = 64  # DMAGATHER_MAX_COALESCED
# dmagather_redop_t: the reductions of dmagather_reduce_scatter (AVG: floating dtypes only).
SUM, AVG = 0, 1
REDOPS = {"sum": SUM, "avg": AVG}
CONFIG_MAGIC = 0x444D4147  # DMAGATHER_CONFIG_MAGIC ("DMAG")


class DmagatherError(RuntimeError):
    """A dmagather call failed; .status is the name (e.g. 'PEER_FAILED'), .code the number,
    .message the library's sentence (str(e) is "STATUS: message")."""

    def __init__(self, code, message):
        self.code = code
        self.message = message
        self.status = STATUS.get(code, str(code))
        super().__init__(f"{self.status}: {message}")


class FallbackError(DmagatherError):
    """The call cannot be served by dmagather here; use the framework's own collective."""


_lib = None
# The SONAME of the library this package's signatures are written for (its
# major version: DMAGATHER_VERSION_MAJOR; tools/build_debs.sh checks them).
SONAME = "libdmagather.so.0"


def load_library(path=None):
    """Loads libdmagather.so once and declares its C signatures."""
    global _lib
    if _lib is not None:
        return _lib
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [path, os.environ.get("DMAGATHER_LIB"), os.path.join(here, "libdmagather.so")]
    d = here
    for _ in range(6):  # bazel-bin/client/libdmagather.so from a source checkout
        candidates.append(os.path.join(d, "bazel-bin", "client", "libdmagather.so"))
        d = os.path.dirname(d)
    for c in candidates:
        if c and os.path.exists(c):
            lib = ctypes.CDLL(c)
            break
    else:
        try:  # installed system-wide (ld.so.cache): the libdmagather0 package
            lib = ctypes.CDLL(SONAME)
        except OSError:
            raise OSError(f"libdmagather.so not found (nor {SONAME} through the dynamic linker): install "
                          "libdmagather0, set DMAGATHER_LIB or build //client:libdmagather.so") from None
    _signatures.declare(lib)
    _lib = lib
    return lib


def has_reduce_scatter(lib=None):
    """Whether the library has dmagather_reduce_scatter[_async] (False for an
    older library, or none found)."""
    try:
        lib = load_library(lib)
    except OSError:
        return False
    return {"dmagather_reduce_scatter", "dmagather_reduce_scatter_async"} <= lib._dmagather_optional


def _redop_code(op):
    """SUM/AVG (0/1) or their names ("sum", "avg"; torch's ReduceOp names too)."""
    if isinstance(op, int) and op in REDOPS.values():
        return op
    name = str(op).rsplit(".", 1)[-1].lower()
    if name not in REDOPS:
        raise ValueError(f"reduction {op!r} is not one of dmagather's ({', '.join(REDOPS)})")
    return REDOPS[name]


def library_version(lib=None):
    """The library's dmagather_version() as a string, e.g. "0.4.0"."""
    return load_library(lib).dmagather_version().decode()


def _version_code(version):
    """DMAGATHER_VERSION_CODE of a "MAJOR.MINOR.PATCH" string: MAJOR*10000 + MINOR*100 + PATCH."""
    parts = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in version.split(".")[:3]]
    major, minor, patch = (parts + [0, 0, 0])[:3]
    return major * 10000 + minor * 100 + patch


def __getattr__(name):  # PEP 562: __version__ is read from the library on first use.
    if name == "__version__":
        return library_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _count_of(buf):
    size = getattr(buf, "size", None)
    return size if isinstance(size, int) else buf.numel()


def _dtype_code(dtype):
    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "")
    if name not in DTYPES:
        raise FallbackError(1, f"dtype {name} is not supported by dmagather")
    return DTYPES[name]


def _address(buf):
    """Address of a numpy array, a torch tensor, or an int."""
    if isinstance(buf, int):
        return buf
    if hasattr(buf, "data_ptr"):
        return buf.data_ptr()
    if hasattr(buf, "__array_interface__"):
        return buf.__array_interface__["data"][0]
    raise TypeError(f"cannot take the address of {type(buf).__name__}")


JOB_ID_MAX = 256  # DMAGATHER_JOB_ID_MAX


def job_id_create(socket=None, lib=None):
    """A new id for a job that spans nodes, from this node's daemon (it becomes
    the job's coordinator). Make it on one rank, give it to every rank through
    the job's launcher, and pass it as Comm(..., job_id=...)."""
    lib = load_library(lib)
    buf = ctypes.create_string_buffer(JOB_ID_MAX)
    code = lib.dmagather_job_id_create(socket.encode() if socket else None, buf, JOB_ID_MAX)
    if code != 0:
        raise (FallbackError if code == 1 else DmagatherError)(code, (lib.dmagather_last_error(None) or b"").decode())
    return buf.value.decode()


class Comm:
    """One rank of a job on the node's dmagatherd (job_id: a job that spans nodes)."""

    def __init__(self, job_key, world_size, rank, socket=None, lib=None, join_timeout_ms=None,
                 local_rank=None, local_world_size=None, spin=None, job_id=None):
        self._lib = load_library(lib)
        self._comm = ctypes.c_void_p()
        self._buffers = {}
        self._classic_pending = False  # allgather/allgather_list since the last wait()
        self._socket = socket.encode() if socket else None  # kept alive for the call below
        self._job_id = job_id.encode() if job_id else None
        cfg = _Config(size=ctypes.sizeof(_Config), magic=CONFIG_MAGIC,
                      version=self._lib.dmagather_version_code(),
                      socket_path=self._socket,
                      join_timeout_ms=0 if join_timeout_ms is None else int(join_timeout_ms),
                      spin=-1 if spin is None else int(spin),
                      local_rank=-1 if local_rank is None else int(local_rank),
                      local_world_size=-1 if local_world_size is None else int(local_world_size),
                      job_id=self._job_id)
        code = self._lib.dmagather_comm_init_config(job_key.encode(), world_size, rank, ctypes.byref(cfg),
                                                    ctypes.byref(self._comm))
        if code != 0:
            self._comm = None
            self._raise(code, self._lib.dmagather_last_error(None))
        self.world_size, self.rank = world_size, rank
        self.backend = self._lib.dmagather_backend(self._comm).decode()

    def _raise(self, code, message=None):
        if message is None and not self._comm:
            message = "the communicator was closed"
        if message is None:
            message = self._lib.dmagather_last_error(self._comm)
        text = message.decode() if isinstance(message, bytes) else str(message)
        raise (FallbackError if code == 1 else DmagatherError)(code, text)

    def _check(self, code):
        if code != 0:
            self._raise(code)

    def alloc(self, nbytes):
        """Raw memory the daemon can reach; returns its address."""
        ptr = ctypes.c_void_p()
        self._check(self._lib.dmagather_alloc(self._comm, nbytes, ctypes.byref(ptr)))
        self._buffers[ptr.value] = nbytes
        return ptr.value

    def empty(self, count, dtype="uint8"):
        """A numpy array of `count` elements in daemon-reachable memory (CPU backend)."""
        import numpy as np
        np_dtype = np.dtype("uint16") if str(dtype) == "bfloat16" else np.dtype(dtype)
        nbytes = max(1, count * np_dtype.itemsize)
        addr = self.alloc(nbytes)
        raw = (ctypes.c_char * nbytes).from_address(addr)
        return np.frombuffer(raw, dtype=np_dtype, count=count)

    def free(self, buf):
        self._check(self._lib.dmagather_free(self._comm, _address(buf)))
        self._buffers.pop(_address(buf), None)

    def register(self, buf, nbytes=None):
        if nbytes is None:
            nbytes = buf.nbytes if hasattr(buf, "nbytes") else buf.numel() * buf.element_size()
        self._check(self._lib.dmagather_register(self._comm, _address(buf), nbytes))

    def allgather(self, send, recv, count=None, dtype=None, stream=None):
        """all_gather_into_tensor: recv gets world_size*count elements, rank r's send at r*count."""
        dtype = dtype if dtype is not None else send.dtype
        count = count if count is not None else (send.size if hasattr(send, "size") and isinstance(send.size, int)
                                                 else send.numel())
        self._classic_pending = True
        self._check(self._lib.dmagather_allgather(self._comm, _address(send), _address(recv), count,
                                                  _dtype_code(dtype), stream))

    def allgather_list(self, send, recvs, count=None, dtype=None, stream=None):
        dtype = dtype if dtype is not None else send.dtype
        count = count if count is not None else (send.size if isinstance(getattr(send, "size", None), int)
                                                 else send.numel())
        arr = (ctypes.c_void_p * len(recvs))(*[_address(r) for r in recvs])
        self._classic_pending = True
        self._check(self._lib.dmagather_allgather_list(self._comm, _address(send), arr, count,
                                                       _dtype_code(dtype), stream))

    def wait(self):
        """Waits for every outstanding op; raises the first failure since the last wait().

        Failures already raised by Op.wait()/Op.test() are reported here again:
        use one style (per-op handles or comm.wait) per comm."""
        code = self._lib.dmagather_wait(self._comm)
        self._classic_pending = False
        self._check(code)

    def _handle(self):
        if not self._comm:
            raise DmagatherError(2, "the communicator was closed")
        return self._comm

    def _submitted(self, code, op, keep):
        """An Op for a submit's result. A refusal that took a sequence number
        (op != 0) is the op's verdict, raised by Op.wait() on every rank; a
        failure that created no op is raised here."""
        if op.value == 0:
            self._raise(code if code != 0 else 6, None if code != 0 else "no op handle returned")
        return Op(self, op.value, keep)

    def allgather_async(self, send, recv, count=None, dtype=None, stream=None):
        """Submits all_gather_into_tensor (as allgather) and returns its Op without waiting.

        An unsupported dtype becomes submit_fallback(reason), so the other ranks
        still learn about the op and every rank gets FALLBACK from Op.wait()."""
        comm = self._handle()
        dtype = dtype if dtype is not None else send.dtype
        count = count if count is not None else _count_of(send)
        try:
            code_dtype = _dtype_code(dtype)
        except FallbackError as e:
            return self.submit_fallback(e.message)
        op = ctypes.c_uint64(0)
        code = self._lib.dmagather_allgather_async(comm, _address(send), _address(recv), count, code_dtype,
                                                   stream, ctypes.byref(op))
        return self._submitted(code, op, (send, recv))

    def allgather_coalesced(self, pairs, stream=None):
        """One op for several flat AllGathers: pairs of (send, recv) or
        (send, recv, count, dtype); items may differ in count and dtype."""
        comm = self._handle()
        pairs = list(pairs)
        # 0 or more than MAX_COALESCED items: the library refuses the op
        # (INVALID_ARGUMENT on every rank), it still takes its sequence number.
        items = (_Gather * max(1, len(pairs)))()
        for i, p in enumerate(pairs):
            send, recv = p[0], p[1]
            count = p[2] if len(p) > 2 and p[2] is not None else _count_of(send)
            dtype = p[3] if len(p) > 3 and p[3] is not None else send.dtype
            try:
                code_dtype = _dtype_code(dtype)
            except FallbackError as e:
                return self.submit_fallback(f"item {i}: {e.message}")
            items[i] = _Gather(_address(send), _address(recv), count, code_dtype)
        op = ctypes.c_uint64(0)
        code = self._lib.dmagather_allgather_coalesced(comm, items if pairs else None, len(pairs), stream,
                                                       ctypes.byref(op))
        return self._submitted(code, op, pairs)

    def _optional(self, name):
        if name not in self._lib._dmagather_optional:
            raise FallbackError(1, f"this libdmagather.so ({self._lib.dmagather_version().decode()}) has no {name}")
        return getattr(self._lib, name)

    def reduce_scatter(self, send, recv, count=None, dtype=None, op=SUM, stream=None):
        """reduce_scatter_tensor: send holds world_size*count elements (chunk r
        for rank r); recv gets count elements, the sum (op=AVG: the mean) over
        ranks 0..N-1 in that order of every rank's chunk `rank`. In place when
        recv is send + rank*count. Complete when it returns (CPU); failures
        also come back from wait()."""
        fn = self._optional("dmagather_reduce_scatter")
        dtype = dtype if dtype is not None else recv.dtype
        count = count if count is not None else _count_of(recv)
        self._classic_pending = True
        self._check(fn(self._handle(), _address(send), _address(recv), count, _dtype_code(dtype), _redop_code(op),
                       stream))

    def reduce_scatter_async(self, send, recv, count=None, dtype=None, op=SUM, stream=None):
        """Submits reduce_scatter (as reduce_scatter) and returns its Op without
        waiting; on the host backend the sum runs in Op.wait()/Op.test().

        An unsupported dtype becomes submit_fallback(reason), so every rank gets
        FALLBACK from Op.wait(); AVG on an integer dtype is INVALID_ARGUMENT."""
        fn = self._optional("dmagather_reduce_scatter_async")
        comm = self._handle()
        dtype = dtype if dtype is not None else recv.dtype
        count = count if count is not None else _count_of(recv)
        try:
            code_dtype = _dtype_code(dtype)
        except FallbackError as e:
            return self.submit_fallback(e.message)
        h = ctypes.c_uint64(0)
        code = fn(comm, _address(send), _address(recv), count, code_dtype, _redop_code(op), stream, ctypes.byref(h))
        return self._submitted(code, h, (send, recv))

    def alltoall_async(self, send, recv, count=None, dtype=None, stream=None):
        """all_to_all_single with equal chunks of `count` elements: chunk r of
        send goes to rank r, where it lands as chunk `rank` of recv (send and
        recv hold world_size*count elements and must not overlap). Returns its Op."""
        fn = self._optional("dmagather_alltoall_async")
        comm = self._handle()
        dtype = dtype if dtype is not None else send.dtype
        count = count if count is not None else _count_of(send) // self.world_size
        try:
            code_dtype = _dtype_code(dtype)
        except FallbackError as e:
            return self.submit_fallback(e.message)
        h = ctypes.c_uint64(0)
        code = fn(comm, _address(send), _address(recv), count, code_dtype, stream, ctypes.byref(h))
        return self._submitted(code, h, (send, recv))

    def submit_fallback(self, reason=""):
        """This rank will not take part in the next op: it fails with FALLBACK
        and `reason` on every rank. Returns that Op (its wait() raises FallbackError)."""
        comm = self._handle()
        op = ctypes.c_uint64(0)
        code = self._lib.dmagather_submit_fallback(comm, str(reason).encode(), ctypes.byref(op))
        return self._submitted(code, op, None)

    def close(self):
        """Leaves the job (outstanding ops are waited for first). Ops of this
        comm raise DmagatherError afterwards.

        dmagather_comm_destroy returns the first op failure since the last
        wait(), also of ops whose verdict an Op already raised. Such op
        verdicts (FALLBACK, INVALID_ARGUMENT) are raised here only when a
        classic allgather/allgather_list was submitted since the last wait();
        failures of the job itself (UNAVAILABLE, PEER_FAILED, ...) always are."""
        if self._comm:
            code = self._lib.dmagather_comm_destroy(self._comm)
            self._comm = None
            if code in (1, 2) and not self._classic_pending:
                return
            if code != 0:
                self._raise(code, self._lib.dmagather_last_error(None))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._comm:
                self._lib.dmagather_comm_destroy(self._comm)
        except Exception:
            pass


class Op:
    """One submitted operation (dmagather_op_t). The same op has the same
    verdict on every rank of the job."""

    def __init__(self, comm, handle, keep=None):
        self.comm, self.handle = comm, handle
        self._keep = keep  # the buffers, alive until the op is known to be done

    def __repr__(self):
        return f"<dmagather.Op {self.handle} rank={self.comm.rank}>"

    def _finish(self, code):
        if code != 0:
            self._keep = None
            self.comm._raise(code)

    def wait(self):
        """Blocks (host) until the op completed; raises FallbackError or
        DmagatherError with the op's status and reason."""
        code = self.comm._lib.dmagather_op_wait(self.comm._handle(), self.handle)
        self._finish(code)
        self._keep = None

    def test(self):
        """True once the op completed successfully, False while it runs;
        raises like wait() when it failed."""
        done = ctypes.c_int(0)
        code = self.comm._lib.dmagather_op_test(self.comm._handle(), self.handle, ctypes.byref(done))
        self._finish(code)
        if done.value:
            self._keep = None
        return bool(done.value)

    def wait_stream(self, stream=None):
        """CUDA/HIP: `stream` (a cudaStream_t / hipStream_t as int) waits on the GPU; the verdict
        is read later with test()/wait(). Host backend: stream is None and this
        is wait()."""
        code = self.comm._lib.dmagather_op_wait_stream(self.comm._handle(), self.handle, stream)
        self._finish(code)
