#!/usr/bin/env python3
"""Copy-engine bandwidth between every ordered pair of GPUs, read (pull) and
write (push): the baseline a multi-GPU run of dmagather is compared with.

A pull is cudaMemcpyPeerAsync issued on a stream of the destination's GPU
(its copy engines read the peer: what dmagatherd does by default); a push is
the same copy issued on a stream of the source's GPU (its engines write the
peer: what dmagatherd does for a pair reachable only that way). No kernel is
launched. Every pair's copy is checked bit-exact once, then timed with CUDA
events on the issuing stream (median of --iters).

    pair_bw.py [--mib 256] [--iters 20] [--csv results/pair_bw.csv] [--memory local,ipc,vmm]

--memory: where the source lives. `local`: cudaMalloc in this process.
`ipc`: allocated by another process and mapped here through CUDA IPC
(cudaIpcOpenMemHandle, as torch shares a CUDA tensor), as dmagatherd reads
the ranks' buffers: the ceiling dmagather's peer copies are held to.
`vmm`: the same from memory the other process's torch allocated with
expandable segments (cuMemCreate, shared as a file descriptor: what a rank
with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True hands dmagatherd); the
owner checks that its segments are expandable, and a torch that cannot
share them is named and the kind skipped.

With one GPU it measures the device-to-device copy on that GPU (the same
call, both ends on one device) so the script is exercised anywhere.
Prints a matrix per direction (GB/s) and writes one CSV row per measurement.
"""
import argparse
import csv
import ctypes
import os
import statistics
import sys

import torch


def cudart():
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    sys.exit("pair_bw: no libcudart found (torch's CUDA runtime is loaded by soname)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--csv", default="results/pair_bw.csv")
    p.add_argument("--memory", default="local,ipc", help="source memory, comma-separated: local, ipc, vmm")
    args = p.parse_args()
    n = torch.cuda.device_count()
    if n == 0:
        sys.exit("pair_bw: no GPU")
    torch.cuda.init()
    rt = cudart()
    rt.cudaMemcpyPeerAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                                       ctypes.c_void_p]
    nbytes = args.mib << 20
    bufs = []
    for d in range(n):
        bufs.append((_source(d, nbytes), torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}")))
    memories = [m for m in args.memory.split(",") if m]
    owners, shared = [], {}
    for kind in ("ipc", "vmm"):
        if kind not in memories:
            continue
        try:
            owner, shared[kind] = _ipc_sources(n, nbytes, expandable=kind == "vmm")
            owners.append(owner)
        except RuntimeError as e:
            print(f"pair_bw: {kind} skipped: {e}")
            memories.remove(kind)
    for a in range(n):
        for b in range(n):
            if a != b and torch.cuda.can_device_access_peer(a, b):
                with torch.cuda.device(a):
                    # A direct copy needs peer access on (0, or already enabled: on either way).
                    rt.cudaDeviceEnablePeerAccess(ctypes.c_int(b), ctypes.c_uint(0))
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d] or [(0, 0)]
    rows, bad = [], 0
    for memory, s, d, mode in [(m, s, d, mode) for m in memories for s, d in pairs for mode in ("pull", "push")]:
        peer = s == d or torch.cuda.can_device_access_peer(d, s)
        on = d if mode == "pull" else s
        src, dst = (shared[memory][s] if memory in shared else bufs[s][0]), bufs[d][1]
        expect = bufs[s][0]
        with torch.cuda.device(on):
            stream = torch.cuda.Stream()
            dst.fill_(0xA5)
            torch.cuda.synchronize(d)
            rc = rt.cudaMemcpyPeerAsync(ctypes.c_void_p(dst.data_ptr()), d, ctypes.c_void_p(src.data_ptr()), s,
                                        nbytes, ctypes.c_void_p(stream.cuda_stream))
            stream.synchronize()
            ok = rc == 0 and torch.equal(dst.cpu(), expect.cpu())
            bad += 0 if ok else 1
            times = []
            for _ in range(args.iters):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(stream)
                rt.cudaMemcpyPeerAsync(ctypes.c_void_p(dst.data_ptr()), d, ctypes.c_void_p(src.data_ptr()), s,
                                       nbytes, ctypes.c_void_p(stream.cuda_stream))
                e1.record(stream)
                e1.synchronize()
                times.append(e0.elapsed_time(e1))
        ms = statistics.median(times)
        rows.append([s, d, mode, memory, int(peer), args.mib, round(ms, 4), round(nbytes / (ms / 1e3) / 1e9, 1),
                     "PASSED" if ok else f"FAILED(rc={rc})"])
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src", "dst", "mode", "memory", "peer_access", "MiB", "ms", "GBps", "bit_exact"])
        w.writerows(rows)
    for memory in memories:
        for mode in ("pull", "push"):
            print(f"{mode} GB/s, {memory} source memory (row: source GPU, column: destination GPU)")
            print("      " + "".join(f"{d:>8}" for d in range(n)))
            for s in range(n):
                cells = []
                for d in range(n):
                    r = [x for x in rows if x[0] == s and x[1] == d and x[2] == mode and x[3] == memory]
                    cells.append(f"{r[0][7]:>8}" if r else f"{'-':>8}")
                print(f"{s:>6}" + "".join(cells))
    for proc, done in owners:
        done.set()
        proc.join(timeout=30)
    print(f"pair_bw: {len(rows)} copies, {bad} not bit-exact")
    return 1 if bad else 0


def _source(d, nbytes):
    """GPU d's source bytes (the same in every process: seeded per GPU)."""
    g = torch.Generator(device=f"cuda:{d}").manual_seed(1000 + d)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=f"cuda:{d}", generator=g)


def _owner(n, nbytes, expandable, conn, done):
    """Another process: allocates every GPU's source and shares it over CUDA
    IPC (torch sends a CUDA tensor as an IPC handle, or an expandable
    segment's as a file descriptor), then keeps it until done. Puts an error
    string instead where the memory is not what was asked for or cannot go."""
    try:
        tensors = [_source(d, nbytes) for d in range(n)]
        torch.cuda.synchronize()
        if expandable:
            kinds = {s.get("is_expandable") for s in torch.cuda.memory._snapshot()["segments"]}
            if kinds != {True}:
                raise RuntimeError(f"segments not all expandable ({kinds}) with torch {torch.__version__}")
        conn.send(tensors)  # Pickled here: a handle torch cannot make fails now, not in a feeder thread.
    except Exception as e:  # noqa: BLE001 - reported to the parent, which skips this kind
        conn.send(f"{type(e).__name__}: {e}")
    done.wait()


def _ipc_sources(n, nbytes, expandable=False):
    """The sources of another process, mapped here through CUDA IPC."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    (mine, theirs), done = ctx.Pipe(), ctx.Event()
    proc = ctx.Process(target=_owner, args=(n, nbytes, expandable, theirs, done), daemon=True)
    # The owner's allocator reads its settings from the environment it starts with.
    before = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if expandable:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    try:
        proc.start()
    finally:
        if before is None:
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        else:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = before
    got = mine.recv() if mine.poll(300) else "the owner process sent nothing in 300 s"
    if isinstance(got, str):
        done.set()
        proc.join(timeout=30)
        raise RuntimeError(got)
    return (proc, done), got


if __name__ == "__main__":
    sys.exit(main())
