// The master's side of checkpoints (docs/checkpoint-format.md): when to
// take one, the bsp cut, collecting every pserver's files into a manifest,
// retention, and finding and checking the checkpoint a job resumes from.
#include <algorithm>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/model_spec.h"
#include "common/proto_names.h"
#include "common/status_macros.h"
#include "common/threads.h"
#include "glog/logging.h"
#include "master/master_server.h"
#include "master/placement.h"
#include "storage/checkpoint_format.h"

namespace strata::master {
namespace {

// The tables this job's config makes, as a checkpoint records them.
std::vector<proto::CheckpointTable> ConfigTables(const JobConfig& config) {
  std::vector<proto::CheckpointTable> out;
  for (const proto::TableInfo& t :
       MakeTableInfos(ModelTables(config.model), static_cast<uint32_t>(config.sparse.partitions))) {
    proto::CheckpointTable c;
    c.set_name(t.name());
    *c.mutable_shape() = t.shape();
    c.set_sparse(t.sparse());
    c.set_dim(t.dim());
    c.set_partitions(t.partitions());
    out.push_back(std::move(c));
  }
  return out;
}

std::string Describe(const proto::CheckpointTable& t) {
  std::string shape;
  for (uint64_t d : t.shape()) absl::StrAppend(&shape, shape.empty() ? "" : "x", d);
  if (t.sparse())
    return absl::StrCat(t.name(), " (sparse, dim ", t.dim(), ", ", t.partitions(), " partitions)");
  return absl::StrCat(t.name(), " [", shape, "]");
}

// Every file of the manifest read back and its crc32c compared, so that a
// corrupt checkpoint is refused before any pserver loads from it.
absl::Status VerifyFiles(storage::FileSystem* fs, const std::string& root,
                         const proto::CheckpointManifest& m) {
  STRATA_RETURN_IF_ERROR(storage::CheckManifestFiles(fs, root, m));
  for (const auto& p : m.partitions()) {
    for (const auto& f : p.files()) {
      const std::string path = storage::JoinPath(root, f.path());
      STRATA_ASSIGN_OR_RETURN(std::string data, fs->ReadFile(path));
      const uint32_t crc = Crc32c(data);
      if (crc != f.crc32c()) {
        return absl::DataLossError(absl::StrFormat(
            "%s: checksum 0x%08x, the manifest says 0x%08x (corrupt)", path, crc, f.crc32c()));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MasterServer::CheckCheckpointFits(const MasterOptions& o, const std::string& root,
                                               const std::string& dir,
                                               const proto::CheckpointManifest& m) {
  const std::string manifest = storage::JoinPath(dir, storage::kManifestName);
  const JobConfig& c = o.config;
  if (!m.precision().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(manifest, ": an inference export in ", m.precision(),
                     " (parameters only, no optimizer state): a job cannot resume from it"));
  }
  if (m.job() != c.job.name) {
    return absl::FailedPreconditionError(absl::StrCat(manifest, ": a checkpoint of job '", m.job(),
                                                      "', not of this job '", c.job.name, "'"));
  }
  const std::vector<proto::CheckpointTable> want = ConfigTables(c);
  bool any_sparse = false, any_dense = false;
  for (size_t i = 0; i < want.size(); ++i) {
    any_sparse |= want[i].sparse();
    any_dense |= !want[i].sparse();
    if (i >= static_cast<size_t>(m.tables_size()) ||
        m.tables(i).SerializeAsString() != want[i].SerializeAsString()) {
      return absl::FailedPreconditionError(
          absl::StrCat(manifest, ": its model does not match the config's: table ", i, " is ",
                       i < static_cast<size_t>(m.tables_size()) ? Describe(m.tables(i)) : "missing",
                       " in the checkpoint, ", Describe(want[i]), " in the config"));
    }
  }
  if (static_cast<size_t>(m.tables_size()) != want.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        manifest, ": ", m.tables_size(), " tables, the config's model has ", want.size()));
  }
  if (any_dense && m.optimizer() != c.optimizer.type) {
    return absl::FailedPreconditionError(absl::StrCat(manifest, ": optimizer '", m.optimizer(),
                                                      "' in the checkpoint, '", c.optimizer.type,
                                                      "' in the config (optimizer.type)"));
  }
  if (any_sparse && m.sparse_optimizer() != c.sparse.optimizer.type) {
    return absl::FailedPreconditionError(absl::StrCat(
        manifest, ": sparse optimizer '", m.sparse_optimizer(), "' in the checkpoint, '",
        c.sparse.optimizer.type, "' in the config (sparse.optimizer.type)"));
  }
  if (any_dense && m.slice_bytes() != c.cluster.slice_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(manifest, ": dense partitions cut at ", m.slice_bytes(),
                     " bytes, the config says ", c.cluster.slice_bytes, " (cluster.slice_bytes)"));
  }
  return VerifyFiles(o.fs, root, m);
}

absl::StatusOr<std::optional<MasterServer::Resumed>> MasterServer::FindResumeCheckpoint(
    const MasterOptions& o) {
  if (o.resume.empty()) return std::optional<Resumed>();
  if (o.resume != "latest") {
    // One checkpoint, named: it is used or the job does not start.
    std::string dir = o.resume;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    STRATA_ASSIGN_OR_RETURN(proto::CheckpointManifest m, storage::ReadManifest(o.fs, dir));
    const std::string root = storage::ParentDir(dir);
    STRATA_RETURN_IF_ERROR(CheckCheckpointFits(o, root, dir, m));
    return std::optional<Resumed>(Resumed{root, std::move(m)});
  }
  if (!o.config.checkpoint.enabled) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.config.source, ": --resume latest needs a checkpoint section (checkpoint.dir)"));
  }
  const std::string& root = o.config.checkpoint.dir;
  STRATA_ASSIGN_OR_RETURN(std::vector<storage::CheckpointEntry> all,
                          storage::ListCheckpoints(o.fs, root));
  std::vector<std::string> refused;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete) {
      LOG(WARNING) << it->dir << ": no manifest (an unfinished checkpoint): skipped";
      continue;
    }
    absl::StatusOr<proto::CheckpointManifest> m = storage::ReadManifest(o.fs, it->dir);
    absl::Status s = m.ok() ? CheckCheckpointFits(o, root, it->dir, *m) : m.status();
    if (s.ok()) {
      if (!refused.empty()) {
        LOG(WARNING) << "resuming from " << it->dir << ", the newest good checkpoint";
      }
      return std::optional<Resumed>(Resumed{root, std::move(*m)});
    }
    LOG(ERROR) << "checkpoint refused: " << s.message();
    refused.push_back(std::string(s.message()));
  }
  if (!refused.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable checkpoint under ", root, ": ", absl::StrJoin(refused, "; ")));
  }
  LOG(INFO) << "--resume latest: no checkpoint under " << root << " yet; starting afresh";
  return std::optional<Resumed>();
}

