// libFuzzer target: one ring slot of random bytes through the ingress
// decoder (server/ingress/decoder.cc) and Ingress::Validate against a
// RegionTable of fake regions (exact heap blocks). Whatever validation
// accepts must lie inside a region this rank registered: checked by address
// arithmetic here, and by AddressSanitizer when the accepted ranges are
// touched.
//
// Input: [world-1 (2 bits) | rank (6 bits)] [expected seq: u32] then the
// slot bytes (DescriptorV1 size, zero-padded); a second slot may follow
// (a second item of the same op, as a coalesced op's).
#include <cstdint>
#include <vector>

#include "abi/descriptor_v1.h"
#include "common/dtype.h"
#include "server/ingress/decoder.h"
#include "server/ingress/ingress.h"
#include "server/ingress/region_table.h"
#include "tests/fuzz/fuzz_input.h"

namespace dmagather::fuzz {
namespace {

using server::ingress::Ingress;
using server::ingress::RegionTable;
using server::scheduler::RankPart;
using server::scheduler::Request;

constexpr int kMaxWorld = 4;

struct Tables {
  Tables() {
    for (int r = 0; r < kMaxWorld; ++r) {
      tables.push_back(std::make_unique<RegionTable>(r));
      for (int i = 0; i < kNumRegions; ++i) {
        auto region = std::make_shared<ExactRegion>(kRegionBytes[i]);
        regions.push_back(region);
        tables.back()->Add(RegionId(r, i), region);
      }
    }
  }
  std::vector<std::unique_ptr<RegionTable>> tables;
  std::vector<std::shared_ptr<ExactRegion>> regions;
};

// [p, p+n) lies inside one registered region of this rank's.
bool Inside(const Tables& t, int rank, const char* p, uint64_t n) {
  for (int i = 0; i < kNumRegions; ++i) {
    const auto& r = t.regions[rank * kNumRegions + i];
    if (p >= r->base() && n <= r->bytes() && uint64_t(p - r->base()) <= r->bytes() - n) return true;
  }
  return false;
}

void Touch(char* p, uint64_t n) {
  if (n == 0) return;
  volatile char* v = p;
  v[0] = v[0];
  v[n - 1] = v[n - 1];
}

}  // namespace
}  // namespace dmagather::fuzz

namespace dmagather::fuzz {

int FuzzOne(const uint8_t* data, size_t size) {
  static Tables* tables = new Tables();
  Input in(data, size);
  const uint8_t shape = in.Take<uint8_t>();
  const int world = 1 + (shape & 3);
  const int rank = (shape >> 2) % world;
  const uint32_t expected_seq = in.Take<uint32_t>();
  RankPart part;
  for (int item = 0; item < 2 && (item == 0 || !in.empty()); ++item) {
    abi::DescriptorV1 slot{};
    in.TakeBytes(&slot, sizeof(slot));
    Request req;
    server::ingress::DecodeDescriptor(slot, &req);
    const size_t items_before = part.items.size();
    Ingress::Validate(req, expected_seq, rank, *tables->tables[rank], world, &part);
    if (!part.status.ok()) {
      if (part.items.size() != items_before) __builtin_trap();  // A failed item is not added.
      continue;
    }
    if (part.items.size() != items_before + 1) __builtin_trap();
    const auto& it = part.items.back();
    const uint64_t bytes = it.count * common::DtypeSize(it.dtype);
    const uint64_t out_bytes = it.kind == server::scheduler::OpKind::kAllGather ? bytes * world : bytes;
    if (it.recv_begin + it.num_recv != part.recv.size()) __builtin_trap();
    if (!Inside(*tables, rank, it.send, bytes)) __builtin_trap();
    Touch(const_cast<char*>(it.send), bytes);
    for (uint32_t i = 0; i < it.num_recv; ++i) {
      char* out = part.recv[it.recv_begin + i];
      if (!Inside(*tables, rank, out, out_bytes)) __builtin_trap();
      Touch(out, out_bytes);
    }
  }
  return 0;
}

}  // namespace dmagather::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return dmagather::fuzz::FuzzOne(data, size); }
