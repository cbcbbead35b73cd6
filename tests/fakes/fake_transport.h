// An in-memory transport::Connection pair for Ring's threads. Test-only.
//
// Each direction is a byte pipe. A pipe can be
//   - closed by its writer (a daemon that dies: the reader gets the bytes
//     already written, then "closed by the peer"; the writer's end is gone,
//     so writes into the other direction fail),
//   - stalled (nothing is delivered and nothing fails - a host that lost
//     power - until the connection is shut down here).
// Shutdown() makes blocked and later calls on that end fail, as tcp's does.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "server/transport/transport.h"

namespace dmagather::server::cluster::testing {

struct FakePipe {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<char> bytes;
  bool writer_gone = false;  // EOF after the bytes.
  bool reader_gone = false;  // Writes fail.
  bool stalled = false;
  bool shut = false;  // The reading end was shut down.
};

// Set when the process owning an end dies: from then on nothing it sends
// leaves (a dead process writes nothing), whichever of its links it uses.
using OwnerDead = std::shared_ptr<std::atomic<bool>>;

class FakeConnection : public transport::Connection {
 public:
  FakeConnection(std::shared_ptr<FakePipe> in, std::shared_ptr<FakePipe> out, std::string peer, OwnerDead dead)
      : in_(std::move(in)), out_(std::move(out)), peer_(std::move(peer)), dead_(std::move(dead)) {}
  ~FakeConnection() override { Die(); }
  FakeConnection(const FakeConnection&) = delete;
  FakeConnection& operator=(const FakeConnection&) = delete;

  absl::Status Send(const void* header, size_t header_len, const void* payload, size_t len) override {
    std::lock_guard<std::mutex> lock(out_->mu);
    if (dead_->load() || out_->reader_gone || out_->writer_gone) {
      return absl::UnavailableError("send to " + peer_ + ": reset");
    }
    const char* h = static_cast<const char*>(header);
    out_->bytes.insert(out_->bytes.end(), h, h + header_len);
    if (len != 0) {
      const char* p = static_cast<const char*>(payload);
      out_->bytes.insert(out_->bytes.end(), p, p + len);
    }
    out_->cv.notify_all();
    return absl::OkStatus();
  }

  absl::Status Recv(void* dst, size_t len) override {
    std::unique_lock<std::mutex> lock(in_->mu);
    in_->cv.wait(lock, [&] { return in_->shut || (!in_->stalled && (in_->bytes.size() >= len || in_->writer_gone)); });
    if (in_->shut) return absl::UnavailableError("connection to " + peer_ + " was shut down");
    if (in_->bytes.size() < len) return absl::UnavailableError("connection to " + peer_ + " closed by the peer");
    char* d = static_cast<char*>(dst);
    std::copy(in_->bytes.begin(), in_->bytes.begin() + long(len), d);
    in_->bytes.erase(in_->bytes.begin(), in_->bytes.begin() + long(len));
    return absl::OkStatus();
  }

  void Shutdown() override {
    {
      std::lock_guard<std::mutex> lock(in_->mu);
      in_->shut = true;
      in_->reader_gone = true;
    }
    in_->cv.notify_all();
    {
      std::lock_guard<std::mutex> lock(out_->mu);
      out_->writer_gone = true;
    }
    out_->cv.notify_all();
  }

  // This end's process dies: the peer reads what was written, then EOF;
  // its writes fail.
  void Die() {
    {
      std::lock_guard<std::mutex> lock(out_->mu);
      out_->writer_gone = true;
    }
    out_->cv.notify_all();
    {
      std::lock_guard<std::mutex> lock(in_->mu);
      in_->reader_gone = true;
      in_->shut = true;  // Its own threads stop reading.
    }
    in_->cv.notify_all();
  }

  const std::string& peer() const override { return peer_; }
  int fd() const override { return -1; }

 private:
  std::shared_ptr<FakePipe> in_, out_;
  const std::string peer_;
  const OwnerDead dead_;
};

// A connection between `a` (the sending, connecting end) and `b`.
struct FakeLink {
  std::shared_ptr<FakePipe> forward = std::make_shared<FakePipe>(), backward = std::make_shared<FakePipe>();
  FakeConnection* a_end = nullptr;  // Owned by the rings.
  FakeConnection* b_end = nullptr;

  std::pair<std::unique_ptr<transport::Connection>, std::unique_ptr<transport::Connection>> Make(const std::string& a,
                                                                                                 const std::string& b,
                                                                                                 OwnerDead a_dead,
                                                                                                 OwnerDead b_dead) {
    auto ca = std::make_unique<FakeConnection>(backward, forward, b, std::move(a_dead));
    auto cb = std::make_unique<FakeConnection>(forward, backward, a, std::move(b_dead));
    a_end = ca.get();
    b_end = cb.get();
    return {std::move(ca), std::move(cb)};
  }
  // Nothing moves either way any more, nothing fails.
  void Stall() {
    for (auto* p : {forward.get(), backward.get()}) {
      std::lock_guard<std::mutex> lock(p->mu);
      p->stalled = true;
    }
  }
};

}  // namespace dmagather::server::cluster::testing
