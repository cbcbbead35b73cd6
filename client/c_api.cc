// The stable C ABI of libdmagather: thin wrappers over CommImpl that turn
// absl::Status into dmagather_status_t and keep the last error's sentence.
#include <string>

#include "client/comm.h"
#include "dmagather/dmagather.h"
#include "common/api_names.h"
#include "common/dtype.h"

struct dmagather_comm {
  std::unique_ptr<dmagather::client::CommImpl> impl;
  std::string last_error;
};

namespace {

thread_local std::string g_init_error;  // dmagather_last_error(NULL): why init failed.

dmagather_status_t Report(dmagather_comm_t comm, const absl::Status& s) {
  if (!s.ok()) {
    if (comm != nullptr) {
      comm->last_error = std::string(s.message());
    } else {
      g_init_error = std::string(s.message());
    }
  }
  return static_cast<dmagather_status_t>(dmagather::common::ToApiStatus(s));
}

#define DMAG_CHECK_COMM(comm) \
  if ((comm) == nullptr) return Report(nullptr, absl::InvalidArgumentError("comm is NULL"))

}  // namespace

extern "C" {

dmagather_status_t dmagather_comm_init(const char* socket_path, const char* job_key, int world_size, int rank,
                                       dmagather_comm_t* comm) {
  if (comm == nullptr) return Report(nullptr, absl::InvalidArgumentError("comm (output) is NULL"));
  *comm = nullptr;
  dmagather::client::CommOptions o;
  o.socket_path = socket_path != nullptr ? socket_path : "";
  o.job_key = job_key != nullptr ? job_key : "";
  o.world_size = world_size;
  o.rank = rank;
  if (const char* t = std::getenv("DMAGATHER_JOIN_TIMEOUT_MS"); t != nullptr && std::atoi(t) > 0) {
    o.join_timeout_ms = std::atoi(t);
  }
  auto impl = dmagather::client::CommImpl::Create(o);
  if (!impl.ok()) return Report(nullptr, impl.status());
  *comm = new dmagather_comm{*std::move(impl), {}};
  return DMAGATHER_OK;
}

dmagather_status_t dmagather_comm_destroy(dmagather_comm_t comm) {
  if (comm == nullptr) return DMAGATHER_OK;
  absl::Status st = comm->impl->Close();
  dmagather_status_t code = Report(nullptr, st);
  delete comm;
  return code;
}

dmagather_status_t dmagather_alloc(dmagather_comm_t comm, size_t bytes, void** ptr) {
  DMAG_CHECK_COMM(comm);
  if (ptr == nullptr) return Report(comm, absl::InvalidArgumentError("ptr (output) is NULL"));
  *ptr = nullptr;
  auto p = comm->impl->Alloc(bytes);
  if (!p.ok()) return Report(comm, p.status());
  *ptr = *p;
  return DMAGATHER_OK;
}

dmagather_status_t dmagather_free(dmagather_comm_t comm, void* ptr) {
  DMAG_CHECK_COMM(comm);
  if (ptr == nullptr) return DMAGATHER_OK;
  return Report(comm, comm->impl->Free(ptr));
}

dmagather_status_t dmagather_register(dmagather_comm_t comm, void* ptr, size_t bytes) {
  DMAG_CHECK_COMM(comm);
  return Report(comm, comm->impl->Register(ptr, bytes));
}

dmagather_status_t dmagather_deregister(dmagather_comm_t comm, void* ptr) {
  DMAG_CHECK_COMM(comm);
  return Report(comm, comm->impl->Deregister(ptr));
}

dmagather_status_t dmagather_allgather(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                       dmagather_dtype_t dtype, void* stream) {
  DMAG_CHECK_COMM(comm);
  return Report(comm, comm->impl->AllGather(send, recv, count, dtype, stream));
}

dmagather_status_t dmagather_allgather_list(dmagather_comm_t comm, const void* send, void* const* recvs,
                                            size_t count, dmagather_dtype_t dtype, void* stream) {
  DMAG_CHECK_COMM(comm);
  return Report(comm, comm->impl->AllGatherList(send, recvs, count, dtype, stream));
}

dmagather_status_t dmagather_wait(dmagather_comm_t comm) {
  DMAG_CHECK_COMM(comm);
  return Report(comm, comm->impl->Wait());
}

const char* dmagather_status_string(dmagather_status_t status) { return dmagather::common::ApiStatusName(status); }

const char* dmagather_last_error(dmagather_comm_t comm) {
  return comm != nullptr ? comm->last_error.c_str() : g_init_error.c_str();
}

const char* dmagather_backend(dmagather_comm_t comm) { return comm != nullptr ? comm->impl->backend().c_str() : ""; }

int dmagather_comm_rank(dmagather_comm_t comm) { return comm != nullptr ? comm->impl->rank() : -1; }

int dmagather_comm_size(dmagather_comm_t comm) { return comm != nullptr ? comm->impl->world_size() : -1; }

size_t dmagather_dtype_size(dmagather_dtype_t dtype) { return dmagather::common::DtypeSize(dtype); }

const char* dmagather_dtype_name(dmagather_dtype_t dtype) { return dmagather::common::DtypeName(dtype); }

const char* dmagather_version(void) { return "0.1.0"; }

}  // extern "C"
