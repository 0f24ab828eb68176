// strata checkpoint (take one now), checkpoint list, export and verify,
// and audit verify: the commands about what the master writes.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "proto/strata.grpc.pb.h"
#include "storage/audit_log.h"
#include "storage/checkpoint_export.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"
#include "storage/ring_checkpoint.h"
#include "storage/s3_file_system.h"
#include "tools/cli/commands.h"

namespace strata::tools::cli {
namespace {

// Shows a checkpoint's progress while it is written: the pservers done and
// their bytes, from the master's status (a line redrawn on a terminal,
// else a line each time a pserver is done). Stops at Finish().
class CheckpointProgress {
 public:
  CheckpointProgress(const ClusterAccess& cluster, std::string master, std::ostream& out)
      : cluster_(cluster), master_(std::move(master)), out_(out) {
    thread_ = std::thread([this] { Run(); });
  }
  CheckpointProgress(const CheckpointProgress&) = delete;
  CheckpointProgress& operator=(const CheckpointProgress&) = delete;
  ~CheckpointProgress() { Finish(); }

  void Finish() {
    if (!done_.HasBeenNotified()) done_.Notify();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    const bool tty = &out_ == &std::cout && isatty(STDOUT_FILENO);
    int shown = -1;
    while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(300))) {
      auto st = cluster_.FetchStatus(master_);
      if (!st.ok() || st->job().checkpoint_in_progress() == 0) continue;
      const proto::JobStatus& j = st->job();
      const std::string line = absl::StrFormat(
          "checkpoint %d: %d of %d pserver(s) written, %.2f MB, %.1f s", j.checkpoint_in_progress(),
          j.checkpoint_pservers_done(), j.checkpoint_pservers_total(),
          j.checkpoint_bytes_so_far() / 1e6, j.checkpoint_seconds_so_far());
      if (tty) {
        out_ << "\r" << line << "\x1b[K" << std::flush;
      } else if (j.checkpoint_pservers_done() != shown) {
        out_ << "\n  " << line << std::flush;
      }
      shown = j.checkpoint_pservers_done();
    }
    if (tty) out_ << "\r\x1b[K";
    if (shown >= 0 && !tty) out_ << "\n";
  }

  const ClusterAccess& cluster_;  // borrowed: the command's, outlives this
  const std::string master_;
  std::ostream& out_;  // the command's; only the thread writes it until Finish()
  absl::Notification done_;
  std::thread thread_;
};

// Local paths, and s3:// ones through the s3 section of --config. The
// error names `who`.
absl::StatusOr<std::unique_ptr<storage::FileSystem>> CheckpointFileSystem(const Invocation& in,
                                                                          const std::string& who) {
  S3Section s3;
  if (in.flags.count("config")) {
    auto config = LoadJobConfig(in.flags.at("config"));
    if (!config.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": ", config.status().message()));
    }
    s3 = config->s3;
  }
  auto fs = storage::NewFileSystemForConfig(s3, in.getenv);
  if (!fs.ok()) return absl::InvalidArgumentError(absl::StrCat(who, ": ", fs.status().message()));
  return fs;
}

// A checkpoint read whole, every checksum checked.
struct VerifiedCheckpoint {
  int files = 0;
  // The digest of the state the checkpoint restores (the chains applied),
  // independent of how it was written: two checkpoints of the same model
  // and optimizer state have the same one.
  uint32_t digest = 0;
};

