"""FSDP2 (torch 2.11 and 2.15 from PyPI, CPU, gloo), launched with torchrun, 2 ranks, a
small model with every block and the root fully_shard'ed, 5 AdamW steps, on one
real daemon (host backend). Runs of fsdp2_train.py:

  off        no DMAGATHER_ALLGATHER                      (fp32, and bf16 params)
  on         DMAGATHER_ALLGATHER=1 only, script unchanged (fp32, and bf16 params):
             FSDP2's default all-gather calls dist.all_gather_into_tensor
  custom     --custom-all-gather: dmagather.torch.FSDPAllGather() on every
             FSDPModule (the documented hook), no variable
  on-copyout DMAGATHER_ALLGATHER=1 and DMAGATHER_FSDP_ZERO_COPY=0: FSDP2's own
             copy-in / copy-out around dmagather's all-gather
  off-odd, on-odd  --odd: uneven padded shards, fp32 and bf16 parameters in one
             group, a Shard(1) block, reshard_after_forward=False on the root
  on-untested  --pretend-torch 2.99.0: a torch dmagather does not know
  on-changed   --change-fsdp2: FSDP2's foreach_all_gather not the one tested
  off-hf, on-hf  --model hf-llama --dtype bf16: transformers' Llama from a
             config (every decoder layer and the root sharded), bf16 mixed
             precision (where the venv has transformers: the newest)

Asserted: losses and final parameters the same bytes as `off` of the same
shapes and dtype; every all-gather of every rank served by dmagather (0
fallbacks; the daemon counted the job's ops, no errors); `custom` gathers in
FSDPAllGather's daemon memory (nothing staged), `on` stages FSDP2's private
buffers. The zero-copy unshard (dmagather/_fsdp_zero_copy.py): `on` runs
gather every parameter group after the first straight into the parameters
(counted per rank, equal on every rank; fp32 with no cast kernel, each own
shard the item's send; bf16 with each own shard cast into its slot), `on-odd`'s Shard(1) block goes FSDP2's
own way with its reason counted, `custom` on the host backend takes FSDP2's
path by rule (host_memory), and `on-copyout` never takes it.

The reduce-scatter (Fsdp2ReduceScatterTest, Fsdp2ReduceScatterMeshTest):
DMAGATHER_ALLGATHER=1 and DMAGATHER_REDUCE_SCATTER=1, the script unchanged,
with each op FSDP2 picks (AVG; SUM and FSDP2's division; bf16 gradients; a
divide factor of the world), HSDP 2 x 2 and 4 ranks on a 1-D mesh: two runs
the same bytes, losses within LOSS_RTOL of the run without dmagather, every
reduce-scatter served (by op as FSDP2 chose it), the daemon's count equal.
"""
import os
import unittest

from trainers_case import TrainerCase, serves_lines, start_lines, HERE, VENV_BIN

try:
    from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: F401
    HAVE_FSDP2 = hasattr(FSDPModule, "set_custom_all_gather")
    WHY = "this torch has no FSDPModule.set_custom_all_gather (torch >= 2.11)"
except Exception as e:  # noqa: BLE001
    HAVE_FSDP2, WHY = False, f"no FSDP2 in this torch: {e}"

WORLD = 2
STEPS = 5
UNTESTED = "2.99.0"  # a torch dmagather does not know
RUN_TIMEOUT_S = 300
RUNS = {
    "off": ({}, []),
    "on": ({"DMAGATHER_ALLGATHER": "1"}, []),
    "custom": ({}, ["--custom-all-gather"]),
    "off-bf16": ({}, ["--dtype", "bf16"]),
    "on-bf16": ({"DMAGATHER_ALLGATHER": "1"}, ["--dtype", "bf16"]),
    "on-copyout": ({"DMAGATHER_ALLGATHER": "1", "DMAGATHER_FSDP_ZERO_COPY": "0"}, []),
    "off-odd": ({}, ["--odd"]),
    "on-odd": ({"DMAGATHER_ALLGATHER": "1"}, ["--odd"]),
    "on-untested": ({"DMAGATHER_ALLGATHER": "1"}, ["--pretend-torch", UNTESTED]),
    "on-changed": ({"DMAGATHER_ALLGATHER": "1"}, ["--change-fsdp2"]),
}
NO_ZERO_COPY_FALLBACK = {"compiled": 0, "group": 0, "shard_dim": 0, "extension": 0, "cpu_offload": 0,
                         "host_memory": 0, "output_fn": 0}


