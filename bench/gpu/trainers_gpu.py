#!/usr/bin/env python3
"""dmagather.torch on CUDA, as trainers use it (docs/TRAINERS.md): several rank processes on ONE GPU.

    DMAGATHER_SOCKET=/path/to/dmagatherd.sock        # a running `dmagatherd --backend=cuda`
    PYTHONPATH=/path/to/client/python                 # the dmagather package (libdmagather.so next to
                                                      # it, or DMAGATHER_LIB=/path/libdmagather.so)
    python3 bench/gpu/trainers_gpu.py --out DIR [--world 4] [--steps 8] [--parts adapter,zero3,fsdp2,overhead]

The process group is gloo (NCCL refuses several ranks on one GPU; gloo does
broadcast/all_reduce on CUDA tensors), so every reference below is built from
gloo broadcast/all_reduce. Parts:

  adapter   dmagather.torch.all_gather_into_tensor / all_gather_coalesced with CUDA
            caching-allocator tensors, fresh output (and input) per gather as ZeRO-3
            does, every dtype, odd sizes, in place and out of place, sync and
            async_op=True (Work.wait() on the current stream); bit-exact against shards
            regenerated on every rank. Signatures repeat, so both the host-waited first
            op and the stream-ordered later ops are checked (their counts are printed).
  zero3     install() (DMAGATHER_ALLGATHER=1) routes dist.all_gather_into_tensor; a
            ZeRO-3-style loop (gather each layer's weight before use, free it after,
            backward, gradient all_reduce, SGD on the shard) for --steps steps against the
            same loop whose gather is gloo broadcast: losses and shards bit-identical,
            and dmagather must have served every gather (no fallback).
  fsdp2     fully_shard (torch >= 2.11) model of Linear-GELU-Linear blocks, --steps Adam
            steps with set_custom_all_gather(dmagather.torch.FSDPAllGather()) against the
            same run with a gloo-broadcast all-gather; both runs share one test-only
            reduce-scatter built from gloo all_reduce (set_custom_reduce_scatter). Loss per
            step and every parameter shard bit-identical.
  vmm       run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (checked): caching-
            allocator tensors in expandable segments (VMM), sizes growing from 64 KiB to 96 MiB
            per shard so segments grow and tensors span several mapped chunks, in place and
            out of place, torch.cuda.empty_cache() between steps (segments shrink: the same
            addresses come back with new physical memory), then shrinking sizes; bit-exact,
            and dmagather must serve every op (no fallback).
  graph     torch.cuda.graph capture of copy-in (producer) -> dmagather.torch.all_gather_into_tensor
            -> copy-out (consumer) on static tensors (warmed up outside the graph), replayed 30
            times with a new input each time (device-to-device copies before each replay, no
            host sync), every replay's output kept and compared bit-exact at the end.
  fsdp2_hf  a Hugging Face Llama (transformers, from a config: 4 layers, hidden 1024, random
            init), bf16 mixed precision, AdamW, --steps steps, three times: FSDP2's all-gather by
            gloo broadcast (reference), FSDPAllGather with FSDP2's copy-in/copy-out
            (zero-copy unshard inactive), FSDPAllGather with the zero-copy unshard. Losses and
            shards bit-identical; rank 0 profiles the last step (torch profiler: SM kernels and
            memcpys launched under FSDP2's all-gather ranges), peak memory, step time p50.
            Writes DIR/fsdp2_hf.json. Run it also with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
  fsdp2_hf_fp32  the same in fp32 (no mixed precision: no cast, so the zero-copy unshard's own
            shards are the items' sends, copied by the library on a copy engine): expected
            under FSDP2's all-gather ranges, no kernel, only those copies. DIR/fsdp2_hf_fp32.json.
  overhead  host µs per call of the Python path (dmagather.torch.all_gather_into_tensor,
            stream-ordered) against the C API (dmagather_allgather through ctypes) for
            shards of 4 KiB .. 1 MiB, plus end-to-end µs (call + cudaStreamSynchronize).

Writes DIR/results.json, DIR/overhead.csv, DIR/fsdp2_loss.csv, DIR/zero3_loss.csv and
prints a table. Exit status 0 only if every part ran and matched.
"""
import argparse
import csv
import json
import os
import struct
import sys
import tempfile
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before CUDA starts
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_k, _v)

HERE = os.path.dirname(os.path.abspath(__file__))
_SRC_PKG = os.path.join(HERE, "..", "..", "client", "python")
if os.path.isdir(_SRC_PKG):
    sys.path.append(_SRC_PKG)  # after PYTHONPATH

