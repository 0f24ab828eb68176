// A FileSystem for tests that wraps another and injects faults (cf.
// leveldb's db/fault_injection_test.cc): errors on chosen operations, a
// full disk, a crash at the n-th write operation, and, after a crash, the
// loss of everything not made durable (unsynced appends, possibly torn;
// directory entries not synced).
#ifndef STRATA_STORAGE_FAULTY_FILE_SYSTEM_H_
#define STRATA_STORAGE_FAULTY_FILE_SYSTEM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/file_system.h"

namespace strata::storage {

enum class FsOp {
  kRead,
  kOpen,  // NewWritableFile and NewAppendableFile
  kAppend,
  kSync,
  kClose,
  kTruncate,
  kRename,
  kSyncDir,
  kDelete,
  kMkdir,
  kLock,
};

// Thread-safe. Files opened through it must be closed or destroyed before it.
// Simplifications: deletions and new directories are durable at once; a
// rename's faults match its destination path.
class FaultyFileSystem : public FileSystem {
 public:
  // `base` is borrowed and must outlive this; usually a memory file system.
  explicit FaultyFileSystem(FileSystem* base) : base_(base) {}

  // The next `count` operations `op` on a path containing `path_part` ("" =
  // any) fail with `error` (count < 0: all of them), without effect.
  void FailOp(FsOp op, std::string path_part, absl::Status error, int count = -1);
  void ClearFaults();
  // Appends beyond `bytes` more bytes write what fits, then fail with
  // ResourceExhausted ("No space left on device"). < 0: no limit.
  void SetSpaceLimit(int64_t bytes);
  // The `n`-th write operation from now (0 = the next one) and everything
  // after it fail with Aborted ("simulated crash"), as if the process had
  // been killed there. < 0: no crash.
  void CrashAfter(int64_t n);
  bool crashed() const;
  // Write operations (open, append, sync, close, truncate, rename, sync dir,
  // delete, mkdir, lock) that went through so far.
  int64_t write_ops() const;
  // Models the machine going down: appends not synced are lost (with
  // `torn`, the first half of them is kept, as a torn write leaves it), and
  // files created or renamed into place since their directory's last
  // SyncDir disappear (a rename is undone). Then ends the crash and the
  // faults: the file system works again, as after a reboot.
  void DropUnsyncedData(bool torn = false);

  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  bool Exists(const std::string& path) override { return base_->Exists(path); }
  bool IsDirectory(const std::string& path) override { return base_->IsDirectory(path); }
  absl::Status CreateDirs(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status DeleteDir(const std::string& path) override;

 private:
  class File;
  struct Fault {
    FsOp op;
    std::string path_part;
    absl::Status error;
    int count;
  };
  // What is durable of a file written through this file system.
  struct Tracked {
    uint64_t synced = 0;         // bytes that survive a crash
    bool entry_durable = false;  // its directory entry survives
    std::string renamed_from;    // where it was before an unsynced rename
    bool from_durable = false;   // that old entry was durable
    // The durable file an unsynced rename replaced, back if it is undone.
    bool replaced = false;
    std::string replaced_data;
  };
  // The injected outcome of `op` on `path`: OK to go ahead, or the error.
  absl::Status Check(FsOp op, const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes of an append that fit the space limit (consumes them).
  size_t Reserve(size_t n) ABSL_LOCKS_EXCLUDED(mu_);
  void Synced(const std::string& path, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // A file cut to `size`: no more than that of it is durable.
  void Truncated(const std::string& path, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);

  FileSystem* const base_;
  mutable absl::Mutex mu_;
  std::vector<Fault> faults_ ABSL_GUARDED_BY(mu_);
  int64_t space_left_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t crash_countdown_ ABSL_GUARDED_BY(mu_) = -1;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t write_ops_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Tracked> tracked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::storage

#endif  // STRATA_STORAGE_FAULTY_FILE_SYSTEM_H_
