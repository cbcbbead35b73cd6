"""The reduce-scatter parts of multi_gpu_bench.py (docs/REDUCE.md): dmagather against NCCL.

  rs_correct  bf16 and fp32, SUM and AVG, 1 element .. --correct_max_mib per rank output, in and out of
              place: bit-exact against a reference computed with torch on the GPU (chunk `rank` of every
              rank's regenerated input, summed in float32 strictly in rank order, AVG as a float32
              division by the rank count, rounded once to the dtype); NCCL's result on the same input
              beside it (max abs difference, fraction of elements that differ, and by more than 1 ulp:
              NCCL rounds at every ring step and adds in ring order, so last-bit differences are
              expected; they are reported, not failures)
  rs_busbw    bf16 SUM, 1 MiB .. --max_bytes output per rank (input: world x output); bus bandwidth
              (world-1)/world x input bytes / time (NCCL's busbw for a reduce-scatter)
  rs_overlap  the bf16 GEMM loop of `overlap` with reduce-scatters of 8..256 MiB output per rank on a
              side stream: the copies run on copy engines, only the sum (a grid of a quarter of the
              SMs at most, for a short time) competes with the GEMM
Called by multi_gpu_bench.worker / report with that module's helpers (time_loop, write_csv).
"""
import os

import torch
import torch.distributed as dist

import dmagather

MiB = 1 << 20
OPS = {"sum": (dmagather.SUM, dist.ReduceOp.SUM), "avg": (dmagather.AVG, dist.ReduceOp.AVG)}
BITS = {torch.bfloat16: torch.int16, torch.float32: torch.int32}  # the integer view a bit comparison uses
SIZES_OVERLAP_MIB = (8, 32, 64, 128, 256)
NCCL_NOTE = {"bfloat16": "NCCL rounds the partial sum to bf16 at every ring step and adds in ring order: "
                         "last-bit differences expected",
             "float32": "NCCL adds in ring order (float32 addition is not associative): last-bit differences "
                        "expected"}


def rs_input(seed, rank, n, dt, dev):
    """Rank `rank`'s input of case `seed`: n values of dtype dt, deterministic in (seed, rank), so any
    rank can regenerate any other rank's input. Normal values scaled by 2^-6..2^6, so the sums add
    operands of different exponents (where the rounding matters), with zeros, negative zeros (at
    the same places on every rank: their sum is -0) and float32 subnormals among them."""
    g = torch.Generator(device=dev)
    g.manual_seed(seed * 1000003 + rank)
    x = torch.randn(n, generator=g, dtype=torch.float32, device=dev)
    e = torch.randint(-6, 7, (n,), generator=g, dtype=torch.int32, device=dev)
    x = torch.ldexp(x, e)
    x[::97] = 0.0
    x[5::101] = -0.0
    sub = x[3::89]
    sub.copy_((torch.rand(sub.numel(), generator=g, dtype=torch.float32, device=dev) * 2 - 1)
              * torch.finfo(torch.float32).tiny)
    return x.to(dt)


def rs_reference(seed, rank, world, count, dt, dev, opname):
    """docs/REDUCE.md's result for this rank, computed independently of dmagather: chunk `rank` of
    every rank's regenerated input, widened to float32 and summed strictly in rank order (one IEEE
    float32 addition per rank), AVG as a float32 division, then rounded once to dt (round to
    nearest even)."""
    acc = None
    for r in range(world):
        x = rs_input(seed, r, world * count, dt, dev)[rank * count:(rank + 1) * count].float()
        acc = x.clone() if acc is None else acc + x
    if opname == "avg":
        # A tensor divisor: torch's GPU kernel computes a division by a Python (CPU) scalar as a
        # multiplication by its reciprocal, which may differ from the division in the last bit.
        acc = acc / torch.full_like(acc, float(world))
    return acc.to(dt)


def ordered_bits(t):
    """The bits of t as int64 in the order of the values (-0 and +0 both 0): the difference of two is
    their distance in ulps (large only where a sum cancels to near zero)."""
    ib = BITS[t.dtype]
    b = t.view(ib).to(torch.int64)
    mag = b & (0x7FFF if ib is torch.int16 else 0x7FFFFFFF)
    return torch.where(b < 0, -mag, mag)


def nccl_rs(inp, out, op=dist.ReduceOp.SUM, stream=None):
    if stream is None:
        dist.reduce_scatter_tensor(out, inp, op=op)
    else:
        with torch.cuda.stream(stream):
            dist.reduce_scatter_tensor(out, inp, op=op)


def make_buffers(seed, rank, world, count, dt, dev, variant):
    """(send, recv) of one case: recv is send's chunk `rank` in place, else NaN-filled memory (what a
    missing write leaves is no valid result)."""
    send = rs_input(seed, rank, world * count, dt, dev)
    if variant == "in_place":
        return send, send[rank * count:(rank + 1) * count]
    return send, torch.full((count,), float("nan"), dtype=dt, device=dev)


