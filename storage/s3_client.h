// A client of the S3 API (AWS S3, MinIO, Ceph's radosgw) on libcurl with
// our own Signature V4 (storage/s3_sign.h): objects, ranged reads, listing
// by prefix, multipart uploads. Every request has a connect timeout and a
// stall timeout and is retried with exponential backoff and jitter on
// connection errors, 5xx, 429 and RequestTimeout. docs/storage.md.
#ifndef STRATA_STORAGE_S3_CLIENT_H_
#define STRATA_STORAGE_S3_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace strata::storage {

// Never logged or put in an error message but for `source` and the access
// key id.
struct S3Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // optional (x-amz-security-token)
  std::string source;         // "AWS_ACCESS_KEY_ID in the environment", "file F"
};

// Looks the keys up in `file` when it is not empty, else in the systemd
// credential "s3" ($CREDENTIALS_DIRECTORY/s3, given by LoadCredential=),
// else in the variables AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and
// AWS_SESSION_TOKEN) that `getenv` returns (main passes ::getenv). The file is either AWS's shared
// credentials format ("[default]" then "aws_access_key_id = ..." and
// "aws_secret_access_key = ...", the first section used) or the same keys
// without a section. Errors name the file and line, or the variables.
absl::StatusOr<S3Credentials> LoadS3Credentials(
    const std::string& file, const std::function<const char*(const char*)>& getenv);

struct S3ClientOptions {
  std::string endpoint;  // "http://127.0.0.1:7480", "https://s3.us-east-1.amazonaws.com"
  std::string region = "us-east-1";
  // Virtual-host addressing puts the bucket in the host name
  // (bucket.endpoint-host); path-style puts it first in the path.
  bool virtual_host = false;
  S3Credentials credentials;
  int connect_timeout_ms = 5000;
  // A request that moves no byte for this long fails (and is retried).
  int stall_timeout_ms = 30000;
  int retries = 4;            // attempts after the first
  int backoff_ms = 200;       // before the first retry; doubles, with jitter, up to 5 s
  int list_page_keys = 1000;  // keys asked for per listing page
  // Tests only: where to connect, whatever the endpoint's host name says
  // ("127.0.0.1:7480"); lets virtual-host addressing be tried without DNS.
  std::string connect_to_for_testing;
  // Tests only: called before each attempt with the operation ("PutObject",
  // "UploadPart", ...) and the attempt number (0 first); a non-OK status
  // makes that attempt fail as a connection error would.
  std::function<absl::Status(absl::string_view op, int attempt)> fault_for_testing;
  // Tests only: true makes that attempt's request go through but its
  // answer be lost (a connection dropped after the store acted).
  std::function<bool(absl::string_view op, int attempt)> lose_answer_for_testing;
  // Tests only: true makes that attempt send its body with one bit flipped
  // after it was summed and signed (a body damaged on the way).
  std::function<bool(absl::string_view op, int attempt)> damage_body_for_testing;
};

struct S3ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

struct S3Listing {
  std::vector<S3ObjectInfo> objects;  // keys under the prefix, sorted
  std::vector<std::string> prefixes;  // "common prefixes" up to the delimiter
};

struct S3Counters {
  uint64_t requests = 0;
  uint64_t retries = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

// Thread-safe: calls from many threads run at once, each on a connection
// of a pool.
class S3Client {
 public:
  // InvalidArgument for a malformed endpoint or missing keys.
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3ClientOptions options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // Errors: NotFound (NoSuchKey / NoSuchBucket), PermissionDenied (bad keys,
  // signature, access), Unavailable (connection or 5xx after the retries),
  // InvalidArgument (another 4xx); each names the method, the s3:// URL,
  // the endpoint and S3's error code and message.
  absl::Status PutObject(const std::string& bucket, const std::string& key, absl::string_view body);
  // `length` < 0 reads to the end. A range past the end is OutOfRange.
  absl::StatusOr<std::string> GetObject(const std::string& bucket, const std::string& key,
                                        uint64_t offset = 0, int64_t length = -1);
  // Exactly `length` bytes at `offset` into `dst`, with no copy in between
  // (a large read's ranges land in place). A short object is Unavailable
  // (retried), a range past the end OutOfRange.
  // With `if_match` (an ETag from HeadObject), an object replaced since is
  // FailedPrecondition instead of a mix of two versions.
  absl::Status GetObjectInto(const std::string& bucket, const std::string& key, uint64_t offset,
                             uint64_t length, char* dst, const std::string& if_match = "");
  // The object's size, and its ETag when `etag` is not null.
  absl::StatusOr<uint64_t> HeadObject(const std::string& bucket, const std::string& key,
                                      std::string* etag = nullptr);
  // All keys under `prefix` (every page); with a delimiter, keys past the
  // next delimiter are rolled up into `prefixes`. `max_keys` > 0 stops
  // after that many entries.
  absl::StatusOr<S3Listing> List(const std::string& bucket, const std::string& prefix,
                                 const std::string& delimiter, int max_keys = 0);
  // OK when the object does not exist.
  absl::Status DeleteObject(const std::string& bucket, const std::string& key);
  // Multi-object delete: requests of up to 1000 keys each. Keys that do not
  // exist are no error; a key the store refused fails the call, naming it
  // and S3's code (after the other keys of its request are gone).
  absl::Status DeleteObjects(const std::string& bucket, const std::vector<std::string>& keys);
  // Server-side copy within the bucket.
  absl::Status CopyObject(const std::string& bucket, const std::string& from_key,
                          const std::string& to_key);
  absl::Status CreateBucket(const std::string& bucket);
  // OK when the bucket exists and these keys may read it.
  absl::Status CheckBucket(const std::string& bucket);

  // Multipart upload. Parts are numbered from 1; all but the last must be
  // at least 5 MiB. UploadPart returns the part's ETag.
  absl::StatusOr<std::string> CreateMultipartUpload(const std::string& bucket,
                                                    const std::string& key);
  absl::StatusOr<std::string> UploadPart(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, int part_number,
                                         absl::string_view body);
  absl::Status CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                       const std::string& upload_id,
                                       const std::vector<std::string>& etags);
  absl::Status AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                    const std::string& upload_id);

  const S3ClientOptions& options() const { return options_; }
  S3Counters counters() const;

  struct Request;
  struct Response;

 private:
  explicit S3Client(S3ClientOptions options);
  // One request with its retries.
  absl::StatusOr<Response> Call(absl::string_view op, Request& request);
  absl::StatusOr<Response> Once(Request& request);
  void* TakeHandle();
  void ReturnHandle(void* handle);

  const S3ClientOptions options_;
  std::string scheme_;    // "http" / "https"
  std::string hostport_;  // "127.0.0.1:7480"
  mutable absl::Mutex mu_;
  std::vector<void*> idle_ ABSL_GUARDED_BY(mu_);  // CURL* easy handles
  S3Counters counters_ ABSL_GUARDED_BY(mu_);
};

// "s3://bucket/a/b" -> {"bucket", "a/b"}; InvalidArgument naming the URL
// when it is not one (no bucket, a bucket name under 3 characters).
absl::Status ParseS3Url(absl::string_view url, std::string* bucket, std::string* key);

}  // namespace strata::storage

#endif  // STRATA_STORAGE_S3_CLIENT_H_
