#include "transport/rdma/verbs.h"

#include <arpa/inet.h>
#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace strata::transport::rdma {
namespace {

std::string Errno(int e) { return absl::StrCat(std::strerror(e), " (errno ", e, ")"); }

ibv_mtu MtuEnum(int bytes) {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

const char* QpStateName(ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET:
      return "RESET";
    case IBV_QPS_INIT:
      return "INIT";
    case IBV_QPS_RTR:
      return "RTR";
    case IBV_QPS_RTS:
      return "RTS";
    case IBV_QPS_SQD:
      return "SQD";
    case IBV_QPS_SQE:
      return "SQE";
    case IBV_QPS_ERR:
      return "ERR";
    default:
      return "UNKNOWN";
  }
}

const char* OpcodeName(ibv_wc_opcode op) {
  switch (op) {
    case IBV_WC_SEND:
      return "SEND";
    case IBV_WC_RDMA_WRITE:
      return "RDMA WRITE";
    case IBV_WC_RDMA_READ:
      return "RDMA READ";
    case IBV_WC_RECV:
      return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM:
      return "RECV (RDMA WRITE with immediate)";
    default:
      return "operation";
  }
}

}  // namespace

std::string DescribeQpInfo(const QpInfo& info) {
  char gid[INET6_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET6, info.gid.data(), gid, sizeof(gid));
  return absl::StrFormat("qpn 0x%x psn 0x%x gid %s lid %d mtu %d", info.qpn, info.psn, gid,
                         info.lid, info.mtu);
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<VerbsDevice>> VerbsDevice::Open(const RdmaSelection& sel) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_get_device_list: ", Errno(errno)));
  }
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> owner(list, ibv_free_device_list);
  ibv_device* dev = nullptr;
  for (int i = 0; i < n; ++i) {
    if (sel.device == ibv_get_device_name(list[i])) dev = list[i];
  }
  if (dev == nullptr) {
    return absl::NotFoundError(absl::StrCat("RDMA device ", sel.device, " is gone"));
  }
  std::unique_ptr<VerbsDevice> d(new VerbsDevice());
  d->selection_ = sel;
  d->ctx_ = ibv_open_device(dev);
  if (d->ctx_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("ibv_open_device(", sel.device, "): ", Errno(errno)));
  }
  d->pd_ = ibv_alloc_pd(d->ctx_);
  if (d->pd_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_alloc_pd(", sel.device, "): ", Errno(errno)));
  }
  ibv_port_attr pa{};
  if (int rc = ibv_query_port(d->ctx_, static_cast<uint8_t>(sel.port), &pa); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("ibv_query_port(", sel.device, ", ", sel.port, "): ", Errno(rc)));
  }
  d->lid_ = pa.lid;
  ibv_gid gid{};
  if (int rc = ibv_query_gid(d->ctx_, static_cast<uint8_t>(sel.port), sel.gid_index, &gid);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("ibv_query_gid(", sel.device, ", port ", sel.port,
                                               ", index ", sel.gid_index, "): ", Errno(rc)));
  }
  std::memcpy(d->gid_.data(), gid.raw, sizeof(gid.raw));
  return d;
}

VerbsDevice::~VerbsDevice() {
  if (pd_ != nullptr) {
    if (int rc = ibv_dealloc_pd(pd_); rc != 0) {
      LOG(WARNING) << "ibv_dealloc_pd(" << selection_.device << "): " << Errno(rc)
                   << " (a region, queue pair or CQ of it still exists)";
    }
  }
  if (ctx_ != nullptr) ibv_close_device(ctx_);
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ProtectionDomain>> ProtectionDomain::Allocate(VerbsDevice* device) {
  ibv_pd* pd = ibv_alloc_pd(device->context());
  if (pd == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ibv_alloc_pd(", device->selection().device, "): ", Errno(errno)));
  }
  return std::unique_ptr<ProtectionDomain>(new ProtectionDomain(device, pd));
}

ProtectionDomain::~ProtectionDomain() {
  if (int rc = ibv_dealloc_pd(pd_); rc != 0) {
    LOG(WARNING) << "ibv_dealloc_pd(" << device_->selection().device << "): " << Errno(rc)
                 << " (a region or queue pair of it still exists)";
  }
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> MemoryRegion::Register(VerbsDevice* device,
                                                                     void* addr, size_t length,
                                                                     int access, ibv_pd* pd) {
  ibv_mr* mr = ibv_reg_mr(pd != nullptr ? pd : device->pd(), addr, length, access);
  if (mr == nullptr) {
    const int e = errno;
    std::string why = absl::StrCat("ibv_reg_mr(", device->selection().device, ", ", length,
                                   " bytes): ", Errno(e));
    if (e == ENOMEM || e == EPERM || e == EAGAIN) {
      absl::StrAppend(&why, "; the locked-memory limit is ",
                      MemlockLimitBytes() == UINT64_MAX
                          ? std::string("unlimited")
                          : absl::StrCat(MemlockLimitBytes(), " bytes"),
                      ": raise it (`ulimit -l unlimited`, LimitMEMLOCK=infinity in the "
                      "systemd unit) and see `strata doctor`");
    }
    return absl::ResourceExhaustedError(why);
  }
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(mr));
}

MemoryRegion::~MemoryRegion() {
  if (int rc = ibv_dereg_mr(mr_); rc != 0) LOG(WARNING) << "ibv_dereg_mr: " << Errno(rc);
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CompletionChannel>> CompletionChannel::Create(VerbsDevice* device) {
  ibv_comp_channel* ch = ibv_create_comp_channel(device->context());
  if (ch == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("ibv_create_comp_channel(", device->selection().device, "): ", Errno(errno)));
  }
  const int flags = fcntl(ch->fd, F_GETFL);
  if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    const int err = errno;
    ibv_destroy_comp_channel(ch);
    return absl::UnavailableError(absl::StrCat("fcntl(O_NONBLOCK) on the completion channel of ",
                                               device->selection().device, ": ", Errno(err)));
  }
  return std::unique_ptr<CompletionChannel>(new CompletionChannel(ch));
}

