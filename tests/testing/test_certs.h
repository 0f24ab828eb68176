// Certificates for tests, made by scripts/gen-certs.sh (as operators make
// them). STRATA_SOURCE_DIR must be defined by the test's build.
#ifndef STRATA_TESTS_TESTING_TEST_CERTS_H_
#define STRATA_TESTS_TESTING_TEST_CERTS_H_

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::testing {

// Under `dir` (made anew):
//   127.0.0.1/      ca.crt, master|pserver|worker .crt/.key (host-wide),
//                   pserver-0, worker-0 .crt/.key (the instances')
//   admin/          client certificate, role admin
//   users/alice/    operator;  users/bob/  viewer
//   users/old/      admin, already expired
//   users/carol/token and tokens: a bearer token of role operator
//   mallory/        the cluster's ca.crt, but a client certificate (role
//                   admin) of another CA
inline absl::Status MakeTestCerts(const std::string& dir) {
  const std::string gen = std::string(STRATA_SOURCE_DIR) + "/scripts/gen-certs.sh";
  const std::string q = "'" + dir + "'";
  std::string script = absl::StrCat(
      "set -e; rm -rf ", q, "; mkdir -p ", q, "; cd ", q, "; ",
      "echo '127.0.0.1 master pserver worker' > hosts; ", gen, " cluster --hosts hosts --out . ; ",
      gen, " user --out . --name alice --role operator; ", gen,
      " user --out . --name bob --role viewer; ", gen,
      " user --out . --name old --role admin --days 0; ", gen,
      " token --out . --name carol --role operator; ", gen,
      " user --out foreign --name mallory --role admin; ",
      "mkdir -p mallory; cp ca/ca.crt mallory/; ",
      "cp foreign/users/mallory/client.crt foreign/users/mallory/client.key mallory/; ",
      "sleep 1");  // (the expired certificate's end is now: let it pass)
  const std::string cmd = absl::StrCat("bash -c \"", script, "\" > ", q, ".log 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(dir + ".log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    return absl::InternalError("gen-certs.sh failed: " + text);
  }
  return absl::OkStatus();
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_TEST_CERTS_H_
