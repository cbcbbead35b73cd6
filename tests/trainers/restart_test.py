"""Training goes on through daemon restarts: unmodified FSDP2 (torchrun) and
DeepSpeed ZeRO-3 (deepspeed), 2 ranks on CPU, DMAGATHER_ALLGATHER=1 alone,
while dmagatherd is SIGKILLed at random points and started again on the same
socket (as systemd's Restart= does), once stopped with SIGTERM (a planned
restart) and once replaced by another build of the binary (the daemon built
without the GPU toolkits, tools/check_no_cuda_build.sh, where the run
provides it in DMAGATHER_OTHER_DAEMON; else that restart runs the same
binary and the test says so).

Asserted: every rank exits 0; each rank logged that it waited and that it was
back, once per restart that happened mid-run (at least 3); every all-gather
was served by dmagather (0 fallbacks); the last daemon counted the job it
took back; the losses and final parameters are the same bytes as the run
without dmagather and without faults.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest

from trainers_case import BIN, HERE, VENV_BIN, clean_env, free_port, rank_stats, read_bytes, run

try:
    from torch.distributed.fsdp import FSDPModule  # noqa: F401
    HAVE_FSDP2 = hasattr(FSDPModule, "set_custom_all_gather")
except Exception:  # noqa: BLE001
    HAVE_FSDP2 = False
try:
    import deepspeed  # noqa: F401
    HAVE_DS = True
except Exception:  # noqa: BLE001
    HAVE_DS = False

WORLD = 2
KILLS = 5  # SIGKILL, SIGKILL, SIGTERM (planned), SIGKILL with the other build, SIGKILL
RUN_TIMEOUT_S = 900


class RestartingDaemon:
    """dmagatherd on one socket path, killed and started again on it."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="dmagather-restart-", dir="/tmp")
        self.sock = os.path.join(self.dir, "d.sock")
        self.proc = None
        self.starts = 0

    def start(self, binary=None):
        self.starts += 1
        log = open(os.path.join(self.dir, f"daemon-{self.starts}.log"), "w")
        self.proc = subprocess.Popen([binary or os.path.join(BIN, "server", "dmagatherd"), f"--socket={self.sock}",
                                      "--backend=host", "--log_level=info", "--metrics_listen="],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        for _ in range(2000):
            if os.path.exists(self.sock) and os.path.exists(self.sock + ".fd"):
                return
            time.sleep(0.005)
        raise AssertionError(f"dmagatherd did not start (log {self.dir})")

    def stop(self, sig):
        self.proc.send_signal(sig)
        rc = self.proc.wait(30)
        self.proc = None
        return rc

    def stats(self):
        p = subprocess.run([os.path.join(BIN, "tools", "dmagatherctl"), f"--socket={self.sock}", "--json", "stats"],
                           capture_output=True, text=True, timeout=30)
        return json.loads(p.stdout) if p.returncode == 0 else {}

    def close(self):
        if self.proc is not None:
            self.stop(signal.SIGTERM)
        if os.environ.get("DMAGATHER_KEEP_LOGS") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)


class Killer(threading.Thread):
    """Once the job's first ops are served, restarts the daemon KILLS times
    at random moments (0.3-1.2 s apart), after a random delay of 0-0.3 s."""

    def __init__(self, daemon, seed):
        super().__init__(daemon=True)
        self.d, self.rng = daemon, random.Random(seed)
        self.done = threading.Event()
        self.restarts, self.other_build, self.exits = 0, False, []

    def run(self):
        while not self.done.is_set() and self.d.stats().get("total_ops", "0") in ("0", 0):
            time.sleep(0.05)
        other = os.environ.get("DMAGATHER_OTHER_DAEMON")
        for k in range(KILLS):
            if self.done.wait(self.rng.uniform(0.3, 1.2)):
                return
            sig = signal.SIGTERM if k == 2 else signal.SIGKILL
            self.exits.append(self.d.stop(sig))
            time.sleep(self.rng.uniform(0.0, 0.3))  # The supervisor's restart delay.
            use_other = k == 3 and other and os.access(other, os.X_OK)
            self.other_build |= bool(use_other)
            self.d.start(other if use_other else None)
            self.restarts += 1


