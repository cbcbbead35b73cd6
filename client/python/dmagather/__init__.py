"""dmagather: AllGather served by the node's dmagatherd (ctypes over libdmagather.so).

    import dmagather
    with dmagather.Comm("job-42", world_size=4, rank=r) as comm:
        out = comm.empty(4 * 1024, "float32")        # memory the daemon can reach
        mine = out[r * 1024:(r + 1) * 1024]          # in place: send = recv + rank*count
        mine[:] = ...
        comm.allgather(mine, out)
        comm.wait()                                  # raises DmagatherError with the reason

The library is found through $DMAGATHER_LIB, next to this package, or in the
Bazel output tree (bazel-bin/client/libdmagather.so).
"""
import ctypes
import os

__all__ = ["Comm", "DmagatherError", "FallbackError", "DTYPES", "load_library", "STATUS"]

STATUS = {0: "OK", 1: "FALLBACK", 2: "INVALID_ARGUMENT", 3: "UNAVAILABLE", 4: "PEER_FAILED",
          5: "TIMEOUT", 6: "INTERNAL"}
# dmagather_dtype_t by name (numpy / torch spellings).
DTYPES = {"uint8": 0, "int8": 1, "int32": 2, "int64": 3, "float16": 4, "bfloat16": 5,
          "float32": 6, "float64": 7}
_SIZES = {0: 1, 1: 1, 2: 4, 3: 8, 4: 2, 5: 2, 6: 4, 7: 8}


class DmagatherError(RuntimeError):
    """A dmagather call failed; .status is the name (e.g. 'PEER_FAILED'), .code the number."""

    def __init__(self, code, message):
        self.code = code
        self.status = STATUS.get(code, str(code))
        super().__init__(f"{self.status}: {message}")


class FallbackError(DmagatherError):
    """The call cannot be served by dmagather here; use the framework's own collective."""


_lib = None


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
        raise OSError("libdmagather.so not found: set DMAGATHER_LIB or build //client:libdmagather.so")
    P, S, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.dmagather_comm_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, I, I, ctypes.POINTER(P)]
    lib.dmagather_comm_destroy.argtypes = [P]
    lib.dmagather_alloc.argtypes = [P, S, ctypes.POINTER(P)]
    lib.dmagather_free.argtypes = [P, P]
    lib.dmagather_register.argtypes = [P, P, S]
    lib.dmagather_deregister.argtypes = [P, P]
    lib.dmagather_allgather.argtypes = [P, P, P, S, I, P]
    lib.dmagather_allgather_list.argtypes = [P, P, ctypes.POINTER(P), S, I, P]
    lib.dmagather_wait.argtypes = [P]
    lib.dmagather_last_error.argtypes = [P]
    lib.dmagather_last_error.restype = ctypes.c_char_p
    lib.dmagather_backend.argtypes = [P]
    lib.dmagather_backend.restype = ctypes.c_char_p
    lib.dmagather_version.restype = ctypes.c_char_p
    for f in ("dmagather_comm_init", "dmagather_comm_destroy", "dmagather_alloc", "dmagather_free",
              "dmagather_register", "dmagather_deregister", "dmagather_allgather",
              "dmagather_allgather_list", "dmagather_wait"):
        getattr(lib, f).restype = I
    _lib = lib
    return lib


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


class Comm:
    """One rank of a job on the node's dmagatherd."""

    def __init__(self, job_key, world_size, rank, socket=None, lib=None):
        self._lib = load_library(lib)
        self._comm = ctypes.c_void_p()
        self._buffers = {}
        code = self._lib.dmagather_comm_init(socket.encode() if socket else None, job_key.encode(),
                                            world_size, rank, ctypes.byref(self._comm))
        if code != 0:
            self._comm = None
            self._raise(code, self._lib.dmagather_last_error(None))
        self.world_size, self.rank = world_size, rank
        self.backend = self._lib.dmagather_backend(self._comm).decode()

    def _raise(self, code, message=None):
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
        self._check(self._lib.dmagather_allgather(self._comm, _address(send), _address(recv), count,
                                                  _dtype_code(dtype), stream))

    def allgather_list(self, send, recvs, count=None, dtype=None, stream=None):
        dtype = dtype if dtype is not None else send.dtype
        count = count if count is not None else (send.size if isinstance(getattr(send, "size", None), int)
                                                 else send.numel())
        arr = (ctypes.c_void_p * len(recvs))(*[_address(r) for r in recvs])
        self._check(self._lib.dmagather_allgather_list(self._comm, _address(send), arr, count,
                                                       _dtype_code(dtype), stream))

    def wait(self):
        self._check(self._lib.dmagather_wait(self._comm))

    def close(self):
        if self._comm:
            code = self._lib.dmagather_comm_destroy(self._comm)
            self._comm = None
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
