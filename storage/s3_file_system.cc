#include "storage/s3_file_system.h"

#include <atomic>
#include <deque>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/huge_pages.h"
#include "common/status_macros.h"
#include "common/threads.h"
#include "glog/logging.h"

namespace strata::storage {
namespace {

constexpr uint64_t kMinPartBytes = 5 << 20;

// One file being written. Not thread-safe (one writer), like every
// WritableFile; its part uploads run on threads of their own.
class S3WritableFile : public WritableFile {
 public:
  S3WritableFile(S3Client* client, std::string bucket, std::string key, uint64_t part_bytes,
                 int parallel)
      : client_(client),
        bucket_(std::move(bucket)),
        key_(std::move(key)),
        part_bytes_(part_bytes),
        parallel_(parallel) {}
  ~S3WritableFile() override {
    if (!closed_) {
      JoinAll();
      AbortUpload();
    }
  }
  S3WritableFile(const S3WritableFile&) = delete;
  S3WritableFile& operator=(const S3WritableFile&) = delete;

  absl::Status Append(absl::string_view data) override {
    if (closed_)
      return absl::FailedPreconditionError(absl::StrCat("write ", Url(), ": file is closed"));
    if (!error_.ok()) return error_;
    bytes_ += data.size();
    // Parts are cut from `data` as it comes: a large append is copied once.
    while (!data.empty() && error_.ok()) {
      const size_t take = std::min<size_t>(part_bytes_ - buffer_.size(), data.size());
      buffer_.append(data.data(), take);
      data.remove_prefix(take);
      if (buffer_.size() == part_bytes_) {
        std::string part;
        part.swap(buffer_);
        StartPart(std::move(part));
      }
    }
    return error_;
  }

  // Nothing is durable in an object store before the object is whole: the
  // upload's errors so far.
  absl::Status Sync() override { return error_; }

  absl::Status Close() override {
    if (closed_) return error_;
    closed_ = true;
    if (upload_id_.empty()) {
      if (error_.ok()) error_ = client_->PutObject(bucket_, key_, buffer_);
      buffer_.clear();
      return error_;
    }
    if (!buffer_.empty() && error_.ok()) StartPart(std::move(buffer_));
    buffer_.clear();
    JoinAll();
    if (error_.ok()) {
      error_ = client_->CompleteMultipartUpload(bucket_, key_, upload_id_, etags_);
      if (absl::IsNotFound(error_)) {
        // NoSuchUpload after a retry: the first attempt completed and its
        // answer was lost. The object says whether it is there, whole.
        absl::StatusOr<uint64_t> size = client_->HeadObject(bucket_, key_);
        if (size.ok() && *size == bytes_) {
          error_ = absl::OkStatus();
          upload_id_.clear();
        }
      }
    }
    if (!error_.ok()) AbortUpload();
    return error_;
  }

 private:
  struct Part {
    int number = 0;
    std::string bytes;
    std::string etag;
    absl::Status status;
    std::thread thread;
  };

  std::string Url() const { return absl::StrCat("s3://", bucket_, "/", key_); }

  void StartPart(std::string bytes) {
    if (upload_id_.empty()) {
      absl::StatusOr<std::string> id = client_->CreateMultipartUpload(bucket_, key_);
      if (!id.ok()) {
        error_ = id.status();
        return;
      }
      upload_id_ = *id;
    }
    while (static_cast<int>(in_flight_.size()) >= parallel_) JoinOldest();
    if (!error_.ok()) return;
    auto part = std::make_unique<Part>();
    part->number = static_cast<int>(etags_.size()) + 1;
    part->bytes = std::move(bytes);
    etags_.emplace_back();
    Part* p = part.get();
    auto upload = [this, p] {
      absl::StatusOr<std::string> etag =
          client_->UploadPart(bucket_, key_, upload_id_, p->number, p->bytes);
      if (etag.ok()) {
        p->etag = *etag;
      } else {
        p->status = etag.status();
      }
    };
    if (!TryStartThread(&p->thread, upload)) upload();  // (joined: not joinable)
    in_flight_.push_back(std::move(part));
  }

  void JoinOldest() {
    std::unique_ptr<Part> p = std::move(in_flight_.front());
    in_flight_.pop_front();
    if (p->thread.joinable()) p->thread.join();
    if (!p->status.ok()) {
      if (error_.ok()) error_ = p->status;
      return;
    }
    etags_[p->number - 1] = p->etag;
  }