def rs_case(args, rank, world, dm, dev, dt, opname, count, variant, seed):
    """One case on every rank: (CSV row, whether any rank's bits differ from the reference)."""
    ib = BITS[dt]
    send, recv = make_buffers(seed, rank, world, count, dt, dev, variant)
    dm.reduce_scatter(send, recv, op=OPS[opname][0])  # On the current stream: the reads below follow it.
    ref = rs_reference(seed, rank, world, count, dt, dev, opname)
    # Elements: off the reference, all, NCCL's bits off ours, NCCL more than 1 ulp off ours.
    sums = [int((recv.view(ib) != ref.view(ib)).sum()), count, 0, 0]
    max_abs = float("nan")  # NCCL's largest absolute difference from ours
    if args.nccl:
        send_n, recv_n = make_buffers(seed, rank, world, count, dt, dev, variant)
        nccl_rs(send_n, recv_n, op=OPS[opname][1])
        sums[2] = int((recv_n.view(ib) != recv.view(ib)).sum())
        sums[3] = int(((ordered_bits(recv_n) - ordered_bits(recv)).abs() > 1).sum())
        max_abs = float((recv_n.float() - recv.float()).abs().max())
        del send_n, recv_n
    where = dev if args.nccl else "cpu"  # gloo (ranks sharing GPUs) reduces CPU tensors
    s = torch.tensor(sums, dtype=torch.int64, device=where)
    m = torch.tensor([max_abs], dtype=torch.float64, device=where)
    dist.all_reduce(s)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    off_ref, elems, off_nccl, over_ulp = (int(v) for v in s.tolist())
    name = str(dt).replace("torch.", "")
    nan = float("nan")
    row = [name, opname, count, variant, "PASSED" if off_ref == 0 else "FAILED", off_ref, elems]
    if args.nccl:
        row += [off_nccl, over_ulp, m.item(), round(off_nccl / elems, 6), NCCL_NOTE[name] if off_nccl else ""]
    else:
        row += [nan, nan, nan, nan, "no NCCL (ranks share GPUs)"]
    del send, recv, ref
    dist.barrier()  # Every rank's op is done before its buffers go back to the allocator.
    return row, off_ref != 0


def part_rs_correct(args, rank, world, dm, dev):
    rows, failures = [], []
    seed = 100000  # Apart from part_correct's seeds.
    for dt in (torch.bfloat16, torch.float32):
        es = torch.empty(0, dtype=dt).element_size()
        big = args.correct_max_mib * MiB // es
        counts = sorted({c for c in (1, 3, 4095, MiB + 7) if c * es <= args.correct_max_mib * MiB} | {big})
        for opname in ("sum", "avg"):
            for count in counts:
                for variant in ("out_of_place", "in_place"):
                    seed += 1
                    row, bad = rs_case(args, rank, world, dm, dev, dt, opname, count, variant, seed)
                    rows.append(row)
                    if bad:
                        failures.append(f"{row[0]} {opname} count={count} {variant}: {row[5]} elements differ")
    dm.comm.wait()
    return rows, failures


def nccl_summary(rows):
    """Per dtype and op over the sizes and variants: [dtype, op, NCCL's largest absolute difference
    from ours, fraction of all ranks' output elements whose bits differ, fraction more than 1 ulp off]."""
    out = {}
    for r in rows:
        o = out.setdefault((r[0], r[1]), [r[0], r[1], 0.0, 0, 0, 0])
        o[2] = max(o[2], r[9])
        o[3], o[4], o[5] = o[3] + r[7], o[4] + r[8], o[5] + r[6]
    return [[o[0], o[1], o[2], round(o[3] / o[5], 6), round(o[4] / o[5], 6)] for o in out.values()]


