#include "storage/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/json.h"
#include "glog/logging.h"
#include "storage/s3_sign.h"

namespace strata::storage {

struct S3Client::Request {
  std::string method = "GET";
  std::string bucket;
  std::string key;  // "" for the bucket itself
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;  // besides the signed basics
  absl::string_view body;
  bool content_md5 = false;  // send Content-MD5 of the body
  // A successful answer's body goes here (exactly `into_size` bytes
  // expected) instead of into Response::body.
  char* into = nullptr;
  size_t into_size = 0;
  uint64_t into_offset = 0;  // the range's first byte
  bool damage_body = false;  // tests: send the body with one bit flipped
};

struct S3Client::Response {
  long status = 0;
  std::string body;
  std::string etag;
  int64_t content_length = -1;
};

namespace {

std::once_flag curl_once;

std::string Url(const std::string& bucket, const std::string& key) {
  return key.empty() ? absl::StrCat("s3://", bucket) : absl::StrCat("s3://", bucket, "/", key);
}

void XmlUnescape(std::string* s) {
  if (s->find('&') == std::string::npos) return;
  std::string out;
  for (size_t i = 0; i < s->size(); ++i) {
    if ((*s)[i] != '&') {
      out.push_back((*s)[i]);
      continue;
    }
    const size_t semi = s->find(';', i);
    if (semi == std::string::npos) {
      out.append(s->substr(i));
      break;
    }
    const std::string ent = s->substr(i + 1, semi - i - 1);
    if (ent == "amp")
      out.push_back('&');
    else if (ent == "lt")
      out.push_back('<');
    else if (ent == "gt")
      out.push_back('>');
    else if (ent == "quot")
      out.push_back('"');
    else if (ent == "apos")
      out.push_back('\'');
    else if (!ent.empty() && ent[0] == '#') {
      uint32_t code = 0;
      const bool hex = ent.size() > 1 && (ent[1] == 'x' || ent[1] == 'X');
      const bool ok =
          hex ? absl::SimpleHexAtoi(ent.substr(2), &code) : absl::SimpleAtoi(ent.substr(1), &code);
      if (ok && code < 0x80) out.push_back(static_cast<char>(code));
    } else {
      out.append(s->substr(i, semi - i + 1));
    }
    i = semi;
  }
  *s = std::move(out);
}

// The texts of every <tag>...</tag> in `xml`, in order (S3's responses
// are flat enough for this; no attributes on the tags we read).
std::vector<std::string> XmlAll(absl::string_view xml, absl::string_view tag) {
  std::vector<std::string> out;
  const std::string open = absl::StrCat("<", tag, ">");
  const std::string close = absl::StrCat("</", tag, ">");
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != absl::string_view::npos) {
    const size_t start = pos + open.size();
    const size_t end = xml.find(close, start);
    if (end == absl::string_view::npos) break;
    std::string text(xml.substr(start, end - start));
    XmlUnescape(&text);
    out.push_back(std::move(text));
    pos = end + close.size();
  }
  return out;
}

std::string XmlFirst(absl::string_view xml, absl::string_view tag) {
  std::vector<std::string> all = XmlAll(xml, tag);
  return all.empty() ? "" : all.front();
}

std::string XmlEscape(absl::string_view s) { return MarkupEscape(s); }

// Where a response body goes: a 2xx body into the caller's buffer when it
// gave one, anything else (an error's XML) into the string.
struct BodySink {
  CURL* curl = nullptr;
  std::string* body = nullptr;
  char* into = nullptr;
  size_t cap = 0;
  size_t got = 0;
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<BodySink*>(user);
  const size_t bytes = size * n;
  if (sink->into != nullptr) {
    long code = 0;
    curl_easy_getinfo(sink->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 200 && code < 300) {
      if (sink->got + bytes > sink->cap) return 0;  // more than asked for: abort
      std::memcpy(sink->into + sink->got, data, bytes);
      sink->got += bytes;
      return bytes;
    }
  }
  sink->body->append(data, bytes);
  return bytes;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  absl::string_view line(data, size * n);
  if (absl::StartsWithIgnoreCase(line, "etag:")) {
    *static_cast<std::string*>(user) = std::string(absl::StripAsciiWhitespace(line.substr(5)));
  }
  return size * n;
}

std::string AmzDate(absl::Time now) {
  return absl::FormatTime("%Y%m%dT%H%M%SZ", now, absl::UTCTimeZone());
}

bool Retryable(long http, const std::string& code) {
  // BadDigest, XAmzContentSHA256Mismatch: the body was damaged on the way
  // (its Content-MD5 or signed SHA-256 differs).
  return http == 500 || http == 502 || http == 503 || http == 504 || http == 429 ||
         (http == 400 &&
          (code == "RequestTimeout" || code == "BadDigest" || code == "XAmzContentSHA256Mismatch"));
}

absl::Status HttpError(long http, const std::string& what, const std::string& body) {
  const std::string code = XmlFirst(body, "Code");
  const std::string message = XmlFirst(body, "Message");
  std::string text = absl::StrCat(what, ": HTTP ", http);
  if (!code.empty()) absl::StrAppend(&text, " ", code);
  if (!message.empty()) absl::StrAppend(&text, ": ", message);
  if (http == 404) return absl::NotFoundError(text);
  if (http == 403) {
    if (code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code.empty()) {
      absl::StrAppend(&text, " (the access key or secret key is wrong)");
    }
    return absl::PermissionDeniedError(text);
  }
  if (http == 416) return absl::OutOfRangeError(text);
  if (http == 412) {
    return absl::FailedPreconditionError(
        absl::StrCat(text, " (the object was replaced while it was read)"));
  }
  if (http >= 500 || http == 429 || http == 408) return absl::UnavailableError(text);
  return absl::InvalidArgumentError(text);
}

absl::Status ParseCredentialLine(absl::string_view line, const std::string& where,
                                 S3Credentials* c) {
  std::pair<absl::string_view, absl::string_view> kv =
      absl::StrSplit(line, absl::MaxSplits('=', 1));
  const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(kv.first));
  const std::string value(absl::StripAsciiWhitespace(kv.second));
  if (line.find('=') == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected NAME = VALUE"));
  }
  if (name == "aws_access_key_id" || name == "access_key") {
    c->access_key = value;
  } else if (name == "aws_secret_access_key" || name == "secret_key") {
    c->secret_key = value;
  } else if (name == "aws_session_token") {
    c->session_token = value;
  }  // other keys (region, output) are not ours: ignored
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<S3Credentials> LoadS3Credentials(
    const std::string& file, const std::function<const char*(const char*)>& getenv) {
  S3Credentials c;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("s3 credentials file ", file, ": cannot be read (",
                                              std::strerror(errno), ")"));
    }
    std::string line;
    int number = 0;
    int sections = 0;
    while (std::getline(in, line)) {
      ++number;
      absl::string_view l = absl::StripAsciiWhitespace(line);
      if (l.empty() || l[0] == '#' || l[0] == ';') continue;
      if (l[0] == '[') {
        if (++sections > 1) break;  // the first profile only
        continue;
      }
      if (absl::Status s = ParseCredentialLine(l, absl::StrCat(file, ":", number), &c); !s.ok()) {
        return s;
      }
    }
    c.source = absl::StrCat("file ", file);
    if (c.access_key.empty() || c.secret_key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "s3 credentials file ", file, ": needs aws_access_key_id and aws_secret_access_key"));
    }
    return c;
  }
  // A systemd credential (LoadCredential=s3:... in the units): the file
  // "s3" in $CREDENTIALS_DIRECTORY, readable by this service only.
  if (const char* dir = getenv("CREDENTIALS_DIRECTORY"); dir != nullptr && *dir != '\0') {
    const std::string systemd_file = absl::StrCat(dir, "/s3");
    if (std::ifstream(systemd_file).good()) {
      absl::StatusOr<S3Credentials> from_systemd = LoadS3Credentials(systemd_file, getenv);
      if (from_systemd.ok()) {
        from_systemd->source = absl::StrCat("systemd credential s3 (", systemd_file, ")");
      }
      return from_systemd;
    }
  }
  const char* key = getenv("AWS_ACCESS_KEY_ID");
  const char* secret = getenv("AWS_SECRET_ACCESS_KEY");
  if (key == nullptr || secret == nullptr || *key == '\0' || *secret == '\0') {
    return absl::InvalidArgumentError(
        "no s3 credentials: set s3.credentials_file in the config, give the service the "
        "systemd credential s3 (LoadCredential=), or set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY in the daemon's environment");
  }
  c.access_key = key;
  c.secret_key = secret;
  if (const char* token = getenv("AWS_SESSION_TOKEN"); token != nullptr) c.session_token = token;
  c.source = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment";
  return c;
}

