#!/usr/bin/env python3
"""torch.distributed gloo reduce_scatter_tensor (SUM) on CPU tensors, timed the
way bench/reduce_scatter_perf.cc times dmagather: W spawned rank processes
(FileStore rendezvous); per iteration every rank meets the others at a
barrier, then times one reduce_scatter_tensor; an iteration lasts as long as
its slowest rank (MAX over the ranks). One intra-op thread per rank
(torch.set_num_threads(1)): dmagather's sum and Open MPI's run on one thread
per rank too.

Every result (warmup and timed) is checked exactly, outside the timed region:
the inputs are small integers (below 256 / ranks), so every sum is exact in
fp32 and bfloat16 whatever order gloo adds in; the output is poisoned before
each op. Prints CSV with the columns of reduce_scatter_perf (staging_MiB
empty: not applicable):
  impl,ranks,dtype,out_MiB,avg_ms,p50_ms,algo_BW_GBps,staging_MiB
algo_BW_GBps: input bytes per rank (ranks x out bytes) / time, 1e9 B/s.

  python gloo_reduce_scatter.py --ranks=4 --sizes_mib=1,4,16,64 --iters=10
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def values(count, chunk, rank, world):
    """Element i of chunk `chunk` of rank `rank`'s send, as in mpi_reduce_scatter.cc."""
    i = torch.arange(count, dtype=torch.int32)
    return (i * 7 + (chunk * 13 + rank * 31)) % (256 // world)


def run_row(rank, world, dtype, mib, iters, warmup):
    """Warmup + iters checked ops; the per-iteration times, MAX over ranks (rank 0)."""
    esize = torch.tensor([], dtype=dtype).element_size()
    count = (mib << 20) // esize
    send = torch.empty(world * count, dtype=dtype)
    want = torch.zeros(count, dtype=torch.int32)
    for c in range(world):
        send[c * count:(c + 1) * count] = values(count, c, rank, world)
        want += values(count, rank, c, world)
    want = want.to(dtype)
    recv = torch.empty(count, dtype=dtype)
    times = []
    for it in range(-warmup, iters):
        recv.fill_(-1)  # Poison: a stale result cannot pass.
        dist.barrier()
        t0 = time.perf_counter()
        dist.reduce_scatter_tensor(recv, send, op=dist.ReduceOp.SUM)
        ms = (time.perf_counter() - t0) * 1e3
        if not torch.equal(recv, want):
            bad = int((recv != want).nonzero()[0])
            raise RuntimeError(f"rank {rank}: gloo reduce_scatter_tensor wrong ({dtype} {mib} MiB iteration {it}, "
                               f"element {bad}: {recv[bad].item()} != {want[bad].item()})")
        if it >= 0:
            times.append(ms)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def rank_main(rank, args, store_path):
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, args.ranks)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=args.ranks)
    rows = []
    for name in args.dtypes.split(","):
        for mib in [int(s) for s in args.sizes_mib.split(",")]:
            t = run_row(rank, args.ranks, DTYPES[name], mib, args.iters, args.warmup)
            avg = sum(t) / len(t)
            bw = (mib << 20) * args.ranks / 1e9 / (avg / 1e3)
            rows.append(f"gloo,{args.ranks},{name},{mib},{avg:.3f},{statistics.median(t):.3f},{bw:.3f},")
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("impl,ranks,dtype,out_MiB,avg_ms,p50_ms,algo_BW_GBps,staging_MiB")
        print("\n".join(rows), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes_mib", default="1,4,16,64")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    if not 1 <= args.ranks <= 256 or args.iters < 1 or args.warmup < 0:
        sys.exit("gloo_reduce_scatter: ranks 1..256, iters >= 1, warmup >= 0")
    print(f"gloo_reduce_scatter: torch {torch.__version__}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(rank_main, args=(args, os.path.join(d, "store")), nprocs=args.ranks)


if __name__ == "__main__":
    main()
