// Writes the seed corpus of the fuzz targets (tools/fuzz.sh): a few valid
// inputs of each, built from the ABI and proto definitions so they follow
// any layout change.  make_seeds DIR  ->  DIR/<target>/seed-N
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "abi/descriptor_v2.h"
#include "abi/fd_channel_v1.h"
#include "abi/ring_v1.h"
#include "common/memory_kinds.h"
#include "dmagather/v1/control.pb.h"
#include "tests/fuzz/fuzz_input.h"

namespace dmagather::fuzz {
namespace {

using Bytes = std::vector<uint8_t>;

void Append(Bytes* b, const void* p, size_t n) {
  b->insert(b->end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
}
template <typename T>
void Put(Bytes* b, T v) {
  Append(b, &v, sizeof(v));
}

void Write(const std::string& dir, const std::string& target, const std::vector<Bytes>& seeds) {
  const std::string d = dir + "/" + target;
  mkdir(d.c_str(), 0755);
  for (size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = d + "/seed-" + std::to_string(i);
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(seeds[i].data(), 1, seeds[i].size(), f) != seeds[i].size()) {
      std::perror(path.c_str());
      std::exit(1);
    }
    std::fclose(f);
  }
}

// decode_validate: shape byte, expected seq, slot(s).
std::vector<Bytes> DecodeSeeds() {
  std::vector<Bytes> out;
  auto seed = [&](int world, int rank, uint32_t seq, std::vector<abi::DescriptorV2> items) {
    Bytes b;
    Put<uint8_t>(&b, uint8_t((world - 1) | (rank << 2)));
    Put<uint32_t>(&b, seq);
    for (const auto& d : items) Append(&b, &d, sizeof(d));
    out.push_back(b);
  };
  auto flat = [](int world, int rank, uint32_t seq, uint64_t count, uint32_t following) {
    abi::DescriptorV2 d{};
    d.stamp = abi::kDescriptorStampV2;
    d.op = abi::kOpAllGatherV2;
    d.seq = seq;
    d.count = count;
    d.items_following = following;
    d.send = {RegionId(rank, 3), 0, rank * count};
    d.num_recv = 1;
    d.recv[0] = {RegionId(rank, 3), 0, 0};
    return d;
  };
  seed(2, 1, 1, {flat(2, 1, 1, 16, 0)});
  seed(4, 3, 9, {flat(4, 3, 9, 100, 1), flat(4, 3, 9, 8, 0)});
  {
    abi::DescriptorV2 d{};  // List output, out of place, float32.
    d.stamp = abi::kDescriptorStampV2;
    d.op = abi::kOpAllGatherListV2;
    d.seq = 5;
    d.dtype = 2;
    d.count = 4;
    d.send = {RegionId(0, 2), 0, 0};
    d.num_recv = 3;
    for (int i = 0; i < 3; ++i) d.recv[i] = {RegionId(0, 3), 0, uint64_t(i) * 16};
    seed(3, 0, 5, {d});
  }
  {
    abi::DescriptorV2 d{};
    d.stamp = abi::kDescriptorStampV2;
    d.op = abi::kOpRefuse;
    d.seq = 2;
    d.refusal.status = 1;
    std::snprintf(d.refusal.reason, sizeof(d.refusal.reason), "rank 0: tensor is not in dmagather memory");
    seed(2, 0, 2, {d});
  }
  {
    abi::DescriptorV1 d{};  // A v1 client.
    d.stamp = abi::kDescriptorStampV1;
    d.op = abi::kOpAllGather;
    d.seq = 1;
    d.count = 32;
    d.send = {RegionId(0, 2), 0, 0};
    d.num_recv = 1;
    d.recv[0] = {RegionId(0, 2), 0, 0};
    Bytes b;
    Put<uint8_t>(&b, 1);
    Put<uint32_t>(&b, 1);
    Append(&b, &d, sizeof(d));
    out.push_back(b);
  }
  return out;
}

// ring: initial tails, then actions (tests/fuzz/ring_fuzz.cc).
std::vector<Bytes> RingSeeds() {
  std::vector<Bytes> out;
  Bytes b = {0, 0};
  for (int op = 0; op < 3; ++op) {
    for (uint8_t r = 0; r < 2; ++r) {
      const uint8_t submit[] = {0, r, 16, 3, uint8_t(op * 40), 0, 0, 0};
      Append(&b, submit, sizeof(submit));
    }
    const uint8_t poll_complete[] = {4, 1, 5, 0, 0};
    Append(&b, poll_complete, sizeof(poll_complete));
  }
  out.push_back(b);
  // Coalesced op of 2 items on both ranks, a refusal, a timeout.
  Bytes c = {3, 250};
  for (uint8_t r = 0; r < 2; ++r) {
    const uint8_t items[] = {0, r, 8, 3, 0, 1, 1, 0, 0, r, 8, 3, 64, 1, 0, 0};
    Append(&c, items, sizeof(items));
  }
  const uint8_t rest[] = {4, 0, 5, 0, 0, 7, 0, 1, 4, 0, 0, 1, 4, 3, 0, 6, 0xff, 0x01, 4, 1};
  Append(&c, rest, sizeof(rest));
  out.push_back(c);
  // A tail far ahead of the head.
  Bytes t = {0, 0, 2, 0};
  Put<uint64_t>(&t, 100000);
  Put<uint8_t>(&t, 4);
  Put<uint8_t>(&t, 0);
  out.push_back(t);
  return out;
}

std::vector<Bytes> ControlSeeds() {
  std::vector<Bytes> out;
  v1::JoinRequest j;
  j.set_job_key("train-7");
  j.set_world_size(4);
  j.set_rank(3);
  j.set_pid(1234);
  j.set_segment_token(0x1234567890abcdefull);
  j.set_join_timeout_ms(60000);
  j.set_backend("host");
  j.mutable_device()->set_kind("cpu");
  j.mutable_device()->set_ordinal(-1);
  j.set_abi_version(2);
  j.set_capability_version(1);
  j.set_client_version("0.3.0");
  j.set_segment_ticket(std::string(16, '\x5a'));
  std::string s = std::string(1, '\0') + j.SerializeAsString();
  out.emplace_back(s.begin(), s.end());
  v1::RegisterRequest r;
  r.set_session_id(7);
  r.set_bytes(1 << 20);
  r.set_session_secret(std::string(16, '\x11'));
  r.set_memory_kind(common::kMemoryHostMemfd);
  r.set_ticket(std::string(16, '\x22'));
  s = std::string(1, '\1') + r.SerializeAsString();
  out.emplace_back(s.begin(), s.end());
  r.clear_ticket();
  r.set_memory_kind(common::kMemoryCudaIpc);
  r.set_handle(std::string(64, '\x33'));
  s = std::string(1, '\1') + r.SerializeAsString();
  out.emplace_back(s.begin(), s.end());
  return out;
}

std::vector<Bytes> FdSeeds() {
  std::vector<Bytes> out;
  for (uint32_t kind : {abi::kFdPing, abi::kFdSegment, abi::kFdBuffer}) {
    abi::FdRequestV1 req{};
    req.stamp = abi::kFdRequestStampV1;
    req.magic = abi::kMagic;
    req.kind = kind;
    req.bytes = kind == abi::kFdSegment ? abi::SegmentLayoutV1::kBytes : kind == abi::kFdBuffer ? 1 << 20 : 0;
    Bytes b = {0, uint8_t(kind == abi::kFdPing ? 0 : 1)};
    Append(&b, &req, sizeof(req));
    out.push_back(b);
  }
  return out;
}

}  // namespace
}  // namespace dmagather::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  mkdir(dir.c_str(), 0755);
  dmagather::fuzz::Write(dir, "decode_validate", dmagather::fuzz::DecodeSeeds());
  dmagather::fuzz::Write(dir, "ring", dmagather::fuzz::RingSeeds());
  dmagather::fuzz::Write(dir, "control_request", dmagather::fuzz::ControlSeeds());
  dmagather::fuzz::Write(dir, "fd_request", dmagather::fuzz::FdSeeds());
  return 0;
}