absl::Status ParseS3Url(absl::string_view url, std::string* bucket, std::string* key) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "s3://")) {
    return absl::InvalidArgumentError(absl::StrCat(url, ": not an s3:// URL"));
  }
  const size_t slash = rest.find('/');
  *bucket = std::string(rest.substr(0, slash));
  *key = slash == absl::string_view::npos ? "" : std::string(rest.substr(slash + 1));
  while (!key->empty() && key->back() == '/') key->pop_back();
  if (bucket->size() < 3 || bucket->size() > 63) {
    return absl::InvalidArgumentError(
        absl::StrCat(url, ": the bucket name must have 3 to 63 characters"));
  }
  for (char c : *bucket) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || c == '.')) {
      return absl::InvalidArgumentError(
          absl::StrCat(url, ": bucket names have lower-case letters, digits, '-' and '.' only"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  absl::string_view ep = options.endpoint;
  std::string scheme;
  if (absl::ConsumePrefix(&ep, "http://")) {
    scheme = "http";
  } else if (absl::ConsumePrefix(&ep, "https://")) {
    scheme = "https";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("s3 endpoint '", options.endpoint, "': must start with http:// or https://"));
  }
  while (absl::ConsumeSuffix(&ep, "/")) {
  }
  if (ep.empty() || ep.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("s3 endpoint '", options.endpoint,
                                                   "': expected scheme://host[:port] and no path"));
  }
  if (options.credentials.access_key.empty() || options.credentials.secret_key.empty()) {
    return absl::InvalidArgumentError("s3 client: no access key or secret key");
  }
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  auto client = std::unique_ptr<S3Client>(new S3Client(std::move(options)));
  client->scheme_ = scheme;
  client->hostport_ = std::string(ep);
  return client;
}

