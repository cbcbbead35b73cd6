"""The multi-node benchmark (run by ring_bench.sh, which builds and installs
what it needs; needs root for the network namespaces).

Nodes are network namespaces on one bridge (veth pairs, 10.211.0.N/24, as in
tests/multinode). For each node count it starts one dmagatherd per node and
runs alternated rounds of
  (a) dmagather AllGather across the nodes (bench/multinode/ring_ops, every
      result checked bit-exact), then the daemons' per-job ring telemetry,
  (b) Open MPI MPI_Allgather over TCP across the same namespaces (mpirun in
      node 0's namespace, the other nodes' orted started through an rsh agent
      that enters their namespace; btl tcp,self on eth0; every result checked),
  (c) the veth line rate: iperf3 node 0 -> node 1 alone ("pair"), then every
      ring link i -> i+1 at once ("ring": what the ring's links get together
      on this machine's cores),
then a chunk-size sweep (--ring_chunk_kib) for the per-chunk cost.
Writes results/multinode_ring.csv, results/multinode_ring_chunks.csv,
results/multinode_ring.png and results/multinode_ring_raw.json.
"""
import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, "bazel-bin")
DAEMON = os.path.join(BIN, "server", "dmagatherd")
CTL = os.path.join(BIN, "tools", "dmagatherctl")
RING_OPS = os.path.join(BIN, "bench", "multinode", "ring_ops")
MPI_BENCH = os.path.join(BIN, "bench", "mpi_allgather")
PORT = 7411
t_start = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - t_start:6.1f} s] {msg}", file=sys.stderr, flush=True)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "multinode"))
import netns_bridge  # noqa: E402
from netns_bridge import sh  # noqa: E402


def uptime():
    return sh("uptime").stdout.strip()


class Nodes:
    """`n` namespaces on one bridge; removed by destroy() (also on signals)."""

    def __init__(self, n, tag):
        self.tag, self.n, self.created = tag, n, []
        netns_bridge.build(tag, n, self.created)

    def ns(self, i):
        return netns_bridge.node_ns(self.tag, i)

    @staticmethod
    def ip(i):
        return netns_bridge.node_ip(i)

    def prefix(self, i):
        return ["ip", "netns", "exec", self.ns(i)]

    def destroy(self):
        netns_bridge.destroy(self.created)


class Daemons:
    def __init__(self, nodes, n, workdir, links, chunk_kib):
        self.nodes, self.n, self.dir = nodes, n, workdir
        self.procs = []
        for i in range(n):
            try:
                os.unlink(self.sock(i))
            except FileNotFoundError:
                pass
            logf = open(os.path.join(workdir, f"d{i}.log"), "a")
            self.procs.append(subprocess.Popen(
                nodes.prefix(i) + [DAEMON, f"--socket={self.sock(i)}", "--backend=host", "--metrics_listen=",
                                   f"--peer_listen={nodes.ip(i)}:{PORT}", f"--peer_links={links}",
                                   f"--ring_chunk_kib={chunk_kib}", "--log_level=" + os.environ.get("RB_LOG_LEVEL", "warning")],
                stdout=logf, stderr=subprocess.STDOUT))
        for i in range(n):
            for _ in range(500):
                if os.path.exists(self.sock(i)):
                    break
                time.sleep(0.02)
            if not os.path.exists(self.sock(i)):
                raise RuntimeError(f"daemon {i} did not start: {open(os.path.join(workdir, f'd{i}.log')).read()}")

    def sock(self, i):
        return os.path.join(self.dir, f"n{i}.sock")

    def ring_stats(self, i, key):
        out = sh(CTL, f"--socket={self.sock(i)}", "--json", "stats", f"--job={key}").stdout
        for j in json.loads(out).get("jobs", []):
            if j.get("job_key") == key:
                return j
        return None

    def check_alive(self):
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                raise RuntimeError(f"daemon of node {i} (pid {p.pid}) exited with {p.returncode} during the run"
                                   f" (negative: killed by that signal)")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def read_csv(text):
    lines = [l for l in text.splitlines() if l and "," in l]
    return list(csv.DictReader(lines))


