"""The collective set-up of one dmagather job for one torch process group.

Every group that dmagather serves gets a job of its own on the daemons: WORLD
(dmagather.torch.init()), and any other group (an HSDP shard group, the data-
parallel dimension of an FSDP x TP mesh, ZeRO++'s hpZ secondary group, a
DeepSpeed group) at its first all-gather, which every rank of that group makes
at the same point of the program. `setup()` runs on every rank of the group,
over the group itself, and ends with the same decision on every rank:

1. One all_reduce(MAX) over the group carries, per rank, whether it is enabled
   (DMAGATHER_ALLGATHER), its max_numel, its node, whether it asks for the
   reduce-scatter (DMAGATHER_REDUCE_SCATTER, and a library that has it), and
   the group's first rank's random job key.
2. The group's nodes decide the job's shape. A rank's node is the daemon it
   talks to (`node_id`): the host's boot id and the control socket's inode, so
   ranks on one host that reach one daemon are one node, whatever the launcher
   set (LOCAL_WORLD_SIZE, LOCAL_SIZE or nothing). A group on one node joins
   that node's daemon. A group across nodes runs on the daemons' hierarchical
   ring: the group's first rank asks its daemon for a job id
   (dmagather.job_id_create: the daemon needs --peer_listen) and a second
   all_reduce passes it to every rank of the group (or says why there is none).
3. Every rank joins (local rank and count on its node from step 2), and a
   last all_reduce tells every rank whether all joined.

Any "no" anywhere disables the group's job on every rank, with one reason;
its all-gathers then go to torch, counted by that reason. The reduce-scatter
is decided the same way, apart: served when the job is up and every rank
asked for it (`_torch_reduce.verdict`).
"""
import hashlib
import os
import secrets
import socket as _socket

import torch
import torch.distributed as dist

from . import Comm, DmagatherError, FallbackError, job_id_create
from . import _torch_reduce
from ._torch_gather import DmagatherAllGather, _env_flag, _max_numel_from_env

DEFAULT_JOIN_TIMEOUT_MS = 10000      # DMAGATHER_JOIN_TIMEOUT_MS overrides
DEFAULT_SOCKET = "/run/dmagather/dmagatherd.sock"  # DMAGATHER_DEFAULT_SOCKET of dmagather.h
_ID_WORDS = 40                       # int64 words of 7 bytes each: a job id of up to 280 bytes


def node_id(socket=None):
    """This rank's node, as a positive 56-bit number: the daemon it talks to
    (the host's boot id, the control socket's device and inode); 0 when there
    is no socket to reach."""
    path = socket or os.environ.get("DMAGATHER_SOCKET") or DEFAULT_SOCKET
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = _socket.gethostname()
    try:
        st = os.stat(path)
    except OSError:
        return 0
    digest = hashlib.sha256(f"{boot}|{st.st_dev}:{st.st_ino}".encode()).digest()
    return int.from_bytes(digest[:7], "little") or 1