PARTS = ("adapter", "zero3", "fsdp2", "overhead", "vmm", "graph", "fsdp2_hf", "fsdp2_hf_fp32")
SIZES_OVERHEAD = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)


def fbits(x):
    return struct.pack("<d", float(x)).hex()


def shard_bits(torch, seed, rank, nbytes, device):
    g = torch.Generator(device="cpu")
    g.manual_seed(seed * 1000003 + rank)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).to(device)


def bcast_gather(torch, dist, out, inp, group=None):
    """Reference all_gather_into_tensor: gloo broadcast of each rank's bytes (bit-exact, any dtype)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    o = out.view(-1).view(torch.uint8)
    n = inp.numel() * inp.element_size()
    mine = inp.reshape(-1).view(torch.uint8)
    for r in range(world):
        dst = o[r * n:(r + 1) * n]
        if r == rank and dst.data_ptr() != mine.data_ptr():
            dst.copy_(mine)
        src = r if group is None else dist.get_global_rank(group, r)
        dist.broadcast(dst, src=src, group=group)


def any_rank(torch, dist, flag):
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


# ---- parts (every rank runs them; rank 0 reports) ------------------------------------

def part_adapter(ctx):
    torch, dist, dt, rank, world, dev = ctx["torch"], ctx["dist"], ctx["dt"], ctx["rank"], ctx["world"], ctx["dev"]
    a = dt.get()
    dtypes = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
              torch.float64]
    counts = [1, 7, 4097, 1 << 16, (1 << 20) + 3]
    bad = []
    seed = 0
    for rep in range(3):  # rep 0: first op of each signature (host wait), 1-2: stream-ordered
        for dtype in dtypes:
            esz = torch.empty((), dtype=dtype).element_size()
            for count in counts:
                seed += 1
                in_place = (seed % 2 == 0)
                async_op = (seed % 3 == 0)
                out = torch.empty(world * count, dtype=dtype, device=dev)  # fresh, caching allocator
                out.view(torch.uint8).fill_(0x5A)
                if in_place:
                    inp = out[rank * count:(rank + 1) * count]
                else:
                    inp = torch.empty(count, dtype=dtype, device=dev)
                inp.view(torch.uint8).copy_(shard_bits(torch, seed, rank, count * esz, dev))
                w = dt.all_gather_into_tensor(out, inp, async_op=async_op)
                if async_op:
                    w.wait()  # the current stream waits; no host block
                want = torch.cat([shard_bits(torch, seed, r, count * esz, dev) for r in range(world)])
                if not torch.equal(out.view(torch.uint8), want):
                    bad.append(f"rep {rep} {dtype} count={count} in_place={in_place} async={async_op}")
                del out, inp
    # Coalesced: 5 tensors of different dtypes in one op, three times.
    for rep in range(3):
        spec = [(torch.bfloat16, 1000), (torch.float32, 33), (torch.uint8, 65536), (torch.float16, 4097),
                (torch.int64, 5)]
        outs, ins = [], []
        for k, (dtype, count) in enumerate(spec):
            esz = torch.empty((), dtype=dtype).element_size()
            i = torch.empty(count, dtype=dtype, device=dev)
            i.view(torch.uint8).copy_(shard_bits(torch, 9000 + k, rank, count * esz, dev))
            ins.append(i)
            outs.append(torch.empty(world * count, dtype=dtype, device=dev))
        dt.all_gather_coalesced(outs, ins, async_op=True).wait()
        for k, (dtype, count) in enumerate(spec):
            esz = torch.empty((), dtype=dtype).element_size()
            want = torch.cat([shard_bits(torch, 9000 + k, r, count * esz, dev) for r in range(world)])
            if not torch.equal(outs[k].view(torch.uint8), want):
                bad.append(f"coalesced rep {rep} item {k}")
    torch.cuda.synchronize()
    dt.synchronize()
    s = a.stats()
    if s["fallback_ops"] or s["stream_ordered_ops"] == 0:
        bad.append(f"expected dmagather to serve every op, stream-ordered after the first: {s}")
    failed = any_rank(torch, dist, bool(bad))
    return {"ok": not failed, "mismatches": bad[:10], "host_waited_ops": s["host_waited_ops"],
            "stream_ordered_ops": s["stream_ordered_ops"], "dmagather_ops": s["dmagather_ops"]}


def part_vmm(ctx):
    torch, dist, dt, rank, world, dev = ctx["torch"], ctx["dist"], ctx["dt"], ctx["rank"], ctx["world"], ctx["dev"]
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" not in conf:
        return {"ok": False, "error": f"run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (is {conf!r})"}
    a = dt.get()
    before = a.stats()
    free_start = torch.cuda.mem_get_info()[0]
    sizes = [64 << 10, (1 << 20) + 3, (5 << 20) + 17, (21 << 20) + 1, (48 << 20) + 5, 96 << 20]
    sizes = sizes + sizes[::-1][1:]  # grow, then shrink
    bad = []
    seed = 50000
    reserved = []
    for step, nbytes in enumerate(sizes):
        for variant in range(2):  # 0: out of place, 1: in place
            seed += 1
            out = torch.empty(world * nbytes, dtype=torch.uint8, device=dev)
            out.fill_(0x5A)
            inp = out[rank * nbytes:(rank + 1) * nbytes] if variant else torch.empty(nbytes, dtype=torch.uint8,
                                                                                       device=dev)
            inp.copy_(shard_bits(torch, seed, rank, nbytes, dev))
            dt.all_gather_into_tensor(out, inp)
            want = torch.cat([shard_bits(torch, seed, r, nbytes, dev) for r in range(world)])
            if not torch.equal(out, want):
                bad.append(f"step {step} bytes={nbytes} in_place={bool(variant)}")
            del out, inp, want
        torch.cuda.synchronize()
        dt.synchronize()
        reserved.append(torch.cuda.memory_reserved())
        torch.cuda.empty_cache()  # expandable segments unmap their free chunks
    torch.cuda.synchronize()
    dt.synchronize()
    after = a.stats()
    served = after["dmagather_ops"] - before["dmagather_ops"]
    fell = after["fallback_ops"] - before["fallback_ops"]
    if fell or served != 2 * len(sizes):
        bad.append(f"dmagather served {served} of {2 * len(sizes)} gathers, {fell} fell back: "
                   f"{after.get('fallback_by_reason')}")
    failed = any_rank(torch, dist, bool(bad))
    # Device-wide free memory (all ranks share the GPU) before and after: the
    # daemon's imports of unmapped chunks must not keep the memory.
    free_end = torch.cuda.mem_get_info()[0]
    return {"ok": not failed, "mismatches": bad[:10], "served": served, "alloc_conf": conf,
            "reserved_bytes_per_step": reserved, "device_free_start": free_start, "device_free_end": free_end}


def part_graph(ctx):
    torch, dist, dt, rank, world, dev = ctx["torch"], ctx["dist"], ctx["dt"], ctx["rank"], ctx["world"], ctx["dev"]
    a = dt.get()
    before = a.stats()
    n = (1 << 20) + 5  # bf16 elements per shard
    replays = 30
    inputs = [shard_bits(torch, 70000 + i, rank, 2 * n, dev).view(torch.bfloat16) for i in range(replays)]
    src = torch.empty(n, dtype=torch.bfloat16, device=dev)
    inp = torch.empty(n, dtype=torch.bfloat16, device=dev)
    out = torch.empty(world * n, dtype=torch.bfloat16, device=dev)
    res = torch.empty(world * n, dtype=torch.bfloat16, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph (the signature's verdict)
        dt.all_gather_into_tensor(out, inp)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        inp.copy_(src)                       # producer
        dt.all_gather_into_tensor(out, inp)  # captured: a persistent op
        res.copy_(out)                       # consumer
    results = []
    for i in range(replays):
        src.copy_(inputs[i])
        g.replay()
        results.append(res.clone())
    torch.cuda.synchronize()
    bad = []
    for i, got in enumerate(results):
        want = torch.cat([shard_bits(torch, 70000 + i, r, 2 * n, dev) for r in range(world)])
        if not torch.equal(got.view(torch.uint8), want):
            bad.append(f"replay {i}")
    del g
    after = a.stats()
    captured = after.get("captured_ops", 0) - before.get("captured_ops", 0)
    if captured != 1 or after["fallback_ops"] != before["fallback_ops"]:
        bad.append(f"expected one captured dmagather op and no fallback: {after}")
    failed = any_rank(torch, dist, bool(bad))
    return {"ok": not failed, "mismatches": bad[:10], "replays": replays, "captured_ops": captured}


def _zero3_run(ctx, gather, steps):
    torch, dist, rank, world, dev = ctx["torch"], ctx["dist"], ctx["rank"], ctx["world"], ctx["dev"]
    torch.manual_seed(1234)
    d, layers, batch = 512, 6, 32
    full = [torch.randn(d, d) * (1.0 / d ** 0.5) for _ in range(layers)]
    n = d * d // world
    shards = [w.reshape(-1)[rank * n:(rank + 1) * n].clone().to(dev) for w in full]
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(batch, d, generator=g).to(dev)
        y = torch.randn(batch, d, generator=g).to(dev)
        weights = []
        h = x
        for li in range(layers):
            w_full = torch.empty(world * n, device=dev)  # fresh per gather, freed after the layer's use
            gather(w_full, shards[li])
            w = w_full.view(d, d).detach().requires_grad_(True)
            weights.append(w)
            h = torch.nn.functional.gelu(h @ w.t())
            del w_full
        loss = ((h - y) ** 2).mean()
        loss.backward()
        losses.append(fbits(loss.item()))
        for li, w in enumerate(weights):
            grad = w.grad.reshape(-1).contiguous()
            dist.all_reduce(grad)  # gloo, CUDA tensor; identical in both runs
            shards[li] -= 0.05 * grad[rank * n:(rank + 1) * n] / world
        del weights, h, loss
    torch.cuda.synchronize()
    return losses, [s.cpu() for s in shards]


def part_zero3(ctx):
    torch, dist, dt = ctx["torch"], ctx["dist"], ctx["dt"]
    a = dt.get()
    if not dt.is_installed():
        return {"ok": False, "error": "install() did not route dist.all_gather_into_tensor (DMAGATHER_ALLGATHER?)"}
    before = a.stats()
    losses_d, shards_d = _zero3_run(ctx, lambda o, i: dist.all_gather_into_tensor(o, i), ctx["steps"])
    dt.synchronize()
    after = a.stats()
    losses_r, shards_r = _zero3_run(ctx, lambda o, i: bcast_gather(torch, dist, o, i), ctx["steps"])
    served = after["dmagather_ops"] - before["dmagather_ops"]
    fell = after["fallback_ops"] - before["fallback_ops"]
    bad = []
    if losses_d != losses_r:
        bad.append(f"losses differ: {losses_d} vs {losses_r}")
    for k, (x, y) in enumerate(zip(shards_d, shards_r)):
        if not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            bad.append(f"shard {k} differs")
    if fell or served != 6 * ctx["steps"]:
        bad.append(f"dmagather served {served} of {6 * ctx['steps']} gathers, {fell} fell back")
    failed = any_rank(torch, dist, bool(bad))
    return {"ok": not failed, "mismatches": bad[:10], "losses": losses_d, "served": served,
            "stream_ordered_ops": after["stream_ordered_ops"] - before["stream_ordered_ops"]}


def _fsdp_api(torch):
    try:
        from torch.distributed.fsdp import fully_shard, FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard, FSDPModule
        except ImportError as e:
            raise RuntimeError(f"this torch ({torch.__version__}) has no FSDP2 fully_shard: {e}")
    for name in ("set_custom_all_gather", "set_custom_reduce_scatter"):
        if not hasattr(FSDPModule, name):
            raise RuntimeError(f"FSDPModule.{name} is missing in torch {torch.__version__} (need >= 2.11)")
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    except ImportError as e:
        raise RuntimeError(f"torch {torch.__version__} lacks _fsdp_api.AllGather/ReduceScatter: {e}")
    from torch.distributed.device_mesh import DeviceMesh
    return fully_shard, FSDPModule, AllGather, ReduceScatter, DeviceMesh


def _reference_comms(torch, dist, AllGather, ReduceScatter):
    """FSDP2 comms for the reference runs: an all-gather by gloo broadcast (bit-exact, any dtype)
    and a test-only reduce-scatter from gloo all_reduce (every arm uses it)."""

    class BroadcastAllGather(AllGather):
        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            bcast_gather(torch, dist, output_tensor, input_tensor, group)
            return None

    class AllReduceReduceScatter(ReduceScatter):
        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            buf = input_tensor.clone()
            name = str(op).upper()
            if "PREMUL" in name:
                raise RuntimeError(f"test reduce-scatter: {op} not handled")
            dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
            if "AVG" in name:
                buf.div_(dist.get_world_size(group))
            output_tensor.copy_(buf.view(dist.get_world_size(group), -1)[dist.get_rank(group)])
            return None

    return BroadcastAllGather, AllReduceReduceScatter


def part_fsdp2(ctx):
    torch, dist, dt, rank, world, dev = ctx["torch"], ctx["dist"], ctx["dt"], ctx["rank"], ctx["world"], ctx["dev"]
    fully_shard, FSDPModule, AllGather, ReduceScatter, DeviceMesh = _fsdp_api(torch)
    BroadcastAllGather, AllReduceReduceScatter = _reference_comms(torch, dist, AllGather, ReduceScatter)
    nn = torch.nn

    def build():
        torch.manual_seed(4321)
        d, hidden, blocks = 256, 1024, 4
        layers = []
        for _ in range(blocks):
            layers.append(nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d)))
        model = nn.Sequential(*layers, nn.Linear(d, 16)).to(dev)
        try:
            mesh = DeviceMesh.from_group(dist.group.WORLD, "cuda")
        except Exception:  # noqa: BLE001
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh("cuda", (world,))
        for blk in model[:-1]:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def train(ag):
        model = build()
        rs = AllReduceReduceScatter()
        n_fsdp = 0
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_custom_all_gather(ag)
                m.set_custom_reduce_scatter(rs)
                n_fsdp += 1
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
        losses = []
        for step in range(ctx["steps"]):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x = torch.randn(64, 256, generator=g).to(dev)
            y = torch.randn(64, 16, generator=g).to(dev)
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(fbits(loss.item()))
        torch.cuda.synchronize()
        params = [p.to_local().detach().cpu().clone() if hasattr(p, "to_local") else p.detach().cpu().clone()
                  for p in model.parameters()]
        return losses, params, n_fsdp

    a = dt.get()
    before = a.stats()
    losses_d, params_d, n_fsdp = train(dt.FSDPAllGather())
    dt.synchronize()
    after = a.stats()
    losses_r, params_r, _ = train(BroadcastAllGather())
    bad = []
    if losses_d != losses_r:
        bad.append(f"losses differ: {losses_d} vs {losses_r}")
    for k, (x, y) in enumerate(zip(params_d, params_r)):
        if not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            bad.append(f"parameter {k} differs")
    served = after["dmagather_ops"] - before["dmagather_ops"]
    fell = after["fallback_ops"] - before["fallback_ops"]
    if served == 0 or fell:
        bad.append(f"dmagather served {served} FSDP2 all-gathers, {fell} fell back")
    failed = any_rank(torch, dist, bool(bad))
    return {"ok": not failed, "mismatches": bad[:10], "losses": losses_d, "fsdp_modules": n_fsdp,
            "served": served, "stream_ordered_ops": after["stream_ordered_ops"] - before["stream_ordered_ops"],
            "torch": torch.__version__}


def _kernels_under(ev):
    out = list(getattr(ev, "kernels", []) or [])
    for c in ev.cpu_children:
        out += _kernels_under(c)
    return out


def _fsdp_gather_kernels(prof):
    """SM work (kernels and memcpy/memset) launched under FSDP2's all-gather ranges
    (record_function "FSDP::all_gather..." and "FSDP::all_gather_copy_out..."), by name."""
    table = {}
    for ev in prof.events():
        if not ev.name.startswith("FSDP::all_gather") or (ev.cpu_parent is not None and
                                                          ev.cpu_parent.name.startswith("FSDP::all_gather")):
            continue
        where = "copy_out" if "copy_out" in ev.name else "all_gather"
        for k in _kernels_under(ev):
            row = table.setdefault(f"{where}: {k.name[:90]}", {"launches": 0, "gpu_us": 0.0})
            row["launches"] += 1
            row["gpu_us"] += float(k.duration)
    # Copies issued from outside torch (the library's own-shard copies) are
    # attributed to no range when the profiler cannot link their API call:
    # every device memcpy of the step, less those above, is listed apart.
    linked = [r for k, r in table.items() if ": Memcpy DtoD" in k]
    try:
        dtod = [e for e in prof.profiler.kineto_results.events()
                if e.device_type().name == "CUDA" and e.name().startswith("Memcpy DtoD")]
    except AttributeError:
        dtod = []
    n = len(dtod) - sum(r["launches"] for r in linked)
    if n > 0:
        us = sum(e.duration_ns() for e in dtod) / 1e3 - sum(r["gpu_us"] for r in linked)
        table["step, not under a range: Memcpy DtoD (Device -> Device)"] = {"launches": n, "gpu_us": us}
    return table


def part_fsdp2_hf(ctx):
    return _fsdp2_hf(ctx, mixed=True)


def part_fsdp2_hf_fp32(ctx):
    return _fsdp2_hf(ctx, mixed=False)


def _fsdp2_hf(ctx, mixed):
    """A Hugging Face Llama (transformers, from a config, random init), every decoder layer and the
    root fully_shard'ed, bf16 mixed precision (mixed) or fp32, AdamW: FSDP2's all-gather by gloo broadcast
    (reference), by dmagather with FSDP2's copy-in/copy-out, and by dmagather's zero-copy
    unshard. Losses and final shards bit-identical across the three; the torch profiler's view
    of the SM work under FSDP2's all-gather ranges (last step), peak memory, step time."""
    torch, dist, dt, rank, world, dev = ctx["torch"], ctx["dist"], ctx["dt"], ctx["rank"], ctx["world"], ctx["dev"]
    fully_shard, FSDPModule, AllGather, ReduceScatter, DeviceMesh = _fsdp_api(torch)
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.profiler import profile, ProfilerActivity
    import transformers
    from dmagather import _fsdp_zero_copy as zc
    BroadcastAllGather, AllReduceReduceScatter = _reference_comms(torch, dist, AllGather, ReduceScatter)

    cfg = transformers.LlamaConfig(vocab_size=8192, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                   num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=512,
                                   attn_implementation="eager")
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cuda")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else \
        MixedPrecisionPolicy()
    gather_bytes = 2 if mixed else 4
    steps = ctx["steps"]

    def train(ag, arm):
        zc.set_active(arm == "zerocopy")
        torch.manual_seed(1234)
        model = transformers.LlamaForCausalLM(cfg).to(dev)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        rs = AllReduceReduceScatter()
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_custom_all_gather(ag)
                m.set_custom_reduce_scatter(rs)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        losses, times = [], []
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)

        def step(i):
            g = torch.Generator().manual_seed(1000 * i + rank)
            ids = torch.randint(0, cfg.vocab_size, (2, 257), generator=g).to(dev)
            out = model(input_ids=ids[:, :-1], labels=ids[:, 1:])
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return out.loss.detach()

        prof_table = None
        for i in range(steps):
            dist.barrier()
            t0 = time.perf_counter()
            if i == steps - 1 and arm != "reference" and rank == 0:
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    loss = step(i)
                    torch.cuda.synchronize()
                prof_table = _fsdp_gather_kernels(prof)
            else:
                loss = step(i)
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(fbits(loss.float().item()))
        dt.synchronize()
        peak = torch.cuda.max_memory_allocated(dev)
        shards = [p.to_local().detach().cpu().clone() for p in model.parameters()]
        shard_bytes = sum(p.to_local().numel() * gather_bytes for p in model.parameters())  # all-gather inputs
        del model, opt
        torch.cuda.empty_cache()
        mid = sorted(times[1:])
        return {"losses": losses, "shards": shards, "peak_bytes": peak, "step_ms_p50": round(mid[len(mid) // 2] * 1e3, 2),
                "kernels": prof_table, "shard_bytes": shard_bytes}

    a = dt.get()
    s0 = a.stats()
    res = {"reference": train(BroadcastAllGather(), "reference")}
    s1 = a.stats()
    res["copyout"] = train(dt.FSDPAllGather(), "copyout")
    s2 = a.stats()
    res["zerocopy"] = train(dt.FSDPAllGather(), "zerocopy")
    s3 = a.stats()
    zc.set_active(True)
    bad = []
    ref = res["reference"]
    for arm in ("copyout", "zerocopy"):
        r = res[arm]
        if r["losses"] != ref["losses"]:
            bad.append(f"{arm}: losses differ from the reference: {r['losses']} vs {ref['losses']}")
        for k, (x, y) in enumerate(zip(r["shards"], ref["shards"])):
            if not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
                bad.append(f"{arm}: parameter {k} differs from the reference")
    served_copyout = s2["dmagather_ops"] - s1["dmagather_ops"]
    served_zero = s3["dmagather_ops"] - s2["dmagather_ops"]
    unshards = s3["zero_copy_unshards"] - s2["zero_copy_unshards"]
    if s1["dmagather_ops"] != s0["dmagather_ops"]:
        bad.append("the reference run went through dmagather")
    if served_copyout == 0 or served_zero == 0 or s3["fallback_ops"] != s0["fallback_ops"]:
        bad.append(f"dmagather served {served_copyout} / {served_zero} ops, "
                   f"{s3['fallback_ops'] - s0['fallback_ops']} fell back")
    if s2["zero_copy_unshards"] != s1["zero_copy_unshards"]:
        bad.append("the copy-out run took the zero-copy path")
    if unshards == 0:
        bad.append(f"the zero-copy run never took the zero-copy path ({s3['zero_copy']}, "
                   f"{s3['zero_copy_fallback_by_reason']})")
    failed = any_rank(torch, dist, bool(bad))
    summary = {arm: {k: v for k, v in r.items() if k != "shards"} for arm, r in res.items()}
    return {"ok": not failed, "mismatches": bad[:10], "losses": ref["losses"], "arms": summary,
            "served": served_zero, "zero_copy_unshards": unshards, "zero_copy_items": s3["zero_copy_items"] - s2["zero_copy_items"],
            "zero_copy_cast_items": s3["zero_copy_cast_items"] - s2["zero_copy_cast_items"],
            "zero_copy": s3["zero_copy"], "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "torch": torch.__version__, "transformers": transformers.__version__}


def part_overhead(ctx):
    import ctypes
    torch, dist, dt, rank, world, dev = ctx["torch"], ctx["dist"], ctx["dt"], ctx["rank"], ctx["world"], ctx["dev"]
    import dmagather
    a = dt.get()
    lib, comm = a.comm._lib, a.comm._comm
    f32 = dmagather.DTYPES["float32"]
    rows = []
    iters = 100  # < the ring (256) and the adapter's lazy window (128): no back-pressure in the timed loop
    for size in SIZES_OVERHEAD:
        count = size // 4
        inp = torch.ones(count, device=dev) * rank
        out = torch.empty(world * count, device=dev)
        stream = torch.cuda.current_stream().cuda_stream
        res = {"shard_bytes": size}
        for path in ("python", "capi"):
            def call():
                if path == "python":
                    dt.all_gather_into_tensor(out, inp)
                else:
                    code = lib.dmagather_allgather(comm, inp.data_ptr(), out.data_ptr(), count, f32, stream)
                    if code != 0:
                        raise RuntimeError(f"dmagather_allgather: {code}")
            for _ in range(5):
                call()
            torch.cuda.synchronize()
            dt.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            dt.synchronize()
            dist.barrier()
            e2e = []
            for _ in range(20):
                s0 = time.perf_counter()
                call()
                torch.cuda.synchronize()
                e2e.append(time.perf_counter() - s0)
            dt.synchronize()
            dist.barrier()
            e2e.sort()
            t = torch.tensor([(t1 - t0) / iters * 1e6, e2e[len(e2e) // 2] * 1e6], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            res[f"{path}_host_us"] = round(t[0].item(), 2)
            res[f"{path}_e2e_us"] = round(t[1].item(), 2)
        want = torch.cat([torch.full((count,), float(r), device=dev) for r in range(world)])
        res["ok"] = bool(torch.equal(out, want))
        rows.append(res)
    ok = not any_rank(torch, dist, not all(r["ok"] for r in rows))
    return {"ok": ok, "rows": rows}


def rank_main(rank, args, store, q):
    result = {}
    try:
        import datetime
        import torch
        import torch.distributed as dist
        torch.cuda.set_device(args.gpu)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=args.world,
                                timeout=datetime.timedelta(seconds=300))
        os.environ["DMAGATHER_ALLGATHER"] = "1"
        import dmagather.torch as dt
        a = dt.install(socket=args.socket)  # collective: every rank joins, or none
        ctx = {"torch": torch, "dist": dist, "dt": dt, "rank": rank, "world": args.world,
               "dev": torch.device("cuda", args.gpu), "steps": args.steps}
        result["setup"] = {"enabled": a.enabled, "backend": a.backend, "unavailable": a.stats()["unavailable"],
                           "torch": torch.__version__, "world": args.world,
                           "gpu": torch.cuda.get_device_name(args.gpu)}
        if not a.enabled or a.backend != "cuda":
            raise RuntimeError(f"dmagather is not serving on cuda here: {result['setup']}")
        for part in args.parts:
            t0 = time.monotonic()
            try:
                r = globals()[f"part_{part}"](ctx)
            except Exception as e:  # noqa: BLE001  (clear error; the other parts still run)
                r = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
            r["seconds"] = round(time.monotonic() - t0, 2)
            result[part] = r
        result["stats"] = dt.stats()
        dt.shutdown()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001
        result["fatal"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    q.put((rank, result))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--socket", default=os.environ.get("DMAGATHER_SOCKET"))
    p.add_argument("--parts", type=lambda s: [x for x in s.split(",") if x], default=list(PARTS[:4]))
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args()
    for part in args.parts:
        if part not in PARTS:
            p.error(f"unknown part {part}; parts: {','.join(PARTS)}")
    if not args.socket or not os.path.exists(args.socket):
        print(f"FAILED: no daemon socket ({args.socket!r}); start `dmagatherd --backend=cuda` and set "
              f"DMAGATHER_SOCKET", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    results = {}
    with tempfile.TemporaryDirectory(prefix="dmagather-trainers-") as d:
        store = os.path.join(d, "store")
        procs = [ctx.Process(target=rank_main, args=(r, args, store, q)) for r in range(args.world)]
        for pr in procs:
            pr.start()
        deadline = time.monotonic() + args.timeout
        try:
            for _ in procs:
                r, res = q.get(timeout=max(1, deadline - time.monotonic()))
                results[r] = res
        except Exception:  # noqa: BLE001
            pass
        for pr in procs:
            pr.join(max(1, deadline - time.monotonic()))
            if pr.is_alive():
                pr.kill()
                pr.join()
    ok = sorted(results) == list(range(args.world))
    summary = {"command": " ".join(sys.argv), "ranks_reported": sorted(results), "parts": {}}
    r0 = results.get(0, {})
    summary["setup"] = r0.get("setup")
    for r, res in sorted(results.items()):
        if "fatal" in res:
            ok = False
            summary.setdefault("fatal", {})[r] = res["fatal"]
    for part in args.parts:
        per_rank = [results[r].get(part, {"ok": False, "error": "not run"}) for r in sorted(results)]
        part_ok = bool(per_rank) and all(x.get("ok") for x in per_rank)
        ok = ok and part_ok
        summary["parts"][part] = {"ok": part_ok, "rank0": r0.get(part),
                                  "errors": {r: results[r].get(part, {}).get("error") for r in sorted(results)
                                             if results[r].get(part, {}).get("error")}}
    summary["stats_rank0"] = r0.get("stats")
    summary["ok"] = ok
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    ov = (r0.get("overhead") or {}).get("rows")
    if ov:
        with open(os.path.join(args.out, "overhead.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(ov[0].keys()))
            w.writeheader()
            w.writerows(ov)
    for hf_part in ("fsdp2_hf", "fsdp2_hf_fp32"):
        hf = r0.get(hf_part)
        if not (hf and hf.get("arms")):
            continue
        with open(os.path.join(args.out, f"{hf_part}.json"), "w") as f:
            json.dump(hf, f, indent=1, default=str)
        print(f"{hf_part} arm  step_ms_p50  peak_MiB  kernels and memcpys under FSDP2's all-gather ranges (last step)")
        for arm, r in hf["arms"].items():
            k = r.get("kernels")
            n = "-" if k is None else sum(v["launches"] for name, v in k.items() if not name.startswith("step,"))
            print(f"         {arm:9s} {r['step_ms_p50']:11.2f} {r['peak_bytes'] / 2**20:9.1f}  {n}")
            for name, v in sorted((k or {}).items()):
                print(f"             {v['launches']:4d} x {v['gpu_us']:9.1f} us  {name}")
    for part in ("zero3", "fsdp2", "fsdp2_hf", "fsdp2_hf_fp32"):
        losses = (r0.get(part) or {}).get("losses")
        if losses:
            with open(os.path.join(args.out, f"{part}_loss.csv"), "w") as f:
                f.write("step,loss,loss_float64_hex\n")
                for i, h in enumerate(losses):
                    f.write(f"{i},{struct.unpack('<d', bytes.fromhex(h))[0]!r},{h}\n")
    print(f"setup: {summary['setup']}")
    for part in args.parts:
        s = summary["parts"][part]
        info = s["rank0"] or {}
        extra = {k: v for k, v in info.items() if k in ("served", "stream_ordered_ops", "host_waited_ops", "replays", "captured_ops",
                                                         "zero_copy_unshards", "zero_copy_items", "zero_copy_cast_items",
                                                         "zero_copy",
                                                         "device_free_start", "device_free_end",
                                                         "fsdp_modules", "seconds", "torch")}
        print(f"{part:9s} {'PASSED' if s['ok'] else 'FAILED'} {extra}")
        for m in info.get("mismatches", []) or []:
            print(f"          mismatch: {m}")
        for r, e in s["errors"].items():
            print(f"          rank {r}: {e}")
        if not s["ok"] and info.get("trace"):
            print(info["trace"])
    if ov:
        print("shard_KiB python_host_us capi_host_us python_e2e_us capi_e2e_us")
        for row in ov:
            print(f"{row['shard_bytes'] >> 10:9d} {row['python_host_us']:14.2f} {row['capi_host_us']:12.2f} "
                  f"{row['python_e2e_us']:13.2f} {row['capi_e2e_us']:11.2f}")
    for r, e in (summary.get("fatal") or {}).items():
        print(f"rank {r} fatal: {e}")
    print("ALL PASSED" if ok else "FAILED", f"(results in {args.out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
