#include "master/checkpoint_coordinator.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <utility>

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
#include "master/placement.h"
#include "storage/checkpoint_format.h"
#include "storage/ring_checkpoint.h"

namespace strata::master {
namespace {

// A table as a checkpoint records it.
proto::CheckpointTable CheckpointTableOf(const proto::TableInfo& t) {
  proto::CheckpointTable c;
  c.set_name(t.name());
  *c.mutable_shape() = t.shape();
  c.set_sparse(t.sparse());
  c.set_dim(t.dim());
  c.set_partitions(t.partitions());
  c.set_allreduce(t.allreduce());
  return c;
}

// The floats of the tables kept by the workers' ring (allreduce).
uint64_t RingFloats(const JobConfig& config) {
  uint64_t n = 0;
  for (const TableSpec& t : ModelTables(config.model)) {
    if (t.allreduce) n += t.num_elements();
  }
  return n;
}

// The tables this job's config makes, as a checkpoint records them.
std::vector<proto::CheckpointTable> ConfigTables(const JobConfig& config) {
  std::vector<proto::CheckpointTable> out;
  for (const proto::TableInfo& t :
       MakeTableInfos(ModelTables(config.model), static_cast<uint32_t>(config.sparse.partitions))) {
    out.push_back(CheckpointTableOf(t));
  }
  return out;
}

std::string Describe(const proto::CheckpointTable& t) {
  std::string shape;
  for (uint64_t d : t.shape()) absl::StrAppend(&shape, shape.empty() ? "" : "x", d);
  if (t.sparse())
    return absl::StrCat(t.name(), " (sparse, dim ", t.dim(), ", ", t.partitions(), " partitions)");
  return absl::StrCat(t.name(), " [", shape, "]",
                      t.allreduce() ? " (allreduce among the workers)" : " (on the pservers)");
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

// Why `m` (read from `dir`, under `root`) cannot resume a job of `c`, or OK.
absl::Status CheckCheckpointFits(const JobConfig& c, storage::FileSystem* fs,
                                 const std::string& root, const std::string& dir,
                                 const proto::CheckpointManifest& m) {
  const std::string manifest = storage::JoinPath(dir, storage::kManifestName);
  if (!m.precision().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(manifest, ": an inference export in ", m.precision(),
                     " (parameters only, no optimizer state): a job cannot resume from it"));
  }
  if (m.job() != c.job.name) {
    return absl::FailedPreconditionError(absl::StrCat(manifest, ": a checkpoint of job '", m.job(),
                                                      "', not of this job '", c.job.name, "'"));
  }
  // (Tables a training script declares are the checkpoint's: the
  // workers' declarations are checked against them.)
  const bool declared = ScriptDeclaresTables(c.model);
  if (declared && m.tables().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(manifest, ": no tables in the checkpoint to resume the script's from"));
  }
  const std::vector<proto::CheckpointTable> want =
      declared ? std::vector<proto::CheckpointTable>(m.tables().begin(), m.tables().end())
               : ConfigTables(c);
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
  const uint64_t ring = RingFloats(c);
  if (ring != m.ring_floats() || (ring > 0 && m.ring_shards().empty())) {
    return absl::FailedPreconditionError(absl::StrCat(
        manifest, ": ", m.ring_floats(), " floats of allreduce tables (", m.ring_shards_size(),
        " ring shards), the config's model has ", ring, " (model.dense_sync)"));
  }
  STRATA_RETURN_IF_ERROR(VerifyFiles(fs, root, m));
  if (ring > 0) {
    // Every shard read and checked, and that they fit together.
    const std::vector<proto::CheckpointRingShard> shards(m.ring_shards().begin(),
                                                         m.ring_shards().end());
    STRATA_RETURN_IF_ERROR(
        storage::ReadRingState(fs, root, shards, ring, m.job(), c.optimizer.type).status());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<ResumePoint>> FindResumeCheckpoint(const JobConfig& config,
                                                                storage::FileSystem* fs,
                                                                const std::string& resume) {
  using Resumed = ResumePoint;
  if (resume.empty()) return std::optional<Resumed>();
  if (resume != "latest") {
    // One checkpoint, named: it is used or the job does not start.
    std::string dir = resume;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    STRATA_ASSIGN_OR_RETURN(proto::CheckpointManifest m, storage::ReadManifest(fs, dir));
    const std::string root = storage::ParentDir(dir);
    STRATA_RETURN_IF_ERROR(CheckCheckpointFits(config, fs, root, dir, m));
    return std::optional<Resumed>(Resumed{root, std::move(m)});
  }
  if (!config.checkpoint.enabled) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": --resume latest needs a checkpoint section (checkpoint.dir)"));
  }
  const std::string& root = config.checkpoint.dir;
  STRATA_ASSIGN_OR_RETURN(std::vector<storage::CheckpointEntry> all,
                          storage::ListCheckpoints(fs, root));
  std::vector<std::string> refused;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete) {
      LOG(WARNING) << it->dir << ": no manifest (an unfinished checkpoint): skipped";
      continue;
    }
    absl::StatusOr<proto::CheckpointManifest> m = storage::ReadManifest(fs, it->dir);
    absl::Status s = m.ok() ? CheckCheckpointFits(config, fs, root, it->dir, *m) : m.status();
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

