// A CopyEngine for unit tests of the scheduler: records every op it is
// given and completes them only when the test says so (in any order, with
// any status), so ordering and failure paths can be driven exactly.
#pragma once

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "server/engines/copy_engine.h"

namespace dmagather::server::engines::testing {

class FakeRegion : public ImportedRegion {
 public:
  explicit FakeRegion(uint64_t bytes) : mem_(bytes) {}
  char* base() const override { return const_cast<char*>(mem_.data()); }
  uint64_t bytes() const override { return mem_.size(); }

 private:
  std::vector<char> mem_;
};

class FakeCopyEngine : public CopyEngine {
 public:
  const char* name() const override { return "fake"; }
  absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec) override {
    return std::make_shared<FakeRegion>(spec.bytes);
  }
  void Execute(EngineOp* op) override { pending.push_back(op); }
  void Stop() override {}
  EngineStats stats() const override { return {}; }
  int worker_threads() const override { return 0; }
  bool host_addressable() const override { return host_memory; }

  // Performs op i's copies (memcpy) and completes it with `status`.
  void Complete(size_t i, absl::Status status = absl::OkStatus()) {
    EngineOp* op = pending[i];
    pending.erase(pending.begin() + i);
    if (status.ok()) {
      for (const auto& c : op->plan.copies) std::memcpy(c.dst, c.src, c.bytes);
    }
    op->OnEngineDone(status);
  }

  std::deque<EngineOp*> pending;
  bool host_memory = false;  // true: behaves as the host backend (rank memory is the daemon's).
};

}  // namespace dmagather::server::engines::testing
