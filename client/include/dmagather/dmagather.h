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

/* The one place the version is written: the library, the daemon and the
 * Python package all report it from here. */
#define DMAGATHER_VERSION_MAJOR 0
#define DMAGATHER_VERSION_MINOR 4
#define DMAGATHER_VERSION_PATCH 0
#define DMAGATHER_VERSION_CODE \
  (DMAGATHER_VERSION_MAJOR * 10000 + DMAGATHER_VERSION_MINOR * 100 + DMAGATHER_VERSION_PATCH)
#define DMAGATHER_STR_INNER_(x) #x
#define DMAGATHER_STR_(x) DMAGATHER_STR_INNER_(x)
#define DMAGATHER_VERSION_STRING          \
  DMAGATHER_STR_(DMAGATHER_VERSION_MAJOR) \
  "." DMAGATHER_STR_(DMAGATHER_VERSION_MINOR) "." DMAGATHER_STR_(DMAGATHER_VERSION_PATCH)

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

/* Options of dmagather_comm_init_config. Always start from
 * DMAGATHER_CONFIG_INITIALIZER: `size`, `magic` and `version` tell the
 * library which fields the caller knows, so fields added in later versions
 * (at the end) never break callers built against this header. */
#define DMAGATHER_CONFIG_MAGIC 0x444d4147u /* "DMAG" */
typedef struct {
  size_t size;             /* sizeof(dmagather_config_t) */
  unsigned int magic;      /* DMAGATHER_CONFIG_MAGIC */
  unsigned int version;    /* DMAGATHER_VERSION_CODE the caller was built with */
  const char* socket_path; /* NULL: $DMAGATHER_SOCKET, then DMAGATHER_DEFAULT_SOCKET */
  int join_timeout_ms;     /* <= 0: $DMAGATHER_JOIN_TIMEOUT_MS, then 60000 */
  int spin;                /* Pause iterations before a waiting rank sleeps; < 0: $DMAGATHER_SPIN, then the
                              daemon's advice (4096 when every rank and the daemon have a core, else 0), then 256 */
  int local_rank;          /* Topology hint: rank among the job's ranks on this node (-1: unknown) */
  int local_world_size;    /* Topology hint: the job's ranks on this node (-1: unknown) */
  const char* job_id; /* Multi-node job: the id from dmagather_job_id_create (NULL: $DMAGATHER_JOB_ID, else one node) */
} dmagather_config_t;

#define DMAGATHER_CONFIG_INITIALIZER \
  { sizeof(dmagather_config_t), DMAGATHER_CONFIG_MAGIC, DMAGATHER_VERSION_CODE, NULL, 0, -1, -1, -1, NULL }

/* Joins (or creates) job `job_key` of `world_size` ranks on the node's daemon
 * as `rank`. Blocks until all ranks have joined or the join timeout passes.
 * config may be NULL (all defaults). */
dmagather_status_t dmagather_comm_init_config(const char* job_key, int world_size, int rank,
                                              const dmagather_config_t* config, dmagather_comm_t* comm);

/* ---- Jobs that span nodes ----
 * One rank (say rank 0) asks its node's daemon for a job id, the job's own
 * launcher hands it to every rank (torch store, MPI broadcast, environment),
 * and every rank passes it as config.job_id. The daemons then find each
 * other (the id names rank 0's daemon and carries a random secret they
 * authenticate with) and run the AllGather hierarchically: copy engines
 * inside each node, a ring between the nodes. The daemons need
 * --peer_listen. The id is a NUL-terminated string of at most
 * DMAGATHER_JOB_ID_MAX - 1 characters; keep it secret within the job. */
#define DMAGATHER_JOB_ID_MAX 256
dmagather_status_t dmagather_job_id_create(const char* socket_path, char* job_id, size_t job_id_size);

/* dmagather_comm_init_config with only a socket path (may be NULL). */
dmagather_status_t dmagather_comm_init(const char* socket_path, const char* job_key, int world_size, int rank,
                                       dmagather_comm_t* comm);

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
 * from dmagather_alloc and returns DMAGATHER_FALLBACK for anything else; a
 * submit that names such memory without asking first is a caller error
 * (DMAGATHER_INVALID_ARGUMENT, on every rank of the op). */
dmagather_status_t dmagather_register(dmagather_comm_t comm, void* ptr, size_t bytes);
dmagather_status_t dmagather_deregister(dmagather_comm_t comm, void* ptr);

/* all_gather_into_tensor: recv holds world_size*count elements and rank r's
 * `send` lands at recv + r*count. send may alias recv + rank*count (in place).
 * Asynchronous. `stream` is a cudaStream_t on the CUDA backend (which then
 * waits for completion on the GPU), NULL on CPU (call dmagather_wait). */
dmagather_status_t dmagather_allgather(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                       dmagather_dtype_t dtype, void* stream);

/* List output: recvs[r] (world_size pointers, each `count` elements)
 * receives rank r's shard. */
dmagather_status_t dmagather_allgather_list(dmagather_comm_t comm, const void* send, void* const* recvs, size_t count,
                                            dmagather_dtype_t dtype, void* stream);

/* Waits for all outstanding operations of this rank; returns the first error
 * since the last wait. */
dmagather_status_t dmagather_wait(dmagather_comm_t comm);

/* ---- Per-op handles ----
 * An op handle names one submitted operation of a comm (1, 2, ...; 0 is
 * never an op). Every rank of a job gets the same verdict for the same op:
 * when one rank cannot take part (memory its backend cannot reach, bad
 * arguments), the op fails on every rank with that rank's status
 * (DMAGATHER_FALLBACK or DMAGATHER_INVALID_ARGUMENT) and reason. */
