"""dmagather.torch's reduce-scatter (DMAGATHER_REDUCE_SCATTER=1) against a real
daemon (host backend), torch CPU + gloo, 2 to 4 rank processes per case:

- served, bit-exact against an independent numpy reference that sums each
  element over the group's ranks in rank order (float32 and float64 in their
  own precision; bfloat16 and float16 accumulated in np.float32 and rounded
  once: bf16 by round-to-nearest-even on the uint32 view, fp16 by numpy's
  astype; AVG the sum divided by the group's size before that rounding;
  integers wrap): float32, bfloat16, float16, float64, int32, int64, int8,
  uint8, SUM and AVG (floats), chunks of 1 element to 4 MiB, in place (the output is this
  rank's chunk of the input) and out of place, daemon memory and private
  tensors (host staging), async_op=True, WORLD and sub-groups (each its own
  job), mixed with all-gathers on the same jobs; the counters agree with what
  was issued, and the daemon counted every op of each job.
- per-op fallbacks, the same on every rank, counted by reason: an op other
  than SUM/AVG (MAX: op_unsupported), AVG on int32 (avg_integer: the
  framework's own error on every rank), complex64 (dtype_unsupported), a chunk
  over DMAGATHER_MAX_NUMEL (numel_over_max), one rank's private tensor without
  host staging (memory_unreachable); then a served op again.
- bad input raises ValueError on every rank: an input numel that is not
  world_size x the output's, an output of another dtype.
- agreed at set-up: one rank without the variable (every rank falls back,
  `not_enabled` naming it, rank 0 says so once), no rank with it (off, nothing
  said), one rank whose library lacks dmagather_reduce_scatter_async
  (`library_too_old` everywhere).
- the signature cache's stream-ordered mode (forced on the host backend): one
  host-waited op per signature, the others stream-ordered, right after
  synchronize().

Runs with Debian's torch 1.13 (Bazel) or any torch with gloo (a venv's python).
"""
import datetime
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
    import numpy as np
    import torch
    import torch.distributed as dist
    HAVE_TORCH = dist.is_available() and dist.is_gloo_available()
    WHY_NO_TORCH = "torch.distributed with gloo is not available"
except ImportError as e:
    HAVE_TORCH = False
    WHY_NO_TORCH = f"torch or numpy is not installed ({e}); apt-get install -y python3-torch"

try:
    import dmagather
    HAVE_RS = dmagather.has_reduce_scatter()
    WHY_NO_RS = f"this libdmagather.so has no dmagather_reduce_scatter_async ({os.environ['DMAGATHER_LIB']})"
except OSError as e:
    HAVE_RS, WHY_NO_RS = False, str(e)

DEADLINE_S = 180
MIB = 1 << 20


# ---- data and the reference -------------------------------------------------------

def np_type(dtype):
    return {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
            torch.bfloat16: np.uint16, torch.int32: np.int32, torch.int64: np.int64, torch.uint8: np.uint8,
            torch.int8: np.int8}[dtype]


def bf16_bits(f32):
    """float32 -> bfloat16 bits, rounded to nearest, ties to even (no NaNs here)."""
    u = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


DTYPE_INDEX = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4, torch.int32: 5,
               torch.int64: 6, torch.uint8: 7, torch.int8: 8} if HAVE_TORCH else {}
INTS = (torch.int32, torch.int64, torch.uint8, torch.int8) if HAVE_TORCH else ()


def rank_input(rank, n, dtype, salt):
    """Rank `rank`'s input of n elements (bf16 as its bits): seeded, with zeros,
    negative zeros and subnormals among normal numbers of varied exponents."""
    rng = np.random.default_rng([salt, rank, n, DTYPE_INDEX[dtype]])
    t = np_type(dtype)
    if dtype in INTS:
        info = np.iinfo(t)
        return rng.integers(info.min, info.max, size=n, dtype=t, endpoint=True)
    x = rng.standard_normal(n) * np.exp2(rng.integers(-6, 7, size=n))
    x[::97] = 0.0
    x[5::101] = -0.0
    tiny = {torch.float32: np.finfo(np.float32).tiny, torch.float64: np.finfo(np.float64).tiny,
            torch.bfloat16: np.finfo(np.float32).tiny, torch.float16: float(np.finfo(np.float16).tiny)}[dtype]
    x[3::89] = tiny * rng.uniform(-1, 1, size=len(x[3::89]))  # subnormals of the dtype (fp16: of fp16)
    if dtype == torch.bfloat16:
        return bf16_bits(x.astype(np.float32))
    return x.astype(t)


