// The libamdhip64 file a process names itself (common/hip/hip_library.h,
// dmagatherd's --hip_lib): once named, HipLibraryCandidates no longer reads
// DMAGATHER_HIP_LIB. Its own binary: the choice is process-wide.
#include "common/hip/hip_library.h"

#include <stdlib.h>

#include <string>
#include <vector>

#include "common/hip/hip_api.h"
#include "gtest/gtest.h"

namespace dmagather::common::hip {
namespace {

const std::vector<std::string> kSonames = {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"};

TEST(HipLibrary, TheProcessChoiceWinsOverTheEnvironment) {
  setenv("DMAGATHER_HIP_LIB", "/from/env/libamdhip64.so.6", 1);
  EXPECT_FALSE(HipLibrarySet().has_value());
  EXPECT_EQ(HipLibraryCandidates(), (std::vector<std::string>{"/from/env/libamdhip64.so.6"}));

  SetHipLibrary("/opt/rocm-7.1.0/lib/libamdhip64.so.7");  // --hip_lib=FILE
  EXPECT_EQ(HipLibrarySet(), std::optional<std::string>("/opt/rocm-7.1.0/lib/libamdhip64.so.7"));
  EXPECT_EQ(HipLibraryCandidates(), (std::vector<std::string>{"/opt/rocm-7.1.0/lib/libamdhip64.so.7"}));

  SetHipLibrary("");  // --hip_lib= (the default): the sonames, whatever the environment says.
  EXPECT_EQ(HipLibraryCandidates(), kSonames);
  unsetenv("DMAGATHER_HIP_LIB");
  EXPECT_EQ(HipLibraryCandidates(), kSonames);
}

}  // namespace
}  // namespace dmagather::common::hip
