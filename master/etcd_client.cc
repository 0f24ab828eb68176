#include "master/etcd_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "glog/logging.h"

namespace strata::master {
namespace {

std::shared_ptr<grpc::Channel> NewEtcdChannel(const std::string& address,
                                              const std::shared_ptr<grpc::ChannelCredentials>& c) {
  grpc::ChannelArguments args;
  // A member that comes back is found again within a second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // The state's snapshot and log come back in one range.
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, c != nullptr ? c : grpc::InsecureChannelCredentials(),
                                   args);
}

bool TryNext(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(Options options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("cluster.etcd.endpoints: no etcd endpoint given");
  }
  std::vector<std::string> addresses;
  for (const std::string& e : options.endpoints) {
    auto a = EtcdEndpointAddress(e);
    if (!a.ok()) return a.status();
    addresses.push_back(*a);
  }
  std::unique_ptr<EtcdClient> c(new EtcdClient(std::move(options), std::move(addresses)));
  // Some member must answer, and know a leader (a quorum).
  std::vector<std::string> why;
  for (size_t i = 0; i < c->addresses_.size(); ++i) {
    std::shared_ptr<grpc::Channel> ch;
    {
      absl::MutexLock l(&c->mu_);
      ch = c->channels_[i];
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + c->options_.request_timeout));
    ctx.set_wait_for_ready(true);  // (through the first connection attempt)
    etcdserverpb::StatusResponse resp;
    const grpc::Status s =
        etcdserverpb::Maintenance::NewStub(ch)->Status(&ctx, etcdserverpb::StatusRequest(), &resp);
    if (!s.ok()) {
      why.push_back(absl::StrCat(c->addresses_[i], ": ", s.error_message()));
      continue;
    }
    if (resp.leader() == 0) {
      why.push_back(absl::StrCat(c->addresses_[i], ": the member knows no leader (no quorum)"));
      continue;
    }
    absl::MutexLock l(&c->mu_);
    c->current_ = i;
    return c;
  }
  return absl::UnavailableError(
      absl::StrCat("etcd (cluster.etcd.endpoints) cannot be reached: ", absl::StrJoin(why, "; ")));
}

EtcdClient::EtcdClient(Options options, std::vector<std::string> addresses)
    : options_(std::move(options)), addresses_(std::move(addresses)) {
  absl::MutexLock l(&mu_);
  for (const std::string& a : addresses_) {
    channels_.push_back(NewEtcdChannel(a, options_.credentials));
  }
}

std::string EtcdClient::endpoint() const {
  absl::MutexLock l(&mu_);
  return addresses_[current_];
}

absl::Status EtcdClient::Call(
    const std::string& what,
    const std::function<grpc::Status(const std::shared_ptr<grpc::Channel>&, grpc::ClientContext*)>&
        call) {
  std::vector<std::string> why;
  for (size_t tried = 0; tried < addresses_.size(); ++tried) {
    size_t i;
    std::shared_ptr<grpc::Channel> ch;
    {
      absl::MutexLock l(&mu_);
      i = current_;
      ch = channels_[i];
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.request_timeout));
    const grpc::Status s = call(ch, &ctx);
    if (s.ok()) return absl::OkStatus();
    why.push_back(absl::StrCat(addresses_[i], ": ", s.error_message()));
    if (!TryNext(s.error_code())) {
      return FromGrpcStatus(s, absl::StrCat("etcd ", addresses_[i], " (", what, ")"));
    }
    absl::MutexLock l(&mu_);
    if (current_ == i) current_ = (i + 1) % addresses_.size();
  }
  return absl::UnavailableError(
      absl::StrCat("etcd (", what, "): no member answered: ", absl::StrJoin(why, "; ")));
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(int64_t ttl_seconds) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_seconds);
  etcdserverpb::LeaseGrantResponse resp;
  absl::Status s = Call("lease grant", [&](const auto& ch, grpc::ClientContext* ctx) {
    return etcdserverpb::Lease::NewStub(ch)->LeaseGrant(ctx, req, &resp);
  });
  if (!s.ok()) return s;
  if (!resp.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd (lease grant): ", resp.error()));
  }
  return resp.id();
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse resp;
  absl::Status s = Call("lease keep-alive", [&](const auto& ch, grpc::ClientContext* ctx) {
    // One renewal on a stream of its own.
    auto stream = etcdserverpb::Lease::NewStub(ch)->LeaseKeepAlive(ctx);
    if (!stream->Write(req) || !stream->Read(&resp)) {
      ctx->TryCancel();
      grpc::Status f = stream->Finish();
      return f.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream closed") : f;
    }
    stream->WritesDone();
    ctx->TryCancel();
    stream->Finish().ok();  // (cancelled by us)
    return grpc::Status::OK;
  });
  if (!s.ok()) return s;
  if (resp.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
  }
  return resp.ttl();
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseRevokeResponse resp;
  return Call("lease revoke", [&](const auto& ch, grpc::ClientContext* ctx) {
    return etcdserverpb::Lease::NewStub(ch)->LeaseRevoke(ctx, req, &resp);
  });
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const etcdserverpb::TxnRequest& req) {
  etcdserverpb::TxnResponse resp;
  absl::Status s = Call("txn", [&](const auto& ch, grpc::ClientContext* ctx) {
    return etcdserverpb::KV::NewStub(ch)->Txn(ctx, req, &resp);
  });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(
    const etcdserverpb::RangeRequest& req) {
  etcdserverpb::RangeResponse resp;
  absl::Status s = Call("range " + req.key(), [&](const auto& ch, grpc::ClientContext* ctx) {
    return etcdserverpb::KV::NewStub(ch)->Range(ctx, req, &resp);
  });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<EtcdClient::Value> EtcdClient::Get(const std::string& key) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  auto resp = Range(req);
  if (!resp.ok()) return resp.status();
  Value v;
  v.revision = resp->header().revision();
  if (resp->kvs_size() > 0) {
    const mvccpb::KeyValue& kv = resp->kvs(0);
    v.found = true;
    v.value = kv.value();
    v.create_revision = kv.create_revision();
    v.mod_revision = kv.mod_revision();
    v.lease = kv.lease();
  }
  return v;
}

absl::Status EtcdClient::Compact(int64_t revision) {
  etcdserverpb::CompactionRequest req;
  req.set_revision(revision);
  etcdserverpb::CompactionResponse resp;
  return Call("compact", [&](const auto& ch, grpc::ClientContext* ctx) {
    return etcdserverpb::KV::NewStub(ch)->Compact(ctx, req, &resp);
  });
}

}  // namespace strata::master
