// The DMAGATHER_* environment variables dmagather reads (the client library,
// its Python package, dmagatherd and the build), and the check that names a
// likely typo: a DMAGATHER_* variable in the environment that nothing reads
// but that is a few edits from one that is ("DMAGATHER_SPINS: did you mean
// DMAGATHER_SPIN?"). CommImpl::Create runs the check once per process.
//
// kKnownVariables is the list of docs/OPERATIONS.md "Knobs" (the variables'
// rows); tools/check_knobs.sh fails when the two differ. Pure functions
// aside, WarnUnknownVariablesOnce keeps one process-wide flag (any thread).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace dmagather::client {

inline constexpr std::string_view kKnownVariables[] = {
    // Client library (C++), any rank.
    "DMAGATHER_SOCKET",
    "DMAGATHER_JOB_ID",
    "DMAGATHER_JOIN_TIMEOUT_MS",
    "DMAGATHER_RECONNECT_S",
    "DMAGATHER_SPIN",
    "DMAGATHER_CUDA_BATCH",  // Client and daemon (common/cuda).
    "DMAGATHER_STAGING_MB",
    // Python package (client/python/dmagather).
    "DMAGATHER_LIB",
    "DMAGATHER_ALLGATHER",
    "DMAGATHER_REDUCE_SCATTER",
    "DMAGATHER_HOST_STAGING",
    "DMAGATHER_MAX_NUMEL",
    "DMAGATHER_ZERO3_ZERO_COPY",
    "DMAGATHER_FSDP_ZERO_COPY",
    "DMAGATHER_STATS_FILE",
    "DMAGATHER_CHECK_WORLD",
    // Client and dmagatherd: the HIP runtime library (the daemon: --hip_lib).
    "DMAGATHER_HIP_LIB",
    // The build (Bazel's toolkit detection, third_party/toolkits).
    "DMAGATHER_CUDA_PATH",
    "DMAGATHER_HIP_PATH",
};

// Levenshtein distance (insertions, deletions, substitutions; bytes).
size_t EditDistance(std::string_view a, std::string_view b);

struct UnknownVariable {
  std::string name;     // "DMAGATHER_SPINS"
  std::string closest;  // "DMAGATHER_SPIN"
  size_t distance = 0;
};

// The DMAGATHER_* names of `env` ("NAME=VALUE" entries, NULL-terminated, as
// `environ`) that are not known and are a likely typo of a known one: at
// most 3 edits away, and at most a third of the name after "DMAGATHER_"
// (so the project's own scripts' variables, DMAGATHER_KEEP_LOGS,
// DMAGATHER_VENV, DMAGATHER_BIN, are left alone). In the order of `env`.
std::vector<UnknownVariable> LikelyTypos(const char* const* env);

// One line per likely typo, naming the closest known variable.
std::string TyposWarning(const std::vector<UnknownVariable>& typos);

// The first call in the process writes TyposWarning(LikelyTypos(env)) to
// `out` when there is any typo; every later call writes nothing. Returns
// the number of typos written.
size_t WarnUnknownVariablesOnce(const char* const* env, std::FILE* out);

}  // namespace dmagather::client
