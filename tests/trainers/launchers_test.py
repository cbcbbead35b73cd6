"""Launchers as users run them, across two simulated nodes (simnodes.py:
network namespaces, each node's dmagatherd at the default socket
/run/dmagather/dmagatherd.sock of its own, so no rank is told where its daemon
is): how DMAGATHER_ALLGATHER=1 reaches every rank, and what the adapter makes
of what each launcher sets. The script is DeepSpeed ZeRO-3's
(zero3_train.py, --record-env: every rank writes the launcher's variables as
it found them), 2 nodes x 2 ranks.

  DeepSpeedRunnerTest  `deepspeed --hostfile H` (DeepSpeed's multi-node
      runner, its default launcher pdsh, Debian's pdsh); only ssh is replaced,
      by simnodes' (the command line runs in a fresh login environment on the
      node, nothing of the caller's), so the runner's own `export ...;` line
      is all that carries the environment.
      shell:          DMAGATHER_ALLGATHER=1 exported in the launching shell
                      only. DeepSpeed 0.19.8 exports to the nodes the
                      variables named PYTHON*, MLFLOW*, MV2*, UCX* (NCCL* on
                      CUDA) and the lines of .deepspeed_env: no rank has it,
                      nothing is set up (the run without dmagather).
      deepspeed_env:  DMAGATHER_ALLGATHER=1 in .deepspeed_env (what
                      docs/TRAINERS.md says): every rank has it, losses and
                      parameters the same bytes as `shell`, every gather served
                      on the daemons' ring, both daemons counted the job's ops.
      DeepSpeed's launch.py sets LOCAL_SIZE (not LOCAL_WORLD_SIZE); the
      adapter's nodes come from the daemons the ranks reach: 2.

  SlurmSrunTest  SLURM 22.05 from Debian (simnodes.SlurmCluster: slurmctld on
      node0, a slurmd on each node, munged), `srun -N 2 --ntasks-per-node 2
      srun_rank.sh python zero3_train.py` from node0; srun_rank.sh makes
      torch's RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR of SLURM's variables.
      off:  the variable nowhere: nothing set up.
      on:   DMAGATHER_ALLGATHER=1 exported in the submitting shell only:
            srun's default --export=ALL gives it to every rank; the same bytes
            as `off`, every gather served, both daemons counted the job's ops.
      Nothing tells a rank how many ranks share its node; the adapter finds
      2 nodes.

Where network namespaces or mounts cannot be made (no root), the classes are
skipped; a launcher that is not installed fails the test (tests/trainers/run.sh
installs them).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import simnodes
from trainers_case import HERE, LIB, VENV_BIN, clean_env, free_port, rank_stats, read_bytes, start_lines

NODES = 2
PER_NODE = 2
WORLD = NODES * PER_NODE
STEPS = 3
RUN_TIMEOUT_S = 300  # a hang guard; a run takes 30-90 s on 2 cores
NETNS_ERROR = simnodes.netns_error()


def run_launcher(argv, env, cwd, log_path, timeout_s=RUN_TIMEOUT_S):
    """(rc, output) of one launcher; past timeout_s its whole session is killed (124)."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            rc = 124
    with open(log_path) as f:
        out = f.read()
    print(f"  ran {os.path.basename(log_path)[:-4]} in {time.monotonic() - t0:.0f} s (rc={rc})",
          file=sys.stderr, flush=True)
    return rc, out


