// The ranks of a GPU test: forked processes placed as a training job's
// ranks are.
#pragma once

#include <functional>

namespace dmagather::testing {

// Runs fn(rank, world) in `world` forked processes; how many failed (a
// non-zero exit or a signal). Before fn, in rank r's process:
//  - DMAGATHER_TEST_SOCKETS (one daemon per simulated node, comma-separated):
//    rank r joins node r % n (DMAGATHER_SOCKET);
//  - DMAGATHER_TEST_RANK_VISIBLE (GPU UUIDs or indices): rank r sees entry
//    r % n alone (CUDA_VISIBLE_DEVICES, as under SLURM --gpus-per-task or a
//    device plugin), so every rank calls its GPU device 0;
//  - with several GPUs visible, rank r uses GPU r % count (one rank per
//    GPU where there are enough: peer copies on the copy engines).
int LaunchRanks(int world, const std::function<int(int, int)>& fn);

}  // namespace dmagather::testing
