"""DeepSpeed ZeRO-3, unmodified (zero3_train.py has nothing of dmagather),
launched with DeepSpeed's own `deepspeed` launcher, 2 ranks on CPU (DeepSpeed's
CPU accelerator: gloo), a small causal transformer, fp32, 6 steps. Three runs
on one real daemon (host backend):

  off   no DMAGATHER_ALLGATHER
  on    DMAGATHER_ALLGATHER=1, nothing else
  both  DMAGATHER_ALLGATHER=1 and DeepSpeed's DS_SDMA_ALLGATHER=1
  zc_off  DMAGATHER_ALLGATHER=1 and DMAGATHER_ZERO3_ZERO_COPY=0: DeepSpeed's
        own coalesced fetch (flat buffer, copy-in, copy-out) on dmagather
  off_bf16, on_bf16  off and on with DeepSpeed's bf16 mixed precision
  install  no DMAGATHER_ALLGATHER (DMAGATHER_HOST_STAGING=1: the host backend
        stages private CPU tensors); the script calls dmagather.torch.install() after
        deepspeed.initialize() (DeepSpeed's backend already holds torch's
        function: install() must replace it there too)

Asserted: every rank's losses and the final (gathered) parameters are the same
bytes in all three; in `on` and `both` every parameter all-gather of every rank
went through dmagather (Python counters: ops > 0, 0 fallbacks) and the daemon
counted the same ops for the job, with no errors or fallbacks; rank 0 printed
exactly one start line; `off` set nothing up. The zero-copy fetch
(_zero3_zero_copy): in `on` the coalesced fetches gathered into the parameters
(equal counts on every rank, no rule hit, the same dmagather ops), and `zc_off`,
which never takes it, is bit-identical to `on` and `off`.

DeepSpeedReduceScatterTest: the gradient reduce-scatter with
DMAGATHER_REDUCE_SCATTER=1 too (start-up hook; and install() after
deepspeed.initialize()), fp32 and bf16: two runs the same bytes, losses within
LOSS_RTOL of the run without dmagather, every reduce-scatter served (SUM, in
place), the daemon's count equal.
"""
import json
import os
import unittest

from trainers_case import TrainerCase, free_port, serves_lines, start_lines, HERE, VENV_BIN

try:
    import deepspeed  # noqa: F401
    HAVE_DS, WHY = True, ""
except Exception as e:  # noqa: BLE001
    HAVE_DS, WHY = False, f"deepspeed is not importable in this venv: {e}"

WORLD = 2
STEPS = 6
RUN_TIMEOUT_S = 900  # the first run on a machine JIT-builds DeepSpeed's CPU shm op (~90 s)


