#!/usr/bin/env python3
"""Where a rank's done-wait goes, and the rank's compute beside a gather it
does not consume yet (docs/CUDA.md, "The rank's side").

    DMAGATHER_SOCKET=/path/dmagatherd.sock PYTHONPATH=/path/to/client/python \\
    DMAGATHER_LIB=/path/libdmagather.so \\
    python3 -m torch.distributed.run --nproc_per_node 2 bench/gpu/consumer_wait.py [--reps 3]

Two ranks (gloo for the barrier; the gather is dmagather's on the cuda
backend). Rank 0 submits a 4 MiB-per-rank all-gather on a side stream, as
FSDP2 and ZeRO-3 prefetch the next layer's, then enqueues 17 bf16 8192^3
GEMMs on its compute stream; rank 1 submits its part 50 ms later, so the op
cannot finish before then. Two arms:
  submit    the done-wait is enqueued on the side stream at submit
            (order_now=True: what dist.all_gather_into_tensor does)
  consumer  no wait at submit; the consumer's stream waits where it uses the
            output (Work.wait_on, as the zero-copy FSDP2 and ZeRO-3 paths do)
Prints one JSON line per arm and repetition: GEMMs completed before the op
completed (`before`), the GEMMs' wall time, a GEMM alone, and whether the
output is bit-exact. With CUDA_DEVICE_MAX_CONNECTIONS=1 every stream of the
process feeds one hardware queue, so a parked wait holds back the GEMMs
enqueued after it ("submit": before = 0); "consumer" lets them run.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gemms", type=int, default=17)
    ap.add_argument("--delay-ms", type=float, default=50.0)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(0)
    import dmagather.torch as dt
    a = dt.init(enabled=True)
    n = (4 << 20) // 4
    inp = torch.full((n,), float(rank + 1), device="cuda")
    out = torch.empty(n * world, device="cuda")
    ref = torch.cat([torch.full((n,), float(r + 1), device="cuda") for r in range(world)])
    side = torch.cuda.Stream()
    m = 8192
    A = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    C = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(A, B, out=C)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        torch.mm(A, B, out=C)
    torch.cuda.synchronize()
    gemm_ms = (time.perf_counter() - t) * 100.0
    # The signature served (stream-ordered from now on).
    for _ in range(3):
        with torch.cuda.stream(side):
            a.all_gather_into_tensor(out, inp)
    torch.cuda.synchronize()
    conns = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "unset")
    for arm in ("submit", "consumer"):
        for rep in range(args.reps):
            out.zero_()
            torch.cuda.synchronize()
            dist.barrier()
            if rank != 0:
                time.sleep(args.delay_ms / 1000.0)
            with torch.cuda.stream(side):
                w = a.all_gather_into_tensor(out, inp, async_op=True, order_now=(arm == "submit"))
            t0 = time.perf_counter()
            evs = []
            if rank == 0:
                for _ in range(args.gemms):
                    torch.mm(A, B, out=C)
                    e = torch.cuda.Event()
                    e.record()
                    evs.append(e)
            done = {}
            op_t = None
            while len(done) < len(evs) or op_t is None:
                now = time.perf_counter()
                for i, e in enumerate(evs):
                    if i not in done and e.query():
                        done[i] = now
                if op_t is None and w.is_completed():
                    op_t = now
            w.wait_on(torch.cuda.current_stream().cuda_stream)  # the consumer
            exact = bool(torch.equal(out, ref))
            torch.cuda.synchronize()
            if rank == 0:
                before = sum(1 for v in done.values() if v < op_t)
                print(json.dumps({"connections": conns, "arm": arm, "rep": rep, "before": before,
                                  "gemms": len(evs), "op_ms": round((op_t - t0) * 1e3, 2),
                                  "gemms_ms": round((max(done.values()) - t0) * 1e3, 2),
                                  "gemm_alone_ms": round(gemm_ms, 3), "exact": exact}), flush=True)
            elif not exact:
                print(json.dumps({"rank": rank, "arm": arm, "rep": rep, "exact": False}), flush=True)
    dt.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
