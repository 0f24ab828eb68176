// The rdma backend's connection: one RC queue pair, either side — its
// credits, fragmentation into SEND frames, RDMA WRITEs into registered
// destinations, completions, and failure (rdma_transport.h has the design).
// Internal to the rdma backend: rdma_transport.cc holds the connection
// handed to users and the transport.
#ifndef STRATA_TRANSPORT_RDMA_RDMA_CHANNEL_H_
#define STRATA_TRANSPORT_RDMA_RDMA_CHANNEL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/message.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_frames.h"
#include "transport/rdma/rdma_hello.h"
#include "transport/rdma/rdma_regions.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/verbs.h"
#include "transport/transport.h"

namespace strata::transport::rdma {

// Receive slots beyond the advertised credits, for credit-only frames
// (which take no credit). Receiver-not-ready retries cover the rest.
inline constexpr uint32_t kSpareRecvSlots = 4;

// As the tcp backend's write_stall_timeout.
inline constexpr absl::Duration kSendStallTimeout = absl::Seconds(60);

inline constexpr uint64_t kWrRecv = 1ull << 56;
inline constexpr uint64_t kWrSend = 2ull << 56;
inline constexpr uint64_t kWrSlotMask = (1ull << 32) - 1;

class Channel;

// The transport as its channels see it.
struct ChannelListener {
  virtual ~ChannelListener() = default;
  // A channel is new (its CQ must be polled) or has failed.
  virtual void ChannelsChanged() = 0;
  // A READY channel broke on a verbs error or a bad frame.
  virtual void CountFailure() = 0;
  // True on the completion thread (which must never wait for completions).
  virtual bool OnCompletionThread() const = 0;
  // Runs `work` (response callbacks of a failed channel, ...) on the
  // completion thread, as transport.h promises; inline when that thread is
  // the caller or has stopped.
  virtual void Run(std::vector<std::function<void()>> work) = 0;
};

// ---------------------------------------------------------------------------
// One RC connection, either side. Thread-safe: callers on any thread, the
// completion thread in PollOnce. Callbacks (response callbacks, the request
// handler) never run under mu_.

class Channel : public std::enable_shared_from_this<Channel> {
 public:
  enum Role { kClient, kServer };

  Channel(std::shared_ptr<DeviceContext> ctx, Role role, std::string peer,
          const RdmaTransportSettings& settings, uint64_t max_payload_bytes,
          std::shared_ptr<const RequestHandler> handler, ChannelListener* listener)
      : ctx_(std::move(ctx)),
        role_(role),
        peer_(std::move(peer)),
        recv_slots_(settings.recv_slots),
        send_slots_(settings.send_slots),
        slot_bytes_(settings.slot_bytes),
        max_payload_bytes_(max_payload_bytes),
        handler_(std::move(handler)),
        listener_(listener),
        announce_timeout_(settings.connect_timeout) {}

  ~Channel();

  const std::string& peer() const { return peer_; }

  // Creates the CQ, the QP and the two slot regions, moves the QP to INIT
  // and posts every receive slot. All or nothing: on error nothing stays
  // allocated.
  absl::Status Allocate();

  absl::StatusOr<HelloQp> LocalHello() const;

  // Joins the QP to the peer's and starts the data path.
  absl::Status Join(const HelloQp& remote);

  // Client: proves the joined queue pairs carry traffic both ways (a wrong
  // GID or route shows up here, not at the first real call): one probe
  // frame out, its answer back, within `timeout`.
  absl::Status Probe(absl::Duration timeout);

  // The caller's region [base, base + bytes) registered in this
  // connection's protection domain, with the narrowest access (remote
  // write for a destination, none for a send source): at its first use
  // here, and anew once the membership key epoch has moved past `epoch`'s
  // registration (the old keys stop working when the last call holding
  // them is done). Null when the connection is not ready or the
  // registration fails (the call then goes by copies; logged once).
  std::shared_ptr<PeerRegion> RegionFor(const char* base, size_t bytes, bool remote_write,
                                        uint64_t epoch);

  // Client: the TCP bootstrap connection (sealed under membership), which
  // carries the announcements of destination regions.
  void SetBootstrap(std::weak_ptr<Connection> bootstrap);

