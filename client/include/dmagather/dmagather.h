/* dmagather: AllGather on GPU copy engines, served by the node's dmagatherd.
 *
 * Stable C ABI of libdmagather.so, usable from C, C++ and ctypes. A rank joins
 * its job once (dmagather_comm_init), allocates or registers the buffers the
 * daemon may read and write, and submits AllGathers that complete
 * asynchronously: on the CPU backend call dmagather_wait before reading the
 * output; on the CUDA backend the caller's stream waits on the GPU.
 *
 * Thread safety: one dmagather_comm_t is used by one thread at a time.
 */
#ifndef DMAGATHER_DMAGATHER_H_
#define DMAGATHER_DMAGATHER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DMAGATHER_VERSION_MAJOR 0
#define DMAGATHER_VERSION_MINOR 1
#define DMAGATHER_VERSION_PATCH 0

/* Default control socket of the node's daemon; overridden by the
 * DMAGATHER_SOCKET environment variable or an explicit socket_path. */
#define DMAGATHER_DEFAULT_SOCKET "/run/dmagather/dmagatherd.sock"

typedef enum {
  DMAGATHER_OK = 0,
  DMAGATHER_FALLBACK = 1,         /* Cannot be served here; reason in last_error. */
  DMAGATHER_INVALID_ARGUMENT = 2, /* Bad pointer, size, dtype, or ranks disagree. */
  DMAGATHER_UNAVAILABLE = 3,      /* No daemon, or the daemon went away. */
  DMAGATHER_PEER_FAILED = 4,      /* Another rank of the job died or left. */
  DMAGATHER_TIMEOUT = 5,          /* Other ranks did not arrive in time. */
  DMAGATHER_INTERNAL = 6          /* A bug or an unexpected system error. */
} dmagather_status_t;

typedef enum {
  DMAGATHER_UINT8 = 0,
  DMAGATHER_INT8 = 1,
  DMAGATHER_INT32 = 2,
  DMAGATHER_INT64 = 3,
  DMAGATHER_FLOAT16 = 4,
  DMAGATHER_BFLOAT16 = 5,
  DMAGATHER_FLOAT32 = 6,
  DMAGATHER_FLOAT64 = 7,
  DMAGATHER_NUM_DTYPES = 8
} dmagather_dtype_t;

typedef struct dmagather_comm* dmagather_comm_t;

/* Joins (or creates) job `job_key` of `world_size` ranks on the node's daemon
 * as `rank`. Blocks until all ranks have joined or the join timeout
 * (DMAGATHER_JOIN_TIMEOUT_MS, default 60000) passes. socket_path may be NULL. */
dmagather_status_t dmagather_comm_init(const char* socket_path, const char* job_key,
                                       int world_size, int rank, dmagather_comm_t* comm);

/* Leaves the job and frees everything the comm holds. Outstanding operations
 * are waited for first. */
dmagather_status_t dmagather_comm_destroy(dmagather_comm_t comm);

/* Memory the daemon can reach (CPU backend: shared memory; CUDA backend:
 * device memory of the rank's current device). */
dmagather_status_t dmagather_alloc(dmagather_comm_t comm, size_t bytes, void** ptr);
dmagather_status_t dmagather_free(dmagather_comm_t comm, void* ptr);

/* Makes memory the caller allocated itself reachable (CUDA: any device
 * pointer, also inside a caching allocator's segment). Registering memory
 * that is already covered is a no-op. The CPU backend reaches only memory
 * from dmagather_alloc and returns DMAGATHER_FALLBACK for anything else. */
dmagather_status_t dmagather_register(dmagather_comm_t comm, void* ptr, size_t bytes);
dmagather_status_t dmagather_deregister(dmagather_comm_t comm, void* ptr);

/* all_gather_into_tensor: recv holds world_size*count elements and rank r's
 * `send` lands at recv + r*count. send may alias recv + rank*count (in place).
 * Asynchronous. `stream` is a cudaStream_t on the CUDA backend, NULL on CPU. */
dmagather_status_t dmagather_allgather(dmagather_comm_t comm, const void* send, void* recv,
                                       size_t count, dmagather_dtype_t dtype, void* stream);

/* List output: recvs[r] (world_size pointers, each `count` elements)
 * receives rank r's shard. */
dmagather_status_t dmagather_allgather_list(dmagather_comm_t comm, const void* send,
                                            void* const* recvs, size_t count,
                                            dmagather_dtype_t dtype, void* stream);

/* Waits for all outstanding operations of this rank; returns the first error
 * since the last wait. */
dmagather_status_t dmagather_wait(dmagather_comm_t comm);

const char* dmagather_status_string(dmagather_status_t status);
/* A sentence about the last failure on this comm: what, which rank, why.
 * Valid until the next call on the comm. */
const char* dmagather_last_error(dmagather_comm_t comm);
/* "host" or "cuda". */
const char* dmagather_backend(dmagather_comm_t comm);
int dmagather_comm_rank(dmagather_comm_t comm);
int dmagather_comm_size(dmagather_comm_t comm);
size_t dmagather_dtype_size(dmagather_dtype_t dtype);
const char* dmagather_dtype_name(dmagather_dtype_t dtype);
const char* dmagather_version(void);

#ifdef __cplusplus
}
#endif

#endif /* DMAGATHER_DMAGATHER_H_ */