def to_torch(arr, dtype):
    if dtype == torch.bfloat16:
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


def bits(t):
    """A tensor's bytes as a numpy uint8 array."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy()


def reference(group, r, n, dtype, op, salt):
    """Group rank r's output: chunk r of every group member's input (members
    are global ranks, in group order), summed in that order (op "avg": divided
    by the group's size), rounded as described in the module docstring."""
    world = len(group)
    chunks = [rank_input(g, world * n, dtype, salt)[r * n:(r + 1) * n] for g in group]
    if dtype in INTS:
        acc = chunks[0].copy()
        for c in chunks[1:]:
            acc += c  # numpy integer arrays wrap
        assert op == "sum"
        return acc
    if dtype == torch.float64:
        acc = chunks[0].copy()
        for c in chunks[1:]:
            acc = acc + c
        return acc / np.float64(world) if op == "avg" else acc
    wide = [(c.astype(np.uint32) << 16).view(np.float32) if dtype == torch.bfloat16 else c.astype(np.float32)
            for c in chunks]
    acc = wide[0].copy()
    for c in wide[1:]:
        acc = acc + c  # np.float32 + np.float32: rounded to float32 at each step
    if op == "avg":
        acc = acc / np.float32(world)
    if dtype == torch.bfloat16:
        return bf16_bits(acc)
    if dtype == torch.float16:
        return acc.astype(np.float16)
    return acc


def same_as_reference(out, ref, dtype):
    got = bits(out)
    want = np.ascontiguousarray(ref).view(np.uint8)
    if got.shape == want.shape and np.array_equal(got, want):
        return None
    esz = torch.empty((), dtype=dtype).element_size()
    if got.shape != want.shape:
        return f"{got.size} bytes, expected {want.size}"
    diff = np.nonzero((got != want).reshape(-1, esz).any(axis=1))[0]
    k = int(diff[0])
    return f"{len(diff)} of {got.size // esz} elements differ, first at {k}"


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


# ---- rank bodies (forked processes) -----------------------------------------------

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64) if HAVE_TORCH else ()
ALL = FLOATS + INTS
SUBGROUPS = {2: [], 3: [[0, 2]], 4: [[0, 2], [1, 3]]}


class Issued:
    """What this rank issued, per job, to compare with the counters."""

    def __init__(self):
        self.jobs = {}

    def add(self, key, **kw):
        c = self.jobs.setdefault(key, {"rs": 0, "ag": 0, "staged": 0, "in_place": 0, "sum": 0, "avg": 0})
        for k, v in kw.items():
            c[k] += v


def one_rs(dt, a, group_ranks, grp, n, dtype, op, salt, in_place, private, issued, async_op=False):
    rank = dist.get_rank()
    world, r = len(group_ranks), group_ranks.index(rank)
    arr = rank_input(rank, world * n, dtype, salt)
    if private:
        inp = to_torch(arr, dtype)
    else:
        inp = a.empty(world * n, dtype=dtype)
        inp.copy_(to_torch(arr, dtype))
    if in_place:
        out = inp[r * n:(r + 1) * n]
    else:
        out = torch.full((n,), 7, dtype=dtype) if private else a.empty(n, dtype=dtype)
    red = dist.ReduceOp.AVG if op == "avg" else dist.ReduceOp.SUM
    work = dt.reduce_scatter_tensor(out, inp, op=red, group=grp, async_op=async_op)
    if async_op:
        if work.wait() is not True or not work.is_completed():
            raise AssertionError("Work.wait()/is_completed()")
    elif work is not None:
        raise AssertionError(f"async_op=False returned {work!r}")
    why = same_as_reference(out, reference(group_ranks, r, n, dtype, op, salt), dtype)
    if why:
        raise AssertionError(f"group {group_ranks} {dtype} n={n} {op} in_place={in_place} private={private}: {why}")
    issued.add(a.job_key, rs=1, staged=int(private), in_place=int(in_place), **{op: 1})