  void JoinAll() {
    while (!in_flight_.empty()) JoinOldest();
  }

  void AbortUpload() {
    if (upload_id_.empty()) return;
    absl::Status s = client_->AbortMultipartUpload(bucket_, key_, upload_id_);
    if (!s.ok()) LOG(WARNING) << "could not abort the upload of " << Url() << ": " << s;
    upload_id_.clear();
  }

  S3Client* const client_;  // owned by the file system, which outlives its files
  const std::string bucket_;
  const std::string key_;
  const uint64_t part_bytes_;
  const int parallel_;
  std::string buffer_;
  uint64_t bytes_ = 0;  // appended so far
  std::string upload_id_;
  std::vector<std::string> etags_;  // by part number - 1
  std::deque<std::unique_ptr<Part>> in_flight_;
  absl::Status error_;
  bool closed_ = false;
};

// Thread-safe: the client is.
class S3FileSystem : public FileSystem {
 public:
  S3FileSystem(std::unique_ptr<S3Client> client, uint64_t part_bytes, int parallel)
      : client_(std::move(client)), part_bytes_(part_bytes), parallel_(parallel) {}

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    std::string bucket, key;
    STRATA_RETURN_IF_ERROR(ParseObject(path, &bucket, &key));
    std::string etag;
    STRATA_ASSIGN_OR_RETURN(uint64_t size, client_->HeadObject(bucket, key, &etag));
    std::string out;
    ResizeLargeString(&out, size);
    if (size <= part_bytes_) {
      STRATA_RETURN_IF_ERROR(client_->GetObjectInto(bucket, key, 0, size, out.data(), etag));
      return out;
    }
    // Ranged GETs, `parallel_` at a time, straight into the result.
    const uint64_t ranges = (size + part_bytes_ - 1) / part_bytes_;
    std::atomic<uint64_t> next{0};
    std::vector<absl::Status> errors(ranges);
    auto work = [&] {
      for (uint64_t i = next++; i < ranges; i = next++) {
        const uint64_t off = i * part_bytes_;
        const uint64_t n = std::min(part_bytes_, size - off);
        // Every range of the same version of the object (If-Match).
        errors[i] = client_->GetObjectInto(bucket, key, off, n, out.data() + off, etag);
      }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < parallel_ && static_cast<uint64_t>(t) < ranges; ++t) {
      if (!TryAddThread(&threads, work)) break;
    }
    work();
    for (std::thread& t : threads) t.join();
    for (const absl::Status& e : errors) STRATA_RETURN_IF_ERROR(e);
    return out;
  }

  absl::StatusOr<std::string> ReadFileRange(const std::string& path, uint64_t offset,
                                            uint64_t n) override {
    std::string bucket, key;
    STRATA_RETURN_IF_ERROR(ParseObject(path, &bucket, &key));
    if (n == 0) return std::string();
    absl::StatusOr<std::string> bytes =
        client_->GetObject(bucket, key, offset, static_cast<int64_t>(n));
    if (absl::IsOutOfRange(bytes.status())) return std::string();  // past the end
    return bytes;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    std::string bucket, key;
    STRATA_RETURN_IF_ERROR(ParseObject(path, &bucket, &key));
    return client_->HeadObject(bucket, key);
  }

  bool Exists(const std::string& path) override {
    std::string bucket, key;
    if (!ParseS3Url(path, &bucket, &key).ok()) return false;
    if (!key.empty() && client_->HeadObject(bucket, key).ok()) return true;
    return IsDirectory(path);
  }

  bool IsDirectory(const std::string& path) override {
    std::string bucket, key;
    if (!ParseS3Url(path, &bucket, &key).ok()) return false;
    if (key.empty()) return client_->CheckBucket(bucket).ok();
    absl::StatusOr<S3Listing> l = client_->List(bucket, key + "/", "/", 1);
    return l.ok() && (!l->objects.empty() || !l->prefixes.empty());
  }

  // Directories are implicit: checks that the bucket is there and that
  // these keys may use it, so a wrong key or bucket shows at start.
  // Once a bucket passed, it is not asked again (a pserver "creates" its
  // checkpoint directory for every checkpoint).
  absl::Status CreateDirs(const std::string& path) override {
    std::string bucket, key;
    STRATA_RETURN_IF_ERROR(ParseS3Url(path, &bucket, &key));
    {
      absl::MutexLock l(&mu_);
      if (checked_buckets_.count(bucket) > 0) return absl::OkStatus();
    }
    absl::Status s = client_->CheckBucket(bucket);
    if (absl::IsNotFound(s)) {
      return absl::NotFoundError(absl::StrCat(
          path, ": bucket ", bucket, " does not exist (create it first: ", s.message(), ")"));
    }
    if (s.ok()) {
      absl::MutexLock l(&mu_);
      checked_buckets_.insert(bucket);
    }
    return s;
  }

