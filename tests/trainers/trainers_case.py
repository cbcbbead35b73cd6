"""Shared pieces of the trainer tests (tests/trainers/run.sh runs them with the
venv of tools/install_venv.sh): a real dmagatherd (host backend) on a private
socket, its counters through dmagatherctl, and launching rank processes the
way users do (deepspeed / torchrun from the venv) with a clean environment."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("DMAGATHER_BIN", os.path.join(REPO, "bazel-bin"))
VENV_BIN = os.path.dirname(sys.executable)
LIB = os.path.join(BIN, "client", "libdmagather.so")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """dmagatherd (the build's, or `program`) on a private socket, host
    backend; `flags` replace the quiet defaults, `env` the inherited one."""

    def __init__(self, program=None, flags=("--log_level=warning", "--metrics_listen="), env=None):
        self.dir = tempfile.mkdtemp(prefix="dmagather-trainers-", dir="/tmp")
        self.sock = os.path.join(self.dir, "d.sock")
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([program or os.path.join(BIN, "server", "dmagatherd"), f"--socket={self.sock}",
                                      "--backend=host", *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=self.dir)
        for _ in range(1000):
            if os.path.exists(self.sock) and os.path.exists(self.sock + ".fd"):
                break
            time.sleep(0.01)

    def stats(self):
        """dmagatherctl --json stats: node totals (total_ops, fallbacks, errors) and jobs."""
        p = subprocess.run([os.path.join(BIN, "tools", "dmagatherctl"), f"--socket={self.sock}", "--json", "stats"],
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise AssertionError(f"dmagatherctl stats: rc={p.returncode} {p.stderr}")
        return json.loads(p.stdout)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def clean_env(sock=None, **extra):
    """The environment a user's job would have: the venv first on PATH, the
    library and socket, and none of the switches unless given in extra."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMAGATHER_", "DS_SDMA", "MORI_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                                 "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                                                                 "MASTER_PORT")}
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["DMAGATHER_LIB"] = LIB
    if sock:
        env["DMAGATHER_SOCKET"] = sock
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(cmd, env, timeout, log_path, cwd=None):
    """Runs a launcher; returns (rc, output). The output is also kept in log_path."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, cwd=cwd or HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout, start_new_session=True)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += f"\n[timed out after {timeout} s]"
    with open(log_path, "w") as f:
        f.write(out)
    print(f"  ran {os.path.basename(cmd[0])} ... in {time.monotonic() - t0:.0f} s (rc={rc}, log {log_path})",
          file=sys.stderr, flush=True)
    return rc, out


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def rank_stats(pattern, world):
    out = {}
    for r in range(world):
        p = pattern.replace("{rank}", str(r))
        if os.path.exists(p):
            with open(p) as f:
                out[r] = json.load(f)
    return out


def losses(run_dir):
    """Every rank's loss per step (losses.bin: float32, rank after rank)."""
    import array
    a = array.array("f")
    a.frombytes(read_bytes(os.path.join(run_dir, "losses.bin")))
    return list(a)


def serves_lines(out):
    return [l for l in out.splitlines() if "dmagather serves reduce_scatter" in l]


def start_lines(out):
    return [l for l in out.splitlines() if "dmagather allgather enabled" in l or "dmagather allgather unavailable" in l]


