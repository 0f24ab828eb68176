#include "master/etcd_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace strata::master {
namespace {

std::string HeadKey(const std::string& keys) { return keys + "state/head"; }
std::string LogPrefix(const std::string& keys) { return keys + "state/log/"; }
std::string SnapPrefix(const std::string& keys) { return keys + "state/snap/"; }
std::string GenPrefix(const std::string& keys, uint64_t gen) {
  return absl::StrFormat("%s%016x/", SnapPrefix(keys), gen);
}
std::string LogKey(const std::string& keys, uint64_t seq) {
  return absl::StrFormat("%s%020d", LogPrefix(keys), seq);
}

etcdserverpb::RequestOp Put(std::string key, std::string value) {
  etcdserverpb::RequestOp op;
  op.mutable_request_put()->set_key(std::move(key));
  op.mutable_request_put()->set_value(std::move(value));
  return op;
}

etcdserverpb::RequestOp DeleteRange(std::string from, std::string to) {
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(std::move(from));
  op.mutable_request_delete_range()->set_range_end(std::move(to));
  return op;
}

}  // namespace

std::string EtcdJobKeys(const std::string& prefix, const std::string& job) {
  std::string p = prefix;
  while (!p.empty() && p.back() == '/') p.pop_back();
  return absl::StrCat(p, "/", job, "/");
}

std::string EtcdStateStore::where() const {
  return absl::StrCat("etcd ", options_.etcd->endpoint(), " keys ", options_.keys, "state/");
}