CompletionChannel::~CompletionChannel() {
  if (int rc = ibv_destroy_comp_channel(channel_); rc != 0) {
    LOG(WARNING) << "ibv_destroy_comp_channel: " << Errno(rc)
                 << " (a completion queue still uses it)";
  }
}

int CompletionChannel::DrainEvents() {
  int n = 0;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(channel_, &cq, &context) == 0) {
    ibv_ack_cq_events(cq, 1);
    ++n;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> CompletionQueue::Create(
    VerbsDevice* device, int depth, CompletionChannel* channel) {
  ibv_cq* cq = ibv_create_cq(device->context(), depth, nullptr,
                             channel != nullptr ? channel->channel() : nullptr, 0);
  if (cq == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_create_cq(", device->selection().device,
                                               ", depth ", depth, "): ", Errno(errno)));
  }
  return std::unique_ptr<CompletionQueue>(new CompletionQueue(cq));
}

CompletionQueue::~CompletionQueue() {
  if (int rc = ibv_destroy_cq(cq_); rc != 0) {
    LOG(WARNING) << "ibv_destroy_cq: " << Errno(rc) << " (a queue pair still uses it)";
  }
}

absl::StatusOr<int> CompletionQueue::Poll(ibv_wc* wc, int n) {
  const int got = ibv_poll_cq(cq_, n, wc);
  if (got < 0) return absl::UnavailableError(absl::StrCat("ibv_poll_cq: returned ", got));
  return got;
}

absl::Status CompletionQueue::Arm() {
  if (int rc = ibv_req_notify_cq(cq_, 0); rc != 0)
    return absl::UnavailableError(absl::StrCat("ibv_req_notify_cq: ", Errno(rc)));
  return absl::OkStatus();
}

absl::Status CompletionStatus(const ibv_wc& wc, const std::string& peer) {
  if (wc.status == IBV_WC_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(OpcodeName(wc.opcode), " with ", peer,
                                             " failed: ", ibv_wc_status_str(wc.status),
                                             " (wc status ", static_cast<int>(wc.status),
                                             ", vendor error 0x", absl::Hex(wc.vendor_err), ")"));
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RcQueuePair>> RcQueuePair::Create(VerbsDevice* device,
                                                                 CompletionQueue* send_cq,
                                                                 CompletionQueue* recv_cq,
                                                                 int max_send_wr, int max_recv_wr,
                                                                 std::string peer, ibv_pd* pd) {
  ibv_qp_init_attr init{};
  init.send_cq = send_cq->cq();
  init.recv_cq = recv_cq->cq();
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = static_cast<uint32_t>(max_send_wr);
  init.cap.max_recv_wr = static_cast<uint32_t>(max_recv_wr);
  init.cap.max_send_sge = 2;  // header + payload chunk (PostSendGather)
  init.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd != nullptr ? pd : device->pd(), &init);
  if (qp == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_create_qp(", device->selection().device,
                                               ") for ", peer, ": ", Errno(errno)));
  }
  std::random_device rd;
  const uint32_t psn = rd() & 0xffffff;
  return std::unique_ptr<RcQueuePair>(new RcQueuePair(device, qp, psn, std::move(peer)));
}

RcQueuePair::~RcQueuePair() {
  if (int rc = ibv_destroy_qp(qp_); rc != 0) {
    LOG(WARNING) << "ibv_destroy_qp for " << peer_ << ": " << Errno(rc);
  }
}

QpInfo RcQueuePair::local_info() const {
  QpInfo info;
  info.qpn = qp_->qp_num;
  info.psn = psn_;
  info.gid = device_->gid();
  info.lid = device_->lid();
  info.mtu = device_->selection().active_mtu;
  return info;
}

