/* A program built outside the tree against the installed packages only:
 *   cc allgather_check.c $(pkg-config --cflags --libs dmagather)
 * Forks WORLD rank processes that join one job on the node's dmagatherd (the
 * default socket, or $DMAGATHER_SOCKET), gather every dtype at several sizes,
 * in place and out of place, and compare every byte of every output with what
 * each rank wrote. Prints one line per rank and exits 0 only when every rank
 * saw every op bit-exact.
 *
 *   allgather_check [WORLD (default 4)] [EXPECTED_VERSION]
 */
#include <dmagather/dmagather.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The byte rank `r` writes at byte `i` of its shard for op `op`. */
static uint8_t pattern(int r, size_t i, int op) {
  uint32_t x = (uint32_t)(r + 1) * 2654435761u ^ (uint32_t)i * 40503u ^ (uint32_t)op * 97u;
  x ^= x >> 13;
  return (uint8_t)(x * 0x5bd1e995u >> 24);
}

static int run_rank(const char* job, int world, int rank) {
  dmagather_comm_t comm;
  if (dmagather_comm_init(NULL, job, world, rank, &comm) != DMAGATHER_OK) {
    fprintf(stderr, "rank %d: init: %s\n", rank, dmagather_last_error(NULL));
    return 1;
  }
  static const size_t counts[] = {1, 1000, 65537, 1 << 20};
  int op = 0;
  size_t compared = 0, bad = 0;
  for (int dt = 0; dt < DMAGATHER_NUM_DTYPES; dt++) {
    size_t es = dmagather_dtype_size((dmagather_dtype_t)dt);
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
      for (int in_place = 0; in_place < 2; in_place++, op++) {
        size_t count = counts[c], shard = count * es;
        uint8_t* recv = NULL;
        uint8_t* send = NULL;
        if (dmagather_alloc(comm, world * shard, (void**)&recv) != DMAGATHER_OK ||
            (!in_place && dmagather_alloc(comm, shard, (void**)&send) != DMAGATHER_OK)) {
          fprintf(stderr, "rank %d: alloc: %s\n", rank, dmagather_last_error(comm));
          return 1;
        }
        memset(recv, 0xA5, world * shard);
        if (in_place) send = recv + rank * shard;
        for (size_t i = 0; i < shard; i++) send[i] = pattern(rank, i, op);
        dmagather_status_t st = dmagather_allgather(comm, send, recv, count, (dmagather_dtype_t)dt, NULL);
        if (st == DMAGATHER_OK) st = dmagather_wait(comm);
        if (st != DMAGATHER_OK) {
          fprintf(stderr, "rank %d: allgather %s count %zu: %s: %s\n", rank, dmagather_dtype_name(dt), count,
                  dmagather_status_string(st), dmagather_last_error(comm));
          return 1;
        }
        for (int r = 0; r < world; r++) {
          for (size_t i = 0; i < shard; i++) {
            if (recv[r * shard + i] != pattern(r, i, op)) bad++;
          }
        }
        compared += world * shard;
        if (!in_place) dmagather_free(comm, send);
        dmagather_free(comm, recv);
      }
    }
  }
  printf("rank %d: backend %s, %d ops, %zu bytes compared, %zu differ\n", rank, dmagather_backend(comm), op, compared,
         bad);
  fflush(stdout);
  dmagather_comm_destroy(comm);
  return bad == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  int world = argc > 1 ? atoi(argv[1]) : 4;
  if (world < 1 || world > 64) {
    fprintf(stderr, "usage: %s [WORLD 1..64] [EXPECTED_VERSION]\n", argv[0]);
    return 2;
  }
  printf("library %s (header %s)\n", dmagather_version(), DMAGATHER_VERSION_STRING);
  if (argc > 2 && strcmp(argv[2], dmagather_version()) != 0) {
    fprintf(stderr, "library version %s, expected %s\n", dmagather_version(), argv[2]);
    return 1;
  }
  char job[64];
  snprintf(job, sizeof(job), "pkgcheck-%d", (int)getpid());
  fflush(stdout);
  for (int r = 0; r < world; r++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) _exit(run_rank(job, world, r));
  }
  int failed = 0;
  for (int r = 0; r < world; r++) {
    int status = 0;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
  }
  printf("%s: %d ranks, %d failed\n", failed ? "FAILED" : "PASSED", world, failed);
  return failed ? 1 : 0;
}
