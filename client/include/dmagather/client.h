// C++ wrapper over the C ABI of libdmagather (header-only, so the ABI
// boundary stays the C one). RAII for the communicator and its buffers.
//
//   dmagather::Comm comm("/run/dmagather/dmagatherd.sock", "job-42", 8, rank);
//   if (!comm.ok()) { std::cerr << comm.error(); ... }
//   void* buf = comm.Alloc(bytes);
//   comm.AllGather(buf + rank*shard, buf, count, DMAGATHER_BFLOAT16);
//   comm.Wait();
#ifndef DMAGATHER_CLIENT_H_
#define DMAGATHER_CLIENT_H_

#include <string>
#include <vector>

#include "dmagather/dmagather.h"

namespace dmagather {

class Comm {
 public:
  Comm(const char* socket_path, const std::string& job_key, int world_size, int rank) {
    status_ = dmagather_comm_init(socket_path, job_key.c_str(), world_size, rank, &comm_);
    if (status_ != DMAGATHER_OK) init_error_ = dmagather_last_error(nullptr);
  }
  ~Comm() {
    if (comm_ != nullptr) dmagather_comm_destroy(comm_);
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  bool ok() const { return comm_ != nullptr; }
  dmagather_status_t init_status() const { return status_; }
  std::string error() const { return comm_ != nullptr ? dmagather_last_error(comm_) : init_error_; }
  dmagather_comm_t get() const { return comm_; }
  int rank() const { return dmagather_comm_rank(comm_); }
  int size() const { return dmagather_comm_size(comm_); }
  std::string backend() const { return dmagather_backend(comm_); }

  // nullptr on failure (see error()).
  void* Alloc(size_t bytes) {
    void* p = nullptr;
    status_ = dmagather_alloc(comm_, bytes, &p);
    return status_ == DMAGATHER_OK ? p : nullptr;
  }
  dmagather_status_t Free(void* p) { return status_ = dmagather_free(comm_, p); }
  dmagather_status_t Register(void* p, size_t bytes) { return status_ = dmagather_register(comm_, p, bytes); }
  dmagather_status_t AllGather(const void* send, void* recv, size_t count, dmagather_dtype_t dtype,
                               void* stream = nullptr) {
    return status_ = dmagather_allgather(comm_, send, recv, count, dtype, stream);
  }
  dmagather_status_t AllGatherList(const void* send, const std::vector<void*>& recvs, size_t count,
                                   dmagather_dtype_t dtype, void* stream = nullptr) {
    return status_ = dmagather_allgather_list(comm_, send, recvs.data(), count, dtype, stream);
  }
  dmagather_status_t ReduceScatter(const void* send, void* recv, size_t count, dmagather_dtype_t dtype,
                                   dmagather_redop_t op, void* stream = nullptr) {
    return status_ = dmagather_reduce_scatter(comm_, send, recv, count, dtype, op, stream);
  }
  dmagather_status_t AllToAll(const void* send, void* recv, size_t count, dmagather_dtype_t dtype,
                              void* stream = nullptr) {
    dmagather_op_t op = 0;
    status_ = dmagather_alltoall_async(comm_, send, recv, count, dtype, stream, &op);
    if (status_ == DMAGATHER_OK) status_ = dmagather_op_wait_stream(comm_, op, stream);
    return status_;
  }
  dmagather_status_t Wait() { return status_ = dmagather_wait(comm_); }

 private:
  dmagather_comm_t comm_ = nullptr;
  dmagather_status_t status_ = DMAGATHER_OK;
  std::string init_error_;
};

}  // namespace dmagather

#endif  // DMAGATHER_CLIENT_H_
