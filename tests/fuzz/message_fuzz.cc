// Fuzz target: the bodies of the data plane's messages, as a pserver's
// partitions and the rdma set-up read them (transport/transport.h,
// docs/wire-protocol.md, docs/sparse.md, docs/reliability.md). The input is
// a sequence of frames as on the wire: a 72-byte header (DecodeFrameHeader)
// then its payload (cut short at the input's end). Each frame goes where a
// pserver would send it, on fresh partitions made for the input:
//
//   kPullRequest, kPushRequest  a dense and a sparse primary partition
//                               (Pull, Push; the one of the other kind
//                               refuses it)
//   kReplicate                  a dense and a sparse backup (ApplyReplica),
//                               and DecodeReplicaUpdate / DecodeReplicaCopy
//   kReplicateResponse          the primaries' OnReplicaAck
//   kRdmaHello, kRdmaHelloReply ParsePeerHello
//   responses                   ResponseStatus
//
// and, to let the input drive the cluster's side too, kPing sets the
// primaries' step workers to {1, sender} and kPong promotes the backups.
// With replication on (a bit of the input's hash), the primaries' own
// records go to the backups between frames, and their acks back.
//
// Every request must be answered at most once, with a valid type, and the
// codecs must round-trip what they accept.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "common/initializer.h"
#include "common/optimizer.h"
#include "common/row_optimizer.h"
#include "glog/logging.h"
#include "pserver/partition.h"
#include "pserver/replica_record.h"
#include "pserver/sparse_table.h"
#include "tests/fuzz/fuzz_support.h"
#include "transport/rdma/rdma_hello.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace strata::pserver {
namespace {

using transport::Message;
using transport::MessageType;

constexpr uint64_t kMaxPayload = 1 << 16;
constexpr uint32_t kBackupNode = 9;
constexpr size_t kDenseLength = 8;
constexpr int kSparseDim = 4;

// Checks that it is answered at most once, with a message type; keeps the
// answer for the replication loop. Thread-compatible (one thread here).
class CheckingResponder : public transport::Responder {
 public:
  void Respond(Message response) override {
    CHECK(!responded_) << "request answered twice";
    responded_ = true;
    CHECK(transport::IsValidMessageType(response.header.type))
        << static_cast<int>(response.header.type);
    response.OwnPayload();  // borrowed only during Respond
    response_ = std::move(response);
  }
  std::string peer() const override { return "fuzz:1"; }
  bool responded() const { return responded_; }
  const Message& response() const { return response_; }

 private:
  bool responded_ = false;
  Message response_;
};

// Collects the primaries' replication records. Thread-safe (the partition
// calls it under its lock).
class QueueSink : public ReplicaSink {
 public:
  void Send(Partition* partition, uint32_t backup, Message record) override {
    absl::MutexLock l(&mu_);
    records_.emplace_back(partition, std::move(record));
  }
  std::vector<std::pair<Partition*, Message>> Take() {
    absl::MutexLock l(&mu_);
    std::vector<std::pair<Partition*, Message>> out;
    out.swap(records_);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<Partition*, Message>> records_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<Partition> Dense(uint32_t id, Consistency consistency) {
  OptimizerSection o;
  o.type = "adam";
  auto opt = Optimizer::Create(o, kDenseLength);
  CHECK(opt.ok()) << opt.status();
  std::vector<float> values(kDenseLength);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i);
  return std::make_unique<Partition>(id, "fc0.weight", std::move(values), std::move(*opt),
                                     consistency);
}

std::unique_ptr<Partition> Sparse(uint32_t id, Consistency consistency, uint64_t hash) {
  RowOptimizerSection o;
  o.type = "adagrad";
  auto opt = RowOptimizer::Create(o);
  CHECK(opt.ok()) << opt.status();
  auto init = RowInitializer::Create("uniform", 0.1, id, 7);
  CHECK(init.ok()) << init.status();
  SparseTableOptions so;
  so.dim = kSparseDim;
  so.optimizer = std::shared_ptr<const RowOptimizer>(std::move(*opt));
  so.initializer = &*init;
  // Admission and eviction as the input's hash says.
  so.admit_min_count = 1 + (hash >> 8) % 2;
  so.admit_probability = (hash >> 9) % 2 ? 1.0 : 0.5;
  so.idle_updates = (hash >> 10) % 2 ? 0 : 3;
  so.capacity_rows = (hash >> 11) % 2 ? 0 : 4;
  so.max_pending_keys = 8;
  auto rows = SparseTable::Create(so);
  CHECK(rows.ok()) << rows.status();
  return std::make_unique<Partition>(id, "embedding", std::move(*rows), consistency);
}

void CheckReplicaCodecs(absl::string_view payload) {
  absl::StatusOr<ReplicaUpdate> u = DecodeReplicaUpdate(payload);
  if (u.ok()) CHECK(EncodeReplicaUpdate(*u) == payload) << "update record does not round-trip";
  auto copy = DecodeReplicaCopy(payload);
  if (copy.ok()) {
    auto again = DecodeReplicaCopy(EncodeReplicaCopy(*copy));
    CHECK(again.ok()) << again.status();
    CHECK(*again == *copy) << "copy record does not round-trip";
  }
}

class Cluster {
 public:
  explicit Cluster(uint64_t hash)
      : consistency_(hash % 2 ? Consistency::kAsp : Consistency::kBsp),
        replicate_((hash >> 1) % 2 == 1),
        dense_(Dense(7, consistency_)),
        sparse_(Sparse(8, consistency_, hash)),
        dense_backup_(Dense(7, consistency_)),
        sparse_backup_(Sparse(8, consistency_, hash)) {
    dense_backup_->MakeBackup();
    sparse_backup_->MakeBackup();
    for (Partition* p : {dense_.get(), sparse_.get()}) {
      p->SetStepWorkers({1, 2});
      if (replicate_) p->SetBackups({kBackupNode}, &sink_);
    }
    Replicate();
  }

