"""python -m dmagather.check: the adapter end to end, as a trainer calls it.

Spawns --world rank processes (torch.multiprocessing, gloo process group),
each calls dmagather.torch.all_gather_into_tensor(flat output, its own shard,
async_op=True) and Work.wait(). Prints

    backend: host (dmagather 0.4.0, 3 ranks, device cpu, framework gloo)
    bfloat16 PASSED
    float16 PASSED
    float32 PASSED
    data_MB avg_ms min_ms max_ms algo_BW
    ...

data_MB is the gathered output, algo_BW = data_MB / avg time (GB/s), times are
the slowest rank's per iteration. Exit status 1 when a dtype FAILED.
Needs a running dmagatherd (DMAGATHER_SOCKET or --socket). --device cuda: CUDA
tensors from the caching allocator (all ranks on the current GPU round-robin).
"""
import argparse
import os
import sys
import tempfile
import time

DTYPES = ("bfloat16", "float16", "float32")


def _expected_shard(torch, rank, count, dtype, device):
    g = torch.Generator(device="cpu").manual_seed(7919 * (rank + 1) + count)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8).view(dtype).to(device)


def _rank(rank, args, store, q):
    import torch
    import torch.distributed as dist
    import datetime
    import logging
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    import dmagather
    import dmagather.torch as dt
    try:
        device = torch.device("cpu")
        if args.device == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=args.world,
                                timeout=datetime.timedelta(seconds=120))
        a = dt.init(enabled=True, socket=args.socket)
        world = args.world

        def buf(count, dtype):
            return a.empty(count, dtype=dtype, device=device) if device.type == "cpu" else \
                torch.empty(count, dtype=dtype, device=device)

        lines = []
        ok_all = True
        for name in DTYPES:
            dtype = getattr(torch, name)
            ok = True
            for count in (1, 1000, 65537):
                inp = buf(count, dtype)
                inp.copy_(_expected_shard(torch, rank, count, dtype, device))
                out = buf(world * count, dtype)
                out.view(torch.uint8).fill_(0xA5)
                dt.all_gather_into_tensor(out, inp, async_op=True).wait()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                want = torch.cat([_expected_shard(torch, r, count, dtype, device) for r in range(world)])
                ok = ok and torch.equal(out.view(torch.uint8), want.view(torch.uint8))
            flags = torch.tensor([0 if ok else 1], dtype=torch.int64)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            ok = flags.item() == 0
            ok_all = ok_all and ok
            lines.append(f"{name} {'PASSED' if ok else 'FAILED'}")
        table = ["data_MB avg_ms min_ms max_ms algo_BW"]
        for size in args.sizes:
            count = max(1, size // 4 // world)
            inp = buf(count, torch.float32)
            out = buf(world * count, torch.float32)
            times = []
            for it in range(args.warmup + args.iters):
                dist.barrier()
                t0 = time.perf_counter()
                dt.all_gather_into_tensor(out, inp, async_op=True).wait()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t1 = time.perf_counter()
                if it >= args.warmup:
                    times.append(t1 - t0)
            tt = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            mb = out.numel() * 4 / 1e6
            avg = tt.mean().item()
            table.append(f"{mb:.3f} {avg * 1e3:.3f} {tt.min().item() * 1e3:.3f} {tt.max().item() * 1e3:.3f} "
                         f"{mb / 1e3 / avg:.2f}")
        st = a.stats()
        if a.enabled:
            header = f"backend: {a.backend} (dmagather {dmagather.library_version()}, {world} ranks, " \
                     f"device {device.type}, framework {a.framework_backend})"
        else:
            header = f"backend: {a.framework_backend} (dmagather unavailable: {st['unavailable']})"
        dt.shutdown()
        dist.destroy_process_group()
        if rank == 0:
            q.put((ok_all, [header] + lines + table, st))
    except BaseException as e:  # noqa: BLE001
        q.put((False, [f"rank {rank}: {type(e).__name__}: {e}"], None))
        raise


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dmagather.check", description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=int(os.environ.get("DMAGATHER_CHECK_WORLD", "4")))
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--socket", default=os.environ.get("DMAGATHER_SOCKET"))
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1 << 16, 1 << 20, 16 << 20], help="gathered bytes, comma separated")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="dmagather-check-") as d:
        store = os.path.join(d, "store")
        procs = [ctx.Process(target=_rank, args=(r, args, store, q)) for r in range(args.world)]
        for pr in procs:
            pr.start()
        try:
            ok, lines, _ = q.get(timeout=600)
        except Exception:  # noqa: BLE001
            ok, lines = False, ["no result within 600 s"]
        for pr in procs:
            pr.join(60)
            if pr.is_alive():
                pr.kill()
    print("\n".join(lines), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
