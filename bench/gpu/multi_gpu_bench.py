#!/usr/bin/env python3
"""dmagather against NCCL on one multi-GPU node, one rank per GPU, in one run.

Needs a running `dmagatherd --backend=cuda` (bench/gpu/multi_gpu.sh starts one) and PyTorch with
NCCL. Parts (--parts, default all):
  correct   every dtype, odd sizes, in/out of place, list output, tensors sub-allocated at odd
            offsets inside one allocation; bit-exact on the GPU against a regenerated reference
  busbw     AllGather bus bandwidth, 1 MiB .. 1 GiB per rank, dmagather vs NCCL
  overlap   bf16 GEMM 8192^3 loop while AllGathers of 8..256 MiB run on a side stream:
            GEMM TF/s and wall time for dmagather vs NCCL vs GEMM alone
  latency   --latency_kib per rank (64 KiB, 1, 2, 4 MiB): p50/p99 dmagather vs NCCL
  rs_correct, rs_busbw, rs_overlap (multi_gpu_rs.py, next to this file; docs/REDUCE.md): the
            reduce-scatter (copies on copy engines, the sum by each rank's kernel) against NCCL's:
            bf16/fp32 SUM/AVG bit-exact against a float32 rank-order reference (NCCL's last-bit
            differences reported), bus bandwidth 1 MiB .. --max_bytes output per rank, GEMM TF/s beside
            reduce-scatters of 8..256 MiB output per rank on a side stream
More ranks than GPUs (--ranks 16 on 8 GPUs) share GPUs round-robin over a gloo group: NCCL
refuses several ranks on one GPU, so its columns are left out. --rank_visible: each rank sees
only its own GPU (CUDA_VISIBLE_DEVICES = that GPU's UUID), as under SLURM --gpus-per-task.
Writes CSV files and PNGs into --out and prints a summary table on rank 0.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0 etc. are set before NCCL starts).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[k] = v

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
import dmagather  # noqa: E402  (PYTHONPATH from multi_gpu.sh, or the source tree)

sys.path.insert(0, HERE)
try:
    import multi_gpu_rs  # noqa: E402  (next to this file)
except ImportError as e:  # staged without it: the rs_* parts are unavailable
    multi_gpu_rs, RS_MISSING = None, str(e)

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]
MiB = 1 << 20
PARTS = ("correct", "busbw", "overlap", "latency", "rs_correct", "rs_busbw", "rs_overlap")


def shard_bits(seed, rank, nbytes, device):
    """Deterministic random bytes of (seed, rank): any rank can regenerate any shard."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1000003 + rank)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=g)


class Dmag:
    """dmagather on the current CUDA stream, or on a given one."""

    def __init__(self, args, rank, world):
        self.comm = dmagather.Comm(f"bench-{args.job}", world, rank, socket=args.socket)
        self.world, self.rank = world, rank

    def allgather(self, inp, out, stream=None):
        self.comm.register(out)
        self.comm.register(inp)
        s = stream or torch.cuda.current_stream()
        self.comm.allgather(inp, out, count=inp.numel(), dtype=inp.dtype, stream=s.cuda_stream)

    def allgather_list(self, inp, outs):
        for o in outs:
            self.comm.register(o)
        self.comm.register(inp)
        self.comm.allgather_list(inp, outs, count=inp.numel(), dtype=inp.dtype,
                                 stream=torch.cuda.current_stream().cuda_stream)

    def reduce_scatter(self, inp, out, op=dmagather.SUM, stream=None):
        """reduce_scatter_tensor(out, inp): out gets chunk `rank` of every rank's inp, summed in rank order."""
        self.comm.register(inp)
        self.comm.register(out)
        s = stream or torch.cuda.current_stream()
        self.comm.reduce_scatter(inp, out, count=out.numel(), dtype=out.dtype, op=op, stream=s.cuda_stream)


def nccl_allgather(inp, out, stream=None):
    if stream is None:
        dist.all_gather_into_tensor(out, inp)
    else:
        with torch.cuda.stream(stream):
            dist.all_gather_into_tensor(out, inp)


