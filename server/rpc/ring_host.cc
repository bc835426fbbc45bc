#include "server/rpc/ring_host.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/ring_wire.h"
#include "server/rpc/log_safe.h"
#include "server/rpc/reply_wire.h"
#include "spdlog/spdlog.h"

namespace indexer {
namespace {

namespace rw = ring_wire;
using Clock = std::chrono::steady_clock;

using rw::CpuRelax;
using rw::FutexWait;
using rw::FutexWake;

bool PowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

// One attached ring and its worker.
class RingHost::Ring {
 public:
  Ring(uint64_t id, const StepServices& services, std::string client, std::string owner,
       std::string peer, uint64_t region, uint64_t offset, PinnedRegion pin, uint32_t slots,
       uint32_t slot_bytes, uint32_t spin_us, std::chrono::milliseconds step_idle)
      : id_(id),
        services_(services),
        owner_(owner),
        region_(region),
        offset_(offset),
        slots_(slots),
        slot_bytes_(slot_bytes),
        spin_(std::chrono::microseconds(spin_us)),
        step_idle_(step_idle),
        pin_(std::move(pin)),
        base_(pin_.data),
        header_(reinterpret_cast<rw::RingHeader*>(pin_.data)),
        session_(services, std::move(client), std::move(owner), std::move(peer), Clock::now()),
        topk_(std::make_unique<std::string>()) {}

  ~Ring() { Stop(); }

  const std::string& owner() const { return owner_; }
  uint64_t region() const { return region_; }
  bool ended() const { return ended_.load(std::memory_order_acquire); }

  void Start() { worker_ = std::thread([this] { Run(); }); }

  // Ends the worker (after the request in hand) and joins it; returns
  // whether an open step was rolled back.
  bool Stop() {
    {
      absl::MutexLock lock(&pin_mu_);
      stop_.store(true, std::memory_order_release);
      if (pin_.hold) FutexWake(&header_->req_head);  // the mapping is still ours
    }
    if (worker_.joinable()) worker_.join();
    return rolled_back_;
  }

 private:
  void Run() {
    uint32_t k = header_->req_tail.load(std::memory_order_acquire);
    Clock::time_point last_message = Clock::now();
    Clock::time_point last_check = last_message;
    while (!stop_.load(std::memory_order_acquire)) {
      const Clock::time_point waiting_since = Clock::now();
      if (!WaitFor(k)) {
        const Clock::time_point now = Clock::now();
        if (now - last_check >= std::chrono::milliseconds(kPollMs)) {
          last_check = now;
          if (!services_.regions->Holds(owner_, region_)) {
            spdlog::info("ring {}: region {} gone (unregistered or lease expired); detached", id_,
                         region_);
            break;
          }
        }
        if (session_.has_step() && now - last_message >= step_idle_) {
          spdlog::info("[{}] ring {}: idle for {} ms: rolled back", session_.Who(), id_,
                       step_idle_.count());
          services_.metrics->StepEnded(StepOutcome::kFailed);
          session_.Reset();
          idle_note_ = absl::StrCat("step: no message for ", step_idle_.count(),
                                    " ms (step_idle_ms); the step was rolled back");
        }
        continue;
      }
      // Every message renews the region's lease (and proves it is still
      // the owner's).
      if (!services_.regions->Lookup(owner_, "ring", {region_, offset_, 1}).ok()) {
        spdlog::info("ring {}: region {} gone; detached", id_, region_);
        break;
      }
      Handle(k, waiting_since);
      ++k;
      last_message = last_check = Clock::now();
    }
    End();
  }

  // Spins, then sleeps (at most kPollMs) until request k is published;
  // false when it is not.
  bool WaitFor(uint32_t k) {
    const Clock::time_point spin_end = Clock::now() + spin_;
    do {
      if (header_->req_head.load(std::memory_order_acquire) != k) return true;
      if (stop_.load(std::memory_order_relaxed)) return false;
      CpuRelax();
    } while (Clock::now() < spin_end);
    header_->server_sleeping.store(1, std::memory_order_seq_cst);
    if (header_->req_head.load(std::memory_order_seq_cst) == k &&
        !stop_.load(std::memory_order_acquire)) {
      FutexWait(&header_->req_head, k, kPollMs);
    }
    header_->server_sleeping.store(0, std::memory_order_relaxed);
    return header_->req_head.load(std::memory_order_acquire) != k;
  }

