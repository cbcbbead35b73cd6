#include "server/service/session.h"

#include <sys/stat.h>

#include "abi/descriptor_v2.h"
#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/random.h"
#include "common/status.h"

namespace dmagather::server::service {
absl::StatusOr<std::shared_ptr<Session>> Session::Open(uint64_t id, const JoinSpec& req, const Handover& segment,
                                                       engines::CopyEngine* engine) {
  // Only ever the memory this caller handed over: messages may describe it.
  DMAG_ASSIGN_OR_RETURN(common::MemfdMapping m,
                        common::MemfdMapping::Map(segment.fd.get(), abi::SegmentLayoutV1::kBytes));
  abi::SegmentViewV1 v = abi::SegmentViewV1::At(m.data());
  const abi::SegmentHeaderV1& h = *v.header;
  if (h.magic != abi::kMagic || h.stamp != abi::kSegmentStampV1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the rank segment is not a v1 dmagather segment (stamp 0x%08x, expected 0x%08x): client and "
                        "daemon versions differ",
                        h.stamp, abi::kSegmentStampV1));
  }
  if (h.token != req.segment_token) {
    return absl::PermissionDeniedError("the rank segment's token does not match the join request");
  }
  if (h.ring_slots != abi::kRingSlotsV1 ||
      (h.descriptor_stamp != abi::kDescriptorStampV2 && h.descriptor_stamp != abi::kDescriptorStampV1) ||
      h.completion_stamp != abi::kCompletionStampV1 || h.segment_bytes != abi::SegmentLayoutV1::kBytes ||
      h.completion_offset != abi::SegmentLayoutV1::kCompletionOffset ||
      h.ring_offset != abi::SegmentLayoutV1::kRingOffset ||
      h.descriptors_offset != abi::SegmentLayoutV1::kDescriptorsOffset) {
    return absl::InvalidArgumentError("the rank segment has an unexpected v1 layout");
  }
  DMAG_ASSIGN_OR_RETURN(std::string secret, common::RandomBytes(16));
  auto s = std::shared_ptr<Session>(new Session(id, std::move(secret), segment.uid, segment.pid, std::move(m)));
  struct stat st;
  if (fstat(segment.fd.get(), &st) != 0) return common::ErrnoStatus("fstat of the rank segment");
  s->segment_dev_ = st.st_dev;
  s->segment_ino_ = st.st_ino;
  s->abi_version_ = h.descriptor_stamp == abi::kDescriptorStampV2 ? 2 : 1;
  s->device_ = req.device;
  v = abi::SegmentViewV1::At(s->segment_.data());
  if (req.resume) {
    // A rank of a job taken back: its done flag, error records and ring
    // carry on from the earlier daemon; the ring's span must be sane.
    const uint64_t head = abi::LoadAcquire(&v.ring->head), tail = abi::LoadAcquire(&v.ring->tail);
    if (tail - head > abi::kRingSlotsV1) {
      return absl::InvalidArgumentError(
          absl::StrCat("the rank segment's ring is corrupt (head ", head, ", tail ", tail, "): cannot take it over"));
    }
  } else {
    // Whatever the client left there, the daemon starts the protocol clean.
    abi::StoreRelease(&v.completion->done_seq, 0u);
    abi::StoreRelease(&v.completion->error_count, 0u);
  }
  abi::StoreRelease(&v.completion->daemon_state, static_cast<uint32_t>(abi::kDaemonServing));
  engines::RankAttach attach;
  attach.rank = req.rank;
  attach.device = s->device_;
  attach.flag_pages = v.completion;
  attach.flag_bytes = abi::SegmentLayoutV1::kRingOffset - abi::SegmentLayoutV1::kCompletionOffset;
  attach.ready_word = &v.completion->ready_seq;
  attach.done_word = &v.completion->done_seq;
  auto engine_rank = engine->AttachRank(attach);
  if (!engine_rank.ok()) {
    return common::Annotate(engine_rank.status(), absl::StrCat("rank ", req.rank, ": "));
  }
  s->rank_ = std::make_shared<scheduler::Rank>(req.rank, s->pid_, s->uid_, v.completion, *std::move(engine_rank));
  s->input_ = std::make_shared<ingress::RankInput>(s->rank_, v, req.resume);
  s->resume_ = req.resume;
  return s;
}

Session::Session(uint64_t id, std::string secret, uid_t uid, pid_t pid, common::MemfdMapping segment)
    : id_(id), secret_(std::move(secret)), uid_(uid), pid_(pid), segment_(std::move(segment)) {}

Session::~Session() { ReleaseMemory(); }

bool Session::SecretMatches(const std::string& presented) const {
  if (presented.size() != secret_.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < secret_.size(); ++i) diff |= static_cast<unsigned char>(presented[i] ^ secret_[i]);
  return diff == 0;
}

void Session::ReleaseMemory() {
  if (released_.exchange(true)) return;
  if (rank_ != nullptr) rank_->Release();  // Engine detach (cuda: cudaHostUnregister) before the unmap.
  if (input_ != nullptr) input_->regions.Clear();
  segment_ = common::MemfdMapping();
}

}  // namespace dmagather::server::service
