"""dmagather.torch against a real daemon with Debian's torch 1.13 (CPU, gloo),
3 rank processes: tensors in dmagather memory are gathered by dmagather
(bit-exact, the daemon counts the ops, gloo is not used); when rank 1's input
is a private torch tensor (the host backend cannot reach it) while ranks 0/2
use dmagather memory, every rank takes the gloo path (bit-exact, nobody
hangs, the daemon counts the refused op) and the next op is dmagather's
again. The fallback reason is logged once, on rank 0 only."""
import json
import logging
import multiprocessing as mp
import os
import subprocess
import sys
import unittest

RUNFILES = os.getcwd()
sys.path.insert(0, os.path.join(RUNFILES, "tests", "python"))
from daemon_case import DaemonTestCase  # noqa: E402
sys.path.insert(0, os.path.join(RUNFILES, "client", "python"))
os.environ.setdefault("DMAGATHER_LIB", os.path.join(RUNFILES, "client", "libdmagather.so"))

try:
    import torch  # noqa: F401
    import torch.distributed as dist
    HAVE_TORCH = dist.is_available() and dist.is_gloo_available()
    WHY_NO_TORCH = "torch.distributed with gloo is not available"
except ImportError as e:
    HAVE_TORCH = False
    WHY_NO_TORCH = f"Debian's python3-torch is not installed ({e}); apt-get install -y python3-torch"

WORLD = 3
DEADLINE_S = 90  # every case is bounded: a hanging rank fails the test, not the run


def stats(sock, job):
    out = subprocess.run([os.path.join(RUNFILES, "tools", "dmagatherctl"), f"--socket={sock}", "--json", "stats",
                          f"--job={job}"], check=True, capture_output=True, text=True, timeout=30).stdout
    jobs = [j for j in json.loads(out).get("jobs", []) if j["job_key"] == job]
    return jobs[0] if jobs else None


def expected(world, count, dtype, salt):
    import torch
    return torch.cat([shard(r, count, dtype, salt) for r in range(world)])


def shard(rank, count, dtype, salt):
    """Bit patterns of every dtype (also NaN payloads) from a seeded generator."""
    import torch
    g = torch.Generator().manual_seed(1000 * salt + rank)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8).view(dtype)


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def rank_main(rank, case, sock, job, store, q):
    try:
        import torch
        import torch.distributed as dist
        from dmagather.torch import DmagatherAllGather
        handler = _ListHandler()
        logging.getLogger("dmagather").addHandler(handler)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                                timeout=__import__("datetime").timedelta(seconds=60))
        ag = DmagatherAllGather(job, WORLD, rank, socket=sock)
        result = {}
        if case == "dmagather":
            spec = [(torch.float32, 1000), (torch.bfloat16, 4097), (torch.int64, 3), (torch.uint8, 65536),
                    (torch.float16, 10)]
            for salt, (dt, count) in enumerate(spec):
                inp = ag.empty(count, dtype=dt)
                inp.copy_(shard(rank, count, dt, salt))
                out = ag.empty(WORLD * count, dtype=dt)
                ag.all_gather_into_tensor(out, inp)
                if not torch.equal(out.view(torch.uint8), expected(WORLD, count, dt, salt).view(torch.uint8)):
                    raise AssertionError(f"{dt} count={count}: output differs")
            # In place (input is this rank's slot of the output) and async_op.
            count = 256
            out = ag.empty((WORLD, count), dtype=torch.float32)
            out[rank].copy_(shard(rank, count, torch.float32, 99))
            work = ag.all_gather_into_tensor(out, out[rank], async_op=True)
            work.wait()
            if not work.is_completed() or not torch.equal(out.view(torch.uint8).view(-1),
                                                          expected(WORLD, count, torch.float32, 99).view(torch.uint8)):
                raise AssertionError("in-place async gather differs")
            result["ops"] = len(spec) + 1
        elif case == "fallback":
            count = 5000
            for salt in (1, 2):  # two refused ops: the reason is logged once
                inp = torch.empty(count, dtype=torch.float32) if rank == 1 else ag.empty(count, torch.float32)
                inp.copy_(shard(rank, count, torch.float32, salt))
                out = ag.empty(WORLD * count, dtype=torch.float32)
                ag.all_gather_into_tensor(out, inp)
                if not torch.equal(out.view(torch.uint8), expected(WORLD, count, torch.float32, salt).view(torch.uint8)):
                    raise AssertionError(f"fallback op {salt}: output differs")
            result["reason"] = ag.last_fallback_reason
            # async_op on the fallback path wraps gloo's work.
            inp = torch.empty(count, dtype=torch.float32) if rank == 1 else ag.empty(count, torch.float32)
            inp.copy_(shard(rank, count, torch.float32, 3))
            out = ag.empty(WORLD * count, dtype=torch.float32)
            ag.all_gather_into_tensor(out, inp, async_op=True).wait()
            if not torch.equal(out.view(torch.uint8), expected(WORLD, count, torch.float32, 3).view(torch.uint8)):
                raise AssertionError("async fallback op differs")
            # Everyone in dmagather memory again: dmagather serves the next op.
            inp = ag.empty(count, torch.float32)
            inp.copy_(shard(rank, count, torch.float32, 4))
            out = ag.empty(WORLD * count, dtype=torch.float32)
            ag.all_gather_into_tensor(out, inp)
            if not torch.equal(out.view(torch.uint8), expected(WORLD, count, torch.float32, 4).view(torch.uint8)):
                raise AssertionError("op after the fallbacks differs")
        result["dmagather_ops"] = ag.dmagather_ops
        result["fallback_ops"] = ag.fallback_ops
        result["warnings"] = [m for m in handler.records if "fallback" in m]
        ag.close()
        dist.destroy_process_group()
        q.put((rank, "ok", result))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, f"{type(e).__name__}: {e}", None))