class RestartTest(unittest.TestCase):
    maxDiff = 4000

    def train(self, name, cmd, faults):
        """Runs `cmd(out)` with DMAGATHER_ALLGATHER=1 (or without, when
        faults is None), restarting the daemon under it when faults."""
        d = RestartingDaemon()
        d.start()
        self.addCleanup(d.close)
        out = os.path.join(d.dir, name)
        stats = os.path.join(d.dir, f"{name}-stats.{{rank}}.json")
        switches = {"DMAGATHER_ALLGATHER": "1"} if faults is not None else {}
        env = clean_env(d.sock, DMAGATHER_STATS_FILE=stats, **switches)
        killer = Killer(d, faults) if faults is not None else None
        if killer:
            killer.start()
        rc, text = run(cmd(out), env, RUN_TIMEOUT_S, os.path.join(d.dir, f"{name}.log"))
        if killer:
            killer.done.set()
            killer.join(60)
        return {"rc": rc, "out": text, "dir": out, "stats": rank_stats(stats, WORLD), "daemon": d.stats(),
                "killer": killer}

    def check(self, off, on):
        self.assertEqual(off["rc"], 0, f"the run without dmagather failed:\n{off['out'][-3000:]}")
        self.assertEqual(on["rc"], 0, f"the run through restarts failed:\n{on['out'][-3000:]}")
        k = on["killer"]
        print(f"  {k.restarts} daemon restarts during the run (other build: {k.other_build}); exits {k.exits}",
              flush=True)
        self.assertGreaterEqual(k.restarts, 3, "fewer than 3 restarts happened while the job ran")
        for r in range(WORLD):
            back = on["out"].count(f"rank {r}: back on dmagatherd")
            waited = on["out"].count(f"dmagather: rank {r}: ") - back
            # A restart after the rank's last op may find it done: at most the last one unseen.
            self.assertGreaterEqual(back, k.restarts - 1, f"rank {r} came back {back} times:\n{on['out'][-3000:]}")
            self.assertEqual(waited, back, f"rank {r}: a wait without its return:\n{on['out'][-3000:]}")
        self.assertEqual(sorted(on["stats"]), list(range(WORLD)), "ranks without counters")
        for r, s in on["stats"].items():
            self.assertGreater(s["dmagather_ops"], 0, f"rank {r} served nothing: {s}")
            self.assertEqual(s["fallback_ops"], 0, f"rank {r} fell back: {s['fallback_by_reason']}")
        self.assertGreaterEqual(int(on["daemon"].get("jobs_taken_over", 0)), 1, on["daemon"])
        for f in ("losses.bin", "params.bin"):
            a, b = read_bytes(os.path.join(off["dir"], f)), read_bytes(os.path.join(on["dir"], f))
            self.assertGreater(len(a), 0)
            self.assertEqual(a, b, f"{f} differs from the run without dmagather")

    @unittest.skipUnless(HAVE_FSDP2, "no FSDP2 with set_custom_all_gather in this torch")
    def test_fsdp2_through_daemon_restarts_bit_identical(self):
        def cmd(out):
            return [os.path.join(VENV_BIN, "torchrun"), "--standalone", "--nproc_per_node", str(WORLD),
                    os.path.join(HERE, "fsdp2_train.py"), "--out", out, "--steps", "100"]
        self.check(self.train("off", cmd, None), self.train("on", cmd, 11))

    @unittest.skipUnless(HAVE_DS, "deepspeed is not importable in this venv")
    def test_zero3_through_daemon_restarts_bit_identical(self):
        def cmd(out):
            return [os.path.join(VENV_BIN, "deepspeed"), "--num_gpus", str(WORLD), "--master_port", str(free_port()),
                    os.path.join(HERE, "zero3_train.py"), "--out", out, "--steps", "60"]
        self.check(self.train("off", cmd, None), self.train("on", cmd, 12))


if __name__ == "__main__":
    unittest.main()
