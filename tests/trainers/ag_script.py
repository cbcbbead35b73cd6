"""A user's script that calls torch.distributed.all_gather_into_tensor (nothing
of dmagather in it), launched with torchrun. Writes OUT/rank{r}.json with what
it saw. Order of calls: a gather on a subgroup of ranks 0..1 first (before any
WORLD call: it sets up a job of the subgroup's own, on ranks 0 and 1 only),
then WORLD gathers of several dtypes from private CPU tensors (sync,
async_op=True, in place), then the subgroup again."""
import json
import os
import sys

import torch
import torch.distributed as dist

import clean_exit  # beside this script

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
res = {"rank": rank, "errors": [], "patched_at_start": hasattr(dist.all_gather_into_tensor, "_dmagather_original")}


def shard(r, count, dtype, salt):
    g = torch.Generator().manual_seed(1000 * salt + r)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8).view(dtype)


def expect(out, count, dtype, salt, ranks, what):
    want = torch.cat([shard(r, count, dtype, salt) for r in ranks])
    if not torch.equal(out.reshape(-1).view(torch.uint8), want.view(torch.uint8)):
        res["errors"].append(f"{what}: output differs")


sub = dist.new_group([0, 1])
if rank in (0, 1):
    x = shard(rank, 100, torch.float32, 50)
    o = torch.empty(200, dtype=torch.float32)
    dist.all_gather_into_tensor(o, x, group=sub)
    expect(o, 100, torch.float32, 50, [0, 1], "subgroup before setup")
res["set_up_after_subgroup"] = "dmagather.torch" in sys.modules

world_ops = 0
for salt, (dtype, count) in enumerate([(torch.float32, 1000), (torch.bfloat16, 4097), (torch.float16, 10),
                                       (torch.int64, 3), (torch.uint8, 65536), (torch.float64, 77)]):
    x = shard(rank, count, dtype, salt)
    o = torch.empty(world * count, dtype=dtype)
    r = dist.all_gather_into_tensor(o, x)
    world_ops += 1
    if r is not None:
        res["errors"].append("sync call returned a Work")
    expect(o, count, dtype, salt, range(world), f"{dtype}")
# async_op=True, in place (the input is this rank's row of the output)
o = torch.empty(world * 256)
mine = o.narrow(0, rank * 256, 256)
mine.copy_(shard(rank, 256, torch.float32, 99))
w = dist.all_gather_into_tensor(o, mine, async_op=True)
world_ops += 1
w.wait()
expect(o, 256, torch.float32, 99, range(world), "async in place")
if rank in (0, 1):
    x = shard(rank, 7, torch.int32, 51)
    o = torch.empty(14, dtype=torch.int32)
    dist.all_gather_into_tensor(o, x, group=sub)
    expect(o, 7, torch.int32, 51, [0, 1], "subgroup after setup")
res["world_ops"] = world_ops
res["set_up_at_end"] = "dmagather.torch" in sys.modules
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(res, f)
# The subgroup goes before the groups are torn down (clean_exit.py says why).
del sub
clean_exit.finish()
