// Raw control-plane pieces for the tests that speak to dmagatherd without
// the client library (hostile or half-made clients): a rank segment, a
// JoinRequest, the daemon's open descriptors.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

#include "abi/descriptor_v2.h"
#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "common/memfd.h"
#include "dmagather/v1/control.pb.h"

namespace dmagather::testing {

// A sealed rank segment with its header written (token as given).
inline common::MemfdMapping MakeSegment(uint64_t token, int seals = -1) {
  auto m = common::MemfdMapping::Create("test-seg", abi::SegmentLayoutV1::kBytes, seals);
  EXPECT_TRUE(m.ok()) << m.status();
  abi::InitSegmentV1(m->data(), token, abi::kDescriptorStampV2);
  return *std::move(m);
}

// A Join for a cpu rank (the daemon takes uid and pid from the kernel; `pid`
// is only what the request says).
inline v1::JoinRequest JoinReq(const std::string& job, int world, int rank, const std::string& ticket, uint64_t token,
                               int pid = -1) {
  v1::JoinRequest req;
  req.set_job_key(job);
  req.set_world_size(world);
  req.set_rank(rank);
  req.set_pid(pid);
  req.set_segment_ticket(ticket);
  req.set_segment_token(token);
  req.set_join_timeout_ms(20000);
  req.mutable_device()->set_kind("cpu");
  req.mutable_device()->set_ordinal(-1);
  req.set_abi_version(2);
  req.set_capability_version(1);
  return req;
}

// Open descriptors of a process (-1 when /proc says nothing).
inline int ProcFds(pid_t pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n - 2;
}

}  // namespace dmagather::testing
