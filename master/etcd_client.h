// A client of etcd's v3 API (master high availability, docs/reliability.md)
// through the gRPC stubs made from etcd's own .proto files
// (master/CMakeLists.txt): leases, transactions, ranges and compaction,
// which is all the master's leadership and its state in etcd need.
#ifndef STRATA_MASTER_ETCD_CLIENT_H_
#define STRATA_MASTER_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace strata::master {

// Talks to one member of the etcd cluster at a time; a request that member
// does not answer in time (down, or cut off from the quorum) is tried on
// the next one, each member once per request. A request that timed out may
// still have been applied: callers make their writes safe to repeat, or
// check what is there. Errors name the endpoint and the request.
// Thread-safe.
class EtcdClient {
 public:
  struct Options {
    // host:port (or http(s)://host:port) of each member.
    std::vector<std::string> endpoints;
    // TLS to etcd (common/security.h's client credentials), or null for
    // plain text.
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    // One try on one member.
    absl::Duration request_timeout = absl::Seconds(2);
  };

  // Checks that some member answers (its status): UNAVAILABLE naming every
  // endpoint and why each failed otherwise.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(Options options);
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // A lease of `ttl_seconds`: its id.
  absl::StatusOr<int64_t> GrantLease(int64_t ttl_seconds);
  // Renews `lease` once: the seconds it now has; NOT_FOUND when it has
  // expired (or was revoked).
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  absl::Status RevokeLease(int64_t lease);
  // A transaction; its response says whether the compares held.
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& req);
  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& req);
  // The value of `key`, nullopt when absent, and the revision read at.
  struct Value {
    bool found = false;
    std::string value;
    int64_t create_revision = 0;
    int64_t mod_revision = 0;
    int64_t lease = 0;
    int64_t revision = 0;  // the store's, when read
  };
  absl::StatusOr<Value> Get(const std::string& key);
  // Drops the store's history before `revision` (not the keys' values).
  absl::Status Compact(int64_t revision);

  // The member asked last (for messages).
  std::string endpoint() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit EtcdClient(Options options, std::vector<std::string> addresses);
  // Runs `call` on the current member, then on the next ones in turn while
  // a member is unavailable or slow; `what` names the request in errors.
  absl::Status Call(const std::string& what,
                    const std::function<grpc::Status(const std::shared_ptr<grpc::Channel>&,
                                                     grpc::ClientContext*)>& call)
      ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const std::vector<std::string> addresses_;  // host:port, one a member
  mutable absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

// The end of the range of keys starting with `prefix` (etcd's range_end).
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace strata::master

#endif  // STRATA_MASTER_ETCD_CLIENT_H_