absl::Status MasterServer::ApplyResume(const Resumed& r) {
  absl::MutexLock l(&mu_);
  const proto::CheckpointManifest& m = r.manifest;
  std::vector<uint64_t> done(m.tasks_done().begin(), m.tasks_done().end());
  std::vector<std::pair<uint64_t, int64_t>> partial;
  for (const auto& t : m.tasks_partial()) partial.emplace_back(t.id(), t.trained_records());
  STRATA_RETURN_IF_ERROR(tasks_.Resume(done, partial));
  restore_ = r;
  if (r.root == options_.config.checkpoint.dir) {
    // The next checkpoints build on it (their chains name its files).
    last_manifest_ = m;
    int chain = 0;
    for (const auto& p : m.partitions()) chain = std::max(chain, p.files_size() - 1);
    increments_since_full_ = chain;
  }
  resumed_from_seq_ = m.seq();
  samples_base_ = m.samples();
  next_node_id_ = std::max(next_node_id_, m.next_node_id());
  max_last_step_ = m.step() > 0 ? m.step() - 1 : 0;
  LOG(INFO) << "resuming from checkpoint " << m.seq() << " (" << m.reason() << ", step " << m.step()
            << "): " << tasks_.done() << " of " << tasks_.total() << " data tasks done, "
            << partial.size() << " partly";
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> MasterServer::NewestVersion(const std::vector<PServerTarget>& targets) {
  uint64_t newest = 0;
  for (const auto& [id, stub] : targets) {
    proto::PServerStatusResponse st;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    STRATA_RETURN_IF_ERROR(FromGrpcStatus(stub->GetStatus(&ctx, proto::PServerStatusRequest(), &st),
                                          absl::StrCat("pserver node ", id)));
    for (const auto& p : st.partitions()) newest = std::max(newest, p.version());
  }
  return newest;
}

std::vector<MasterServer::PServerTarget> MasterServer::OwnersLocked() {
  std::set<uint32_t> owners;
  for (const auto& p : view_.partitions()) owners.insert(p.owner());
  std::vector<PServerTarget> targets;
  for (uint32_t id : owners) targets.emplace_back(id, pserver_stubs_[id].get());
  return targets;
}

bool MasterServer::CheckpointAndStopWithin(absl::Duration grace) {
  LOG(INFO) << "SIGTERM: checkpointing before stopping (grace " << absl::FormatDuration(grace)
            << ")";
  // The checkpoint runs on a thread of its own, which outlives this call
  // when it takes too long (the caller then exits the process).
  auto done = std::make_shared<absl::Notification>();
  std::thread([this, done] {
    auto r = Checkpoint("sigterm on master", /*stop_after=*/true);
    if (!r.ok()) LOG(WARNING) << "no checkpoint before stopping: " << r.status();
    done->Notify();
  }).detach();
  return done->WaitForNotificationWithTimeout(grace);
}

absl::StatusOr<proto::StopResponse> MasterServer::Stop(const std::string& reason,
                                                       bool no_checkpoint) {
  bool checkpoint = false;
  {
    absl::MutexLock l(&mu_);
    if (IsJobOver(job_state_)) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat("the job has already ended: it ",
                                                                   JobStateName(job_state_))),
                        proto::REASON_JOB_NOT_RUNNING);
    }
    checkpoint = options_.config.checkpoint.enabled && !no_checkpoint && placed_ && view_.ready();
  }
  proto::StopResponse resp;
  if (checkpoint) {
    absl::StatusOr<proto::CheckpointResponse> c = Checkpoint(reason, /*stop_after=*/true);
    if (!c.ok()) {
      return absl::Status(
          c.status().code(),
          absl::StrCat("not stopped: the checkpoint before the stop failed (", c.status().message(),
                       "); the job goes on (stop without one: no_checkpoint)"));
    }
    resp.set_checkpointed(true);
    *resp.mutable_checkpoint() = std::move(*c);
    return resp;
  }
  absl::MutexLock l(&mu_);
  if (!IsJobOver(job_state_)) {
    FinishJobLocked(proto::JOB_STOPPED, absl::StrCat("stopped on request (", reason, ")"));
  }
  return resp;
}