  // Client: whether the server has destination `r`'s key, announcing it
  // first (RdmaHello.region on the bootstrap: the key never travels on the
  // queue pair). Once per region; waits for the answer, except on the
  // completion thread (false there: that call's answer comes by SEND).
  bool Announce(PeerRegion* r);

  // Server: a destination the client announced on the bootstrap.
  absl::Status AddRemoteRegion(const proto::RdmaRegion& r);

  // Server: requests on this connection must come from node `node` (the
  // one its bootstrap's membership handshake proved); another sender
  // closes it, as on TCP.
  void BindNode(uint32_t node);

  // Closes the TCP bootstrap connection; run once when this fails, so that
  // the peer tears its side down too.
  void SetCloser(std::function<void()> closer);

  ConnectionState state() const;
  bool failed() const { return state() == ConnectionState::kFailed; }
  absl::Status failure() const;
  RdmaConnectionStats stats() const;
  uint32_t DestinationKey(const void* addr) const;

  // Client: sends a request; `done` runs once with the response or an
  // error. `dest`: CallInto's destination (copied into when a fitting
  // response comes by SEND); `remote`: the same destination when
  // registered, for the server to RDMA WRITE into.
  //
  // `source_lkey` (non-zero): the request's borrowed payload lies in memory
  // registered with that key. Then its SENDs gather straight from it (no
  // copy into the send slots). With payload_ref_until_response the caller
  // keeps the bytes until `done` runs, and Call returns at once; otherwise
  // Call returns once those SENDs completed (the borrow ends when Call
  // returns), except on the completion thread, which must not wait: there
  // the payload is copied. (Nor should such a Call wait on another
  // transport's thread: do not make one from another transport's callback.)
  void Call(Message request, ResponseCallback done, char* dest, size_t dest_size,
            const WriteTarget& remote, std::shared_ptr<PeerRegion> dest_region = nullptr,
            std::shared_ptr<PeerRegion> source_region = nullptr);

  // Server: sends the response to `request` (finished by OnceResponder),
  // by RDMA WRITE into `target` when it holds a successful payload of the
  // target's size.
  void Respond(const MessageHeader& request, Message response, const WriteTarget& target);

  // Fails the connection: pending calls get `reason`, resources are freed.
  void Fail(const absl::Status& reason, bool warn = false);

  absl::Status ForceError();

  absl::Status Arm();

  // Completion thread: handles what the CQ has; returns how many
  // completions there were.
  int PollOnce();

 private:
  struct Pending {
    ResponseCallback done;
    char* dest;
    size_t dest_size;
    // The regions whose keys the request carries or its SENDs read:
    // registered until the call is done.
    std::vector<std::shared_ptr<PeerRegion>> regions;
  };
  // A message sent straight from the caller's registered memory.
  struct ZeroCopy {
    std::shared_ptr<PeerRegion> region;  // holds `lkey` while SENDs read it
    uint32_t lkey = 0;
    bool posted_all = false;  // every frame posted
    int in_flight = 0;        // posted SENDs not completed yet
  };
  // A message on its way out.
  struct Outgoing {
    char header[kMsgHeaderBytes];
    Frame frame;        // kMessage or kWritten, with dest_* for requests
    std::string owned;  // the payload, when owned
    const char* data = nullptr;
    size_t size = 0;
    bool borrowed = false;                // data points at the caller's memory
    size_t sent = 0;                      // payload bytes posted
    bool started = false;                 // the first frame was posted
    WriteTarget write;                    // kWritten: where the payload goes
    std::shared_ptr<ZeroCopy> zero_copy;  // SENDs gather from `data` itself
  };

  absl::Status AllocateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status Named(const absl::Status& s) const;

