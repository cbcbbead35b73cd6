"""The rank side of tools/amd/first_contact.sh: checks on a real AMD node
(ROCm PyTorch, one rank per GPU, RCCL for the framework collective), against
the running dmagatherd --backend=hip at $DMAGATHER_SOCKET. Each check prints
one line "PASS|FAIL|SKIP <claim>: <detail>" for the report.

    python3 first_contact.py ranks [--world N]   bit-exact, stale-read, RCCL beside
    python3 first_contact.py peers               bandwidth GPU 0 <-> each peer
    python3 first_contact.py bad_stream          a bad stream is INVALID_ARGUMENT

Nothing here has run on AMD hardware yet: it is the script that does so first.
"""
import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time

DTYPES = ("bfloat16", "float16", "float32")
COUNTS = (1, 3, 4095, 1048583)


def _line(ok, claim, detail):
    return f"{'PASS' if ok else 'FAIL'} {claim}: {detail}"


def _shard(torch, rank, count, dtype, device):
    g = torch.Generator(device="cpu").manual_seed(7919 * (rank + 1) + count)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8).view(dtype).to(device)


def _rank(rank, args, store, q):
    import torch
    import torch.distributed as dist
    import dmagather.torch as dt
    lines = []
    try:
        torch.cuda.set_device(args.devices[rank])
        dev = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=args.world,
                                timeout=datetime.timedelta(seconds=300))
        a = dt.init(enabled=True, socket=args.socket)
        world = args.world

        def agree(ok):
            t = torch.tensor([0 if ok else 1], dtype=torch.int64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t.item() == 0

        backend_ok = agree(a.enabled and a.backend == "hip")
        lines.append(_line(backend_ok, "ranks use the hip backend",
                           f"backend {a.backend if a.enabled else 'disabled'}, {world} ranks on GPUs {args.devices}"))

        # 1. Bit-exact, one rank per GPU, every dtype x count, out of place.
        bad = []
        for name in DTYPES:
            dtype = getattr(torch, name)
            for count in COUNTS:
                inp = _shard(torch, rank, count, dtype, dev)
                out = torch.empty(world * count, dtype=dtype, device=dev)
                out.view(torch.uint8).fill_(0xA5)
                dt.all_gather_into_tensor(out, inp, async_op=True).wait()
                want = torch.cat([_shard(torch, r, count, dtype, dev) for r in range(world)])
                if not torch.equal(out.view(torch.uint8), want.view(torch.uint8)):
                    bad.append(f"{name}x{count}")
        ok = agree(not bad)
        lines.append(_line(ok, "AllGather is bit-exact (one rank per GPU)",
                           f"{len(DTYPES) * len(COUNTS)} cases" + (f", rank 0 wrong: {bad}" if bad else "")))

        # 2. Stale read: SDMA writes bypass the consumer's L2. The output
        # block is read by a kernel first (its lines cached in L2), freed,
        # handed out again by the caching allocator, gathered into, and read
        # by a kernel right after the stream-ordered wait: no host sync.
        count, iters, stale = 1 << 20, args.stale_iters, 0
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for it in range(iters):
                out = torch.full((world * count,), float(it % 7 + 1), dtype=torch.float32, device=dev)
                _ = out.sum()  # Cache the output's lines in L2.
                del out
                out = torch.empty(world * count, dtype=torch.float32, device=dev)  # The same block again.
                inp = torch.full((count,), float(1000 * (rank + 1) + it), dtype=torch.float32, device=dev)
                dt.all_gather_into_tensor(out, inp, async_op=True).wait()  # Stream-ordered.
                want = torch.cat([torch.full((count,), float(1000 * (r + 1) + it), dtype=torch.float32, device=dev)
                                  for r in range(world)])
                stale += int((out != want).sum().item() > 0)
        torch.cuda.synchronize()
        ok = agree(stale == 0)
        lines.append(_line(ok, "no stale reads after an op (SDMA bypasses L2; event release/acquire)",
                           f"{iters} ops of {count * 4 >> 20} MiB per rank, {stale} with stale data on rank 0"))

        # 3. Bandwidth beside RCCL, same sizes, same process group.
        for mib in args.sizes_mib:
            count = (mib << 20) // 2
            inp = torch.randn(count, device=dev).to(torch.bfloat16)
            out_d = torch.empty(world * count, dtype=torch.bfloat16, device=dev)
            out_r = torch.empty_like(out_d)
            res = {}
            for label, fn in (("dmagather", lambda: dt.all_gather_into_tensor(out_d, inp, async_op=True).wait()),
                              ("rccl", lambda: dist.all_gather_into_tensor(out_r, inp))):
                for _ in range(args.warmup):
                    fn()
                torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    fn()
                torch.cuda.synchronize()
                res[label] = (time.perf_counter() - t0) / args.iters
            same = agree(torch.equal(out_d.view(torch.uint8), out_r.view(torch.uint8)))
            gb = world * count * 2 / 1e9
            lines.append(_line(same, f"{mib} MiB/rank beside RCCL (same output)",
                               f"dmagather {gb / res['dmagather']:.1f} GB/s, RCCL {gb / res['rccl']:.1f} GB/s "
                               f"(algo BW, rank 0's time)"))
        dt.shutdown()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001
        lines.append(_line(False, f"rank {rank} ran to the end", f"{type(e).__name__}: {e}"))
    q.put((rank, lines))


def _spawn(args):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="dmagather-first-contact-") as d:
        store = os.path.join(d, "store")
        procs = [ctx.Process(target=_rank, args=(r, args, store, q)) for r in range(args.world)]
        for p in procs:
            p.start()
        got = {}
        try:
            for _ in procs:
                r, lines = q.get(timeout=args.timeout)
                got[r] = lines
        except Exception:  # noqa: BLE001
            pass
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    if 0 not in got:
        return [_line(False, "ranks finished", f"no result from rank 0 within {args.timeout} s")]
    extra = [l for r, ls in sorted(got.items()) if r != 0 for l in ls if "ran to the end" in l]
    return got[0] + extra


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("ranks", "peers", "bad_stream"))
    p.add_argument("--world", type=int, default=0, help="ranks (default: every visible GPU)")
    p.add_argument("--socket", default=os.environ.get("DMAGATHER_SOCKET"))
    p.add_argument("--sizes_mib", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--stale_iters", type=int, default=200)
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args(argv)
    import torch
    n = torch.cuda.device_count()
    if n == 0:
        print(_line(False, "PyTorch sees the GPUs", "torch.cuda.device_count() is 0 (a ROCm build of torch?)"))
        return 1
    if args.what == "bad_stream":
        # In a child: on ROCm 7 without the check this crashes the process.
        code = "\n".join([
            "import os, torch, dmagather as d",
            "torch.cuda.set_device(0)",
            f"c = d.Comm('fc-bad-stream-' + str(os.getpid()), 1, 0, socket={args.socket!r})",
            "x = torch.ones(4, device='cuda'); y = torch.empty(4, device='cuda')",
            "try:",
            "    c.allgather(x, y, stream=0xdead0)",
            "    print('NO_ERROR')",
            "except d.DmagatherError as e:",
            "    print(e.status, e.message)",
        ])
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        out = (r.stdout.strip().splitlines() or [""])[-1]
        ok = r.returncode == 0 and out.startswith("INVALID_ARGUMENT")
        print(_line(ok, "a bad stream is INVALID_ARGUMENT (no crash)",
                    f"exit {r.returncode}, {out or r.stderr.strip()[-200:]}"))
        return 0 if ok else 1
    if args.what == "peers":
        lines = []
        for peer in range(1, n):
            args.world, args.devices, args.stale_iters = 2, [0, peer], 0
            got = _spawn(args)
            for l in got:
                if "beside RCCL" in l or l.startswith("FAIL"):
                    lines.append(l.replace(" beside RCCL", f" GPU 0<->{peer} beside RCCL", 1))
        print("\n".join(lines))
        return 0 if all(not l.startswith("FAIL") for l in lines) else 1
    args.world = args.world or n
    args.devices = list(range(args.world))
    lines = _spawn(args)
    print("\n".join(lines))
    return 0 if all(not l.startswith("FAIL") for l in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