  void Handle(uint32_t k, Clock::time_point waiting_since) {
    StepReceipt receipt;
    receipt.read_posted = waiting_since;
    receipt.received = Clock::now();
    const uint8_t* slot = base_ + rw::RequestSlotOffset(slots_, slot_bytes_, k);
    rw::SlotHeader sh;
    std::memcpy(&sh, slot, sizeof(sh));
    absl::Status s;
    reply_.clear();
    v1::StepRequest::KindCase kind = v1::StepRequest::KIND_NOT_SET;
    const uint32_t room = slot_bytes_ - rw::kSlotHeaderBytes;
    if (sh.bytes > room) {
      s = absl::InvalidArgumentError(absl::StrCat("slot.bytes: expected at most ", room,
                                                  " (slot_bytes - 16), got ", sh.bytes));
    } else if (sh.seq != k) {
      s = absl::InvalidArgumentError(
          absl::StrCat("slot.seq: expected ", k, " (the request's number), got ", sh.seq));
    } else {
      // A private copy: the client may write the slot again while it is parsed.
      request_.assign(reinterpret_cast<const char*>(slot) + rw::kSlotHeaderBytes, sh.bytes);
      services_.metrics->BytesIn(sh.bytes);
      const bool parsed = req_.ParseFromString(request_);
      receipt.parsed = Clock::now();
      if (!parsed) {
        s = absl::InvalidArgumentError("request: expected a StepRequest message");
      } else {
        kind = req_.kind_case();
        s = Step(receipt, room);
      }
    }
    if (!s.ok()) {
      if (kind != v1::StepRequest::kHeader && !idle_note_.empty() && !session_.has_step()) {
        s = absl::DeadlineExceededError(idle_note_);
      }
      spdlog::warn("[{}] ring {}: {}: {}", session_.Who(), id_, absl::StatusCodeToString(s.code()),
                   CapText(s.message()));
      if (session_.has_step()) {
        services_.metrics->StepEnded(s.code() == absl::StatusCode::kAborted
                                         ? StepOutcome::kAborted
                                         : StepOutcome::kFailed);
      }
      session_.Reset();
      reply_.assign(s.message().data(), std::min<size_t>(s.message().size(), room));
    }
    if (kind == v1::StepRequest::kHeader) idle_note_.clear();
    Publish(k, s.ok() ? 0 : static_cast<int32_t>(s.code()));
  }

