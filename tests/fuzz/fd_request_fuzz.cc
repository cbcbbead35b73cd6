// libFuzzer target: the fd channel's check of a received message
// (server/service/fd_request.cc, ParseFdRequest), with the recvmsg flags
// and the number of descriptors that came with it under the fuzzer's
// control. What it accepts is exactly a ping or a telemetry-ticket request
// without descriptors, or a segment/buffer hand-over with one descriptor.
//
// Input: [msg_flags bits: 1 = MSG_TRUNC, 2 = MSG_CTRUNC] [descriptors: u8]
// then the message (any length).
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "abi/device_memory_v1.h"
#include "abi/fd_channel_v1.h"
#include "abi/ring_v1.h"
#include "server/service/fd_request.h"

namespace dmagather::fuzz {

int FuzzOne(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int flags = ((data[0] & 1) ? MSG_TRUNC : 0) | ((data[0] & 2) ? MSG_CTRUNC : 0);
  const size_t num_fds = data[1] % 8;
  // A private heap copy of exactly the message, so a read past it is reported.
  std::unique_ptr<uint8_t[]> msg(new uint8_t[size - 2 + 1]);
  std::memcpy(msg.get(), data + 2, size - 2);
  auto req = server::service::ParseFdRequest(msg.get(), size - 2, flags, num_fds);
  if (!req.ok()) {
    if (req.status().message().empty()) __builtin_trap();  // Every refusal says why.
    return 0;
  }
  if (size - 2 != sizeof(abi::FdRequestV1) || flags != 0) __builtin_trap();
  if (req->stamp != abi::kFdRequestStampV1 || req->magic != abi::kMagic) __builtin_trap();
  switch (req->kind) {
    case abi::kFdPing:
    case abi::kFdTelemetry:
      if (num_fds != 0) __builtin_trap();
      break;
    case abi::kFdSegment:
      if (num_fds != 1 || req->bytes != abi::SegmentLayoutV1::kBytes) __builtin_trap();
      break;
    case abi::kFdBuffer:
      if (num_fds != 1) __builtin_trap();
      break;
    case abi::kFdDeviceMemory:
      if (num_fds < 1 || num_fds > abi::kMaxFdsPerRequestV1 || req->bytes == 0) __builtin_trap();
      break;
    default:
      __builtin_trap();
  }
  return 0;
}

}  // namespace dmagather::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return dmagather::fuzz::FuzzOne(data, size); }