typedef uint64_t dmagather_op_t;

/* One tensor of a coalesced AllGather (flat output, as
 * dmagather_allgather). */
typedef struct {
  const void* send;
  void* recv;
  size_t count;
  dmagather_dtype_t dtype;
} dmagather_gather_t;

#define DMAGATHER_MAX_COALESCED 64

/* Submits an AllGather and returns its handle in *op without waiting. CUDA:
 * the inputs are taken as ready at this point of `stream`; nothing waits for
 * completion until dmagather_op_wait_stream / dmagather_op_wait. When this
 * rank cannot take part, the op is still submitted (so the other ranks learn
 * it), *op is set, and the status says why (FALLBACK / INVALID_ARGUMENT). */
dmagather_status_t dmagather_allgather_async(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                             dmagather_dtype_t dtype, void* stream, dmagather_op_t* op);

/* n (1..DMAGATHER_MAX_COALESCED) flat AllGathers as one op: one matching and
 * one completion for the group; items may differ in count and dtype. */
dmagather_status_t dmagather_allgather_coalesced(dmagather_comm_t comm, const dmagather_gather_t* items, size_t n,
                                                 void* stream, dmagather_op_t* op);

/* ---- Reduce-scatter and all-to-all ----
 * The copy engines move the chunks (an all-to-all into staging memory of
 * the comm); the rank then sums them in one fixed order. */
typedef enum {
  DMAGATHER_SUM = 0,
  DMAGATHER_AVG = 1, /* The sum divided by world_size, rounded once (floating dtypes only). */
  DMAGATHER_NUM_REDOPS = 2
} dmagather_redop_t;

/* reduce_scatter_tensor: `send` holds world_size*count elements, chunk r
 * (elements [r*count, (r+1)*count)) for rank r; `recv` gets count elements:
 * chunk `rank` of every rank's send, summed over ranks 0..world_size-1 in
 * that order. 16-bit floats are accumulated in fp32 and rounded once, fp32
 * in fp32, fp64 in fp64; integers wrap. The same bits on every run, backend
 * and timing. recv may be send + rank*count (in place); else the two must
 * not overlap. The chunks pass through the comm's staging memory
 * ($DMAGATHER_STAGING_MB, default 64 MiB, allocated at the first use):
 * larger ops move in slices. Not served across nodes, nor under CUDA-graph
 * capture (FALLBACK). CUDA: stream-ordered on `stream`; the sum is a small
 * kernel on it. CPU: complete when the call returns. */
dmagather_status_t dmagather_reduce_scatter(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                            dmagather_dtype_t dtype, dmagather_redop_t op, void* stream);
/* The same, returning its handle without waiting (as dmagather_allgather_async).
 * CPU: the sum runs in dmagather_op_wait/op_test/wait. CUDA: the sum is on
 * `stream`; dmagather_op_wait_stream makes another stream wait for it. */
dmagather_status_t dmagather_reduce_scatter_async(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                                  dmagather_dtype_t dtype, dmagather_redop_t op, void* stream,
                                                  dmagather_op_t* handle);

/* all_to_all_single with equal chunks: `send` and `recv` hold world_size*count
 * elements; chunk r of send goes to rank r, where it lands as chunk `rank`
 * of recv. send and recv must not overlap. Within one node. */
dmagather_status_t dmagather_alltoall_async(dmagather_comm_t comm, const void* send, void* recv, size_t count,
                                            dmagather_dtype_t dtype, void* stream, dmagather_op_t* op);

/* Tells the job that this rank will not take part in its next operation
 * (e.g. its framework decided the tensors are unsuitable): that op completes
 * with DMAGATHER_FALLBACK and `reason` on every rank. */
dmagather_status_t dmagather_submit_fallback(dmagather_comm_t comm, const char* reason, dmagather_op_t* op);

/* Blocks (host) until `op` has completed; returns its status. */
dmagather_status_t dmagather_op_wait(dmagather_comm_t comm, dmagather_op_t op);
/* Non-blocking: *done = 1 and the op's status once completed; *done = 0 and
 * DMAGATHER_OK while it runs. */
dmagather_status_t dmagather_op_test(dmagather_comm_t comm, dmagather_op_t op, int* done);
/* CUDA: makes `stream` wait (on the GPU, no host sync) until `op` has
 * completed. The op's status is read later with dmagather_op_test/op_wait.
 * CPU backend: stream must be NULL and this is dmagather_op_wait. */
dmagather_status_t dmagather_op_wait_stream(dmagather_comm_t comm, dmagather_op_t op, void* stream);

const char* dmagather_status_string(dmagather_status_t status);
/* A sentence about the last failure on this comm: what, which rank, why.
 * Valid until the next call on the comm. */
const char* dmagather_last_error(dmagather_comm_t comm);
/* "host", "cuda" or "hip". */
const char* dmagather_backend(dmagather_comm_t comm);
int dmagather_comm_rank(dmagather_comm_t comm);
int dmagather_comm_size(dmagather_comm_t comm);
size_t dmagather_dtype_size(dmagather_dtype_t dtype);
const char* dmagather_dtype_name(dmagather_dtype_t dtype);
const char* dmagather_version(void);
/* DMAGATHER_VERSION_CODE of the library (MAJOR*10000 + MINOR*100 + PATCH). */
int dmagather_version_code(void);

#ifdef __cplusplus
}
#endif

#endif /* DMAGATHER_DMAGATHER_H_ */
