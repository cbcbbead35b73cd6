"""dmagather.torch as trainers use it (docs/TRAINERS.md), with Debian's torch 1.13 (CPU,
gloo), the host backend and a real daemon, 3 rank processes per case:

- direct API: init() logs the start line on rank 0 only; all_gather_into_tensor
  (sync, async_op=True, in place) and all_gather_coalesced (3 dtypes in one op;
  70 items = 2 ops) bit-exact; counters agree with the daemon's op count.
- install() with DMAGATHER_ALLGATHER=1: the patched dist.all_gather_into_tensor
  is dmagather's for WORLD (its counters move, the daemon counts the op); every
  fallback reason taken and counted (not_world_group on a subgroup,
  numel_over_max, dtype_unsupported: Python counters, identical on every rank;
  memory_unreachable: one rank's private tensor, the daemon's fallback_ops);
  every fallback result bit-exact through gloo; uninstall() restores torch's.
- ranks that see different conditions agree: DMAGATHER_ALLGATHER unset on one
  rank, the daemon unreachable on one rank, a join that fails (one rank in
  another job): every rank disabled, same reason kind, rank 0 logs
  "unavailable (...); using gloo allgather", bounded time, results bit-exact.
- the signature cache (stream-ordered mode, forced on the host backend): the
  first op of a signature is host-waited, later ones are not; Work.wait()
  blocks and the data is bit-exact; a later op refused by one rank raises
  StreamOrderedError on that rank at once and on the others at the next
  synchronize() (never silently), nobody hangs.
- FSDPAllGather: allocate() memory is pooled (no new shm once freed), the
  FSDP2-style in-place call bit-exact.
- python -m dmagather.check: PASSED for bf16/fp16/fp32, the table, the header.
"""
import datetime
import json
import logging
import multiprocessing as mp
import os
import subprocess
import sys
import time
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
DEADLINE_S = 90


