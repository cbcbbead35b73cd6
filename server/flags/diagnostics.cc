// dmagatherd --help, group "diagnostics": the log and the Prometheus endpoint.
// Declared in server/flags/flags.h; read by server/main.cc.
#include "absl/flags/flag.h"
#include "server/flags/flags.h"

ABSL_FLAG(std::string, log_level, "info", "Least severe messages logged: info, warning or error.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus endpoint: GET /metrics over HTTP on HOST:PORT ([::1]:9464 for IPv6, port 0 = any free "
          "port); empty = none. Every job's counters: keep it on loopback or a network only operators reach.");