S3Client::S3Client(S3ClientOptions options) : options_(std::move(options)) {}

S3Client::~S3Client() {
  absl::MutexLock lock(&mu_);
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* S3Client::TakeHandle() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void S3Client::ReturnHandle(void* handle) {
  absl::MutexLock lock(&mu_);
  idle_.push_back(handle);
}

S3Counters S3Client::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

absl::StatusOr<S3Client::Response> S3Client::Once(Request& r) {
  std::string host = hostport_;
  std::string path;
  if (options_.virtual_host && !r.bucket.empty()) {
    host = absl::StrCat(r.bucket, ".", hostport_);
    path = absl::StrCat("/", r.key);
  } else {
    path = absl::StrCat("/", r.bucket, r.key.empty() ? "" : "/", r.key);
  }
  const std::string query = EncodeQuery(r.query);
  const std::string url =
      absl::StrCat(scheme_, "://", host, UriEncode(path, true), query.empty() ? "" : "?", query);
  SigV4Request sr;
  sr.method = r.method;
  sr.path = path;
  sr.query = r.query;
  sr.payload_sha256 = Sha256Hex(r.body);
  sr.headers = r.headers;
  sr.headers.emplace_back("host", host);
  const std::string amz_date = AmzDate(absl::Now());
  sr.headers.emplace_back("x-amz-date", amz_date);
  sr.headers.emplace_back("x-amz-content-sha256", sr.payload_sha256);
  if (!options_.credentials.session_token.empty()) {
    sr.headers.emplace_back("x-amz-security-token", options_.credentials.session_token);
  }
  if (r.content_md5) sr.headers.emplace_back("content-md5", Md5Base64(r.body));
  const SigV4Signature sig =
      SignV4(sr, options_.credentials.access_key, options_.credentials.secret_key, options_.region,
             "s3", amz_date);

  CURL* curl = static_cast<CURL*>(TakeHandle());
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  curl_easy_reset(curl);
  curl_slist* headers = nullptr;
  for (const auto& [name, value] : sr.headers) {
    headers = curl_slist_append(headers, absl::StrCat(name, ": ", value).c_str());
  }
  headers = curl_slist_append(headers, absl::StrCat("Authorization: ", sig.authorization).c_str());
  headers = curl_slist_append(headers, "Expect:");
  headers = curl_slist_append(headers, r.method == "POST" && !r.body.empty()
                                           ? "Content-Type: application/xml"
                                           : "Content-Type: application/octet-stream");
  curl_slist* connect_to = nullptr;
  if (!options_.connect_to_for_testing.empty()) {
    connect_to =
        curl_slist_append(nullptr, absl::StrCat("::", options_.connect_to_for_testing).c_str());
    curl_easy_setopt(curl, CURLOPT_CONNECT_TO, connect_to);
  }
  Response resp;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  // The path is sent as signed: "/./" or "/../" in a key must not be folded.
  curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(std::max(1, options_.stall_timeout_ms / 1000)));
  // Large transfer buffers: fewer reads, writes and callbacks per MB, CPU
  // left to the store when it runs on the same host.
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, 512L << 10);
  BodySink sink;
  sink.curl = curl;
  sink.body = &resp.body;
  sink.into = r.into;
  sink.cap = r.into_size;
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &resp.etag);
  std::string damaged;  // outlives curl_easy_perform
  if (r.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (r.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, r.method.c_str());
    if (r.method == "PUT" || r.method == "POST") {
      if (r.damage_body && !r.body.empty()) {
        // Signed and summed as it was; sent damaged, as a bad link might.
        damaged.assign(r.body.data(), r.body.size());
        damaged[damaged.size() / 2] ^= 1;
      }
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS,
                       r.body.empty()    ? ""
                       : damaged.empty() ? r.body.data()
                                         : damaged.data());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    }
  }
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.status);
  curl_off_t length = -1;
  if (curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK) {
    resp.content_length = length;
  }
  curl_slist_free_all(headers);
  curl_slist_free_all(connect_to);
  ReturnHandle(curl);
  {
    absl::MutexLock lock(&mu_);
    ++counters_.requests;
    counters_.bytes_sent += r.body.size();
    counters_.bytes_received += resp.body.size() + sink.got;
  }
  if (rc != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(curl_easy_strerror(rc)));
  }
  if (r.into != nullptr && resp.status == 200 && r.into_offset > 0) {
    // A ranged GET answered with the whole object: the range was ignored.
    return absl::DataLossError("the store ignored the Range header (200, not 206)");
  }
  if (r.into != nullptr && resp.status >= 200 && resp.status < 300 && sink.got != r.into_size) {
    return absl::UnavailableError(
        absl::StrCat("the body ended after ", sink.got, " of ", r.into_size, " bytes"));
  }
  return resp;
}