def one_ag(dt, a, group_ranks, grp, n, dtype, salt, issued):
    rank = dist.get_rank()
    world = len(group_ranks)
    inp = to_torch(rank_input(rank, n, dtype, salt), dtype)
    out = torch.empty(world * n, dtype=dtype)
    dt.all_gather_into_tensor(out, inp, group=grp)
    want = np.concatenate([rank_input(g, n, dtype, salt) for g in group_ranks])
    if not np.array_equal(bits(out), want.view(np.uint8)):
        raise AssertionError(f"all-gather on group {group_ranks} {dtype} differs")
    issued.add(a.job_key, ag=1)


def sweep(dt, group_ranks, grp, issued, big):
    """Every dtype and op, sizes 1 .. several MiB, in place and not, daemon and
    private memory, on one group, with all-gathers between."""
    a = dt.adapter_for(grp)
    salt = 0
    sizes = (1, 3, 1000, 4097)
    for dtype in ALL:
        ops = ("sum", "avg") if dtype in FLOATS else ("sum",)
        for n in sizes:
            for op in ops:
                for in_place in (False, True):
                    for private in (False, True):
                        salt += 1
                        one_rs(dt, a, group_ranks, grp, n, dtype, op, salt, in_place, private, issued)
        salt += 1
        one_ag(dt, a, group_ranks, grp, 513, dtype, salt, issued)
    # async_op=True; and chunks of several MiB (float32: 4 MiB, bf16: 3 MiB).
    salt += 1
    one_rs(dt, a, group_ranks, grp, 777, torch.float32, "sum", salt, True, True, issued, async_op=True)
    for dtype, n in big:
        for op, in_place, private in (("sum", False, True), ("avg", True, False)):
            salt += 1
            one_rs(dt, a, group_ranks, grp, n, dtype, op, salt, in_place, private, issued)
    return a


