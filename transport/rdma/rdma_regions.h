// The memory of the rdma backend's connections: the caller's regions named
// through Transport::RegisterMemory (Registry), their registrations in one
// connection's protection domain (PeerRegion), the slot memory and the
// device context a connection keeps alive. Internal to the rdma backend
// (rdma_transport.cc).
#ifndef STRATA_TRANSPORT_RDMA_RDMA_REGIONS_H_
#define STRATA_TRANSPORT_RDMA_RDMA_REGIONS_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "transport/rdma/verbs.h"

namespace strata::transport::rdma {

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using SlotMemory = std::unique_ptr<char, FreeDeleter>;

// ---------------------------------------------------------------------------
// What outlives the transport for as long as a connection handle does.

struct DeviceContext {
  std::unique_ptr<VerbsDevice> device;
  std::unique_ptr<CompletionChannel> events;
};

// Memory the caller named through Transport::RegisterMemory. It is
// registered with the device per connection (Channel::RegionFor), in that
// connection's protection domain, at its first use there: a peer's keys
// reach only what was registered for it.
class Registry {
 public:
  // `remote_write`: a destination peers may RDMA-WRITE into; otherwise a
  // send source (local reads need no access flag).
  absl::Status Register(void* addr, size_t size, bool remote_write);
  // The registered region holding [addr, addr + size), if any.
  bool Find(const char* addr, size_t size, bool remote_write, const char** base, size_t* bytes);

 private:
  struct Region {
    size_t size;
    bool remote_write;
  };

  bool FindLocked(const char* addr, size_t size, bool remote_write, const char** base,
                  size_t* bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::multimap<uintptr_t, Region> regions_ ABSL_GUARDED_BY(mu_);
};

// A caller's region registered in one connection's protection domain, for
// one key epoch. Calls using its keys hold it; the domain outlives it.
struct PeerRegion {
  std::shared_ptr<DeviceContext> ctx;  // (destroyed last)
  std::shared_ptr<ProtectionDomain> pd;
  std::unique_ptr<MemoryRegion> mr;  // (destroyed first)
  uint64_t epoch = 0;
  // Destinations: the connection's number for it, and whether the server
  // has its key (Channel::Announce): 0 not yet, 1 yes, -1 it cannot.
  uint32_t handle = 0;
  absl::Mutex announce_mu;
  int announced ABSL_GUARDED_BY(announce_mu) = 0;
  ~PeerRegion() { mr.reset(); }
};

// Announced regions a connection keeps; past it the oldest is forgotten
// (a request naming it is answered by SEND, as without a destination).
constexpr size_t kMaxRemoteRegions = 1024;

}  // namespace strata::transport::rdma

#endif  // STRATA_TRANSPORT_RDMA_RDMA_REGIONS_H_