absl::StatusOr<S3Client::Response> S3Client::Call(absl::string_view op, Request& r) {
  const std::string what =
      absl::StrCat("s3 ", op, " ", Url(r.bucket, r.key), " at ", options_.endpoint);
  std::mt19937_64 rng(std::hash<std::thread::id>()(std::this_thread::get_id()) ^
                      static_cast<uint64_t>(absl::GetCurrentTimeNanos()));
  absl::Status last;
  const int attempts = options_.retries + 1;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (attempt > 0) {
      const int64_t cap = std::min<int64_t>(5000, int64_t{options_.backoff_ms} << (attempt - 1));
      const int64_t sleep_ms = cap / 2 + static_cast<int64_t>(rng() % (cap / 2 + 1));
      {
        absl::MutexLock lock(&mu_);
        ++counters_.retries;
      }
      VLOG(1) << what << ": attempt " << attempt + 1 << " in " << sleep_ms << " ms after "
              << last.message();
      absl::SleepFor(absl::Milliseconds(sleep_ms));
    }
    absl::Status injected =
        options_.fault_for_testing ? options_.fault_for_testing(op, attempt) : absl::OkStatus();
    r.damage_body =
        options_.damage_body_for_testing && options_.damage_body_for_testing(op, attempt);
    absl::StatusOr<Response> resp = injected.ok() ? Once(r) : absl::StatusOr<Response>(injected);
    if (resp.ok() && options_.lose_answer_for_testing &&
        options_.lose_answer_for_testing(op, attempt)) {
      resp = absl::UnavailableError("injected: the answer was lost");
    }
    if (!resp.ok()) {
      last = absl::UnavailableError(absl::StrCat(what, ": ", resp.status().message()));
      continue;
    }
    if (resp->status >= 200 && resp->status < 300) {
      // CompleteMultipartUpload and CopyObject may fail with 200 and an
      // <Error> body.
      if ((op == "CompleteMultipartUpload" || op == "CopyObject") &&
          absl::StrContains(resp->body, "<Error>")) {
        const std::string code = XmlFirst(resp->body, "Code");
        last = HttpError(500, what, resp->body);
        if (code == "InternalError" || code == "SlowDown") continue;
        return last;
      }
      return resp;
    }
    last = HttpError(resp->status, what, resp->body);
    if (!Retryable(resp->status, XmlFirst(resp->body, "Code"))) return last;
  }
  if (attempts > 1) {
    return absl::Status(last.code(), absl::StrCat(last.message(), " (", attempts, " attempts)"));
  }
  return last;
}

