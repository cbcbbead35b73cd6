"""Per-op handles of the Python package against a real daemon: allgather_async
with Op.test/Op.wait, a coalesced op of three dtypes, and the collective
fallback when ranks diverge (one rank submit_fallback, the others real
AllGathers): every rank gets FALLBACK with that rank's reason, and the next op
succeeds. Also the config path (join_timeout_ms reaches the library) and
__version__ from the library. The reduce-scatter and the all-to-all through
Comm (where the library has them): reduce_scatter_async SUM and AVG (in place)
bit-exact against sums in rank order, the classic reduce_scatter + wait(),
alltoall_async, and AVG on an integer dtype refused on every rank."""
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time
import unittest

import numpy as np

RUNFILES = os.getcwd()
sys.path.insert(0, os.path.join(RUNFILES, "tests", "python"))
from daemon_case import DaemonTestCase  # noqa: E402
sys.path.insert(0, os.path.join(RUNFILES, "client", "python"))
os.environ.setdefault("DMAGATHER_LIB", os.path.join(RUNFILES, "client", "libdmagather.so"))
import dmagather  # noqa: E402

WORLD = 3
DEADLINE_S = 60  # no test may hang: every rank process is bounded by this


def stats(sock, job):
    out = subprocess.run([os.path.join(RUNFILES, "tools", "dmagatherctl"), f"--socket={sock}", "--json", "stats",
                          f"--job={job}"], check=True, capture_output=True, text=True, timeout=30).stdout
    reply = json.loads(out)
    jobs = [j for j in reply.get("jobs", []) if j["job_key"] == job]
    return reply, jobs[0] if jobs else None


def run_ranks(target, *args, world=WORLD):
    """Runs target(rank, *args) in `world` fresh processes; returns {rank: result}.

    spawn, not fork: this process has used libdmagather itself (tests that
    open a Comm here), and a forked child inherits its gRPC state, after which
    the child's calls to the daemon time out."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_guard, args=(target, r, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in procs:
            r, res = q.get(timeout=DEADLINE_S)
            results[r] = res
    except Exception:  # noqa: BLE001  (queue.Empty: some rank hangs)
        pass
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
    return results


def _guard(target, rank, args, q):
    try:
        q.put((rank, target(rank, *args)))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, f"{type(e).__name__}: {e}"))


def wait_test(op, timeout_s=30):
    """Polls op.test() until it reports completion; returns the number of polls."""
    deadline = time.monotonic() + timeout_s
    polls = 0
    while not op.test():
        polls += 1
        if time.monotonic() > deadline:
            raise AssertionError(f"{op} not done after {timeout_s} s")
        time.sleep(0.0005)
    return polls


def pattern(seed, nbytes):
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def async_and_coalesced(rank, sock, job):
    with dmagather.Comm(job, WORLD, rank, socket=sock, join_timeout_ms=30000, local_rank=rank,
                        local_world_size=WORLD) as comm:
        # allgather_async, in place, completion seen through Op.test then Op.wait.
        for i, (dt, count) in enumerate([("float32", 1), ("int64", 777), ("bfloat16", 70001), ("uint8", 4096)]):
            out = comm.empty(WORLD * count, dt)
            raw = out.view(np.uint8)
            isz = out.itemsize
            raw[rank * count * isz:(rank + 1) * count * isz] = pattern(100 * i + rank, count * isz)
            op = comm.allgather_async(out[rank * count:(rank + 1) * count], out, count=count, dtype=dt)
            if not isinstance(op, dmagather.Op) or op.handle <= 0:
                raise AssertionError(f"allgather_async returned {op!r}")
            wait_test(op)
            op.wait()  # a completed op can be waited for again
            for r in range(WORLD):
                if not np.array_equal(raw[r * count * isz:(r + 1) * count * isz], pattern(100 * i + r, count * isz)):
                    raise AssertionError(f"async {dt} count={count}: shard of rank {r} differs")
            comm.free(out)
        # One coalesced op: three arrays of different dtypes and counts, out of place.
        spec = [("uint8", 13), ("float64", 1000), ("int32", 4099)]
        pairs, sends = [], []
        for j, (dt, count) in enumerate(spec):
            send = comm.empty(count, dt)
            send.view(np.uint8)[:] = pattern(1000 + 10 * j + rank, send.nbytes)
            recv = comm.empty(WORLD * count, dt)
            pairs.append((send, recv))
            sends.append(send)
        op = comm.allgather_coalesced(pairs)
        op.wait()
        for j, ((dt, count), (_, recv)) in enumerate(zip(spec, pairs)):
            raw = recv.view(np.uint8)
            n = count * recv.itemsize
            for r in range(WORLD):
                if not np.array_equal(raw[r * n:(r + 1) * n], pattern(1000 + 10 * j + r, n)):
                    raise AssertionError(f"coalesced item {j} ({dt}): shard of rank {r} differs")
        # Per-item (send, recv, count, dtype): a prefix of each array, as raw bytes.
        bsend = comm.empty(64, "uint8")
        bsend[:] = rank + 1
        brecv = comm.empty(WORLD * 16, "uint8")
        op = comm.allgather_coalesced([(bsend, brecv, 16, "uint8")])
        wait_test(op)
        if not np.array_equal(brecv, np.repeat(np.arange(1, WORLD + 1, dtype=np.uint8), 16)):
            raise AssertionError(f"coalesced with explicit count: {brecv}")
    return "ok"


def diverging_fallback(rank, sock, job):
    with dmagather.Comm(job, WORLD, rank, socket=sock) as comm:
        count = 1024
        out = comm.empty(WORLD * count, "int32")
        mine = out[rank * count:(rank + 1) * count]
        mine[:] = np.arange(count, dtype=np.int32) + 100000 * rank
        # The same op: rank 1 opts out, ranks 0 and 2 submit real AllGathers.
        if rank == 1:
            op = comm.submit_fallback("rank one's tensors live in private memory")
        else:
            op = comm.allgather_async(mine, out)
        try:
            op.wait()
            return "op.wait() did not raise"
        except dmagather.FallbackError as e:
            if e.status != "FALLBACK" or e.code != 1:
                return f"wrong status {e.status}"
            if "rank one's tensors live in private memory" not in str(e):
                return f"reason of rank 1 missing: {e}"
            first = str(e)
        # Op.test agrees with Op.wait on the failed op.
        try:
            op.test()
            return "op.test() did not raise"
        except dmagather.FallbackError:
            pass
        # The next op: every rank takes part and it succeeds, bit-exact.
        out[:] = -1
        mine[:] = np.arange(count, dtype=np.int32) * 7 + 100000 * rank
        op2 = comm.allgather_async(mine, out)
        if op2.handle != op.handle + 1:
            return f"op handles {op.handle} then {op2.handle}"
        op2.wait()
        for r in range(WORLD):
            if not np.array_equal(out[r * count:(r + 1) * count], np.arange(count, dtype=np.int32) * 7 + 100000 * r):
                return f"op after the fallback: shard of rank {r} differs"
        # An unsupported dtype on one rank is also a collective fallback, not a local raise.
        dt = "complex64" if rank == 2 else "int32"
        op3 = comm.allgather_async(mine, out, count=count, dtype=dt)
        try:
            op3.wait()
            return "unsupported dtype on rank 2 not reported"
        except dmagather.FallbackError as e:
            if "complex64" not in str(e):
                return f"dtype reason missing: {e}"
    return ("ok", first)


def rs_values(rank, n):
    """Rank `rank`'s float32 reduce-scatter input of n elements."""
    rng = np.random.default_rng(500 + rank)
    return (rng.standard_normal(n) * np.exp2(rng.integers(-8, 9, size=n))).astype(np.float32)


