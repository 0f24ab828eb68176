// Thin RAII layer over libibverbs for the rdma transport: an opened device
// with its protection domain, completion queues, registered memory and RC
// queue pairs. Every failing verbs call is an absl::Status that names the
// call and, where there is one, the peer; nothing here aborts.
//
// Built only with STRATA_WITH_RDMA (libibverbs). Not thread-safe unless a
// method says so: the transport drives each object from its own thread.
// Destroy in reverse order of creation: queue pairs, then CQs and regions,
// then the device (verbs refuses to free a PD or CQ still in use; that is
// logged, and the resource leaks).
#ifndef STRATA_TRANSPORT_RDMA_VERBS_H_
#define STRATA_TRANSPORT_RDMA_VERBS_H_

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/rdma/rdma_device.h"

namespace strata::transport::rdma {

// What one side of an RC connection tells the other (over the control
// channel) so the two queue pairs can be joined.
struct QpInfo {
  uint32_t qpn = 0;
  uint32_t psn = 0;               // 24 bits
  std::array<uint8_t, 16> gid{};  // RoCE: the GID to reach this side
  uint16_t lid = 0;               // InfiniBand
  int mtu = 1024;                 // active MTU in bytes
};
std::string DescribeQpInfo(const QpInfo& info);

// An opened device and its protection domain.
class VerbsDevice {
 public:
  // Opens `selection.device` (as chosen by SelectRdmaDevice).
  static absl::StatusOr<std::unique_ptr<VerbsDevice>> Open(const RdmaSelection& selection);
  ~VerbsDevice();
  VerbsDevice(const VerbsDevice&) = delete;
  VerbsDevice& operator=(const VerbsDevice&) = delete;

  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  const RdmaSelection& selection() const { return selection_; }
  const std::array<uint8_t, 16>& gid() const { return gid_; }
  uint16_t lid() const { return lid_; }

 private:
  VerbsDevice() = default;
  RdmaSelection selection_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::array<uint8_t, 16> gid_{};
  uint16_t lid_ = 0;
};

// A protection domain of one connection: its queue pair and the memory
// regions it may use. A remote key works only on a queue pair of the
// region's domain, so a key handed to one peer is no use to another.
class ProtectionDomain {
 public:
  static absl::StatusOr<std::unique_ptr<ProtectionDomain>> Allocate(VerbsDevice* device);
  ~ProtectionDomain();  // after every queue pair and region of it
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;

  ibv_pd* pd() const { return pd_; }
  VerbsDevice* device() const { return device_; }

 private:
  ProtectionDomain(VerbsDevice* device, ibv_pd* pd) : device_(device), pd_(pd) {}
  VerbsDevice* const device_;
  ibv_pd* const pd_;
};

// Memory registered with the device, once (never per message).
class MemoryRegion {
 public:
  // `access`: IBV_ACCESS_* flags; the narrowest that the use needs. `pd`:
  // the protection domain (null: the device's). A failure names ibv_reg_mr
  // and, for ENOMEM/EPERM, the locked-memory limit with its fix.
  static absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(VerbsDevice* device, void* addr,
                                                                size_t length, int access,
                                                                ibv_pd* pd = nullptr);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  char* data() const { return static_cast<char*>(mr_->addr); }
  size_t size() const { return mr_->length; }
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }

 private:
  explicit MemoryRegion(ibv_mr* mr) : mr_(mr) {}
  ibv_mr* mr_;
};

// A completion channel: a file descriptor that becomes readable when an
// armed CQ attached to it gets a completion (event-driven completion).
class CompletionChannel {
 public:
  static absl::StatusOr<std::unique_ptr<CompletionChannel>> Create(VerbsDevice* device);
  ~CompletionChannel();
  CompletionChannel(const CompletionChannel&) = delete;
  CompletionChannel& operator=(const CompletionChannel&) = delete;

  ibv_comp_channel* channel() const { return channel_; }
  int fd() const { return channel_->fd; }
  // Consumes every pending event (the fd is non-blocking), acknowledging
  // each; returns how many there were.
  int DrainEvents();

 private:
  explicit CompletionChannel(ibv_comp_channel* channel) : channel_(channel) {}
  ibv_comp_channel* channel_;
};

