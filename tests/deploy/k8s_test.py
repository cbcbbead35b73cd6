"""deploy/k8s: the DaemonSet (scrapeable, updated only on purpose, the pod
settings docs/OPERATIONS.md "Kubernetes" gives) and the training-pod sketch
(what a pod needs to reach the daemon), each checked field by field, and the
two against each other (the same socket directory and path)."""
import unittest

import yaml

DAEMONSET = "deploy/k8s/daemonset.yaml"
TRAINING_POD = "deploy/k8s/training-pod.yaml"


def load(path):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    assert len(docs) == 1, f"{path}: {len(docs)} documents"
    return docs[0]


def flags(container):
    """The container's --name=value arguments as a dict."""
    out = {}
    for a in container.get("args", []):
        assert a.startswith("--"), a
        name, _, value = a[2:].partition("=")
        out[name] = value
    return out


def mount_of(pod_spec, container, mount_path):
    """The hostPath behind the container's mount at mount_path."""
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    name = mounts.get(mount_path)
    if name is None:
        return None
    volume = next(v for v in pod_spec["volumes"] if v["name"] == name)
    return volume.get("hostPath", {}).get("path")


class DaemonSetTest(unittest.TestCase):
    def test_carries_a_multi_node_job(self):
        """The ring listens on the pod's address, from the downward API, on a
        declared port: the other nodes' daemons can reach it."""
        pod = load(DAEMONSET)["spec"]["template"]["spec"]
        c = pod["containers"][0]
        self.assertEqual(flags(c).get("peer_listen"), "$(POD_IP):7411")
        env = {e["name"]: e for e in c.get("env", [])}
        self.assertEqual(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
        self.assertIn({"name": "ring", "containerPort": 7411, "protocol": "TCP"}, c["ports"])

    def setUp(self):
        self.ds = load(DAEMONSET)
        self.template = self.ds["spec"]["template"]
        self.pod = self.template["spec"]
        (self.container,) = self.pod["containers"]
        self.flags = flags(self.container)

    def test_kind_and_update_strategy(self):
        self.assertEqual(self.ds["kind"], "DaemonSet")
        # Replacing a daemon ends its node's jobs: only when the operator deletes the pod.
        self.assertEqual(self.ds["spec"]["updateStrategy"], {"type": "OnDelete"})
        # SIGTERM lets running ops finish (--drain_timeout_s, default 10 s) before the kill.
        drain = float(self.flags.get("drain_timeout_s", "10"))
        self.assertGreater(self.pod["terminationGracePeriodSeconds"], drain)

    def test_metrics_endpoint_is_scrapeable(self):
        host, _, port = self.flags["metrics_listen"].rpartition(":")
        self.assertNotIn(host, ("127.0.0.1", "localhost", "[::1]", ""), "metrics on loopback: no Prometheus reaches it")
        ports = {p["name"]: p for p in self.container["ports"]}
        self.assertEqual(ports["metrics"]["containerPort"], int(port))
        self.assertEqual(ports["metrics"].get("protocol", "TCP"), "TCP")
        ann = self.template["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scrape"], "true")
        self.assertEqual(ann["prometheus.io/port"], port)
        self.assertEqual(ann["prometheus.io/path"], "/metrics")

    def test_pod_settings(self):
        self.assertIs(self.pod["hostPID"], True)
        self.assertIs(self.pod.get("hostIPC", False), False)
        self.assertEqual(self.container["securityContext"]["runAsUser"], 0)
        self.assertNotIn("hostUsers", self.pod)  # The host's uids (SO_PEERCRED) are the jobs' owners.
        self.assertEqual(self.container["resources"]["limits"]["nvidia.com/gpu"], 0)
        env = {e["name"]: e.get("value") for e in self.container["env"]}
        self.assertEqual(env["NVIDIA_VISIBLE_DEVICES"], "all")
        # The socket mode is the daemon's default (0666): not overridden here.
        self.assertIn(self.flags.get("socket_mode", "0666"), ("0666",))

    def test_socket_in_the_host_directory(self):
        sock = self.flags["socket"]
        self.assertEqual(sock, "/run/dmagather/dmagatherd.sock")
        self.assertEqual(mount_of(self.pod, self.container, "/run/dmagather"), "/run/dmagather")
        probe = self.container["readinessProbe"]["exec"]["command"]
        self.assertIn(f"--socket={sock}", probe)
        self.assertEqual(probe[-1], "health")


class TrainingPodTest(unittest.TestCase):
    def setUp(self):
        self.ds_pod = load(DAEMONSET)["spec"]["template"]["spec"]
        self.ds_flags = flags(self.ds_pod["containers"][0])
        self.pod = load(TRAINING_POD)["spec"]
        (self.container,) = self.pod["containers"]

    def test_shares_the_host_pid_namespace_not_ipc(self):
        # cudaMalloc/hipMalloc memory: IPC import across one pid namespace only.
        self.assertIs(self.pod["hostPID"], True)
        self.assertIs(self.pod.get("hostIPC", False), False)

    def test_reaches_the_daemons_socket(self):
        sock = self.ds_flags["socket"]
        sock_dir = sock.rsplit("/", 1)[0]
        env = {e["name"]: e.get("value") for e in self.container["env"]}
        self.assertEqual(env["DMAGATHER_SOCKET"], sock)
        # The same host directory as the daemon's, mounted where the socket path points.
        daemon_host_dir = mount_of(self.ds_pod, self.ds_pod["containers"][0], sock_dir)
        self.assertEqual(mount_of(self.pod, self.container, sock_dir), daemon_host_dir)


if __name__ == "__main__":
    unittest.main()