namespace {

// What a checkpoint's manifest says of the job, before its partitions.
proto::CheckpointManifest ManifestHeader(const JobConfig& config, uint64_t seq,
                                         const std::string& reason, uint64_t step,
                                         uint64_t cluster_epoch) {
  proto::CheckpointManifest m;
  m.set_format_version(storage::kCheckpointFormatVersion);
  m.set_job(config.job.name);
  m.set_seq(seq);
  m.set_consistency(ConsistencyName(config.job.consistency));
  m.set_step(step);
  m.set_cluster_epoch(cluster_epoch);
  m.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  m.set_reason(reason);
  for (auto& t : ConfigTables(config)) *m.add_tables() = std::move(t);
  m.set_optimizer(config.optimizer.type);
  m.set_sparse_optimizer(config.sparse.optimizer.type);
  m.set_slice_bytes(config.cluster.slice_bytes);
  return m;
}

}  // namespace

absl::StatusOr<proto::CheckpointResponse> MasterServer::Checkpoint(const std::string& reason,
                                                                   bool stop_after) {
  absl::MutexLock cl(&checkpoint_mu_);
  const CheckpointSection& cfg = options_.config.checkpoint;
  const bool bsp = options_.config.job.consistency == Consistency::kBsp;
  std::vector<PServerTarget> targets;
  proto::ClusterView view;
  uint64_t seq = 0, base_seq = 0;
  bool training_over = false;
  {
    absl::MutexLock l(&mu_);
    if (!cfg.enabled) {
      return absl::FailedPreconditionError(
          "checkpoints are off: the job's config has no checkpoint section");
    }
    if (!placed_ || !view_.ready() || IsJobOver(job_state_)) {
      return WithReason(absl::FailedPreconditionError(
                            absl::StrCat("no checkpoint: the job is ", JobStateName(job_state_),
                                         placed_ ? "" : " (partitions not placed)")),
                        proto::REASON_JOB_NOT_RUNNING);
    }
    view = view_;
    targets = OwnersLocked();
    seq = next_checkpoint_seq_++;
    if (cfg.incremental && last_manifest_.has_value() &&
        increments_since_full_ + 1 < cfg.full_every) {
      base_seq = last_manifest_->seq();
    }
    training_over = job_state_ == proto::JOB_EVALUATING;
    checkpoint_op_ = LongOp{seq, 0, static_cast<int>(targets.size()), 0, clock_->Now()};
  }
  // (No checkpoint in progress once this returns, however it returns.)
  struct EndOp {
    MasterServer* m;
    ~EndOp() {
      absl::MutexLock l(&m->mu_);
      m->checkpoint_op_ = LongOp();
    }
  } end_op{this};
  const absl::Time start = absl::Now();
  const std::string dir = storage::JoinPath(cfg.dir, storage::CheckpointDirName(seq));
  auto fail = [&](const absl::Status& s) -> absl::Status {
    // The partial directory is garbage: no manifest, so no checkpoint.
    if (absl::Status d = options_.fs->DeleteRecursively(dir); !d.ok()) {
      LOG(WARNING) << "cannot remove " << dir << ": " << d;
    }
    absl::MutexLock l(&mu_);
    ++checkpoint_failures_;
    last_checkpoint_time_ = clock_->Now();  // not again at once
    LOG(ERROR) << "checkpoint " << seq << " (" << reason << ") failed: " << s
               << "; the previous checkpoint stays the latest";
    sink_->Event("checkpoint_failed",
                 absl::StrCat("checkpoint ", seq, " (", reason, ") failed: ", s.message()));
    return s;
  };

  proto::CheckpointPartitionsRequest req;
  req.set_job(options_.config.job.name);
  req.set_seq(seq);
  req.set_base_seq(base_seq);
  req.set_root(cfg.dir);
  req.set_zstd_level(cfg.compression_level);
  req.set_timeout_ms(static_cast<int64_t>(cfg.timeout_seconds) * 1000);
  absl::StatusOr<std::vector<proto::CheckpointPartitionsResponse>> results =
      WriteCheckpointPartitions(targets, training_over, &req);
  if (!results.ok()) return fail(results.status());

  // The manifest: each partition's new file on top of its chain.
  proto::CheckpointManifest m =
      ManifestHeader(options_.config, seq, reason, bsp ? req.version() : 0, view.epoch());
  std::map<uint32_t, proto::CheckpointPartition> got;
  double stall = 0;
  uint64_t written = 0;
  for (auto& r : *results) {
    stall = std::max(stall, r.max_stall_seconds());
    written += r.bytes_written();
    for (auto& p : *r.mutable_partitions()) got[p.id()] = std::move(p);
  }
  absl::Status merged;
  {
    absl::MutexLock l(&mu_);
    merged = FillManifestLocked(view, base_seq,
                                bsp ? std::optional<uint64_t>(req.version()) : std::nullopt,
                                std::move(got), &m);
  }
  if (!merged.ok()) return fail(merged);
  m.set_bytes_written(written);
  m.set_max_stall_seconds(stall);
  m.set_write_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  HitFailpoint(options_.failpoints, "master.checkpoint.before_manifest");
  if (absl::Status s = storage::WriteManifest(options_.fs, dir, m); !s.ok()) return fail(s);
  HitFailpoint(options_.failpoints, "master.checkpoint.after_manifest");

  auto deleted = storage::ApplyRetention(options_.fs, cfg.dir, cfg.keep_last);
  if (!deleted.ok()) {
    LOG(WARNING) << "checkpoint retention under " << cfg.dir << ": " << deleted.status();
  } else {
    for (const auto& d : *deleted) VLOG(1) << "retention: removed " << d;
  }
  HitFailpoint(options_.failpoints, "master.checkpoint.after_retention");
  proto::CheckpointResponse resp;
  resp.set_seq(seq);
  resp.set_dir(dir);
  resp.set_step(m.step());
  resp.set_incremental(m.incremental());
  resp.set_bytes_written(written);
  resp.set_write_seconds(m.write_seconds());
  if (checkpoint_seconds_ != nullptr) {
    checkpoint_seconds_->Observe(m.write_seconds());
    checkpoint_bytes_->Observe(static_cast<double>(written));
  }
  absl::MutexLock l(&mu_);
  CheckpointDoneLocked(reason, dir, std::move(m));
  if (stop_after && !IsJobOver(job_state_)) {
    FinishJobLocked(proto::JOB_STOPPED,
                    absl::StrCat("stopped after checkpoint ", seq, " (", reason, ")"));
  }
  return resp;
}

