"""Simulated nodes for the launcher tests (tests/trainers/launchers_test.py):
network namespaces joined by a bridge (tests/multinode/netns_bridge.py), and
in each node a view of /run/dmagather of its own, so that every node's daemon
listens at the default socket path, /run/dmagather/dmagatherd.sock, as on a
real cluster, and a rank finds its node's daemon with no DMAGATHER_SOCKET.

Everything that runs "on node i" goes through node_argv(i, argv): `ip netns
exec` (which gives the command a mount namespace of its own), a UTS namespace
whose host name is the node's (`node0`, `node1`; every node's /etc/hosts
resolves them to their addresses), and a bind mount of the node's directory
on /run/dmagather, seen by nothing outside.
"""
import json
import os
import shutil
import subprocess
import sys
import time

from trainers_case import BIN, REPO

sys.path.append(os.path.join(REPO, "tests", "multinode"))  # After this folder: its multinode_test is not ours
import netns_bridge  # noqa: E402

RUN_DIR = "/run/dmagather"
SOCKET = os.path.join(RUN_DIR, "dmagatherd.sock")
RING_PORT = 7411
ETC_NETNS = "/etc/netns"


def netns_error():
    """None where network namespaces and bind mounts can be made, else why not."""
    tag = f"dml{os.getpid() % 10000}"
    try:
        netns_bridge.sh("ip", "netns", "add", tag)
        try:
            netns_bridge.sh("ip", "netns", "exec", tag, "mount", "--bind", "/tmp", "/tmp")
        finally:
            netns_bridge.sh("ip", "netns", "del", tag)
        return None
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        return (getattr(e, "stderr", "") or getattr(e, "stdout", "") or str(e)).strip()