def launch_runs(case, prefix, runs, world=WORLD, steps=STEPS):
    """Every run of `runs` (name: (switches, fsdp2_train.py args)) under torchrun, `world` ranks."""
    def launcher(args):
        return lambda out: ([os.path.join(VENV_BIN, "torchrun"), "--standalone", "--nproc_per_node", str(world),
                             os.path.join(HERE, "fsdp2_train.py"), "--out", out, "--steps", str(steps)] + args)
    case.launch_all(prefix, {n: (sw, launcher(a)) for n, (sw, a) in runs.items()}, world, RUN_TIMEOUT_S)


class Fsdp2Checks(TrainerCase):
    """What the WORLD runs assert (no tests of its own)."""

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

    def zero_copy(self, name):
        """(unshards, fallback_by_reason) of a run, equal on every rank."""
        r = self.ok(name)
        seen = {(s["zero_copy"], s["zero_copy_unshards"], tuple(sorted(s["zero_copy_fallback_by_reason"].items())))
                for s in r["stats"].values()}
        self.assertEqual(len(seen), 1, f"{name}: ranks disagree on the zero-copy path: {r['stats']}")
        status, unshards, by_reason = seen.pop()
        return status, unshards, dict(by_reason)


@unittest.skipUnless(HAVE_FSDP2, WHY)
class Fsdp2Test(Fsdp2Checks):
    @classmethod
    def setUpClass(cls):
        launch_runs(cls, "dmagather-fsdp2-", RUNS)

    def test_off_sets_nothing_up(self):
        for name in ("off", "off-bf16", "off-odd"):
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
        status, unshards, by_reason = self.zero_copy("custom")
        self.assertEqual((status, unshards), ("on", 0), "custom, host backend: FSDP2's path by rule")
        self.assertGreaterEqual(by_reason["host_memory"], STEPS, by_reason)

    def test_zero_copy_unshard_gathers_into_the_parameters(self):
        for name in ("on", "on-bf16"):
            status, unshards, by_reason = self.zero_copy(name)
            self.assertEqual(status, "on", name)
            # 5 groups (3 blocks, the root) unshard in forward and backward of every
            # step; only the very first all-gather (which sets dmagather up) is FSDP2's.
            self.assertGreaterEqual(unshards, 2 * 4 * STEPS - 1, f"{name}: too few zero-copy unshards")
            self.assertEqual(by_reason, NO_ZERO_COPY_FALLBACK, name)
            # fp32: every own shard is the item's send (the library copies it);
            # bf16 mixed precision: every own shard is cast into its slot.
            for rank, s in self.ok(name)["stats"].items():
                self.assertGreater(s["zero_copy_items"], unshards, f"{name} rank {rank}: {s}")
                cast = s["zero_copy_items"] if name == "on-bf16" else 0
                self.assertEqual(s["zero_copy_cast_items"], cast, f"{name} rank {rank}: {s}")

    def test_zero_copy_off_by_variable_bit_identical(self):
        self.check_served("on-copyout", staged=True)
        status, unshards, _ = self.zero_copy("on-copyout")
        self.assertEqual((status, unshards), ("off: DMAGATHER_FSDP_ZERO_COPY=0", 0))
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["on-copyout"]["dir"], "FSDP2 off vs copy-out path")
        self.assert_same_bytes(self.runs["on"]["dir"], self.runs["on-copyout"]["dir"], "zero-copy vs copy-out path")

    def test_zero_copy_odd_shapes_bit_identical(self):
        self.check_served("on-odd", staged=True)
        self.assert_same_bytes(self.runs["off-odd"]["dir"], self.runs["on-odd"]["dir"], "FSDP2 --odd off vs on")
        status, unshards, by_reason = self.zero_copy("on-odd")
        self.assertEqual(status, "on")
        self.assertGreater(unshards, 0)
        # The Shard(1) block: FSDP2's own path for each of its unshards (forward, backward).
        self.assertEqual(dict(by_reason, shard_dim=0), NO_ZERO_COPY_FALLBACK, by_reason)
        self.assertGreaterEqual(by_reason["shard_dim"], 2 * STEPS - 1, by_reason)

    def test_entry_point_of_this_torch_served(self):
        """FSDP2's DefaultAllGather calls all_gather_into_tensor (torch 2.11) or
        all_gather_single (2.15): either way every all-gather is dmagather's."""
        import torch.distributed as dist
        called = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc
        import inspect
        self.assertIn(f"dist.{called}(", inspect.getsource(fc.DefaultAllGather.__call__))
        self.check_served("on", staged=True)

    def test_untested_torch_named_once_and_served_without_zero_copy(self):
        """A torch dmagather does not know: one line on rank 0 names it, the
        entry points are served, FSDP2 takes its own copy-in/out, same bytes."""
        self.check_served("on-untested", staged=True)
        out = self.ok("on-untested")["out"]
        named = [l for l in out.splitlines() if f"torch {UNTESTED} is not a version dmagather was tested with" in l]
        self.assertEqual(len(named), 1, out[-3000:])
        self.assertIn(f"torch {UNTESTED}", start_lines(out)[0])
        status, unshards, _ = self.zero_copy("on-untested")
        self.assertEqual((status, unshards), (f"off: torch {UNTESTED} is not one it supports (2.11, 2.15)", 0))
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["on-untested"]["dir"], "FSDP2 off vs untested torch")

    def test_changed_internals_one_line_and_fallback(self):
        """FSDP2's internals not as tested: one clear line on rank 0, the
        zero-copy path off, every all-gather still served, same bytes."""
        self.check_served("on-changed", staged=True)
        out = self.ok("on-changed")["out"]
        lines = [l for l in out.splitlines() if "zero-copy unshard is off" in l]
        self.assertEqual(len(lines), 1, out[-3000:])
        self.assertIn("_fsdp_param_group", lines[0])
        status, unshards, _ = self.zero_copy("on-changed")
        self.assertTrue(status.startswith("off: FSDP2's internals differ"), status)
        self.assertEqual(unshards, 0)
        self.assert_same_bytes(self.runs["off"]["dir"], self.runs["on-changed"]["dir"], "FSDP2 off vs changed internals")


