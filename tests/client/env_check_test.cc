// env_check: the edit distance, which DMAGATHER_* names in an environment
// count as likely typos (and which are left alone), the warning's words,
// and that the process warns once.
#include "client/env_check.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace dmagather::client {
namespace {

// A NULL-terminated environment, as `environ`.
class Env {
 public:
  explicit Env(std::vector<std::string> entries) : entries_(std::move(entries)) {
    for (const std::string& e : entries_) ptrs_.push_back(e.c_str());
    ptrs_.push_back(nullptr);
  }
  const char* const* get() const { return ptrs_.data(); }

 private:
  std::vector<std::string> entries_;
  std::vector<const char*> ptrs_;
};

std::string ReadAll(std::FILE* f) {
  std::rewind(f);
  std::string out;
  char buf[512];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  return out;
}

TEST(EnvCheckTest, EditDistance) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("SPIN", "SPIN"), 0u);
  EXPECT_EQ(EditDistance("SPINS", "SPIN"), 1u);      // Insertion.
  EXPECT_EQ(EditDistance("SOKET", "SOCKET"), 1u);    // Deletion.
  EXPECT_EQ(EditDistance("YEILDS", "YIELDS"), 2u);   // Transposition = 2 substitutions.
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);  // The textbook case.
  EXPECT_EQ(EditDistance("JOIN_TIMEOUT", "JOIN_TIMEOUT_MS"), 3u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
}

TEST(EnvCheckTest, KnownNamesAreUniqueAndPrefixed) {
  std::vector<std::string> seen;
  for (std::string_view k : kKnownVariables) {
    EXPECT_EQ(k.substr(0, 10), "DMAGATHER_") << k;
    for (const std::string& s : seen) EXPECT_NE(s, k);
    seen.emplace_back(k);
  }
  EXPECT_EQ(seen.size(), 19u);
}

TEST(EnvCheckTest, TyposNameTheClosestKnownVariable) {
  Env env({"PATH=/usr/bin", "DMAGATHER_SPINS=0", "DMAGATHER_SOCKET=/tmp/s", "DMAGATHER_JOIN_TIMEOUT=5000",
           "DMAGATHER_CUDA_BATH=0", "DMAGATHER_SOKET=/s", "HOME=/root", "DMAGATHER_STATS_FLE=8"});
  const std::vector<UnknownVariable> typos = LikelyTypos(env.get());
  ASSERT_EQ(typos.size(), 5u);
  EXPECT_EQ(typos[0].name, "DMAGATHER_SPINS");
  EXPECT_EQ(typos[0].closest, "DMAGATHER_SPIN");
  EXPECT_EQ(typos[0].distance, 1u);
  EXPECT_EQ(typos[1].name, "DMAGATHER_JOIN_TIMEOUT");
  EXPECT_EQ(typos[1].closest, "DMAGATHER_JOIN_TIMEOUT_MS");
  EXPECT_EQ(typos[1].distance, 3u);
  EXPECT_EQ(typos[2].closest, "DMAGATHER_CUDA_BATCH");
  EXPECT_EQ(typos[3].closest, "DMAGATHER_SOCKET");
  EXPECT_EQ(typos[3].distance, 1u);
  EXPECT_EQ(typos[4].closest, "DMAGATHER_STATS_FILE");

  EXPECT_EQ(TyposWarning({typos[0]}),
            "dmagather: warning: DMAGATHER_SPINS is set, but dmagather reads no such variable; did you mean "
            "DMAGATHER_SPIN? (docs/OPERATIONS.md \"Knobs\" lists them all)\n");
}

TEST(EnvCheckTest, KnownAndFarNamesAreLeftAlone) {
  std::vector<std::string> entries;
  for (std::string_view k : kKnownVariables) entries.push_back(std::string(k) + "=1");
  // The project's scripts' own variables, far from every knob; a name
  // without a value; the prefix alone; other programs' variables.
  for (const char* e : {"DMAGATHER_KEEP_LOGS=1", "DMAGATHER_VENV=/v", "DMAGATHER_BIN=/b", "DMAGATHER_PY=python3",
                        "DMAGATHER_DEBS=/d", "DMAGATHER_RUN_TIMEOUT_S=60", "DMAGATHER_TEST_SOCKETS=a,b",
                        "DMAGATHER_FAKE_HIP_VERSION=6", "DMAGATHER_", "NCCL_DEBUG=INFO", "XDMAGATHER_SPINS=1"}) {
    entries.push_back(e);
  }
  Env env(entries);
  const std::vector<UnknownVariable> typos = LikelyTypos(env.get());
  for (const UnknownVariable& u : typos) ADD_FAILURE() << u.name << " taken for " << u.closest;
  EXPECT_TRUE(LikelyTypos(nullptr).empty());
}

TEST(EnvCheckTest, WarnsOncePerProcess) {
  Env env({"DMAGATHER_SOCKETS=/tmp/x", "DMAGATHER_SPIN=0"});
  std::FILE* first = std::tmpfile();
  std::FILE* second = std::tmpfile();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(WarnUnknownVariablesOnce(env.get(), first), 1u);
  EXPECT_EQ(WarnUnknownVariablesOnce(env.get(), second), 0u);
  EXPECT_EQ(ReadAll(first),
            "dmagather: warning: DMAGATHER_SOCKETS is set, but dmagather reads no such variable; did you mean "
            "DMAGATHER_SOCKET? (docs/OPERATIONS.md \"Knobs\" lists them all)\n");
  EXPECT_EQ(ReadAll(second), "");
  std::fclose(first);
  std::fclose(second);
}

}  // namespace
}  // namespace dmagather::client
