"""Simulated nodes on one machine: network namespaces joined by veth pairs to
a bridge in one more namespace (root and iproute2 needed). Node i is
namespace f"{tag}n{i}" with eth0 at 10.211.0.(i+1)/24. Shared by the
multi-node test and bench/multinode/ring_bench.py."""

import subprocess


def sh(*args, check=True, timeout=None):
    return subprocess.run(list(args), check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def node_ns(tag, i):
    return f"{tag}n{i}"


def node_ip(i):
    return f"10.211.0.{i + 1}"


def build(tag, n, created):
    """Makes the bridge and n nodes; appends every namespace made to `created`
    as soon as it exists (so a caller's cleanup removes a partial build)."""
    sw = f"{tag}sw"
    sh("ip", "netns", "add", sw)
    created.append(sw)
    sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", sw, "link", "set", "br0", "up")
    for i in range(n):
        ns = node_ns(tag, i)
        sh("ip", "netns", "add", ns)
        created.append(ns)
        a, b = f"{tag}a{i}", f"{tag}b{i}"
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        sh("ip", "link", "set", a, "netns", sw)
        sh("ip", "link", "set", b, "netns", ns)
        sh("ip", "-n", ns, "link", "set", b, "name", "eth0")
        sh("ip", "-n", ns, "addr", "add", f"{node_ip(i)}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", sw, "link", "set", a, "master", "br0")
        sh("ip", "-n", sw, "link", "set", a, "up")


def destroy(created):
    for ns in reversed(created):
        sh("ip", "netns", "del", ns, check=False)
    created.clear()


def stop(procs):
    """Stops the nodes' processes (SIGTERM, then SIGKILL after 10 s) and empties the list."""
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    procs.clear()