  // Frees every verbs resource, QP first (so nothing DMAs into freed slots).
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status FailureLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // `warn`: a verbs error or a bad frame (logged as a warning), rather
  // than a close (released, shut down, the peer went away).
  void FailLocked(const absl::Status& reason, bool warn = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  char* RecvSlot(uint32_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  char* SendSlot(uint32_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status PostRecvSlot(uint32_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Queues a frame of the path check.
  void EnqueueControl(uint16_t kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Queues `message` (taking its payload or borrowing the caller's) and
  // sends what credits and slots allow; what is left stays queued with its
  // payload copied, so the caller's memory is free when this returns;
  // except a zero-copy message, which keeps reading the caller's memory
  // (its Call waits, or its caller keeps the bytes until the answer).
  void Enqueue(Message message, Outgoing out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Posts queued frames while credits and send slots last; returns credits
  // in a credit frame when they pile up with nothing to carry them (also
  // when the queue waits for credits: the peer may be waiting for ours).
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void PumpQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint32_t TakeSendSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One SEND: frame header (+ message header) (+ chunk) from a send slot.
  // Data frames take a credit; every frame returns ours.
  // `zero_copy`: the chunk is gathered from the caller's registered memory
  // instead of copied into the slot.
  bool PostFrame(Frame f, const char* msg_header, const char* chunk, uint32_t n,
                 const std::shared_ptr<ZeroCopy>& zero_copy = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void OnCompletion(const ibv_wc& wc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One received frame (a slot's bytes); the slot is reposted after.
  absl::Status OnReceive(const char* p, uint32_t len, bool* took_credit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Deliver(IncomingMessage in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<DeviceContext> ctx_;
  const Role role_;
  const std::string peer_;
  const uint32_t recv_slots_;
  const uint32_t send_slots_;
  const uint32_t slot_bytes_;
  const uint64_t max_payload_bytes_;
  const std::shared_ptr<const RequestHandler> handler_;  // server side
  ChannelListener* const listener_;
  const absl::Duration announce_timeout_;  // Announce's wait for the answer

  // The caller's regions registered for this peer (RegionFor), by start
  // and use. Taken without mu_ held (registering is a system call).
  mutable absl::Mutex regions_mu_;
  std::map<std::pair<uintptr_t, bool>, std::shared_ptr<PeerRegion>> regions_
      ABSL_GUARDED_BY(regions_mu_);
  bool region_failure_logged_ ABSL_GUARDED_BY(regions_mu_) = false;
  uint64_t stats_region_rotations_ ABSL_GUARDED_BY(regions_mu_) = 0;
  uint32_t next_region_handle_ ABSL_GUARDED_BY(regions_mu_) = 0;

  mutable absl::Mutex mu_;
  ConnectionState state_ ABSL_GUARDED_BY(mu_) = ConnectionState::kExchanging;
  std::optional<uint32_t> bound_node_ ABSL_GUARDED_BY(mu_);  // server: BindNode
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CompletionQueue> cq_ ABSL_GUARDED_BY(mu_);
  // This connection's own protection domain: its queue pair, its slots
  // and the caller's regions registered for this peer (RegionFor).
  std::shared_ptr<ProtectionDomain> pd_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<RcQueuePair> qp_ ABSL_GUARDED_BY(mu_);
  SlotMemory recv_mem_ ABSL_GUARDED_BY(mu_);
  SlotMemory send_mem_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<MemoryRegion> recv_mr_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<MemoryRegion> send_mr_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_send_ ABSL_GUARDED_BY(mu_);
  // Per send slot: the zero-copy message its SEND reads from, if any.
  std::vector<std::shared_ptr<ZeroCopy>> slot_zero_copy_ ABSL_GUARDED_BY(mu_);
  uint64_t sends_completed_ ABSL_GUARDED_BY(mu_) = 0;  // progress, for stalls
  uint32_t peer_credits_ ABSL_GUARDED_BY(mu_) = 0;     // SENDs we may post
  uint32_t peer_recv_slots_ ABSL_GUARDED_BY(mu_) = 0;  // the peer's advertised slots
  uint32_t to_return_ ABSL_GUARDED_BY(mu_) = 0;        // slots reposted, not yet reported
  uint32_t frame_room_ ABSL_GUARDED_BY(mu_) = 0;       // bytes per SEND
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  FrameReader reader_ ABSL_GUARDED_BY(mu_);  // the frames received
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::function<void()> closer_ ABSL_GUARDED_BY(mu_);
  std::weak_ptr<Connection> bootstrap_ ABSL_GUARDED_BY(mu_);              // client
  std::map<uint32_t, RemoteRegion> remote_regions_ ABSL_GUARDED_BY(mu_);  // server
  bool probe_acked_ ABSL_GUARDED_BY(mu_) = false;
  RdmaConnectionStats stats_ ABSL_GUARDED_BY(mu_);
  // Callbacks to run once mu_ is released.
  std::vector<std::function<void()>> deferred_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::transport::rdma

#endif  // STRATA_TRANSPORT_RDMA_RDMA_CHANNEL_H_