def part_rs_busbw(args, rank, world, dm, dev, time_loop):
    rows = []
    size = MiB  # output bytes per rank
    while size <= args.max_bytes:
        out = torch.empty(size // 2, dtype=torch.bfloat16, device=dev)
        inp = torch.empty(world * out.numel(), dtype=torch.bfloat16, device=dev).normal_()
        iters = max(5, min(100, (8 << 30) // (size * world)))
        t_d = time_loop(lambda: dm.reduce_scatter(inp, out), iters)
        t_n = time_loop(lambda: nccl_rs(inp, out), iters) if args.nccl else float("nan")
        bus = lambda t: (world - 1) / world * size * world / (t / 1e3) / 1e9  # noqa: E731
        rows.append([size // MiB, size * world // MiB, round(t_d, 4), round(t_n, 4), round(bus(t_d), 2),
                     round(bus(t_n), 2), round(bus(t_d) / bus(t_n), 3)])
        dist.barrier()
        out = inp = None  # Freed before the next size is allocated.
        size *= 2
    return rows


def part_rs_overlap(args, rank, world, dm, dev, gemm_overlap):
    def make(mib):
        out = torch.empty(mib * MiB // 2, dtype=torch.bfloat16, device=dev)
        inp = torch.empty(world * out.numel(), dtype=torch.bfloat16, device=dev).normal_()
        return (lambda s: dm.reduce_scatter(inp, out, stream=s)), (lambda s: nccl_rs(inp, out, stream=s))
    return gemm_overlap(args, dev, SIZES_OVERLAP_MIB, make)


def run_parts(args, rank, world, dm, dev, parts, summary, time_loop, write_csv, gemm_overlap):
    """The rs_* parts named in `parts`, in order; CSVs and summary entries on rank 0."""
    if not dmagather.has_reduce_scatter():
        raise RuntimeError("this libdmagather.so has no dmagather_reduce_scatter: the rs_* parts need it")
    path = lambda name: os.path.join(args.out, name)  # noqa: E731
    if "rs_correct" in parts:
        rows, failures = part_rs_correct(args, rank, world, dm, dev)
        bad = torch.tensor([len(failures)], device=dev if args.nccl else "cpu")
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # Each case's verdict is already every rank's.
        summary["rs_correct"] = int(bad.item())
        if rank == 0:
            write_csv(path("rs_correct.csv"),
                      ["dtype", "op", "count_per_rank", "variant", "result", "elements_differing_from_reference",
                       "elements_all_ranks", "nccl_elements_differing", "nccl_elements_over_1ulp", "nccl_max_abs_diff",
                       "nccl_fraction_differing", "nccl_note"], rows)
            summary["rs_correct_nccl"] = nccl_summary(rows) if args.nccl else []
            summary["rs_correct_note"] = ("dmagather: bit-exact against float32 accumulation in rank order, "
                                          "rounded once. bfloat16: " + NCCL_NOTE["bfloat16"] + ". float32: " +
                                          NCCL_NOTE["float32"])
        if failures and rank == 0:
            print(f"rs_correct: FAILED {failures[:5]}", flush=True)
    if "rs_busbw" in parts:
        rows = part_rs_busbw(args, rank, world, dm, dev, time_loop)
        if rank == 0:
            write_csv(path("rs_busbw.csv"), ["MiB_out_per_rank", "MiB_in_per_rank", "dmag_ms", "nccl_ms",
                                             "dmag_busbw", "nccl_busbw", "ratio"], rows)
            summary["rs_busbw"] = rows
    if "rs_overlap" in parts:
        rows = part_rs_overlap(args, rank, world, dm, dev, gemm_overlap)
        if rank == 0:
            write_csv(path("rs_overlap.csv"),
                      ["RS_out_MiB", "gemm_alone_ms", "rs_alone_dmag_ms", "rs_alone_nccl_ms", "both_dmag_ms",
                       "both_nccl_ms", "gemm_TFs_alone", "gemm_TFs_with_dmag", "gemm_TFs_with_nccl",
                       "wall_nccl_over_dmag"], rows)
            summary["rs_overlap"] = rows


def report(args, world, s):
    """Rank 0's tables of the rs_* parts, and rs_busbw.png."""
    if "rs_correct" in s:
        n = s["rs_correct"]
        print(f"reduce-scatter correctness: {'all PASSED' if n == 0 else str(n) + ' FAILED'} "
              f"(bit-exact against float32 accumulation in rank order, rounded once)")
        for r in s.get("rs_correct_nccl", []):
            print(f"  NCCL {r[0]} {r[1]}: {100 * r[3]:.4f}% of elements differ from ours, {100 * r[4]:.4f}% by "
                  f"more than 1 ulp, max abs diff {r[2]:.3g} (expected: NCCL adds in ring order, rounding "
                  f"each step to the dtype)")
    if "rs_busbw" in s:
        print(f"{'RS out MiB/rank':>15} {'dmag GB/s':>10} {'nccl GB/s':>10} {'ratio':>6}")
        for r in s["rs_busbw"]:
            print(f"{r[0]:>15} {r[4]:>10} {r[5]:>10} {r[6]:>6}")
    if "rs_overlap" in s:
        print(f"{'RS MiB':>6} {'GEMM TF/s alone':>15} {'+dmag':>7} {'+nccl':>7} {'wall nccl/dmag':>15}")
        for r in s["rs_overlap"]:
            print(f"{r[0]:>6} {r[6]:>15} {r[7]:>7} {r[8]:>7} {r[9]:>15}")
    if "rs_busbw" not in s:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [r[0] for r in s["rs_busbw"]]
    ax.plot(x, [r[4] for r in s["rs_busbw"]], "o-", label="dmagather (copy engines + sum kernel)")
    ax.plot(x, [r[5] for r in s["rs_busbw"]], "s-", label="NCCL")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("output MiB per rank")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"ReduceScatter bf16 sum, {world} GPUs")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "rs_busbw.png"), dpi=110)
