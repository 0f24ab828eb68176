#include "storage/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/huge_pages.h"
#include "common/status_macros.h"

namespace strata::storage {

std::string ParentDir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<std::string> FileSystem::ReadFileRange(const std::string& path, uint64_t offset,
                                                      uint64_t n) {
  STRATA_ASSIGN_OR_RETURN(std::string all, ReadFile(path));
  if (offset >= all.size()) return std::string();
  return all.substr(offset, n);
}

absl::Status WritableFile::Truncate(uint64_t) {
  return absl::UnimplementedError("this file system cannot cut a file it writes");
}

absl::StatusOr<std::unique_ptr<WritableFile>> FileSystem::NewAppendableFile(
    const std::string& path) {
  return absl::UnimplementedError(
      absl::StrCat("append to ", path, ": this file system has no appendable files"));
}

absl::StatusOr<std::unique_ptr<FileLock>> FileSystem::LockFile(const std::string& path) {
  return absl::UnimplementedError(
      absl::StrCat("lock ", path, ": this file system has no file locks"));
}

absl::Status FileSystem::WriteFileAtomic(const std::string& path, absl::string_view contents) {
  const std::string tmp = path + ".tmp";
  absl::Status status = [&]() -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, NewWritableFile(tmp));
    STRATA_RETURN_IF_ERROR(f->Append(contents));
    STRATA_RETURN_IF_ERROR(f->Sync());
    STRATA_RETURN_IF_ERROR(f->Close());
    return RenameFile(tmp, path);
  }();
  if (!status.ok()) {
    DeleteFile(tmp).IgnoreError();
    return status;
  }
  // Make the rename itself durable.
  return SyncDir(ParentDir(path));
}

absl::Status FileSystem::DeleteRecursively(const std::string& path) {
  if (!Exists(path)) return absl::OkStatus();
  if (!IsDirectory(path)) return DeleteFile(path);
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
  for (const std::string& name : names) {
    STRATA_RETURN_IF_ERROR(DeleteRecursively(JoinPath(path, name)));
  }
  absl::Status s = DeleteDir(path);
  // An implicit directory (memory file system) goes with its last entry.
  if (absl::IsNotFound(s) && !Exists(path)) return absl::OkStatus();
  return s;
}