absl::StatusOr<CheckpointStart> FindCheckpointStart(const JobConfig& config,
                                                    storage::FileSystem* fs,
                                                    const std::string& resume, bool restarted) {
  CheckpointStart start;
  if (restarted && config.checkpoint.enabled) {
    // Its last checkpoint is the base of the next (and what a lost
    // partition is restored from).
    STRATA_ASSIGN_OR_RETURN(start.resumed, FindResumeCheckpoint(config, fs, "latest"));
  } else if (!restarted) {
    STRATA_ASSIGN_OR_RETURN(start.resumed, FindResumeCheckpoint(config, fs, resume));
  }
  if (config.checkpoint.enabled) {
    STRATA_ASSIGN_OR_RETURN(auto existing, storage::ListCheckpoints(fs, config.checkpoint.dir));
    if (!existing.empty()) start.next_seq = existing.back().seq + 1;
  }
  return start;
}

namespace {

// What a checkpoint's manifest says of the job, before its partitions.
proto::CheckpointManifest ManifestHeader(const JobConfig& config, uint64_t seq,
                                         const std::string& reason, uint64_t step,
                                         const proto::ClusterView& view) {
  const uint64_t cluster_epoch = view.epoch();
  proto::CheckpointManifest m;
  m.set_format_version(storage::kCheckpointFormatVersion);
  m.set_job(config.job.name);
  m.set_seq(seq);
  m.set_consistency(ConsistencyName(config.job.consistency));
  m.set_step(step);
  m.set_cluster_epoch(cluster_epoch);
  m.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  m.set_reason(reason);
  for (const proto::TableInfo& t : view.tables()) *m.add_tables() = CheckpointTableOf(t);
  m.set_optimizer(config.optimizer.type);
  m.set_sparse_optimizer(config.sparse.optimizer.type);
  m.set_slice_bytes(config.cluster.slice_bytes);
  return m;
}

}  // namespace

CheckpointCoordinator::CheckpointCoordinator(Options options, Master* master)
    : options_(std::move(options)),
      cfg_(options_.config.checkpoint),
      ring_floats_(RingFloats(options_.config)),
      clock_(options_.clock),
      master_(master) {}

CheckpointCoordinator::~CheckpointCoordinator() { Shutdown(); }

void CheckpointCoordinator::Start() {
  if (!cfg_.enabled || thread_.joinable()) return;
  thread_ = std::thread([this] {
    // By steps, the pservers are asked often: a fast job does hundreds of
    // steps a second.
    const absl::Duration tick = absl::Milliseconds(cfg_.every_steps > 0 ? 20 : 200);
    while (!stop_.WaitForNotificationWithTimeout(tick)) Tick();
  });
}

