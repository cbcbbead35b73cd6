#include "client/env_check.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>

namespace dmagather::client {
namespace {

constexpr std::string_view kPrefix = "DMAGATHER_";

bool IsKnown(std::string_view name) {
  return std::find(std::begin(kKnownVariables), std::end(kKnownVariables), name) != std::end(kKnownVariables);
}

}  // namespace

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({above + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<UnknownVariable> LikelyTypos(const char* const* env) {
  std::vector<UnknownVariable> out;
  for (; env != nullptr && *env != nullptr; ++env) {
    std::string_view entry = *env;
    const std::string_view name = entry.substr(0, entry.find('='));
    if (name.substr(0, kPrefix.size()) != kPrefix || IsKnown(name)) continue;
    UnknownVariable u{std::string(name), "", std::string_view::npos};
    for (std::string_view known : kKnownVariables) {
      const size_t d = EditDistance(name.substr(kPrefix.size()), known.substr(kPrefix.size()));
      if (d < u.distance) {
        u.distance = d;
        u.closest = std::string(known);
      }
    }
    const size_t suffix = name.size() - kPrefix.size();
    if (u.distance <= 3 && 3 * u.distance <= suffix) out.push_back(std::move(u));
  }
  return out;
}

std::string TyposWarning(const std::vector<UnknownVariable>& typos) {
  std::string out;
  for (const UnknownVariable& u : typos) {
    out += "dmagather: warning: " + u.name + " is set, but dmagather reads no such variable; did you mean " +
           u.closest + "? (docs/OPERATIONS.md \"Knobs\" lists them all)\n";
  }
  return out;
}

size_t WarnUnknownVariablesOnce(const char* const* env, std::FILE* out) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return 0;
  const std::vector<UnknownVariable> typos = LikelyTypos(env);
  if (!typos.empty()) {
    const std::string text = TyposWarning(typos);
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
  }
  return typos.size();
}

}  // namespace dmagather::client
