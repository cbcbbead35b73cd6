#include "server/cluster/job_id.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/random.h"
#include "common/status.h"

namespace dmagather::server::cluster {
namespace {
constexpr char kPrefix[] = "dmagather1";
}

std::string Proof(const std::string& key, const char* label, const std::string& a, const std::string& b) {
  const std::string msg = absl::StrCat(label, "|", a, "|", b);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

bool ProofEqual(const std::string& x, const std::string& y) {
  return x.size() == y.size() && !x.empty() && CRYPTO_memcmp(x.data(), y.data(), x.size()) == 0;
}

absl::StatusOr<JobId> ParseJobId(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits('/', 2));
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat("job id '", text.substr(0, 80), "' is not valid (", why,
                                                   "); make it with dmagather_job_id_create on one rank"));
  };
  if (parts.size() != 3 || parts[0] != kPrefix) return bad("expected dmagather1/<secret>/<address>");
  if (parts[1].size() != 32) return bad("the secret must be 32 hex digits");
  for (char c : parts[1]) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return bad("the secret must be 32 hex digits");
  }
  if (parts[2].empty()) return bad("no coordinator address");
  JobId id;
  id.secret = absl::HexStringToBytes(parts[1]);
  id.address = parts[2];
  id.tag = Proof(id.secret, "tag", "", "").substr(0, 16);
  return id;
}

absl::StatusOr<std::string> MakeJobId(const std::string& coordinator_address) {
  DMAG_ASSIGN_OR_RETURN(std::string secret, common::RandomBytes(16));
  return absl::StrCat(kPrefix, "/", absl::BytesToHexString(secret), "/", coordinator_address);
}

}  // namespace dmagather::server::cluster
