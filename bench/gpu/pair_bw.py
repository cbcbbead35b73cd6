#!/usr/bin/env python3
"""Copy-engine bandwidth between every ordered pair of GPUs, read (pull) and
write (push): the baseline a multi-GPU run of dmagather is compared with.

A pull is cudaMemcpyPeerAsync issued on a stream of the destination's GPU
(its copy engines read the peer: what dmagatherd does by default); a push is
the same copy issued on a stream of the source's GPU (its engines write the
peer: what dmagatherd does for a pair reachable only that way). No kernel is
launched. Every pair's copy is checked bit-exact once, then timed with CUDA
events on the issuing stream (median of --iters).

    pair_bw.py [--mib 256] [--iters 20] [--csv results/pair_bw.csv]

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
        g = torch.Generator(device=f"cuda:{d}").manual_seed(1000 + d)
        bufs.append((torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=f"cuda:{d}", generator=g),
                     torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}")))
    for a in range(n):
        for b in range(n):
            if a != b and torch.cuda.can_device_access_peer(a, b):
                with torch.cuda.device(a):
                    # A direct copy needs peer access on (0, or already enabled: on either way).
                    rt.cudaDeviceEnablePeerAccess(ctypes.c_int(b), ctypes.c_uint(0))
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d] or [(0, 0)]
    rows, bad = [], 0
    for s, d in pairs:
        peer = s == d or torch.cuda.can_device_access_peer(d, s)
        for mode in ("pull", "push"):
            on = d if mode == "pull" else s
            src, dst = bufs[s][0], bufs[d][1]
            with torch.cuda.device(on):
                stream = torch.cuda.Stream()
                dst.fill_(0xA5)
                torch.cuda.synchronize(d)
                rc = rt.cudaMemcpyPeerAsync(ctypes.c_void_p(dst.data_ptr()), d, ctypes.c_void_p(src.data_ptr()), s,
                                            nbytes, ctypes.c_void_p(stream.cuda_stream))
                stream.synchronize()
                ok = rc == 0 and torch.equal(dst.cpu(), src.cpu())
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
            rows.append([s, d, mode, int(peer), args.mib, round(ms, 4), round(nbytes / (ms / 1e3) / 1e9, 1),
                         "PASSED" if ok else f"FAILED(rc={rc})"])
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src", "dst", "mode", "peer_access", "MiB", "ms", "GBps", "bit_exact"])
        w.writerows(rows)
    for mode in ("pull", "push"):
        print(f"{mode} GB/s (row: source GPU, column: destination GPU)")
        print("      " + "".join(f"{d:>8}" for d in range(n)))
        for s in range(n):
            cells = []
            for d in range(n):
                r = [x for x in rows if x[0] == s and x[1] == d and x[2] == mode]
                cells.append(f"{r[0][6]:>8}" if r else f"{'-':>8}")
            print(f"{s:>6}" + "".join(cells))
    print(f"pair_bw: {len(rows)} copies, {bad} not bit-exact")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