absl::Status RcQueuePair::Init() {
  if (initialized_) return absl::OkStatus();
  const RdmaSelection& sel = device_->selection();
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(sel.port);
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (int rc = ibv_modify_qp(qp_, &a,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("ibv_modify_qp(RESET -> INIT) for ", peer_, ": ", Errno(rc)));
  }
  initialized_ = true;
  return absl::OkStatus();
}

absl::Status RcQueuePair::Connect(const QpInfo& remote) {
  if (absl::Status s = Init(); !s.ok()) return s;
  const RdmaSelection& sel = device_->selection();
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = MtuEnum(std::min(sel.active_mtu, remote.mtu));
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;  // RoCE needs the GRH; harmless on InfiniBand
  std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid.data(), remote.gid.size());
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(sel.gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.dlid = remote.lid;
  a.ah_attr.sl = 0;
  a.ah_attr.port_num = static_cast<uint8_t>(sel.port);
  if (int rc = ibv_modify_qp(qp_, &a,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("ibv_modify_qp(INIT -> RTR) for ", peer_,
                                               " (remote ", DescribeQpInfo(remote),
                                               "): ", Errno(rc)));
  }
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;  // 4.096 us * 2^14 = 67 ms per try
  a.retry_cnt = 7;
  a.rnr_retry = 7;  // receiver not ready: retry forever (credits prevent it)
  a.sq_psn = psn_;
  a.max_rd_atomic = 1;
  if (int rc = ibv_modify_qp(qp_, &a,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("ibv_modify_qp(RTR -> RTS) for ", peer_, ": ", Errno(rc)));
  }
  return absl::OkStatus();
}

absl::Status RcQueuePair::PostRecv(uint64_t wr_id, char* addr, uint32_t length, uint32_t lkey) {
  ibv_sge sge{reinterpret_cast<uint64_t>(addr), length, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("ibv_post_recv for ", peer_, " (QP ", StateName(), "): ", Errno(rc)));
  }
  return absl::OkStatus();
}

absl::Status RcQueuePair::PostSendWr(ibv_wr_opcode opcode, const char* what, uint64_t wr_id,
                                     const char* addr, uint32_t length, uint32_t lkey,
                                     bool signaled, uint32_t imm, uint64_t remote_addr,
                                     uint32_t rkey, const ibv_sge* second) {
  ibv_sge sge[2] = {{reinterpret_cast<uint64_t>(addr), length, lkey}, {}};
  if (second != nullptr) sge[1] = *second;
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = second != nullptr ? 2 : 1;
  wr.opcode = opcode;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    return absl::UnavailableError(absl::StrCat("ibv_post_send(", what, ") to ", peer_, " (QP ",
                                               StateName(), "): ", Errno(rc)));
  }
  return absl::OkStatus();
}

absl::Status RcQueuePair::PostSend(uint64_t wr_id, const char* addr, uint32_t length, uint32_t lkey,
                                   bool signaled) {
  return PostSendWr(IBV_WR_SEND, "SEND", wr_id, addr, length, lkey, signaled,
                    /*imm=*/0, /*remote_addr=*/0, /*rkey=*/0);
}

absl::Status RcQueuePair::PostSendGather(uint64_t wr_id, const char* head, uint32_t head_length,
                                         uint32_t head_lkey, const char* body, uint32_t body_length,
                                         uint32_t body_lkey, bool signaled) {
  const ibv_sge second{reinterpret_cast<uint64_t>(body), body_length, body_lkey};
  return PostSendWr(IBV_WR_SEND, "SEND", wr_id, head, head_length, head_lkey, signaled,
                    /*imm=*/0, /*remote_addr=*/0, /*rkey=*/0, &second);
}

absl::Status RcQueuePair::PostWriteWithImm(uint64_t wr_id, const char* addr, uint32_t length,
                                           uint32_t lkey, uint64_t remote_addr, uint32_t rkey,
                                           uint32_t imm, bool signaled) {
  return PostSendWr(IBV_WR_RDMA_WRITE_WITH_IMM, "RDMA WRITE with immediate", wr_id, addr, length,
                    lkey, signaled, imm, remote_addr, rkey);
}

absl::Status RcQueuePair::PostWrite(uint64_t wr_id, const char* addr, uint32_t length,
                                    uint32_t lkey, uint64_t remote_addr, uint32_t rkey,
                                    bool signaled) {
  return PostSendWr(IBV_WR_RDMA_WRITE, "RDMA WRITE", wr_id, addr, length, lkey, signaled, /*imm=*/0,
                    remote_addr, rkey);
}

absl::Status RcQueuePair::ForceError() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (int rc = ibv_modify_qp(qp_, &a, IBV_QP_STATE); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("ibv_modify_qp(-> ERR) for ", peer_, ": ", Errno(rc)));
  }
  return absl::OkStatus();
}

std::string RcQueuePair::StateName() const {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp_, &a, IBV_QP_STATE, &init) != 0) return "unknown state";
  return QpStateName(a.qp_state);
}

}  // namespace strata::transport::rdma
