#include "transport/data_plane_auth.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
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

absl::Status KeyEpochRefusal(absl::StatusCode code, absl::string_view message) {
  return WithReason(absl::Status(code, message), proto::REASON_KEY_EPOCH);
}

bool IsKeyEpochRefusal(const absl::Status& s) { return HasReason(s, proto::REASON_KEY_EPOCH); }

absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  absl::Status out(s.code(), absl::StrCat(prefix, s.message()));
  s.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

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

std::string SessionKey(absl::string_view key, bool client_to_server, absl::string_view server_nonce,
                       absl::string_view client_nonce) {
  return Hmac(key,
              absl::StrCat(client_to_server ? "strata data-plane c2s" : "strata data-plane s2c",
                           server_nonce, client_nonce));
}

FrameCipher::FrameCipher(std::string key) : key_(std::move(key)) {
  CHECK_EQ(key_.size(), 32u);
  ctx_ = EVP_CIPHER_CTX_new();
  CHECK(ctx_ != nullptr);
}

FrameCipher::~FrameCipher() { EVP_CIPHER_CTX_free(static_cast<EVP_CIPHER_CTX*>(ctx_)); }

void FrameCipher::NextNonce(unsigned char nonce[12]) {
  std::memset(nonce, 0, 12);
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<unsigned char>(counter_ >> (8 * i));
  ++counter_;
}

void FrameCipher::Seal(absl::string_view aad, const char* in, size_t n, char* out) {
  auto* ctx = static_cast<EVP_CIPHER_CTX*>(ctx_);
  unsigned char nonce[12];
  NextNonce(nonce);
  int len = 0;
  CHECK_EQ(EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr,
                              reinterpret_cast<const unsigned char*>(key_.data()), nonce),
           1);
  CHECK_EQ(EVP_EncryptUpdate(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(aad.data()),
                             static_cast<int>(aad.size())),
           1);
  // (In pieces: EVP lengths are ints.)
  size_t done = 0;
  while (done < n) {
    const int piece = static_cast<int>(std::min<size_t>(n - done, 1 << 30));
    CHECK_EQ(EVP_EncryptUpdate(ctx, reinterpret_cast<unsigned char*>(out + done), &len,
                               reinterpret_cast<const unsigned char*>(in + done), piece),
             1);
    done += piece;
  }
  CHECK_EQ(EVP_EncryptFinal_ex(ctx, reinterpret_cast<unsigned char*>(out + n), &len), 1);
  CHECK_EQ(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kFrameTagBytes, out + n), 1);
}

bool FrameCipher::Open(absl::string_view aad, char* data, size_t n) {
  return Open(aad, data, n, data);
}

bool FrameCipher::Open(absl::string_view aad, const char* in, size_t n, char* out) {
  if (n < kFrameTagBytes) return false;
  auto* ctx = static_cast<EVP_CIPHER_CTX*>(ctx_);
  unsigned char nonce[12];
  NextNonce(nonce);
  const size_t body = n - kFrameTagBytes;
  int len = 0;
  if (EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key_.data()), nonce) != 1 ||
      EVP_DecryptUpdate(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(aad.data()),
                        static_cast<int>(aad.size())) != 1) {
    return false;
  }
  size_t done = 0;
  while (done < body) {
    const int piece = static_cast<int>(std::min<size_t>(body - done, 1 << 30));
    if (EVP_DecryptUpdate(ctx, reinterpret_cast<unsigned char*>(out + done), &len,
                          reinterpret_cast<const unsigned char*>(in + done), piece) != 1) {
      return false;
    }
    done += piece;
  }
  // (The tag is copied out first: `out` may be `in`.)
  char tag[kFrameTagBytes];
  std::memcpy(tag, in + body, kFrameTagBytes);
  if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kFrameTagBytes, tag) != 1) {
    return false;
  }
  unsigned char final_block[16];
  return EVP_DecryptFinal_ex(ctx, final_block, &len) == 1;
}

void MembershipKeys::Update(uint32_t node_id, uint64_t epoch, std::string key, std::string secret) {
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
  if (!have_) {
    return KeyEpochRefusal(absl::StatusCode::kUnavailable,
                           "this server has no data-plane keys yet");
  }
  if (secret_.empty()) {
    return absl::FailedPreconditionError("this node cannot verify data-plane members");
  }
  if (epoch != own_.epoch) {
    return KeyEpochRefusal(
        absl::StatusCode::kUnavailable,
        absl::StrCat(
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