@unittest.skipUnless(HAVE_DS, WHY)
class DeepSpeedZero3Test(TrainerCase):
    @classmethod
    def setUpClass(cls):
        def launcher(extra):
            return lambda out: ([os.path.join(VENV_BIN, "deepspeed"), "--num_gpus", str(WORLD), "--master_port",
                                 str(free_port()), os.path.join(HERE, "zero3_train.py"), "--out", out, "--steps",
                                 str(STEPS)] + extra)
        runs = {"off": ({}, launcher([])),
                "on": ({"DMAGATHER_ALLGATHER": "1"}, launcher([])),
                "both": ({"DMAGATHER_ALLGATHER": "1", "DS_SDMA_ALLGATHER": "1"}, launcher([])),
                "zc_off": ({"DMAGATHER_ALLGATHER": "1", "DMAGATHER_ZERO3_ZERO_COPY": "0"}, launcher([])),
                "off_bf16": ({}, launcher(["--dtype", "bf16"])),
                "on_bf16": ({"DMAGATHER_ALLGATHER": "1"}, launcher(["--dtype", "bf16"])),
                "install": ({"DMAGATHER_HOST_STAGING": "1"}, launcher(["--install-after-init"]))}
        cls.launch_all("dmagather-zero3-", runs, WORLD, RUN_TIMEOUT_S)

    def test_off_sets_nothing_up(self):
        r = self.ok("off")
        self.assertEqual(r["stats"], {}, "dmagather was set up without DMAGATHER_ALLGATHER")
        self.assertEqual(start_lines(r["out"]), [])
        self.assertEqual(r["daemon"]["jobs"], [], "a job reached the daemon with dmagather off")

    def check_served(self, name, staged=True):
        r = self.ok(name)
        self.assertEqual(sorted(r["stats"]), list(range(WORLD)), f"{name}: ranks without counters")
        ops = {s["dmagather_ops"] for s in r["stats"].values()}
        self.assertEqual(len(ops), 1, f"{name}: ranks disagree on ops: {r['stats']}")
        n = ops.pop()
        self.assertGreater(n, 0)
        for rank, s in r["stats"].items():
            self.assertTrue(s["enabled"], s)
            self.assertEqual(s["fallback_ops"], 0, f"{name} rank {rank} fell back: {s['fallback_by_reason']} "
                                                   f"({s['last_fallback_reason']})")
            if staged:
                self.assertEqual(s["staged_ops"], n, "ZeRO-3's CPU tensors are private: every op staged")
        lines = start_lines(r["out"])
        self.assertEqual(len(lines), 1, f"{name}: start lines {lines}")
        self.assertIn("dmagather allgather enabled (backend=host", lines[0])
        # The daemon's view of the job: the same ops, every rank, no errors, no fallbacks.
        key = r["stats"][0]["job_key"]
        jobs = [j for j in r["daemon"]["jobs"] if j["job_key"] == key]
        self.assertEqual(len(jobs), 1, f"job {key} not in the daemon's stats")
        j = jobs[0]
        self.assertEqual(int(j["ops"]), n)
        self.assertEqual(j.get("errors", []), [])
        self.assertEqual(sorted(x["rank"] for x in j["ranks"]), list(range(WORLD)))
        for x in j["ranks"]:
            self.assertEqual(int(x["ops"]), n, x)
        self.assertEqual(r["daemon"].get("fallbacks", []), [])
        return n, lines[0]

    def test_env_only_bit_identical(self):
        self.ok("off")
        self.ok("on")
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["on"]["dir"], "off vs DMAGATHER_ALLGATHER=1")

    def test_env_only_serves_every_parameter_gather(self):
        _, line = self.check_served("on")
        self.assertIn("DMAGATHER_ALLGATHER=1", line)

    def test_install_after_deepspeed_initialize_serves(self):
        # Without replacing the function DeepSpeed's backend captured, no gather would
        # reach dmagather here. The gathers made inside deepspeed.initialize() (one
        # per parameter on DeepSpeed 0.19.8: 41 of 191) come before install() can be
        # called: every later one must be served.
        n_install, _ = self.check_served("install")
        n_on, _ = self.check_served("on")
        params = json.load(open(os.path.join(self.runs["off"]["dir"], "summary.json")))["params"]
        self.assertGreater(n_install, 0)
        self.assertLessEqual(n_on - n_install, params, f"install() after initialize: {n_install} of {n_on} served")
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["install"]["dir"], "off vs install() after init")

    def zero_copy(self, name):
        stats = self.ok(name)["stats"]
        self.assertEqual(sorted(stats), list(range(WORLD)), f"{name}: ranks without counters")
        keys = ("zero3_zero_copy", "zero3_zero_copy_fetches", "zero3_zero_copy_items", "zero3_zero_copy_bytes",
                "zero3_zero_copy_fallback_by_reason")
        views = {rank: tuple(str(s[k]) for k in keys) for rank, s in stats.items()}
        self.assertEqual(len(set(views.values())), 1, f"{name}: ranks took different paths: {views}")
        return stats[0]

    def test_zero_copy_fetch_takes_every_coalesced_fetch_bit_identical(self):
        s = self.zero_copy("on")
        self.assertEqual(s["zero3_zero_copy"], "on")
        self.assertGreater(s["zero3_zero_copy_fetches"], 0)
        self.assertGreater(s["zero3_zero_copy_items"], s["zero3_zero_copy_fetches"], "a fetch of one parameter")
        self.assertEqual(sum(s["zero3_zero_copy_fallback_by_reason"].values()), 0, s)
        self.assertLess(s["zero3_zero_copy_fetches"], s["dmagather_ops"], "single-parameter gathers are not fetches")
        off = self.zero_copy("zc_off")
        self.assertEqual(off["zero3_zero_copy"], "off: DMAGATHER_ZERO3_ZERO_COPY=0")
        self.assertEqual(off["zero3_zero_copy_fetches"], 0)
        self.assertEqual(off["dmagather_ops"], s["dmagather_ops"], "the same ops, gathered another way")
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["zc_off"]["dir"], "off vs zero-copy off")
        self.assert_same_bytes(self.runs["on"]["dir"], self.runs["zc_off"]["dir"], "zero-copy on vs off")

    def test_zero_copy_fetch_bf16_bit_identical(self):
        # bf16: DeepSpeed keeps the partitions in bf16 (fp32 master weights in the
        # optimizer), so the fetch gathers bf16 with no cast.
        s = self.zero_copy("on_bf16")
        self.assertEqual(s["zero3_zero_copy"], "on")
        self.assertGreater(s["zero3_zero_copy_fetches"], 0)
        self.assertEqual(sum(s["zero3_zero_copy_fallback_by_reason"].values()), 0, s)
        self.assertEqual(json.load(open(os.path.join(self.runs["off_bf16"]["dir"], "summary.json")))["dtype"], "bf16")
        self.assert_same_bytes(self.runs["off_bf16"]["dir"], self.runs["on_bf16"]["dir"], "bf16: off vs zero-copy")

    def test_install_after_initialize_keeps_deepspeeds_fetch(self):
        # The parameters were converted inside deepspeed.initialize(), before
        # install() could arm the zero-copy fetch: they keep DeepSpeed's.
        s = self.zero_copy("install")
        self.assertEqual(s["zero3_zero_copy"], "on")
        self.assertEqual(s["zero3_zero_copy_fetches"], 0)

    def test_with_ds_sdma_allgather_bit_identical_and_served(self):
        self.ok("off")
        n_on, _ = self.check_served("on")
        n_both, line = self.check_served("both")
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["both"]["dir"], "off vs both switches")
        # DeepSpeed's SDMA path needs mori (AMD); without it every gather reaches dmagather, as with ours alone.
        self.assertEqual(n_both, n_on)
        self.assertIn("DS_SDMA_ALLGATHER is set", line)
        self.assertNotIn("SDMA allgather enabled", self.runs["both"]["out"])


