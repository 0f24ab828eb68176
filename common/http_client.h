// GET over HTTP or HTTPS (libcurl), for the CLI and tests: HTTPS verifies
// the server against the cluster's CA and proves the caller with a client
// certificate or a bearer token (docs/security.md, "HTTP endpoints").
#ifndef STRATA_COMMON_HTTP_CLIENT_H_
#define STRATA_COMMON_HTTP_CLIENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata {

struct HttpClientOptions {
  std::string ca_file;    // https: the CA the server's certificate must chain to
  std::string cert_file;  // https: a client certificate and its key, or ""
  std::string key_file;
  std::string bearer_token;  // sent as "Authorization: Bearer ..." (https only)
  absl::Duration timeout = absl::Seconds(5);
};

struct HttpResult {
  long status = 0;
  std::string body;
  std::string location;  // a redirect's target (not followed), or ""
};

// GET `url`. Unavailable naming the URL when no response came (connection,
// TLS or timeout); otherwise the response, whatever its status. A token is
// refused for a plain http:// URL (it would cross the network in clear).
// Thread-safe.
absl::StatusOr<HttpResult> HttpFetch(const std::string& url, const HttpClientOptions& options);

}  // namespace strata

#endif  // STRATA_COMMON_HTTP_CLIENT_H_
