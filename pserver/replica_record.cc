#include "pserver/replica_record.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata::pserver {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Reads from a byte range, refusing to run past its end.
class Reader {
 public:
  explicit Reader(absl::string_view b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() < sizeof(T)) return false;
    std::memcpy(v, b_.data(), sizeof(T));
    b_.remove_prefix(sizeof(T));
    return true;
  }
  bool Bytes(size_t n, absl::string_view* out) {
    if (b_.size() < n) return false;
    *out = b_.substr(0, n);
    b_.remove_prefix(n);
    return true;
  }
  size_t left() const { return b_.size(); }

 private:
  absl::string_view b_;
};

}  // namespace

std::string EncodeReplicaUpdate(const ReplicaUpdate& u) {
  std::string out;
  out.reserve(28 + u.pushes.size() * 12 + u.keys.size() * 8 + u.grads.size() * 4);
  Put<uint32_t>(&out, static_cast<uint32_t>(u.pushes.size()));
  Put<uint32_t>(&out, static_cast<uint32_t>(u.keys.size()));
  Put<float>(&out, u.scale);
  Put<uint32_t>(&out, static_cast<uint32_t>(u.grads.size()));
  Put<uint32_t>(&out, u.chunk);
  Put<uint64_t>(&out, u.version);
  for (const auto& [sender, seq] : u.pushes) {
    Put<uint32_t>(&out, sender);
    Put<uint64_t>(&out, seq);
  }
  out.append(reinterpret_cast<const char*>(u.keys.data()), u.keys.size() * sizeof(uint64_t));
  out.append(reinterpret_cast<const char*>(u.grads.data()), u.grads.size() * sizeof(float));
  return out;
}

absl::StatusOr<ReplicaUpdate> DecodeReplicaUpdate(absl::string_view bytes) {
  Reader r(bytes);
  uint32_t pushes = 0, keys = 0, grads = 0;
  ReplicaUpdate u;
  if (!r.Get(&pushes) || !r.Get(&keys) || !r.Get(&u.scale) || !r.Get(&grads) || !r.Get(&u.chunk) ||
      !r.Get(&u.version)) {
    return absl::DataLossError(
        absl::StrCat("replication record of ", bytes.size(), " bytes: truncated header"));
  }
  const uint64_t want = uint64_t{pushes} * 12 + uint64_t{keys} * 8 + uint64_t{grads} * 4;
  if (want != r.left()) {
    return absl::DataLossError(absl::StrCat("replication record: ", pushes, " pushes, ", keys,
                                            " keys and ", grads, " floats need ", want, " bytes, ",
                                            r.left(), " follow"));
  }
  u.pushes.resize(pushes);
  for (auto& [sender, seq] : u.pushes) {
    r.Get(&sender);
    r.Get(&seq);
  }
  absl::string_view k, g;
  r.Bytes(uint64_t{keys} * 8, &k);
  r.Bytes(uint64_t{grads} * 4, &g);
  // An empty vector's data() may be null (a dense record has no keys), and
  // memcpy to null is undefined even for 0 bytes.
  u.keys.resize(keys);
  if (keys > 0) std::memcpy(u.keys.data(), k.data(), k.size());
  u.grads.resize(grads);
  if (grads > 0) std::memcpy(u.grads.data(), g.data(), g.size());
  return u;
}

std::string EncodeReplicaCopy(const std::map<storage::BlockType, std::string>& streams) {
  std::vector<CopyStream> views;
  for (const auto& [type, s] : streams) views.push_back(CopyStream{type, {s}});
  std::string out;
  EncodeReplicaCopy(views, &out);
  return out;
}

size_t ReplicaCopySize(const std::vector<CopyStream>& streams) {
  size_t total = 4;
  for (const CopyStream& s : streams) {
    total += 12;
    for (absl::string_view p : s.parts) total += p.size();
  }
  return total;
}

void EncodeReplicaCopy(const std::vector<CopyStream>& streams, std::string* out) {
  const size_t total = ReplicaCopySize(streams);
  if (out->size() < total) out->resize(total);
  char* at = out->data();
  const auto put = [&at](const void* p, size_t n) {
    if (n > 0) std::memcpy(at, p, n);
    at += n;
  };
  const uint32_t n = static_cast<uint32_t>(streams.size());
  put(&n, sizeof(n));
  for (const CopyStream& s : streams) {
    const uint32_t type = static_cast<uint32_t>(s.type);
    uint64_t size = 0;
    for (absl::string_view p : s.parts) size += p.size();
    put(&type, sizeof(type));
    put(&size, sizeof(size));
    for (absl::string_view p : s.parts) put(p.data(), p.size());
  }
  out->resize(total);  // (never larger: cut to the copy)
}

absl::StatusOr<std::map<storage::BlockType, std::string>> DecodeReplicaCopy(
    absl::string_view bytes) {
  Reader r(bytes);
  uint32_t n = 0;
  if (!r.Get(&n)) return absl::DataLossError("replica copy: truncated");
  std::map<storage::BlockType, std::string> streams;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t type = 0;
    uint64_t size = 0;
    absl::string_view s;
    if (!r.Get(&type) || !r.Get(&size) || !r.Bytes(size, &s)) {
      return absl::DataLossError(absl::StrCat("replica copy of ", bytes.size(), " bytes: stream ",
                                              i, " of ", n, " truncated"));
    }
    if (!streams.emplace(static_cast<storage::BlockType>(type), std::string(s)).second) {
      return absl::DataLossError(absl::StrCat("replica copy: block type ", type, " twice"));
    }
  }
  if (r.left() != 0) {
    return absl::DataLossError(
        absl::StrCat("replica copy: ", r.left(), " bytes after the last stream"));
  }
  return streams;
}

}  // namespace strata::pserver