HPZ_WORLD = 4
HPZ_STEPS = 3


@unittest.skipUnless(HAVE_DS, WHY)
class DeepSpeedHpzTest(TrainerCase):
    """ZeRO++ hpZ (zero_hpz_partition_size 2), 4 ranks of one node, unmodified
    with DMAGATHER_ALLGATHER=1: the WORLD gathers on WORLD's job, the secondary
    partition's gathers on each secondary group's own job."""

    @classmethod
    def setUpClass(cls):
        def launcher(extra):
            return lambda out: ([os.path.join(VENV_BIN, "deepspeed"), "--num_gpus", str(HPZ_WORLD), "--master_port",
                                 str(free_port()), os.path.join(HERE, "zero3_train.py"), "--out", out, "--steps",
                                 str(HPZ_STEPS), "--hpz", "2"] + extra)
        cls.launch_all("dmagather-hpz-", {"off": ({}, launcher([])),
                                          "on": ({"DMAGATHER_ALLGATHER": "1"}, launcher([]))},
                       HPZ_WORLD, RUN_TIMEOUT_S)

    def test_secondary_groups_served_bit_identical(self):
        on = self.ok("on")
        self.assert_same_bytes(self.ok("off")["dir"], on["dir"], "ZeRO++ hpZ off vs DMAGATHER_ALLGATHER=1")
        jobs = {j["job_key"]: j for j in on["daemon"]["jobs"]}
        world_ops = {s["dmagather_ops"] for s in on["stats"].values()}
        self.assertEqual(len(world_ops), 1, on["stats"])
        self.assertEqual(int(jobs[on["stats"][0]["job_key"]]["ops"]), world_ops.pop())
        seen = {}
        for rank, s in on["stats"].items():
            self.assertEqual(s["fallback_ops"], 0, s)
            self.assertEqual(len(s["groups"]), 1, s["groups"])
            g = s["groups"][0]
            self.assertEqual(g["ranks"], [0, 1] if rank < 2 else [2, 3], g)
            self.assertEqual(g["fallback_ops"], 0, g)
            self.assertGreater(g["dmagather_ops"], 0, g)
            seen.setdefault(tuple(g["ranks"]), set()).add((g["job_key"], g["dmagather_ops"]))
        self.assertEqual(sorted(seen), [(0, 1), (2, 3)])
        for ranks, keys in seen.items():
            self.assertEqual(len(keys), 1, f"secondary group {ranks}: ranks disagree {keys}")
            key, ops = keys.pop()
            self.assertEqual(int(jobs[key]["ops"]), ops, f"secondary group {ranks}: the daemon's count")
            self.assertEqual(jobs[key].get("errors", []), [])


