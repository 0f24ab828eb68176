// Membership on the data plane (docs/security.md, "The data plane"): a TCP
// connection to a pserver's data port serves requests only after the
// client proved it is a member of the cluster now.
//
// The master draws a random secret for each key epoch and hands it, over
// the mTLS control plane, to the pservers; every node gets its own key,
// HMAC-SHA256(secret, "strata node key" || node id). The key epoch moves
// on whenever a node leaves (declared dead or drained), so a departed
// node's key stops working at once.
//
// The handshake (two request/response pairs on the new connection, before
// anything else; docs/wire-protocol.md):
//   client -> AUTH_HELLO  sender_id = node, epoch = key epoch, payload = 32
//                         random bytes (client nonce)
//   server <- AUTH_HELLO_REPLY  payload = 32 random bytes (server nonce)
//   client -> AUTH_PROOF  payload = HMAC(key, "strata data-plane client" ||
//                         node || epoch || server nonce || client nonce)
//   server <- AUTH_PROOF_REPLY  OK, payload = HMAC(key, "strata data-plane
//                         server" || ...): the server knew the key too
// Any other request before the proof verified closes the connection
// unserved. A stale epoch is refused Unavailable, the reply's epoch the
// server's own: whichever side is behind gets the new keys with its next
// heartbeat, and the client tries again until its connect deadline
// (IsKeyEpochRefusal: no sign of a dead peer). A wrong proof is refused
// PermissionDenied. The server's nonce is fresh per connection: a recorded
// handshake does not replay.
#ifndef STRATA_TRANSPORT_DATA_PLANE_AUTH_H_
#define STRATA_TRANSPORT_DATA_PLANE_AUTH_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace strata::transport {

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthMacBytes = 32;

// `n` bytes from the system's CSPRNG (OpenSSL RAND_bytes).
std::string RandomBytes(size_t n);
// Node `node_id`'s key of the epoch whose secret is `secret`.
std::string DeriveNodeKey(absl::string_view secret, uint32_t node_id);
// The client's (server = false) or server's proof of the handshake.
std::string HandshakeMac(absl::string_view key, bool server, uint32_t node_id, uint64_t epoch,
                         absl::string_view server_nonce, absl::string_view client_nonce);

// Encryption of the data plane (TransportOptions::encrypt_data_plane):
// after the handshake each direction of the connection has its own
// AES-256-GCM key, HMAC(key, "strata data-plane c2s" | "s2c" || server
// nonce || client nonce). Every frame's payload is sealed, its 72-byte
// header is authenticated with it (additional data), and the 96-bit nonce
// is the frame's number in that direction: a frame changed, dropped,
// replayed or reordered fails to open and closes the connection.
// The payload on the wire is the ciphertext followed by the 16-byte tag.
inline constexpr size_t kFrameTagBytes = 16;
std::string SessionKey(absl::string_view key, bool client_to_server, absl::string_view server_nonce,
                       absl::string_view client_nonce);

// One direction's frames. Not thread-safe: the sender's under its write
// lock, the receiver's on its reading thread.
class FrameCipher {
 public:
  explicit FrameCipher(std::string key);
  ~FrameCipher();
  FrameCipher(const FrameCipher&) = delete;
  FrameCipher& operator=(const FrameCipher&) = delete;
  // Seals `n` bytes of `in` into `out` (n + kFrameTagBytes bytes), with
  // `aad` authenticated alongside; the next frame number.
  void Seal(absl::string_view aad, const char* in, size_t n, char* out);
  // Opens `n` bytes (ciphertext and tag) in place; false when they do not
  // authenticate (then nothing after it can be trusted).
  bool Open(absl::string_view aad, char* data, size_t n);
  // The same, the plaintext (n - kFrameTagBytes bytes) written to `out`.
  bool Open(absl::string_view aad, const char* in, size_t n, char* out);

 private:
  void NextNonce(unsigned char nonce[12]);
  const std::string key_;
  uint64_t counter_ = 0;
  void* ctx_ = nullptr;  // EVP_CIPHER_CTX, reused
};

// A refusal because the two sides hold keys of different epochs (or the
// server none yet): marked with a payload that survives being passed on.
absl::Status KeyEpochRefusal(absl::StatusCode code, absl::string_view message);
bool IsKeyEpochRefusal(const absl::Status& s);
// `s` with `prefix` before its message, its payloads kept.
absl::Status Annotate(const absl::Status& s, absl::string_view prefix);

// A node's data-plane keys, as the master last gave them. Thread-safe.
class MembershipKeys {
 public:
  struct Own {
    uint32_t node_id = 0;
    uint64_t epoch = 0;
    std::string key;
  };
  // The master's latest: this node's id and key of key epoch `epoch`, and
  // (pservers, which verify others) the epoch's secret; "" for none.
  void Update(uint32_t node_id, uint64_t epoch, std::string key, std::string secret);
  // This node's key; FailedPrecondition before the first Update.
  absl::StatusOr<Own> OwnKey() const;
  // The key node `node_id` holds in `epoch`: Unavailable when `epoch` is
  // not the current key epoch (or none is known yet), FailedPrecondition
  // when this node cannot verify others (no secret).
  absl::StatusOr<std::string> KeyOf(uint32_t node_id, uint64_t epoch) const;
  uint64_t epoch() const;

 private:
  mutable absl::Mutex mu_;
  Own own_ ABSL_GUARDED_BY(mu_);
  bool have_ ABSL_GUARDED_BY(mu_) = false;
  std::string secret_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::transport

#endif  // STRATA_TRANSPORT_DATA_PLANE_AUTH_H_