absl::StatusOr<VerifiedCheckpoint> ReadCheckpoint(storage::FileSystem* fs, const std::string& root,
                                                  const proto::CheckpointManifest& m) {
  STRATA_RETURN_IF_ERROR(storage::CheckManifestFiles(fs, root, m));
  VerifiedCheckpoint v;
  for (const auto& p : m.partitions()) {
    std::string dense;
    std::map<uint64_t, std::string> rows;
    std::string pending;
    uint64_t version = 0;
    for (const auto& file : p.files()) {
      const std::string path = storage::JoinPath(root, file.path());
      ++v.files;
      STRATA_ASSIGN_OR_RETURN(auto streams, storage::ReadBlockFile(fs, path, &file));
      proto::CheckpointPartitionHeader h;
      STRATA_RETURN_IF_ERROR(
          storage::ParseHeaderBlock(streams, storage::BlockType::kHeader, path, &h));
      version = h.version();
      if (!h.sparse()) {
        dense = streams[storage::BlockType::kDenseValues] +
                streams[storage::BlockType::kOptimizerState];
        continue;
      }
      const std::string& del = streams[storage::BlockType::kSparseDeletes];
      for (size_t i = 0; i + 8 <= del.size(); i += 8) {
        uint64_t key;
        std::memcpy(&key, del.data() + i, 8);
        rows.erase(key);
      }
      const std::string& recs = streams[storage::BlockType::kSparseRows];
      for (size_t i = 0; h.row_bytes() >= 8 && i + h.row_bytes() <= recs.size();
           i += h.row_bytes()) {
        uint64_t key;
        std::memcpy(&key, recs.data() + i, 8);
        rows[key] = recs.substr(i, h.row_bytes());
      }
      pending = streams[storage::BlockType::kSparsePending];
    }
    uint32_t c = Crc32cExtend(v.digest, reinterpret_cast<const char*>(&version), sizeof(version));
    c = Crc32cExtend(c, dense.data(), dense.size());
    for (const auto& [key, rec] : rows) c = Crc32cExtend(c, rec.data(), rec.size());
    v.digest = Crc32cExtend(c, pending.data(), pending.size());
  }
  if (m.ring_shards_size() > 0) {
    // The allreduce tables (storage/ring_checkpoint.h): their state put
    // back together, whatever the ring's size was.
    const std::vector<proto::CheckpointRingShard> shards(m.ring_shards().begin(),
                                                         m.ring_shards().end());
    STRATA_ASSIGN_OR_RETURN(
        storage::RingState ring,
        storage::ReadRingState(fs, root, shards, m.ring_floats(), m.job(), m.optimizer()));
    v.files += m.ring_shards_size();
    uint32_t c =
        Crc32cExtend(v.digest, reinterpret_cast<const char*>(&ring.updates), sizeof(ring.updates));
    c = Crc32cExtend(c, reinterpret_cast<const char*>(ring.values.data()),
                     ring.values.size() * sizeof(float));
    v.digest = Crc32cExtend(c, reinterpret_cast<const char*>(ring.state.data()),
                            ring.state.size() * sizeof(float));
  }
  return v;
}

}  // namespace

CliResult TakeCheckpoint(const Invocation& in) {
  const Flags& f = in.flags;
  if (!f.count("master")) return Failure(2, "strata checkpoint: --master HOST:PORT is required");
  const std::string& master = f.at("master");
  double timeout = 900;
  if (f.count("timeout") && !absl::SimpleAtod(f.at("timeout"), &timeout)) {
    return Failure(2, "strata checkpoint: --timeout must be a number of seconds");
  }
  auto stub = proto::Master::NewStub(in.cluster.Channel(master));
  proto::CheckpointRequest req;
  req.set_reason("request");
  req.set_stop_after(f.count("stop") > 0);
  proto::CheckpointResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(timeout)));
  std::optional<CheckpointProgress> progress;
  if (!in.json) {
    in.out << "checkpointing..." << std::flush;
    progress.emplace(in.cluster, master, in.out);
  }
  absl::Status s = in.cluster.FromCall(stub->Checkpoint(&ctx, req, &resp), "master " + master);
  if (progress) progress->Finish();
  if (!s.ok()) {
    if (!in.json) in.out << "\n";
    return Failure(1, absl::StrCat("strata checkpoint: ", s.message()));
  }
  CliResult r;
  r.data = JsonValue::FromProto(resp);
  r.text = [resp] {
    return absl::StrFormat(" checkpoint %d (%s)%s: %.2f MB written in %.2f s: %s\n", resp.seq(),
                           resp.incremental() ? "incremental" : "full",
                           resp.step() ? absl::StrCat(" at step ", resp.step()) : "",
                           resp.bytes_written() / 1e6, resp.write_seconds(), resp.dir());
  };
  return r;
}

CliResult ListCheckpoints(const Invocation& in) {
  if (!in.flags.count("dir")) {
    return Failure(2, "strata checkpoint list: --dir DIR (the checkpoint root) is required");
  }
  auto fs = CheckpointFileSystem(in, "strata checkpoint list");
  if (!fs.ok()) return Failure(2, std::string(fs.status().message()));
  auto all = storage::ListCheckpoints(fs->get(), in.flags.at("dir"));
  if (!all.ok()) {
    return Failure(1, absl::StrCat("strata checkpoint list: ", all.status().message()));
  }
  JsonValue json = JsonValue::Array(",\n");
  std::string text = absl::StrFormat("%-8s %-11s %-8s %-12s %-10s %-12s %s\n", "SEQ", "KIND",
                                     "STEP", "WRITTEN_MB", "RAW_MB", "CREATED", "REASON");
  for (const auto& e : *all) {
    auto m = storage::ReadManifest(fs->get(), e.dir);
    if (!m.ok()) {
      json.Append(JsonValue::Object()
                      .Set("seq", JsonValue::Int(e.seq))
                      .Set("error", JsonValue::String(m.status().message())));
      absl::StrAppendFormat(&text, "%-8d %-11s %s\n", e.seq, e.complete ? "BAD" : "unfinished",
                            e.complete ? m.status().message() : "no MANIFEST");
      continue;
    }
    json.Append(JsonValue::FromProto(*m));
    absl::StrAppendFormat(
        &text, "%-8d %-11s %-8d %-12.2f %-10.2f %-12s %s\n", m->seq(),
        m->incremental() ? "incremental" : "full", m->step(), m->bytes_written() / 1e6,
        m->raw_bytes() / 1e6,
        absl::FormatTime("%m-%d %H:%M:%S", absl::FromUnixMillis(m->created_unix_ms()),
                         absl::LocalTimeZone()),
        m->reason());
  }
  CliResult r = TextResult(std::move(text));
  r.data = std::move(json);
  return r;
}