def reduce_device(group):
    """Where the group's all_reduce takes its tensor."""
    b = str(dist.get_backend(group)).lower()
    if b == "nccl" or (b.startswith("cuda:") and "cpu:" not in b):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_max(values, group, dev):
    """all_reduce(MAX) of a list of int64 over the group."""
    t = torch.tensor(values, dtype=torch.int64).to(dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().tolist()


def _encode(text):
    data = text.encode()
    if len(data) > 7 * _ID_WORDS:
        raise ValueError(f"job id of {len(data)} bytes")
    data = data.ljust(7 * _ID_WORDS, b"\0")
    return [int.from_bytes(data[7 * k:7 * k + 7], "little") for k in range(_ID_WORDS)]


def _decode(words):
    return b"".join(int(w).to_bytes(7, "little") for w in words).rstrip(b"\0").decode()


def _job_id(group, rank, socket, dev):
    """The group's first rank makes a multi-node job id; every rank gets it, or
    (None, why) on every rank."""
    words, why = [0] * _ID_WORDS, ""
    if rank == 0:
        try:
            words = _encode(job_id_create(socket))
        except (DmagatherError, FallbackError, OSError, ValueError) as e:
            why = str(e)
    v = _all_max([1 if why else 0] + words, group, dev)
    if v[0]:
        return None, "the group's first rank could not make a multi-node job id (its daemon needs --peer_listen)" + \
            (f": {why}" if why else "")
    return _decode(v[1:]), None


def _join_all(key, size, rank, socket, join_timeout_ms, dev, group, local, job_id):
    """Every rank joins, then one all_reduce tells every rank whether all did.
    Returns (comm, None), or (None, (reason kind, sentence)) on every rank."""
    comm = None
    jt = join_timeout_ms
    if jt is None:
        jt = int(os.environ.get("DMAGATHER_JOIN_TIMEOUT_MS") or DEFAULT_JOIN_TIMEOUT_MS)
    code, why = 0, ""
    try:
        comm = Comm(key, size, rank, socket=socket, join_timeout_ms=jt, local_rank=local[0],
                    local_world_size=local[1], job_id=job_id)
    except DmagatherError as e:
        code, why = (1 if e.status == "UNAVAILABLE" else 2), str(e)
    except OSError as e:  # libdmagather.so not found
        code, why = 1, str(e)
    v = [0] * size
    v[rank] = code
    v = _all_max(v, group, dev)
    bad = [r for r in range(size) if v[r]]
    if not bad:
        return comm, None
    if comm is not None:
        try:
            comm.close()
        except DmagatherError:
            pass
    ones = [str(r) for r in bad if v[r] == 1]
    twos = [str(r) for r in bad if v[r] != 1]
    parts = ([f"daemon unreachable on rank(s) {','.join(ones)}"] if ones else []) + \
            ([f"join failed on rank(s) {','.join(twos)}"] if twos else [])
    return None, ("daemon_unreachable" if ones else "join_failed", "; ".join(parts) +
                  (f" (this rank: {why})" if why else ""))


def setup(group, *, enabled, socket=None, max_numel=None, join_timeout_ms=None, job_key=None, stream_ordered=None,
          host_staging=False, reduce_scatter=None):
    """Collective over `group` (None: WORLD): the group's adapter, joined or
    disabled with its reason on every rank of the group, and its
    reduce-scatter (adapter.reduce_scatter) served or not on every rank
    (reduce_scatter: default $DMAGATHER_REDUCE_SCATTER == 1)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    dev = reduce_device(group)
    mine = int(max_numel) if max_numel is not None else _max_numel_from_env()
    # [disabled flag of each rank..., node of each rank..., -max_numel, key words of the first rank,
    #  reduce-scatter word of each rank (_torch_reduce.rank_code)...]
    t = [0] * (3 * size + 3)
    t[2 * size + 3 + rank] = _torch_reduce.rank_code(reduce_scatter)
    t[rank] = 0 if enabled else 1
    t[size + rank] = node_id(socket)
    t[2 * size] = -max(1, mine)  # MAX of the negatives: the smallest max_numel wins
    if rank == 0:
        t[2 * size + 1] = secrets.randbits(62)
        t[2 * size + 2] = secrets.randbits(62)
    t = _all_max(t, group, dev)
    disabled = [r for r in range(size) if t[r]]
    nodes = t[size:2 * size]
    agreed_max = -t[2 * size]
    key = job_key or f"torch-{t[2 * size + 1]:016x}{t[2 * size + 2]:016x}"
    order = list(dict.fromkeys(n for n in nodes if n))  # the nodes, by their first rank
    here = [r for r in range(size) if nodes[r] == nodes[rank]]
    local = (here.index(rank), len(here))
    comm, unavailable = None, None
    no_socket = [r for r in range(size) if nodes[r] == 0]
    if disabled:
        which = "" if len(disabled) == size else f" on rank(s) {','.join(map(str, disabled))}"
        unavailable = ("not_enabled", f"not enabled{which}: DMAGATHER_ALLGATHER is not 1")
    elif no_socket:  # decided before anyone joins: no join time-out to wait for
        path = socket or os.environ.get("DMAGATHER_SOCKET") or DEFAULT_SOCKET
        mine = f" (this rank: no dmagatherd socket at {path}: is dmagatherd running?)" if rank in no_socket else ""
        unavailable = ("daemon_unreachable", f"daemon unreachable on rank(s) {','.join(map(str, no_socket))}{mine}")
    else:
        job_id, why = (None, None)
        if len(order) > 1:
            job_id, why = _job_id(group, rank, socket, dev)
        if why is not None:
            unavailable = ("join_failed", f"the group spans {len(order)} nodes and {why}")
        else:
            comm, unavailable = _join_all(key, size, rank, socket, join_timeout_ms, dev, group, local, job_id)
    env_staging = _env_flag("DMAGATHER_HOST_STAGING")
    staging = env_staging if env_staging is not None else bool(host_staging)
    a = DmagatherAllGather(key, size, rank, group=group, comm=comm, max_numel=agreed_max, unavailable=unavailable,
                           backend_name=str(dist.get_backend(group)), stream_ordered=stream_ordered,
                           host_staging=staging)
    a.nodes = len(order)
    a.ranks = dist.get_process_group_ranks(group) if group is not None else list(range(size))  # global ranks
    rs_codes = t[2 * size + 3:3 * size + 3]
    a.reduce_scatter = _torch_reduce.ReduceScatter(a, off=_torch_reduce.verdict(rs_codes),
                                                   requested=any(c != 1 for c in rs_codes))
    return a
