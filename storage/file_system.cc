#include "storage/file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace strata::storage {
namespace {

// "<op> <path>: <strerror>" with the code errno maps to (ENOENT ->
// NotFound, EACCES -> PermissionDenied, ...).
absl::Status PosixError(absl::string_view op, const std::string& path,
                        int err) {
  return absl::ErrnoToStatus(err, absl::StrCat(op, " ", path));
}

// Parent directory of `path` for fsync after rename: "a/b" -> "a",
// "b" -> ".", "/b" -> "/".
std::string ParentDir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

int CloseRetryingIntr(int fd) {
  // On Linux the descriptor is released even when close() reports EINTR, so
  // retrying would close someone else's; report only real errors.
  int rc = close(fd);
  if (rc != 0 && errno == EINTR) return 0;
  return rc;
}

// POSIX file system. Thread-safe: holds no state; concurrent writers of the
// same path race on "path.tmp" like any two processes would.
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
      if (st.st_size > 0) contents.reserve(static_cast<size_t>(st.st_size));
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

  absl::Status WriteFileAtomic(const std::string& path,
                               const std::string& contents) override {
    const std::string tmp = path + ".tmp";
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PosixError("open", tmp, errno);
    absl::Status status = WriteAll(fd, tmp, contents);
    if (status.ok() && fsync(fd) != 0) status = PosixError("fsync", tmp, errno);
    if (CloseRetryingIntr(fd) != 0 && status.ok()) {
      status = PosixError("close", tmp, errno);
    }
    if (status.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
      status = PosixError(absl::StrCat("rename ", tmp, " to"), path, errno);
    }
    if (!status.ok()) {
      unlink(tmp.c_str());
      return status;
    }
    // Make the rename itself durable.
    const std::string dir = ParentDir(path);
    int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) return PosixError("open", dir, errno);
    if (fsync(dir_fd) != 0) status = PosixError("fsync", dir, errno);
    close(dir_fd);
    return status;
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

  absl::Status CreateDirs(const std::string& path) override {
    if (path.empty()) {
      return absl::InvalidArgumentError("mkdir: empty path");
    }
    // Create each prefix ending before a '/', then the whole path.
    for (size_t pos = path.find('/', 1);; pos = path.find('/', pos + 1)) {
      const std::string prefix =
          pos == std::string::npos ? path : path.substr(0, pos);
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

 private:
  static absl::Status WriteAll(int fd, const std::string& path,
                               absl::string_view data) {
    while (!data.empty()) {
      ssize_t n = write(fd, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("write", path, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }
};

// In-memory file system. Thread-safe: one mutex guards all state. Paths are
// compared as given (no normalization beyond dropping trailing slashes);
// directories are implicit: a file's parents exist once it is written.
class MemoryFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(path);
    if (it == files_.end()) {
      return absl::NotFoundError(
          absl::StrCat("open ", path, ": No such file or directory"));
    }
    return it->second;
  }

  absl::Status WriteFileAtomic(const std::string& path,
                               const std::string& contents) override {
    if (path.empty() || path.back() == '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("open ", path, ": Is a directory"));
    }
    absl::MutexLock lock(&mu_);
    if (IsDirLocked(path)) {
      return absl::FailedPreconditionError(
          absl::StrCat("rename ", path, ".tmp to ", path, ": Is a directory"));
    }
    files_[path] = contents;
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(path);
    if (it == files_.end()) {
      return absl::NotFoundError(
          absl::StrCat("stat ", path, ": No such file or directory"));
    }
    return static_cast<uint64_t>(it->second.size());
  }

  bool Exists(const std::string& path) override {
    const std::string p = StripTrailingSlashes(path);
    absl::MutexLock lock(&mu_);
    return files_.count(p) > 0 || IsDirLocked(p);
  }

  absl::Status CreateDirs(const std::string& path) override {
    if (path.empty()) {
      return absl::InvalidArgumentError("mkdir: empty path");
    }
    const std::string p = StripTrailingSlashes(path);
    absl::MutexLock lock(&mu_);
    // A file in the way fails as mkdir would.
    for (size_t pos = 0;; pos = p.find('/', pos + 1)) {
      const std::string prefix =
          pos == std::string::npos ? p : p.substr(0, pos);
      if (files_.count(prefix) > 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("mkdir ", prefix, ": Not a directory"));
      }
      if (pos == std::string::npos) break;
    }
    dirs_.insert(p);
    return absl::OkStatus();
  }

 private:
  static std::string StripTrailingSlashes(std::string path) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    return path;
  }

  // True when `path` was created by CreateDirs, is a parent of one that
  // was, or is a parent of a file.
  bool IsDirLocked(const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (dirs_.count(path) > 0) return true;
    const std::string prefix = path == "/" ? path : path + "/";
    // Any entry under `prefix` sorts at or after it.
    auto dir = dirs_.lower_bound(prefix);
    if (dir != dirs_.end() && dir->compare(0, prefix.size(), prefix) == 0) {
      return true;
    }
    auto file = files_.lower_bound(prefix);
    return file != files_.end() &&
           file->first.compare(0, prefix.size(), prefix) == 0;
  }

  mutable absl::Mutex mu_;
  std::map<std::string, std::string> files_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dirs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<FileSystem> NewPosixFileSystem() {
  return std::make_unique<PosixFileSystem>();
}

std::unique_ptr<FileSystem> NewMemoryFileSystem() {
  return std::make_unique<MemoryFileSystem>();
}

}  // namespace strata::storage
