// The stable C ABI of libdmagather: thin wrappers over CommImpl that turn
// absl::Status into dmagather_status_t and keep the last error's sentence.
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/comm.h"
#include "common/api_names.h"
#include "common/dtype.h"
#include "dmagather/dmagather.h"

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

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : fallback;
}

#define DMAG_CHECK_COMM(comm) \
  if ((comm) == nullptr) return Report(nullptr, absl::InvalidArgumentError("comm is NULL"))

// The fields of a caller's config that its version has (size says which).
#define DMAG_CONFIG_HAS(cfg, field) ((cfg)->size >= offsetof(dmagather_config_t, field) + sizeof((cfg)->field))

}  // namespace

extern "C" {

dmagather_status_t dmagather_comm_init_config(const char* job_key, int world_size, int rank,
                                              const dmagather_config_t* config, dmagather_comm_t* comm) {
  if (comm == nullptr) return Report(nullptr, absl::InvalidArgumentError("comm (output) is NULL"));
  *comm = nullptr;
  dmagather::client::CommOptions o;
  o.job_key = job_key != nullptr ? job_key : "";
  o.world_size = world_size;
  o.rank = rank;
  o.join_timeout_ms = EnvInt("DMAGATHER_JOIN_TIMEOUT_MS", 60000);
  // 0 is a setting here (the job ends with its daemon), not "unset".
  if (const char* r = std::getenv("DMAGATHER_RECONNECT_S"); r != nullptr && *r != '\0' && std::atoi(r) >= 0) {
    o.reconnect_s = std::atoi(r);
  }
  if (config != nullptr) {
    if (config->magic != DMAGATHER_CONFIG_MAGIC || config->size < offsetof(dmagather_config_t, socket_path)) {
      return Report(nullptr, absl::InvalidArgumentError(
                                 "config was not set up with DMAGATHER_CONFIG_INITIALIZER (bad size or magic)"));
    }
    // Same major version: the fields the caller knows mean what it thinks.
    if (config->version / 10000 != DMAGATHER_VERSION_MAJOR) {
      return Report(nullptr, absl::InvalidArgumentError(absl::StrCat(
                                 "config was built against dmagather version code ", config->version,
                                 "; this library is ", DMAGATHER_VERSION_STRING, " (major versions differ)")));
    }
    if (DMAG_CONFIG_HAS(config, socket_path) && config->socket_path != nullptr) o.socket_path = config->socket_path;
    if (DMAG_CONFIG_HAS(config, join_timeout_ms) && config->join_timeout_ms > 0) {
      o.join_timeout_ms = config->join_timeout_ms;
    }
    if (DMAG_CONFIG_HAS(config, spin)) o.spin = config->spin;
    if (DMAG_CONFIG_HAS(config, local_rank)) o.local_rank = config->local_rank;
    if (DMAG_CONFIG_HAS(config, local_world_size)) o.local_world_size = config->local_world_size;
    if (DMAG_CONFIG_HAS(config, job_id) && config->job_id != nullptr) o.job_id = config->job_id;
  }
  if (o.job_id.empty()) {
    if (const char* id = std::getenv("DMAGATHER_JOB_ID"); id != nullptr) o.job_id = id;
  }
  auto impl = dmagather::client::CommImpl::Create(o);
  if (!impl.ok()) return Report(nullptr, impl.status());
  *comm = new dmagather_comm{*std::move(impl), {}};
  return DMAGATHER_OK;
}

dmagather_status_t dmagather_job_id_create(const char* socket_path, char* job_id, size_t job_id_size) {
  if (job_id == nullptr || job_id_size == 0) {
    return Report(nullptr, absl::InvalidArgumentError("job_id (output) is NULL or empty"));
  }
  job_id[0] = '\0';
  auto id = dmagather::client::CreateJobId(socket_path != nullptr ? socket_path : "");
  if (!id.ok()) return Report(nullptr, id.status());
  if (id->size() + 1 > job_id_size) {
    return Report(nullptr, absl::InvalidArgumentError(
                               absl::StrCat("job_id needs ", id->size() + 1, " bytes (DMAGATHER_JOB_ID_MAX)")));
  }
  memcpy(job_id, id->c_str(), id->size() + 1);
  return DMAGATHER_OK;
}

dmagather_status_t dmagather_comm_init(const char* socket_path, const char* job_key, int world_size, int rank,
                                       dmagather_comm_t* comm) {
  dmagather_config_t config = DMAGATHER_CONFIG_INITIALIZER;
  config.socket_path = socket_path;
  return dmagather_comm_init_config(job_key, world_size, rank, &config, comm);
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

dmagather_status_t dmagather_allgather_list(dmagather_comm_t comm, const void* send, void* const* recvs, size_t count,
                                            dmagather_dtype_t dtype, void* stream) {
  DMAG_CHECK_COMM(comm);
  return Report(comm, comm->impl->AllGatherList(send, recvs, count, dtype, stream));
}

dmagather_status_t dmagather_allgather_async(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                             dmagather_dtype_t dtype, void* stream, dmagather_op_t* op) {
  DMAG_CHECK_COMM(comm);
  dmagather::client::GatherItem item{false, send, &recv, count, dtype};
  uint64_t handle = 0;
  dmagather_status_t st = Report(comm, comm->impl->Submit(&item, 1, stream, &handle));
  if (op != nullptr) *op = handle;
  return st;
}

dmagather_status_t dmagather_allgather_coalesced(dmagather_comm_t comm, const dmagather_gather_t* items, size_t n,
                                                 void* stream, dmagather_op_t* op) {
  DMAG_CHECK_COMM(comm);
  dmagather::client::GatherItem gi[DMAGATHER_MAX_COALESCED];
  const size_t m = items == nullptr ? 0 : std::min<size_t>(n, DMAGATHER_MAX_COALESCED);
  for (size_t i = 0; i < m; ++i) {
    gi[i] = dmagather::client::GatherItem{false, items[i].send, &items[i].recv, items[i].count, items[i].dtype};
  }
  uint64_t handle = 0;
  dmagather_status_t st = Report(comm, comm->impl->Submit(items == nullptr ? nullptr : gi, n, stream, &handle));
  if (op != nullptr) *op = handle;
  return st;
}

dmagather_status_t dmagather_submit_fallback(dmagather_comm_t comm, const char* reason, dmagather_op_t* op) {
  DMAG_CHECK_COMM(comm);
  uint64_t handle = 0;
  dmagather_status_t st = Report(comm, comm->impl->SubmitFallback(reason != nullptr ? reason : "", &handle));
  if (op != nullptr) *op = handle;
  return st;
}

dmagather_status_t dmagather_reduce_scatter_async(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                                  dmagather_dtype_t dtype, dmagather_redop_t op, void* stream,
                                                  dmagather_op_t* handle) {
  DMAG_CHECK_COMM(comm);
  uint64_t h = 0;
  dmagather_status_t st = Report(comm, comm->impl->ReduceScatterOp(send, recv, count, dtype, op, stream, &h));
  if (handle != nullptr) *handle = h;
  return st;
}

dmagather_status_t dmagather_reduce_scatter(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                            dmagather_dtype_t dtype, dmagather_redop_t op, void* stream) {
  DMAG_CHECK_COMM(comm);
  uint64_t h = 0;
  absl::Status st = comm->impl->ReduceScatterOp(send, recv, count, dtype, op, stream, &h);
  // CPU: complete on return; GPU: stream-ordered on `stream` already.
  if (st.ok() && comm->impl->host_waits()) st = comm->impl->OpWait(h);
  return Report(comm, st);
}

dmagather_status_t dmagather_alltoall_async(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                            dmagather_dtype_t dtype, void* stream, dmagather_op_t* op) {
  DMAG_CHECK_COMM(comm);
  uint64_t h = 0;
  dmagather_status_t st = Report(comm, comm->impl->AllToAll(send, recv, count, dtype, stream, &h));
  if (op != nullptr) *op = h;
  return st;
}

dmagather_status_t dmagather_op_wait(dmagather_comm_t comm, dmagather_op_t op) {
  DMAG_CHECK_COMM(comm);
  return Report(comm, comm->impl->OpWait(op));
}

dmagather_status_t dmagather_op_test(dmagather_comm_t comm, dmagather_op_t op, int* done) {
  DMAG_CHECK_COMM(comm);
  if (done == nullptr) return Report(comm, absl::InvalidArgumentError("done (output) is NULL"));
  *done = 0;
  absl::Status op_status;
  auto finished = comm->impl->OpTest(op, &op_status);
  if (!finished.ok()) return Report(comm, finished.status());
  *done = *finished ? 1 : 0;
  return Report(comm, op_status);
}

dmagather_status_t dmagather_op_wait_stream(dmagather_comm_t comm, dmagather_op_t op, void* stream) {
  DMAG_CHECK_COMM(comm);
  return Report(comm, comm->impl->OpWaitStream(op, stream));
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

const char* dmagather_version(void) { return DMAGATHER_VERSION_STRING; }

int dmagather_version_code(void) { return DMAGATHER_VERSION_CODE; }

}  // extern "C"