absl::Status S3Client::PutObject(const std::string& bucket, const std::string& key,
                                 absl::string_view body) {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  r.key = key;
  r.body = body;
  r.content_md5 = true;
  return Call("PutObject", r).status();
}

absl::StatusOr<std::string> S3Client::GetObject(const std::string& bucket, const std::string& key,
                                                uint64_t offset, int64_t length) {
  if (length == 0) return std::string();
  Request r;
  r.bucket = bucket;
  r.key = key;
  if (offset > 0 || length > 0) {
    r.headers.emplace_back("range", length > 0
                                        ? absl::StrCat("bytes=", offset, "-", offset + length - 1)
                                        : absl::StrCat("bytes=", offset, "-"));
  }
  absl::StatusOr<Response> resp = Call("GetObject", r);
  if (!resp.ok()) return resp.status();
  if (length > 0 && resp->body.size() != static_cast<size_t>(length)) {
    // A short range is the object's end; a long one means the range was
    // ignored, which would be wrong to pass on.
    if (resp->body.size() > static_cast<size_t>(length)) {
      return absl::DataLossError(absl::StrCat("s3 GetObject ", Url(bucket, key), ": asked for ",
                                              length, " bytes at ", offset, ", got ",
                                              resp->body.size()));
    }
  }
  return std::move(resp->body);
}

absl::Status S3Client::GetObjectInto(const std::string& bucket, const std::string& key,
                                     uint64_t offset, uint64_t length, char* dst,
                                     const std::string& if_match) {
  if (length == 0) return absl::OkStatus();
  Request r;
  r.bucket = bucket;
  r.key = key;
  r.headers.emplace_back("range", absl::StrCat("bytes=", offset, "-", offset + length - 1));
  if (!if_match.empty()) r.headers.emplace_back("if-match", if_match);
  r.into = dst;
  r.into_size = length;
  r.into_offset = offset;
  return Call("GetObject", r).status();
}