class LauncherCase(unittest.TestCase):
    """Two simulated nodes with a daemon each; subclasses launch the runs in
    setUpClass (cls.launch_runs) and keep what they left in cls.runs."""
    maxDiff = 4000
    tag_prefix = "dl"

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix=f"dmagather-{cls.tag_prefix}-", dir="/tmp")
        cls.nodes = None
        cls.runs = {}
        try:
            cls.nodes = simnodes.SimNodes(f"{cls.tag_prefix}{os.getpid() % 10000}", NODES, cls.dir)
            cls.launch_runs()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.nodes is not None:
            cls.nodes.close()
            cls.nodes = None
        if os.environ.get("DMAGATHER_KEEP_LOGS") != "1":
            shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def keep(cls, label, rc, out, run_dir, stats_pattern):
        envs = {}
        for r in range(WORLD):
            p = os.path.join(run_dir, f"env.{r}.json")
            if os.path.exists(p):
                with open(p) as f:
                    envs[r] = json.load(f)
        cls.runs[label] = {"rc": rc, "out": out, "dir": run_dir, "envs": envs,
                           "stats": rank_stats(stats_pattern, WORLD),
                           "daemons": [cls.nodes.stats(i) for i in range(NODES)]}

    def ok(self, label):
        """The run succeeded. A launcher whose only failure is a rank aborting
        at interpreter exit (torch's gloo finalization race, docs/TRAINERS.md)
        passes when the run's results were written and no rank raised."""
        r = self.runs[label]
        if r["rc"] != 0:
            exit_abort = ("terminate called without an active exception" in r["out"]
                          and not re.search(r"Traceback", r["out"])
                          and os.path.exists(os.path.join(r["dir"], "summary.json")))
            self.assertTrue(exit_abort, f"{label}: rc={r['rc']}\n{r['out'][-3000:]}")
            print(f"  {label}: rc={r['rc']}, a rank aborted at exit after the run", file=sys.stderr)
        self.assertEqual(sorted(r["envs"]), list(range(WORLD)), f"{label}: ranks that recorded their environment")
        return r

    def assert_not_reached(self, label):
        """No rank had the variable, and nothing of dmagather ran."""
        r = self.ok(label)
        for rank, e in r["envs"].items():
            self.assertIsNone(e["DMAGATHER_ALLGATHER"], f"{label}: rank {rank} has DMAGATHER_ALLGATHER")
        self.assertEqual(r["stats"], {}, f"{label}: dmagather set up without the variable")
        self.assertEqual(start_lines(r["out"]), [])
        for i in range(NODES):
            self.assertEqual(r["daemons"][i].get("jobs", []), [], f"{label}: node {i}'s daemon had a job")
        return r

    def assert_served(self, label, reference):
        """Every rank had the variable; the same bytes as `reference`; every
        gather of every rank served on the two daemons' ring, both daemons
        counted the job's ops with no errors."""
        r = self.ok(label)
        for rank, e in r["envs"].items():
            self.assertEqual(e["DMAGATHER_ALLGATHER"], "1", f"{label}: rank {rank}")
        ref = self.ok(reference)
        for f in ("losses.bin", "params.bin"):
            a, b = read_bytes(os.path.join(ref["dir"], f)), read_bytes(os.path.join(r["dir"], f))
            self.assertGreater(len(a), 0, f)
            self.assertTrue(a == b, f"{label}: {f} differs from {reference}'s")
        self.assertEqual(sorted(r["stats"]), list(range(WORLD)))
        ops = {s["dmagather_ops"] for s in r["stats"].values()}
        self.assertEqual(len(ops), 1, r["stats"])
        n = ops.pop()
        self.assertGreaterEqual(n, STEPS)
        for rank, s in r["stats"].items():
            self.assertEqual(s["fallback_ops"], 0, f"rank {rank}: {s['fallback_by_reason']}")
        lines = start_lines(r["out"])
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("dmagather allgather enabled", lines[0])
        self.assertIn(f"{NODES} nodes", lines[0])
        key = r["stats"][0]["job_key"]
        for i in range(NODES):
            jobs = [j for j in r["daemons"][i]["jobs"] if j["job_key"] == key]
            self.assertEqual(len(jobs), 1, f"node {i}: job {key} not in {r['daemons'][i]['jobs']}")
            self.assertEqual(int(jobs[0]["ops"]), n, f"node {i}")
            self.assertEqual(jobs[0].get("errors", []), [], f"node {i}")
            # The node decision, seen from the daemons: node i's daemon had
            # node i's ranks joined (a pid each) and every other rank on the
            # node it is on, and is node i of the job's ring of NODES.
            where = {int(x.get("rank", 0)): (x.get("state", ""), int(x.get("pid", 0)))
                     for x in jobs[0].get("ranks", [])}
            self.assertEqual(sorted(where), list(range(WORLD)), f"node {i}: {where}")
            for rank, (state, pid) in where.items():
                if rank // PER_NODE == i:
                    self.assertTrue(pid > 0 and not state.startswith("remote"), f"node {i}, rank {rank}: {state}")
                else:
                    self.assertEqual(state, f"remote (node {rank // PER_NODE})", f"node {i}, rank {rank}")
            ring = jobs[0].get("ring", {})
            self.assertEqual((int(ring.get("nodes", 0)), int(ring.get("node", 0))), (NODES, i), f"node {i}: {ring}")
        print(f"  {label}: {n} ops per rank served, both daemons counted {n}, each with its node's "
              f"{PER_NODE} ranks", file=sys.stderr)
        return r