try:
    import transformers
    HAVE_TRANSFORMERS, WHY_NOT_HF = True, ""
except Exception as e:  # noqa: BLE001
    HAVE_TRANSFORMERS, WHY_NOT_HF = False, f"no transformers in this venv ({e}): the newest venv has it"

HF_ARGS = ["--model", "hf-llama", "--dtype", "bf16"]
HF_RUNS = {"off-hf": ({}, HF_ARGS), "on-hf": ({"DMAGATHER_ALLGATHER": "1"}, HF_ARGS)}


@unittest.skipUnless(HAVE_FSDP2 and HAVE_TRANSFORMERS, WHY if not HAVE_FSDP2 else WHY_NOT_HF)
class Fsdp2HfLlamaTest(Fsdp2Checks):
    """A Hugging Face Llama from a config under unmodified FSDP2, bf16 mixed
    precision: DMAGATHER_ALLGATHER=1 alone, bit-identical, every gather served,
    zero-copy on every unshard after the first."""

    @classmethod
    def setUpClass(cls):
        launch_runs(cls, "dmagather-fsdp2-hf-", HF_RUNS)

    def test_hf_llama_bit_identical_served_zero_copy(self):
        self.assertEqual(self.ok("off-hf")["stats"], {}, "off set something up")
        self.check_served("on-hf", staged=True)
        self.assert_same_bytes(self.runs["off-hf"]["dir"], self.runs["on-hf"]["dir"],
                               f"FSDP2 HF Llama off vs on (transformers {transformers.__version__})")
        status, unshards, by_reason = self.zero_copy("on-hf")
        self.assertEqual(status, "on")
        n = self.ok("on-hf")["stats"][0]["dmagather_ops"]
        self.assertEqual(unshards, n - 1, "every unshard after the first (which sets dmagather up) zero-copy")
        self.assertEqual(by_reason, NO_ZERO_COPY_FALLBACK)


MESH_WORLD = 4
MESH_STEPS = 3
MESH_RUNS = {
    "off-hsdp": ({}, ["--hsdp", "2"]),
    "on-hsdp": ({"DMAGATHER_ALLGATHER": "1"}, ["--hsdp", "2"]),
    "off-tp": ({}, ["--tp", "2"]),
    "on-tp": ({"DMAGATHER_ALLGATHER": "1"}, ["--tp", "2"]),
}
# The groups FSDP2 gathers on, by mesh (global ranks): HSDP's shard groups
# (a 2 x 2 replicate x shard mesh) and FSDP x TP's data-parallel groups (a
# 2 x 2 dp x tp mesh).
MESH_GROUPS = {"hsdp": [[0, 1], [0, 1], [2, 3], [2, 3]], "tp": [[0, 2], [1, 3], [0, 2], [1, 3]]}