CliResult VerifyCheckpoint(const Invocation& in) {
  if (!in.flags.count("dir")) {
    return Failure(2, "strata checkpoint verify: --dir DIR (a checkpoint directory) is required");
  }
  auto fs = CheckpointFileSystem(in, "strata checkpoint verify");
  if (!fs.ok()) return Failure(2, std::string(fs.status().message()));
  const std::string dir = WithoutTrailingSlashes(in.flags.at("dir"));
  auto m = storage::ReadManifest(fs->get(), dir);
  if (!m.ok()) return Failure(1, absl::StrCat("strata checkpoint verify: ", m.status().message()));
  auto v = ReadCheckpoint(fs->get(), storage::ParentDir(dir), *m);
  if (!v.ok()) return Failure(1, absl::StrCat("strata checkpoint verify: ", v.status().message()));
  const std::string digest = absl::StrFormat("%08x", v->digest);
  CliResult r = TextResult(absl::StrFormat(
      "%s: ok (%s, job '%s', step %d, %d partitions%s, %d files checked; state digest %s)\n", dir,
      m->incremental() ? "incremental" : "full", m->job(), m->step(), m->partitions_size(),
      m->ring_shards_size() > 0 ? absl::StrCat(", ", m->ring_shards_size(), " ring shards") : "",
      v->files, digest));
  r.data = JsonValue::Object()
               .Set("dir", JsonValue::String(dir))
               .Set("ok", JsonValue::Bool(true))
               .Set("seq", JsonValue::Int(m->seq()))
               .Set("step", JsonValue::Int(m->step()))
               .Set("files", JsonValue::Int(v->files))
               .Set("state_digest", JsonValue::String(digest));
  return r;
}

CliResult ExportCheckpoint(const Invocation& in) {
  const Flags& f = in.flags;
  if (!f.count("dir") || !f.count("out") || !f.count("precision")) {
    return Failure(
        2, "strata checkpoint export: --dir DIR --out DIR2 --precision bf16|fp16 are required");
  }
  auto precision = storage::ParsePrecision(f.at("precision"));
  if (!precision.ok()) {
    return Failure(2, absl::StrCat("strata checkpoint export: ", precision.status().message()));
  }
  auto fs = CheckpointFileSystem(in, "strata checkpoint export");
  if (!fs.ok()) return Failure(2, std::string(fs.status().message()));
  const std::string dir = WithoutTrailingSlashes(f.at("dir"));
  const std::string dst = WithoutTrailingSlashes(f.at("out"));
  auto m = storage::ExportCheckpoint(fs->get(), dir, dst, *precision);
  if (!m.ok()) return Failure(1, absl::StrCat("strata checkpoint export: ", m.status().message()));
  CliResult r = TextResult(absl::StrFormat(
      "%s: %s export of %s (job '%s', step %d, %d partitions): %.2f MB\n", dst, m->precision(), dir,
      m->job(), m->step(), m->partitions_size(), m->bytes_written() / 1e6));
  r.data = JsonValue::FromProto(*m);
  return r;
}

// strata audit verify --file FILE: the audit log's chain, whole.
CliResult VerifyAudit(const Invocation& in) {
  if (!in.flags.count("file")) return Failure(2, "strata audit verify: --file FILE is required");
  const std::string& path = in.flags.at("file");
  std::ifstream file(path, std::ios::binary);
  if (!file) return Failure(2, absl::StrCat("strata audit verify: cannot read ", path));
  std::stringstream contents;
  contents << file.rdbuf();
  auto head = storage::VerifyAuditLog(contents.str(), path);
  if (!head.ok()) {
    // (The verdict on stdout under --json as well, for scripts.)
    CliResult r = Failure(1, absl::StrCat("strata audit verify: ", head.status().message()));
    r.data = JsonValue::Object()
                 .Set("file", JsonValue::String(path))
                 .Set("ok", JsonValue::Bool(false))
                 .Set("error", JsonValue::String(head.status().message()));
    return r;
  }
  CliResult r =
      TextResult(absl::StrFormat("%s: ok: %d records, each chained to the one before; head %d %s\n",
                                 path, head->seq, head->seq, head->hash));
  r.data = JsonValue::Object()
               .Set("file", JsonValue::String(path))
               .Set("ok", JsonValue::Bool(true))
               .Set("records", JsonValue::Int(head->seq))
               .Set("head", JsonValue::String(head->hash));
  return r;
}

CliResult AuditUsage(const Invocation& in) {
  return Failure(2, "strata audit: usage: strata audit verify --file FILE [--json]");
}

}  // namespace strata::tools::cli
