"""A unittest base class that runs a real dmagatherd (host backend) on a private
socket for the test class: cls.sock is its socket, cls.dir its directory."""
import os
import subprocess
import tempfile
import time
import unittest

RUNFILES = os.getcwd()


class DaemonTestCase(unittest.TestCase):
    DAEMON_PREFIX = "dmagather-py-"

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix=cls.DAEMON_PREFIX, dir="/tmp")
        cls.sock = os.path.join(cls.dir, "d.sock")
        cls.daemon = subprocess.Popen([os.path.join(RUNFILES, "server", "dmagatherd"), f"--socket={cls.sock}",
                                       "--backend=host", "--log_level=warning",
                                       "--metrics_listen="])
        for _ in range(500):
            if os.path.exists(cls.sock):
                break
            time.sleep(0.01)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.terminate()
        cls.daemon.wait(10)

    def collect_ranks(self, procs, q, deadline_s):
        """Starts `procs` (rank processes that put (rank, status, result) on `q`),
        waits at most `deadline_s` for all of them (killing stragglers), asserts
        every rank reported "ok", and returns {rank: result}."""
        import time
        for p in procs:
            p.start()
        results = {}
        deadline = time.monotonic() + deadline_s
        try:
            for _ in procs:
                r, status, res = q.get(timeout=max(1, deadline - time.monotonic()))
                results[r] = (status, res)
        except Exception:  # noqa: BLE001  (queue.Empty)
            pass
        for p in procs:
            p.join(max(1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        world = len(procs)
        self.assertEqual(sorted(results), list(range(world)), f"rank(s) hung or died: {results}")
        for r in range(world):
            self.assertEqual(results[r][0], "ok", f"rank {r}")
        return {r: results[r][1] for r in range(world)}