  // One listing of the prefix and batched deletes, not a walk that asks
  // about every entry.
  absl::Status DeleteRecursively(const std::string& path) override {
    std::string bucket, key;
    STRATA_RETURN_IF_ERROR(ParseS3Url(path, &bucket, &key));
    if (key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("delete ", path, ": refusing to empty a whole bucket"));
    }
    STRATA_ASSIGN_OR_RETURN(S3Listing l, client_->List(bucket, key + "/", ""));
    std::vector<std::string> keys = {key};  // the object of that name, if any
    for (const S3ObjectInfo& o : l.objects) keys.push_back(o.key);
    return client_->DeleteObjects(bucket, keys);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    std::string bucket, key;
    STRATA_RETURN_IF_ERROR(ParseObject(path, &bucket, &key));
    return std::unique_ptr<WritableFile>(
        new S3WritableFile(client_.get(), bucket, key, part_bytes_, parallel_));
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    std::string fb, fk, tb, tk;
    STRATA_RETURN_IF_ERROR(ParseObject(from, &fb, &fk));
    STRATA_RETURN_IF_ERROR(ParseObject(to, &tb, &tk));
    if (fb != tb) {
      return absl::InvalidArgumentError(
          absl::StrCat("rename ", from, " to ", to, ": not within one bucket"));
    }
    STRATA_RETURN_IF_ERROR(client_->CopyObject(fb, fk, tk));
    return client_->DeleteObject(fb, fk);
  }

  absl::Status SyncDir(const std::string&) override { return absl::OkStatus(); }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    std::string bucket, key;
    STRATA_RETURN_IF_ERROR(ParseS3Url(dir, &bucket, &key));
    const std::string prefix = key.empty() ? "" : key + "/";
    STRATA_ASSIGN_OR_RETURN(S3Listing l, client_->List(bucket, prefix, "/"));
    std::vector<std::string> names;
    for (const S3ObjectInfo& o : l.objects) {
      absl::string_view name = o.key;
      absl::ConsumePrefix(&name, prefix);
      if (!name.empty()) names.emplace_back(name);
    }
    for (const std::string& p : l.prefixes) {
      absl::string_view name = p;
      absl::ConsumePrefix(&name, prefix);
      absl::ConsumeSuffix(&name, "/");
      if (!name.empty()) names.emplace_back(name);
    }
    if (names.empty()) {
      return absl::NotFoundError(absl::StrCat("opendir ", dir, ": no object under it"));
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status DeleteFile(const std::string& path) override {
    std::string bucket, key;
    STRATA_RETURN_IF_ERROR(ParseObject(path, &bucket, &key));
    return client_->DeleteObject(bucket, key);
  }

  absl::Status DeleteDir(const std::string&) override { return absl::OkStatus(); }

  absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents) override {
    std::string bucket, key;
    STRATA_RETURN_IF_ERROR(ParseObject(path, &bucket, &key));
    if (contents.size() > part_bytes_) {
      // A multipart upload is atomic too: the object appears at Complete.
      STRATA_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, NewWritableFile(path));
      STRATA_RETURN_IF_ERROR(f->Append(contents));
      return f->Close();
    }
    return client_->PutObject(bucket, key, contents);
  }

 private:
  static absl::Status ParseObject(const std::string& path, std::string* bucket, std::string* key) {
    STRATA_RETURN_IF_ERROR(ParseS3Url(path, bucket, key));
    if (key->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": names a bucket, not an object"));
    }
    return absl::OkStatus();
  }

  const std::unique_ptr<S3Client> client_;
  absl::Mutex mu_;
  std::set<std::string> checked_buckets_ ABSL_GUARDED_BY(mu_);
  const uint64_t part_bytes_;
  const int parallel_;
};

