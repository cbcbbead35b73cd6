// Helpers for the transport tests: a connected, upgraded pair of
// Connections over 127.0.0.1, and self-checking frames (the header names the
// payload's length and seed, so a reader verifies every byte on its own).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/transport/transport.h"

namespace dmagather::server::transport::testing {

inline constexpr size_t kHeaderBytes = 256;  // What the ring sends today.

struct LinkPair {
  std::unique_ptr<Connection> a;  // The initiator (it connected).
  std::unique_ptr<Connection> b;  // The accepting end.
};

// Listens with `tb` on 127.0.0.1:0, connects with `ta`, and upgrades both
// ends at once (as two daemons do). The first failure is returned.
inline absl::StatusOr<LinkPair> MakeLinkPair(Transport& ta, Transport& tb) {
  auto listener = tb.Listen("127.0.0.1:0");
  if (!listener.ok()) return listener.status();
  absl::StatusOr<std::unique_ptr<Connection>> b = absl::UnknownError("not accepted");
  std::thread acceptor([&] {
    auto c = (*listener)->Accept();
    if (c.ok()) {
      b = tb.Upgrade(std::move(*c), /*initiator=*/false);
    } else {
      b = c.status();
    }
  });
  absl::StatusOr<std::unique_ptr<Connection>> a = ta.Connect((*listener)->address(), absl::Seconds(5));
  if (a.ok()) {
    a = ta.Upgrade(std::move(*a), /*initiator=*/true);
  } else {
    (*listener)->Shutdown();
  }
  acceptor.join();
  if (!a.ok()) return absl::Status(a.status().code(), absl::StrCat("initiator: ", a.status().message()));
  if (!b.ok()) return absl::Status(b.status().code(), absl::StrCat("acceptor: ", b.status().message()));
  LinkPair p;
  p.a = std::move(*a);
  p.b = std::move(*b);
  return p;
}

// Deterministic bytes from a seed (splitmix64 per 8 bytes).
inline void FillPattern(uint64_t seed, char* p, size_t n) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t i = 0; i < n; i += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(p + i, &z, std::min<size_t>(8, n - i));
  }
}

struct Frame {
  std::vector<char> header = std::vector<char>(kHeaderBytes);
  std::vector<char> payload;
};

// Header: payload length, seed, then pattern bytes.
inline Frame MakeFrame(uint64_t seed, size_t len) {
  Frame f;
  const uint64_t l = len;
  std::memcpy(f.header.data(), &l, 8);
  std::memcpy(f.header.data() + 8, &seed, 8);
  FillPattern(~seed, f.header.data() + 16, kHeaderBytes - 16);
  f.payload.resize(len);
  FillPattern(seed, f.payload.data(), len);
  return f;
}

inline absl::Status SendFrame(Connection& c, const Frame& f) {
  return c.Send(f.header.data(), f.header.size(), f.payload.empty() ? nullptr : f.payload.data(), f.payload.size());
}

// Reads one frame (the header, then the payload in pieces of at most
// `piece` bytes; 0: one Recv) and checks it is frame `seed`, every byte.
inline absl::Status RecvAndCheckFrame(Connection& c, uint64_t seed, size_t piece = 0) {
  std::vector<char> header(kHeaderBytes);
  if (auto s = c.Recv(header.data(), header.size()); !s.ok()) return s;
  uint64_t len = 0, got_seed = 0;
  std::memcpy(&len, header.data(), 8);
  std::memcpy(&got_seed, header.data() + 8, 8);
  if (got_seed != seed) return absl::DataLossError(absl::StrCat("frame seed ", got_seed, ", expected ", seed));
  if (len > (uint64_t{1} << 30)) return absl::DataLossError(absl::StrCat("frame ", seed, ": length ", len));
  Frame want = MakeFrame(seed, len);
  if (header != want.header) return absl::DataLossError(absl::StrCat("frame ", seed, ": header differs"));
  std::vector<char> payload(len);
  for (size_t off = 0; off < len;) {
    const size_t n = piece == 0 ? len - off : std::min(piece, len - off);
    if (auto s = c.Recv(payload.data() + off, n); !s.ok()) return s;
    off += n;
  }
  if (payload != want.payload) {
    size_t i = 0;
    while (payload[i] == want.payload[i]) ++i;
    return absl::DataLossError(absl::StrCat("frame ", seed, " (", len, " bytes): payload differs at byte ", i));
  }
  return absl::OkStatus();
}

}  // namespace dmagather::server::transport::testing
