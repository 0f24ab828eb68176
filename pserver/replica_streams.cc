#include "pserver/replica_streams.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "glog/logging.h"

namespace strata::pserver {

using transport::Message;

namespace {
// The slowest transfer rate a backup is given before a big record (a full
// copy) counts as unanswered: each such byte adds to the ack timeout.
constexpr double kSlowestCopyBytesPerSecond = 64 << 20;
}  // namespace

ReplicaStreams::ReplicaStreams(transport::Transport* transport, std::function<uint32_t()> self,
                               std::function<uint64_t()> epoch, std::function<void()> on_stale,
                               std::function<void(uint32_t, const std::string&)> on_unreachable,
                               absl::Duration ack_timeout)
    : transport_(transport),
      self_(std::move(self)),
      epoch_(std::move(epoch)),
      on_stale_(std::move(on_stale)),
      on_unreachable_(std::move(on_unreachable)),
      ack_timeout_(ack_timeout) {
  thread_ = std::thread([this] { Loop(); });
}

ReplicaStreams::~ReplicaStreams() { Shutdown(); }

void ReplicaStreams::Shutdown() {
  {
    absl::MutexLock l(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  // The records' partitions are released without mu_ held.
  std::map<uint32_t, Stream> streams;
  {
    absl::MutexLock l(&mu_);
    streams.swap(streams_);
  }
}

void ReplicaStreams::SetBackups(const std::map<uint32_t, std::string>& addresses) {
  // Destroyed after mu_ is released (declared first): a dropped record may
  // hold the last reference to a partition that moved away.
  std::vector<Stream> dropped_streams;
  std::vector<std::shared_ptr<transport::Connection>> dropped;
  absl::MutexLock l(&mu_);
  for (auto it = streams_.begin(); it != streams_.end();) {
    if (addresses.count(it->first) == 0) {
      if (!it->second.queue.empty()) {
        LOG(INFO) << "replication to node " << it->first << " ends with " << it->second.queue.size()
                  << " record(s) unacknowledged (it left the view)";
      }
      dropped.push_back(std::move(it->second.conn));
      dropped_streams.push_back(std::move(it->second));
      it = streams_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [id, address] : addresses) {
    Stream& s = streams_[id];
    if (s.address != address) {
      s.address = address;
      s.conn.reset();
      s.retry_at = absl::InfinitePast();
    }
  }
  wake_ = true;
}

void ReplicaStreams::KeepOnly(const std::map<uint32_t, std::set<uint32_t>>& backups) {
  // Released after mu_ (declared first): a dropped record may hold the
  // last reference to a partition that moved away.
  std::vector<Entry> dropped;
  absl::MutexLock l(&mu_);
  for (auto& [id, s] : streams_) {
    for (auto it = s.queue.begin(); it != s.queue.end();) {
      auto b = backups.find(it->record.header.partition);
      if (b != backups.end() && b->second.count(id) > 0) {
        ++it;
        continue;
      }
      stats_.queued_bytes -= std::min<uint64_t>(stats_.queued_bytes, it->record.payload.size());
      dropped.push_back(std::move(*it));
      it = s.queue.erase(it);
    }
  }
  if (!dropped.empty()) {
    LOG(INFO) << "replication: " << dropped.size()
              << " record(s) dropped (their partition moved away, or their node backs it no more)";
    wake_ = true;
  }
}

void ReplicaStreams::Send(Partition* partition, uint32_t backup, Message record) {
  std::shared_ptr<Partition> shared = partition->weak_from_this().lock();
  CHECK(shared != nullptr) << "ReplicaStreams::Send: partition " << partition->id()
                           << " is not owned by a std::shared_ptr";
  absl::MutexLock l(&mu_);
  if (stop_) return;
  Stream& s = streams_[backup];
  stats_.queued_bytes += record.payload.size();
  s.queue.push_back(Entry{std::move(shared), std::move(record)});
  wake_ = true;
}

ReplicaStreams::Stats ReplicaStreams::stats() const {
  absl::MutexLock l(&mu_);
  Stats st = stats_;
  st.queued = 0;
  for (const auto& [id, s] : streams_) st.queued += s.queue.size();
  return st;
}

void ReplicaStreams::Loop() {
  while (true) {
    // What to send now: (backup, address, connection, generation, records).
    struct Batch {
      uint32_t backup;
      std::string address;
      std::shared_ptr<transport::Connection> conn;
      uint64_t generation;
      std::vector<Message> records;
    };
    std::vector<Batch> batches;
    std::vector<std::pair<uint32_t, std::string>> silent;  // backups that did not answer
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_ || stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(20));
      if (stop_) return;
      wake_ = false;
      const absl::Time now = absl::Now();
      for (auto& [id, s] : streams_) {
        // The oldest record sent and not answered: is it overdue?
        for (const Entry& e : s.queue) {
          if (e.acked) continue;
          // Longer after each failure in a row, and for big records (a
          // full copy): a slow backup is not resent to forever.
          const absl::Duration overdue =
              ack_timeout_ * (1 << std::min(s.failures, 5)) +
              absl::Seconds(static_cast<double>(e.record.payload.size()) /
                            kSlowestCopyBytesPerSecond);
          if (e.sent && now - e.sent_at > overdue) {
            const std::string why =
                absl::StrCat("replication record ", e.record.header.seq, " of partition ",
                             e.record.header.partition, " unanswered for ",
                             absl::FormatDuration(now - e.sent_at));
            LOG(WARNING) << "replication to node " << id << " at " << s.address << ": " << why
                         << "; sending everything unacknowledged again on a new connection";
            ++stats_.ack_timeouts;
            ++s.generation;
            ++s.failures;
            for (Entry& x : s.queue) x.sent = x.acked;
            s.conn.reset();
            s.retry_at = now;
            silent.emplace_back(id, why);
          }
          break;
        }
        if (s.address.empty() || now < s.retry_at) continue;
        Batch b{id, s.address, s.conn, s.generation, {}};
        for (Entry& e : s.queue) {
          if (e.sent) continue;
          e.sent = true;
          e.sent_at = now;
          Message m;
          m.header = e.record.header;
          m.payload = e.record.payload;
          m.header.sender_id = self_();
          m.header.epoch = epoch_();
          if (e.resend) {
            ++stats_.resends;
          } else {
            ++stats_.records_sent;
            stats_.bytes_sent += m.payload.size();
            e.resend = true;
          }
          b.records.push_back(std::move(m));
        }
        if (!b.records.empty()) batches.push_back(std::move(b));
      }
    }
    if (on_unreachable_) {
      for (const auto& [backup, why] : silent) on_unreachable_(backup, why);
    }
    for (Batch& b : batches) {
      if (b.conn == nullptr || !b.conn->healthy()) {
        auto conn = transport_->Connect(b.address);
        if (!conn.ok()) {
          for (Message& m : b.records) {
            OnAnswer(b.backup, b.generation, m.header.partition, m.header.seq, conn.status());
          }
          continue;
        }
        b.conn = std::move(*conn);
        absl::MutexLock l(&mu_);
        auto it = streams_.find(b.backup);
        if (it != streams_.end() && it->second.generation == b.generation) {
          it->second.conn = b.conn;
        }
      }
      for (Message& m : b.records) {
        const uint32_t partition = m.header.partition;
        const uint64_t seq = m.header.seq;
        b.conn->Call(std::move(m), [this, backup = b.backup, gen = b.generation, partition,
                                    seq](absl::StatusOr<Message> answer) {
          OnAnswer(backup, gen, partition, seq, std::move(answer));
        });
      }
    }
  }
}

void ReplicaStreams::OnAnswer(uint32_t backup, uint64_t generation, uint32_t partition,
                              uint64_t seq, absl::StatusOr<Message> answer) {
  absl::Status status = answer.ok() ? transport::ResponseStatus(*answer) : answer.status();
  // Released after mu_ (declared first): it may hold the last reference
  // to a partition that moved away.
  std::vector<std::pair<std::shared_ptr<Partition>, uint64_t>> acked;
  bool stale = false;
  {
    absl::MutexLock l(&mu_);
    auto it = streams_.find(backup);
    if (it == streams_.end() || it->second.generation != generation) return;
    Stream& s = it->second;
    if (status.ok()) {
      s.failures = 0;
      for (Entry& e : s.queue) {
        if (e.record.header.partition == partition && e.record.header.seq == seq) {
          e.acked = true;
          break;
        }
      }
      while (!s.queue.empty() && s.queue.front().acked) {
        Entry& e = s.queue.front();
        acked.emplace_back(std::move(e.partition), e.record.header.seq);
        stats_.queued_bytes -= std::min<uint64_t>(stats_.queued_bytes, e.record.payload.size());
        s.queue.pop_front();
      }
    } else {
      // Everything unacknowledged goes again, in order, after a backoff.
      ++s.generation;
      ++s.failures;
      for (Entry& e : s.queue) e.sent = e.acked;
      if (!answer.ok()) s.conn.reset();
      s.retry_at = absl::Now() + std::min(absl::Milliseconds(10) * (1 << std::min(s.failures, 7)),
                                          absl::Seconds(1));
      stale = HasReason(status, proto::REASON_STALE_EPOCH);
      LOG_EVERY_N(WARNING, 20) << "replication to node " << backup << " at " << s.address
                               << " (partition " << partition << ", record " << seq
                               << "): " << status << "; resending";
    }
    wake_ = true;
  }
  if (stale && on_stale_) on_stale_();
  if (!answer.ok() && on_unreachable_) on_unreachable_(backup, std::string(status.message()));
  for (auto& [p, index] : acked) p->OnReplicaAck(backup, index);
}

}  // namespace strata::pserver