def case_sweep(rank, world, dt, groups):
    issued = Issued()
    big = ((torch.float32, 4 * MIB // 4), (torch.bfloat16, 3 * MIB // 2))
    adapters = [sweep(dt, list(range(world)), None, issued, big)]
    for ranks, grp in groups:
        if rank in ranks:
            adapters.append(sweep(dt, ranks, grp, issued, ((torch.float32, MIB // 4),)))
    # WORLD once more after the sub-groups: its job goes on.
    one_rs(dt, adapters[0], list(range(world)), None, 5, torch.bfloat16, "avg", 9999, False, True, issued)
    return {"issued": issued.jobs, "stats": {a.job_key: a.stats() for a in adapters}}


def case_fallbacks(rank, world, dt, groups):
    """WORLD of 2: every per-op reason once, then a served op."""
    a = dt.adapter_for(None)
    res = {}
    n = 6
    # op_unsupported: MAX, the framework's result.
    inp = to_torch(rank_input(rank, world * n, torch.int32, 1), torch.int32)
    out = torch.empty(n, dtype=torch.int32)
    dt.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.MAX)
    want = np.maximum.reduce([rank_input(g, world * n, torch.int32, 1)[rank * n:(rank + 1) * n] for g in range(world)])
    if not np.array_equal(out.numpy(), want):
        raise AssertionError("MAX through the framework differs")
    # avg_integer: the framework's own error, on every rank.
    try:
        dt.reduce_scatter_tensor(torch.empty(n, dtype=torch.int32), inp, op=dist.ReduceOp.AVG)
        res["avg_int"] = "no error"
    except RuntimeError as e:
        res["avg_int"] = "RuntimeError"
        res["avg_int_text"] = str(e)[:200]
    # dtype_unsupported: complex64 (the framework sums; whole numbers, so exactly).
    inpc = torch.arange(world * n).to(torch.complex64) * (1 + 2j) + 100 * rank
    outc = torch.empty(n, dtype=torch.complex64)
    dt.reduce_scatter_tensor(outc, inpc)
    wantc = sum(torch.arange(world * n).to(torch.complex64) * (1 + 2j) + 100 * g for g in range(world))
    if not torch.equal(outc, wantc[rank * n:(rank + 1) * n]):
        raise AssertionError("complex64 through the framework differs")
    # numel_over_max: a chunk over DMAGATHER_MAX_NUMEL (set to 4096 for this case).
    big = a.max_numel + 1
    inp64 = to_torch(rank_input(rank, world * big, torch.int64, 3), torch.int64)
    out64 = torch.empty(big, dtype=torch.int64)
    dt.reduce_scatter_tensor(out64, inp64)
    if not np.array_equal(out64.numpy(), reference(list(range(world)), rank, big, torch.int64, "sum", 3)):
        raise AssertionError("over max_numel through the framework differs")
    # memory_unreachable: rank 1's input is private and host staging is off.
    a.host_staging = False
    inp = to_torch(rank_input(rank, world * n, torch.int64, 4), torch.int64)
    if rank != 1:
        t = a.empty(world * n, dtype=torch.int64)
        t.copy_(inp)
        inp = t
    out = a.empty(n, dtype=torch.int64)
    dt.reduce_scatter_tensor(out, inp)
    if not np.array_equal(out.numpy(), reference(list(range(world)), rank, n, torch.int64, "sum", 4)):
        raise AssertionError("memory_unreachable through the framework differs")
    # Bad input: ValueError on every rank, nothing submitted.
    for what, (o, i) in {"indivisible": (torch.empty(2), torch.empty(5)),
                         "dtype": (torch.empty(2, dtype=torch.float64), torch.empty(4))}.items():
        try:
            dt.reduce_scatter_tensor(o, i)
            res[what] = "no error"
        except ValueError as e:
            res[what] = str(e)
    # Served again.
    inp = a.empty(world * n, dtype=torch.float32)
    inp.copy_(to_torch(rank_input(rank, world * n, torch.float32, 5), torch.float32))
    out = a.empty(n, dtype=torch.float32)
    dt.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
    why = same_as_reference(out, reference(list(range(world)), rank, n, torch.float32, "avg", 5), torch.float32)
    if why:
        raise AssertionError(f"the op after the fallbacks: {why}")
    res["stats"] = a.stats()
    res["job_key"] = a.job_key
    return res


def case_agreed(rank, world, dt, groups):
    """The set-up's verdict: an int64 SUM, whatever serves it, is exact."""
    a = dt.adapter_for(None)
    n = 1000
    inp = to_torch(rank_input(rank, world * n, torch.int64, 1), torch.int64)
    out = torch.empty(n, dtype=torch.int64)
    dt.reduce_scatter_tensor(out, inp)
    if not np.array_equal(out.numpy(), reference(list(range(world)), rank, n, torch.int64, "sum", 1)):
        raise AssertionError("int64 sum differs")
    return {"stats": a.stats()}


def case_stream_ordered(rank, world, dt, groups):
    """The signature cache's stream-ordered mode (the GPU backends'; forced on
    the host backend): the first op of a signature is host-waited, the later
    ones are not; their results are right after synchronize() / Work.wait()."""
    a = dt.adapter_for(None)
    n, salt = 2049, 0
    outs = []
    for k in range(4):
        for dtype, op in ((torch.float32, "sum"), (torch.bfloat16, "avg")):
            salt += 1
            arr = rank_input(rank, world * n, dtype, salt)
            inp = a.empty(world * n, dtype=dtype)
            inp.copy_(to_torch(arr, dtype))
            out = a.empty(n, dtype=dtype)
            red = dist.ReduceOp.AVG if op == "avg" else dist.ReduceOp.SUM
            work = dt.reduce_scatter_tensor(out, inp, op=red, async_op=k == 3)
            outs.append((out, dtype, op, salt, work))
    for _, _, _, _, work in outs:
        if work is not None:
            work.wait()
    dt.synchronize()
    for out, dtype, op, salt, _ in outs:
        why = same_as_reference(out, reference(list(range(world)), rank, n, dtype, op, salt), dtype)
        if why:
            raise AssertionError(f"stream-ordered {dtype} {op} salt {salt}: {why}")
    return {"stats": a.stats()}


CASES = {"sweep": case_sweep, "fallbacks": case_fallbacks, "agreed": case_agreed,
         "stream_ordered": case_stream_ordered}


def rank_main(rank, world, case, sock, store, q, env):
    try:
        for k in ("DMAGATHER_REDUCE_SCATTER", "DMAGATHER_HOST_STAGING", "DMAGATHER_MAX_NUMEL"):
            os.environ.pop(k, None)
        os.environ.update(env.get(rank, env.get("all", {})))
        import torch.distributed as dist
        import dmagather
        if env.get("old_library_on") == rank:  # this rank's library as one without the reduce-scatter
            dmagather.load_library()._dmagather_optional.discard("dmagather_reduce_scatter_async")
        import dmagather.torch as dt
        handler = _ListHandler()
        logging.getLogger("dmagather").addHandler(handler)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        groups = [(ranks, dist.new_group(ranks)) for ranks in SUBGROUPS[world]]
        dt.init(enabled=True, socket=sock, stream_ordered=case == "stream_ordered" or None)
        result = CASES[case](rank, world, dt, groups)
        result["log"] = [m for m in handler.records if "reduce_scatter" in m]
        dt.shutdown()
        del groups
        dist.destroy_process_group()
        q.put((rank, "ok", result))
    except BaseException as e:  # noqa: BLE001
        import traceback
        q.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}", None))


def daemon_jobs(sock):
    p = subprocess.run([os.path.join(RUNFILES, "tools", "dmagatherctl"), f"--socket={sock}", "--json", "stats"],
                       capture_output=True, text=True, timeout=30, check=True)
    return {j["job_key"]: j for j in json.loads(p.stdout).get("jobs", [])}


@unittest.skipUnless(HAVE_TORCH, WHY_NO_TORCH)
@unittest.skipUnless(HAVE_RS, WHY_NO_RS)
class ReduceScatterTest(DaemonTestCase):
    DAEMON_PREFIX = "dmagather-rs-"
    maxDiff = 4000

    def run_case(self, case, world, env):
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        store = os.path.join(self.dir, f"{case}-{world}-{len(os.listdir(self.dir))}.store")
        procs = [ctx.Process(target=rank_main, args=(r, world, case, self.sock, store, q, env)) for r in range(world)]
        return self.collect_ranks(procs, q, DEADLINE_S)

    def check_sweep(self, world):
        res = self.run_case("sweep", world, {"all": {"DMAGATHER_REDUCE_SCATTER": "1", "DMAGATHER_HOST_STAGING": "1"}})
        jobs = daemon_jobs(self.sock)
        seen = {}
        for rank, r in res.items():
            self.assertEqual(set(r["issued"]), set(r["stats"]), f"rank {rank}")
            for key, issued in r["issued"].items():
                s = r["stats"][key]
                self.assertEqual(s["reduce_scatter"], "on", s)
                self.assertEqual(s["reduce_scatter_fallback_ops"], 0, f"rank {rank}: {s}")
                self.assertEqual(s["fallback_ops"], 0, f"rank {rank}: {s}")
                self.assertEqual(s["reduce_scatter_ops"], issued["rs"], f"rank {rank}")
                self.assertEqual(s["reduce_scatter_ops_by_op"], {"sum": issued["sum"], "avg": issued["avg"]})
                self.assertEqual(s["reduce_scatter_staged_ops"], issued["staged"], f"rank {rank}")
                self.assertEqual(s["reduce_scatter_in_place_ops"], issued["in_place"], f"rank {rank}")
                self.assertEqual(s["reduce_scatter_host_waited_ops"], issued["rs"])
                self.assertEqual(s["dmagather_ops"], issued["ag"], f"rank {rank}")
                seen.setdefault(key, set()).add((issued["rs"], issued["ag"]))
        self.assertEqual(len(seen), 1 + len(SUBGROUPS[world]), seen)
        for key, s in seen.items():
            self.assertEqual(len(s), 1, f"job {key}: ranks disagree {s}")
            rs, ag = s.pop()
            self.assertIn(key, jobs, f"job {key} not on the daemon")
            self.assertEqual(int(jobs[key]["ops"]), rs + ag, f"job {key}: the daemon's count")
            self.assertEqual(int(jobs[key].get("fallback_ops", 0)), 0)
        lines = res[0]["log"]
        served = [l for l in lines if l.startswith("dmagather serves reduce_scatter_tensor")]
        self.assertEqual(len(served), 1 + sum(1 for g in SUBGROUPS[world] if 0 in g), lines)
        self.assertIn("(sum, avg) for WORLD on the host backend", served[0])
        for r in range(1, world):
            self.assertEqual(res[r]["log"], [], f"rank {r} logged")

    def test_world2_bit_exact(self):
        self.check_sweep(2)

    def test_world3_with_subgroup_bit_exact(self):
        self.check_sweep(3)

    def test_world4_with_subgroups_bit_exact(self):
        self.check_sweep(4)

    def test_fallbacks_counted_and_bad_input_raises(self):
        env = {"all": {"DMAGATHER_REDUCE_SCATTER": "1", "DMAGATHER_HOST_STAGING": "1", "DMAGATHER_MAX_NUMEL": "4096"}}
        res = self.run_case("fallbacks", 2, env)
        for rank, r in res.items():
            s = r["stats"]
            self.assertEqual(s["reduce_scatter_ops"], 1, f"rank {rank}: {s}")
            want = {k: 0 for k in s["reduce_scatter_fallback_by_reason"]}
            want.update(op_unsupported=1, avg_integer=1, dtype_unsupported=1, numel_over_max=1, memory_unreachable=1)
            self.assertEqual(s["reduce_scatter_fallback_by_reason"], want, f"rank {rank}")
            self.assertEqual(s["reduce_scatter_fallback_by_op"], {"MAX": 1})
            self.assertEqual(r["avg_int"], "RuntimeError", f"rank {rank}")
            self.assertIn("world_size (2)", r["indivisible"])
            self.assertIn("dtype torch.float64 is not the input's torch.float32", r["dtype"])
            self.assertIn("rank 1", s["reduce_scatter_last_fallback_reason"] or "")
        self.assertEqual(len([l for l in res[0]["log"] if "fallback" in l]), 5, res[0]["log"])
        job = daemon_jobs(self.sock)[res[0]["job_key"]]
        self.assertEqual(int(job["fallback_ops"]), 1, "the refused op")

    def test_one_rank_without_the_variable_every_rank_falls_back(self):
        env = {"all": {"DMAGATHER_REDUCE_SCATTER": "1"}, 1: {}}
        res = self.run_case("agreed", 3, env)
        for rank, r in res.items():
            s = r["stats"]
            self.assertEqual(s["reduce_scatter"], "off: DMAGATHER_REDUCE_SCATTER is not 1 on rank(s) 1", rank)
            self.assertEqual(s["reduce_scatter_ops"], 0)
            self.assertEqual(s["reduce_scatter_fallback_by_reason"]["not_enabled"], 1)
        self.assertEqual(res[0]["log"][0], "dmagather reduce_scatter not served (DMAGATHER_REDUCE_SCATTER is not 1 on "
                                           "rank(s) 1): using gloo's for WORLD", res[0]["log"])

    def test_off_by_default_says_nothing(self):
        res = self.run_case("agreed", 2, {})
        for rank, r in res.items():
            self.assertEqual(r["stats"]["reduce_scatter"], "off: DMAGATHER_REDUCE_SCATTER is not 1")
            self.assertEqual(r["stats"]["reduce_scatter_fallback_by_reason"]["not_enabled"], 1)
            self.assertEqual(r["log"], [], f"rank {rank}")

    def test_stream_ordered_mode_host_waits_the_first_op_of_a_signature(self):
        res = self.run_case("stream_ordered", 3, {"all": {"DMAGATHER_REDUCE_SCATTER": "1"}})
        for rank, r in res.items():
            s = r["stats"]
            self.assertEqual(s["reduce_scatter_ops"], 8, f"rank {rank}: {s}")
            self.assertEqual(s["reduce_scatter_host_waited_ops"], 2, "one per signature")
            self.assertEqual(s["reduce_scatter_stream_ordered_ops"], 6)
            self.assertEqual(s["reduce_scatter_fallback_ops"], 0)

    def test_library_without_reduce_scatter_on_one_rank(self):
        env = {"all": {"DMAGATHER_REDUCE_SCATTER": "1"}, "old_library_on": 1}
        res = self.run_case("agreed", 2, env)
        for rank, r in res.items():
            self.assertEqual(r["stats"]["reduce_scatter"],
                             "off: the libdmagather.so of rank(s) 1 has no dmagather_reduce_scatter_async")
            self.assertEqual(r["stats"]["reduce_scatter_fallback_by_reason"]["library_too_old"], 1)


if __name__ == "__main__":
    unittest.main()