absl::StatusOr<uint64_t> S3Client::HeadObject(const std::string& bucket, const std::string& key,
                                              std::string* etag) {
  Request r;
  r.method = "HEAD";
  r.bucket = bucket;
  r.key = key;
  absl::StatusOr<Response> resp = Call("HeadObject", r);
  if (!resp.ok()) return resp.status();
  if (resp->content_length < 0) {
    return absl::DataLossError(
        absl::StrCat("s3 HeadObject ", Url(bucket, key), ": the answer has no Content-Length"));
  }
  if (etag != nullptr) *etag = resp->etag;
  return static_cast<uint64_t>(resp->content_length);
}

absl::StatusOr<S3Listing> S3Client::List(const std::string& bucket, const std::string& prefix,
                                         const std::string& delimiter, int max_keys) {
  S3Listing out;
  std::string token;
  while (true) {
    Request r;
    r.bucket = bucket;
    r.query = {{"list-type", "2"}, {"prefix", prefix}};
    if (!delimiter.empty()) r.query.emplace_back("delimiter", delimiter);
    const int page =
        max_keys > 0 ? std::min(max_keys, options_.list_page_keys) : options_.list_page_keys;
    r.query.emplace_back("max-keys", absl::StrCat(page));
    if (!token.empty()) r.query.emplace_back("continuation-token", token);
    absl::StatusOr<Response> resp = Call("ListObjectsV2", r);
    if (!resp.ok()) return resp.status();
    for (const std::string& c : XmlAll(resp->body, "Contents")) {
      S3ObjectInfo info;
      info.key = XmlFirst(c, "Key");
      if (!absl::SimpleAtoi(XmlFirst(c, "Size"), &info.size)) {
        return absl::DataLossError(
            absl::StrCat("s3 ListObjectsV2 ", Url(bucket, prefix), ": no size for key ", info.key));
      }
      out.objects.push_back(std::move(info));
    }
    for (const std::string& c : XmlAll(resp->body, "CommonPrefixes")) {
      out.prefixes.push_back(XmlFirst(c, "Prefix"));
    }
    token = XmlFirst(resp->body, "NextContinuationToken");
    const bool truncated = XmlFirst(resp->body, "IsTruncated") == "true";
    const size_t have = out.objects.size() + out.prefixes.size();
    if (!truncated || token.empty() || (max_keys > 0 && have >= static_cast<size_t>(max_keys))) {
      break;
    }
  }
  std::sort(out.objects.begin(), out.objects.end(),
            [](const S3ObjectInfo& a, const S3ObjectInfo& b) { return a.key < b.key; });
  std::sort(out.prefixes.begin(), out.prefixes.end());
  return out;
}