std::vector<absl::StatusOr<proto::CheckpointPartitionsResponse>> MasterServer::CheckpointCalls(
    const std::vector<PServerTarget>& targets, const proto::CheckpointPartitionsRequest& req) {
  std::vector<absl::StatusOr<proto::CheckpointPartitionsResponse>> results(
      targets.size(), absl::UnknownError("no answer"));
  {
    absl::MutexLock l(&mu_);  // (a retry starts over)
    checkpoint_op_.done = 0;
    checkpoint_op_.bytes = 0;
  }
  const int timeout_seconds = options_.config.checkpoint.timeout_seconds;
  std::vector<std::thread> calls;
  for (size_t i = 0; i < targets.size(); ++i) {
    auto call = [&, i] {
      proto::CheckpointPartitionsResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(timeout_seconds + 5)));
      {
        absl::MutexLock il(&inflight_mu_);
        if (stopping_) {
          results[i] = absl::CancelledError("the master is shutting down");
          return;
        }
        inflight_.insert(&ctx);
      }
      absl::Status s = FromGrpcStatus(targets[i].second->CheckpointPartitions(&ctx, req, &resp),
                                      absl::StrCat("pserver node ", targets[i].first));
      {
        absl::MutexLock il(&inflight_mu_);
        inflight_.erase(&ctx);
      }
      if (s.ok()) {
        absl::MutexLock l(&mu_);
        ++checkpoint_op_.done;
        checkpoint_op_.bytes += resp.bytes_written();
      }
      if (s.ok()) {
        results[i] = std::move(resp);
      } else {
        results[i] = s;
      }
    };
    if (!TryAddThread(&calls, call)) call();
  }
  for (auto& t : calls) t.join();
  return results;
}

