"""The Python package over libdmagather.so against a real daemon: bit-exact
AllGather of every dtype from several processes, list output, and errors that
surface as exceptions with the daemon's reason."""
import multiprocessing as mp
import os
import sys
import unittest

import numpy as np

RUNFILES = os.getcwd()
sys.path.insert(0, os.path.join(RUNFILES, "tests", "python"))
from daemon_case import DaemonTestCase  # noqa: E402
sys.path.insert(0, os.path.join(RUNFILES, "client", "python"))
os.environ.setdefault("DMAGATHER_LIB", os.path.join(RUNFILES, "client", "libdmagather.so"))
import dmagather  # noqa: E402

DTYPES = ["uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def rank_main(sock, job, world, rank, q):
    try:
        with dmagather.Comm(job, world, rank, socket=sock) as comm:
            for i, dt in enumerate(DTYPES):
                for count in (1, 3, 4095, 70001):
                    out = comm.empty(world * count, dt)
                    rng = lambda r: np.random.default_rng(1000 * i + count + r)  # noqa: E731
                    raw = out.view(np.uint8)
                    isz = out.itemsize
                    mine = raw[rank * count * isz:(rank + 1) * count * isz]
                    mine[:] = rng(rank).integers(0, 256, size=count * isz, dtype=np.uint8)
                    comm.allgather(out[rank * count:(rank + 1) * count], out, count=count, dtype=dt)
                    comm.wait()
                    for r in range(world):
                        want = rng(r).integers(0, 256, size=count * isz, dtype=np.uint8)
                        if not np.array_equal(raw[r * count * isz:(r + 1) * count * isz], want):
                            raise AssertionError(f"{dt} count={count}: shard of rank {r} differs")
                    comm.free(out)
            # List output.
            src = comm.empty(100, "int32")
            src[:] = np.arange(100, dtype=np.int32) + 1000 * rank
            outs = [comm.empty(100, "int32") for _ in range(world)]
            comm.allgather_list(src, outs)
            comm.wait()
            for r in range(world):
                if not np.array_equal(outs[r], np.arange(100, dtype=np.int32) + 1000 * r):
                    raise AssertionError(f"list output of rank {r} differs")
            # Ranks disagree: every rank gets INVALID_ARGUMENT naming them.
            buf = comm.empty(world * 64, "float32")
            part = comm.empty(64, "float32")
            try:
                comm.allgather(part[:32 + rank], buf, count=32 + rank)
                comm.wait()
                raise AssertionError("mismatch not reported")
            except dmagather.DmagatherError as e:
                if e.status != "INVALID_ARGUMENT" or "ranks disagree" not in str(e):
                    raise
        q.put((rank, "ok"))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, f"{type(e).__name__}: {e}"))


class CtypesTest(DaemonTestCase):
    DAEMON_PREFIX = "dmagather-py-"

    def test_every_dtype_bit_exact_from_three_processes(self):
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(self.sock, "py-job", 3, r, q)) for r in range(3)]
        for p in procs:
            p.start()
        results = dict(q.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(30)
        self.assertEqual(results, {0: "ok", 1: "ok", 2: "ok"})

    def test_no_daemon_raises_unavailable(self):
        with self.assertRaises(dmagather.DmagatherError) as cm:
            dmagather.Comm("x", 1, 0, socket=os.path.join(self.dir, "absent.sock"))
        self.assertEqual(cm.exception.status, "UNAVAILABLE")
        self.assertIn("is dmagatherd running", str(cm.exception))

    def test_unsupported_dtype_is_a_fallback(self):
        with dmagather.Comm("py-fallback", 1, 0, socket=self.sock) as comm:
            buf = comm.empty(8, "float32")
            with self.assertRaises(dmagather.FallbackError):
                comm.allgather(buf, buf, count=8, dtype="complex64")


if __name__ == "__main__":
    unittest.main()