class CompletionQueue {
 public:
  // `channel`: where the CQ's events go once armed (nullptr: none).
  static absl::StatusOr<std::unique_ptr<CompletionQueue>> Create(
      VerbsDevice* device, int depth, CompletionChannel* channel = nullptr);
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  ibv_cq* cq() const { return cq_; }
  // Up to `n` completions into wc; the count, or an error naming ibv_poll_cq.
  absl::StatusOr<int> Poll(ibv_wc* wc, int n);
  // Asks for one event on the completion channel at the next completion.
  absl::Status Arm();

 private:
  explicit CompletionQueue(ibv_cq* cq) : cq_(cq) {}
  ibv_cq* cq_;
};

// A completion's outcome: OK, or Unavailable naming the operation, the verbs
// status and the peer.
absl::Status CompletionStatus(const ibv_wc& wc, const std::string& peer);

// A reliable-connected queue pair. Created in RESET, joined to its peer by
// Connect (INIT -> RTR -> RTS); a QP in error reports every later post and
// completion as an error, and is torn down by its owner.
class RcQueuePair {
 public:
  // `pd`: the protection domain (null: the device's).
  static absl::StatusOr<std::unique_ptr<RcQueuePair>> Create(
      VerbsDevice* device, CompletionQueue* send_cq, CompletionQueue* recv_cq, int max_send_wr,
      int max_recv_wr, std::string peer, ibv_pd* pd = nullptr);
  ~RcQueuePair();
  RcQueuePair(const RcQueuePair&) = delete;
  RcQueuePair& operator=(const RcQueuePair&) = delete;

  QpInfo local_info() const;
  const std::string& peer() const { return peer_; }
  // RESET -> INIT: receives may be posted from here on. Remote access: RDMA
  // WRITE into this side's regions (their rkeys), nothing else.
  absl::Status Init();
  // Joins this QP to the remote one (INIT -> RTR -> RTS; Init first if not
  // done); the path MTU is the smaller of the two.
  absl::Status Connect(const QpInfo& remote);

  absl::Status PostRecv(uint64_t wr_id, char* addr, uint32_t length, uint32_t lkey);
  // SEND of [addr, addr + length) into the receive the peer posted next.
  absl::Status PostSend(uint64_t wr_id, const char* addr, uint32_t length, uint32_t lkey,
                        bool signaled);
  // One SEND gathered from two registered pieces (a header from one region,
  // a payload chunk from another), into the receive the peer posted next.
  absl::Status PostSendGather(uint64_t wr_id, const char* head, uint32_t head_length,
                              uint32_t head_lkey, const char* body, uint32_t body_length,
                              uint32_t body_lkey, bool signaled);
  // RDMA WRITE with immediate: `length` bytes into the peer's registered
  // memory at remote_addr/rkey; the peer gets a receive completion carrying
  // `imm` (it must have a receive posted).
  absl::Status PostWriteWithImm(uint64_t wr_id, const char* addr, uint32_t length, uint32_t lkey,
                                uint64_t remote_addr, uint32_t rkey, uint32_t imm, bool signaled);
  // RDMA WRITE (no immediate: the peer sees no completion).
  absl::Status PostWrite(uint64_t wr_id, const char* addr, uint32_t length, uint32_t lkey,
                         uint64_t remote_addr, uint32_t rkey, bool signaled);
  // Moves the QP to the error state (tests; a failing peer does the same).
  absl::Status ForceError();
  // "RESET", "INIT", "RTR", "RTS", "ERR", ... (ibv_query_qp).
  std::string StateName() const;

 private:
  RcQueuePair(VerbsDevice* device, ibv_qp* qp, uint32_t psn, std::string peer)
      : device_(device), qp_(qp), psn_(psn), peer_(std::move(peer)) {}
  // One work request on the send queue; `what` names it in errors.
  absl::Status PostSendWr(ibv_wr_opcode opcode, const char* what, uint64_t wr_id, const char* addr,
                          uint32_t length, uint32_t lkey, bool signaled, uint32_t imm,
                          uint64_t remote_addr, uint32_t rkey, const ibv_sge* second = nullptr);

  VerbsDevice* const device_;
  ibv_qp* const qp_;
  const uint32_t psn_;
  const std::string peer_;
  bool initialized_ = false;
};

}  // namespace strata::transport::rdma

#endif  // STRATA_TRANSPORT_RDMA_VERBS_H_
