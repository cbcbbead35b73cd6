"""DMAGATHER_ALLGATHER=1 as the only switch (dmagather_autoload.pth, installed
into the venv by tools/install_venv.sh; dmagather/_autoload.py):

- unset (or 0): no dmagather module is imported by any Python process, and
  torch.distributed.all_gather_into_tensor is torch's own; any other value,
  or a misspelled variable (DMAGATHER_ALLGATER), imports nothing either and
  rank 0 says so in one line;
- set: the function is replaced as soon as torch.distributed is imported, and
  nothing else happens (dmagather.torch not imported) until a gather;
- 3 ranks of an unmodified script under torchrun: a subgroup gather before any
  WORLD gather goes to torch and sets nothing up; then the WORLD gathers
  (6 dtypes, async in place) are bit-exact and served by dmagather (every
  rank's counters, the daemon's job ops), the later subgroup gather falls back
  counted as not_world_group; rank 0 prints the one start line, other ranks
  none;
- the daemon unreachable: every rank is told the same, rank 0 prints
  "unavailable (daemon unreachable ...)", results bit-exact through gloo;
- python -m dmagather.check --world 4 in the venv's torch: PASSED.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from trainers_case import Daemon, TrainerCase, clean_env, rank_stats, run, start_lines, HERE, VENV_BIN

PY = sys.executable
# 'patched': every all-gather entry point this torch has (all_gather_into_tensor;
# all_gather_single from 2.15 on) is dmagather's.
PROBE = ("import sys, json, torch.distributed as d; names = [n for n in ('all_gather_into_tensor', "
         "'all_gather_single') if hasattr(d, n)]; print(json.dumps({'mods': sorted(m for m in sys.modules "
         "if m.startswith('dmagather')), 'patched': all(hasattr(getattr(d, n), '_dmagather_original') "
         "for n in names)}))")
WORLD = 3


def probe(env, stderr=None):
    p = subprocess.run([PY, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(p.stderr)
    if stderr is not None:
        stderr.append(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


class AutoloadTest(TrainerCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.dir = tempfile.mkdtemp(prefix="dmagather-autoload-", dir="/tmp")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        if os.environ.get("DMAGATHER_KEEP_LOGS") != "1":
            shutil.rmtree(cls.dir, ignore_errors=True)

    def test_unset_imports_nothing(self):
        for val in (None, "0", "true"):  # only exactly "1" switches it on
            env = clean_env(self.daemon.sock) if val is None else clean_env(self.daemon.sock, DMAGATHER_ALLGATHER=val)
            err = []
            self.assertEqual(probe(env, err), {"mods": [], "patched": False}, f"DMAGATHER_ALLGATHER={val}")
            notes = [l for l in err[0].splitlines() if l.startswith("dmagather:")]
            if val == "true":  # a value it does not act on: one line says so
                self.assertEqual(notes, ["dmagather: DMAGATHER_ALLGATHER=true is not acted on: only 1 switches "
                                         "dmagather on (unset or 0: off); nothing of dmagather is loaded"])
            else:
                self.assertEqual(notes, [], f"DMAGATHER_ALLGATHER={val}")

    def test_a_misspelled_switch_says_so_in_one_line(self):
        err = []
        env = clean_env(self.daemon.sock, DMAGATHER_ALLGATER="1")
        self.assertEqual(probe(env, err), {"mods": [], "patched": False})
        self.assertEqual([l for l in err[0].splitlines() if l.startswith("dmagather:")],
                         ["dmagather: DMAGATHER_ALLGATER is not a dmagather variable (did you mean "
                          "DMAGATHER_ALLGATHER=1?); nothing of dmagather is loaded"])
        err = []
        probe(clean_env(self.daemon.sock, DMAGATHER_ALLGATER="1", RANK="1"), err)
        self.assertEqual([l for l in err[0].splitlines() if l.startswith("dmagather:")], [], "rank 0 alone says it")

    def test_set_patches_at_import_and_sets_nothing_up(self):
        got = probe(clean_env(self.daemon.sock, DMAGATHER_ALLGATHER="1"))
        self.assertTrue(got["patched"])
        self.assertEqual(got["mods"], ["dmagather", "dmagather._autoload", "dmagather._import_hook",
                                       "dmagather._signatures", "dmagather._torch_entry"])

    def launch(self, name, **env_extra):
        out = os.path.join(self.dir, name)
        stats = os.path.join(self.dir, f"{name}-stats.{{rank}}.json")
        env = clean_env(self.daemon.sock, DMAGATHER_STATS_FILE=stats, **env_extra)
        rc, text = run([os.path.join(VENV_BIN, "torchrun"), "--standalone", "--nproc_per_node", str(WORLD),
                        os.path.join(HERE, "ag_script.py"), out], env, 300, os.path.join(self.dir, f"{name}.log"))
        self.assertEqual(rc, 0, text[-3000:])
        res = {}
        for r in range(WORLD):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                res[r] = json.load(f)
        for r, x in res.items():
            self.assertEqual(x["errors"], [], f"rank {r}")
        return text, res, rank_stats(stats, WORLD)

    def test_unmodified_script_served_by_env_alone(self):
        text, res, st = self.launch("served", DMAGATHER_ALLGATHER="1")
        for r in range(WORLD):
            self.assertTrue(res[r]["patched_at_start"])
            # The subgroup's first gather set up a job of its own, on its ranks only.
            self.assertEqual(res[r]["set_up_after_subgroup"], r in (0, 1))
            self.assertTrue(res[r]["set_up_at_end"])
            s = st[r]
            self.assertEqual(s["dmagather_ops"], res[r]["world_ops"], s)
            self.assertEqual(s["staged_ops"], res[r]["world_ops"], s)
            self.assertEqual(s["fallback_ops"], 0, s)
            groups = s["groups"]
            self.assertEqual(len(groups), 1 if r in (0, 1) else 0, s)
            for g in groups:
                self.assertEqual((g["ranks"], g["group_size"], g["group_rank"]), ([0, 1], 2, r), g)
                self.assertEqual((g["dmagather_ops"], g["staged_ops"], g["fallback_ops"]), (2, 2, 0), g)
        self.assertEqual(st[0]["groups"][0]["job_key"], st[1]["groups"][0]["job_key"])
        lines = start_lines(text)
        self.assertEqual(len(lines), 2, lines)
        self.assertIn("dmagather allgather enabled for a group of 2 ranks (0,1) (backend=host", lines[0])
        self.assertIn("dmagather allgather enabled (backend=host", lines[1])
        jobs = self.daemon.stats()["jobs"]
        for key, ops in ((st[0]["job_key"], res[0]["world_ops"]), (st[0]["groups"][0]["job_key"], 2)):
            job = [j for j in jobs if j["job_key"] == key]
            self.assertEqual(len(job), 1, key)
            self.assertEqual(int(job[0]["ops"]), ops)
            self.assertEqual(job[0].get("errors", []), [])

    def test_daemon_unreachable_every_rank_falls_back_alike(self):
        text, res, st = self.launch("nodaemon", DMAGATHER_ALLGATHER="1",
                                    DMAGATHER_SOCKET=os.path.join(self.dir, "absent.sock"),
                                    DMAGATHER_JOIN_TIMEOUT_MS="2000")
        lines = start_lines(text)
        self.assertEqual(len(lines), 2, lines)
        self.assertIn("dmagather allgather unavailable for a group of 2 ranks (0,1) (daemon unreachable on rank(s) "
                      "0,1 ", lines[0])
        self.assertIn("dmagather allgather unavailable (daemon unreachable on rank(s) 0,1,2", lines[1])
        for r in range(WORLD):
            s = st[r]
            self.assertFalse(s["enabled"])
            self.assertEqual(s["dmagather_ops"], 0)
            self.assertEqual(s["fallback_by_reason"]["daemon_unreachable"], res[r]["world_ops"], s)
            # the subgroup's two gathers (ranks 0 and 1) count in its own job's counters
            for g in s["groups"]:
                self.assertEqual((g["enabled"], g["fallback_by_reason"]["daemon_unreachable"]), (False, 2), g)

    def test_check_module(self):
        env = clean_env(self.daemon.sock)
        p = subprocess.run([PY, "-m", "dmagather.check", "--world", "4"], env=env, capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        for dt in ("bfloat16", "float16", "float32"):
            self.assertRegex(p.stdout, rf"{dt}\s+PASSED")


if __name__ == "__main__":
    unittest.main()