absl::StatusOr<std::vector<proto::CheckpointPartitionsResponse>>
MasterServer::WriteCheckpointPartitions(const std::vector<PServerTarget>& targets,
                                        bool training_over,
                                        proto::CheckpointPartitionsRequest* req) {
  const bool bsp = options_.config.job.consistency == Consistency::kBsp;
  // Steps ahead of the newest version for the bsp cut: training goes on
  // while partitions wait for it, so a wide margin costs nothing, and one
  // too narrow (a fast job passing the cut before it is set) a retry.
  uint64_t margin = 16;
  for (int attempt = 0;; ++attempt) {
    if (stop_.HasBeenNotified()) return absl::CancelledError("the master is shutting down");
    if (bsp) {
      // The cut: `margin` steps after the newest version now; once training
      // is over, the newest (a partition still applying the last step
      // reaches it by itself).
      STRATA_ASSIGN_OR_RETURN(uint64_t newest, NewestVersion(targets));
      req->set_at_version(true);
      req->set_version(training_over ? newest : newest + margin);
    }
    std::vector<absl::StatusOr<proto::CheckpointPartitionsResponse>> results =
        CheckpointCalls(targets, *req);
    bool past_cut = false, cancelled = false, busy = false;
    absl::Status first_error;
    for (const auto& r : results) {
      if (r.ok()) continue;
      past_cut |= HasReason(r.status(), proto::REASON_CUT_PASSED);
      // A pserver still finishing an earlier attempt: try again shortly.
      busy |= HasReason(r.status(), proto::REASON_CHECKPOINT_BUSY);
      cancelled |= absl::IsCancelled(r.status());
      if (first_error.ok()) first_error = r.status();
    }
    if (first_error.ok()) {
      std::vector<proto::CheckpointPartitionsResponse> out;
      for (auto& r : results) out.push_back(*std::move(r));
      return out;
    }
    if (busy && attempt < 3) {
      stop_.WaitForNotificationWithTimeout(absl::Seconds(1));
      continue;
    }
    if (cancelled && bsp && !training_over && attempt < 3) {
      // Training ended before reaching the cut: set it where it stopped.
      absl::MutexLock l(&mu_);
      training_over = job_state_ == proto::JOB_EVALUATING;
      if (training_over) continue;
    }
    if (!past_cut || attempt == 3) return first_error;
    // Training outran the cut while it was being set: aim further ahead.
    margin *= 4;
    VLOG(1) << "checkpoint " << req->seq() << ": training passed the cut; again " << margin
            << " steps ahead";
  }
}

