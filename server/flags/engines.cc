// dmagatherd --help, group "engines": which copy backend moves the bytes, and
// how its work is cut and issued. Declared in server/flags/flags.h; read by
// server/main.cc.
#include "absl/flags/flag.h"
#include "server/flags/flags.h"

ABSL_FLAG(std::string, backend, "auto",
          "Copy backend: host (worker threads over shared memory), cuda (copy engines), hip (SDMA), or auto "
          "(hip, then cuda, then host: the first that starts; the choice and its reason are logged).");
ABSL_FLAG(int, workers, 4, "Host backend: copy worker threads.");
ABSL_FLAG(int, chunk_kib, 0,
          "Copies are cut into chunks of this many KiB so every worker (host) or stream (cuda) shares a large op. "
          "0: the backend's default (host 1024, cuda 32768, hip 65536; cuda caps it at 65536, hip at 131072).");
ABSL_FLAG(int, streams, 0,
          "GPU backends (cuda, hip): copy streams per device; 0 = max(4, devices - 1), so that a device pulls from "
          "every peer at once.");
ABSL_FLAG(bool, parallel_issue, true,
          "GPU backends with several devices: each device's copies are issued by its own thread (false: one thread "
          "issues every device in turn).");
ABSL_FLAG(int, host_inline_kib, 256,
          "Host backend: ops whose copies total at most this many KiB are copied on the ingress thread "
          "(no worker wake-up); 0 = always hand them to the workers.");
ABSL_FLAG(int, stay_awake_us, -1,
          "While a job is active, the threads on an op's path (ingress; the GPU engine's issuing, gate and "
          "completion threads) keep polling this long after their last work instead of sleeping, so an op after "
          "a gap costs no wake-up; each such thread holds a core meanwhile (yielding it to anything runnable). "
          "-1: the backend's default (cuda, hip 10000; host 0, which polls briefly and sleeps); 0: sleep "
          "after a short spin.");