@unittest.skipUnless(HAVE_TORCH, WHY_NO_TORCH)
class TorchAdapterTest(DaemonTestCase):
    DAEMON_PREFIX = "dmagather-torch-"

    def run_case(self, case, job):
        # fork: the parent has imported torch but created no threads or process group.
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        store = os.path.join(self.dir, f"{job}.store")
        procs = [ctx.Process(target=rank_main, args=(r, case, self.sock, job, store, q)) for r in range(WORLD)]
        return self.collect_ranks(procs, q, DEADLINE_S)

    def test_dmagather_memory_goes_through_dmagather(self):
        res = self.run_case("dmagather", "torch-served")
        for r in range(WORLD):
            self.assertEqual(res[r]["fallback_ops"], 0, f"rank {r}")
            self.assertEqual(res[r]["dmagather_ops"], res[r]["ops"], f"rank {r}")
            self.assertEqual(res[r]["warnings"], [])
        job = stats(self.sock, "torch-served")
        self.assertIsNotNone(job, "job missing from dmagatherctl stats")
        self.assertEqual(int(job["ops"]), res[0]["ops"])
        self.assertGreater(int(job["bytes"]), 0)
        self.assertEqual(int(job["fallback_ops"]), 0)

    def test_private_tensor_on_one_rank_sends_every_rank_to_gloo(self):
        res = self.run_case("fallback", "torch-diverge")
        for r in range(WORLD):
            # The same path on every rank: 3 ops by gloo, then 1 by dmagather.
            self.assertEqual(res[r]["fallback_ops"], 3, f"rank {r}")
            self.assertEqual(res[r]["dmagather_ops"], 1, f"rank {r}")
            self.assertIn("rank 1", res[r]["reason"], f"rank {r}")
        # Logged once, on rank 0 only (two refused ops, one warning).
        self.assertEqual(len(res[0]["warnings"]), 1, res[0]["warnings"])
        self.assertEqual(res[1]["warnings"], [])
        self.assertEqual(res[2]["warnings"], [])
        job = stats(self.sock, "torch-diverge")
        self.assertIsNotNone(job, "job missing from dmagatherctl stats")
        self.assertGreaterEqual(int(job["fallback_ops"]), 1)
        self.assertEqual(int(job["fallback_ops"]), 3)


if __name__ == "__main__":
    unittest.main()