def run_dmagather(d, nodes, n, rpn, sizes, budget, key):
    socks = ",".join(d.sock(i) for i in range(n))
    nss = ",".join(nodes.ns(i) for i in range(n))
    r = sh(RING_OPS, f"--sockets={socks}", f"--netns={nss}", f"--ranks_per_node={rpn}",
           f"--sizes_kib={','.join(map(str, sizes))}", f"--budget_mib={budget}", f"--key={key}", check=False,
           timeout=900)
    if r.returncode != 0:
        d.check_alive()
        raise RuntimeError(f"ring_ops failed: {r.stderr[-3000:]}")
    rows = read_csv(r.stdout)
    for row in rows:
        # Per node: the job's ring telemetry and the daemon's per-op latency.
        row["stats"] = [d.ring_stats(i, row["job_key"]) for i in range(n)]
    return rows


def run_mpi(nodes, n, rpn, sizes, budget, agent, workdir, yield_idle):
    hosts = ",".join(f"{nodes.ip(i)}:{rpn}" for i in range(n))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               RING_BENCH_NS_PREFIX=f"{nodes.tag}n", TMPDIR=workdir)
    cmd = nodes.prefix(0) + [
        "mpirun", "--allow-run-as-root", "-np", str(n * rpn), "--host", hosts, "--map-by", "node" if rpn == 1 else "slot",
        "--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1",
        "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
        "--mca", "pml", "ob1", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1" if yield_idle else "0",
        MPI_BENCH, f"--sizes_kib={','.join(map(str, sizes))}", f"--budget_mib={budget}", "--iters=50", "--warmup=5"]
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180)  # A launch that hangs (seen under load) costs the round, not the run.
    if r.returncode != 0:
        raise RuntimeError(f"mpirun failed ({r.returncode}): {r.stderr[-3000:]}\n{r.stdout[-1000:]}")
    return read_csv(r.stdout)


