"""FSDP2 (torch 2.11 from PyPI, CPU, gloo), launched with torchrun, 2 ranks, a
small model with every block and the root fully_shard'ed, 5 AdamW steps, on one
real daemon (host backend). Runs of fsdp2_train.py:

  off        no DMAGATHER_ALLGATHER                      (fp32, and bf16 params)
  on         DMAGATHER_ALLGATHER=1 only, script unchanged (fp32, and bf16 params):
             FSDP2's default all-gather calls dist.all_gather_into_tensor
  custom     --custom-all-gather: dmagather.torch.FSDPAllGather() on every
             FSDPModule (the documented hook), no variable

Asserted: losses and final parameters the same bytes as `off` of the same
dtype; every all-gather of every rank served by dmagather (0 fallbacks; the
daemon counted the job's ops, no errors); `custom` gathers in FSDPAllGather's
daemon memory (nothing staged), `on` stages FSDP2's private buffers.
"""
import os
import unittest

from trainers_case import TrainerCase, start_lines, HERE, VENV_BIN

try:
    from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: F401
    HAVE_FSDP2 = hasattr(FSDPModule, "set_custom_all_gather")
    WHY = "this torch has no FSDPModule.set_custom_all_gather (torch >= 2.11)"
except Exception as e:  # noqa: BLE001
    HAVE_FSDP2, WHY = False, f"no FSDP2 in this torch: {e}"

WORLD = 2
STEPS = 5
RUN_TIMEOUT_S = 300
RUNS = {
    "off": ({}, []),
    "on": ({"DMAGATHER_ALLGATHER": "1"}, []),
    "custom": ({}, ["--custom-all-gather"]),
    "off-bf16": ({}, ["--dtype", "bf16"]),
    "on-bf16": ({"DMAGATHER_ALLGATHER": "1"}, ["--dtype", "bf16"]),
}


@unittest.skipUnless(HAVE_FSDP2, WHY)
class Fsdp2Test(TrainerCase):
    @classmethod
    def setUpClass(cls):
        def launcher(args):
            return lambda out: ([os.path.join(VENV_BIN, "torchrun"), "--standalone", "--nproc_per_node", str(WORLD),
                                 os.path.join(HERE, "fsdp2_train.py"), "--out", out, "--steps", str(STEPS)] + args)
        cls.launch_all("dmagather-fsdp2-", {name: (switches, launcher(args)) for name, (switches, args) in RUNS.items()},
                       WORLD, RUN_TIMEOUT_S)

    def check_served(self, name, staged):
        r = self.ok(name)
        self.assertEqual(sorted(r["stats"]), list(range(WORLD)), f"{name}: ranks without counters")
        ops = {s["dmagather_ops"] for s in r["stats"].values()}
        self.assertEqual(len(ops), 1, f"{name}: ranks disagree: {r['stats']}")
        n = ops.pop()
        self.assertGreaterEqual(n, STEPS, f"{name}: too few ops")
        for rank, s in r["stats"].items():
            self.assertEqual(s["fallback_ops"], 0, f"{name} rank {rank}: {s['fallback_by_reason']} "
                                                   f"({s['last_fallback_reason']})")
            self.assertEqual(s["staged_ops"], n if staged else 0, f"{name} rank {rank}: {s}")
        self.assertEqual(len(start_lines(r["out"])), 1, start_lines(r["out"]))
        key = r["stats"][0]["job_key"]
        jobs = [j for j in r["daemon"]["jobs"] if j["job_key"] == key]
        self.assertEqual(len(jobs), 1, f"job {key} not in the daemon's stats")
        self.assertEqual(int(jobs[0]["ops"]), n)
        self.assertEqual(jobs[0].get("errors", []), [])
        self.assertEqual(r["daemon"].get("fallbacks", []), [])

    def test_off_sets_nothing_up(self):
        for name in ("off", "off-bf16"):
            r = self.ok(name)
            self.assertEqual(r["stats"], {}, name)
            self.assertEqual(start_lines(r["out"]), [], name)

    def test_env_only_bit_identical_and_served(self):
        self.check_served("on", staged=True)
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["on"]["dir"], "FSDP2 off vs DMAGATHER_ALLGATHER=1")

    def test_env_only_bf16_bit_identical_and_served(self):
        self.check_served("on-bf16", staged=True)
        self.assert_same_bytes(self.runs["off-bf16"]["dir"], self.runs["on-bf16"]["dir"], "FSDP2 bf16 off vs on")

    def test_custom_all_gather_bit_identical_in_daemon_memory(self):
        self.check_served("custom", staged=False)
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["custom"]["dir"], "FSDP2 off vs FSDPAllGather")


if __name__ == "__main__":
    unittest.main()