absl::Status MasterServer::FillManifestLocked(const proto::ClusterView& view, uint64_t base_seq,
                                              std::optional<uint64_t> cut_step,
                                              std::map<uint32_t, proto::CheckpointPartition> got,
                                              proto::CheckpointManifest* m) {
  std::map<uint32_t, const proto::CheckpointPartition*> previous;
  if (last_manifest_.has_value()) {
    for (const auto& p : last_manifest_->partitions()) previous[p.id()] = &p;
  }
  bool incremental = false;
  for (const proto::PartitionInfo& info : view.partitions()) {
    auto it = got.find(info.id());
    if (it == got.end()) {
      return absl::InternalError(absl::StrCat("no pserver wrote partition ", info.id()));
    }
    proto::CheckpointPartition entry = std::move(it->second);
    auto prev = previous.find(info.id());
    const bool has_new = entry.files_size() > 0;
    if (!has_new || !entry.files(0).full()) {
      if (prev == previous.end() || base_seq == 0) {
        return absl::InternalError(absl::StrCat("partition ", info.id(), " wrote ",
                                                has_new ? "a delta" : "nothing",
                                                " with no previous checkpoint to build on"));
      }
      incremental = true;
      proto::CheckpointPartition chained = *prev->second;
      chained.set_version(entry.version());
      chained.set_rows(entry.rows());
      chained.set_raw_bytes(entry.raw_bytes());
      for (const auto& f : entry.files()) *chained.add_files() = f;
      entry = std::move(chained);
    }
    entry.set_table_id(info.table_id());
    entry.set_offset(info.offset());
    entry.set_length(info.length());
    m->set_raw_bytes(m->raw_bytes() + entry.raw_bytes());
    *m->add_partitions() = std::move(entry);
  }
  m->set_incremental(incremental);
  m->set_base_seq(incremental ? base_seq : 0);
  const TaskScheduler::Cut cut = tasks_.CutAt(cut_step, options_.config.job.batch_size);
  for (uint64_t id : cut.done) m->add_tasks_done(id);
  for (const auto& [id, records] : cut.partial) {
    proto::CheckpointTask* t = m->add_tasks_partial();
    t->set_id(id);
    t->set_trained_records(records);
  }
  // The samples in the parameters at the cut: the records of the tasks
  // done and of the parts trained.
  uint64_t samples = 0;
  for (uint64_t id : cut.done) samples += tasks_.RecordsOf(id);
  for (const auto& [id, records] : cut.partial) samples += records;
  m->set_samples(samples);
  m->set_next_node_id(next_node_id_);
  return absl::OkStatus();
}

