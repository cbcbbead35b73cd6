"""Multi-node jobs for real: several nodes on this machine, each a network
namespace joined to the others through veth pairs and a bridge (created and
removed here), each with its own dmagatherd (--peer_listen on its own
address) and its own rank processes (started inside the namespace). Only
traffic between these namespaces can make a test pass.

Where network namespaces cannot be made (no CAP_NET_ADMIN), the nodes are
daemons on 127.0.0.1 with their own ports instead, and the link-cut test is
skipped (it needs a link to cut).
"""
import hashlib
import hmac
import json
import re
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

RUNFILES = os.getcwd()
DAEMON = os.path.join(RUNFILES, "server", "dmagatherd")
CTL = os.path.join(RUNFILES, "tools", "dmagatherctl")
LIB = os.path.join(RUNFILES, "client", "libdmagather.so")
PY = os.path.join(RUNFILES, "client", "python")
RANK = os.path.join(RUNFILES, "tests", "multinode", "mn_rank.py")
PORT = 7411
MAX_NODES = 8


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_bridge  # noqa: E402  (beside this file)
from netns_bridge import sh  # noqa: E402


class Nodes:
    """MAX_NODES namespaces on one bridge (or loopback when that is impossible)."""

    def __init__(self):
        self.tag = f"dmg{os.getpid() % 100000}"
        self.netns = False
        self.created = []
        try:
            self._make()
            self.netns = True
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            self.destroy()
            self.why = (getattr(e, "stderr", "") or str(e)).strip()
            print(f"network namespaces unavailable ({self.why}); nodes on 127.0.0.1")

    def _make(self):
        netns_bridge.build(self.tag, MAX_NODES, self.created)

    def ns(self, i):
        return netns_bridge.node_ns(self.tag, i)

    def address(self, i):
        return f"{netns_bridge.node_ip(i)}:{PORT}" if self.netns else "127.0.0.1:0"

    def prefix(self, i):
        return ["ip", "netns", "exec", self.ns(i)] if self.netns else []

    def link(self, i, up):
        sh("ip", "-n", f"{self.tag}sw", "link", "set", f"{self.tag}a{i}", "up" if up else "down")

    def destroy(self):
        netns_bridge.destroy(self.created)


# The bit-exact runs are about data, not timeouts: a generous op timeout, so
# that 16 ranks and 8 daemons on a loaded 2-core machine (sanitizer builds,
# compiles beside them) are never failed for being slow. The failure tests
# set their own.
SHAPE_OP_TIMEOUT_S = 30
# Ranks that end with their daemon (no waiting for one to take the job back).
NO_WAIT = {"DMAGATHER_RECONNECT_S": "0"}