// Thread-safe: both file systems are.
class RoutingFileSystem : public FileSystem {
 public:
  RoutingFileSystem(std::unique_ptr<FileSystem> local, std::unique_ptr<FileSystem> s3)
      : local_(std::move(local)), s3_(std::move(s3)) {}

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->ReadFile(path);
  }
  absl::StatusOr<std::string> ReadFileRange(const std::string& path, uint64_t offset,
                                            uint64_t n) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->ReadFileRange(path, offset, n);
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->FileSize(path);
  }
  bool Exists(const std::string& path) override {
    absl::StatusOr<FileSystem*> fs = For(path);
    return fs.ok() && (*fs)->Exists(path);
  }
  bool IsDirectory(const std::string& path) override {
    absl::StatusOr<FileSystem*> fs = For(path);
    return fs.ok() && (*fs)->IsDirectory(path);
  }
  absl::Status CreateDirs(const std::string& path) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->CreateDirs(path);
  }
  absl::Status DeleteRecursively(const std::string& path) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->DeleteRecursively(path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->NewWritableFile(path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->NewAppendableFile(path);
  }
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->LockFile(path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (IsS3Path(from) != IsS3Path(to)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rename ", from, " to ", to, ": between a local path and an object store"));
    }
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(from));
    return fs->RenameFile(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(dir));
    return fs->SyncDir(dir);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(dir));
    return fs->ListDir(dir);
  }
  absl::Status DeleteFile(const std::string& path) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->DeleteFile(path);
  }
  absl::Status DeleteDir(const std::string& path) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->DeleteDir(path);
  }
  absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents) override {
    STRATA_ASSIGN_OR_RETURN(FileSystem * fs, For(path));
    return fs->WriteFileAtomic(path, contents);
  }

 private:
  absl::StatusOr<FileSystem*> For(const std::string& path) const {
    if (!IsS3Path(path)) return local_.get();
    if (s3_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(path,
                       ": an object-store path needs the s3 section of the config (endpoint, "
                       "credentials)"));
    }
    return s3_.get();
  }

  const std::unique_ptr<FileSystem> local_;
  const std::unique_ptr<FileSystem> s3_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FileSystem>> NewS3FileSystem(S3FileSystemOptions options) {
  if (options.part_bytes < kMinPartBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("s3 part size ", options.part_bytes, " is under S3's minimum of 5 MiB"));
  }
  if (options.parallel_parts < 1) {
    return absl::InvalidArgumentError("s3 parallel_parts must be at least 1");
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client,
                          S3Client::Create(std::move(options.client)));
  return std::unique_ptr<FileSystem>(
      new S3FileSystem(std::move(client), options.part_bytes, options.parallel_parts));
}

std::unique_ptr<FileSystem> NewRoutingFileSystem(std::unique_ptr<FileSystem> local,
                                                 std::unique_ptr<FileSystem> s3) {
  return std::make_unique<RoutingFileSystem>(std::move(local), std::move(s3));
}

absl::StatusOr<std::unique_ptr<FileSystem>> NewFileSystemForConfig(
    const S3Section& s3, const std::function<const char*(const char*)>& getenv,
    std::string* described) {
  if (!s3.enabled) return NewRoutingFileSystem(NewPosixFileSystem(), nullptr);
  S3FileSystemOptions o;
  o.client.endpoint = s3.endpoint;
  o.client.region = s3.region;
  o.client.virtual_host = s3.addressing == "virtual";
  o.client.connect_timeout_ms = s3.connect_timeout_ms;
  o.client.stall_timeout_ms = s3.timeout_seconds * 1000;
  o.client.retries = s3.retries;
  STRATA_ASSIGN_OR_RETURN(o.client.credentials, LoadS3Credentials(s3.credentials_file, getenv));
  o.part_bytes = static_cast<uint64_t>(s3.part_size_mb) << 20;
  o.parallel_parts = s3.parallel_parts;
  if (described != nullptr) {
    *described = absl::StrCat("object store ", s3.endpoint, " (", s3.addressing,
                              "-style addressing), access key ", o.client.credentials.access_key,
                              " from ", o.client.credentials.source);
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<FileSystem> fs, NewS3FileSystem(std::move(o)));
  return NewRoutingFileSystem(NewPosixFileSystem(), std::move(fs));
}

absl::Status CheckCheckpointRoot(FileSystem* fs, const CheckpointSection& checkpoint) {
  if (!checkpoint.enabled) return absl::OkStatus();
  absl::Status s = fs->CreateDirs(checkpoint.dir);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("checkpoint.dir ", checkpoint.dir, ": ", s.message()));
}

}  // namespace strata::storage
