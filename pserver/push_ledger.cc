#include "pserver/push_ledger.h"

#include <algorithm>

namespace strata::pserver {

bool PushLedger::Seen(uint32_t sender, uint64_t seq, uint32_t chunk) const {
  auto last = last_seq_.find(sender);
  if (last != last_seq_.end() && seq <= last->second) return true;
  auto per = partial_.find(sender);
  if (per == partial_.end()) return false;
  auto p = per->second.find(seq);
  return p != per->second.end() && chunk < p->second.done.size() && p->second.done[chunk];
}

void PushLedger::Resolve(uint32_t sender, uint64_t seq, uint32_t chunk, bool applied) {
  if (chunks_ > 1) {
    auto& per = partial_[sender];
    Partial& p = per[seq];
    if (p.done.empty()) p.done.assign(chunks_, false);
    if (chunk < chunks_ && !p.done[chunk]) {
      p.done[chunk] = true;
      ++p.resolved;
    }
    p.applied = p.applied && applied;
    if (p.resolved < chunks_) return;
    applied = p.applied;
    per.erase(per.begin(), per.upper_bound(seq));
    if (per.empty()) partial_.erase(sender);
  }
  uint64_t& last = last_seq_[sender];
  last = std::max(last, seq);
  if (applied) ++applied_by_sender_[sender];
}

void PushLedger::Save(proto::CheckpointPartitionHeader* h) const {
  for (const auto& [sender, seq] : last_seq_) (*h->mutable_last_seq())[sender] = seq;
  for (const auto& [sender, n] : applied_by_sender_) (*h->mutable_applied_by_sender())[sender] = n;
  for (const auto& [sender, per] : partial_) {
    for (const auto& [seq, p] : per) {
      proto::PartialPush* out = h->add_partial_pushes();
      out->set_sender(sender);
      out->set_seq(seq);
      for (uint32_t c = 0; c < p.done.size(); ++c) {
        if (p.done[c]) out->add_chunks(c);
      }
    }
  }
}

void PushLedger::Load(const proto::CheckpointPartitionHeader& h) {
  last_seq_.clear();
  for (const auto& [sender, seq] : h.last_seq()) last_seq_[sender] = seq;
  applied_by_sender_.clear();
  for (const auto& [sender, n] : h.applied_by_sender()) applied_by_sender_[sender] = n;
  partial_.clear();
  for (const proto::PartialPush& in : h.partial_pushes()) {
    if (chunks_ <= 1) break;
    Partial p;
    p.done.assign(chunks_, false);
    bool fits = true;
    for (uint32_t c : in.chunks()) {
      if (c >= chunks_) fits = false;
      if (fits && !p.done[c]) {
        p.done[c] = true;
        ++p.resolved;
      }
    }
    if (fits && p.resolved < chunks_) partial_[in.sender()][in.seq()] = std::move(p);
  }
}

}  // namespace strata::pserver
