"""The end of a rank's script: torch.distributed torn down while the
interpreter is fully alive.

A gloo process group that is still referenced when the interpreter shuts
down (by a DeviceMesh, by FSDP or DeepSpeed objects caught in reference
cycles, by a subgroup kept in a global) outlives destroy_process_group(); if
one of its worker threads then releases a finished work's tensors during
finalization, it needs the GIL, is made to exit, and the process aborts
("terminate called without an active exception": torch's own race, seen
under load). Destroying the groups and collecting the cycles here joins
those workers first."""
import gc

import torch.distributed as dist


def finish():
    """Call after main() has returned (its locals are gone)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
