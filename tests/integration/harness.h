// Integration-test harness: a real dmagatherd process on a private socket
// (DaemonProcess, daemon_process.h), and real rank processes (fork) that
// report back through shared memory.
// The test process itself never touches gRPC (only its children do), so
// forking is safe.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/daemon_process.h"

namespace dmagather::testing {

struct RankReport {
  int exit_code = -1;  // Child exit status (128+signal when killed).
  int status = -1;     // A dmagather_status_t the rank chose to report.
  double seconds = 0;  // A duration the rank chose to report.
  std::string message;
};

// What a rank function can report.
struct Reporter {
  int* status;
  double* seconds;
  char* message;
  void Say(const std::string& s) const;
};

// Runs fn(rank, reporter) in `world` forked processes, waits for all (each
// is killed after timeout_s), and returns their reports. fn's return value
// is the child's exit code (0 = pass).
std::vector<RankReport> RunRanks(int world, const std::function<int(int rank, const Reporter&)>& fn,
                                 double timeout_s = 120);

// Forks one rank without waiting; Reap() returns its report.
class RankProcess {
 public:
  RankProcess(int rank, const std::function<int(int rank, const Reporter&)>& fn);
  ~RankProcess();
  pid_t pid() const { return pid_; }
  RankReport Reap(double timeout_s = 60);

 private:
  pid_t pid_ = -1;
  void* shared_ = nullptr;
};

// A fresh job key per call.
std::string UniqueJob(const std::string& prefix);

// Runs a program from the runfiles (e.g. "tools/dmagatherctl") and returns
// its stdout; *exit_code gets its exit status.
std::string RunProgram(const std::vector<std::string>& argv, int* exit_code);

}  // namespace dmagather::testing
