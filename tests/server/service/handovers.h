// Test helper: what a client hands over on the fd channel (a rank segment
// with its header written, a host buffer), put straight into a TicketTable
// as the fd channel would, with the uid and pid the test names.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "abi/descriptor_v2.h"
#include "abi/fd_channel_v1.h"
#include "abi/ring_v1.h"
#include "common/memfd.h"
#include "server/service/ticket_table.h"

namespace dmagather::server::service {

class Handovers {
 public:
  explicit Handovers(TicketTable* tickets) : tickets_(tickets) {}

  // A rank segment whose header carries `token`; its ticket.
  std::string Segment(uint64_t token, uid_t uid, pid_t pid) {
    auto m = common::MemfdMapping::Create("test-seg", abi::SegmentLayoutV1::kBytes);
    EXPECT_TRUE(m.ok()) << m.status();
    abi::InitSegmentV1(m->data(), token, abi::kDescriptorStampV2);
    const int fd = m->fd();
    segments.push_back(*std::move(m));
    return Issue(abi::kFdSegment, uid, pid, abi::SegmentLayoutV1::kBytes, fd);
  }

  // A host buffer of `bytes` (a new memfd, or `fd` when given); its ticket.
  std::string Buffer(uint64_t bytes, uid_t uid, pid_t pid, int fd = -1) {
    if (fd < 0) {
      auto m = common::MemfdMapping::Create("test-buf", bytes);
      EXPECT_TRUE(m.ok()) << m.status();
      fd = m->fd();
      buffers.push_back(*std::move(m));
    }
    return Issue(abi::kFdBuffer, uid, pid, bytes, fd);
  }

  std::vector<common::MemfdMapping> segments;  // In the order handed over.
  std::vector<common::MemfdMapping> buffers;

 private:
  std::string Issue(uint32_t kind, uid_t uid, pid_t pid, uint64_t bytes, int fd) {
    Handover h;
    h.kind = kind;
    h.uid = uid;
    h.pid = pid;
    h.bytes = bytes;
    h.fd = common::UniqueFd(dup(fd));
    auto t = tickets_->Issue(std::move(h));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : std::string();
  }

  TicketTable* const tickets_;
};

}  // namespace dmagather::server::service