  // The step logic; fills reply_ (at most `room` bytes).
  absl::Status Step(const StepReceipt& receipt, uint32_t room) {
    switch (req_.kind_case()) {
      case v1::StepRequest::kHeader:
        // LayerTimings.stream_clock_ns: a ring's step starts with its header.
        if (!session_.has_step()) session_.set_created(receipt.received);
        return session_.Begin(req_.header(), receipt);
      case v1::StepRequest::kLayer: {
        auto res = session_.Layer(req_.layer(), receipt, std::move(topk_));
        if (!res.ok()) {
          topk_ = std::make_unique<std::string>();
          return res.status();
        }
        const std::string head = LayerReplyHead(res->reply, res->meta, res->topk->size());
        topk_ = std::move(res->topk);
        if (head.size() + topk_->size() > room) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "reply: ", head.size() + topk_->size(), " bytes exceed the ring's slot (", room,
              " bytes of payload); name a topk_out region or attach a ring with larger slots"));
        }
        reply_ = head;
        reply_.append(*topk_);
        return absl::OkStatus();
      }
      case v1::StepRequest::kCommit: {
        auto committed = session_.Commit();
        if (!committed.ok()) return committed.status();
        v1::StepResponse resp;
        *resp.mutable_committed() = std::move(*committed);
        services_.metrics->StepEnded(StepOutcome::kCommitted);
        session_.Reset();
        return Serialize(resp, room);
      }
      case v1::StepRequest::kAbort: {
        if (session_.has_step()) {
          spdlog::info("[{}] ring {}: aborted by the client: rolled back", session_.Who(), id_);
          services_.metrics->StepEnded(StepOutcome::kAborted);
        }
        session_.Reset();
        v1::StepResponse resp;
        resp.mutable_aborted();
        return Serialize(resp, room);
      }
      default:
        return absl::InvalidArgumentError(
            "request: expected one of header, layer, commit, abort to be set");
    }
  }

  absl::Status Serialize(const v1::StepResponse& resp, uint32_t room) {
    reply_ = resp.SerializeAsString();
    if (reply_.size() > room) {
      return absl::ResourceExhaustedError(absl::StrCat("reply: ", reply_.size(),
                                                       " bytes exceed the ring's slot (", room,
                                                       " bytes of payload)"));
    }
    return absl::OkStatus();
  }

  // Writes response k and rings the client's doorbell if it sleeps.
  void Publish(uint32_t k, int32_t code) {
    uint8_t* slot = base_ + rw::ResponseSlotOffset(slots_, slot_bytes_, k);
    const rw::SlotHeader sh{static_cast<uint32_t>(reply_.size()), code, k, 0};
    std::memcpy(slot, &sh, sizeof(sh));
    std::memcpy(slot + rw::kSlotHeaderBytes, reply_.data(), reply_.size());
    services_.metrics->BytesOut(static_cast<int64_t>(reply_.size()));
    header_->req_tail.store(k + 1, std::memory_order_release);
    header_->resp_head.store(k + 1, std::memory_order_seq_cst);
    if (header_->client_sleeping.load(std::memory_order_seq_cst) != 0) {
      FutexWake(&header_->resp_head);
    }
    // The reply is out: the layer's regions may be unmapped from now on.
    session_.ReleasePins();
  }

  // Rolls back an open step and lets go of the ring's memory.
  void End() {
    if (session_.has_step() && !session_.committed()) {
      spdlog::info("[{}] ring {}: detached with an open step: rolled back", session_.Who(), id_);
      services_.metrics->StepEnded(StepOutcome::kAborted);
      rolled_back_ = true;
    }
    session_.Reset();
    absl::MutexLock lock(&pin_mu_);
    header_->detached.store(1, std::memory_order_seq_cst);
    FutexWake(&header_->resp_head);
    pin_ = PinnedRegion();
    ended_.store(true, std::memory_order_release);
  }

  const uint64_t id_;
  const StepServices services_;
  const std::string owner_;
  const uint64_t region_;
  const uint64_t offset_;
  const uint32_t slots_;       // copied at attach: the client cannot change them
  const uint32_t slot_bytes_;
  const std::chrono::microseconds spin_;
  const std::chrono::milliseconds step_idle_;
  absl::Mutex pin_mu_;  // orders Stop's wake against End's unmap
  PinnedRegion pin_ ABSL_GUARDED_BY(pin_mu_);
  uint8_t* const base_;        // the ring header's address
  rw::RingHeader* const header_;
  StepSession session_;
  std::unique_ptr<std::string> topk_;  // reused top-k buffer
  std::string request_;                // the request's bytes, copied
  std::string reply_;                  // the response's payload
  v1::StepRequest req_;
  std::string idle_note_;  // why the last step went, for its next message
  std::atomic<bool> stop_{false};
  std::atomic<bool> ended_{false};
  bool rolled_back_ = false;  // written by the worker, read after join
  std::thread worker_;
};

RingHost::RingHost(const StepServices& services, uint32_t spin_us,
                   std::chrono::milliseconds step_idle)
    : services_(services), spin_us_(spin_us), step_idle_(step_idle) {}

RingHost::~RingHost() {
  std::map<uint64_t, std::unique_ptr<Ring>> rings;
  {
    absl::MutexLock lock(&mu_);
    rings.swap(rings_);
  }
  rings.clear();  // each destructor stops and joins its worker
}

