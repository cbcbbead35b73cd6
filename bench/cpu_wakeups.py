#!/usr/bin/env python3
"""CPU wake-ups per op: what a stream of small AllGathers costs the daemon's
threads in wake-ups, read from `dmagatherctl --json stats` (ingress_sleeps:
the ingress thread slept on the doorbell and was woken; engine_wakeups: a GPU
engine's issuing, completion or gate thread was woken for work), before and
after each arm.

    DMAGATHER_SOCKET=/path/dmagatherd.sock PYTHONPATH=client/python \\
    python3 bench/cpu_wakeups.py --ctl bazel-bin/tools/dmagatherctl [--ranks 2] [--ops 2000] \\
        [--daemon_pid PID]

Arms: `burst` (ops back to back), and `gap_us=G` (each rank sleeps G us
between ops, as compute between a trainer's layers). Prints one line per arm:
ops, ingress sleeps and engine wake-ups per op, the op's p50 in us, and with
--daemon_pid the daemon's CPU time over the arm as a share of one core (what
threads that stay awake cost). With
--device host, memory from the daemon (Comm.empty); with --device cuda, each
rank's GPU memory on a cuda daemon, where the engine_wakeups count too.
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time


def stats(ctl, socket):
    out = subprocess.run([ctl, f"--socket={socket}", "--json", "stats"], capture_output=True, text=True, check=True)
    s = json.loads(out.stdout)
    return int(s.get("ingress_sleeps", 0)), int(s.get("engine_wakeups", 0)), int(s.get("total_ops", 0))


def cpu_seconds(pid):
    """The process's user + system CPU time, from /proc (clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rank_main(job, world, rank, socket, ops, gap_us, device, ready, go, q):
    import dmagather
    count = 1024  # float32: 4 KiB shards
    with dmagather.Comm(job, world, rank, socket=socket) as comm:
        stream = None
        if device == "cuda":  # The rank's GPU memory, its op ordered on its stream.
            import torch
            torch.cuda.set_device(rank % torch.cuda.device_count())
            out = torch.zeros(world * count, dtype=torch.float32, device="cuda")
            comm.register(out)
            stream = torch.cuda.current_stream().cuda_stream
        else:
            out = comm.empty(world * count, "float32")
        mine = out[rank * count:(rank + 1) * count]
        comm.allgather(mine, out, stream=stream)  # Warm: the job's first op, outside the count.
        comm.wait()
        ready.wait()  # The counters are read between the two barriers.
        go.wait()
        times = []
        for i in range(ops):
            if gap_us:
                time.sleep(gap_us / 1e6)
            t = time.perf_counter()
            comm.allgather(mine, out, stream=stream)
            comm.wait()
            times.append((time.perf_counter() - t) * 1e6)
        q.put((rank, statistics.median(times)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctl", required=True)
    ap.add_argument("--socket", default=os.environ.get("DMAGATHER_SOCKET"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--gaps_us", default="0,1000")
    ap.add_argument("--daemon_pid", type=int, default=0)
    ap.add_argument("--device", choices=("host", "cuda"), default="host",
                    help="host: memory from the daemon; cuda: each rank's GPU memory (a cuda daemon)")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    for gap in (int(g) for g in args.gaps_us.split(",")):
        q = ctx.Queue()
        ready, go = ctx.Barrier(args.ranks + 1), ctx.Barrier(args.ranks + 1)
        job = f"wakeups-{os.getpid()}-{gap}"
        procs = [ctx.Process(target=rank_main, args=(job, args.ranks, r, args.socket, args.ops, gap, args.device, ready, go, q))
                 for r in range(args.ranks)]
        for p in procs:
            p.start()
        # Only the timed ops count: the ranks' start (imports, a GPU context)
        # and the warm-up op come before the first snapshot.
        ready.wait(timeout=600)
        s0 = stats(args.ctl, args.socket)
        c0, t0 = (cpu_seconds(args.daemon_pid) if args.daemon_pid else 0.0), time.monotonic()
        go.wait(timeout=60)
        p50 = [q.get(timeout=600)[1] for _ in procs]
        s1 = stats(args.ctl, args.socket)
        cpu = ""
        if args.daemon_pid:
            cpu = f", daemon CPU {(cpu_seconds(args.daemon_pid) - c0) / (time.monotonic() - t0):.2f} of a core"
        for p in procs:
            p.join()
        ops = s1[2] - s0[2]
        arm = "burst" if gap == 0 else f"gap_us={gap}"
        print(f"{arm}: {ops} ops, ingress sleeps {(s1[0] - s0[0]) / max(ops, 1):.3f}/op, "
              f"engine wake-ups {(s1[1] - s0[1]) / max(ops, 1):.3f}/op, p50 {statistics.median(p50):.1f} us{cpu}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
