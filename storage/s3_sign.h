// AWS Signature Version 4 for S3 requests (docs/storage.md): the canonical
// request, the string to sign, the signing key and the Authorization header.
// Checked against AWS's published examples in tests/storage/s3_sign_test.cc.
#ifndef STRATA_STORAGE_S3_SIGN_H_
#define STRATA_STORAGE_S3_SIGN_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace strata::storage {

// Lower-case hex of SHA-256(data).
std::string Sha256Hex(absl::string_view data);
// Base64 of MD5(data), for Content-MD5.
std::string Md5Base64(absl::string_view data);
// RFC 3986 percent-encoding as SigV4 wants it: everything but A-Z a-z 0-9
// - _ . ~ is %XX (upper-case hex); '/' is kept when `keep_slash`.
std::string UriEncode(absl::string_view s, bool keep_slash);

struct SigV4Request {
  std::string method;  // "GET"
  std::string path;    // not encoded: "/bucket/my key"
  // Not encoded; any order. A flag parameter ("uploads") has an empty value.
  std::vector<std::pair<std::string, std::string>> query;
  // Every header to sign, host and x-amz-date included; any case and order.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_sha256;  // hex, or "UNSIGNED-PAYLOAD"
};

struct SigV4Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;      // hex
  std::string authorization;  // the Authorization header's value
};

// Signs `request` at `amz_date` ("20130524T000000Z") for `region` and
// `service` ("s3").
SigV4Signature SignV4(const SigV4Request& request, absl::string_view access_key,
                      absl::string_view secret_key, absl::string_view region,
                      absl::string_view service, absl::string_view amz_date);

// "a=1&b=x%20y": the query string as sent, the same encoding as signed.
std::string EncodeQuery(const std::vector<std::pair<std::string, std::string>>& query);

}  // namespace strata::storage

#endif  // STRATA_STORAGE_S3_SIGN_H_