@unittest.skipUnless(HAVE_FSDP2, WHY)
class Fsdp2MeshTest(TrainerCase):
    """FSDP2 on 2-D meshes, 4 ranks of one node: every all-gather is on a
    sub-group, which gets a dmagather job of its own at its first gather."""

    @classmethod
    def setUpClass(cls):
        launch_runs(cls, "dmagather-fsdp2-mesh-", MESH_RUNS, MESH_WORLD, MESH_STEPS)

    def check_mesh(self, mesh):
        on = self.ok(f"on-{mesh}")
        self.assert_same_bytes(self.runs[f"off-{mesh}"]["dir"], on["dir"], f"FSDP2 {mesh} off vs on")
        self.assertEqual(self.runs[f"off-{mesh}"]["stats"], {}, "off set something up")
        keys = {}
        for rank, s in on["stats"].items():
            self.assertNotIn("dmagather_ops", s, f"rank {rank}: WORLD was never gathered on, yet set up")
            self.assertEqual(len(s["groups"]), 1, f"rank {rank}: {s['groups']}")
            g = s["groups"][0]
            self.assertEqual(g["ranks"], MESH_GROUPS[mesh][rank], g)
            self.assertEqual(g["fallback_ops"], 0, g)
            self.assertGreaterEqual(g["dmagather_ops"], 2 * 4 * MESH_STEPS, g)
            # zero-copy unshards on the sub-group: every one after the first (which sets the job up)
            self.assertEqual(g["zero_copy_unshards"], g["dmagather_ops"] - 1, g)
            self.assertEqual(g["zero_copy_fallback_by_reason"], NO_ZERO_COPY_FALLBACK, g)
            keys.setdefault(tuple(g["ranks"]), set()).add((g["job_key"], g["dmagather_ops"]))
        self.assertEqual(len(keys), 2, keys)
        jobs = {j["job_key"]: j for j in on["daemon"]["jobs"]}
        for ranks, seen in keys.items():
            self.assertEqual(len(seen), 1, f"group {ranks}: ranks disagree {seen}")
            key, ops = seen.pop()
            self.assertEqual(int(jobs[key]["ops"]), ops, f"group {ranks}: the daemon's count")
            self.assertEqual(jobs[key].get("errors", []), [])
        self.assertEqual(len(start_lines(on["out"])), 1, start_lines(on["out"]))
        self.assertIn("for a group of 2 ranks", start_lines(on["out"])[0])

    def test_hsdp_shard_groups_served_bit_identical(self):
        self.check_mesh("hsdp")

    def test_fsdp_x_tp_dp_groups_served_bit_identical(self):
        self.check_mesh("tp")


# The reduce-scatter (DMAGATHER_REDUCE_SCATTER=1 beside DMAGATHER_ALLGATHER=1):
# FSDP2's gradient reduce-scatter (DefaultReduceScatter: dist.reduce_scatter_tensor
# on torch 2.11, dist.reduce_scatter_single on 2.15), unmodified, with each of
# the ops FSDP2 chooses: AVG (fp32; bf16 gradients), SUM with FSDP2's own
# division after it (set_force_sum_reduction_for_comms), AVG from
# set_gradient_divide_factor(world).
RS_ON = {"DMAGATHER_ALLGATHER": "1", "DMAGATHER_REDUCE_SCATTER": "1"}
# Losses against the run without dmagather (gloo's reduce-scatter): the
# gradient sums differ at most in their last bit (another summation order;
# with two ranks a + b is the same either way), AdamW's update is bounded by
# its learning rate (1e-3) whatever the gradient's scale, so over these few
# steps a loss moves by far less than 1e-3 of itself; a reduction that is
# wrong (a missing rank, a chunk off by one, a doubled or undivided sum)
# moves them by more than that from the first step on.
LOSS_RTOL = 1e-3
RS_RUNS = {
    "off": ({}, []),
    "rs": (RS_ON, []),
    "rs-again": (RS_ON, []),
    "off-sum": ({}, ["--rs-sum"]),
    "rs-sum": (RS_ON, ["--rs-sum"]),
    "off-bf16": ({}, ["--dtype", "bf16", "--reduce-dtype", "bf16"]),
    "rs-bf16": (RS_ON, ["--dtype", "bf16", "--reduce-dtype", "bf16"]),
    "rs-divide": (RS_ON, ["--grad-divide", str(WORLD)]),
}
# FSDP2's reduce-scatters: one per parameter group (3 blocks, the root) per step.
RS_PER_STEP = 4


