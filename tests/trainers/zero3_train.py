"""A plain DeepSpeed ZeRO-3 training script (nothing of dmagather in it): a small
causal transformer trained for a few steps on data from a seeded generator.

    deepspeed --num_gpus N zero3_train.py --out DIR [--steps 6] [--dtype fp32|bf16]
    torchrun --nproc_per_node N zero3_train.py --out DIR ... [--dist-backend gloo]

Writes DIR/losses.bin (each step's loss on rank 0, float32 bytes of every
step) and DIR/params.bin (every parameter, gathered, in bytes, rank 0), and
DIR/summary.json; with --profile also DIR/profile.json (rank 0: step times,
peak memory, the last step's kernels by name and stream, memcpys). Runs on CPU
(DeepSpeed's CPU accelerator: gloo) or CUDA (nccl), whichever DeepSpeed's
accelerator is. On CUDA, ranks beyond the GPU count share GPUs (rank r on GPU
r % count; NCCL refuses that, so several ranks on one GPU need --dist-backend
gloo, which gathers CUDA tensors).
"""
import argparse
import collections
import contextlib
import glob
import hashlib
import json
import os
import tempfile

import torch
import torch.nn as nn
import deepspeed
import clean_exit  # noqa: E402  (beside this script)


class Block(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True, bias=True)
        self.ln2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.ff(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=256, d=64, heads=4, ff=256, layers=3, seq=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        n = ids.shape[1]
        pos = torch.arange(n, device=ids.device)
        x = self.tok(ids) + self.pos(pos)[None]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=ids.device), diagonal=1).to(x.dtype)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--dist-backend", default=None, help="default: the accelerator's (gloo on CPU, nccl on CUDA)")
    p.add_argument("--install-after-init", action="store_true",
                   help="the older route: dmagather.torch.install() after deepspeed.initialize()")
    p.add_argument("--profile", action="store_true",
                   help="rank 0: step times, peak memory, and the torch profiler's GPU activity of the "
                        "last step (kernels by name and stream, memcpys) into DIR/profile.json")
    p.add_argument("--hpz", type=int, default=0, metavar="N",
                   help="ZeRO++ hpZ: zero_hpz_partition_size N (a secondary partition over groups of N ranks)")
    p.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    p.add_argument("--record-env", action="store_true",
                   help="each rank writes DIR/env.RANK.json: what its launcher set (LAUNCH_ENV) as it found it")
    args = p.parse_args()
    if args.record_env:
        record_env(args.out)

    acc = deepspeed.get_accelerator()
    ds_args = None
    if acc.device_name() == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", max(args.local_rank, 0)))
        index = local_rank % torch.cuda.device_count()
        if index != local_rank:
            # Ranks share GPUs (a one-GPU test box): DeepSpeed binds its process
            # group to cuda:<LOCAL_RANK> (init_process_group's device_id), which
            # does not exist here; name the GPU this rank runs on instead.
            os.environ["LOCAL_RANK"] = str(index)
        torch.cuda.set_device(index)
        ds_args = argparse.Namespace(device_rank=index)  # the engine's device (default: LOCAL_RANK)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    if args.dist_backend:
        deepspeed.init_distributed(dist_backend=args.dist_backend)
    else:
        deepspeed.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(1234)
    micro, seq, vocab = 4, 32, 256
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,   # every parameter partitioned (and gathered)
            "stage3_prefetch_bucket_size": 20000,
            "stage3_max_live_parameters": 100000,
            "reduce_bucket_size": 50000,
            "overlap_comm": False,
        },
        "bf16": {"enabled": args.dtype == "bf16"},
        "steps_per_print": 1000,
        "wall_clock_breakdown": False,
    }
    if args.hpz:
        config["zero_optimization"]["zero_hpz_partition_size"] = args.hpz
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = TinyLM(vocab=vocab, seq=seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(args=ds_args, model=model, optimizer=opt, config=config)
    if args.install_after_init:
        import dmagather.torch as dt
        dt.install(enabled=True)  # (without the variable: the start-up hook stays out of it)

    g = torch.Generator().manual_seed(42)
    losses = []
    prof = Profile(args.profile and rank == 0, device, args.steps)
    for step in range(args.steps):
        with prof.step(step):
            ids = torch.randint(0, vocab, (world, micro, seq + 1), generator=g)[rank].to(device)
            logits = engine(ids[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
            engine.backward(loss)
            engine.step()
            losses.append(loss.detach().float().cpu())

    # Every rank's losses, so that each rank's run is compared.
    local = torch.stack(losses).to(device)
    every = [torch.empty_like(local) for _ in range(world)]
    torch.distributed.all_gather(every, local)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        blobs = [(n, q.detach().cpu().contiguous()) for n, q in engine.module.named_parameters()]
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        lb = b"".join(t.cpu().numpy().tobytes() for t in every)
        pb = b"".join(t.reshape(-1).view(torch.uint8).numpy().tobytes() for _, t in blobs)
        open(os.path.join(args.out, "losses.bin"), "wb").write(lb)
        open(os.path.join(args.out, "params.bin"), "wb").write(pb)
        prof.write(os.path.join(args.out, "profile.json"))
        json.dump({"world": world, "dist_backend": str(torch.distributed.get_backend()), "steps": args.steps, "dtype": args.dtype, "device": str(device),
                   "losses": [float(x) for x in every[0]], "params": len(blobs),
                   "param_elements": sum(t.numel() for _, t in blobs),
                   "losses_sha256": hashlib.sha256(lb).hexdigest(), "params_sha256": hashlib.sha256(pb).hexdigest(),
                   "torch": torch.__version__, "deepspeed": deepspeed.__version__},
                  open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    torch.distributed.barrier()
    if rank == 0:
        remove_shm_buffers()


class Profile:
    """--profile on rank 0: every step's time (the device synchronized at its
    end), the peak memory allocated, and the GPU activity of the last step as
    the torch profiler sees it: kernels by name and by stream, memcpys by kind.
    Off: nothing runs (the data path's runs stay as they are)."""

    def __init__(self, on, device, steps):
        self.on, self.device, self.last = on, device, steps - 1
        self.step_ms, self.trace = [], None
        if on and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def step(self, i):
        if not self.on:
            yield
            return
        import time
        import torch.profiler as tp
        acts = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._sync()
        t0 = time.perf_counter()
        if i != self.last:
            yield
            self._sync()
        else:
            with tp.profile(activities=acts) as p:
                yield
                self._sync()
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "trace.json")
                p.export_chrome_trace(path)
                with open(path) as f:
                    self.trace = json.load(f).get("traceEvents", [])
        self.step_ms.append((time.perf_counter() - t0) * 1e3)

    def write(self, path):
        if not self.on:
            return
        kernels, streams, memcpy = collections.Counter(), collections.Counter(), collections.Counter()
        kernel_us = collections.Counter()
        for e in self.trace or []:
            cat, name = e.get("cat"), e.get("name", "")[:120]
            if cat == "kernel":
                kernels[name] += 1
                kernel_us[name] += e.get("dur", 0)
                streams[str(e.get("args", {}).get("stream"))] += 1
            elif cat == "gpu_memcpy":
                memcpy[name] += 1
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        json.dump({"step_ms": self.step_ms, "peak_allocated_bytes": peak,
                   "last_step": {"kernels": sum(kernels.values()), "kernel_us": sum(kernel_us.values()),
                                 "kernels_by_stream": dict(streams),
                                 "kernels_by_name": {k: [n, kernel_us[k]] for k, n in kernels.most_common()},
                                 "memcpy_by_kind": dict(memcpy)}},
                  open(path, "w"), indent=1)


# What a launcher may set for a rank (torchrun, DeepSpeed's launch.py, SLURM)
# and the switch itself: recorded by --record-env before anything reads them.
LAUNCH_ENV = ("DMAGATHER_ALLGATHER", "DMAGATHER_SOCKET", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
              "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "GROUP_RANK", "MASTER_ADDR", "SLURM_PROCID", "SLURM_LOCALID",
              "SLURM_NTASKS", "SLURM_NODEID", "SLURMD_NODENAME")


def record_env(out):
    rank = os.environ.get("RANK", "x")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"env.{rank}.json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in LAUNCH_ENV}, f, indent=1)


def remove_shm_buffers():
    """DeepSpeed's CPU shm all-reduce leaves one 66 MB /dev/shm file per rank and run
    (deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>, ops/csrc/cpu/comm/shm.cpp);
    after the last barrier every rank has them mapped, so this run's names go."""
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR')}_{os.environ.get('MASTER_PORT')}_"
    for p in glob.glob(os.path.join("/dev/shm", glob.escape(prefix) + "*")):
        try:
            os.unlink(p)
        except OSError:
            pass


if __name__ == "__main__":
    main()
    clean_exit.finish()