  void Deliver(const Message& m) {
    const MessageType type = m.header.type;
    const absl::string_view payload(m.payload_data(), m.payload_size());
    switch (type) {
      case MessageType::kPullRequest:
        dense_->Pull(m, Responder());
        sparse_->Pull(m, Responder());
        break;
      case MessageType::kPushRequest:
        dense_->Push(m, Responder());
        sparse_->Push(m, Responder());
        break;
      case MessageType::kReplicate:
        CheckReplicaCodecs(payload);
        dense_backup_->ApplyReplica(m, Responder());
        sparse_backup_->ApplyReplica(m, Responder());
        break;
      case MessageType::kReplicateResponse:
        dense_->OnReplicaAck(m.header.sender_id, m.header.seq);
        sparse_->OnReplicaAck(m.header.sender_id, m.header.seq);
        break;
      case MessageType::kRdmaHello:
      case MessageType::kRdmaHelloReply: {
        auto hello = transport::rdma::ParsePeerHello(
            std::string_view(payload.data(), payload.size()), "fuzz:1");
        if (hello.ok() && hello->rdma_ready()) (void)transport::rdma::HelloQpOf(*hello);
        break;
      }
      case MessageType::kPing:
        for (Partition* p : {dense_.get(), sparse_.get()}) {
          p->SetStepWorkers({1, m.header.sender_id});
        }
        break;
      case MessageType::kPong:
        dense_backup_->Promote();
        sparse_backup_->Promote();
        break;
      default:
        break;
    }
    if (transport::ResponseTypeFor(type) == type) (void)transport::ResponseStatus(m);
    Replicate();
  }

 private:
  std::shared_ptr<CheckingResponder> Responder() {
    responders_.push_back(std::make_shared<CheckingResponder>());
    return responders_.back();
  }

  // The primaries' records to their backups, the backups' acks back, until
  // none is left.
  void Replicate() {
    if (!replicate_) return;
    for (int round = 0; round < 4; ++round) {
      auto records = sink_.Take();
      if (records.empty()) return;
      for (auto& [primary, record] : records) {
        Partition* backup = primary == dense_.get() ? dense_backup_.get() : sparse_backup_.get();
        auto r = std::make_shared<CheckingResponder>();
        backup->ApplyReplica(record, r);
        if (r->responded() && r->response().header.status == 0) {
          primary->OnReplicaAck(kBackupNode, record.header.seq);
        }
      }
    }
  }

  const Consistency consistency_;
  const bool replicate_;
  QueueSink sink_;  // outlives the partitions, which borrow it
  std::unique_ptr<Partition> dense_, sparse_, dense_backup_, sparse_backup_;
  std::vector<std::shared_ptr<CheckingResponder>> responders_;
};

void Run(const uint8_t* data, size_t size) {
  Cluster cluster(fuzz::InputHash(data, size));
  const char* p = reinterpret_cast<const char*>(data);
  size_t left = size;
  while (left >= transport::tcp::kFrameHeaderBytes) {
    Message m;
    uint64_t payload_bytes = 0;
    if (!transport::tcp::DecodeFrameHeader(p, kMaxPayload, &m.header, &payload_bytes).ok()) {
      return;  // the connection would close here
    }
    p += transport::tcp::kFrameHeaderBytes;
    left -= transport::tcp::kFrameHeaderBytes;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(payload_bytes, left));
    m.payload.assign(p, n);
    p += n;
    left -= n;
    cluster.Deliver(m);
  }
}

}  // namespace
}  // namespace strata::pserver

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  strata::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::pserver::Run(data, size);
  return 0;
}