def reduce_scatter_and_alltoall(rank, sock, job):
    n = 1031
    with dmagather.Comm(job, WORLD, rank, socket=sock, join_timeout_ms=30000, local_rank=rank,
                        local_world_size=WORLD) as comm:
        mine = lambda a: a[rank * n:(rank + 1) * n]  # noqa: E731
        total = mine(rs_values(0, WORLD * n))
        for r in range(1, WORLD):
            total = total + mine(rs_values(r, WORLD * n))  # np.float32, in rank order
        # SUM, out of place: the handle, seen done through Op.test().
        send = comm.empty(WORLD * n, "float32")
        send[:] = rs_values(rank, WORLD * n)
        recv = comm.empty(n, "float32")
        op = comm.reduce_scatter_async(send, recv, op=dmagather.SUM)
        wait_test(op)
        if not np.array_equal(recv.view(np.uint32), total.view(np.uint32)):
            raise AssertionError("reduce_scatter_async SUM differs")
        # AVG, in place (recv is this rank's chunk of send), by name.
        send[:] = rs_values(rank, WORLD * n)
        comm.reduce_scatter_async(send, mine(send), op="avg").wait()
        if not np.array_equal(mine(send).view(np.uint32), (total / np.float32(WORLD)).view(np.uint32)):
            raise AssertionError("reduce_scatter_async AVG in place differs")
        # The classic call: int64 wraps, complete at wait().
        big = np.iinfo(np.int64).max
        s64 = comm.empty(WORLD * 3, "int64")
        s64[:] = big - np.arange(WORLD * 3) + rank
        r64 = comm.empty(3, "int64")
        comm.reduce_scatter(s64, r64)
        comm.wait()
        want = sum((big - np.arange(WORLD * 3) + r)[rank * 3:(rank + 1) * 3] for r in range(WORLD))
        if not np.array_equal(r64, want):
            raise AssertionError(f"reduce_scatter int64: {r64} != {want}")
        # AVG on an integer dtype: INVALID_ARGUMENT on every rank.
        try:
            comm.reduce_scatter_async(s64, r64, op=dmagather.AVG).wait()
            raise AssertionError("AVG on int64 was served")
        except dmagather.FallbackError:
            raise
        except dmagather.DmagatherError as e:
            if e.status != "INVALID_ARGUMENT":
                raise
        # all-to-all: chunk r of every rank's send lands as chunk `rank` of rank r's recv.
        a_send = comm.empty(WORLD * 5, "int32")
        a_send[:] = 1000 * rank + np.arange(WORLD * 5)
        a_recv = comm.empty(WORLD * 5, "int32")
        comm.alltoall_async(a_send, a_recv, count=5).wait()
        want = np.concatenate([1000 * r + np.arange(rank * 5, (rank + 1) * 5) for r in range(WORLD)])
        if not np.array_equal(a_recv, want):
            raise AssertionError(f"alltoall: {a_recv} != {want}")
    return "ok"


