"""torch.distributed's all-gather entry points that dmagather serves, and the
torch versions it knows. Imports nothing (not even torch): the start-up hook
(`_autoload`) reads it before torch.distributed is imported.

The entry points are every name under which a torch version exposes the flat
all-gather (output = every rank's input, concatenated in rank order):
- `all_gather_into_tensor`: torch 1.13 to today; what DeepSpeed calls;
- `all_gather_single`: torch 2.15 on. There `all_gather_into_tensor` is an alias
  that calls it, and FSDP2's `DefaultAllGather` calls it directly, so a torch
  2.15 FSDP2 job with only `all_gather_into_tensor` served gets nothing.
Each one torch has is replaced by dmagather's function in the
`torch.distributed` namespace (not in `distributed_c10d`: torch's own alias
and its coalescing manager keep calling torch's function).

The reduce-scatter's entry points (served with DMAGATHER_REDUCE_SCATTER=1,
`_torch_reduce`) likewise: `reduce_scatter_tensor` (torch 1.13 on; what
DeepSpeed ZeRO-3 and FSDP2 2.11 call) and `reduce_scatter_single` (2.15 on,
where `reduce_scatter_tensor` is its alias and FSDP2's DefaultReduceScatter
calls it).

TESTED_TORCH: the major.minor versions whose FSDP2 internals the zero-copy
unshard (`_fsdp_zero_copy`) was written against and that CI runs the trainer
tests on (tools/install_venv.sh: the oldest and the newest). Any other torch
still gets its entry points served, and is named on rank 0 at start-up.
"""

ENTRY_POINTS = ("all_gather_into_tensor", "all_gather_single")
RS_ENTRY_POINTS = ("reduce_scatter_tensor", "reduce_scatter_single")
TESTED_TORCH = ("2.11", "2.15")
# DeepSpeed's ZeRO-3 module, whose import arms the zero-copy fetch (_zero3_zero_copy).
ZERO3_MODULE = "deepspeed.runtime.zero.partition_parameters"


def major_minor(version):
    """'2.15.0+cu130' -> '2.15'."""
    return ".".join(version.split("+")[0].split(".")[:2])


def present(dist_module, names=ENTRY_POINTS):
    """The entry points this torch.distributed has, in ENTRY_POINTS (or
    `names`) order."""
    return [n for n in names if callable(getattr(dist_module, n, None))]


def present_rs(dist_module):
    """The reduce-scatter entry points this torch.distributed has."""
    return present(dist_module, RS_ENTRY_POINTS)


def is_dmagather(dist_module, names=ENTRY_POINTS):
    """Every entry point this torch.distributed has is dmagather's (the start-up
    hook's or install()'s: each carries `_dmagather_original`)."""
    names = present(dist_module, names)
    return bool(names) and all(getattr(getattr(dist_module, n), "_dmagather_original", None) is not None
                               for n in names)


def torch_original(dist_module, names=ENTRY_POINTS):
    """torch's own all-gather under dmagather's replacements (the first entry
    point this torch has: all_gather_into_tensor; on 2.15 an alias of
    all_gather_single); names=RS_ENTRY_POINTS: its reduce-scatter
    (reduce_scatter_tensor)."""
    f = getattr(dist_module, present(dist_module, names)[0])
    for _ in range(4):
        inner = getattr(f, "_dmagather_original", None)
        if inner is None:
            break
        f = inner
    return f


# Set by the switch layer (dmagather.torch: set_serving): serving(group) is the
# adapter that serves `group` while torch's all-gather is dmagather's and the
# group's job is set up, else None. The framework patches ask it, so that they
# import nothing above them.
_serving = None


def set_serving(fn):
    global _serving
    _serving = fn


def serving(group):
    return _serving(group) if _serving is not None else None


def untested_note(version, names):
    """A sentence naming a torch outside TESTED_TORCH, or None for a tested one."""
    if major_minor(version) in TESTED_TORCH:
        return None
    served = ", ".join(f"torch.distributed.{n}" for n in names) or "no all-gather entry point it knows"
    return (f"torch {version} is not a version dmagather was tested with ({', '.join(TESTED_TORCH)}): "
            f"it serves {served}; FSDP2's zero-copy unshard stays off")


_named = False


def name_untested_once(version, names, logger):
    """Rank 0's one line about a torch outside TESTED_TORCH (start-up hook or
    init(), whichever comes first); nothing for a tested one."""
    global _named
    note = untested_note(version, names)
    if note is not None and not _named:
        _named = True
        logger.warning("dmagather: %s", note)