absl::Status EtcdStateReader::Follow() {
  records_read_ = 0;
  STRATA_ASSIGN_OR_RETURN(EtcdClient::Value head_kv, etcd_->Get(HeadKey(keys_)));
  if (!head_kv.found) {  // nothing written yet
    state_.reset();
    generation_ = 0;
    return absl::OkStatus();
  }
  proto::EtcdStateHead head;
  if (!head.ParseFromString(head_kv.value)) {
    return absl::DataLossError(absl::StrCat("etcd key ", HeadKey(keys_),
                                            " does not parse; delete the keys under ", keys_,
                                            "state/ to start the master afresh"));
  }
  if (head.generation() != generation_ || !state_.has_value()) {
    const std::string gen = GenPrefix(keys_, head.generation());
    // (All of it as of the head's read: a snapshot the leader writes
    // meanwhile does not tear it; a revision compacted since is an error
    // that the next Follow does not meet.)
    etcdserverpb::RangeRequest preq;  // (its parts only)
    preq.set_key(absl::StrFormat("%s%06d", gen, 0));
    preq.set_range_end(absl::StrFormat("%s%06d", gen, head.parts()));
    preq.set_revision(head_kv.revision);
    STRATA_ASSIGN_OR_RETURN(etcdserverpb::RangeResponse parts, etcd_->Range(preq));
    const std::string afresh =
        absl::StrCat("delete the keys under ", keys_, "state/ to start the master afresh");
    if (parts.kvs_size() != static_cast<int>(head.parts())) {
      return absl::DataLossError(absl::StrCat("etcd snapshot ", gen, ": ", parts.kvs_size(), " of ",
                                              head.parts(), " parts; ", afresh));
    }
    std::string bytes;
    for (const mvccpb::KeyValue& kv : parts.kvs()) bytes += kv.value();
    STRATA_ASSIGN_OR_RETURN(state_, DecodeSnapshot("etcd snapshot " + gen, bytes, afresh));
    generation_ = head.generation();
  }
  // The log's records after the state's.
  etcdserverpb::RangeRequest req;
  req.set_key(LogKey(keys_, state_->record_seq() + 1));
  req.set_range_end(PrefixRangeEnd(LogPrefix(keys_)));
  req.set_revision(head_kv.revision);
  STRATA_ASSIGN_OR_RETURN(etcdserverpb::RangeResponse log, etcd_->Range(req));
  std::vector<proto::MasterState> records;
  for (const mvccpb::KeyValue& kv : log.kvs()) {
    StateRecords r = DecodeStateRecords(kv.key(), kv.value());
    if (!r.bad.empty() || r.states.size() != 1) {
      LOG(WARNING) << (r.bad.empty() ? absl::StrCat(kv.key(), ": not one record") : r.bad)
                   << ": the log ends there (" << records.size() << " good record(s) before it)";
      break;
    }
    records.push_back(std::move(r.states[0]));
  }
  records_read_ = static_cast<int>(records.size());
  ReplayStateRecords(absl::StrCat("etcd ", LogPrefix(keys_)), std::move(records), &state_);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EtcdStateStore>> EtcdStateStore::Open(
    Options options, std::optional<proto::MasterState>* state, EtcdStateReader* followed) {
  std::optional<EtcdStateReader> own;
  if (followed == nullptr) followed = &own.emplace(options.etcd, options.keys);
  // (Elected: nobody writes now; one read brings it up to date.)
  STRATA_RETURN_IF_ERROR(followed->Follow());
  *state = followed->state();
  std::unique_ptr<EtcdStateStore> store(new EtcdStateStore(std::move(options)));
  store->generation_ = followed->generation();
  if (state->has_value()) {
    store->seq_ = (*state)->record_seq();
    store->state_ = **state;
    STRATA_RETURN_IF_ERROR(store->WriteSnapshot());
  }
  return store;
}

absl::Status EtcdStateStore::Commit(std::vector<etcdserverpb::RequestOp> ops, int64_t* revision) {
  MasterLeadership* lead = options_.leadership;
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = lead->StillLeading();
  for (etcdserverpb::RequestOp& op : ops) *txn.add_success() = std::move(op);
  STRATA_ASSIGN_OR_RETURN(etcdserverpb::TxnResponse resp, options_.etcd->Txn(txn));
  if (!resp.succeeded()) {
    const std::string why =
        absl::StrCat("a state write found ", lead->leader_key(), " is no longer this master's (",
                     "revision ", lead->revision(), "): another master leads");
    lead->Deposed(why);
    return absl::FailedPreconditionError(why);
  }
  lead->Wrote(resp.header().revision());
  if (revision != nullptr) *revision = resp.header().revision();
  return absl::OkStatus();
}

absl::Status EtcdStateStore::WriteSnapshot() {
  const std::string keys = options_.keys;
  const std::string bytes = EncodeStateRecord(state_);
  // (The state's seq names its generation: each snapshot's is new.)
  const uint64_t gen = std::max(generation_ + 1, seq_);
  const std::string prefix = GenPrefix(keys, gen);
  uint32_t parts = 0;
  for (size_t off = 0; off < bytes.size() || parts == 0; off += options_.part_bytes) {
    std::vector<etcdserverpb::RequestOp> ops;
    // (A generation's number may have been used by a snapshot whose head
    // was never written, a leader's before: its parts go, the first
    // overwritten. etcd refuses a delete and a put of one key in one
    // transaction.)
    if (parts == 0) {
      ops.push_back(DeleteRange(absl::StrFormat("%s%06d", prefix, 1), PrefixRangeEnd(prefix)));
    }
    ops.push_back(
        Put(absl::StrFormat("%s%06d", prefix, parts++), bytes.substr(off, options_.part_bytes)));
    STRATA_RETURN_IF_ERROR(Commit(std::move(ops), nullptr));
  }
  proto::EtcdStateHead head;
  head.set_generation(gen);
  head.set_parts(parts);
  head.set_seq(seq_);
  // The head names the new snapshot; the log and every other snapshot
  // (an older one, or parts of one whose head was never written) go.
  std::vector<etcdserverpb::RequestOp> ops;
  ops.push_back(Put(HeadKey(keys), head.SerializeAsString()));
  ops.push_back(DeleteRange(LogPrefix(keys), PrefixRangeEnd(LogPrefix(keys))));
  ops.push_back(DeleteRange(SnapPrefix(keys), prefix));
  ops.push_back(DeleteRange(PrefixRangeEnd(prefix), PrefixRangeEnd(SnapPrefix(keys))));
  int64_t revision = 0;
  STRATA_RETURN_IF_ERROR(Commit(std::move(ops), &revision));
  generation_ = gen;
  snapshot_bytes_ = bytes.size();
  log_bytes_ = 0;
  // The history of what was replaced goes too (etcd keeps every revision
  // until compacted), unless etcd is compacted by its own policy
  // (cluster.etcd.compact false). Best effort: the next snapshot compacts
  // again.
  if (!options_.compact) return absl::OkStatus();
  if (absl::Status s = options_.etcd->Compact(revision); !s.ok()) {
    LOG(WARNING) << "compacting etcd at revision " << revision << ": " << s;
  }
  return absl::OkStatus();
}

absl::Status EtcdStateStore::Append(std::vector<proto::MasterState> records) {
  if (records.empty()) return absl::OkStatus();
  // (A record etcd would refuse alone: a snapshot instead, in parts.)
  PreparedRecords p = PrepareRecords(std::move(records), broken_, log_bytes_, snapshot_bytes_,
                                     options_.min_log_bytes, options_.txn_bytes, &seq_, &state_);
  absl::Status s;
  if (p.snapshot) {
    s = WriteSnapshot();
  } else {
    // As few transactions as etcd's limits allow (128 operations, 1.5 MiB).
    std::vector<etcdserverpb::RequestOp> ops;
    size_t in_txn = 0;
    for (size_t i = 0; i < p.encoded.size() && s.ok(); ++i) {
      in_txn += p.encoded[i].size();
      ops.push_back(Put(LogKey(options_.keys, p.first_seq + i), std::move(p.encoded[i])));
      const bool last = i + 1 == p.encoded.size();
      if (last || ops.size() >= 100 || in_txn + p.encoded[i + 1].size() > options_.txn_bytes) {
        s = Commit(std::move(ops), nullptr);
        ops.clear();
        in_txn = 0;
      }
    }
    if (s.ok()) log_bytes_ += p.bytes;
  }
  broken_ = !s.ok();
  return s;
}

}  // namespace strata::master
