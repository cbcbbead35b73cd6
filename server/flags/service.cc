// dmagatherd --help, group "service": where ranks and tools reach the daemon,
// who may, and how long it waits for them. Declared in server/flags/flags.h;
// read by server/main.cc.
#include "absl/flags/flag.h"
#include "server/flags/flags.h"

ABSL_FLAG(std::string, socket, "/run/dmagather/dmagatherd.sock",
          "Unix socket of the gRPC control plane. Clients find it through DMAGATHER_SOCKET or this default.");
ABSL_FLAG(std::string, socket_mode, "0666",
          "Permissions of the socket and of the fd channel <socket>.fd (octal). 0666: every local user may run ranks "
          "(jobs, limits and telemetry are per uid, which comes from the kernel); 0660: only the socket's group.");
ABSL_FLAG(int, fd_timeout_ms, 2000,
          "The fd channel (<socket>.fd): a connection that has not sent its one request within this many ms is "
          "closed.");
ABSL_FLAG(int, fd_ticket_ttl_ms, 5000,
          "A descriptor handed over on the fd channel must be claimed by its Join/Register within this many ms.");
ABSL_FLAG(double, op_timeout_s, 60.0,
          "An AllGather whose ranks have not all submitted it within this many seconds fails with TIMEOUT on the "
          "ranks that did, and stops the job.");
ABSL_FLAG(double, drain_timeout_s, 10.0, "On SIGTERM, how long in-flight operations may take to finish.");
ABSL_FLAG(std::string, operator_group, "",
          "Members of this group see every job in Telemetry.Stats/Metrics (dmagatherctl); others see their own "
          "uid's jobs. Empty: only root sees all.");
