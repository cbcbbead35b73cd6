"""DeepSpeed ZeRO-3, unmodified (zero3_train.py has nothing of dmagather),
launched with DeepSpeed's own `deepspeed` launcher, 2 ranks on CPU (DeepSpeed's
CPU accelerator: gloo), a small causal transformer, fp32, 6 steps. Three runs
on one real daemon (host backend):

  off   no DMAGATHER_ALLGATHER
  on    DMAGATHER_ALLGATHER=1, nothing else
  both  DMAGATHER_ALLGATHER=1 and DeepSpeed's DS_SDMA_ALLGATHER=1
  install  no DMAGATHER_ALLGATHER (DMAGATHER_HOST_STAGING=1: the host backend
        stages private CPU tensors); the script calls dmagather.torch.install() after
        deepspeed.initialize() (DeepSpeed's backend already holds torch's
        function: install() must replace it there too)

Asserted: every rank's losses and the final (gathered) parameters are the same
bytes in all three; in `on` and `both` every parameter all-gather of every rank
went through dmagather (Python counters: ops > 0, 0 fallbacks) and the daemon
counted the same ops for the job, with no errors or fallbacks; rank 0 printed
exactly one start line; `off` set nothing up.
"""
import os
import unittest

from trainers_case import TrainerCase, free_port, start_lines, HERE, VENV_BIN

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
        import json
        params = json.load(open(os.path.join(self.runs["off"]["dir"], "summary.json")))["params"]
        self.assertGreater(n_install, 0)
        self.assertLessEqual(n_on - n_install, params, f"install() after initialize: {n_install} of {n_on} served")
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["install"]["dir"], "off vs install() after init")

    def test_with_ds_sdma_allgather_bit_identical_and_served(self):
        self.ok("off")
        n_on, _ = self.check_served("on")
        n_both, line = self.check_served("both")
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["both"]["dir"], "off vs both switches")
        # DeepSpeed's SDMA path needs mori (AMD); without it every gather reaches dmagather, as with ours alone.
        self.assertEqual(n_both, n_on)
        self.assertIn("DS_SDMA_ALLGATHER is set", line)
        self.assertNotIn("SDMA allgather enabled", self.runs["both"]["out"])


if __name__ == "__main__":
    unittest.main()
