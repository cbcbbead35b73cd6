// PeerTable: which GPU of the engine can reach which other GPU's memory
// directly (peer access enabled and a probe copy checked at start-up). The
// GPU engine routes every copy by it (IssuingDevice below, router.h) and the
// importers grant access to imported memory by it (cuda/vmm_import.h), so no
// copy is ever issued on a device that cannot reach both ends of it.
//
// Threads: filled once by the engine's start-up, then read-only.
#pragma once

#include <string>
#include <vector>

namespace dmagather::server::engines::gpu {

class PeerTable {
 public:
  PeerTable() = default;
  explicit PeerTable(int devices) : n_(devices), ok_(size_t(devices) * devices, 0), why_(ok_.size()) {
    for (int d = 0; d < n_; ++d) ok_[Index(d, d)] = 1;
  }

  int devices() const { return n_; }
  // `from` reads and writes memory of `to` directly (always true for from == to).
  bool ok(int from, int to) const { return InRange(from) && InRange(to) && ok_[Index(from, to)] != 0; }
  // Why a pair is not reachable ("" when it is, or nothing was said).
  const std::string& why(int from, int to) const {
    static const std::string kNone;
    return InRange(from) && InRange(to) ? why_[Index(from, to)] : kNone;
  }
  // The device that issues a copy from memory of `src` into memory of `dst`:
  // `dst` when it reaches the source (a pull; src < 0: host memory), else
  // `src` when it reaches the destination (a push), else -1.
  int IssuingDevice(int src, int dst) const {
    if (!InRange(dst)) return -1;
    if (src < 0 || src == dst || ok(dst, src)) return dst;
    if (ok(src, dst)) return src;
    return -1;
  }
  void Set(int from, int to, bool reachable, std::string why = "") {
    if (!InRange(from) || !InRange(to) || from == to) return;
    ok_[Index(from, to)] = reachable ? 1 : 0;
    why_[Index(from, to)] = reachable ? "" : std::move(why);
  }

 private:
  bool InRange(int d) const { return d >= 0 && d < n_; }
  size_t Index(int from, int to) const { return size_t(from) * n_ + to; }

  int n_ = 0;
  std::vector<char> ok_;
  std::vector<std::string> why_;
};

}  // namespace dmagather::server::engines::gpu