void CheckpointCoordinator::Shutdown() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  {
    // A checkpoint waiting on pservers gives up now.
    absl::MutexLock il(&inflight_mu_);
    stopping_ = true;
    for (grpc::ClientContext* ctx : inflight_) ctx->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<proto::CheckpointResponse> CheckpointCoordinator::Checkpoint(
    const std::string& reason, bool stop_after) {
  absl::MutexLock run(&run_mu_);
  if (!cfg_.enabled) {
    return absl::FailedPreconditionError(
        "checkpoints are off: the job's config has no checkpoint section");
  }
  const bool bsp = options_.config.job.consistency == Consistency::kBsp;
  // (Read first: training that ends after the cluster was read, before a
  // call waiting for a cut is made, is told by this count.)
  const uint64_t trainings_done = this->trainings_done();
  Master::Cluster cluster = master_->CheckpointCluster(/*with_view=*/true);
  if (!cluster.ready) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat("no checkpoint: ", cluster.why_not)),
        proto::REASON_JOB_NOT_RUNNING);
  }
  if (ring_floats_ > 0 && cluster.evaluating) return NoRingWhileEvaluating();
  uint64_t seq = 0, base_seq = 0;
  {
    absl::MutexLock l(&mu_);
    seq = next_seq_++;
    if (cfg_.incremental && last_manifest_.has_value() &&
        increments_since_full_ + 1 < cfg_.full_every) {
      base_seq = last_manifest_->seq();
    }
    progress_ = Progress{seq, 0, static_cast<int>(cluster.owners.size()), 0, clock_->Now()};
  }
  // (No checkpoint in progress once this returns, however it returns.)
  struct EndProgress {
    CheckpointCoordinator* c;
    ~EndProgress() {
      absl::MutexLock l(&c->mu_);
      c->progress_ = Progress();
    }
  } end_progress{this};
  const absl::Time start = absl::Now();
  const std::string dir = storage::JoinPath(cfg_.dir, storage::CheckpointDirName(seq));

  proto::CheckpointPartitionsRequest req;
  req.set_job(options_.config.job.name);
  req.set_seq(seq);
  req.set_base_seq(base_seq);
  req.set_root(cfg_.dir);
  req.set_zstd_level(cfg_.compression_level);
  req.set_timeout_ms(static_cast<int64_t>(cfg_.timeout_seconds) * 1000);
  std::vector<proto::RingCheckpointReport> ring;
  absl::StatusOr<std::vector<proto::CheckpointPartitionsResponse>> results =
      WriteCheckpointPartitions(cluster.owners, cluster.training_over, trainings_done, &req, &ring);
  if (!results.ok()) return Failed(seq, reason, dir, results.status());

  // The manifest: each partition's new file on top of its chain; the
  // ring's shards. (A job with no partitions: its step is the ring's.)
  uint64_t cut_step = bsp ? req.version() : 0;
  if (!ring.empty() && cluster.owners.empty()) cut_step = ring.front().step() + 1;
  proto::CheckpointManifest m =
      ManifestHeader(options_.config, seq, reason, cut_step, cluster.view);
  if (!ring.empty()) {
    m.set_ring_floats(ring_floats_);
    m.set_ring_step(ring.front().step());
    m.set_ring_updates(ring.front().updates());
    for (const auto& r : ring) {
      *m.add_ring_shards() = r.shard();
      m.set_raw_bytes(m.raw_bytes() + r.shard().file().raw_bytes());
    }
  }
  std::map<uint32_t, proto::CheckpointPartition> got;
  double stall = 0;
  uint64_t written = 0;
  for (auto& r : *results) {
    stall = std::max(stall, r.max_stall_seconds());
    written += r.bytes_written();
    for (auto& p : *r.mutable_partitions()) got[p.id()] = std::move(p);
  }
  for (const auto& r : ring) written += r.shard().file().size();
  if (absl::Status s = ChainPartitions(cluster.view, base_seq, std::move(got), &m); !s.ok()) {
    return Failed(seq, reason, dir, s);
  }
  master_->FillManifestTasks(bsp ? std::optional<uint64_t>(cut_step) : std::nullopt, &m);
  m.set_bytes_written(written);
  m.set_max_stall_seconds(stall);
  m.set_write_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  HitFailpoint(options_.failpoints, "master.checkpoint.before_manifest");
  if (absl::Status s = storage::WriteManifest(options_.fs, dir, m); !s.ok()) {
    return Failed(seq, reason, dir, s);
  }
  HitFailpoint(options_.failpoints, "master.checkpoint.after_manifest");

  auto deleted = storage::ApplyRetention(options_.fs, cfg_.dir, cfg_.keep_last);
  if (!deleted.ok()) {
    LOG(WARNING) << "checkpoint retention under " << cfg_.dir << ": " << deleted.status();
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
  if (seconds_histogram_ != nullptr) {
    seconds_histogram_->Observe(m.write_seconds());
    bytes_histogram_->Observe(static_cast<double>(written));
  }
  Done(reason, dir, std::move(m));
  if (stop_after) master_->StopAfterCheckpoint(seq, reason);
  return resp;
}

absl::Status CheckpointCoordinator::Failed(uint64_t seq, const std::string& reason,
                                           const std::string& dir, const absl::Status& why) {
  // The partial directory is garbage: no manifest, so no checkpoint.
  if (absl::Status d = options_.fs->DeleteRecursively(dir); !d.ok()) {
    LOG(WARNING) << "cannot remove " << dir << ": " << d;
  }
  {
    absl::MutexLock l(&mu_);
    ++failures_;
    last_time_ = clock_->Now();  // not again at once
  }
  LOG(ERROR) << "checkpoint " << seq << " (" << reason << ") failed: " << why
             << "; the previous checkpoint stays the latest";
  options_.sink->Event("checkpoint_failed",
                       absl::StrCat("checkpoint ", seq, " (", reason, ") failed: ", why.message()));
  return why;
}