class OpsTest(DaemonTestCase):
    DAEMON_PREFIX = "dmagather-ops-"

    def test_async_and_coalesced_bit_exact(self):
        results = run_ranks(async_and_coalesced, self.sock, "py-ops")
        self.assertEqual(results, {0: "ok", 1: "ok", 2: "ok"})
        _, job = stats(self.sock, "py-ops")
        self.assertIsNotNone(job, "job not in the daemon's stats")
        self.assertGreaterEqual(int(job["ops"]), 6)
        self.assertEqual(int(job["fallback_ops"]), 0)

    @unittest.skipUnless({"dmagather_reduce_scatter_async", "dmagather_alltoall_async"} <=
                         dmagather.load_library()._dmagather_optional, "a library without reduce-scatter/all-to-all")
    def test_reduce_scatter_and_alltoall_through_comm(self):
        results = run_ranks(reduce_scatter_and_alltoall, self.sock, "py-rs")
        self.assertEqual(results, {0: "ok", 1: "ok", 2: "ok"})
        _, job = stats(self.sock, "py-rs")
        self.assertIsNotNone(job, "job not in the daemon's stats")
        self.assertGreaterEqual(int(job["ops"]), 4)

    def test_collective_fallback_with_diverging_ranks(self):
        results = run_ranks(diverging_fallback, self.sock, "py-diverge")
        self.assertEqual(sorted(results), [0, 1, 2], f"a rank hung or died: {results}")
        for r in range(WORLD):
            self.assertEqual(results[r][0], "ok", f"rank {r}: {results}")
            # The reason names the refusing rank on every rank.
            self.assertIn("rank 1", results[r][1])
        _, job = stats(self.sock, "py-diverge")
        self.assertIsNotNone(job)
        self.assertEqual(int(job["fallback_ops"]), 2)

    def test_version_from_library(self):
        with open(os.path.join(RUNFILES, "client", "include", "dmagather", "dmagather.h")) as f:
            header = f.read()
        parts = [re.search(rf"#define DMAGATHER_VERSION_{k} (\d+)", header).group(1) for k in ("MAJOR", "MINOR",
                                                                                              "PATCH")]
        self.assertEqual(dmagather.__version__, ".".join(parts))
        self.assertEqual(dmagather._version_code(dmagather.__version__),
                         int(parts[0]) * 10000 + int(parts[1]) * 100 + int(parts[2]))
        self.assertEqual(dmagather.library_version(), dmagather.__version__)

    def test_config_reaches_the_library(self):
        # join_timeout_ms from the config: a 2-rank job with one rank times out fast.
        t0 = time.monotonic()
        with self.assertRaises(dmagather.DmagatherError) as cm:
            dmagather.Comm("py-lonely", 2, 0, socket=self.sock, join_timeout_ms=300)
        self.assertEqual(cm.exception.status, "TIMEOUT")
        self.assertIn("300 ms", str(cm.exception))
        self.assertLess(time.monotonic() - t0, 20)

    def test_ops_of_a_closed_comm_raise(self):
        comm = dmagather.Comm("py-closed", 1, 0, socket=self.sock)
        buf = comm.empty(8, "float32")
        op = comm.allgather_async(buf, buf)
        op.wait()
        comm.close()
        with self.assertRaises(dmagather.DmagatherError) as cm:
            op.wait()
        self.assertEqual(cm.exception.status, "INVALID_ARGUMENT")
        with self.assertRaises(dmagather.DmagatherError):
            comm.submit_fallback("late")

    def test_coalesced_item_count_is_checked_by_the_library(self):
        with dmagather.Comm("py-coalesced-n", 1, 0, socket=self.sock) as comm:
            buf = comm.empty(8, "uint8")
            for pairs in ([], [(buf, buf)] * (dmagather.MAX_COALESCED + 1)):
                op = comm.allgather_coalesced(pairs)
                with self.assertRaises(dmagather.DmagatherError) as cm:
                    op.wait()
                self.assertEqual(cm.exception.status, "INVALID_ARGUMENT")
                self.assertIn("items", str(cm.exception))
            comm.allgather_coalesced([(buf, buf)] * dmagather.MAX_COALESCED).wait()

    def test_unreachable_memory_is_refused_through_the_op(self):
        with dmagather.Comm("py-private", 1, 0, socket=self.sock) as comm:
            private = np.zeros(8, np.float32)
            op = comm.allgather_async(private, private)  # an Op, not a raise: the job learns it too
            with self.assertRaises(dmagather.DmagatherError) as cm:
                op.wait()
            self.assertIn("not inside memory", str(cm.exception))
            buf = comm.empty(8, "float32")
            comm.allgather_async(buf, buf).wait()


if __name__ == "__main__":
    unittest.main()
