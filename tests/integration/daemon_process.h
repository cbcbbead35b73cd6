// DaemonProcess: a real dmagatherd in a child process on a private socket,
// started and stopped by the integration tests (harness.h) and by
// bench/robustness. Start forks and execs the daemon (stderr into
// <dir>/dmagatherd.log) and waits until its socket accepts connections.
//
// Threads: the owning thread only. The process that calls Start must be
// safe to fork (no gRPC in it).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace dmagather::testing {

struct DaemonStart {
  // The daemon binary (the tests' default: their runfiles' server/dmagatherd).
  std::string binary = "server/dmagatherd";
  // After --socket=<dir>/dmagatherd.sock --backend=host --log_level=warning
  // --metrics_listen= (no HTTP metrics unless asked: tests run in parallel).
  std::vector<std::string> flags;
  // The socket's directory (empty: a fresh private one); a daemon started
  // again in the same dir uses the same socket path.
  std::string dir;
  double listen_timeout_s = 5;
};

class DaemonProcess {
 public:
  // nullptr (and a message on stderr) when the daemon exits at start or
  // does not listen within listen_timeout_s (a directory the caller gave
  // is then left as it is, with the daemon's log).
  static std::unique_ptr<DaemonProcess> StartWith(const DaemonStart& start);
  static std::unique_ptr<DaemonProcess> Start(const std::vector<std::string>& flags = {}, const std::string& dir = "");
  // Stops a running daemon (SIGTERM); removes the directory unless KeepDir.
  // With DMAGATHER_SANITIZER set, a non-zero exit at SIGTERM (an ASan/LSan
  // report) aborts with the daemon's log.
  ~DaemonProcess();

  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }
  // Sends `sig` and reaps the process; returns its exit status (waitpid
  // form). Not running: the status it was reaped with before (-1: none).
  int Stop(int sig);
  bool running() const { return pid_ > 0; }
  // Not exited (reaps it if it has: running() is false from then on).
  bool Alive();
  // Keeps the directory when this object goes (another daemon uses it next).
  void KeepDir() { keep_dir_ = true; }

 private:
  std::string dir_, socket_;
  pid_t pid_ = -1;
  int exit_status_ = -1;
  bool keep_dir_ = false;
};

// Whether a Unix socket at `path` accepts a connection.
bool CanConnect(const std::string& path);

}  // namespace dmagather::testing
