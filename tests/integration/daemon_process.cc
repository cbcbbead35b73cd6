// DaemonProcess: see daemon_process.h.
#include "tests/integration/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

namespace dmagather::testing {

bool CanConnect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

std::unique_ptr<DaemonProcess> DaemonProcess::Start(const std::vector<std::string>& flags, const std::string& dir) {
  DaemonStart s;
  s.flags = flags;
  s.dir = dir;
  return StartWith(s);
}

std::unique_ptr<DaemonProcess> DaemonProcess::StartWith(const DaemonStart& start) {
  char tmpl[] = "/tmp/dmagather-test-XXXXXX";
  if (start.dir.empty() && mkdtemp(tmpl) == nullptr) {
    perror("mkdtemp");
    return nullptr;
  }
  auto d = std::unique_ptr<DaemonProcess>(new DaemonProcess());
  d->dir_ = start.dir.empty() ? std::string(tmpl) : start.dir;
  d->socket_ = d->dir_ + "/dmagatherd.sock";
  std::vector<std::string> args = {start.binary, "--socket=" + d->socket_, "--backend=host", "--log_level=warning",
                                   "--metrics_listen="};
  args.insert(args.end(), start.flags.begin(), start.flags.end());
  const std::string log = d->dir_ + "/dmagatherd.log";
  fflush(stdout);
  fflush(stderr);
  d->pid_ = fork();
  if (d->pid_ == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    perror(("execv " + start.binary).c_str());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(start.listen_timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (CanConnect(d->socket_)) return d;
    int status;
    if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
      std::cerr << "dmagatherd exited at start; log in " << log << "\n";
      d->pid_ = -1;
      if (!start.dir.empty()) d->KeepDir();
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::cerr << "dmagatherd did not listen within " << start.listen_timeout_s << " s; log in " << log << "\n";
  if (!start.dir.empty()) d->KeepDir();
  return nullptr;
}

int DaemonProcess::Stop(int sig) {
  if (pid_ <= 0) return exit_status_;
  kill(pid_, sig);
  waitpid(pid_, &exit_status_, 0);
  pid_ = -1;
  return exit_status_;
}

bool DaemonProcess::Alive() {
  if (pid_ <= 0) return false;
  if (waitpid(pid_, &exit_status_, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return kill(pid_, 0) == 0;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    const int status = Stop(SIGTERM);
    // Under tools/test_asan.sh a daemon that found a memory error or a leak
    // reports it at exit (non-zero status): fail the test with the report.
    if (getenv("DMAGATHER_SANITIZER") != nullptr && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      fprintf(stderr, "dmagatherd (%s) exited with status 0x%x after SIGTERM; its log:\n", socket_.c_str(), status);
      const std::string cat = "tail -n 60 '" + dir_ + "/dmagatherd.log' >&2";
      if (system(cat.c_str()) != 0) {
      }
      abort();
    }
  }
  if (keep_dir_) return;
  std::string cmd = "rm -rf '" + dir_ + "'";
  if (system(cmd.c_str()) != 0) {
  }
}

}  // namespace dmagather::testing