class Cluster:
    """One dmagatherd per node (fresh for each test)."""

    def __init__(self, nodes, n, op_timeout_s=6, extra=()):
        self.nodes = nodes
        self.dir = tempfile.mkdtemp(prefix="dmagather-mn-", dir="/tmp")
        self.daemons = []
        self.cmds = []
        for i in range(n):
            self.cmds.append(nodes.prefix(i) + [DAEMON, f"--socket={self.sock(i)}", "--backend=host", "--workers=2",
                                                f"--peer_listen={nodes.address(i)}", "--metrics_listen=",
                                                f"--op_timeout_s={op_timeout_s}", "--peer_links=2",
                                                "--ring_chunk_kib=256", *extra])
            with open(os.path.join(self.dir, f"d{i}.log"), "w") as log:
                self.daemons.append(subprocess.Popen(self.cmds[i], stdout=log, stderr=subprocess.STDOUT))
        for i in range(n):
            self.wait_socket(i)

    def wait_socket(self, i):
        for _ in range(1000):
            if os.path.exists(self.sock(i)):
                break
            time.sleep(0.01)
        assert os.path.exists(self.sock(i)), self.log(i)

    def restart(self, i):
        """Node i's daemon again, as its supervisor would start it (same
        socket, same peer address); its log goes on in the same file."""
        if os.path.exists(self.sock(i)):
            os.unlink(self.sock(i))  # The dead daemon's; the test waits for the new one's.
        with open(os.path.join(self.dir, f"d{i}.log"), "a") as log:
            self.daemons[i] = subprocess.Popen(self.cmds[i], stdout=log, stderr=subprocess.STDOUT)
        self.wait_socket(i)

    def sock(self, i):
        return os.path.join(self.dir, f"n{i}.sock")

    def log(self, i):
        with open(os.path.join(self.dir, f"d{i}.log")) as f:
            return f.read()

    def job_id(self, node=0):
        import sys
        sys.path.insert(0, PY)
        import dmagather
        return dmagather.job_id_create(self.sock(node), lib=LIB)

    def start_ranks(self, placement, key, scenario, arg=None, job_id=None, env=None, only=None):
        """placement[r] = node of rank r. Returns the processes (by rank; only
        the ranks in `only` when given)."""
        job_id = job_id or self.job_id(placement[0])
        world = len(placement)
        e = dict(os.environ, DMAGATHER_PY=PY, DMAGATHER_LIB=LIB, **(env or {}))
        procs = []
        for r, node in enumerate(placement):
            if only is not None and r not in only:
                continue
            cmd = self.nodes.prefix(node) + ["/usr/bin/python3", RANK, self.sock(node), job_id, key, str(world),
                                             str(r), scenario] + ([str(arg)] if arg is not None else [])
            procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        return procs

    @staticmethod
    def results(procs, timeout):
        out = {}
        deadline = time.monotonic() + timeout
        for r, p in enumerate(procs):
            try:
                stdout, stderr = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
                out[r] = {"hung": True, "stderr": stderr[-2000:]}
                continue
            lines = [l for l in getattr(p, "early_lines", []) + stdout.splitlines() if l.startswith("RESULT ")]
            out[r] = json.loads(lines[-1][7:]) if lines else {"crashed": p.returncode, "stderr": stderr[-2000:]}
            if out[r].get("code", 0) != 0 or out[r].get("join", 0) != 0:
                out[r].setdefault("stderr", stderr[-2000:])  # The client's own lines, for a failure's story.
        return out

    def run(self, placement, key, scenario, arg=None, timeout=120, **kw):
        return self.results(self.start_ranks(placement, key, scenario, arg, **kw), timeout)

    def ctl(self, i, *args):
        r = sh(CTL, f"--socket={self.sock(i)}", "--json", *args)
        return json.loads(r.stdout)

    def stop(self, name):
        for p in self.daemons:
            if p.poll() is None:
                p.terminate()
        for p in self.daemons:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        keep = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")  # Daemon logs, for a failed run.
        if keep:
            for i in range(len(self.daemons)):
                shutil.copy(os.path.join(self.dir, f"d{i}.log"), os.path.join(keep, f"{name}-daemon{i}.log"))
        shutil.rmtree(self.dir, ignore_errors=True)


class MultiNodeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.nodes = Nodes()

    @classmethod
    def tearDownClass(cls):
        cls.nodes.destroy()

    def setUp(self):
        self.cluster = None

    def tearDown(self):
        if self.cluster is not None:
            self.cluster.stop(self._testMethodName)

    def start(self, n, **kw):
        self.cluster = Cluster(self.nodes, n, **kw)
        return self.cluster

    def assertAllOk(self, res, world):
        self.assertEqual(sorted(res), list(range(world)))
        for r in range(world):
            self.assertEqual(res[r].get("join"), 0, f"rank {r}: {res[r]}")

    def test_bit_exact_every_shape(self):
        """2, 3, 4 and 8 nodes x 1-4 ranks, contiguous, interleaved and uneven
        placements: every dtype, odd sizes, in/out of place, list, coalesced."""
        c = self.start(MAX_NODES, op_timeout_s=SHAPE_OP_TIMEOUT_S)
        layouts = {
            "2x1": [0, 1],
            "2x4": [0, 0, 0, 0, 1, 1, 1, 1],
            "4x3-interleaved": [r % 4 for r in range(12)],
            "8x1": list(range(8)),
            "8x2-interleaved": [r % 8 for r in range(16)],
            "3-uneven-1-3-2": [2, 1, 1, 0, 1, 2],
        }
        for name, placement in layouts.items():
            with self.subTest(layout=name):
                t0 = time.monotonic()
                res = c.run(placement, f"shape-{name}", "matrix", timeout=240)
                self.assertAllOk(res, len(placement))
                for r in range(len(placement)):
                    self.assertGreater(res[r].get("checked", 0), 40, f"rank {r}: {res[r]}")
                print(f"{name}: {len(placement)} ranks on {len(set(placement))} nodes bit-exact "
                      f"({res[0]['checked']} ops per rank) in {time.monotonic() - t0:.1f} s")

    def test_staged_ring(self):
        """The GPU backends' ring path (land in pinned host staging, copy into
        every local output; own chunks copied out of rank memory before they
        are sent), forced on the host backend: bit-exact; an op over the
        transit budget is FALLBACK on every rank of every node."""
        c = self.start(3, op_timeout_s=SHAPE_OP_TIMEOUT_S, extra=("--ring_staging=always", "--ring_transit_mib=64"))
        for name, placement in {"2x3": [0, 0, 0, 1, 1, 1], "3-uneven-1-3-2": [2, 1, 1, 0, 1, 2]}.items():
            with self.subTest(layout=name):
                res = c.run(placement, f"staged-{name}", "matrix", timeout=240)
                self.assertAllOk(res, len(placement))
                for r in range(len(placement)):
                    self.assertGreater(res[r].get("checked", 0), 40, f"rank {r}: {res[r]}")
        # 4 ranks x 16 MiB float32 shards: 256 MiB of output per op, over the 64 MiB budget.
        res = c.run([0, 1, 2, 0], "staged-over", "loop", 5)
        for r in range(4):
            self.assertEqual(res[r].get("code"), 1, res[r])  # FALLBACK everywhere
            self.assertIn("ring_transit_mib", res[r]["message"])

    def test_disagreement_and_fallback_reach_every_node(self):
        c = self.start(2)
        res = c.run([0, 1, 0, 1], "disagree", "disagree")
        self.assertAllOk(res, 4)
        for r in range(4):
            self.assertEqual(res[r]["first"]["code"], 2, res[r])  # INVALID_ARGUMENT everywhere
            self.assertIn("disagree", res[r]["first"]["message"])
            self.assertTrue(res[r]["next_ok"], res[r])
        res = c.run([0, 1, 0, 1], "fallback", "fallback")
        self.assertAllOk(res, 4)
        for r in range(4):
            self.assertEqual(res[r]["first"]["code"], 1, res[r])  # FALLBACK everywhere, with rank 3's reason
            self.assertIn("rank 3 has no such tensor", res[r]["first"]["message"])
            self.assertTrue(res[r]["next_ok"], res[r])

    def test_daemon_killed_mid_op(self):
        # The op timeout (30 s) is far beyond what detection may take: a rank
        # that learns of the death by its op timing out fails the test, and a
        # slow first op on a loaded machine is not mistaken for it.
        # Ranks that do not wait for a daemon to come back (the waiting ones:
        # test_daemon_restarted_mid_run).
        c, res, killed_at = self.kill_node2_mid_run([0, 1, 2, 0, 1, 2], "victim", "loop", 60, NO_WAIT)
        for r in range(6):
            self.assertNotEqual(res[r].get("code", 0), 0, f"rank {r}: {res[r]}")
            # PEER_FAILED (not TIMEOUT at the 30 s op timeout) is the proof it
            # was noticed; how fast is printed below, not asserted.
            if r % 3 == 2:
                self.assertEqual(res[r]["code"], 3, res[r])  # Its own daemon is gone: UNAVAILABLE.
            else:
                self.assertEqual(res[r]["code"], 4, res[r])  # PEER_FAILED naming the dead node.
                self.assertRegex(res[r]["message"], r"^node 2 \(.*\) failed", res[r])
        print("daemon of node 2 killed: " + "; ".join(
            f"rank {r} {res[r]['code']} after {res[r]['failed_at'] - killed_at:.2f} s" for r in range(6)))
        # The surviving daemons keep serving: a new job on nodes 0 and 1.
        res = c.run([0, 1, 1, 0], "after-kill", "matrix", timeout=240)
        self.assertAllOk(res, 4)

    def test_daemon_killed_during_setup(self):
        # Nodes 0 and 1 wait in Join for the job's table; node 2 has reported
        # one of its two ranks to the coordinator (node 0) and its daemon dies.
        # Every waiting rank must fail PEER_FAILED naming node 2, long before
        # the 120 s join timeout.
        if not self.nodes.netns:
            self.skipTest(f"needs network namespaces ({self.nodes.why})")
        c = self.start(3)
        job_id = c.job_id(0)
        procs = c.start_ranks([0, 1, 2, 2], "setup-victim", "loop", 10, job_id=job_id, only={0, 1, 2},
                              env={"MN_JOIN_TIMEOUT_MS": "120000"})
        # Nodes 1 and 2 have reported to the coordinator (node 0 reports to
        # itself): all three are waiting for the table when node 2 dies.
        node1, node2 = self.nodes.address(1), self.nodes.address(2)
        deadline = time.monotonic() + 120
        while not all(f"{n} reported" in c.log(0) for n in (node1, node2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        for n in (node1, node2):
            self.assertIn(f"{n} reported", c.log(0), f"{n} never reported to the coordinator")
        c.daemons[2].kill()
        res = Cluster.results(procs, 100)
        for r in (0, 1):
            self.assertNotIn("hung", res[r], f"rank {r} hung")
            self.assertEqual(res[r].get("join"), 4, f"rank {r}: {res[r]}")  # PEER_FAILED, not the join timeout
            self.assertRegex(res[r]["message"], r"node .*" + re.escape(node2) + r" failed", res[r])
        print("daemon of node 2 killed during the setup: " + "; ".join(
            f"rank {r} {res[r].get('join')} after {res[r].get('join_s', 0):.2f} s in Join" for r in (0, 1)))
        # The surviving daemons keep serving: a new job on nodes 0 and 1.
        res = c.run([0, 1], "after-setup-kill", "matrix", timeout=240)
        self.assertAllOk(res, 2)

    def test_daemon_restarted_mid_run(self):
        """Issue: a node's daemon restarted under a running multi-node job.
        Node 1's daemon (SIGKILL, restarted 0.5 s later), then node 0's (the
        job's coordinator), then node 2's twice, the second time just after
        its new daemon told the coordinator its ranks were back, before the
        ring formed again (the setup starts over): the surviving daemons hand the job
        back to their ranks, every rank joins again, the ring forms again and
        starts after the newest op done anywhere. Every op of every rank ends
        once, checked byte by byte (each op's inputs differ)."""
        if not self.nodes.netns:
            self.skipTest(f"needs network namespaces ({self.nodes.why}): a restarted daemon must keep its address")
        c = self.start(3, op_timeout_s=SHAPE_OP_TIMEOUT_S)
        ops = 1500
        procs = c.start_ranks([0, 1, 2, 0, 1, 2], "restart", "verify", ops)
        self.wait_first_ops(procs)
        node2 = self.nodes.address(2)
        for victim in (1, 0, 2):
            time.sleep(1.0)
            self.assertTrue(all(p.poll() is None for p in procs), "the job ended before the kills")
            c.daemons[victim].kill()
            c.daemons[victim].wait()
            time.sleep(0.5)
            reports = c.log(0).count(f"{node2} reported")
            c.restart(victim)
        # Node 2 again, the moment its new daemon has reported its ranks back
        # to the coordinator (node 0), before the ring formed again: the
        # setup starts over on every node.
        deadline = time.monotonic() + 30
        while c.log(0).count(f"{node2} reported") == reports and time.monotonic() < deadline:
            time.sleep(0.002)
        self.assertGreater(c.log(0).count(f"{node2} reported"), reports, "node 2's daemon never reported")
        c.daemons[2].kill()
        c.daemons[2].wait()
        time.sleep(0.5)
        c.restart(2)
        res = Cluster.results(procs, 300)
        failed = {r: res[r] for r in range(6) if res[r].get("code") != 0}
        self.assertEqual(failed, {}, "ranks that did not go on")
        for r in range(6):
            self.assertEqual(res[r]["ops"], ops, res[r])
            self.assertEqual(res[r]["bad"], 0, res[r])
        for i in (0, 1):  # Node 2's daemon counts only what it took back.
            st = c.ctl(i, "stats")
            self.assertGreaterEqual(int(st.get("ranks_resumed", 0)), 4, f"node {i}: {st}")
        print("four daemon kills under the job (nodes 1, 0, 2, 2): " + "; ".join(
            f"rank {r}: {res[r]['ops']} ops, longest wait {res[r]['max_wait_s']:.2f} s" for r in range(6)))

    def test_daemon_that_does_not_come_back(self):
        """Node 2's daemon killed and not restarted, ranks waiting 3 s
        (DMAGATHER_RECONNECT_S=3): the other nodes' ranks fail PEER_FAILED
        saying the ring did not form again, node 2's UNAVAILABLE after their
        grace period; nobody hangs."""
        if not self.nodes.netns:
            self.skipTest(f"needs network namespaces ({self.nodes.why})")
        _, res, killed_at = self.kill_node2_mid_run([0, 1, 2], "gone", "verify", 100000,
                                                    {"DMAGATHER_RECONNECT_S": "3"})
        for r in range(3):
            self.assertEqual(res[r]["bad"], 0, res[r])
        for r in (0, 1):
            self.assertEqual(res[r].get("code"), 4, f"rank {r}: {res[r]}")  # PEER_FAILED
            self.assertIn("did not form again", res[r]["message"], res[r])
        self.assertEqual(res[2].get("code"), 3, res[2])  # UNAVAILABLE: its daemon is gone
        self.assertIn("within 3 s", res[2]["message"], res[2])
        print("node 2's daemon not back: " + "; ".join(
            f"rank {r} {res[r]['code']} after {res[r]['failed_at'] - killed_at:.2f} s" for r in range(3)))

    def test_link_cut_mid_op(self):
        if not self.nodes.netns:
            self.skipTest(f"needs network namespaces ({self.nodes.why})")
        # No FIN reaches anyone: the ring's heartbeats (--peer_timeout_ms, 5 s by
        # default) must find the silent node, well before the 30 s op timeout.
        c = self.start(3, op_timeout_s=SHAPE_OP_TIMEOUT_S)
        procs = c.start_ranks([0, 1, 2], "cut", "loop", 60, env=NO_WAIT)
        self.wait_first_ops(procs)
        self.nodes.link(1, up=False)
        cut_at = time.time()
        try:
            res = Cluster.results(procs, 60)
        finally:
            self.nodes.link(1, up=True)
        for r in range(3):
            self.assertNotIn("hung", res[r], f"rank {r} hung")
            self.assertEqual(res[r].get("code"), 4, f"rank {r}: {res[r]}")  # PEER_FAILED, not TIMEOUT
            # Nodes 0 and 2 blame the cut-off node; node 1 one of its neighbours.
            self.assertRegex(res[r]["message"], r"^node 1 \(" if r != 1 else r"^node [02] \(", res[r])
        print("node 1's link cut: " + "; ".join(
            f"rank {r} {res[r]['code']} after {res[r]['failed_at'] - cut_at:.2f} s: {res[r]['message'][:120]}"
            for r in range(3)))

    def test_wrong_secret_is_refused(self):
        c = self.start(2)
        real = c.job_id(0)
        prefix, secret_hex, address = real.split("/", 2)
        # A rank with a forged id (right coordinator, another secret): its
        # daemon cannot join the job; the job's ranks time out cleanly.
        forged = f"{prefix}/{'0' * 32 if secret_hex != '0' * 32 else '1' * 32}/{address}"
        env = {"MN_JOIN_TIMEOUT_MS": "4000"}
        p0 = c.start_ranks([0, 1], "forged", "join", job_id=real, env=env, only=[0])
        p1 = c.start_ranks([0, 1], "forged", "join", job_id=forged, env=env, only=[1])
        res0, res1 = Cluster.results(p0, 30)[0], Cluster.results(p1, 30)[0]
        self.assertNotEqual(res0.get("join"), 0, res0)
        self.assertNotEqual(res1.get("join"), 0, res1)
        # A connection that knows the job's tag but not its secret is refused
        # while the job bootstraps, and the job then runs undisturbed.
        job = c.job_id(0)
        secret = bytes.fromhex(job.split("/")[1])
        procs = c.start_ranks([0, 1], "guarded", "matrix", job_id=job, env={"MN_JOIN_TIMEOUT_MS": "30000"},
                              only=[0])
        for _ in range(100):  # Until rank 0 has joined its daemon (the job is known there).
            answer = self.inject(c, 0, secret)
            if b"no rank of that job" not in answer:
                break
            time.sleep(0.1)
        self.assertIn(b"authentication failed", answer)
        procs += c.start_ranks([0, 1], "guarded", "matrix", job_id=job, env={"MN_JOIN_TIMEOUT_MS": "30000"},
                               only=[1])
        res = Cluster.results(procs, 240)
        self.assertAllOk(res, 2)
        health = c.ctl(0, "health")
        self.assertGreaterEqual(int(health.get("peer_auth_failures", 0)), 1, health)

    def inject(self, c, node, secret):
        """A peer hello with the job's tag and a wrong proof; returns the reply bytes."""
        host, port = (f"10.211.0.{node + 1}", PORT) if self.nodes.netns else (None, None)
        if host is None:
            log = c.log(node)
            port = int(log.split("peer listener on 127.0.0.1:")[1].split()[0])
            host = "127.0.0.1"
        tag = hmac.new(secret, b"tag||", hashlib.sha256).digest()[:16]

        def field(num, value):
            if isinstance(value, int):
                return bytes([num << 3]) + bytes([value])
            return bytes([num << 3 | 2, len(value)]) + value

        hello = field(1, 2) + field(2, b"ring") + field(3, tag) + field(4, os.urandom(32)) + field(5, os.urandom(32))
        cmd = self.nodes.prefix((node + 1) % 2) + ["/usr/bin/python3", "-c", (
            "import socket,struct,sys\n"
            f"s=socket.create_connection(('{host}',{port}),timeout=5)\n"
            "n=b''\n"
            "while len(n)<32: n+=s.recv(32-len(n))\n"
            f"h=bytes.fromhex('{hello.hex()}')\n"
            "s.sendall(struct.pack('<I',len(h))+h)\n"
            "data=b''\n"
            "while True:\n"
            "  x=s.recv(4096)\n"
            "  if not x: break\n"
            "  data+=x\n"
            "sys.stdout.write(data.hex())\n")]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=20).stdout
        return bytes.fromhex(out.strip())

    def test_telemetry_shows_the_ring(self):
        c = self.start(2)
        res = c.run([0, 1], "telemetry", "matrix", timeout=240)
        self.assertAllOk(res, 2)
        health = c.ctl(0, "health")
        self.assertEqual(health.get("transport"), "tcp", health)
        self.assertIn("no RDMA device", health.get("transport_reason", ""))
        stats = c.ctl(1, "stats")
        jobs = [j for j in stats.get("jobs", []) if j.get("job_key") == "telemetry"]
        self.assertTrue(jobs, stats)
        ring = jobs[0].get("ring", {})
        self.assertEqual(ring.get("nodes"), 2, ring)
        self.assertGreater(int(ring.get("bytes_received", 0)), 4 << 20, ring)
        self.assertGreater(int(ring.get("bytes_sent", 0)), 4 << 20, ring)
        self.assertEqual(ring.get("transport"), "tcp")

    def kill_node2_mid_run(self, placement, key, scenario, arg, env):
        """Three nodes; once every rank has completed an op, node 2's daemon is
        SIGKILLed and not started again. (cluster, results, when it was
        killed); no rank may hang."""
        c = self.start(3, op_timeout_s=SHAPE_OP_TIMEOUT_S)
        procs = c.start_ranks(placement, key, scenario, arg, env=env)
        self.wait_first_ops(procs)
        c.daemons[2].kill()
        killed_at = time.time()
        res = Cluster.results(procs, 60)
        for r in range(len(placement)):
            self.assertNotIn("hung", res[r], f"rank {r} hung")
        return c, res, killed_at

    def wait_first_ops(self, procs, timeout=60):
        """Until every rank has completed one op. A rank that ends first (its
        first op failed) fails the test here: what follows is about a failure
        that happens mid-op, after the ring carried a whole op."""
        deadline = time.monotonic() + timeout
        for p in procs:
            p.early_lines = []  # Kept for results().
            p.first_op_done = False
            while time.monotonic() < deadline:
                line = p.stdout.readline()
                if not line:
                    break
                if line.startswith("FIRST_OP_DONE"):
                    p.first_op_done = True
                    break
                p.early_lines.append(line.rstrip("\n"))
        if not all(p.first_op_done for p in procs):
            res = Cluster.results(procs, 30)
            self.fail("a rank ended before its first op completed: " +
                      "; ".join(f"rank {r}: {res[r]}" for r in sorted(res)))


if __name__ == "__main__":
    unittest.main()
