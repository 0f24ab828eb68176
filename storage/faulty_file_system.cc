#include "storage/faulty_file_system.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace strata::storage {

// Forwards to the base file, asking the file system before each operation.
class FaultyFileSystem::File : public WritableFile {
 public:
  // `size`: what the file holds already (appending to it).
  File(FaultyFileSystem* fs, std::string path, std::unique_ptr<WritableFile> base,
       uint64_t size = 0)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)), size_(size) {}

  absl::Status Append(absl::string_view data) override {
    STRATA_RETURN_IF_ERROR(fs_->Check(FsOp::kAppend, path_));
    const size_t fits = fs_->Reserve(data.size());
    STRATA_RETURN_IF_ERROR(base_->Append(data.substr(0, fits)));
    size_ += fits;
    if (fits < data.size()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("write ", path_, ": No space left on device"));
    }
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    STRATA_RETURN_IF_ERROR(fs_->Check(FsOp::kSync, path_));
    STRATA_RETURN_IF_ERROR(base_->Sync());
    fs_->Synced(path_, size_);
    return absl::OkStatus();
  }
  absl::Status Truncate(uint64_t size) override {
    STRATA_RETURN_IF_ERROR(fs_->Check(FsOp::kTruncate, path_));
    STRATA_RETURN_IF_ERROR(base_->Truncate(size));
    size_ = std::min(size_, size);
    fs_->Truncated(path_, size_);
    return absl::OkStatus();
  }
  absl::Status Close() override {
    STRATA_RETURN_IF_ERROR(fs_->Check(FsOp::kClose, path_));
    return base_->Close();
  }

 private:
  FaultyFileSystem* const fs_;  // outlives its files
  const std::string path_;
  const std::unique_ptr<WritableFile> base_;
  uint64_t size_;
};

void FaultyFileSystem::FailOp(FsOp op, std::string path_part, absl::Status error, int count) {
  absl::MutexLock l(&mu_);
  faults_.push_back({op, std::move(path_part), std::move(error), count});
}

void FaultyFileSystem::ClearFaults() {
  absl::MutexLock l(&mu_);
  faults_.clear();
  space_left_ = -1;
  crash_countdown_ = -1;
}

void FaultyFileSystem::SetSpaceLimit(int64_t bytes) {
  absl::MutexLock l(&mu_);
  space_left_ = bytes;
}

void FaultyFileSystem::CrashAfter(int64_t n) {
  absl::MutexLock l(&mu_);
  crash_countdown_ = n;
}

bool FaultyFileSystem::crashed() const {
  absl::MutexLock l(&mu_);
  return crashed_;
}

int64_t FaultyFileSystem::write_ops() const {
  absl::MutexLock l(&mu_);
  return write_ops_;
}

absl::Status FaultyFileSystem::Check(FsOp op, const std::string& path) {
  absl::MutexLock l(&mu_);
  if (crashed_) return absl::AbortedError(absl::StrCat(path, ": simulated crash"));
  for (Fault& f : faults_) {
    if (f.op != op || f.count == 0 || path.find(f.path_part) == std::string::npos) continue;
    if (f.count > 0) --f.count;
    return f.error;
  }
  if (op == FsOp::kRead) return absl::OkStatus();
  if (crash_countdown_ == 0) {
    crashed_ = true;
    return absl::AbortedError(absl::StrCat(path, ": simulated crash"));
  }
  if (crash_countdown_ > 0) --crash_countdown_;
  ++write_ops_;
  return absl::OkStatus();
}

size_t FaultyFileSystem::Reserve(size_t n) {
  absl::MutexLock l(&mu_);
  if (space_left_ < 0) return n;
  const size_t fits = std::min<size_t>(n, static_cast<size_t>(space_left_));
  space_left_ -= static_cast<int64_t>(fits);
  return fits;
}

void FaultyFileSystem::Synced(const std::string& path, uint64_t size) {
  absl::MutexLock l(&mu_);
  auto it = tracked_.find(path);
  if (it != tracked_.end()) it->second.synced = size;
}

void FaultyFileSystem::Truncated(const std::string& path, uint64_t size) {
  absl::MutexLock l(&mu_);
  auto it = tracked_.find(path);
  if (it != tracked_.end()) it->second.synced = std::min(it->second.synced, size);
}

absl::StatusOr<std::string> FaultyFileSystem::ReadFile(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kRead, path));
  return base_->ReadFile(path);
}

absl::StatusOr<uint64_t> FaultyFileSystem::FileSize(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kRead, path));
  return base_->FileSize(path);
}

absl::StatusOr<std::vector<std::string>> FaultyFileSystem::ListDir(const std::string& dir) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kRead, dir));
  return base_->ListDir(dir);
}

