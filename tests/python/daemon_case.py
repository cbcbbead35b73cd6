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
