"""One rank of DeepSpeed ZeRO-3 (tests/trainers/zero3_train.py, unmodified)
with every tensor copy counted: how many copies the run makes and how many
elements they write, so that DeepSpeed's own coalesced fetch (a torch.cat into
a flat buffer before the gather, one torch.cat per parameter after it) and
dmagather's zero-copy fetch can be compared on the same run.

    deepspeed --num_gpus N bench/trainers/zero3_copies.py --prof OUT.json -- ZERO3_TRAIN_ARGS...

Counting is a torch dispatch mode over the training (every aten call of the
rank's thread: forward, backward, the fetches and the optimizer): for cat,
copy_, _foreach_copy_, _to_copy and clone, the calls and the elements each
writes (its output). Writes OUT.json per rank (OUT with {rank} replaced), with
the run's wall time (informational: CPU timing here is not a benchmark).
"""
import json
import os
import runpy
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "tests", "trainers", "zero3_train.py")
COPIES = ("cat", "copy_", "_foreach_copy_", "_to_copy", "clone")


def elements(out):
    if isinstance(out, (list, tuple)):
        return sum(elements(o) for o in out)
    return out.numel() if hasattr(out, "numel") else 0


def counting_mode(res):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in COPIES:
                c = res.setdefault(name, {"calls": 0, "elements": 0})
                c["calls"] += 1
                # In-place copies write their first argument(s); others their output.
                c["elements"] += elements(args[0] if name in ("copy_", "_foreach_copy_") else out)
            return out

    return Count()


def main():
    args = sys.argv[1:]
    prof_out, local_rank = None, None
    rest = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--prof":
            prof_out = args[i + 1]
            i += 2
            continue
        if a.startswith("--local_rank"):
            rest.append(a)
        elif a != "--":
            rest.append(a)
        i += 1
    if prof_out is None:
        sys.exit("usage: zero3_copies.py --prof OUT.json -- ZERO3_TRAIN_ARGS...")
    sys.path.insert(0, os.path.dirname(TRAIN))
    g = runpy.run_path(TRAIN, run_name="zero3_train")
    sys.argv = [TRAIN] + rest
    copies = {}
    t0 = time.monotonic()
    with counting_mode(copies):
        g["main"]()
    wall = time.monotonic() - t0
    rank = int(os.environ.get("RANK", "0"))
    res = {"rank": rank, "wall_s": round(wall, 3), "copies": copies}
    with open(prof_out.replace("{rank}", str(rank)), "w") as f:
        json.dump(res, f, indent=1)
    g["clean_exit"].finish()


if __name__ == "__main__":
    main()