std::vector<absl::StatusOr<proto::CheckpointPartitionsResponse>>
CheckpointCoordinator::CheckpointCalls(const std::vector<PServerTarget>& targets,
                                       const proto::CheckpointPartitionsRequest& req,
                                       std::optional<uint64_t> trainings_done) {
  std::vector<absl::StatusOr<proto::CheckpointPartitionsResponse>> results(
      targets.size(), absl::UnknownError("no answer"));
  {
    absl::MutexLock l(&mu_);  // (a retry starts over)
    progress_.done = 0;
    progress_.bytes = 0;
  }
  const int timeout_seconds = cfg_.timeout_seconds;
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
        if (trainings_done.has_value() && *trainings_done != trainings_done_) {
          // Training ended after the cut was set: the cut may never be
          // reached, and the TrainingDone that cancels waiting calls came
          // before this one.
          results[i] = absl::CancelledError(absl::StrCat(
              "checkpoint ", req.seq(), ": training ended before the call for its cut was made"));
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
        ++progress_.done;
        progress_.bytes += resp.bytes_written();
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
CheckpointCoordinator::WriteCheckpointPartitions(const std::vector<PServerTarget>& targets,
                                                 bool training_over, uint64_t trainings_done,
                                                 proto::CheckpointPartitionsRequest* req,
                                                 std::vector<proto::RingCheckpointReport>* ring) {
  const bool bsp = options_.config.job.consistency == Consistency::kBsp;
  // Steps ahead of the newest version for the bsp cut: training goes on
  // while partitions wait for it, so a wide margin costs nothing, and one
  // too narrow (a fast job passing the cut before it is set) a retry.
  uint64_t margin = 16;
  uint64_t ring_cut = 0;
  for (int attempt = 0;; ++attempt) {
    if (stop_.HasBeenNotified()) return absl::CancelledError("the master is shutting down");
    if (bsp) {
      // The cut: `margin` steps after the newest version now; once training
      // is over, the newest (a partition still applying the last step
      // reaches it by itself).
      uint64_t newest = 0, ring_newest = 0;
      if (!targets.empty()) {
        STRATA_ASSIGN_OR_RETURN(newest, NewestPartitionVersion(targets));
      }
      if (ring_floats_ > 0) {
        // (The ring's updates and the pservers' versions count the same
        // steps: a bsp step with samples is one of each.) The ask reaches
        // the ring in a heartbeat response or two: the margin covers
        // what it trains meanwhile.
        absl::MutexLock l(&mu_);
        ring_newest = RingUpdatesLocked();
        if (attempt == 0) {
          margin = std::max<uint64_t>(
              margin, static_cast<uint64_t>(ring_rate_ * 3e-3 *
                                            options_.config.cluster.heartbeat_interval_ms));
        }
      }
      req->set_at_version(true);
      if (training_over) {
        // Each where it stopped (training is over on both).
        req->set_version(targets.empty() ? ring_newest : newest);
        ring_cut = ring_newest;
      } else {
        req->set_version(std::max(newest, ring_newest) + margin);
        ring_cut = req->version();
      }
    }
    // The pservers' calls wait for the cut; the ring's part beside them.
    // Each side gives up as soon as the other has failed.
    std::vector<absl::StatusOr<proto::CheckpointPartitionsResponse>> results;
    std::atomic<bool> calls_failed{false};
    std::thread calls([&] {
      results = CheckpointCalls(
          targets, *req, bsp && !training_over ? std::optional(trainings_done) : std::nullopt);
      for (const auto& r : results) calls_failed = calls_failed || !r.ok();
    });
    absl::StatusOr<std::vector<proto::RingCheckpointReport>> ring_got =
        std::vector<proto::RingCheckpointReport>();
    if (ring_floats_ > 0) {
      ring_got = AwaitRing(req->seq(), ring_cut, training_over, &calls_failed);
      if (!ring_got.ok() && !absl::IsAborted(ring_got.status())) {
        absl::MutexLock il(&inflight_mu_);
        for (grpc::ClientContext* ctx : inflight_) ctx->TryCancel();
      }
    }
    calls.join();
    bool past_cut = false, cancelled = false, busy = false;
    absl::Status first_error;
    if (!ring_got.ok() && !absl::IsAborted(ring_got.status())) {
      past_cut |= absl::IsOutOfRange(ring_got.status());
      cancelled |= absl::IsCancelled(ring_got.status());
      first_error = ring_got.status();
    }
    for (const auto& r : results) {
      if (r.ok()) continue;
      past_cut |= HasReason(r.status(), proto::REASON_CUT_PASSED);
      // A pserver still finishing an earlier attempt: try again shortly.
      busy |= HasReason(r.status(), proto::REASON_CHECKPOINT_BUSY);
      cancelled |= absl::IsCancelled(r.status());
      if (first_error.ok()) first_error = r.status();
    }
    if (first_error.ok() && !ring_got.ok()) first_error = ring_got.status();
    if (first_error.ok()) {
      std::vector<proto::CheckpointPartitionsResponse> out;
      for (auto& r : results) out.push_back(*std::move(r));
      *ring = *std::move(ring_got);
      return out;
    }
    if (ring_floats_ > 0 && past_cut) {
      // (The ring's updates come with the heartbeats: fresher ones first.)
      stop_.WaitForNotificationWithTimeout(
          absl::Milliseconds(2 * options_.config.cluster.heartbeat_interval_ms));
    }
    if (busy && attempt < 3) {
      stop_.WaitForNotificationWithTimeout(absl::Seconds(1));
      continue;
    }
    if (cancelled && bsp && !training_over && attempt < 3) {
      // Training ended before reaching the cut: set it where it stopped.
      training_over = master_->CheckpointCluster(/*with_view=*/false).training_over;
      if (training_over) continue;
    }
    if (!past_cut || attempt == 3) return first_error;
    // Training outran the cut while it was being set: aim further ahead.
    margin *= 4;
    VLOG(1) << "checkpoint " << req->seq() << ": training passed the cut; again " << margin
            << " steps ahead";
  }
}

absl::Status CheckpointCoordinator::ChainPartitions(
    const proto::ClusterView& view, uint64_t base_seq,
    std::map<uint32_t, proto::CheckpointPartition> got, proto::CheckpointManifest* m) const {
  absl::MutexLock l(&mu_);
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
  return absl::OkStatus();
}

void CheckpointCoordinator::Done(const std::string& reason, const std::string& dir,
                                 proto::CheckpointManifest m) {
  const uint64_t written = m.bytes_written();
  const double stall = m.max_stall_seconds();
  const bool bsp = options_.config.job.consistency == Consistency::kBsp;
  LOG(INFO) << absl::StrFormat(
      "checkpoint %d (%s%s) at %s: %.2f MB written, %.2f MB raw state, in %.2f s; longest "
      "stall %.2f ms; %s",
      m.seq(), reason,
      m.incremental() ? absl::StrCat(", incremental over ", m.base_seq()) : ", full",
      bsp ? absl::StrCat("step ", m.step()) : "the partitions' own versions", written / 1e6,
      m.raw_bytes() / 1e6, m.write_seconds(), stall * 1e3, dir);
  options_.sink->Event(
      "checkpoint", absl::StrFormat("checkpoint %d (%s%s) at step %d: %d bytes in %.3f s: %s",
                                    m.seq(), reason, m.incremental() ? ", incremental" : ", full",
                                    m.step(), written, m.write_seconds(), dir));
  absl::MutexLock l(&mu_);
  increments_since_full_ = m.incremental() ? increments_since_full_ + 1 : 0;
  ++done_;
  bytes_total_ += written;
  raw_bytes_ = m.raw_bytes();
  raw_total_ += m.raw_bytes();
  max_stall_ = std::max(max_stall_, stall);
  seconds_total_ += m.write_seconds();
  last_time_ = clock_->Now();
  // (Workers that come while the ring has not gone past it, a restart
  // after the final checkpoint say, start from it; retention keeps it.)
  SetRingRestoreLocked(cfg_.dir, m);
  last_manifest_ = std::move(m);
}

std::string CheckpointCoordinator::Due(uint64_t step, bool running) {
  absl::MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  if (last_time_ == absl::InfinitePast()) last_time_ = now;
  if (next_step_trigger_ == 0 && cfg_.every_steps > 0) {
    next_step_trigger_ = (step / cfg_.every_steps + 1) * cfg_.every_steps;
  }
  if (final_pending_) return "final";
  if (!running) return "";
  if (!again_.empty()) return std::exchange(again_, std::string());
  if (cfg_.every_steps > 0 && step >= next_step_trigger_) {
    next_step_trigger_ = (step / cfg_.every_steps + 1) * cfg_.every_steps;
    return "steps";
  }
  if (cfg_.every_seconds > 0 && now - last_time_ >= absl::Seconds(cfg_.every_seconds)) {
    return "interval";
  }
  return "";
}

void CheckpointCoordinator::Tick() {
  // (Read first: a pause from here on is one under this turn's checkpoint.)
  const uint64_t pauses = this->pauses();
  const Master::Cluster c = master_->CheckpointCluster(/*with_view=*/false);
  if (!c.ready) return;
  // The step now: the newest partition version (bsp: the step; asp: the
  // updates of the busiest partition), asked of the pservers.
  uint64_t step = 0;
  if (cfg_.every_steps > 0 && c.running && !c.owners.empty()) {
    absl::StatusOr<uint64_t> newest = NewestPartitionVersion(c.owners);
    if (newest.ok()) step = *newest;
  }
  if (cfg_.every_steps > 0 && c.running && ring_floats_ > 0) {
    absl::MutexLock l(&mu_);
    step = std::max(step, RingUpdatesLocked());
  }
  const std::string reason = Due(step, c.running);
  if (reason.empty()) return;
  auto r = Checkpoint(reason, /*stop_after=*/false);
  if (!r.ok() && this->pauses() != pauses) {
    // This master paused under it (its lead in etcd not renewed in time):
    // taken again once it acts again (the final one stays pending).
    LOG(WARNING) << "the " << reason << " checkpoint, cancelled by a pause of this master, is "
                 << "taken again once it acts again";
    if (reason == "final") return;
    absl::MutexLock l(&mu_);
    again_ = reason;
    return;
  }
  if (reason == "final") {
    {
      absl::MutexLock l(&mu_);
      final_pending_ = false;
      final_done_ = true;
    }
    master_->FinalCheckpointDone();
  }
}

void CheckpointCoordinator::CancelInflight() {
  absl::MutexLock il(&inflight_mu_);
  ++pauses_;
  for (grpc::ClientContext* ctx : inflight_) ctx->TryCancel();
}

void CheckpointCoordinator::TrainingDone() {
  {
    absl::MutexLock l(&mu_);
    // The trained model is saved before it is evaluated.
    if (cfg_.enabled && cfg_.on_finish && !final_done_) final_pending_ = true;
  }
  absl::MutexLock il(&inflight_mu_);
  ++trainings_done_;
  for (grpc::ClientContext* ctx : inflight_) ctx->TryCancel();
}

bool CheckpointCoordinator::final_pending() const {
  absl::MutexLock l(&mu_);
  return final_pending_;
}

absl::StatusOr<proto::CheckpointResponse> CheckpointCoordinator::CheckpointBeforeStop(
    const std::string& reason) {
  absl::StatusOr<proto::CheckpointResponse> c = Checkpoint(reason, /*stop_after=*/true);
  if (c.ok()) return c;
  return absl::Status(
      c.status().code(),
      absl::StrCat("not stopped: the checkpoint before the stop failed (", c.status().message(),
                   "); the job goes on (stop without one: no_checkpoint)"));
}

bool CheckpointCoordinator::CheckpointAndStopWithin(absl::Duration grace) {
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

absl::Status CheckpointCoordinator::PlacePartitions(const proto::ClusterView& view,
                                                    const std::vector<PServerTarget>& targets) {
  std::optional<proto::CheckpointManifest> chains;
  std::string root;
  {
    absl::MutexLock l(&mu_);
    chains = to_place_;
    root = to_place_root_;
    if (chains.has_value()) {
      restore_ = Progress{chains->seq(), 0, static_cast<int>(targets.size()), 0, clock_->Now()};
    }
  }
  return SendPlacement(view, targets, chains ? &*chains : nullptr, root, [this] {
    absl::MutexLock l(&mu_);
    ++restore_.done;
    LOG(INFO) << "restoring checkpoint " << restore_.seq << ": " << restore_.done << " of "
              << restore_.total << " pserver(s) loaded their partitions";
  });
}

void CheckpointCoordinator::RestorePlaced() {
  absl::MutexLock l(&mu_);
  restore_ = Progress();
  to_place_.reset();
}

std::string CheckpointCoordinator::RestorePhase() const {
  absl::MutexLock l(&mu_);
  if (restore_.seq == 0) return "";
  return absl::StrFormat("restoring checkpoint %d: %d of %d pserver(s) loaded", restore_.seq,
                         restore_.done, restore_.total);
}

void CheckpointCoordinator::Resume(const ResumePoint& r) {
  absl::MutexLock l(&mu_);
  // The pservers load the partitions' chains only.
  to_place_.emplace();
  to_place_->set_seq(r.manifest.seq());
  *to_place_->mutable_partitions() = r.manifest.partitions();
  to_place_root_ = r.root;
  SetRingRestoreLocked(r.root, r.manifest);
  if (r.root != cfg_.dir) return;
  // The next checkpoints build on it (their chains name its files).
  last_manifest_ = r.manifest;
  int chain = 0;
  for (const auto& p : r.manifest.partitions()) chain = std::max(chain, p.files_size() - 1);
  increments_since_full_ = chain;
}

void CheckpointCoordinator::RingBeat(uint32_t node, const proto::HeartbeatRequest& req,
                                     proto::HeartbeatResponse* resp) {
  absl::MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  ring_beats_[node] = {req.ring_updates(), now};
  const uint64_t updates = RingUpdatesLocked();
  if (ring_rate_since_ == absl::InfinitePast() || updates < ring_rate_base_) {
    ring_rate_since_ = now;
    ring_rate_base_ = updates;
  } else if (now - ring_rate_since_ >= absl::Seconds(1)) {
    ring_rate_ = static_cast<double>(updates - ring_rate_base_) /
                 absl::ToDoubleSeconds(now - ring_rate_since_);
    ring_rate_since_ = now;
    ring_rate_base_ = updates;
  }
  for (const proto::RingCheckpointReport& r : req.ring_checkpoints()) {
    if (r.id() == ring_ask_.id() && r.id() > 0) ring_reports_[node] = r;
  }
  if (ring_ask_.seq() > 0) *resp->mutable_ring_checkpoint() = ring_ask_;
}

std::optional<proto::RingRestore> CheckpointCoordinator::RingRestore() const {
  absl::MutexLock l(&mu_);
  // (Once the ring has gone past the checkpoint, its members hold the
  // state: a worker joining later takes theirs.)
  if (!ring_restore_.has_value() || RingUpdatesLocked() > ring_restore_->updates()) {
    return std::nullopt;
  }
  return ring_restore_;
}

uint64_t CheckpointCoordinator::RingUpdatesLocked() const {
  // (Those of workers heard of lately: a ring of restarted workers starts
  // again from what it restored.)
  const absl::Time since =
      clock_->Now() - absl::Milliseconds(5 * options_.config.cluster.heartbeat_interval_ms);
  uint64_t newest = 0;
  for (const auto& [node, beat] : ring_beats_) {
    if (beat.second >= since) newest = std::max(newest, beat.first);
  }
  return newest;
}

void CheckpointCoordinator::SetRingRestoreLocked(const std::string& root,
                                                 const proto::CheckpointManifest& m) {
  if (m.ring_shards_size() == 0) return;
  ring_restore_.emplace();
  ring_restore_->set_root(root);
  ring_restore_->set_seq(m.seq());
  *ring_restore_->mutable_shards() = m.ring_shards();
  ring_restore_->set_floats(m.ring_floats());
  ring_restore_->set_step(m.ring_step());
  ring_restore_->set_updates(m.ring_updates());
}

std::string CheckpointCoordinator::TrainedModel() const {
  absl::MutexLock l(&mu_);
  if (!last_manifest_.has_value()) {
    return "no checkpoint holds the trained model (checkpoint.on_finish)";
  }
  return last_manifest_->reason() == "final"
             ? absl::StrCat("checkpoint ", last_manifest_->seq(), " holds the trained model")
             : absl::StrCat("the last checkpoint is ", last_manifest_->seq(), " (",
                            last_manifest_->reason(), ")");
}

absl::Status CheckpointCoordinator::NoRingWhileEvaluating() const {
  // (The members leave their ring's steps, where their shards are cut: no
  // whole set would come before the timeout.)
  const std::string model = TrainedModel();
  return WithReason(absl::FailedPreconditionError(absl::StrCat(
                        "no checkpoint: training is over and the workers' ring of the allreduce "
                        "tables steps no more while the model is evaluated; ",
                        model)),
                    proto::REASON_JOB_NOT_RUNNING);
}

absl::StatusOr<std::vector<proto::RingCheckpointReport>> CheckpointCoordinator::AwaitRing(
    uint64_t seq, uint64_t cut, bool training_over, const std::atomic<bool>* give_up) {
  {
    absl::MutexLock l(&mu_);
    // (Ids by seq, which a restarted master does not reuse, then by try.)
    ring_asks_ = (ring_asks_ >> 20) == seq ? ring_asks_ + 1 : (seq << 20) + 1;
    ring_ask_.set_id(ring_asks_);
    ring_ask_.set_seq(seq);
    ring_ask_.set_root(cfg_.dir);
    ring_ask_.set_cut(cut);
    ring_ask_.set_zstd_level(cfg_.compression_level);
    ring_reports_.clear();
  }
  struct Disarm {
    CheckpointCoordinator* c;
    ~Disarm() {
      absl::MutexLock l(&c->mu_);
      c->ring_ask_.Clear();
      c->ring_reports_.clear();
    }
  } disarm{this};
  const absl::Time deadline = absl::Now() + absl::Seconds(cfg_.timeout_seconds);
  // "Passed" from a member while others' shards may still come (a member
  // new to a ring formed during the checkpoint): believed after a few
  // heartbeats without a whole set.
  std::optional<absl::Time> passed_since;
  const absl::Duration passed_grace =
      absl::Milliseconds(3 * options_.config.cluster.heartbeat_interval_ms);
  while (true) {
    {
      absl::MutexLock l(&mu_);
      // The shards of one ring (by its epoch), by where they start.
      std::map<uint64_t, std::map<uint64_t, const proto::RingCheckpointReport*>> by_ring;
      bool passed = false;
      for (const auto& [node, r] : ring_reports_) {
        if (!r.error().empty()) {
          return absl::UnavailableError(
              absl::StrCat("checkpoint ", seq, ": worker node ", node,
                           " could not write its ring shard: ", r.error()));
        }
        if (r.passed()) {
          passed = true;
          continue;
        }
        if (r.floats() != ring_floats_) {
          return absl::InternalError(
              absl::StrCat("checkpoint ", seq, ": worker node ", node, " wrote a shard of ",
                           r.floats(), " floats of allreduce tables, the job has ", ring_floats_));
        }
        by_ring[r.ring_epoch()][r.shard().begin()] = &r;
      }
      for (const auto& [epoch, shards] : by_ring) {
        uint64_t at = 0;
        for (const auto& [begin, r] : shards) {
          if (begin == at) at = r->shard().end();
        }
        if (at != ring_floats_) continue;
        std::vector<proto::RingCheckpointReport> out;
        at = 0;
        for (const auto& [begin, r] : shards) {
          if (begin != at) continue;
          out.push_back(*r);
          at = r->shard().end();
        }
        return out;
      }
      if (passed && !passed_since.has_value()) passed_since = absl::Now();
      if (passed && (by_ring.empty() || absl::Now() - *passed_since >= passed_grace)) {
        return absl::OutOfRangeError(absl::StrCat("checkpoint ", seq,
                                                  ": the workers' ring was past update ", cut,
                                                  " when it learned of it"));
      }
    }
    if (stop_.HasBeenNotified()) return absl::CancelledError("the master is shutting down");
    if (give_up != nullptr && give_up->load()) {
      return absl::AbortedError(absl::StrCat("checkpoint ", seq, ": the pservers' part failed"));
    }
    const Master::Cluster now = master_->CheckpointCluster(/*with_view=*/false);
    if (now.evaluating) return NoRingWhileEvaluating();
    if (!training_over && now.training_over) {
      return absl::CancelledError(
          absl::StrCat("checkpoint ", seq, ": training ended before the ring reached the cut"));
    }
    if (absl::Now() >= deadline) {
      absl::MutexLock l(&mu_);
      std::vector<uint32_t> nodes;
      for (const auto& [node, r] : ring_reports_) nodes.push_back(node);
      return absl::DeadlineExceededError(absl::StrCat(
          "checkpoint ", seq, ": the workers' ring wrote no whole set of shards at update ", cut,
          " within ", cfg_.timeout_seconds, " s (shards from worker nodes [",
          absl::StrJoin(nodes, ", "), "]; the ring is at update ", RingUpdatesLocked(), ")"));
    }
    stop_.WaitForNotificationWithTimeout(absl::Milliseconds(50));
  }
}

std::optional<proto::CheckpointManifest> CheckpointCoordinator::last_manifest() const {
  absl::MutexLock l(&mu_);
  return last_manifest_;
}

void CheckpointCoordinator::set_next_seq(uint64_t seq) {
  absl::MutexLock l(&mu_);
  next_seq_ = seq;
}

void CheckpointCoordinator::Save(proto::MasterState* st) const {
  absl::MutexLock l(&mu_);
  st->set_next_checkpoint_seq(next_seq_);
  st->set_checkpoints_done(done_);
}

void CheckpointCoordinator::Restore(const proto::MasterState& st, std::optional<ResumePoint> last) {
  absl::MutexLock l(&mu_);
  done_ = st.checkpoints_done();
  next_seq_ = std::max(next_seq_, st.next_checkpoint_seq());
  if (last.has_value()) {
    SetRingRestoreLocked(last->root, last->manifest);
    last_manifest_ = std::move(last->manifest);
  }
}

void CheckpointCoordinator::FillStatus(proto::JobStatus* js) const {
  absl::MutexLock l(&mu_);
  if (progress_.seq > 0) {
    js->set_checkpoint_in_progress(progress_.seq);
    js->set_checkpoint_pservers_done(progress_.done);
    js->set_checkpoint_pservers_total(progress_.total);
    js->set_checkpoint_bytes_so_far(progress_.bytes);
    js->set_checkpoint_seconds_so_far(absl::ToDoubleSeconds(clock_->Now() - progress_.start));
  }
  js->set_checkpoints(done_);
  js->set_checkpoint_failures(failures_);
  if (last_manifest_.has_value()) {
    js->set_last_checkpoint_seq(last_manifest_->seq());
    js->set_last_checkpoint_step(last_manifest_->step());
    js->set_last_checkpoint_dir(
        storage::JoinPath(cfg_.dir, storage::CheckpointDirName(last_manifest_->seq())));
  }
}

void CheckpointCoordinator::FillSummary(proto::JobSummary* s) const {
  if (!cfg_.enabled) return;
  absl::MutexLock l(&mu_);
  // checkpoint_bytes: mean bytes written per checkpoint of this run;
  // checkpoint_raw_bytes: mean size of a full uncompressed dump of the
  // same states (parameters and optimizer state); their ratio.
  s->set_checkpoints(static_cast<double>(done_));
  s->set_checkpoint_failures(static_cast<double>(failures_));
  s->set_checkpoint_bytes(done_ ? static_cast<double>(bytes_total_ / done_) : 0);
  s->set_checkpoint_raw_bytes(done_ ? static_cast<double>(raw_total_ / done_) : 0);
  s->set_checkpoint_bytes_ratio(
      raw_total_ ? static_cast<double>(bytes_total_) / static_cast<double>(raw_total_) : 0.0);
  s->set_checkpoint_seconds_mean(done_ ? seconds_total_ / static_cast<double>(done_) : 0.0);
  s->set_checkpoint_max_stall_seconds(max_stall_);
  s->set_last_checkpoint(last_manifest_ ? static_cast<double>(last_manifest_->seq()) : 0);
}

void CheckpointCoordinator::RegisterMetrics(MetricsRegistry* metrics) {
  seconds_histogram_ = metrics->GetHistogram("strata_master_checkpoint_seconds",
                                             "Time a checkpoint took, from its cut to its manifest",
                                             Histogram::LatencyBounds());
  bytes_histogram_ = metrics->GetHistogram("strata_master_checkpoint_bytes",
                                           "Bytes a checkpoint wrote", Histogram::ByteBounds());
  auto locked = [this](auto fn) {
    return [this, fn]() {
      absl::MutexLock l(&mu_);
      return static_cast<double>(fn());
    };
  };
  metrics->AddCallbackGauge("strata_master_checkpoints", "Checkpoints completed by this run",
                            locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done_; }));
  metrics->AddCallbackGauge("strata_master_checkpoint_failures", "Checkpoints that failed",
                            locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return failures_; }));
  metrics->AddCallbackGauge(
      "strata_master_checkpoint_bytes_written", "Bytes written by this run's checkpoints",
      locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return bytes_total_; }));
  metrics->AddCallbackGauge("strata_master_checkpoint_raw_bytes",
                            "Bytes of a full uncompressed dump of the last checkpoint's state",
                            locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return raw_bytes_; }));
  metrics->AddCallbackGauge("strata_master_checkpoint_last_seconds",
                            "Time the last checkpoint took",
                            locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                              return last_manifest_ ? last_manifest_->write_seconds() : 0.0;
                            }));
  metrics->AddCallbackGauge("strata_master_checkpoint_last_step",
                            "BSP step of the last checkpoint's cut",
                            locked([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                              return last_manifest_ ? last_manifest_->step() : 0;
                            }));
}

}  // namespace strata::master
