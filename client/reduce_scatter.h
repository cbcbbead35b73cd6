// ReduceScatter: a communicator's reduce-scatter. The daemon moves the
// chunks (an all-to-all into this rank's staging buffer: chunk `rank` of
// every other rank's send), then the rank sums them in rank order, reading
// its own chunk straight from its send (ClientBackend::Reduce: a small
// kernel on the caller's stream on GPUs, a vectorized loop on the host).
//
// Staging: two halves, each holding one chunk from every rank, allocated
// (registered with the daemon) at the first reduce-scatter and grown up to
// the bound ($DMAGATHER_STAGING_MB, 64 MiB in all by default); freed when
// the communicator closes. An op whose chunks do not fit a half moves in
// slices, alternating halves, so slice k+1's copies overlap slice k's sum.
// A half is taken again only after the sum that read it:
//  - GPU: the new user's stream waits for the half's mark (an event
//    recorded after that sum), on the GPU;
//  - host: that sum runs first (a sum runs in its op's wait, or when its
//    half is needed: slice k+2's submit runs slice k's sum, so slice k+1's
//    copies overlap it).
//
// The handle of a reduce-scatter is its last slice's op; its status is the
// first failure of any of its slices.
//
// Captured into a CUDA graph (the caller's stream is capturing): one op, no
// slices, with a staging buffer of its own that every replay writes, held
// while the graph lives (freed once its graph slot is seen reclaimed, at the
// next reduce-scatter or at close); the live captures' staging together is
// bounded like the halves (FALLBACK beyond). The capture holds the wait for
// the copies, the sum and the op's mark (an event recorded in the capture,
// for other streams of the same capture).
//
// Threads: the communicator's user thread (one call at a time).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "client/backend.h"
#include "dmagather/dmagather.h"

namespace dmagather::client {

class CommImpl;

class ReduceScatter {
 public:
  // `staging_bytes`: the bound on both halves together.
  ReduceScatter(CommImpl* comm, ClientBackend* backend, int rank, int world, uint64_t staging_bytes);
  ~ReduceScatter();

  absl::Status Submit(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, int redop, void* stream,
                      uint64_t* handle);

  // Whether `handle` is a reduce-scatter this object still tracks.
  bool Tracks(uint64_t handle) const;
  // Host: the op's sum (after its copies); GPU: the host waits for it. Its
  // status (the first failure of its slices).
  absl::Status Wait(uint64_t handle);
  // Non-blocking Wait: *done = false while it runs.
  absl::Status Test(uint64_t handle, bool* done);
  // `stream` waits (on the GPU) for the op's sum.
  absl::Status WaitStream(uint64_t handle, void* stream);
  // Every pending sum (dmagather_wait, close).
  absl::Status Finish();
  // Frees the staging buffer (the communicator is closing).
  void Release();

  uint64_t staging_bytes() const { return 2 * half_bytes_; }

 private:
  struct Half {
    std::unique_ptr<StreamMark> mark;  // GPU: after the last sum that read the half.
    // Host: the sum an async op left to its wait (none: pending == false).
    bool pending = false;
    uint64_t handle = 0;  // The op whose copies the pending sum waits for.
    ReduceArgs args;
  };
  struct Record {
    uint64_t first = 0, last = 0;  // The op's slices.
    int half = 0;                  // Its last slice's half.
  };

  // One call's arguments.
  struct Call {
    const char* send;
    char* recv;
    uint64_t count;
    dmagather_dtype_t dtype;
    int redop;
    void* stream;
    uint64_t esize = 0;
    uint64_t chunk = 0;  // Bytes of one chunk of the send.
  };
  // OK, or why this rank cannot take part.
  absl::Status CheckArgs(const Call& c);
  // A reduce-scatter captured into a CUDA graph.
  struct Captured {
    uint32_t slot = 0;
    uint64_t generation = 0;  // GraphSlots: which capture of the slot.
    char* staging = nullptr;
    uint64_t bytes = 0;
    std::unique_ptr<StreamMark> mark;  // After the sum, in the capture.
  };

  // Submits elements [off, off+n) of every chunk as one all-to-all into the
  // next half, and enqueues (GPU) or leaves pending (host) its sum.
  absl::Status SubmitSlice(const Call& c, uint64_t off, uint64_t n, Record* rec);
  // The capture path: the whole op into staging of its own, then the
  // capture's wait for it and its sum.
  absl::Status SubmitCaptured(const Call& c, uint64_t* handle);
  // Frees the staging of captures whose graphs were destroyed.
  void FreeDeadCaptures();
  // The sum of elements [off, off+n) of every chunk, the other ranks'
  // chunks at `staging` (n elements apart).
  ReduceArgs SumArgs(const Call& c, uint64_t off, uint64_t n, const char* staging) const;
  // Makes both halves at least `bytes` each (within the bound), waiting for
  // their users first when they must move.
  absl::Status EnsureStaging(uint64_t bytes);
  // Half `h` may be written by an op on `stream`.
  absl::Status TakeHalf(int h, void* stream);
  absl::Status RunPending(Half* half);
  // The statuses of ops first..last (the first failure).
  absl::Status SlicesStatus(const Record& r);
  const Record* Find(uint64_t handle) const;

  CommImpl* const comm_;
  ClientBackend* const backend_;
  const int rank_, world_;
  const uint64_t bound_;
  char* staging_ = nullptr;  // Two halves of half_bytes_.
  uint64_t half_bytes_ = 0;
  Half halves_[2];
  int next_half_ = 0;
  std::deque<Record> records_;             // The most recent ops (older ones have finished).
  std::map<uint64_t, Captured> captured_;  // By handle, while their graphs live.
  uint64_t captured_bytes_ = 0;
};

// $DMAGATHER_STAGING_MB in bytes (default 64 MiB; at least 1 MiB).
uint64_t StagingBoundFromEnv();

}  // namespace dmagather::client
