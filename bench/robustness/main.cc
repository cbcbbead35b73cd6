// The robustness driver's main: the runs named by --runs, in order, against
// one daemon (restart kills and restarts its own), then the table.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "bench/robustness/robustness.h"

using dmagather::bench::robustness::Daemon;
using dmagather::bench::robustness::DirEntries;
using dmagather::bench::robustness::g_rows;
using dmagather::bench::robustness::Join;
using dmagather::bench::robustness::MonotonicNs;
using dmagather::bench::robustness::PrintTable;
using dmagather::bench::robustness::Row;
using dmagather::bench::robustness::RunKill;
using dmagather::bench::robustness::RunMutate;
using dmagather::bench::robustness::RunRestart;
using dmagather::bench::robustness::RunSoak;
using dmagather::bench::robustness::Seconds;

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "robustness --dmagatherd=PATH --dmagatherctl=PATH [--runs=mutate,kill,restart,soak]: the robustness table");
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  std::string base = absl::GetFlag(FLAGS_dir);
  if (base.empty()) {
    char tmpl[] = "/tmp/dmagather-robust-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return perror("mkdtemp"), 2;
    base = tmpl;
  }
  const std::vector<std::string> runs = absl::StrSplit(absl::GetFlag(FLAGS_runs), ',', absl::SkipEmpty());
  const uint64_t t0 = MonotonicNs();
  // mutate, kill and soak share one daemon (it must survive all of them);
  // restart kills its own.
  std::unique_ptr<Daemon> shared;
  int daemon_failures = 0;
  for (const std::string& run : runs) {
    if (run == "restart") {
      RunRestart(base);
      continue;
    }
    if (run != "mutate" && run != "kill" && run != "soak") {
      fprintf(stderr, "unknown run %s\n", run.c_str());
      return 2;
    }
    if (shared == nullptr || !shared->Alive()) {
      if (shared != nullptr) ++daemon_failures;
      const std::string dir = base + "/shared";
      mkdir(dir.c_str(), 0700);
      shared = std::make_unique<Daemon>(dir, std::vector<std::string>{});
      if (!shared->Start()) return 2;
      printf("dmagatherd pid %d on %s (--backend=host, --op_timeout_s=%d)\n", shared->pid(), shared->socket().c_str(),
             absl::GetFlag(FLAGS_op_timeout_s));
    }
    if (run == "mutate") RunMutate(*shared);
    if (run == "kill") RunKill(*shared);
    if (run == "soak") RunSoak(*shared);
  }
  bool all_ok = daemon_failures == 0;
  if (shared != nullptr) {
    all_ok = all_ok && shared->Alive();
    const int st = shared->Stop(SIGTERM);
    printf("\nshared daemon: SIGTERM -> exit %d; socket dir after: %s\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
           Join(DirEntries(base + "/shared")).c_str());
  }
  PrintTable();
  for (const Row& r : g_rows) all_ok = all_ok && r.ok;
  printf("\n%s in %.0f s\n", all_ok ? "NOTHING LOST" : "SOMETHING WAS LOST", Seconds(t0, MonotonicNs()));
  if (all_ok) {
    std::string cmd = "rm -rf '" + base + "'";
    if (system(cmd.c_str()) != 0) {
    }
  } else {
    printf("kept %s (daemon logs)\n", base.c_str());
  }
  return all_ok ? 0 : 1;
}
