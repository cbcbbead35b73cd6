// The flags of dmagatherd, one file per group of `dmagatherd --help` (absl
// prints the flags of each file under that file's name): service, limits,
// engines, cluster, diagnostics. main.cc reads them into DaemonOptions;
// docs/OPERATIONS.md "Knobs" has one row per flag (tools/check_knobs.sh).
#pragma once

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

// The service (server/flags/service.cc)
ABSL_DECLARE_FLAG(std::string, socket);
ABSL_DECLARE_FLAG(std::string, socket_mode);
ABSL_DECLARE_FLAG(int, fd_timeout_ms);
ABSL_DECLARE_FLAG(int, fd_ticket_ttl_ms);
ABSL_DECLARE_FLAG(double, op_timeout_s);
ABSL_DECLARE_FLAG(double, drain_timeout_s);
ABSL_DECLARE_FLAG(std::string, operator_group);

// Limits (server/flags/limits.cc)
ABSL_DECLARE_FLAG(int, max_connections);
ABSL_DECLARE_FLAG(int, max_connections_per_uid);
ABSL_DECLARE_FLAG(int, fd_max_connections_per_uid);
ABSL_DECLARE_FLAG(int, max_jobs_per_uid);
ABSL_DECLARE_FLAG(int, max_sessions_per_uid);
ABSL_DECLARE_FLAG(int, max_regions_per_uid);
ABSL_DECLARE_FLAG(int64_t, max_mapped_bytes_per_uid);

// Engines (server/flags/engines.cc)
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(int, workers);
ABSL_DECLARE_FLAG(int, chunk_kib);
ABSL_DECLARE_FLAG(int, streams);
ABSL_DECLARE_FLAG(bool, parallel_issue);
ABSL_DECLARE_FLAG(int, host_inline_kib);
ABSL_DECLARE_FLAG(int, stay_awake_us);
ABSL_DECLARE_FLAG(bool, cuda_batch);
ABSL_DECLARE_FLAG(bool, cuda_graphs);
ABSL_DECLARE_FLAG(int, cuda_graph_max_kib);
ABSL_DECLARE_FLAG(int, cuda_graph_sole_max_kib);
ABSL_DECLARE_FLAG(int, cuda_graph_per_shape);
ABSL_DECLARE_FLAG(bool, cuda_done_on_device);
ABSL_DECLARE_FLAG(std::string, hip_engines);
ABSL_DECLARE_FLAG(std::string, hip_skip_engines);
ABSL_DECLARE_FLAG(std::string, hip_lib);
ABSL_DECLARE_FLAG(std::string, hsa_lib);

// Cluster (server/flags/cluster.cc)
ABSL_DECLARE_FLAG(std::string, peer_listen);
ABSL_DECLARE_FLAG(std::string, peer_advertise);
ABSL_DECLARE_FLAG(std::string, transport);
ABSL_DECLARE_FLAG(int, peer_links);
ABSL_DECLARE_FLAG(int, ring_chunk_kib);
ABSL_DECLARE_FLAG(int, ring_transit_mib);
ABSL_DECLARE_FLAG(std::string, ring_staging);
ABSL_DECLARE_FLAG(int, peer_timeout_ms);
ABSL_DECLARE_FLAG(std::string, ib_device);
ABSL_DECLARE_FLAG(int, ib_gid_index);
ABSL_DECLARE_FLAG(int, ib_slots);
ABSL_DECLARE_FLAG(int64_t, ib_slot_bytes);

// Diagnostics (server/flags/diagnostics.cc)
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, metrics_listen);