@unittest.skipUnless(HAVE_FSDP2, WHY)
class Fsdp2ReduceScatterTest(Fsdp2Checks):
    @classmethod
    def setUpClass(cls):
        launch_runs(cls, "dmagather-fsdp2-rs-", RS_RUNS)

    def test_entry_point_of_this_torch_is_what_fsdp2_calls(self):
        import torch.distributed as dist
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc
        import inspect
        called = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
        self.assertIn(f"dist.{called}(", inspect.getsource(fc.DefaultReduceScatter.__call__))

    def test_avg_served_same_bits_every_run_close_to_gloo(self):
        self.check_reduce_scatter_served("rs", WORLD, "avg", RS_PER_STEP * STEPS)
        self.assert_same_bytes(self.runs["rs"]["dir"], self.runs["rs-again"]["dir"], "FSDP2 reduce-scatter run 1 vs 2")
        self.assert_losses_close(self.runs["off"]["dir"], self.runs["rs"]["dir"], LOSS_RTOL, "FSDP2 fp32 AVG vs gloo")
        lines = serves_lines(self.ok("rs")["out"])
        self.assertEqual(len(lines), 1, lines)
        import torch.distributed as dist
        names = ", ".join(n for n in ("reduce_scatter_tensor", "reduce_scatter_single") if hasattr(dist, n))
        self.assertIn(f"dmagather serves {names} (sum, avg) for WORLD on the host backend", lines[0])

    def test_sum_with_fsdp2s_division_served(self):
        self.check_reduce_scatter_served("rs-sum", WORLD, "sum", RS_PER_STEP * STEPS)
        self.assert_losses_close(self.runs["off-sum"]["dir"], self.runs["rs-sum"]["dir"], LOSS_RTOL,
                                 "FSDP2 SUM + division vs gloo")

    def test_bf16_gradients_served(self):
        self.check_reduce_scatter_served("rs-bf16", WORLD, "avg", RS_PER_STEP * STEPS)
        self.assert_losses_close(self.runs["off-bf16"]["dir"], self.runs["rs-bf16"]["dir"], LOSS_RTOL,
                                 "FSDP2 bf16 gradients vs gloo")

    def test_divide_factor_of_the_world_is_avg(self):
        self.check_reduce_scatter_served("rs-divide", WORLD, "avg", RS_PER_STEP * STEPS)
        self.assert_same_bytes(self.runs["rs"]["dir"], self.runs["rs-divide"]["dir"], "AVG vs divide factor 2")

    def test_without_the_variable_nothing_changes(self):
        """DMAGATHER_ALLGATHER=1 alone (the earlier classes' `on` runs): the
        reduce-scatter stays torch's; here `off` set nothing up."""
        self.assertEqual(self.ok("off")["stats"], {})
        self.assertEqual(serves_lines(self.ok("off")["out"]), [])


RS_MESH_RUNS = {
    "off-hsdp": ({}, ["--hsdp", "2"]),
    "rs-hsdp": (RS_ON, ["--hsdp", "2"]),
    "rs-hsdp-again": (RS_ON, ["--hsdp", "2"]),
    "off-1d": ({}, []),
    "rs-1d": (RS_ON, []),
    "rs-1d-again": (RS_ON, []),
}


@unittest.skipUnless(HAVE_FSDP2, WHY)
class Fsdp2ReduceScatterMeshTest(Fsdp2Checks):
    """4 ranks: HSDP (2 x 2), whose reduce-scatters run on the shard groups'
    jobs (the all-reduce over the replicate groups stays gloo's), and a 1-D
    mesh over all 4 ranks (a sum of four chunks: its order matters)."""

    @classmethod
    def setUpClass(cls):
        launch_runs(cls, "dmagather-fsdp2-rs-mesh-", RS_MESH_RUNS, MESH_WORLD, MESH_STEPS)

    def test_hsdp_shard_groups_served(self):
        jobs = self.check_reduce_scatter_served("rs-hsdp", MESH_WORLD, "avg", RS_PER_STEP * MESH_STEPS, group=True)
        self.assertEqual(len(jobs), 2, jobs)
        self.assert_same_bytes(self.runs["rs-hsdp"]["dir"], self.runs["rs-hsdp-again"]["dir"], "HSDP run 1 vs 2")
        self.assert_losses_close(self.runs["off-hsdp"]["dir"], self.runs["rs-hsdp"]["dir"], LOSS_RTOL,
                                 "FSDP2 HSDP vs gloo")
        lines = serves_lines(self.ok("rs-hsdp")["out"])
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("for a group of 2 ranks (0,1) on the host backend", lines[0])

    def test_four_ranks_served_close_to_gloo(self):
        self.check_reduce_scatter_served("rs-1d", MESH_WORLD, "avg", RS_PER_STEP * MESH_STEPS)
        self.assert_same_bytes(self.runs["rs-1d"]["dir"], self.runs["rs-1d-again"]["dir"], "4 ranks run 1 vs 2")
        self.assert_losses_close(self.runs["off-1d"]["dir"], self.runs["rs-1d"]["dir"], LOSS_RTOL,
                                 "FSDP2 4 ranks vs gloo")


if __name__ == "__main__":
    unittest.main()