class TrainerCase(unittest.TestCase):
    """Runs each configuration of a training script once, in setUpClass, on
    one real daemon; the tests then compare what the runs left."""
    maxDiff = 4000

    @classmethod
    def launch_all(cls, prefix, runs, world, timeout_s):
        """runs: {name: (env switches, cmd(out_dir) -> argv)}. Fills cls.runs."""
        cls.daemon = Daemon()
        cls.dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        cls.runs = {}
        for name, (switches, cmd) in runs.items():
            out = os.path.join(cls.dir, name)
            stats = os.path.join(cls.dir, f"{name}-stats.{{rank}}.json")
            env = clean_env(cls.daemon.sock, DMAGATHER_STATS_FILE=stats, **switches)
            rc, text = run(cmd(out), env, timeout_s, os.path.join(cls.dir, f"{name}.log"))
            cls.runs[name] = {"rc": rc, "out": text, "dir": out, "stats": rank_stats(stats, world),
                              "daemon": cls.daemon.stats()}

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        if os.environ.get("DMAGATHER_KEEP_LOGS") != "1":
            shutil.rmtree(cls.dir, ignore_errors=True)

    def ok(self, name):
        r = self.runs[name]
        self.assertEqual(r["rc"], 0, f"{name} run failed:\n{r['out'][-3000:]}")
        return r

    def assert_same_bytes(self, a_dir, b_dir, what):
        for name in ("losses.bin", "params.bin"):
            a, b = read_bytes(os.path.join(a_dir, name)), read_bytes(os.path.join(b_dir, name))
            self.assertGreater(len(a), 0, f"{a_dir}/{name} is empty")
            self.assertEqual(len(a), len(b), f"{what}: {name} sizes differ")
            if a != b:
                first = next(i for i in range(len(a)) if a[i] != b[i])
                self.fail(f"{what}: {name} differs from byte {first} on")

    def assert_losses_close(self, ref_dir, run_dir, rtol, what):
        """Every rank's loss of every step within rtol (relative) of the
        reference run's; returns the largest relative difference seen."""
        a, b = losses(ref_dir), losses(run_dir)
        self.assertEqual(len(a), len(b), f"{what}: losses.bin sizes differ")
        self.assertGreater(len(a), 0)
        worst = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))
        print(f"  {what}: largest relative loss difference {worst:.3g} over {len(a)} losses "
              f"({'the same bits' if a == b else 'not bit-identical'})", file=sys.stderr, flush=True)
        self.assertLessEqual(worst, rtol, f"{what}: losses {a} vs {b}")
        return worst

    def check_reduce_scatter_served(self, name, world, ops, min_ops, group=False):
        """Every rank of run `name` served its reduce-scatters (WORLD's job, or
        with group=True the one sub-group job of each rank): at least min_ops
        each, all of them with `ops` ("sum" or "avg"), none fallen back, equal
        on the ranks of a job; the daemon counted the job's all-gathers and
        reduce-scatters; rank 0 said what it serves. Returns {job: rs ops}."""
        r = self.ok(name)
        self.assertEqual(sorted(r["stats"]), list(range(world)), f"{name}: ranks without counters")
        per_job = {}
        for rank, top in r["stats"].items():
            s = top["groups"][0] if group else top
            self.assertEqual(s["reduce_scatter"], "on", f"{name} rank {rank}")
            self.assertEqual(s["reduce_scatter_fallback_ops"], 0,
                             f"{name} rank {rank}: {s['reduce_scatter_fallback_by_reason']} "
                             f"({s['reduce_scatter_last_fallback_reason']})")
            n = s["reduce_scatter_ops"]
            self.assertGreaterEqual(n, min_ops, f"{name} rank {rank}: too few reduce-scatters")
            other = "avg" if ops == "sum" else "sum"
            self.assertEqual(s["reduce_scatter_ops_by_op"], {ops: n, other: 0}, f"{name} rank {rank}")
            self.assertEqual(s["fallback_ops"], 0, f"{name} rank {rank}: all-gathers fell back")
            per_job.setdefault(s["job_key"], set()).add((n, s["dmagather_ops"]))
        jobs = {j["job_key"]: j for j in r["daemon"]["jobs"]}
        for key, seen in per_job.items():
            self.assertEqual(len(seen), 1, f"{name}: ranks of job {key} disagree: {seen}")
            rs, ag = next(iter(seen))
            self.assertEqual(int(jobs[key]["ops"]), rs + ag, f"{name}: the daemon's count of job {key}")
            self.assertEqual(jobs[key].get("errors", []), [])
        lines = serves_lines(r["out"])
        self.assertGreaterEqual(len(lines), 1, f"{name}: rank 0 did not say what it serves")
        return {k: next(iter(v))[0] for k, v in per_job.items()}