class SimNodes:
    """n nodes, node i named f"node{i}" at netns_bridge.node_ip(i), each with
    a dmagatherd (host backend, --peer_listen on its address) at SOCKET."""

    def __init__(self, tag, n, work_dir):
        self.tag, self.n, self.dir = tag, n, work_dir
        self.created, self.daemons = [], []
        self.node_dirs = [os.path.join(work_dir, f"node{i}-run") for i in range(n)]
        try:
            # The mount point (left in place: another instance may be using it;
            # an empty directory under /run, which a boot clears).
            os.makedirs(RUN_DIR, exist_ok=True)
            netns_bridge.build(tag, n, self.created)
            # Every node's /etc/hosts names the nodes (`ip netns exec` mounts
            # /etc/netns/NS/hosts over /etc/hosts).
            hosts = "127.0.0.1 localhost\n" + "".join(f"{self.ip(i)} {self.name(i)}\n" for i in range(n))
            for i in range(n):
                os.makedirs(os.path.join(ETC_NETNS, self.ns(i)), exist_ok=True)
                with open(os.path.join(ETC_NETNS, self.ns(i), "hosts"), "w") as f:
                    f.write(hosts)
            for i in range(n):
                os.makedirs(self.node_dirs[i])
                log = open(os.path.join(work_dir, f"daemon{i}.log"), "w")
                self.daemons.append(subprocess.Popen(
                    self.node_argv(i, [os.path.join(BIN, "server", "dmagatherd"), f"--socket={SOCKET}",
                                       "--backend=host", f"--peer_listen={netns_bridge.node_ip(i)}:{RING_PORT}",
                                       "--metrics_listen=", "--log_level=warning"]),
                    stdout=log, stderr=subprocess.STDOUT))
            for i in range(n):
                self._wait_socket(i)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def name(i):
        return f"node{i}"

    @staticmethod
    def ip(i):
        return netns_bridge.node_ip(i)

    def ns(self, i):
        return netns_bridge.node_ns(self.tag, i)

    def node_argv(self, i, argv):
        """argv run on node i: its network, its /run/dmagather."""
        return ["ip", "netns", "exec", self.ns(i), "unshare", "--uts", "sh", "-c",
                f'hostname {self.name(i)} && mount --bind "$0" {RUN_DIR} && exec "$@"',
                self.node_dirs[i]] + list(argv)

    def socket(self, i):
        """Node i's daemon socket as seen from outside the nodes."""
        return os.path.join(self.node_dirs[i], os.path.basename(SOCKET))

    def _wait_socket(self, i):
        for _ in range(1000):
            if os.path.exists(self.socket(i)):
                return
            if self.daemons[i].poll() is not None:
                break
            time.sleep(0.01)
        with open(os.path.join(self.dir, f"daemon{i}.log")) as f:
            raise AssertionError(f"daemon of node {i} did not start: {f.read()[-2000:]}")

    def stats(self, i):
        p = subprocess.run([os.path.join(BIN, "tools", "dmagatherctl"), f"--socket={self.socket(i)}", "--json",
                            "stats"], capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise AssertionError(f"dmagatherctl stats (node {i}): {p.stderr}")
        return json.loads(p.stdout)

    def write_ssh(self, bin_dir, home):
        """An `ssh` for the nodes, on PATH in bin_dir: `ssh [options] [user@]nodeI
        COMMAND...` runs COMMAND as sshd would — `bash -c COMMAND` in a fresh
        login environment (HOME, USER, LOGNAME, SHELL, sshd's PATH,
        SSH_CONNECTION), nothing of the caller's — on node I. Only the remote
        shell is replaced: what reaches the remote side is what the caller put
        in the command line."""
        os.makedirs(bin_dir, exist_ok=True)
        cases = "\n".join(f"  {self.name(i)}|{self.ip(i)}) node=({' '.join(self._quote(a) for a in self.node_argv(i, []))}) ;;"
                          for i in range(self.n))
        path = os.path.join(bin_dir, "ssh")
        with open(path, "w") as f:
            f.write(SSH_TEMPLATE.replace("@CASES@", cases).replace("@HOME@", self._quote(home)))
        os.chmod(path, 0o755)
        return path

    @staticmethod
    def _quote(s):
        return "'" + s.replace("'", "'\\''") + "'"

    def close(self):
        netns_bridge.stop(self.daemons)
        netns_bridge.destroy(self.created)
        for i in range(self.n):
            shutil.rmtree(os.path.join(ETC_NETNS, self.ns(i)), ignore_errors=True)
        try:
            os.rmdir(ETC_NETNS)  # only where nothing else is in it
        except OSError:
            pass


SSH_TEMPLATE = r"""#!/bin/bash
# ssh for the simulated nodes (tests/trainers/simnodes.py): the remote shell
# only. Options are read and ignored (there is no connection to make).
set -euo pipefail
while (($#)); do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -[246AaCfGgKkMNnqsTtVvXxYy]*) shift ;;
    -[bcDEeFIiJLlmOopQRSWw]*) shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
host=${1:?ssh: no host}
shift
host=${host#*@}
case "$host" in
@CASES@
  *) echo "ssh: Could not resolve hostname $host: Name or service not known" >&2; exit 255 ;;
esac
cmd="$*"
cd @HOME@
exec "${node[@]}" env -i HOME=@HOME@ USER=root LOGNAME=root SHELL=/bin/bash \
  PATH=/usr/local/bin:/usr/bin:/bin SSH_CONNECTION="10.211.0.254 22 $host 22" \
  /bin/bash -c "$cmd"
"""


class SlurmCluster:
    """A SLURM cluster over the nodes (Debian's slurmctld, slurmd, munge;
    nothing of SLURM changed): munged (its own key and socket), slurmctld on
    node0, one slurmd per node, each started on its node (node_argv). Node i
    is NodeName=node{i} at its address, CPUs=2; the one partition holds them
    all. argv(cmd) runs a SLURM command (srun, sinfo) from node0, the login
    node; env() is the environment it needs (SLURM_CONF)."""

    def __init__(self, nodes, work_dir, cpus=2):
        self.nodes, self.dir = nodes, work_dir
        self.procs, self.munged_pid = [], None
        self.conf = os.path.join(work_dir, "slurm.conf")
        munge_dir = os.path.join(work_dir, "munge")
        self.munge_sock = os.path.join(munge_dir, "munge.sock")
        try:
            # munged runs as its user; its directory must be that user's, and
            # searchable by every client.
            os.makedirs(munge_dir)
            shutil.chown(munge_dir, "munge", "munge")
            os.chmod(munge_dir, 0o711)
            for d in (work_dir, os.path.dirname(work_dir)):
                os.chmod(d, 0o755)
            key = os.path.join(munge_dir, "munge.key")
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
            shutil.chown(key, "munge", "munge")
            os.chmod(key, 0o600)
            r = subprocess.run(["runuser", "-u", "munge", "--", "munged", f"--socket={self.munge_sock}",
                            f"--key-file={key}", f"--pid-file={munge_dir}/munged.pid",
                            f"--log-file={munge_dir}/munged.log", f"--seed-file={munge_dir}/munged.seed"],
                           check=False, capture_output=True, text=True, timeout=30)
            if not os.path.exists(os.path.join(munge_dir, "munged.pid")):
                raise AssertionError(f"munged did not start: {r.stderr}")
            with open(os.path.join(munge_dir, "munged.pid")) as f:
                self.munged_pid = int(f.read().strip())
            for d in ["ctld"] + [f"slurmd-{nodes.name(i)}" for i in range(nodes.n)]:
                os.makedirs(os.path.join(work_dir, d))
            with open(self.conf, "w") as f:
                f.write(SLURM_CONF.format(dir=work_dir, munge=self.munge_sock, ctld=nodes.name(0), ctld_ip=nodes.ip(0)))
                for i in range(nodes.n):
                    f.write(f"NodeName={nodes.name(i)} NodeAddr={nodes.ip(i)} CPUs={cpus} State=UNKNOWN\n")
                f.write(f"PartitionName=main Nodes={','.join(nodes.name(i) for i in range(nodes.n))} Default=YES "
                        "MaxTime=INFINITE State=UP\n")
            self._start(0, "slurmctld", ["slurmctld", "-D", "-i"])
            for i in range(nodes.n):
                # slurmd (22.05) opens its cgroup plugin even with
                # proctrack/linuxproc and task/none, and looks for the named
                # v1 hierarchy `systemd`: mount one, in the node's own mounts.
                self._start(i, f"slurmd-{nodes.name(i)}", [
                    "sh", "-c", "mount -t tmpfs none /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && "
                    "mount -t cgroup -o none,name=systemd none /sys/fs/cgroup/systemd && exec \"$@\"", "sh",
                    "slurmd", "-D", "-N", nodes.name(i)])
            self._wait_idle()
        except BaseException:
            self.close()
            raise

    def env(self, base):
        return dict(base, SLURM_CONF=self.conf)

    def argv(self, cmd):
        return self.nodes.node_argv(0, cmd)

    def _start(self, i, name, cmd):
        log = open(os.path.join(self.dir, f"{name}.out"), "w")
        self.procs.append(subprocess.Popen(self.nodes.node_argv(i, cmd), env=self.env(os.environ), stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def _wait_idle(self, timeout_s=120):
        """Until every node is idle in sinfo (the slurmds registered)."""
        t_end, states = time.monotonic() + timeout_s, ""
        while time.monotonic() < t_end:
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"a SLURM daemon exited (rc={p.returncode}): {self.logs()}")
            r = subprocess.run(self.argv(["sinfo", "-h", "-N", "-o", "%N %T"]), env=self.env(os.environ),
                               capture_output=True, text=True, timeout=60)
            states = r.stdout.strip()
            lines = states.splitlines()
            if len(lines) == self.nodes.n and all(l.split()[-1] == "idle" for l in lines):
                return
            time.sleep(0.5)
        raise AssertionError(f"SLURM nodes not idle after {timeout_s} s: {states!r}\n{self.logs()}")

    def logs(self):
        text = ""
        for name in ["slurmctld"] + [f"slurmd-{self.nodes.name(i)}" for i in range(self.nodes.n)]:
            p = os.path.join(self.dir, f"{name}.out")
            if os.path.exists(p):
                with open(p) as f:
                    text += f"--- {name}\n" + "".join(l for l in f.readlines() if "pmix" not in l)[-1500:]
        return text

    def close(self):
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        self.procs = []
        if self.munged_pid:
            try:
                os.kill(self.munged_pid, 15)
            except ProcessLookupError:
                pass
            self.munged_pid = None


# The cluster's configuration: no accounting, no cgroup enforcement, root
# runs the daemons and the jobs (the test runs as root).
SLURM_CONF = """ClusterName=dmagather
SlurmctldHost={ctld}({ctld_ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge}
StateSaveLocation={dir}/ctld
SlurmdSpoolDir={dir}/slurmd-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
"""