@unittest.skipIf(NETNS_ERROR is not None, f"network namespaces unavailable: {NETNS_ERROR}")
class DeepSpeedRunnerTest(LauncherCase):
    tag_prefix = "dsr"

    @classmethod
    def launch_runs(cls):
        # The runner's home: a fresh one, so no ~/.deepspeed_env of this
        # machine's joins the job's. The nodes' home: this user's (torch's
        # extension cache, DeepSpeed's built CPU op, lives there).
        home = os.path.join(cls.dir, "home")
        os.makedirs(home)
        bin_dir = os.path.join(cls.dir, "bin")
        cls.nodes.write_ssh(bin_dir, os.path.expanduser("~"))
        hostfile = os.path.join(cls.dir, "hostfile")
        with open(hostfile, "w") as f:
            f.write("".join(f"{simnodes.SimNodes.name(i)} slots={PER_NODE}\n" for i in range(NODES)))
        for label, shell, ds_env in (("shell", {"DMAGATHER_ALLGATHER": "1"}, {}),
                                     ("deepspeed_env", {}, {"DMAGATHER_ALLGATHER": "1"})):
            job = os.path.join(cls.dir, label)
            os.makedirs(job)
            stats = os.path.join(cls.dir, f"{label}-stats.{{rank}}.json")
            env = clean_env(None, HOME=home, **shell)
            # The job's .deepspeed_env: the switch (deepspeed_env run) and what
            # this harness needs on every rank: the launching shell's PATH (as
            # the other trainer tests have it: torch's extension build, which
            # DeepSpeed's CPU op caches, depends on it), one thread per rank (4
            # ranks on 2 cores), the checkout's library (a wheel or the Debian
            # package needs none) and the counters' file.
            lines = dict(ds_env, PATH=env["PATH"], OMP_NUM_THREADS="1", DMAGATHER_LIB=LIB,
                         DMAGATHER_STATS_FILE=stats)
            with open(os.path.join(job, ".deepspeed_env"), "w") as f:
                f.write("".join(f"{k}={v}\n" for k, v in lines.items()))
            env["PATH"] = bin_dir + os.pathsep + env["PATH"]
            out = os.path.join(job, "out")
            argv = cls.nodes.node_argv(0, [os.path.join(VENV_BIN, "deepspeed"), "--hostfile", hostfile,
                                           "--master_port", str(free_port()), os.path.join(HERE, "zero3_train.py"),
                                           "--steps", str(STEPS), "--out", out, "--record-env"])
            rc, text = run_launcher(argv, env, job, os.path.join(cls.dir, f"deepspeed-{label}.log"))
            cls.keep(label, rc, text, out, stats)

    def test_shell_variable_does_not_reach_the_nodes(self):
        self.assert_not_reached("shell")

    def test_deepspeed_env_reaches_every_rank_and_is_served(self):
        self.assert_served("deepspeed_env", "shell")

    def test_launch_sets_local_size_and_the_nodes_are_the_daemons(self):
        r = self.ok("deepspeed_env")
        for rank, e in r["envs"].items():
            self.assertEqual((e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_SIZE"], e["CROSS_RANK"],
                              e["CROSS_SIZE"], e["LOCAL_WORLD_SIZE"]),
                             (str(rank), str(rank % PER_NODE), str(WORLD), str(PER_NODE), str(rank // PER_NODE),
                              str(NODES), None), f"rank {rank}: {e}")
            # The master address the runner found itself (`ssh node0 hostname -I`).
            self.assertEqual(e["MASTER_ADDR"], simnodes.SimNodes.ip(0))
            self.assertIsNone(e["DMAGATHER_SOCKET"])
        self.assertIn(f"{NODES} nodes", start_lines(r["out"])[0])


@unittest.skipIf(NETNS_ERROR is not None, f"network namespaces unavailable: {NETNS_ERROR}")
class SlurmSrunTest(LauncherCase):
    tag_prefix = "slr"

    @classmethod
    def launch_runs(cls):
        cls.slurm = simnodes.SlurmCluster(cls.nodes, os.path.join(cls.dir, "slurm"))
        try:
            for label, shell in (("off", {}), ("on", {"DMAGATHER_ALLGATHER": "1"})):
                job = os.path.join(cls.dir, label)
                os.makedirs(job)
                stats = os.path.join(cls.dir, f"{label}-stats.{{rank}}.json")
                env = cls.slurm.env(clean_env(None, DMAGATHER_STATS_FILE=stats, MASTER_PORT=free_port(), **shell))
                out = os.path.join(job, "out")
                argv = cls.slurm.argv(["srun", "-N", str(NODES), f"--ntasks-per-node={PER_NODE}",
                                       "--kill-on-bad-exit=1", os.path.join(HERE, "srun_rank.sh"),
                                       os.path.join(VENV_BIN, "python"), "-u", os.path.join(HERE, "zero3_train.py"),
                                       "--steps", str(STEPS), "--out", out, "--record-env"])
                rc, text = run_launcher(argv, env, job, os.path.join(cls.dir, f"srun-{label}.log"))
                cls.keep(label, rc, text, out, stats)
        finally:
            cls.slurm.close()

    def test_off_sets_nothing_up(self):
        self.assert_not_reached("off")

    def test_srun_passes_the_variable_and_every_gather_is_served(self):
        self.assert_served("on", "off")

    def test_ranks_from_slurm_and_the_nodes_are_the_daemons(self):
        r = self.ok("on")
        for rank, e in r["envs"].items():
            self.assertEqual((e["SLURM_PROCID"], e["SLURM_LOCALID"], e["SLURM_NTASKS"], e["SLURMD_NODENAME"]),
                             (str(rank), str(rank % PER_NODE), str(WORLD), f"node{rank // PER_NODE}"), e)
            self.assertEqual((e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"]),
                             (str(rank), str(rank % PER_NODE), str(WORLD), "node0"), e)
            # Nothing says how many ranks share a node: the adapter counts them
            # by the daemon each reaches.
            self.assertEqual((e["LOCAL_WORLD_SIZE"], e["LOCAL_SIZE"], e["DMAGATHER_SOCKET"]), (None, None, None), e)
        self.assertIn(f"{NODES} nodes", start_lines(r["out"])[0])


if __name__ == "__main__":
    unittest.main()
