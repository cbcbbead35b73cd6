"""The C signatures of libdmagather.so (dmagather.h) for ctypes, and its
structs: what dmagather.load_library declares on the library it loads."""
import ctypes


class _Config(ctypes.Structure):
    """dmagather_config_t (field order and types as in dmagather.h)."""
    _fields_ = [("size", ctypes.c_size_t),
                ("magic", ctypes.c_uint),
                ("version", ctypes.c_uint),
                ("socket_path", ctypes.c_char_p),
                ("join_timeout_ms", ctypes.c_int),
                ("spin", ctypes.c_int),
                ("local_rank", ctypes.c_int),
                ("local_world_size", ctypes.c_int),
                ("job_id", ctypes.c_char_p)]


class _Gather(ctypes.Structure):
    """dmagather_gather_t (dmagather_dtype_t is a C enum: int)."""
    _fields_ = [("send", ctypes.c_void_p),
                ("recv", ctypes.c_void_p),
                ("count", ctypes.c_size_t),
                ("dtype", ctypes.c_int)]


def declare(lib):
    """Declares argtypes/restype of every function; the newer, optional
    symbols only where this library has them (lib._dmagather_optional)."""
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
    lib.dmagather_version.argtypes = []
    lib.dmagather_version.restype = ctypes.c_char_p
    lib.dmagather_version_code.argtypes = []
    lib.dmagather_version_code.restype = ctypes.c_int
    OP = ctypes.c_uint64  # dmagather_op_t
    lib.dmagather_comm_init_config.argtypes = [ctypes.c_char_p, I, I, ctypes.POINTER(_Config), ctypes.POINTER(P)]
    lib.dmagather_job_id_create.argtypes = [ctypes.c_char_p, ctypes.c_char_p, S]
    lib.dmagather_allgather_async.argtypes = [P, P, P, S, I, P, ctypes.POINTER(OP)]
    lib.dmagather_allgather_coalesced.argtypes = [P, ctypes.POINTER(_Gather), S, P, ctypes.POINTER(OP)]
    lib.dmagather_submit_fallback.argtypes = [P, ctypes.c_char_p, ctypes.POINTER(OP)]
    lib.dmagather_op_wait.argtypes = [P, OP]
    lib.dmagather_op_test.argtypes = [P, OP, ctypes.POINTER(I)]
    lib.dmagather_op_wait_stream.argtypes = [P, OP, P]
    lib.dmagather_status_string.argtypes = [I]
    lib.dmagather_status_string.restype = ctypes.c_char_p
    lib.dmagather_comm_rank.argtypes = [P]
    lib.dmagather_comm_size.argtypes = [P]
    lib.dmagather_dtype_size.argtypes = [I]
    lib.dmagather_dtype_size.restype = S
    lib.dmagather_dtype_name.argtypes = [I]
    lib.dmagather_dtype_name.restype = ctypes.c_char_p
    # Newer symbols, declared only where this library has them: an older
    # libdmagather.so still loads (has_reduce_scatter() says False).
    lib._dmagather_optional = set()
    for name, args in (("dmagather_reduce_scatter", [P, P, P, S, I, I, P]),
                       ("dmagather_reduce_scatter_async", [P, P, P, S, I, I, P, ctypes.POINTER(OP)]),
                       ("dmagather_alltoall_async", [P, P, P, S, I, P, ctypes.POINTER(OP)])):
        try:
            f = getattr(lib, name)
        except AttributeError:
            continue
        f.argtypes = args
        f.restype = I
        lib._dmagather_optional.add(name)
    for f in ("dmagather_comm_init", "dmagather_comm_init_config", "dmagather_comm_destroy", "dmagather_alloc",
              "dmagather_free", "dmagather_register", "dmagather_deregister", "dmagather_allgather",
              "dmagather_allgather_list", "dmagather_wait", "dmagather_allgather_async",
              "dmagather_allgather_coalesced", "dmagather_submit_fallback", "dmagather_op_wait",
              "dmagather_op_test", "dmagather_op_wait_stream", "dmagather_comm_rank", "dmagather_comm_size",
              "dmagather_job_id_create"):
        getattr(lib, f).restype = I