def part_correct(args, rank, world, dm, dev):
    rows, failures = [], []
    seed = 1
    for dt in DTYPES:
        es = torch.empty(0, dtype=dt).element_size()
        big = args.correct_max_mib * MiB // es
        for count in sorted({c for c in (1, 3, 4095, MiB + 7) if c * es <= args.correct_max_mib * MiB} | {big}):
            for variant in ("out_of_place", "in_place", "list", "suballoc"):
                seed += 1
                nbytes = count * es
                # One allocation, tensors carved at odd offsets (the IPC-base bug).
                pad = 4096 + 3 * es if variant == "suballoc" else 0
                pool = torch.empty(pad + nbytes * world + pad + nbytes, dtype=torch.uint8, device=dev)
                pool.fill_(0xA5)
                out_b = pool[pad:pad + nbytes * world]
                if variant == "in_place":
                    in_b = out_b[rank * nbytes:(rank + 1) * nbytes]
                else:
                    in_b = pool[pad + nbytes * world + pad:][:nbytes]
                in_b.copy_(shard_bits(seed, rank, nbytes, dev))
                out_t, in_t = out_b.view(dt), in_b.view(dt)
                if variant == "list":
                    outs = list(out_t.chunk(world))
                    dm.allgather_list(in_t, outs)
                else:
                    dm.allgather(in_t, out_t)
                ref = torch.cat([shard_bits(seed, r, nbytes, dev) for r in range(world)])
                ok = bool(torch.equal(out_b, ref))  # Reads after the stream's done-wait.
                if not ok:
                    failures.append(f"{dt} count={count} {variant}")
                rows.append([str(dt).replace("torch.", ""), count, variant, "PASSED" if ok else "FAILED"])
                del pool, ref
    dm.comm.wait()
    return rows, failures


