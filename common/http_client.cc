#include "common/http_client.h"

#include <curl/curl.h>

#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

}  // namespace

absl::StatusOr<HttpResult> HttpFetch(const std::string& url, const HttpClientOptions& options) {
  const bool https = absl::StartsWith(url, "https://");
  if (!options.bearer_token.empty() && !https) {
    return absl::InvalidArgumentError(
        absl::StrCat("GET ", url, ": a token is sent only over https"));
  }
  // (curl's global set-up is not thread-safe: once, before any request.)
  static std::once_flag curl_once;
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  HttpResult result;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options.timeout)));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &result.body);
  curl_slist* headers = nullptr;
  const std::string auth = absl::StrCat("Authorization: Bearer ", options.bearer_token);
  if (https) {
    if (!options.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options.ca_file.c_str());
    if (!options.cert_file.empty()) {
      curl_easy_setopt(curl, CURLOPT_SSLCERT, options.cert_file.c_str());
      curl_easy_setopt(curl, CURLOPT_SSLKEY, options.key_file.c_str());
    }
    if (!options.bearer_token.empty()) {
      headers = curl_slist_append(headers, auth.c_str());
      curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    }
  }
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &result.status);
  char* location = nullptr;  // (redirects are not followed)
  if (curl_easy_getinfo(curl, CURLINFO_REDIRECT_URL, &location) == CURLE_OK &&
      location != nullptr) {
    result.location = location;
  }
  curl_easy_cleanup(curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": ", curl_easy_strerror(rc)));
  }
  return result;
}

}  // namespace strata
