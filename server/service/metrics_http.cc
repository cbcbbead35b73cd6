#include "server/service/metrics_http.h"

#include <glog/logging.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dmagather::server::service {
namespace {

// The server's connection workers: a fixed set of threads taking accepted
// connections in turn (httplib's own pool waits on a std::condition_variable,
// whose libstdc++ symbol is newer than the wheel's manylinux tag admits).
class ScrapeWorkers : public httplib::TaskQueue {
 public:
  explicit ScrapeWorkers(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~ScrapeWorkers() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(fn));
  }
  void shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &ScrapeWorkers::HasWorkOrStop));
        if (tasks_.empty()) return;  // Stopped with nothing left.
        fn = std::move(tasks_.front());
        tasks_.pop_front();
      }
      fn();
    }
  }

  bool HasWorkOrStop() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); }

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace

struct MetricsHttpServer::Impl {
  httplib::Server server;
  std::thread thread;
};

bool SplitHostPort(const std::string& listen, std::string* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  std::string h = listen.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h.empty()) return false;
  int p;
  if (!absl::SimpleAtoi(listen.substr(colon + 1), &p) || p < 0 || p > 65535) return false;
  *host = h;
  *port = p;
  return true;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& listen,
                                                                            std::function<std::string()> render) {
  std::string host;
  int port;
  if (!SplitHostPort(listen, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen '", listen, "' is not HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464)"));
  }
  auto m = std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer());
  m->impl_ = std::make_unique<Impl>();
  httplib::Server& s = m->impl_->server;
  // Two threads, short timeouts: scrapes are rare and small.
  s.new_task_queue = [] { return new ScrapeWorkers(2); };
  s.set_read_timeout(2, 0);
  s.set_write_timeout(2, 0);
  s.set_keep_alive_timeout(2);
  s.set_keep_alive_max_count(16);
  s.set_payload_max_length(4096);
  s.Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("dmagatherd: Prometheus metrics at /metrics\n", "text/plain");
  });
  if (port == 0) {
    port = s.bind_to_any_port(host);
    if (port < 0) port = 0;
  } else if (!s.bind_to_port(host, port)) {
    port = 0;
  }
  if (port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, " for /metrics (address in use, or ",
                                               "not an address of this host)"));
  }
  m->port_ = port;
  m->address_ = absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port);
  Impl* impl = m->impl_.get();
  impl->thread = std::thread([impl] { impl->server.listen_after_bind(); });
  // stop() before the loop runs would be lost: wait until it does.
  for (int i = 0; i < 2000 && !impl->server.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return m;
}

void MetricsHttpServer::Stop() {
  if (impl_ == nullptr) return;
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_.reset();
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

}  // namespace dmagather::server::service
