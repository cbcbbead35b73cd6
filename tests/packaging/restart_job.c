/* A long job for the package upgrade test (tests/packaging/upgrade.sh), built
 * against the installed packages only:
 *   cc restart_job.c $(pkg-config --cflags --libs dmagather)
 * Forks WORLD rank processes that join one job on the node's dmagatherd and
 * run numbered AllGathers 0, 1, 2, ... until the op number written in
 * DIR/stop (or MAX_OPS): op k has its own count, dtype, placement and input
 * bytes, and every output byte of it is compared once, after its one wait,
 * with what each rank wrote for op k. The daemon may be restarted or upgraded
 * under the job: the library waits for the next daemon (DMAGATHER_RECONNECT_S)
 * and the ops go on. Each rank appends one line per op to DIR/rank<R>.csv:
 *
 *   op,handle,count,dtype,in_place,status,differ,done_ns
 *
 * (done_ns: CLOCK_REALTIME when the op's wait returned), and prints a summary
 * line. Exits 0 only when every rank ran every op to DMAGATHER_OK with no byte
 * differing and op handles 1, 2, ... in order (no op lost, none seen twice).
 *
 *   restart_job WORLD DIR [PACE_US (default 2000)] [MAX_OPS (default 100000)]
 */
#include <dmagather/dmagather.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const size_t kCounts[] = {1, 1000, 4099, 65537};
#define NCOUNTS (sizeof(kCounts) / sizeof(kCounts[0]))
#define MAX_COUNT 65537

/* The byte rank `r` writes at byte `i` of its shard for op `op`. */
static uint8_t pattern(int r, size_t i, uint64_t op) {
  uint32_t x = (uint32_t)(r + 1) * 2654435761u ^ (uint32_t)i * 40503u ^ (uint32_t)op * 2246822519u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  return (uint8_t)(x >> 24 ^ x);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The op number in DIR/stop, or `fallback` while there is none. */
static uint64_t read_stop(const char* path, uint64_t fallback) {
  FILE* f = fopen(path, "r");
  if (f == NULL) return fallback;
  unsigned long long v = 0;
  int n = fscanf(f, "%llu", &v);
  fclose(f);
  return n == 1 ? (uint64_t)v : fallback;
}

static int run_rank(const char* job, const char* dir, int world, int rank, unsigned pace_us, uint64_t max_ops) {
  char path[4096], stop_path[4096];
  snprintf(path, sizeof(path), "%s/rank%d.csv", dir, rank);
  snprintf(stop_path, sizeof(stop_path), "%s/stop", dir);
  FILE* csv = fopen(path, "w");
  if (csv == NULL) {
    perror(path);
    return 1;
  }
  fprintf(csv, "op,handle,count,dtype,in_place,status,differ,done_ns\n");
  fflush(csv);
  dmagather_comm_t comm;
  if (dmagather_comm_init(NULL, job, world, rank, &comm) != DMAGATHER_OK) {
    fprintf(stderr, "rank %d: init: %s\n", rank, dmagather_last_error(NULL));
    return 1;
  }
  uint8_t* recv = NULL;
  uint8_t* send = NULL;
  if (dmagather_alloc(comm, (size_t)world * MAX_COUNT * 8, (void**)&recv) != DMAGATHER_OK ||
      dmagather_alloc(comm, (size_t)MAX_COUNT * 8, (void**)&send) != DMAGATHER_OK) {
    fprintf(stderr, "rank %d: alloc: %s\n", rank, dmagather_last_error(comm));
    return 1;
  }
  uint64_t op = 0, bad_ops = 0, compared = 0, differ_total = 0;
  int failed = 0;
  for (; op < read_stop(stop_path, max_ops) && op < max_ops; op++) {
    dmagather_dtype_t dt = (dmagather_dtype_t)(op / NCOUNTS % DMAGATHER_NUM_DTYPES);
    size_t count = kCounts[op % NCOUNTS], es = dmagather_dtype_size(dt), shard = count * es;
    int in_place = (int)(op / (NCOUNTS * DMAGATHER_NUM_DTYPES) % 2);
    memset(recv, 0xA5, (size_t)world * shard);
    uint8_t* in = in_place ? recv + (size_t)rank * shard : send;
    for (size_t i = 0; i < shard; i++) in[i] = pattern(rank, i, op);
    dmagather_op_t handle = 0;
    dmagather_status_t st = dmagather_allgather_async(comm, in, recv, count, dt, NULL, &handle);
    if (st == DMAGATHER_OK) st = dmagather_op_wait(comm, handle);
    uint64_t done = now_ns();
    size_t differ = 0;
    if (st == DMAGATHER_OK) {
      for (int r = 0; r < world; r++) {
        const uint8_t* out = recv + (size_t)r * shard;
        for (size_t i = 0; i < shard; i++) differ += out[i] != pattern(r, i, op);
      }
      compared += (uint64_t)world * shard;
    }
    fprintf(csv, "%llu,%llu,%zu,%s,%d,%s,%zu,%llu\n", (unsigned long long)op, (unsigned long long)handle, count,
            dmagather_dtype_name(dt), in_place, dmagather_status_string(st), differ, (unsigned long long)done);
    fflush(csv);
    differ_total += differ;
    if (st != DMAGATHER_OK || differ != 0 || handle != op + 1) bad_ops++;
    if (st != DMAGATHER_OK) {
      fprintf(stderr, "rank %d: op %llu: %s: %s\n", rank, (unsigned long long)op, dmagather_status_string(st),
              dmagather_last_error(comm));
      failed = 1;
      break;
    }
    if (pace_us > 0) usleep(pace_us);
  }
  fclose(csv);
  printf("rank %d: backend %s, %llu ops, %llu bytes compared, %llu differ, %llu bad ops\n", rank,
         dmagather_backend(comm), (unsigned long long)op, (unsigned long long)compared,
         (unsigned long long)differ_total, (unsigned long long)bad_ops);
  fflush(stdout);
  dmagather_free(comm, send);
  dmagather_free(comm, recv);
  dmagather_comm_destroy(comm);
  return failed || bad_ops != 0 ? 1 : 0;
}

int main(int argc, char** argv) {
  int world = argc > 2 ? atoi(argv[1]) : 0;
  if (world < 1 || world > 64) {
    fprintf(stderr, "usage: %s WORLD(1..64) DIR [PACE_US] [MAX_OPS]\n", argv[0]);
    return 2;
  }
  const char* dir = argv[2];
  unsigned pace_us = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 2000;
  uint64_t max_ops = argc > 4 ? strtoull(argv[4], NULL, 10) : 100000;
  printf("library %s, %d ranks, pace %u us, at most %llu ops\n", dmagather_version(), world, pace_us,
         (unsigned long long)max_ops);
  char job[64];
  snprintf(job, sizeof(job), "upgrade-%d", (int)getpid());
  fflush(stdout);
  for (int r = 0; r < world; r++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) _exit(run_rank(job, dir, world, r, pace_us, max_ops));
  }
  int failed = 0;
  for (int r = 0; r < world; r++) {
    int status = 0;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
  }
  printf("%s: %d ranks, %d failed\n", failed ? "FAILED" : "PASSED", world, failed);
  return failed ? 1 : 0;
}