void RingHost::ReapLocked() {
  for (auto it = rings_.begin(); it != rings_.end();) {
    if (it->second->ended()) {
      it = rings_.erase(it);  // the worker has returned: the join is immediate
    } else {
      ++it;
    }
  }
}

absl::StatusOr<uint64_t> RingHost::Attach(const std::string& client, const std::string& owner,
                                          const std::string& peer, uint64_t region,
                                          uint64_t offset) {
  if (offset % rw::kAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset: expected a multiple of ", rw::kAlignment, ", got ", offset));
  }
  auto head = services_.regions->Lookup(owner, "ring", {region, offset, rw::kHeaderBytes});
  if (!head.ok()) return head.status();
  if (head->on_device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region: region ", region, " is a device region; a ring lives in a host region"));
  }
  // The parameters, read once: the client may change the header later, the
  // worker only ever uses these copies.
  uint32_t params[4];
  std::memcpy(params, head->data, sizeof(params));
  const uint32_t magic = params[0], version = params[1], slots = params[2],
                 slot_bytes = params[3];
  if (magic != rw::kMagic) {
    return absl::InvalidArgumentError(absl::StrCat("ring.magic: expected 0x",
                                                   absl::Hex(rw::kMagic), ", got 0x",
                                                   absl::Hex(magic)));
  }
  if (version != rw::kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring.version: expected ", rw::kVersion, ", got ", version));
  }
  if (!PowerOfTwo(slots) || slots > rw::kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring.slot_count: expected a power of two in [1, ", rw::kMaxSlots, "], got ", slots));
  }
  if (slot_bytes % rw::kAlignment != 0 || slot_bytes < rw::kMinSlotBytes ||
      slot_bytes > rw::kMaxSlotBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring.slot_bytes: expected a multiple of ", rw::kAlignment, " in [", rw::kMinSlotBytes,
        ", ", rw::kMaxSlotBytes, "], got ", slot_bytes));
  }
  auto whole =
      services_.regions->Lookup(owner, "ring", {region, offset, rw::RingBytes(slots, slot_bytes)});
  if (!whole.ok()) return whole.status();

  absl::MutexLock lock(&mu_);
  ReapLocked();
  int mine = 0;
  for (const auto& [id, r] : rings_) {
    if (r->region() == region && r->owner() == owner) {
      return absl::AlreadyExistsError(
          absl::StrCat("region: region ", region, " already holds ring ", id));
    }
    if (r->owner() == owner) ++mine;
  }
  if (static_cast<int>(rings_.size()) >= kMaxRings) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ring: ", kMaxRings, " rings are attached (the daemon's limit)"));
  }
  if (mine >= kMaxPerClient) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ring: this client has ", kMaxPerClient, " rings attached (the limit per client)"));
  }
  const uint64_t id = next_id_++;
  auto ring = std::make_unique<Ring>(id, services_, client, owner, peer, region, offset,
                                     std::move(*whole), slots, slot_bytes, spin_us_, step_idle_);
  ring->Start();
  rings_[id] = std::move(ring);
  spdlog::debug("ring {} attached on region {} ({} slots of {} bytes)", id, region, slots,
                slot_bytes);
  return id;
}

absl::StatusOr<bool> RingHost::Detach(const std::string& owner, uint64_t ring) {
  std::unique_ptr<Ring> r;
  {
    absl::MutexLock lock(&mu_);
    ReapLocked();
    auto it = rings_.find(ring);
    if (it == rings_.end() || it->second->owner() != owner) {
      return absl::NotFoundError(absl::StrCat("ring: ring ", ring, " not found"));
    }
    r = std::move(it->second);
    rings_.erase(it);
  }
  return r->Stop();
}

void RingHost::DetachRegion(const std::string& owner, uint64_t region) {
  std::unique_ptr<Ring> r;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = rings_.begin(); it != rings_.end(); ++it) {
      if (it->second->region() == region && it->second->owner() == owner) {
        r = std::move(it->second);
        rings_.erase(it);
        break;
      }
    }
  }
  if (r) r->Stop();
}

size_t RingHost::size() {
  absl::MutexLock lock(&mu_);
  ReapLocked();
  return rings_.size();
}

}  // namespace indexer