absl::Status FaultyFileSystem::CreateDirs(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kMkdir, path));
  return base_->CreateDirs(path);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultyFileSystem::NewWritableFile(
    const std::string& path) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kOpen, path));
  const bool existed = base_->Exists(path);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, base_->NewWritableFile(path));
  {
    absl::MutexLock l(&mu_);
    // A file that existed before we watched it keeps its durable entry.
    const bool watched = tracked_.count(path) > 0;
    Tracked& t = tracked_[path];
    t.synced = 0;
    if (!watched) t.entry_durable = existed;
  }
  return std::unique_ptr<WritableFile>(new File(this, path, std::move(f)));
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultyFileSystem::NewAppendableFile(
    const std::string& path) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kOpen, path));
  const bool existed = base_->Exists(path);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, base_->NewAppendableFile(path));
  const uint64_t size = existed ? base_->FileSize(path).value_or(0) : 0;
  {
    absl::MutexLock l(&mu_);
    if (tracked_.count(path) == 0) {
      // What it held before we watched it is durable.
      Tracked& t = tracked_[path];
      t.synced = size;
      t.entry_durable = existed;
    }
  }
  return std::unique_ptr<WritableFile>(new File(this, path, std::move(f), size));
}

absl::StatusOr<std::unique_ptr<FileLock>> FaultyFileSystem::LockFile(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kLock, path));
  return base_->LockFile(path);
}

absl::Status FaultyFileSystem::RenameFile(const std::string& from, const std::string& to) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kRename, to));
  STRATA_ASSIGN_OR_RETURN(uint64_t size, base_->FileSize(from));
  // What survives of the file being replaced, should the rename not.
  absl::StatusOr<std::string> old = base_->ReadFile(to);
  STRATA_RETURN_IF_ERROR(base_->RenameFile(from, to));
  absl::MutexLock l(&mu_);
  bool replaced = false;
  std::string replaced_data;
  if (old.ok()) {
    auto it = tracked_.find(to);
    if (it == tracked_.end()) {
      replaced = true;
      replaced_data = std::move(*old);
    } else if (it->second.entry_durable) {
      replaced = true;
      replaced_data = old->substr(0, it->second.synced);
    } else if (it->second.replaced) {
      replaced = true;
      replaced_data = it->second.replaced_data;
    }
  }
  Tracked moved;
  if (auto it = tracked_.find(from); it != tracked_.end()) {
    moved = it->second;
    tracked_.erase(it);
  } else {
    moved.synced = size;  // written before we watched: durable
    moved.entry_durable = true;
  }
  moved.from_durable = moved.entry_durable;
  moved.renamed_from = from;
  moved.entry_durable = false;
  moved.replaced = replaced;
  moved.replaced_data = std::move(replaced_data);
  tracked_[to] = std::move(moved);
  return absl::OkStatus();
}

absl::Status FaultyFileSystem::SyncDir(const std::string& dir) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kSyncDir, dir));
  STRATA_RETURN_IF_ERROR(base_->SyncDir(dir));
  absl::MutexLock l(&mu_);
  for (auto& [path, t] : tracked_) {
    if (ParentDir(path) == dir) {
      t.entry_durable = true;
      t.renamed_from.clear();
      t.replaced = false;
      t.replaced_data.clear();
    }
  }
  return absl::OkStatus();
}

absl::Status FaultyFileSystem::DeleteFile(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kDelete, path));
  STRATA_RETURN_IF_ERROR(base_->DeleteFile(path));
  absl::MutexLock l(&mu_);
  tracked_.erase(path);
  return absl::OkStatus();
}

absl::Status FaultyFileSystem::DeleteDir(const std::string& path) {
  STRATA_RETURN_IF_ERROR(Check(FsOp::kDelete, path));
  return base_->DeleteDir(path);
}

void FaultyFileSystem::DropUnsyncedData(bool torn) {
  absl::MutexLock l(&mu_);
  for (auto& [path, t] : tracked_) {
    auto data = base_->ReadFile(path);
    if (!data.ok()) continue;
    if (!t.entry_durable) {
      base_->DeleteFile(path).IgnoreError();
      if (t.replaced) {
        // The file the rename replaced is what the disk still holds.
        auto f = base_->NewWritableFile(path);
        if (f.ok()) (*f)->Append(t.replaced_data).IgnoreError();
      }
      if (!t.renamed_from.empty() && t.from_durable) {
        // The rename never reached the disk: the file is back where it was.
        auto f = base_->NewWritableFile(t.renamed_from);
        if (f.ok()) (*f)->Append(data->substr(0, t.synced)).IgnoreError();
      }
      continue;
    }
    uint64_t keep = std::min<uint64_t>(t.synced, data->size());
    if (torn) keep += (data->size() - keep) / 2;
    if (keep == data->size()) continue;
    auto f = base_->NewWritableFile(path);
    if (f.ok()) (*f)->Append(data->substr(0, keep)).IgnoreError();
  }
  tracked_.clear();
  faults_.clear();
  space_left_ = -1;
  crash_countdown_ = -1;
  crashed_ = false;
}

}  // namespace strata::storage