def time_loop(fn, iters, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(iters):
        fn()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / iters  # ms


def part_busbw(args, rank, world, dm, dev):
    rows = []
    size = MiB
    while size <= args.max_bytes:
        inp_out = torch.empty(size * world, dtype=torch.uint8, device=dev)
        inp = inp_out[rank * size:(rank + 1) * size]
        inp.random_(0, 255)
        iters = max(5, min(100, (8 << 30) // (size * world)))
        t_d = time_loop(lambda: dm.allgather(inp, inp_out), iters)
        t_n = time_loop(lambda: nccl_allgather(inp, inp_out), iters) if args.nccl else float("nan")
        bus = lambda t: (world - 1) / world * size * world / (t / 1e3) / 1e9  # noqa: E731
        rows.append([size // MiB, round(t_d, 4), round(t_n, 4), round(bus(t_d), 2), round(bus(t_n), 2),
                     round(bus(t_d) / bus(t_n), 3)])
        del inp_out
        size *= 2
    return rows


def gemm_overlap(args, dev, sizes_mib, make):
    """The bf16 GEMM loop (--overlap_gemms of 8192^3) alone, one collective per GEMM alone (as a
    layer-by-layer prefetch, or a backward pass's gradient buckets, would issue them), and the two
    together with the collectives on a side stream; per size in `sizes_mib`, make(mib) -> (ours,
    theirs): dmagather's and NCCL's collective on that size's buffers, each called with a stream
    (None: the current one). One row per size: the overlap CSV's columns."""
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    flops = 2 * n ** 3
    gemms = args.overlap_gemms
    rows = []
    t_gemm = time_loop(lambda: torch.mm(a, b), gemms) * gemms  # ms for the loop
    side = torch.cuda.Stream(device=dev)
    for mib in sizes_mib:
        ours, theirs = make(mib)
        t_d = time_loop(lambda: ours(None), gemms) * gemms
        t_n = time_loop(lambda: theirs(None), gemms) * gemms if args.nccl else float("nan")

        def both(op):
            def run():
                main = torch.cuda.current_stream()
                side.wait_stream(main)
                for _ in range(gemms):
                    op(side)
                    torch.mm(a, b)
                main.wait_stream(side)
            return run
        t_both_d = time_loop(both(ours), 1, warmup=2)
        t_both_n = time_loop(both(theirs), 1, warmup=2) if args.nccl else float("nan")
        tf = lambda t: flops * gemms / (t / 1e3) / 1e12  # noqa: E731
        rows.append([mib, round(t_gemm, 3), round(t_d, 3), round(t_n, 3), round(t_both_d, 3),
                     round(t_both_n, 3), round(tf(t_gemm), 1), round(tf(t_both_d), 1), round(tf(t_both_n), 1),
                     round(t_both_n / t_both_d, 3)])
        ours = theirs = None  # The buffers go before the next size is allocated.
        dist.barrier()
    return rows


def part_overlap(args, rank, world, dm, dev):
    def make(mib):
        size = mib * MiB
        out = torch.empty(size * world, dtype=torch.uint8, device=dev)
        inp = out[rank * size:(rank + 1) * size]
        return (lambda s: dm.allgather(inp, out, stream=s)), (lambda s: nccl_allgather(inp, out, stream=s))
    return gemm_overlap(args, dev, (8, 32, 64, 128, 256), make)


def part_latency(args, rank, world, dm, dev):
    res = []
    for kib in (int(k) for k in args.latency_kib.split(",")):
        res += latency_one(args, rank, world, dm, dev, kib * 1024)
    return res


def latency_one(args, rank, world, dm, dev, size):
    out = torch.empty(size * world, dtype=torch.uint8, device=dev)
    inp = out[rank * size:(rank + 1) * size]
    res = []
    impls = [("dmagather", lambda: dm.allgather(inp, out))]
    if args.nccl:
        impls.append(("nccl", lambda: nccl_allgather(inp, out)))
    for name, fn in impls:
        ts = []
        for _ in range(20):
            fn()
        for _ in range(args.latency_iters):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier()
            torch.cuda.synchronize()
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3)
        ts.sort()
        res.append([size // 1024, name, round(ts[len(ts) // 2], 2), round(ts[int(len(ts) * 0.99)], 2)])
    return res


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def worker(rank, world, args):
    if args.rank_visible:
        # Before this process's first CUDA call: it sees one GPU, its device 0.
        os.environ["CUDA_VISIBLE_DEVICES"] = args.rank_visible.split(",")[rank % len(args.rank_visible.split(","))]
    idx = rank % torch.cuda.device_count()
    torch.cuda.set_device(idx)
    dev = torch.device("cuda", idx)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    if args.nccl:
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    dm = Dmag(args, rank, world)
    parts = args.parts.split(",")
    summary = {}
    if "correct" in parts:
        rows, failures = part_correct(args, rank, world, dm, dev)
        bad = torch.tensor([len(failures)], device=dev if args.nccl else "cpu")
        dist.all_reduce(bad)
        summary["correct"] = int(bad.item())
        if rank == 0:
            write_csv(os.path.join(args.out, "correct.csv"), ["dtype", "count", "variant", "result"], rows)
        if failures:
            print(f"rank {rank}: FAILED {failures[:5]}", flush=True)
    if "busbw" in parts:
        rows = part_busbw(args, rank, world, dm, dev)
        if rank == 0:
            write_csv(os.path.join(args.out, "busbw.csv"),
                      ["MiB_per_rank", "dmag_ms", "nccl_ms", "dmag_busbw", "nccl_busbw", "ratio"], rows)
            summary["busbw"] = rows
    if "overlap" in parts:
        rows = part_overlap(args, rank, world, dm, dev)
        if rank == 0:
            write_csv(os.path.join(args.out, "overlap.csv"),
                      ["AG_MiB", "gemm_alone_ms", "ag_alone_dmag_ms", "ag_alone_nccl_ms", "both_dmag_ms",
                       "both_nccl_ms", "gemm_TFs_alone", "gemm_TFs_with_dmag", "gemm_TFs_with_nccl",
                       "wall_nccl_over_dmag"], rows)
            summary["overlap"] = rows
    if "latency" in parts:
        rows = part_latency(args, rank, world, dm, dev)
        if rank == 0:
            write_csv(os.path.join(args.out, "latency.csv"), ["KiB_per_rank", "impl", "p50_us", "p99_us"], rows)
            summary["latency"] = rows
    if any(p.startswith("rs_") for p in parts):
        multi_gpu_rs.run_parts(args, rank, world, dm, dev, parts, summary, time_loop, write_csv, gemm_overlap)
    dm.comm.wait()
    dm.comm.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)


def report(args, world):
    s = json.load(open(os.path.join(args.out, "summary.json")))
    print(f"=== dmagather vs NCCL, {world} GPUs ===")
    if "correct" in s:
        print(f"correctness: {'all PASSED' if s['correct'] == 0 else str(s['correct']) + ' FAILED'}")
    if "busbw" in s:
        print(f"{'MiB/rank':>9} {'dmag GB/s':>10} {'nccl GB/s':>10} {'ratio':>6}")
        for r in s["busbw"]:
            print(f"{r[0]:>9} {r[3]:>10} {r[4]:>10} {r[5]:>6}")
    if "overlap" in s:
        print(f"{'AG MiB':>6} {'GEMM TF/s alone':>15} {'+dmag':>7} {'+nccl':>7} {'wall nccl/dmag':>15}")
        for r in s["overlap"]:
            print(f"{r[0]:>6} {r[6]:>15} {r[7]:>7} {r[8]:>7} {r[9]:>15}")
    if "latency" in s:
        for r in s["latency"]:
            print(f"{r[0]} KiB latency {r[1]}: p50 {r[2]} us, p99 {r[3]} us")
    if multi_gpu_rs is not None:
        multi_gpu_rs.report(args, world, s)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        if "busbw" in s:
            fig, ax = plt.subplots(figsize=(6, 4))
            x = [r[0] for r in s["busbw"]]
            ax.plot(x, [r[3] for r in s["busbw"]], "o-", label="dmagather (copy engines)")
            ax.plot(x, [r[4] for r in s["busbw"]], "s-", label="NCCL")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("MiB per rank")
            ax.set_ylabel("bus bandwidth (GB/s)")
            ax.set_title(f"AllGather, {world} GPUs")
            ax.legend()
            ax.grid(alpha=0.3)
            fig.tight_layout()
            fig.savefig(os.path.join(args.out, "busbw.png"), dpi=110)
    except ImportError:
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", default=os.environ.get("DMAGATHER_SOCKET"))
    p.add_argument("--ranks", type=int, default=torch.cuda.device_count())
    p.add_argument("--parts", default=None,
                   help="comma-separated, of " + ",".join(PARTS) + " (default: all of them)")
    p.add_argument("--max_bytes", type=int, default=1 << 30,
                   help="largest shard of busbw, largest output per rank of rs_busbw (bytes)")
    p.add_argument("--overlap_gemms", type=int, default=20)
    p.add_argument("--latency_iters", type=int, default=200)
    p.add_argument("--correct_max_mib", type=int, default=64,
                   help="largest shard of correct, largest output per rank of rs_correct (MiB)")
    p.add_argument("--latency_kib", default="64,1024,2048,4096", help="sizes per rank for the latency part")
    p.add_argument("--rank_visible", default="",
                   help="GPU UUIDs (or indices), comma-separated: rank r sees only entry r %% n")
    p.add_argument("--out", default="results/multi_gpu")
    p.add_argument("--port", type=int, default=29531)
    p.add_argument("--job", default=str(os.getpid()))
    args = p.parse_args()
    if args.parts is None:
        args.parts = ",".join(x for x in PARTS if multi_gpu_rs is not None or not x.startswith("rs_"))
        if multi_gpu_rs is None:
            print(f"no reduce-scatter parts: multi_gpu_rs.py did not import ({RS_MISSING})", flush=True)
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        p.error(f"unknown part(s) {', '.join(sorted(unknown))}: the parts are {','.join(PARTS)}")
    if multi_gpu_rs is None and "rs_" in args.parts:
        p.error(f"--parts={args.parts}: multi_gpu_rs.py did not import ({RS_MISSING})")
    os.makedirs(args.out, exist_ok=True)
    gpus = len(args.rank_visible.split(",")) if args.rank_visible else torch.cuda.device_count()
    args.nccl = args.ranks <= gpus  # NCCL refuses several ranks on one GPU
    if not args.nccl:
        print(f"{args.ranks} ranks on {gpus} GPU(s): a gloo group, dmagather only (no NCCL columns)", flush=True)
    mp.spawn(worker, args=(args.ranks, args), nprocs=args.ranks, join=True)
    report(args, args.ranks)
    ctl = os.environ.get("DMAGATHERCTL")
    if ctl:
        stats = subprocess.run([ctl, f"--socket={args.socket}", "--json", "stats"], capture_output=True, text=True)
        with open(os.path.join(args.out, "dmagather_stats.json"), "w") as f:
            f.write(stats.stdout)
        same = json.loads(stats.stdout or "{}").get("same_device_copies", "0")
        print(f"daemon same-device copies during the run: {same} (must be 0 with one rank per GPU)")


if __name__ == "__main__":
    main()
