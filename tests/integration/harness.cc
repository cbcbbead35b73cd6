#include "tests/integration/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

namespace dmagather::testing {
namespace {

struct SharedReport {
  int status;
  double seconds;
  char message[2048];
};

int WaitWithTimeout(pid_t pid, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      // Where it hung, for the failure's reader (gdb, where the machine has it).
      if (access("/usr/bin/gdb", X_OK) == 0) {
        const std::string cmd = "timeout 60 /usr/bin/gdb -p " + std::to_string(pid) +
                                " -batch -nx -ex 'thread apply all bt' 2>&1 | grep -E '^(Thread|#)' | head -200 >&2";
        std::cerr << "process " << pid << " did not end within " << timeout_s << " s; its threads:\n";
        if (system(cmd.c_str()) != 0) std::cerr << "(gdb could not attach)\n";
      }
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

void Reporter::Say(const std::string& s) const { snprintf(message, 2048, "%s", s.c_str()); }

RankProcess::RankProcess(int rank, const std::function<int(int, const Reporter&)>& fn) {
  shared_ = mmap(nullptr, sizeof(SharedReport), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  auto* sh = static_cast<SharedReport*>(shared_);
  sh->status = -1;
  pid_ = fork();
  if (pid_ == 0) {
    Reporter rep{&sh->status, &sh->seconds, sh->message};
    std::cout.flush();
    _exit(fn(rank, rep));
  }
}

RankProcess::~RankProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  munmap(shared_, sizeof(SharedReport));
}

RankReport RankProcess::Reap(double timeout_s) {
  RankReport r;
  r.exit_code = WaitWithTimeout(pid_, timeout_s);
  pid_ = -1;
  auto* sh = static_cast<SharedReport*>(shared_);
  r.status = sh->status;
  r.seconds = sh->seconds;
  r.message = sh->message;
  return r;
}

std::vector<RankReport> RunRanks(int world, const std::function<int(int, const Reporter&)>& fn, double timeout_s) {
  std::vector<std::unique_ptr<RankProcess>> procs;
  for (int r = 0; r < world; ++r) procs.push_back(std::make_unique<RankProcess>(r, fn));
  std::vector<RankReport> out;
  for (auto& p : procs) out.push_back(p->Reap(timeout_s));
  return out;
}

std::string UniqueJob(const std::string& prefix) {
  static int n = 0;
  return prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

std::string RunProgram(const std::vector<std::string>& argv_in, int* exit_code) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return "";
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    std::vector<std::string> args = argv_in;
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

}  // namespace dmagather::testing
