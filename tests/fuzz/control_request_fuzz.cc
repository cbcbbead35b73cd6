// libFuzzer target: control-plane requests as the daemon receives them -
// bytes parsed as a JoinRequest or RegisterRequest protobuf (what gRPC hands
// the service), then the registry's pure request checks
// (server/service/request_checks.cc). What the checks accept must satisfy
// what the registry relies on afterwards (indexing by rank, job keys as
// printable names, host memory only with a ticket).
//
// Input: [which: 0 = Join, 1 = Register] then the serialized message.
#include <cstdint>

#include "abi/abi_v1.h"
#include "common/memory_kinds.h"
#include "dmagather/v1/control.pb.h"
#include "server/service/request_checks.h"

namespace dmagather::fuzz {

int FuzzOne(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t* msg = data + 1;
  const int n = static_cast<int>(size - 1);
  if ((data[0] & 1) == 0) {
    v1::JoinRequest req;
    if (!req.ParseFromArray(msg, n)) return 0;
    if (!server::service::CheckJoinRequest(req).ok()) return 0;
    if (req.world_size() < 1 || req.world_size() > int(abi::kMaxRanksV1)) __builtin_trap();
    if (req.rank() < 0 || req.rank() >= req.world_size()) __builtin_trap();
    if (req.job_key().empty() || req.job_key().size() > 128) __builtin_trap();
    for (char c : req.job_key()) {
      if (c <= ' ' || c > '~') __builtin_trap();
    }
    // The registry then works on a copy (as it keys its job table).
    v1::JoinRequest copy;
    if (!copy.ParseFromString(req.SerializeAsString())) __builtin_trap();
  } else {
    v1::RegisterRequest req;
    if (!req.ParseFromArray(msg, n)) return 0;
    if (!server::service::CheckRegisterRequest(req).ok()) return 0;
    if (req.memory_kind().empty()) __builtin_trap();
    if (req.memory_kind() == common::kMemoryHostMemfd && req.ticket().empty()) __builtin_trap();
  }
  return 0;
}

}  // namespace dmagather::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return dmagather::fuzz::FuzzOne(data, size); }