RS_ON = {"DMAGATHER_ALLGATHER": "1", "DMAGATHER_REDUCE_SCATTER": "1"}
# Losses against the run without dmagather (gloo's reduce-scatter): see
# fsdp2_test.py's LOSS_RTOL (the same bound, the same reasons: last-bit
# differences of the gradient sums under AdamW at lr 1e-3, a few steps).
LOSS_RTOL = 1e-3


@unittest.skipUnless(HAVE_DS, WHY)
class DeepSpeedReduceScatterTest(TrainerCase):
    """ZeRO-3's gradient reduce-scatter, unmodified: stage3's
    __avg_scatter_grads -> reduce_scatter_coalesced (the gradients divided by
    the world first, one flat buffer, this rank's chunk of it as the output:
    in place) -> dist.reduce_scatter_fn -> TorchBackend.reduce_scatter_tensor
    -> the function DeepSpeed captured when its backend was built
    (torch.distributed.reduce_scatter_tensor, replaced by then by the start-up
    hook; install() replaces the captured one). Served with SUM."""

    @classmethod
    def setUpClass(cls):
        def launcher(extra):
            return lambda out: ([os.path.join(VENV_BIN, "deepspeed"), "--num_gpus", str(WORLD), "--master_port",
                                 str(free_port()), os.path.join(HERE, "zero3_train.py"), "--out", out, "--steps",
                                 str(STEPS)] + extra)
        runs = {"off": ({}, launcher([])),
                "rs": (RS_ON, launcher([])),
                "rs_again": (RS_ON, launcher([])),
                "off_bf16": ({}, launcher(["--dtype", "bf16"])),
                "rs_bf16": (RS_ON, launcher(["--dtype", "bf16"])),
                "install": ({"DMAGATHER_HOST_STAGING": "1", "DMAGATHER_REDUCE_SCATTER": "1"},
                            launcher(["--install-after-init"]))}
        cls.launch_all("dmagather-zero3-rs-", runs, WORLD, RUN_TIMEOUT_S)

    def test_deepspeed_calls_the_captured_reduce_scatter_tensor(self):
        import importlib
        import inspect
        ds_torch = importlib.import_module("deepspeed.comm.torch")  # (deepspeed.comm's `torch` is torch itself)
        cc = importlib.import_module("deepspeed.runtime.comm.coalesced_collectives")
        self.assertIn("dist.reduce_scatter_fn", inspect.getsource(cc._torch_reduce_scatter_fn))
        # TorchBackend.reduce_scatter_tensor is wrapped (stage_on_cpu): its module's text.
        self.assertIn("return self.reduce_scatter_function(output_tensor", inspect.getsource(ds_torch))
        self.assertIn("torch.distributed.reduce_scatter_tensor",
                      inspect.getsource(ds_torch.TorchBackend.get_reduce_scatter_function))

    def test_served_same_bits_every_run_close_to_gloo(self):
        self.check_reduce_scatter_served("rs", WORLD, "sum", STEPS)
        for rank, s in self.ok("rs")["stats"].items():
            self.assertEqual(s["reduce_scatter_in_place_ops"], s["reduce_scatter_ops"], f"rank {rank}: in place")
        self.assert_same_bytes(self.runs["rs"]["dir"], self.runs["rs_again"]["dir"], "ZeRO-3 reduce-scatter run 1 vs 2")
        self.assert_losses_close(self.runs["off"]["dir"], self.runs["rs"]["dir"], LOSS_RTOL, "ZeRO-3 fp32 vs gloo")
        self.assertEqual(len(serves_lines(self.ok("rs")["out"])), 1)

    def test_bf16_served_close_to_gloo(self):
        self.check_reduce_scatter_served("rs_bf16", WORLD, "sum", STEPS)
        self.assert_losses_close(self.runs["off_bf16"]["dir"], self.runs["rs_bf16"]["dir"], LOSS_RTOL,
                                 "ZeRO-3 bf16 vs gloo")

    def test_install_after_initialize_replaces_the_captured_function(self):
        """Without replacing DeepSpeed's captured reduce_scatter_function, no
        reduce-scatter would reach dmagather after install()."""
        self.check_reduce_scatter_served("install", WORLD, "sum", STEPS)
        self.assert_losses_close(self.runs["off"]["dir"], self.runs["install"]["dir"], LOSS_RTOL,
                                 "ZeRO-3 install() vs gloo")

    def test_off_sets_nothing_up(self):
        self.assertEqual(self.ok("off")["stats"], {})
        self.assertEqual(self.ok("off")["daemon"]["jobs"], [])


if __name__ == "__main__":
    unittest.main()
