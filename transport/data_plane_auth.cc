#include "transport/data_plane_auth.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "openssl/evp.h"
#include "openssl/hmac.h"
#include "openssl/rand.h"

namespace strata::transport {
namespace {

std::string Hmac(absl::string_view key, absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &len);
  return std::string(reinterpret_cast<char*>(md), len);
}

void AppendLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

}  // namespace

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  CHECK_EQ(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)), 1)
      << "the system's random number generator failed";
  return out;
}

std::string DeriveNodeKey(absl::string_view secret, uint32_t node_id) {
  std::string data = "strata node key";
  AppendLe(&data, node_id, 4);
  return Hmac(secret, data);
}

std::string HandshakeMac(absl::string_view key, bool server, uint32_t node_id, uint64_t epoch,
                         absl::string_view server_nonce, absl::string_view client_nonce) {
  std::string data = server ? "strata data-plane server" : "strata data-plane client";
  AppendLe(&data, node_id, 4);
  AppendLe(&data, epoch, 8);
  absl::StrAppend(&data, server_nonce, client_nonce);
  return Hmac(key, data);
}

void MembershipKeys::Update(uint32_t node_id, uint64_t epoch, std::string key,
                            std::string secret) {
  absl::MutexLock l(&mu_);
  if (have_ && own_.epoch != epoch) {
    LOG(INFO) << "data-plane keys of key epoch " << epoch << " (were " << own_.epoch << ")";
  }
  own_ = Own{node_id, epoch, std::move(key)};
  secret_ = std::move(secret);
  have_ = true;
}

absl::StatusOr<MembershipKeys::Own> MembershipKeys::OwnKey() const {
  absl::MutexLock l(&mu_);
  if (!have_) {
    return absl::FailedPreconditionError("no data-plane key yet (it comes at registration)");
  }
  return own_;
}

absl::StatusOr<std::string> MembershipKeys::KeyOf(uint32_t node_id, uint64_t epoch) const {
  absl::MutexLock l(&mu_);
  if (!have_) return absl::UnavailableError("this server has no data-plane keys yet");
  if (secret_.empty()) {
    return absl::FailedPreconditionError("this node cannot verify data-plane members");
  }
  if (epoch != own_.epoch) {
    return absl::UnavailableError(absl::StrCat(
        "data-plane key epoch ", epoch, " is not the current one (", own_.epoch,
        "): the caller's key is stale or revoked; a member gets the new one at its next "
        "heartbeat"));
  }
  return DeriveNodeKey(secret_, node_id);
}

uint64_t MembershipKeys::epoch() const {
  absl::MutexLock l(&mu_);
  return own_.epoch;
}

}  // namespace strata::transport
