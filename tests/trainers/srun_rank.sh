#!/bin/bash
# One rank of a job that SLURM's srun starts (one task per rank):
#   srun -N2 --ntasks-per-node=2 srun_rank.sh python train.py ...
# torch.distributed's variables from SLURM's, the job's first node as the
# master. srun passes the submitting shell's environment to every task
# (--export=ALL, its default), DMAGATHER_ALLGATHER=1 with it.
export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS
export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
export MASTER_PORT=${MASTER_PORT:-29500}
exec "$@"