absl::Status S3Client::DeleteObject(const std::string& bucket, const std::string& key) {
  Request r;
  r.method = "DELETE";
  r.bucket = bucket;
  r.key = key;
  absl::Status s = Call("DeleteObject", r).status();
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::Status S3Client::DeleteObjects(const std::string& bucket,
                                     const std::vector<std::string>& keys) {
  constexpr size_t kPerRequest = 1000;  // S3's limit
  for (size_t first = 0; first < keys.size(); first += kPerRequest) {
    std::string xml = "<Delete><Quiet>true</Quiet>";
    const size_t end = std::min(keys.size(), first + kPerRequest);
    for (size_t i = first; i < end; ++i) {
      absl::StrAppend(&xml, "<Object><Key>", XmlEscape(keys[i]), "</Key></Object>");
    }
    xml += "</Delete>";
    Request r;
    r.method = "POST";
    r.bucket = bucket;
    r.query = {{"delete", ""}};
    r.body = xml;
    r.content_md5 = true;  // required for this request
    absl::StatusOr<Response> resp = Call("DeleteObjects", r);
    if (!resp.ok()) return resp.status();
    // Quiet: only the keys that failed are listed, each in an <Error>.
    const std::vector<std::string> errors = XmlAll(resp->body, "Error");
    if (!errors.empty()) {
      const std::string code = XmlFirst(errors.front(), "Code");
      return absl::Status(
          code == "AccessDenied" ? absl::StatusCode::kPermissionDenied
                                 : absl::StatusCode::kUnavailable,
          absl::StrCat("s3 DeleteObjects ", Url(bucket, XmlFirst(errors.front(), "Key")), " (",
                       errors.size(), " of ", end - first, " keys refused) at ", options_.endpoint,
                       ": ", code, " ", XmlFirst(errors.front(), "Message")));
    }
  }
  return absl::OkStatus();
}

absl::Status S3Client::CopyObject(const std::string& bucket, const std::string& from_key,
                                  const std::string& to_key) {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  r.key = to_key;
  r.headers.emplace_back("x-amz-copy-source",
                         UriEncode(absl::StrCat("/", bucket, "/", from_key), true));
  return Call("CopyObject", r).status();
}

absl::Status S3Client::CreateBucket(const std::string& bucket) {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  absl::StatusOr<Response> resp = Call("CreateBucket", r);
  if (!resp.ok() && absl::StrContains(resp.status().message(), "BucketAlreadyOwnedByYou")) {
    return absl::OkStatus();
  }
  return resp.status();
}

absl::Status S3Client::CheckBucket(const std::string& bucket) {
  absl::StatusOr<S3Listing> l = List(bucket, "", "/", 1);
  return l.status();
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(const std::string& bucket,
                                                            const std::string& key) {
  Request r;
  r.method = "POST";
  r.bucket = bucket;
  r.key = key;
  r.query = {{"uploads", ""}};
  absl::StatusOr<Response> resp = Call("CreateMultipartUpload", r);
  if (!resp.ok()) return resp.status();
  std::string id = XmlFirst(resp->body, "UploadId");
  if (id.empty()) {
    return absl::DataLossError(absl::StrCat("s3 CreateMultipartUpload ", Url(bucket, key),
                                            ": the answer has no UploadId"));
  }
  return id;
}

absl::StatusOr<std::string> S3Client::UploadPart(const std::string& bucket, const std::string& key,
                                                 const std::string& upload_id, int part_number,
                                                 absl::string_view body) {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  r.key = key;
  r.query = {{"partNumber", absl::StrCat(part_number)}, {"uploadId", upload_id}};
  r.body = body;
  r.content_md5 = true;
  absl::StatusOr<Response> resp = Call("UploadPart", r);
  if (!resp.ok()) return resp.status();
  if (resp->etag.empty()) {
    return absl::DataLossError(absl::StrCat("s3 UploadPart ", Url(bucket, key), " part ",
                                            part_number, ": the answer has no ETag"));
  }
  return resp->etag;
}

absl::Status S3Client::CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                               const std::string& upload_id,
                                               const std::vector<std::string>& etags) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    absl::StrAppend(&xml, "<Part><PartNumber>", i + 1, "</PartNumber><ETag>", XmlEscape(etags[i]),
                    "</ETag></Part>");
  }
  xml += "</CompleteMultipartUpload>";
  Request r;
  r.method = "POST";
  r.bucket = bucket;
  r.key = key;
  r.query = {{"uploadId", upload_id}};
  r.body = xml;
  return Call("CompleteMultipartUpload", r).status();
}

absl::Status S3Client::AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                            const std::string& upload_id) {
  Request r;
  r.method = "DELETE";
  r.bucket = bucket;
  r.key = key;
  r.query = {{"uploadId", upload_id}};
  absl::Status s = Call("AbortMultipartUpload", r).status();
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

}  // namespace strata::storage