def daemon_job(sock, job):
    p = subprocess.run([os.path.join(RUNFILES, "tools", "dmagatherctl"), f"--socket={sock}", "--json", "stats",
                        f"--job={job}"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:  # an unknown job is an error of dmagatherctl
        if "not found" in p.stderr.lower() or "no job" in p.stderr.lower() or "unknown" in p.stderr.lower():
            return None
        raise AssertionError(f"dmagatherctl stats: {p.stderr}")
    jobs = [j for j in json.loads(p.stdout).get("jobs", []) if j["job_key"] == job]
    return jobs[0] if jobs else None


def shard(rank, count, dtype, salt):
    """Bit patterns of every dtype (also NaN payloads) from a seeded generator."""
    import torch
    g = torch.Generator().manual_seed(1000 * salt + rank)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8).view(dtype)


def expected(count, dtype, salt, ranks=range(WORLD)):
    import torch
    return torch.cat([shard(r, count, dtype, salt) for r in ranks])


def same_bits(a, b):
    import torch
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


# ---- rank bodies (run in forked processes) -----------------------------------------

def case_direct(rank, sock, dt, a):
    import torch
    res = {}
    spec = [(torch.float32, 1000), (torch.bfloat16, 4097), (torch.int64, 3), (torch.uint8, 65536),
            (torch.float16, 10), (torch.float64, 77), (torch.int8, 5), (torch.int32, 9)]
    for salt, (dtp, count) in enumerate(spec):
        inp = a.empty(count, dtype=dtp)
        inp.copy_(shard(rank, count, dtp, salt))
        out = a.empty(WORLD * count, dtype=dtp)
        assert dt.all_gather_into_tensor(out, inp) is None
        if not same_bits(out, expected(count, dtp, salt)):
            raise AssertionError(f"{dtp} count={count}: output differs")
    # async_op=True, in place (input is this rank's row of a 2-D output): Work.wait() blocks on CPU.
    count = 256
    out = a.empty((WORLD, count), dtype=torch.float32)
    out[rank].copy_(shard(rank, count, torch.float32, 99))
    work = dt.all_gather_into_tensor(out, out[rank], async_op=True)
    if work.wait() is not True or not work.is_completed():
        raise AssertionError("Work.wait()/is_completed()")
    if not same_bits(out, expected(count, torch.float32, 99)):
        raise AssertionError("in-place async gather differs")
    # Coalesced: three dtypes in one op, then 70 items (two ops of 64 + 6).
    items = [(torch.float32, 33), (torch.bfloat16, 1025), (torch.uint8, 7)]
    ins = [a.empty(c, dtype=d) for d, c in items]
    outs = [a.empty(WORLD * c, dtype=d) for d, c in items]
    for k, ((d, c), i) in enumerate(zip(items, ins)):
        i.copy_(shard(rank, c, d, 200 + k))
    dt.all_gather_coalesced(outs, ins, async_op=True).wait()
    for k, ((d, c), o) in enumerate(zip(items, outs)):
        if not same_bits(o, expected(c, d, 200 + k)):
            raise AssertionError(f"coalesced item {k} differs")
    ins = [a.empty(k + 1, dtype=torch.int32) for k in range(70)]
    outs = [a.empty(WORLD * (k + 1), dtype=torch.int32) for k in range(70)]
    for k, i in enumerate(ins):
        i.copy_(torch.arange(k + 1, dtype=torch.int32) + 1000 * rank + 100000 * k)
    assert dt.all_gather_coalesced(outs, ins) is None
    for k, o in enumerate(outs):
        want = torch.cat([torch.arange(k + 1, dtype=torch.int32) + 1000 * r + 100000 * k for r in range(WORLD)])
        if not torch.equal(o, want):
            raise AssertionError(f"coalesced-70 item {k} differs")
    res["ops"] = len(spec) + 1 + 1 + 2
    return res


def case_install(rank, sock, dt, a):
    import torch
    import torch.distributed as dist
    res = {}
    orig = dist.all_gather_into_tensor
    if not dt.is_installed() or orig.__module__ != "dmagather.torch":
        raise AssertionError("install() did not patch torch.distributed.all_gather_into_tensor")
    sub = dist.new_group([0, 1])  # collective: every rank calls new_group

    def check(out, count, dtp, salt, ranks=range(WORLD)):
        if not same_bits(out, expected(count, dtp, salt, ranks)):
            raise AssertionError(f"salt {salt}: output differs")

    def c(name):
        return a.stats()["fallback_by_reason"][name]

    # 1. WORLD, dmagather memory: served by dmagather through the patched function.
    before = a.stats()["dmagather_ops"]
    inp = a.empty(1000, torch.float32)
    inp.copy_(shard(rank, 1000, torch.float32, 1))
    out = a.empty(WORLD * 1000, torch.float32)
    dist.all_gather_into_tensor(out, inp)
    check(out, 1000, torch.float32, 1)
    if a.stats()["dmagather_ops"] != before + 1:
        raise AssertionError("the patched WORLD gather did not go through dmagather")
    # group=dist.group.WORLD explicitly, keyword names as DeepSpeed passes them.
    dist.all_gather_into_tensor(output_tensor=out, input_tensor=inp, group=dist.group.WORLD, async_op=True).wait()
    check(out, 1000, torch.float32, 1)
    # 2. not the WORLD group: ranks 0 and 1 only, on the group's own job (set up here).
    if rank in (0, 1):
        g = dt.adapter_for(sub)  # the group's job (collective over ranks 0 and 1); its own memory
        inp2 = g.empty(100, torch.float32)
        inp2.copy_(shard(rank, 100, torch.float32, 2))
        out2 = g.empty(2 * 100, torch.float32)
        dist.all_gather_into_tensor(out2, inp2, group=sub)
        check(out2, 100, torch.float32, 2, ranks=range(2))
        groups = dt.stats()["groups"]
        if [(g["ranks"], g["dmagather_ops"], g["fallback_ops"]) for g in groups] != [([0, 1], 1, 0)]:
            raise AssertionError(f"the subgroup's own job: {[(g['ranks'], g['dmagather_ops'], g['fallback_ops'], g['last_fallback_reason']) for g in groups]}")
        if c("not_world_group") != 0:
            raise AssertionError(f"not_world_group: {a.stats()}")
    # 3. shard over DMAGATHER_MAX_NUMEL (=1000 in this case's env).
    inp3 = a.empty(1001, torch.float32)
    inp3.copy_(shard(rank, 1001, torch.float32, 3))
    out3 = a.empty(WORLD * 1001, torch.float32)
    work = dist.all_gather_into_tensor(out3, inp3, async_op=True)  # gloo's work, wrapped
    work.wait()
    check(out3, 1001, torch.float32, 3)
    # 4. a dtype dmagather does not carry (gloo does).
    inp4 = torch.randn(10, dtype=torch.complex64, generator=torch.Generator().manual_seed(rank))
    out4 = torch.empty(WORLD * 10, dtype=torch.complex64)
    dist.all_gather_into_tensor(out4, inp4)
    want4 = torch.cat([torch.randn(10, dtype=torch.complex64, generator=torch.Generator().manual_seed(r))
                       for r in range(WORLD)])
    if not torch.equal(out4, want4):
        raise AssertionError("complex64 through gloo differs")
    # 5. memory the backend cannot reach, on rank 1 only: FALLBACK on every rank (daemon counts it).
    for salt in (5, 6):
        inp5 = torch.empty(500, dtype=torch.float32) if rank == 1 else a.empty(500, torch.float32)
        inp5.copy_(shard(rank, 500, torch.float32, salt))
        out5 = a.empty(WORLD * 500, torch.float32)
        dist.all_gather_into_tensor(out5, inp5)
        check(out5, 500, torch.float32, salt)
    # 6. dmagather again.
    inp.copy_(shard(rank, 1000, torch.float32, 7))
    dist.all_gather_into_tensor(out, inp)
    check(out, 1000, torch.float32, 7)
    res["stats"] = a.stats()
    dt.uninstall()
    if dist.all_gather_into_tensor.__module__ == "dmagather.torch":
        raise AssertionError("uninstall() left the patch in place")
    return res


def case_disabled(rank, sock, dt, a):
    """Every rank disabled (whatever the local reason): gathers go to gloo, counted."""
    import torch
    import torch.distributed as dist
    for salt in (1, 2):
        inp = shard(rank, 300, torch.float32, salt).clone()
        out = torch.empty(WORLD * 300, dtype=torch.float32)
        dist.all_gather_into_tensor(out, inp)
        if not same_bits(out, expected(300, torch.float32, salt)):
            raise AssertionError("fallback gather differs")
    return {"stats": a.stats()}


def case_stream(rank, sock, dt, a):
    import torch
    res = {}
    count = 4096
    inp = a.empty(count, torch.float32)
    out = a.empty(WORLD * count, torch.float32)
    for salt in range(1, 5):  # op 1 of the signature host-waited, ops 2..4 stream-ordered
        inp.copy_(shard(rank, count, torch.float32, salt))
        w = dt.all_gather_into_tensor(out, inp, async_op=True)
        w.wait()
        if not same_bits(out, expected(count, torch.float32, salt)):
            raise AssertionError(f"stream-ordered op {salt} differs")
    s = a.stats()
    res["host_waited"], res["stream_ordered"] = s["host_waited_ops"], s["stream_ordered_ops"]
    # A new signature is host-waited again, also the first op of a coalesced one.
    small = a.empty(8, torch.int32)
    small_out = a.empty(WORLD * 8, torch.int32)
    dt.all_gather_into_tensor(small_out, small)
    res["host_waited_after_new"] = a.stats()["host_waited_ops"]
    # A served signature refused by rank 1 (private memory): no verdict on the host any more.
    bad = torch.empty(count, dtype=torch.float32) if rank == 1 else inp
    try:
        dt.all_gather_into_tensor(out, bad)
        res["at_call"] = "returned"
    except dt.StreamOrderedError as e:
        res["at_call"] = f"raised: {e}"
    try:
        dt.synchronize()
        res["at_sync"] = "returned"
    except dt.StreamOrderedError as e:
        res["at_sync"] = f"raised: {e}"
    try:
        dt.all_gather_into_tensor(out, inp)
        res["later"] = "returned"
    except dt.StreamOrderedError:
        res["later"] = "raised"
    return res


def case_fsdp(rank, sock, dt, a):
    import torch
    ag = dt.FSDPAllGather()
    n = 1000
    addrs = []
    for salt in range(3):
        out = ag.allocate((WORLD * n,), dtype=torch.bfloat16, device=torch.device("cpu"))
        addrs.append(out.data_ptr())
        inp = out.narrow(0, rank * n, n)  # FSDP2's all_gather_copy_in: the input is this rank's slot
        inp.copy_(shard(rank, n, torch.bfloat16, salt))
        work = ag(output_tensor=out, input_tensor=inp, group=None, async_op=bool(salt % 2))
        if work is not None:
            work.wait()
        if not same_bits(out, expected(n, torch.bfloat16, salt)):
            raise AssertionError(f"FSDP-style gather {salt} differs")
        del out, inp, work  # FSDP2 frees the all-gather output after copy-out
    return {"addrs": addrs, "allocated": a.stats()["host_buffers_allocated"], "stats": a.stats()}


CASES = {"direct": case_direct, "install": case_install, "disabled": case_disabled, "stream": case_stream,
         "fsdp": case_fsdp}


def rank_main(rank, case, sock, store, q, env, init_kwargs):
    try:
        for k, v in env.get(rank, {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        import torch.distributed as dist
        import dmagather.torch as dt
        handler = _ListHandler()
        logging.getLogger("dmagather").addHandler(handler)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
        kw = dict(init_kwargs)
        if isinstance(kw.get("socket"), dict):
            kw["socket"] = kw["socket"].get(rank, sock)
        kw.setdefault("socket", sock)
        if isinstance(kw.get("job_key"), dict):
            kw["job_key"] = kw["job_key"][rank]
        t0 = time.monotonic()
        if kw.pop("install", False):
            a = dt.install(**kw)
        else:
            a = dt.init(**kw)
        init_s = time.monotonic() - t0
        res = CASES[case](rank, sock, dt, a)
        res.setdefault("stats", a.stats())
        res["init_s"] = init_s
        res["job_key"] = a.job_key
        res["log"] = list(handler.records)
        try:
            dt.shutdown()
        except Exception as e:  # noqa: BLE001
            res["shutdown"] = f"{type(e).__name__}: {e}"
        dist.destroy_process_group()
        q.put((rank, "ok", res))
    except BaseException as e:  # noqa: BLE001
        import traceback
        q.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}", None))


@unittest.skipUnless(HAVE_TORCH, WHY_NO_TORCH)
class TrainersTest(DaemonTestCase):
    maxDiff = None
    DAEMON_PREFIX = "dmagather-trainers-"

    def run_case(self, case, name, env=None, **init_kwargs):
        ctx = mp.get_context("fork")  # the parent has imported torch, not libdmagather
        q = ctx.Queue()
        store = os.path.join(self.dir, f"{name}.store")
        procs = [ctx.Process(target=rank_main, args=(r, case, self.sock, store, q, env or {}, init_kwargs))
                 for r in range(WORLD)]
        t0 = time.monotonic()
        out = self.collect_ranks(procs, q, DEADLINE_S)
        out["wall_s"] = time.monotonic() - t0
        return out

    def assert_start_line(self, res, text):
        """WORLD's start line, the one line rank 0 logs for WORLD's job (a
        subgroup's job logs its own line, "... for a group of ...")."""
        lines = [m for m in res[0]["log"] if m.startswith("dmagather allgather ") and "fallback" not in m
                 and "for a group of" not in m]
        self.assertEqual(len(lines), 1, res[0]["log"])
        self.assertIn(text, lines[0])
        for r in (1, 2):
            self.assertEqual(res[r]["log"], [], f"rank {r} logged")
        return lines[0]

    def test_direct_api_bit_exact_and_counted(self):
        res = self.run_case("direct", "direct", enabled=True)
        self.assert_start_line(res, "dmagather allgather enabled (backend=host, max_numel=268435456)")
        keys = {res[r]["job_key"] for r in range(WORLD)}
        self.assertEqual(len(keys), 1, "ranks joined different jobs")
        for r in range(WORLD):
            s = res[r]["stats"]
            self.assertTrue(s["enabled"])
            self.assertEqual(s["dmagather_ops"], res[r]["ops"], f"rank {r}: {s}")
            self.assertEqual(s["fallback_ops"], 0, f"rank {r}: {s}")
            self.assertEqual(s["host_waited_ops"], res[r]["ops"], "CPU: every verdict is read on the host")
            self.assertNotIn("shutdown", res[r])
        job = daemon_job(self.sock, keys.pop())
        self.assertIsNotNone(job, "job missing from dmagatherctl stats")
        self.assertEqual(int(job["ops"]), res[0]["ops"])
        self.assertEqual(int(job["fallback_ops"]), 0)

    def test_install_routes_world_and_counts_every_reason(self):
        env = {r: {"DMAGATHER_ALLGATHER": "1", "DMAGATHER_MAX_NUMEL": "1000"} for r in range(WORLD)}
        res = self.run_case("install", "install", env=env, install=True)
        self.assert_start_line(res, "dmagather allgather enabled (backend=host, max_numel=1000)")
        for r in range(WORLD):
            s = res[r]["stats"]
            by = s["fallback_by_reason"]
            self.assertEqual(s["dmagather_ops"], 3, f"rank {r}: {s}")  # 1., its async twin, 6.
            self.assertEqual(by["numel_over_max"], 1, f"rank {r}: {s}")
            self.assertEqual(by["dtype_unsupported"], 1, f"rank {r}: {s}")
            self.assertEqual(by["memory_unreachable"], 2, f"rank {r}: {s}")
            self.assertEqual(by["not_world_group"], 0, f"rank {r}: {s}")
            self.assertEqual(by["not_enabled"] + by["daemon_unreachable"] + by["join_failed"], 0)
            self.assertEqual(s["fallback_ops"], sum(by.values()))
            self.assertIn("rank 1", s["last_fallback_reason"])
        # Each reason logged once, on rank 0 only (memory_unreachable: two ops, one line).
        warn = [m for m in res[0]["log"] if "fallback" in m]
        self.assertEqual(len([m for m in warn if "(memory_unreachable)" in m]), 1, warn)
        for k in ("numel_over_max", "dtype_unsupported"):
            self.assertEqual(len([m for m in warn if f"({k})" in m]), 1, (k, warn))
        job = daemon_job(self.sock, res[0]["job_key"])
        self.assertIsNotNone(job)
        # Only memory goes through the daemon: 3 served + 2 refused ops.
        self.assertEqual(int(job["fallback_ops"]), 2)
        self.assertEqual(int(job["ops"]) + int(job["fallback_ops"]) >= 3, True)

    def check_disabled(self, res, kind, line_text, ranks_in_reason=None):
        line = self.assert_start_line(res, "dmagather allgather unavailable (")
        self.assertIn(line_text, line)
        self.assertTrue(line.endswith("; using gloo allgather"), line)
        for r in range(WORLD):
            s = res[r]["stats"]
            self.assertFalse(s["enabled"], f"rank {r}")
            self.assertEqual(s["fallback_by_reason"][kind], 2, f"rank {r}: {s}")
            self.assertEqual(s["fallback_ops"], 2)
            self.assertEqual(s["dmagather_ops"], 0)
            if ranks_in_reason:
                self.assertIn(ranks_in_reason, s["unavailable"])

    def test_not_enabled_on_one_rank_disables_every_rank(self):
        env = {0: {"DMAGATHER_ALLGATHER": "1"}, 1: {"DMAGATHER_ALLGATHER": None}, 2: {"DMAGATHER_ALLGATHER": "1"}}
        res = self.run_case("disabled", "not-enabled", env=env, install=True)
        self.check_disabled(res, "not_enabled", "not enabled on rank(s) 1", "rank(s) 1")
        self.assertIsNone(daemon_job(self.sock, res[0]["job_key"]), "a disabled job must not join")

    def test_not_enabled_anywhere(self):
        env = {r: {"DMAGATHER_ALLGATHER": None} for r in range(WORLD)}
        res = self.run_case("disabled", "not-enabled-all", env=env, install=True)
        self.check_disabled(res, "not_enabled", "not enabled")

    def test_daemon_unreachable_on_one_rank_disables_every_rank(self):
        env = {r: {"DMAGATHER_ALLGATHER": "1"} for r in range(WORLD)}
        res = self.run_case("disabled", "unreachable", env=env, install=True, join_timeout_ms=1500,
                            socket={1: os.path.join(self.dir, "no-such.sock")})
        self.check_disabled(res, "daemon_unreachable", "daemon unreachable on rank(s) 1", "rank(s) 1")
        for r in range(WORLD):
            self.assertLess(res[r]["init_s"], 20, f"rank {r}: init not bounded")

    def test_join_failed_disables_every_rank(self):
        env = {r: {"DMAGATHER_ALLGATHER": "1"} for r in range(WORLD)}
        res = self.run_case("disabled", "join-failed", env=env, install=True, join_timeout_ms=1000,
                            job_key={0: "jf-a", 1: "jf-b", 2: "jf-a"})
        self.check_disabled(res, "join_failed", "join failed on rank(s) 0,1,2")
        for r in range(WORLD):
            self.assertLess(res[r]["init_s"], 20, f"rank {r}: init not bounded")
            self.assertIn("TIMEOUT", res[r]["stats"]["unavailable"])

    def test_signature_cache_stream_ordered_and_lazy_failure(self):
        res = self.run_case("stream", "stream", enabled=True, stream_ordered=True)
        for r in range(WORLD):
            self.assertEqual(res[r]["host_waited"], 1, f"rank {r}: {res[r]}")
            self.assertEqual(res[r]["stream_ordered"], 3, f"rank {r}: {res[r]}")
            self.assertEqual(res[r]["host_waited_after_new"], 2, f"rank {r}: {res[r]}")
            self.assertEqual(res[r]["later"], "raised", f"rank {r}: {res[r]}")
        # Rank 1 refused: it raises at once; the others find out at synchronize().
        self.assertTrue(res[1]["at_call"].startswith("raised"), res[1])
        self.assertIn("not valid", res[1]["at_call"])
        for r in (0, 2):
            self.assertEqual(res[r]["at_call"], "returned", f"rank {r}: {res[r]}")
            self.assertTrue(res[r]["at_sync"].startswith("raised"), f"rank {r}: {res[r]}")
            self.assertIn("rank 1", res[r]["at_sync"])
            self.assertIn("FALLBACK", res[r]["at_sync"])
        job = daemon_job(self.sock, res[0]["job_key"])
        self.assertEqual(int(job["fallback_ops"]), 1)

    def test_fsdp_allocate_pools_memory_and_gathers_in_place(self):
        res = self.run_case("fsdp", "fsdp", enabled=True)
        for r in range(WORLD):
            self.assertEqual(res[r]["allocated"], 1, f"rank {r}: allocate() did not reuse its buffer: {res[r]}")
            self.assertEqual(len(set(res[r]["addrs"])), 1, res[r]["addrs"])
            self.assertEqual(res[r]["stats"]["dmagather_ops"], 3)

    def test_check_script(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(RUNFILES, "client", "python"), DMAGATHER_SOCKET=self.sock)
        p = subprocess.run([sys.executable, "-m", "dmagather.check", "--world", "3", "--sizes", "65536,1048576",
                            "--iters", "3"], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        lines = p.stdout.splitlines()
        self.assertTrue(lines[0].startswith("backend: host "), lines)
        for name in ("bfloat16", "float16", "float32"):
            self.assertIn(f"{name} PASSED", lines)
        i = lines.index("data_MB avg_ms min_ms max_ms algo_BW")
        self.assertEqual(len(lines) - i - 1, 2, lines)
        for row in lines[i + 1:]:
            self.assertEqual(len([float(x) for x in row.split()]), 5, row)


if __name__ == "__main__":
    unittest.main()