void MasterServer::CheckpointDoneLocked(const std::string& reason, const std::string& dir,
                                        proto::CheckpointManifest m) {
  const uint64_t written = m.bytes_written();
  const double stall = m.max_stall_seconds();
  increments_since_full_ = m.incremental() ? increments_since_full_ + 1 : 0;
  ++checkpoints_done_;
  checkpoint_bytes_total_ += written;
  checkpoint_raw_bytes_ = m.raw_bytes();
  checkpoint_raw_total_ += m.raw_bytes();
  checkpoint_max_stall_ = std::max(checkpoint_max_stall_, stall);
  checkpoint_seconds_total_ += m.write_seconds();
  last_checkpoint_time_ = clock_->Now();
  const bool bsp = options_.config.job.consistency == Consistency::kBsp;
  LOG(INFO) << absl::StrFormat(
      "checkpoint %d (%s%s) at %s: %.2f MB written, %.2f MB raw state, in %.2f s; longest "
      "stall %.2f ms; %s",
      m.seq(), reason,
      m.incremental() ? absl::StrCat(", incremental over ", m.base_seq()) : ", full",
      bsp ? absl::StrCat("step ", m.step()) : "the partitions' own versions", written / 1e6,
      m.raw_bytes() / 1e6, m.write_seconds(), stall * 1e3, dir);
  sink_->Event("checkpoint",
               absl::StrFormat("checkpoint %d (%s%s) at step %d: %d bytes in %.3f s: %s", m.seq(),
                               reason, m.incremental() ? ", incremental" : ", full", m.step(),
                               written, m.write_seconds(), dir));
  last_manifest_ = std::move(m);
}

void MasterServer::CheckpointLoop() {
  const CheckpointSection& cfg = options_.config.checkpoint;
  // By steps, the pservers are asked often: a fast job does hundreds of
  // steps a second.
  const absl::Duration tick = absl::Milliseconds(cfg.every_steps > 0 ? 20 : 200);
  while (!stop_.WaitForNotificationWithTimeout(tick)) {
    std::string reason;
    // The step now: the newest partition version (bsp: the step; asp: the
    // updates of the busiest partition), asked of the pservers.
    uint64_t step = 0;
    if (cfg.every_steps > 0) {
      std::vector<PServerTarget> targets;
      {
        absl::MutexLock l(&mu_);
        if (placed_ && job_state_ == proto::JOB_RUNNING) targets = OwnersLocked();
      }
      if (!targets.empty()) {
        absl::StatusOr<uint64_t> newest = NewestVersion(targets);
        if (newest.ok()) step = *newest;
      }
    }
    {
      absl::MutexLock l(&mu_);
      if (!placed_ || !view_.ready() || IsJobOver(job_state_)) continue;
      const absl::Time now = clock_->Now();
      if (last_checkpoint_time_ == absl::InfinitePast()) last_checkpoint_time_ = now;
      if (next_step_trigger_ == 0 && cfg.every_steps > 0) {
        next_step_trigger_ = (step / cfg.every_steps + 1) * cfg.every_steps;
      }
      if (final_checkpoint_pending_) {
        reason = "final";
      } else if (job_state_ == proto::JOB_RUNNING) {
        if (cfg.every_steps > 0 && step >= next_step_trigger_) {
          reason = "steps";
          next_step_trigger_ = (step / cfg.every_steps + 1) * cfg.every_steps;
        } else if (cfg.every_seconds > 0 &&
                   now - last_checkpoint_time_ >= absl::Seconds(cfg.every_seconds)) {
          reason = "interval";
        }
      }
    }
    if (reason.empty()) continue;
    auto r = Checkpoint(reason, /*stop_after=*/false);
    if (reason == "final") {
      absl::MutexLock l(&mu_);
      final_checkpoint_pending_ = false;
      final_checkpoint_done_ = true;
      UpdateJobStateLocked();
    }
  }
}

}  // namespace strata::master