namespace {

// "<op> <path>: <strerror>" with the code errno maps to (ENOENT ->
// NotFound, EACCES -> PermissionDenied, ENOSPC -> ResourceExhausted, ...).
absl::Status PosixError(absl::string_view op, const std::string& path, int err) {
  return absl::ErrnoToStatus(err, absl::StrCat(op, " ", path));
}

int CloseRetryingIntr(int fd) {
  // On Linux the descriptor is released even when close() reports EINTR, so
  // retrying would close someone else's; report only real errors.
  int rc = close(fd);
  if (rc != 0 && errno == EINTR) return 0;
  return rc;
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    if (fd_ < 0) return Closed();
    while (!data.empty()) {
      ssize_t n = write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("write", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return Closed();
    if (fdatasync(fd_) != 0) return PosixError("fsync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t size) override {
    if (fd_ < 0) return Closed();
    if (ftruncate(fd_, static_cast<off_t>(size)) != 0) return PosixError("truncate", path_, errno);
    // (A file opened without O_APPEND writes at its offset.)
    if (lseek(fd_, static_cast<off_t>(size), SEEK_SET) < 0) return PosixError("seek", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    const int rc = CloseRetryingIntr(fd_);
    fd_ = -1;
    if (rc != 0) return PosixError("close", path_, errno);
    return absl::OkStatus();
  }

 private:
  absl::Status Closed() const {
    return absl::FailedPreconditionError(absl::StrCat("write ", path_, ": file is closed"));
  }
  const std::string path_;
  int fd_;
};

// flock(2) on an open descriptor: released by close, or by the process's
// death.
class PosixFileLock : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override { close(fd_); }

 private:
  const int fd_;
};

// POSIX file system. Thread-safe: holds no state.
class PosixFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path, errno);
    std::string contents;
    struct stat st;
    if (fstat(fd, &st) == 0) {
      if (S_ISDIR(st.st_mode)) {
        close(fd);
        return PosixError("read", path, EISDIR);
      }
      if (st.st_size > 0) {
        contents.reserve(static_cast<size_t>(st.st_size));
        AdviseHugePages(contents.data(), contents.capacity());
      }
    }
    char buf[1 << 16];
    while (true) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        close(fd);
        return PosixError("read", path, err);
      }
      if (n == 0) break;
      contents.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return contents;
  }

  absl::StatusOr<std::string> ReadFileRange(const std::string& path, uint64_t offset,
                                            uint64_t n) override {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path, errno);
    std::string out(n, '\0');
    size_t got = 0;
    while (got < n) {
      ssize_t r = pread(fd, out.data() + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        close(fd);
        return PosixError("read", path, err);
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    close(fd);
    out.resize(got);
    return out;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return PosixError("stat", path, errno);
    if (S_ISDIR(st.st_mode)) return PosixError("size of", path, EISDIR);
    return static_cast<uint64_t>(st.st_size);
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
  }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  absl::Status CreateDirs(const std::string& path) override {
    if (path.empty()) {
      return absl::InvalidArgumentError("mkdir: empty path");
    }
    // Create each prefix ending before a '/', then the whole path.
    for (size_t pos = path.find('/', 1);; pos = path.find('/', pos + 1)) {
      const std::string prefix = pos == std::string::npos ? path : path.substr(0, pos);
      if (!prefix.empty() && prefix.back() != '/') {
        if (mkdir(prefix.c_str(), 0755) != 0) {
          int err = errno;
          struct stat st;
          if (err != EEXIST) return PosixError("mkdir", prefix, err);
          if (stat(prefix.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
            return PosixError("mkdir", prefix, ENOTDIR);
          }
        }
      }
      if (pos == std::string::npos) break;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("open", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) return PosixError("open", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) return PosixError("open", path, errno);
    // (An flock is per open file description: a second LockFile in this
    // process conflicts too.)
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char holder[32] = {0};
      const ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
      close(fd);
      if (err != EWOULDBLOCK) return PosixError("lock", path, err);
      return absl::FailedPreconditionError(absl::StrCat(
          "lock ", path, ": held by pid ", n > 0 ? absl::string_view(holder) : "(unknown)"));
    }
    const std::string pid = std::to_string(getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
      const int err = errno;
      close(fd);
      return PosixError("write the pid into", path, err);
    }
    return std::unique_ptr<FileLock>(new PosixFileLock(fd));
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) {
      return PosixError(absl::StrCat("rename ", from, " to"), to, errno);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", dir, errno);
    absl::Status s;
    if (fsync(fd) != 0) s = PosixError("fsync", dir, errno);
    close(fd);
    return s;
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return PosixError("opendir", dir, errno);
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    const int err = errno;
    closedir(d);
    if (err != 0) return PosixError("readdir", dir, err);
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return PosixError("unlink", path, errno);
    return absl::OkStatus();
  }

  absl::Status DeleteDir(const std::string& path) override {
    if (rmdir(path.c_str()) != 0) return PosixError("rmdir", path, errno);
    return absl::OkStatus();
  }
};

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

absl::Status NoSuchFile(absl::string_view op, const std::string& path) {
  return absl::NotFoundError(absl::StrCat(op, " ", path, ": No such file or directory"));
}

// In-memory file system. Thread-safe: one mutex guards all state. Paths are
// compared as given (no normalization beyond dropping trailing slashes);
// directories are implicit: a file's parents exist once it is written.
// Everything is durable at once (Sync and SyncDir do nothing).
class MemoryFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(path);
    if (it == files_.end()) return NoSuchFile("open", path);
    return it->second;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(path);
    if (it == files_.end()) return NoSuchFile("stat", path);
    return static_cast<uint64_t>(it->second.size());
  }

  bool Exists(const std::string& path) override {
    const std::string p = StripTrailingSlashes(path);
    absl::MutexLock lock(&mu_);
    return files_.count(p) > 0 || IsDirLocked(p);
  }

  bool IsDirectory(const std::string& path) override {
    const std::string p = StripTrailingSlashes(path);
    absl::MutexLock lock(&mu_);
    return IsDirLocked(p);
  }

  absl::Status CreateDirs(const std::string& path) override {
    if (path.empty()) {
      return absl::InvalidArgumentError("mkdir: empty path");
    }
    const std::string p = StripTrailingSlashes(path);
    absl::MutexLock lock(&mu_);
    // A file in the way fails as mkdir would.
    for (size_t pos = 0;; pos = p.find('/', pos + 1)) {
      const std::string prefix = pos == std::string::npos ? p : p.substr(0, pos);
      if (files_.count(prefix) > 0) {
        return absl::FailedPreconditionError(absl::StrCat("mkdir ", prefix, ": Not a directory"));
      }
      if (pos == std::string::npos) break;
    }
    dirs_.insert(p);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    if (path.empty() || path.back() == '/') {
      return absl::InvalidArgumentError(absl::StrCat("open ", path, ": Is a directory"));
    }
    absl::MutexLock lock(&mu_);
    if (IsDirLocked(path)) {
      return absl::FailedPreconditionError(absl::StrCat("open ", path, ": Is a directory"));
    }
    files_[path].clear();
    return std::unique_ptr<WritableFile>(new File(this, path));
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    if (path.empty() || path.back() == '/') {
      return absl::InvalidArgumentError(absl::StrCat("open ", path, ": Is a directory"));
    }
    absl::MutexLock lock(&mu_);
    if (IsDirLocked(path)) {
      return absl::FailedPreconditionError(absl::StrCat("open ", path, ": Is a directory"));
    }
    files_[path];  // (created when missing, kept otherwise)
    return std::unique_ptr<WritableFile>(new File(this, path));
  }

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    if (IsDirLocked(path)) {
      return absl::FailedPreconditionError(absl::StrCat("lock ", path, ": Is a directory"));
    }
    const std::string pid = std::to_string(getpid());
    if (!locked_.insert(path).second) {
      return absl::FailedPreconditionError(absl::StrCat("lock ", path, ": held by pid ", pid));
    }
    files_[path] = pid;
    return std::unique_ptr<FileLock>(new Lock(this, path));
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(from);
    if (it == files_.end()) return NoSuchFile(absl::StrCat("rename ", from, " to"), to);
    if (IsDirLocked(to)) {
      return absl::FailedPreconditionError(
          absl::StrCat("rename ", from, " to ", to, ": Is a directory"));
    }
    std::string data = std::move(it->second);
    files_.erase(it);
    files_[to] = std::move(data);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    absl::MutexLock lock(&mu_);
    if (!IsDirLocked(StripTrailingSlashes(dir))) return NoSuchFile("open", dir);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    const std::string d = StripTrailingSlashes(dir);
    absl::MutexLock lock(&mu_);
    if (!IsDirLocked(d)) return NoSuchFile("opendir", dir);
    const std::string prefix = d == "/" ? d : d + "/";
    std::set<std::string> names;
    auto collect = [&](const std::string& entry) {
      if (entry.compare(0, prefix.size(), prefix) != 0 || entry.size() == prefix.size()) return;
      names.insert(entry.substr(prefix.size(), entry.find('/', prefix.size()) - prefix.size()));
    };
    for (auto it = files_.lower_bound(prefix); it != files_.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      collect(it->first);
    }
    for (auto it = dirs_.lower_bound(prefix); it != dirs_.end(); ++it) {
      if (it->compare(0, prefix.size(), prefix) != 0) break;
      collect(*it);
    }
    return std::vector<std::string>(names.begin(), names.end());
  }

  absl::Status DeleteFile(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    if (files_.erase(path) == 0) return NoSuchFile("unlink", path);
    return absl::OkStatus();
  }

  absl::Status DeleteDir(const std::string& path) override {
    const std::string p = StripTrailingSlashes(path);
    absl::MutexLock lock(&mu_);
    if (!IsDirLocked(p)) return NoSuchFile("rmdir", path);
    const std::string prefix = p + "/";
    auto f = files_.lower_bound(prefix);
    auto d = dirs_.lower_bound(prefix);
    if ((f != files_.end() && f->first.compare(0, prefix.size(), prefix) == 0) ||
        (d != dirs_.end() && d->compare(0, prefix.size(), prefix) == 0)) {
      return absl::FailedPreconditionError(absl::StrCat("rmdir ", path, ": Directory not empty"));
    }
    dirs_.erase(p);
    return absl::OkStatus();
  }

 private:
  class File : public WritableFile {
   public:
    File(MemoryFileSystem* fs, std::string path) : fs_(fs), path_(std::move(path)) {}
    absl::Status Append(absl::string_view data) override {
      if (closed_) {
        return absl::FailedPreconditionError(absl::StrCat("write ", path_, ": file is closed"));
      }
      absl::MutexLock lock(&fs_->mu_);
      fs_->files_[path_].append(data.data(), data.size());
      return absl::OkStatus();
    }
    absl::Status Sync() override { return absl::OkStatus(); }
    absl::Status Truncate(uint64_t size) override {
      if (closed_) {
        return absl::FailedPreconditionError(absl::StrCat("truncate ", path_, ": file is closed"));
      }
      absl::MutexLock lock(&fs_->mu_);
      std::string& data = fs_->files_[path_];
      if (size < data.size()) data.resize(size);
      return absl::OkStatus();
    }
    absl::Status Close() override {
      closed_ = true;
      return absl::OkStatus();
    }

   private:
    MemoryFileSystem* const fs_;  // outlives its files
    const std::string path_;
    bool closed_ = false;
  };

  class Lock : public FileLock {
   public:
    Lock(MemoryFileSystem* fs, std::string path) : fs_(fs), path_(std::move(path)) {}
    ~Lock() override {
      absl::MutexLock lock(&fs_->mu_);
      fs_->locked_.erase(path_);
    }

   private:
    MemoryFileSystem* const fs_;  // outlives its locks
    const std::string path_;
  };

  // True when `path` was created by CreateDirs, is a parent of one that
  // was, or is a parent of a file.
  bool IsDirLocked(const std::string& path) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (dirs_.count(path) > 0) return true;
    const std::string prefix = path == "/" ? path : path + "/";
    // Any entry under `prefix` sorts at or after it.
    auto dir = dirs_.lower_bound(prefix);
    if (dir != dirs_.end() && dir->compare(0, prefix.size(), prefix) == 0) {
      return true;
    }
    auto file = files_.lower_bound(prefix);
    return file != files_.end() && file->first.compare(0, prefix.size(), prefix) == 0;
  }

  mutable absl::Mutex mu_;
  std::map<std::string, std::string> files_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dirs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> locked_ ABSL_GUARDED_BY(mu_);  // paths a Lock holds
};

}  // namespace

std::unique_ptr<FileSystem> NewPosixFileSystem() { return std::make_unique<PosixFileSystem>(); }

std::unique_ptr<FileSystem> NewMemoryFileSystem() { return std::make_unique<MemoryFileSystem>(); }

}  // namespace strata::storage