def iperf(nodes, pairs, seconds, streams):
    """Concurrent TCP streams src -> dst for every (src, dst): `streams` iperf3
    client/server processes per pair, one connection each (iperf3 3.12 runs
    all -P streams of a process on one thread; the ring has one send and one
    receive thread per connection). Returns Gbit/s received per pair."""
    servers, clients = [], []
    for k, (src, dst) in enumerate(pairs):
        for s in range(streams):
            port = 5201 + k * streams + s
            servers.append(subprocess.Popen(nodes.prefix(dst) + ["iperf3", "-s", "-1", "-p", str(port)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(0.5)
    for k, (src, dst) in enumerate(pairs):
        for s in range(streams):
            port = 5201 + k * streams + s
            clients.append((k, subprocess.Popen(
                nodes.prefix(src) + ["iperf3", "-c", nodes.ip(dst), "-p", str(port), "-t", str(seconds), "-l", "1M",
                                     "-J"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    out = [0.0] * len(pairs)
    for k, c in clients:
        o, e = c.communicate(timeout=seconds + 30)
        out[k] += json.loads(o)["end"]["sum_received"]["bits_per_second"] / 1e9
    for s in servers:
        try:
            s.wait(5)
        except subprocess.TimeoutExpired:
            s.kill()
    return out


def summarize_ring(row, n):
    """Time split from the daemons' telemetry for one job (one size)."""
    per_node = []
    for st in row["stats"]:
        if not st or "ring" not in st:
            continue
        g = st["ring"]
        ops = int(g.get("ops", 0)) or 1
        per_node.append({
            "ring_ms_per_op": 1e3 * float(g.get("busy_s", 0)) / ops,
            "ops": ops,
            "bytes_received": int(g.get("bytes_received", 0)),
            "chunks_per_op": int(g.get("chunk_latency", {}).get("count", 0)) / ops,
            "chunk_p50_us": float(g.get("chunk_latency", {}).get("p50_us", 0)),
            "chunk_p99_us": float(g.get("chunk_latency", {}).get("p99_us", 0)),
            "gbps": float(g.get("throughput_gbps", 0)),
            "daemon_op_p50_us": float(st.get("latency", {}).get("p50_us", 0)),
        })
    if not per_node:
        return {}
    return {k: statistics.mean(p[k] for p in per_node) for k in per_node[0]}


def one_round(a, nodes, d, n, rpn, sizes, rnd, agent, workdir, raw):
    up = uptime()
    raw["uptime"].append(up)
    log(f"{n} nodes x {rpn} rank(s), round {rnd + 1}/{a.rounds}: dmagather ... ({up})")
    rr = {"uptime": up}
    rr["dmagather"] = run_dmagather(d, nodes, n, rpn, sizes, a.budget_mib, f"rb{n}x{rpn}r{rnd}-{int(time.time())}")
    log(f"{n} nodes x {rpn} rank(s), round {rnd + 1}/{a.rounds}: Open MPI ...")
    rr["openmpi"] = run_mpi(nodes, n, rpn, sizes, a.budget_mib, agent, workdir, a.mpi_yield)
    log(f"{n} nodes x {rpn} rank(s), round {rnd + 1}/{a.rounds}: line rate (iperf3) ...")
    rr["line_pair_gbps"] = iperf(nodes, [(0, 1)], a.iperf_seconds, a.iperf_streams)[0]
    # The ring's links all at once (two nodes: 0->1 and 1->0).
    rr["line_ring_gbps"] = iperf(nodes, [(i, (i + 1) % n) for i in range(n)], a.iperf_seconds, a.iperf_streams)
    log(f"  line rate pair {rr['line_pair_gbps']:.2f} Gbit/s, ring links "
        f"{', '.join(f'{x:.2f}' for x in rr['line_ring_gbps'])} Gbit/s")
    return rr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="2,4")
    ap.add_argument("--sizes_kib", default="64,256,1024,4096,16384,65536")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget_mib", type=int, default=384, help="output MiB per rank per size and round")
    ap.add_argument("--links", type=int, default=4, help="dmagatherd --peer_links")
    ap.add_argument("--chunk_kib", type=int, default=1024, help="dmagatherd --ring_chunk_kib of the main sweep")
    ap.add_argument("--multi_rank", default="2x2", help="NODESxRANKS_PER_NODE point ('' to skip)")
    ap.add_argument("--chunk_sweep", default="64,256,1024,4096", help="--ring_chunk_kib values ('' to skip)")
    ap.add_argument("--chunk_sweep_nodes", type=int, default=4)
    ap.add_argument("--chunk_sweep_sizes_kib", default="1024,16384")
    ap.add_argument("--iperf_seconds", type=int, default=2)
    ap.add_argument("--iperf_streams", type=int, default=0, help="connections per link (0: --links)")
    ap.add_argument("--mpi_yield", type=int, default=1,
                    help="Open MPI mpi_yield_when_idle (1: waiting ranks yield the shared cores, as dmagather's sleep)")
    ap.add_argument("--out", default="results/multinode_ring")
    ap.add_argument("--keep_workdir", action="store_true", help="keep the daemons' logs")
    a = ap.parse_args()
    a.iperf_streams = a.iperf_streams or a.links
    node_counts = [int(x) for x in a.nodes.split(",") if x]
    sizes = [int(x) for x in a.sizes_kib.split(",") if x]
    configs = [(n, 1) for n in node_counts]
    if a.multi_rank:
        mn, mr = (int(x) for x in a.multi_rank.split("x"))
        configs.append((mn, mr))
    max_n = max([n for n, _ in configs] + ([a.chunk_sweep_nodes] if a.chunk_sweep else []))

    workdir = tempfile.mkdtemp(prefix="dmagather-ringbench-", dir="/tmp")
    agent = os.path.join(workdir, "netns_rsh")
    with open(agent, "w") as f:  # rsh agent: "agent HOST CMD...": run CMD in HOST's namespace.
        f.write('#!/bin/sh\nhost=$1; shift\nn=${host##*.}\n'
                'exec ip netns exec "${RING_BENCH_NS_PREFIX}$((n - 1))" /bin/sh -c "$*"\n')
    os.chmod(agent, 0o755)
    nodes = None
    daemons = []

    def on_signal(sig, _frame):
        raise SystemExit(f"interrupted by signal {sig}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    raw = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(a), "uptime": [], "configs": [],
           "chunk_sweep": [], "nproc": os.cpu_count()}
    try:
        nodes = Nodes(max_n, f"drb{os.getpid() % 100000}")
        log(f"{max_n} namespaces up ({nodes.tag}n0..n{max_n - 1}, 10.211.0.1..{max_n}); workdir {workdir}")
        for n, rpn in configs:
            cfg = {"nodes": n, "rpn": rpn, "rounds": []}
            d = Daemons(nodes, n, workdir, a.links, a.chunk_kib)
            daemons.append(d)
            for rnd in range(a.rounds):
                for attempt in range(3):
                    try:
                        cfg["rounds"].append(one_round(a, nodes, d, n, rpn, sizes, rnd, agent, workdir, raw))
                        break
                    except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
                        # This machine is shared: a daemon killed from outside, or a
                        # timeout under load, costs the round, not the run.
                        log(f"round failed ({str(e)[:400]}); restarting the daemons and retrying")
                        raw.setdefault("failures", []).append({"nodes": n, "rpn": rpn, "round": rnd,
                                                               "error": str(e)[:2000], "uptime": uptime()})
                        d.stop()
                        d = Daemons(nodes, n, workdir, a.links, a.chunk_kib)
                        daemons.append(d)
                else:
                    raise RuntimeError(f"{n} nodes x {rpn}: round {rnd + 1} failed three times")
            d.stop()
            raw["configs"].append(cfg)
        if a.chunk_sweep:
            n = a.chunk_sweep_nodes
            csizes = [int(x) for x in a.chunk_sweep_sizes_kib.split(",") if x]
            for ck in [int(x) for x in a.chunk_sweep.split(",")]:
                up = uptime()
                raw["uptime"].append(up)
                log(f"chunk sweep: {n} nodes, --ring_chunk_kib={ck} ... ({up})")
                for attempt in range(3):
                    d = Daemons(nodes, n, workdir, a.links, ck)
                    daemons.append(d)
                    try:
                        rows = run_dmagather(d, nodes, n, 1, csizes, a.budget_mib, f"rbchunk{ck}-{int(time.time())}")
                        break
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        log(f"chunk sweep failed ({str(e)[:400]}); retrying")
                        raw.setdefault("failures", []).append({"chunk_kib": ck, "error": str(e)[:2000],
                                                               "uptime": uptime()})
                    finally:
                        d.stop()
                else:
                    raise RuntimeError(f"chunk sweep {ck} KiB failed three times")
                raw["chunk_sweep"].append({"chunk_kib": ck, "nodes": n, "uptime": up, "dmagather": rows})
    finally:
        for d in daemons:
            d.stop()
        if nodes is not None:
            nodes.destroy()
        for f in os.listdir(workdir):
            if f.endswith(".log") and os.path.getsize(os.path.join(workdir, f)) > 0:
                tail = open(os.path.join(workdir, f)).read()[-600:]
                if "rror" in tail or "WARN" in tail.upper():
                    log(f"daemon log {f}: ...{tail}")
        if a.keep_workdir:
            log(f"kept {workdir}")
        else:
            subprocess.run(["rm", "-rf", workdir])
    report(raw, a)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def report(raw, a):
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + "_raw.json", "w") as f:
        json.dump(raw, f, indent=1)
    rows = []
    for cfg in raw["configs"]:
        n, rpn = cfg["nodes"], cfg["rpn"]
        pair = med([r["line_pair_gbps"] for r in cfg["rounds"]])
        ring_link = med([min(r["line_ring_gbps"]) for r in cfg["rounds"]])
        by_size = {}
        for r in cfg["rounds"]:
            for x in r["dmagather"]:
                by_size.setdefault(int(x["shard_KiB"]), {"d": [], "m": [], "t": []})["d"].append(float(x["p50_us"]))
                by_size[int(x["shard_KiB"])]["t"].append(summarize_ring(x, n))
            for x in r["openmpi"]:
                by_size.setdefault(int(x["shard_KiB"]), {"d": [], "m": [], "t": []})["m"].append(float(x["p50_us"]))
        for k in sorted(by_size):
            v = by_size[k]
            d50, m50 = med(v["d"]), med(v["m"])
            out_bytes = k * 1024 * n * rpn  # What each rank receives (in place: its own shard included).
            algo = out_bytes / (d50 * 1e-6) / 1e9
            bus = algo * (n - 1) / n
            # Per node and link direction the ring carries (N-1)/N of a node's output.
            link_bytes = (n - 1) * k * 1024 * rpn
            link_gbps = link_bytes * 8 / (d50 * 1e-6) / 1e9
            tel = [t for t in v["t"] if t]
            ring_ms = med([t["ring_ms_per_op"] for t in tel])
            rows.append({
                "nodes": n, "ranks_per_node": rpn, "shard_KiB": k,
                "dmagather_p50_us": d50, "openmpi_p50_us": m50, "speed_vs_openmpi": m50 / d50,
                "algo_GBps": algo, "bus_GBps": bus, "openmpi_algo_GBps": out_bytes / (m50 * 1e-6) / 1e9,
                "link_Gbps": link_gbps, "line_pair_Gbps": pair, "line_ring_link_Gbps": ring_link,
                "frac_of_pair_line": link_gbps / pair, "frac_of_ring_line": link_gbps / ring_link,
                "openmpi_frac_of_pair_line": link_bytes * 8 / (m50 * 1e-6) / 1e9 / pair,
                "ring_busy_ms_per_op": ring_ms, "ring_share_of_op": ring_ms * 1e3 / d50,
                "chunk_p50_us": med([t["chunk_p50_us"] for t in tel]),
                "chunk_p99_us": med([t["chunk_p99_us"] for t in tel]),
                "daemon_op_p50_us": med([t["daemon_op_p50_us"] for t in tel]),
                "rounds": len(cfg["rounds"]),
            })
    cols = list(rows[0].keys()) if rows else []
    with open(a.out + ".csv", "w") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})
    crow = []
    for c in raw["chunk_sweep"]:
        for x in c["dmagather"]:
            t = summarize_ring(x, c["nodes"])
            crow.append({"chunk_kib": c["chunk_kib"], "nodes": c["nodes"], "shard_KiB": int(x["shard_KiB"]),
                         "dmagather_p50_us": float(x["p50_us"]), "ring_busy_ms_per_op": t.get("ring_ms_per_op"),
                         "chunk_p50_us": t.get("chunk_p50_us"), "chunk_p99_us": t.get("chunk_p99_us"),
                         "ring_Gbps": t.get("gbps"), "uptime": c["uptime"]})
    if crow:
        with open(a.out + "_chunks.csv", "w") as f:
            w = csv.DictWriter(f, list(crow[0].keys()))
            w.writeheader()
            for r in crow:
                w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})

    print(f"machine: {raw['nproc']} cores, shared; load during the run (uptime before each measurement):")
    for u in raw["uptime"]:
        print(f"  {u}")
    print(f"dmagatherd --backend=host --peer_links={a.links} --ring_chunk_kib={a.chunk_kib}; "
          f"{a.rounds} alternated rounds; p50 of per-op time (max over ranks), median of the rounds")
    print(f"{'N':>2} {'r/n':>3} {'shard_KiB':>9} {'dmag_us':>9} {'ompi_us':>9} {'speed':>6} {'algo_GB/s':>9} "
          f"{'bus_GB/s':>8} {'link_Gb/s':>9} {'pair_line':>9} {'ring_line':>9} {'%pair':>6} {'%ring':>6} "
          f"{'ring_ms':>8} {'ring%op':>7} {'chunk_p50':>9}")
    for r in rows:
        print(f"{r['nodes']:>2} {r['ranks_per_node']:>3} {r['shard_KiB']:>9} {r['dmagather_p50_us']:>9.0f} "
              f"{r['openmpi_p50_us']:>9.0f} {r['speed_vs_openmpi']:>6.2f} {r['algo_GBps']:>9.3f} {r['bus_GBps']:>8.3f} "
              f"{r['link_Gbps']:>9.2f} {r['line_pair_Gbps']:>9.2f} {r['line_ring_link_Gbps']:>9.2f} "
              f"{100 * r['frac_of_pair_line']:>5.0f}% {100 * r['frac_of_ring_line']:>5.0f}% "
              f"{r['ring_busy_ms_per_op']:>8.2f} {100 * r['ring_share_of_op']:>6.0f}% {r['chunk_p50_us']:>9.0f}")
    if crow:
        print("chunk sweep (ring telemetry, mean over nodes):")
        print(f"{'chunk_KiB':>9} {'N':>2} {'shard_KiB':>9} {'dmag_us':>9} {'ring_ms':>8} {'chunk_p50':>9} "
              f"{'chunk_p99':>9} {'ring_Gb/s':>9}")
        for r in crow:
            print(f"{r['chunk_kib']:>9} {r['nodes']:>2} {r['shard_KiB']:>9} {r['dmagather_p50_us']:>9.0f} "
                  f"{r['ring_busy_ms_per_op']:>8.2f} {r['chunk_p50_us']:>9.0f} {r['chunk_p99_us']:>9.0f} "
                  f"{r['ring_Gbps']:>9.2f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axs = plt.subplots(1, 2, figsize=(12, 4.5))
        for (n, rpn) in sorted({(r["nodes"], r["ranks_per_node"]) for r in rows}):
            rs = [r for r in rows if r["nodes"] == n and r["ranks_per_node"] == rpn]
            ks = [r["shard_KiB"] for r in rs]
            lab = f"{n} nodes x {rpn}"
            l, = axs[0].plot(ks, [r["link_Gbps"] for r in rs], "o-", label=f"dmagather {lab}")
            axs[0].plot(ks, [r["openmpi_frac_of_pair_line"] * r["line_pair_Gbps"] for r in rs], "s--",
                        color=l.get_color(), label=f"Open MPI {lab}")
            axs[0].axhline(rs[0]["line_ring_link_Gbps"], color=l.get_color(), lw=0.8, ls=":")
            axs[1].plot(ks, [r["speed_vs_openmpi"] for r in rs], "o-", label=lab)
        axs[0].set_xscale("log", base=2)
        axs[0].set_xlabel("shard per rank (KiB)")
        axs[0].set_ylabel("per-link payload rate (Gbit/s): (N-1)/N of output / time")
        axs[0].set_title("Ring vs Open MPI (dotted: iperf3, all ring links at once)")
        axs[0].grid(True, alpha=0.3)
        axs[0].legend(fontsize=7)
        axs[1].set_xscale("log", base=2)
        axs[1].axhline(1, color="k", lw=0.8)
        axs[1].set_xlabel("shard per rank (KiB)")
        axs[1].set_ylabel("Open MPI p50 / dmagather p50")
        axs[1].set_title("Speed vs Open MPI over TCP (>1: dmagather faster)")
        axs[1].grid(True, alpha=0.3)
        axs[1].legend(fontsize=8)
        fig.suptitle(f"tcp over veth, {raw['nproc']}-core shared machine, {raw['started']}", fontsize=9)
        fig.tight_layout()
        fig.savefig(a.out + ".png", dpi=110)
        print(f"wrote {a.out}.csv, {a.out}_chunks.csv, {a.out}.png, {a.out}_raw.json")
    except ImportError:
        print(f"wrote {a.out}.csv (matplotlib missing: no PNG)")


if __name__ == "__main__":
    main()
