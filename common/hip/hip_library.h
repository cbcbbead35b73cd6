// Which libamdhip64 file a process opens, when the process says so itself:
// dmagatherd names it with its --hip_lib flag (server/main.cc, before any
// HIP call), so that its settings come from flags alone. Where nobody set
// it, HipLibraryCandidates (hip_api.h) reads DMAGATHER_HIP_LIB, as the
// client library does in a rank. Built with and without HIP.
//
// Threads: SetHipLibrary before the first HIP call; both functions from
// any thread.
#pragma once

#include <optional>
#include <string>

namespace dmagather::common::hip {

// `file`: that file alone; "": the sonames, newest first. Either way the
// environment is no longer read.
void SetHipLibrary(const std::string& file);

// What SetHipLibrary set; nullopt where it was never called.
std::optional<std::string> HipLibrarySet();

}  // namespace dmagather::common::hip
