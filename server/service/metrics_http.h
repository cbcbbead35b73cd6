// MetricsHttpServer: the Prometheus scrape endpoint (`--metrics_listen`,
// GET /metrics), serving the same text as `dmagatherctl metrics`
// (metrics.h renders both). Debian's cpp-httplib, two threads; it never
// touches the data path: a slow or hostile HTTP client delays only scrapes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace dmagather::server::service {

class MetricsHttpServer {
 public:
  // `listen`: "HOST:PORT" ("127.0.0.1:9464", "[::1]:9464"; PORT 0 = any
  // free port). `render` returns the exposition text (called on the
  // server's threads). Returns once the socket is bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& listen,
                                                                  std::function<std::string()> render);
  ~MetricsHttpServer();  // Stops.

  void Stop();
  // The bound address, "HOST:PORT" (PORT resolved when 0 was asked for).
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  struct Impl;
  MetricsHttpServer() = default;
  std::unique_ptr<Impl> impl_;
  std::string address_;
  int port_ = 0;
};

// Splits "HOST:PORT" / "[V6]:PORT"; false when malformed.
bool SplitHostPort(const std::string& listen, std::string* host, int* port);

}  // namespace dmagather::server::service
