#include "storage/s3_sign.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::storage {
namespace {

std::string Digest(const EVP_MD* md, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), out, &n, md, nullptr);
  return std::string(reinterpret_cast<char*>(out), n);
}

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

// Trims and collapses runs of spaces, as the canonical headers want.
std::string CanonicalHeaderValue(absl::string_view v) {
  std::string out;
  bool space = false;
  for (char c : absl::StripAsciiWhitespace(v)) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string Sha256Hex(absl::string_view data) {
  return absl::BytesToHexString(Digest(EVP_sha256(), data));
}

std::string Md5Base64(absl::string_view data) {
  return absl::Base64Escape(Digest(EVP_md5(), data));
}

std::string UriEncode(absl::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string EncodeQuery(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> enc;
  enc.reserve(query.size());
  for (const auto& [k, v] : query) enc.emplace_back(UriEncode(k, false), UriEncode(v, false));
  std::sort(enc.begin(), enc.end());
  std::vector<std::string> parts;
  parts.reserve(enc.size());
  for (const auto& [k, v] : enc) parts.push_back(absl::StrCat(k, "=", v));
  return absl::StrJoin(parts, "&");
}

SigV4Signature SignV4(const SigV4Request& request, absl::string_view access_key,
                      absl::string_view secret_key, absl::string_view region,
                      absl::string_view service, absl::string_view amz_date) {
  std::vector<std::pair<std::string, std::string>> headers;
  headers.reserve(request.headers.size());
  for (const auto& [name, value] : request.headers) {
    headers.emplace_back(absl::AsciiStrToLower(name), CanonicalHeaderValue(value));
  }
  std::sort(headers.begin(), headers.end());
  std::string canonical_headers;
  std::vector<absl::string_view> names;
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&canonical_headers, name, ":", value, "\n");
    names.push_back(name);
  }
  const std::string signed_headers = absl::StrJoin(names, ";");

  SigV4Signature sig;
  sig.canonical_request = absl::StrCat(request.method, "\n", UriEncode(request.path, true), "\n",
                                       EncodeQuery(request.query), "\n", canonical_headers, "\n",
                                       signed_headers, "\n", request.payload_sha256);
  const absl::string_view day = amz_date.substr(0, 8);
  const std::string scope = absl::StrCat(day, "/", region, "/", service, "/aws4_request");
  sig.string_to_sign = absl::StrCat("AWS4-HMAC-SHA256\n", amz_date, "\n", scope, "\n",
                                    Sha256Hex(sig.canonical_request));
  std::string key = HmacSha256(absl::StrCat("AWS4", secret_key), day);
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  key = HmacSha256(key, "aws4_request");
  sig.signature = absl::BytesToHexString(HmacSha256(key, sig.string_to_sign));
  sig.authorization = absl::StrCat("AWS4-HMAC-SHA256 Credential=", access_key, "/", scope,
                                   ",SignedHeaders=", signed_headers, ",Signature=", sig.signature);
  return sig;
}

}  // namespace strata::storage
