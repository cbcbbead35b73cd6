"""A plain FSDP2 training script: a small MLP-block transformer-ish model, every
block and the root fully_shard'ed on a 1-D mesh over WORLD, a few AdamW steps
on data from a seeded generator. Launched with torchrun.

    torchrun --nproc_per_node N fsdp2_train.py --out DIR [--steps 5] [--device cpu|cuda]
             [--custom-all-gather] [--odd] [--pretend-torch V] [--change-fsdp2] [--hsdp R | --tp T]
             [--model mlp|hf-llama] [--reduce-dtype fp32|bf16] [--rs-sum] [--grad-divide F]

--model hf-llama: a Hugging Face Llama (transformers' LlamaForCausalLM) from a
small config instead of the MLP blocks: every decoder layer and the root
fully_shard'ed, as FSDP2 users shard it.

--odd: the shapes FSDP2's unshard has to get right beyond the even case: odd
sizes (uneven, padded last shards), one block's matrices sharded on dim 1
(Shard(1)), and reshard_after_forward=False on the root. (Parameters of several
dtypes in one group: FSDP2 refuses them, "FSDP expects uniform original
parameter dtype"; only fsdp_pre_all_gather extensions gather several dtypes.)

--custom-all-gather: the documented FSDP2 hook, dmagather.torch.FSDPAllGather()
on every FSDPModule (the one line a script adds); without it the script has
nothing of dmagather, and DMAGATHER_ALLGATHER=1 alone decides. On CPU, gloo
has no reduce_scatter_tensor in every torch version: --rs-allreduce replaces
FSDP2's reduce-scatter by an all_reduce (same for every run compared).

--reduce-dtype bf16 (with --dtype bf16): gradients reduce-scattered in bf16
(FSDP2's default there is fp32). --rs-sum: FSDP2's reduce-scatter with SUM
and a separate division (set_force_sum_reduction_for_comms) instead of AVG.
--grad-divide F: set_gradient_divide_factor(F) (F the reduce-scatter group's
size: AVG; any other: PREMUL_SUM, which gloo does not have).

Writes DIR/losses.bin (float32 bytes of every rank's loss per step), DIR/params.bin
(every parameter's full tensor, bytes), DIR/summary.json. Rank 0 writes.
"""
import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import clean_exit  # noqa: E402  (beside this script)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--custom-all-gather", action="store_true")
    p.add_argument("--odd", action="store_true")
    p.add_argument("--model", choices=["mlp", "hf-llama"], default="mlp")
    p.add_argument("--rs-allreduce", action="store_true")
    p.add_argument("--reduce-dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--rs-sum", action="store_true")
    p.add_argument("--grad-divide", type=float, default=None)
    p.add_argument("--hsdp", type=int, default=0, metavar="R",
                   help="HSDP: a (R, world/R) mesh, replicate x shard (FSDP2 gathers on the shard groups)")
    p.add_argument("--tp", type=int, default=0, metavar="T",
                   help="FSDP x TP: a (world/T, T) mesh, each block's Linears tensor-parallel over T, FSDP over dp")
    p.add_argument("--pretend-torch", default=None, help="tests: torch.__version__ as this string from the start "
                                                         "(a torch dmagather does not know)")
    p.add_argument("--change-fsdp2", action="store_true", help="tests: FSDP2's foreach_all_gather wrapped, as a "
                                                               "new torch might change what dmagather relies on")
    p.add_argument("--dist-backend", default=None, help="default: gloo on CPU, nccl on CUDA; several ranks on "
                                                         "one GPU need gloo (rank r on GPU r % count)")
    args = p.parse_args()

    from torch.distributed.fsdp import fully_shard, FSDPModule, MixedPrecisionPolicy
    from torch.distributed.device_mesh import init_device_mesh

    if args.pretend_torch:
        torch.__version__ = args.pretend_torch
    if args.change_fsdp2:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
        orig_gather = pg.foreach_all_gather

        def changed_gather(*a, **k):
            return orig_gather(*a, **k)
        pg.foreach_all_gather = changed_gather

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        dist.init_process_group(args.dist_backend or "nccl")
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dist.init_process_group(args.dist_backend or "gloo")
        dev = torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(4321)
    if args.model == "hf-llama":
        model, blocks, vocab = hf_llama(dev)
    else:
        d, hidden, nblocks, vocab = (37, 102, 3, 29) if args.odd else (64, 256, 3, 128)
        blocks = [nn.Sequential(nn.LayerNorm(d), nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
                  for _ in range(nblocks)]
        model = nn.Sequential(nn.Embedding(vocab, d), *blocks, nn.LayerNorm(d), nn.Linear(d, vocab)).to(dev)
    if args.hsdp:
        mesh = init_device_mesh(dev.type, (args.hsdp, world // args.hsdp), mesh_dim_names=("replicate", "shard"))
    elif args.tp:
        mesh_2d = init_device_mesh(dev.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
        mesh = mesh_2d["dp"]
    else:
        mesh = init_device_mesh(dev.type, (world,))
    reduce_dtype = torch.bfloat16 if args.reduce_dtype == "bf16" else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype) if args.dtype == "bf16" else \
        MixedPrecisionPolicy()
    if args.tp:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        for b in blocks:
            parallelize_module(b, mesh_2d["tp"], {"1": ColwiseParallel(), "3": RowwiseParallel()})
    for k, b in enumerate(blocks):
        extra = {}
        if args.odd and k == 1:
            from torch.distributed.tensor import Shard
            extra["shard_placement_fn"] = lambda p: Shard(1) if p.dim() == 2 and p.shape[1] % world == 0 else Shard(0)
        fully_shard(b, mesh=mesh, mp_policy=mp, **extra)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=not args.odd)

    fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in fsdp_modules:
        if args.rs_sum:
            m.set_force_sum_reduction_for_comms(True)
        if args.grad_divide is not None:
            m.set_gradient_divide_factor(args.grad_divide)
    if args.custom_all_gather:
        import dmagather.torch as dt
        ag = dt.FSDPAllGather()
        for m in fsdp_modules:
            m.set_custom_all_gather(ag)
    if args.rs_allreduce:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

        class AllReduceRS(ReduceScatter):
            def allocate(self, size, *, dtype, device):
                return torch.empty(*size, dtype=dtype, device=device)

            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                buf = input_tensor.clone()
                dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
                if "AVG" in str(op).upper():
                    buf.div_(dist.get_world_size(group))
                output_tensor.copy_(buf.view(dist.get_world_size(group), -1)[dist.get_rank(group)])
                return None

        rs = AllReduceRS()
        for m in fsdp_modules:
            m.set_custom_reduce_scatter(rs)

    data_rank = mesh_2d["dp"].get_local_rank() if args.tp else rank  # TP ranks of one dp rank see the same data
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(7)
    losses = []
    for step in range(args.steps):
        ids = torch.randint(0, vocab, (world, 8, 17), generator=g)[data_rank].to(dev)
        logits = model(ids[:, :-1])
        if args.model == "hf-llama":
            logits = logits.logits
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().float())

    local = torch.stack(losses)
    every = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(every, local)
    if dev.type == "cuda" and dist.get_backend() == "gloo":
        # DTensor.full_tensor() goes through functional collectives, which crash
        # (SIGSEGV) over gloo with CUDA tensors in torch 2.11: each parameter's
        # local shards of every rank, in rank order, by all_gather_object.
        mine = [q.to_local().detach().cpu().contiguous() for _, q in model.named_parameters()]
        every_shard = [None] * world
        dist.all_gather_object(every_shard, mine)
        full = [(n, torch.cat([every_shard[r][i].reshape(-1) for r in range(world)]))
                for i, (n, _) in enumerate(model.named_parameters())]
    else:
        full = [(n, q.full_tensor().detach().cpu().contiguous()) for n, q in model.named_parameters()]
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        lb = b"".join(t.cpu().numpy().tobytes() for t in every)
        pb = b"".join(t.reshape(-1).view(torch.uint8).numpy().tobytes() for _, t in full)
        open(os.path.join(args.out, "losses.bin"), "wb").write(lb)
        open(os.path.join(args.out, "params.bin"), "wb").write(pb)
        json.dump({"world": world, "steps": args.steps, "device": str(dev), "dtype": args.dtype,
                   "custom_all_gather": args.custom_all_gather, "losses": [float(x) for x in every[0]],
                   "fsdp_modules": len(fsdp_modules), "losses_sha256": hashlib.sha256(lb).hexdigest(),
                   "params_sha256": hashlib.sha256(pb).hexdigest(), "torch": torch.__version__},
                  open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    dist.barrier()
    dist.destroy_process_group()


def hf_llama(dev):
    """transformers' Llama from a small config (random weights, seeded): the
    model, its decoder layers (each one FSDP2 group) and the vocabulary size."""
    import transformers
    vocab = 128
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=172, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).to(dev)
    return model, list(model.model.layers), vocab


if __name__ == "__main__":
    main()
    clean_exit.finish()
