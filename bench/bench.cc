#include "bench/bench.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "common/model_spec.h"
#include "common/optimizer.h"
#include "common/row_optimizer.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "master/master_server.h"
#include "proto/strata.grpc.pb.h"
#include "pserver/partition.h"
#include "pserver/pserver.h"
#include "pserver/sparse_table.h"
#include "storage/file_system.h"
#include "transport/data_plane_auth.h"
#include "transport/transport.h"
#include "worker/param_client.h"

namespace strata::bench {
namespace {

Latency Percentiles(std::vector<double> us) {
  Latency l;
  if (us.empty()) return l;
  std::sort(us.begin(), us.end());
  l.p50_us = us[us.size() / 2];
  l.p99_us = us[std::min(us.size() - 1, static_cast<size_t>(us.size() * 0.99))];
  return l;
}

// A listening socket on 127.0.0.1 and its port.
absl::StatusOr<std::pair<int, int>> Listen() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd, 1) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("bind/listen on 127.0.0.1: ", strerror(errno)));
  }
  return std::make_pair(fd, static_cast<int>(ntohs(a.sin_port)));
}

absl::StatusOr<int> ConnectTo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port, ": ", strerror(errno)));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

absl::StatusOr<double> RawTcpThroughputGbps(uint64_t total) {
  double best = 0;
  for (uint64_t chunk : {128ull << 10, 1ull << 20, 16ull << 20}) {
    STRATA_ASSIGN_OR_RETURN(auto lp, Listen());
    std::vector<char> rbuf(1 << 20);
    std::thread server([&] {
      int c = accept(lp.first, nullptr, nullptr);
      uint64_t got = 0;
      while (got < total) {
        ssize_t r = recv(c, rbuf.data(), rbuf.size(), 0);
        if (r <= 0) break;
        got += static_cast<uint64_t>(r);
      }
      char ack = 1;
      WriteAll(c, &ack, 1);
      close(c);
    });
    auto fd = ConnectTo(lp.second);
    if (!fd.ok()) {
      close(lp.first);
      server.join();
      return fd.status();
    }
    std::vector<char> buf(chunk, 'x');
    const absl::Time t0 = absl::Now();
    for (uint64_t sent = 0; sent < total; sent += chunk) {
      WriteAll(*fd, buf.data(), std::min<uint64_t>(chunk, total - sent));
    }
    char ack;
    ReadAll(*fd, &ack, 1);
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    close(*fd);
    server.join();
    close(lp.first);
    best = std::max(best, total / secs / 1e9);
  }
  return best;
}

absl::StatusOr<Latency> RawTcpPingPong(uint64_t bytes, double seconds) {
  STRATA_ASSIGN_OR_RETURN(auto lp, Listen());
  std::thread server([&] {
    int c = accept(lp.first, nullptr, nullptr);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<char> b(bytes);
    while (ReadAll(c, b.data(), bytes) && WriteAll(c, b.data(), bytes)) {
    }
    close(c);
  });
  STRATA_ASSIGN_OR_RETURN(int fd, ConnectTo(lp.second));
  std::vector<char> b(bytes, 'p');
  std::vector<double> us;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  while (us.size() < 5 || (absl::Now() < end && us.size() < 100000)) {
    const absl::Time t0 = absl::Now();
    if (!WriteAll(fd, b.data(), bytes) || !ReadAll(fd, b.data(), bytes)) break;
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  close(fd);
  server.join();
  close(lp.first);
  return Percentiles(us);
}

namespace {

// The bench's job: one dense table, asp, a tiny learning rate.
JobConfig BenchConfig(uint64_t bytes, const std::string& optimizer, int64_t slice_bytes) {
  JobConfig config;
  config.job.name = "bench";
  config.job.consistency = Consistency::kAsp;
  config.model.type = "dense";
  config.model.dense_tables = {bytes / 4};
  config.optimizer.type = optimizer;
  config.optimizer.learning_rate = 1e-12;
  config.data.train_labels = "/labels";
  config.data.train_images = "/images";
  config.cluster.slice_bytes = slice_bytes;
  config.cluster.heartbeat_interval_ms = 1000;
  config.cluster.dead_timeout_ms = 3600 * 1000;
  config.cluster.request_timeout_ms = 120 * 1000;
  return config;
}

// Fetches the cluster view from the master. `stub` must outlive the result.
std::function<absl::StatusOr<proto::ClusterView>()> ViewFetcher(proto::Master::Stub* stub) {
  return [stub]() -> absl::StatusOr<proto::ClusterView> {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::ClusterView v;
    STRATA_RETURN_IF_ERROR(
        FromGrpcStatus(stub->GetClusterView(&ctx, proto::GetClusterViewRequest(), &v)));
    return v;
  };
}

// The master reads the training-set size from the labels and images files'
// headers: one record (a 1x1 image).
absl::Status WriteBenchLabels(storage::FileSystem* fs) {
  STRATA_RETURN_IF_ERROR(
      fs->WriteFileAtomic("/labels", std::string("\0\0\x08\x01\0\0\0\x01\x00", 9)));
  return fs->WriteFileAtomic("/images",
                             std::string("\0\0\x08\x03\0\0\0\x01\0\0\0\x01\0\0\0\x01\x00", 17));
}

// Clients registered with the master as workers (so the view becomes
// ready), each with its own data-plane transport. Cancels and shuts down
// its clients when destroyed.
struct BenchClients {
  std::unique_ptr<proto::Master::Stub> stub;  // used by the clients' view refresh
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<std::unique_ptr<worker::ParamClient>> clients;

  ~BenchClients() {
    for (auto& c : clients) c->Cancel();
    for (auto& t : transports) t->Shutdown();
  }
};

// Registers `n` clients with the master at `master` and waits (30 s at
// most) until the cluster view is ready.
absl::StatusOr<std::unique_ptr<BenchClients>> ConnectClients(
    const std::string& master, int n, const transport::TransportOptions& topts,
    absl::Duration request_timeout) {
  auto bc = std::make_unique<BenchClients>();
  bc->stub =
      proto::Master::NewStub(grpc::CreateChannel(master, grpc::InsecureChannelCredentials()));
  auto fetch_view = ViewFetcher(bc->stub.get());
  for (int i = 0; i < n; ++i) {
    proto::RegisterRequest req;
    req.set_role(proto::WORKER);
    req.set_index(i);
    req.set_host("127.0.0.1");
    proto::RegisterResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    STRATA_RETURN_IF_ERROR(FromGrpcStatus(bc->stub->Register(&ctx, req, &resp)));
    STRATA_ASSIGN_OR_RETURN(auto t, transport::CreateTransport(topts));
    bc->clients.push_back(std::make_unique<worker::ParamClient>(t.get(), resp.node_id(), fetch_view,
                                                                request_timeout));
    bc->transports.push_back(std::move(t));
  }
  const absl::Time ready_by = absl::Now() + absl::Seconds(30);
  while (true) {
    STRATA_ASSIGN_OR_RETURN(proto::ClusterView v, fetch_view());
    if (v.ready()) {
      for (auto& cl : bc->clients) cl->SetView(v);
      return bc;
    }
    if (absl::Now() > ready_by) return absl::DeadlineExceededError("bench cluster not ready");
    absl::SleepFor(absl::Milliseconds(20));
  }
}

uint64_t ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stoull(line.substr(field.size() + 1)) * 1024;  // "... kB"
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<MemoryResult> RunMemory(uint64_t model_bytes, const std::string& optimizer) {
  const JobConfig config = BenchConfig(model_bytes, optimizer, 4 << 20);
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return absl::InternalError("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // The pserver process: wait for the master's address, serve until killed.
    close(to_child[1]);
    close(to_parent[0]);
    char addr[256] = {0};
    if (read(to_child[0], addr, sizeof(addr) - 1) <= 0) _exit(1);
    pserver::PServerOptions po;
    po.config = config;
    po.master_address = addr;
    po.http_port = -1;
    auto child_fs = storage::NewMemoryFileSystem();
    po.fs = child_fs.get();
    auto ps = pserver::PServer::Create(po);
    if (!ps.ok() || !(*ps)->Start().ok()) _exit(2);
    const char ok = 1;
    if (write(to_parent[1], &ok, 1) != 1) _exit(3);
    pause();
    _exit(0);
  }
  close(to_child[0]);
  close(to_parent[1]);
  absl::Cleanup kill_child = [pid] {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  };
  auto fs = storage::NewMemoryFileSystem();
  STRATA_RETURN_IF_ERROR(WriteBenchLabels(fs.get()));
  master::MasterOptions mo;
  mo.config = config;
  mo.http_port = -1;
  mo.fs = fs.get();
  STRATA_ASSIGN_OR_RETURN(auto master, master::MasterServer::Create(mo));
  STRATA_RETURN_IF_ERROR(master->Start());
  const std::string addr = master->address();
  char ok = 0;
  if (write(to_child[1], addr.data(), addr.size()) != static_cast<ssize_t>(addr.size()) ||
      read(to_parent[0], &ok, 1) != 1) {
    return absl::InternalError("the pserver process did not start");
  }
  STRATA_ASSIGN_OR_RETURN(
      auto bc, ConnectClients(addr, 1, transport::TransportOptions(), absl::Seconds(120)));
  worker::ParamClient& client = *bc->clients[0];
  {
    std::vector<std::vector<float>> grads{std::vector<float>(model_bytes / 4, 1e-3f)};
    std::vector<std::vector<float>> params;
    for (int i = 0; i < 2; ++i) {
      STRATA_RETURN_IF_ERROR(client.PushAll(grads, 0, 1).status());
      STRATA_RETURN_IF_ERROR(client.PullAll(0, &params).status());
    }
  }
  MemoryResult r;
  r.model_bytes = model_bytes;
  STRATA_ASSIGN_OR_RETURN(auto probe, Optimizer::Create(config.optimizer, 1));
  r.state_bytes = probe->state_bytes_per_param() * (model_bytes / 4);
  r.rss_bytes = ProcStatusBytes(pid, "VmRSS");
  r.peak_rss_bytes = ProcStatusBytes(pid, "VmHWM");
  r.bound_bytes = 1.3 * static_cast<double>(r.model_bytes + r.state_bytes) + (64 << 20);
  return r;
}

absl::StatusOr<PushPullResult> RunPushPull(const PushPullCase& c) {
  JobConfig config = BenchConfig(c.bytes, "sgd", c.slice_bytes);
  config.cluster.chunk_bytes = c.chunk_bytes;

  auto fs = storage::NewMemoryFileSystem();
  STRATA_RETURN_IF_ERROR(WriteBenchLabels(fs.get()));

  master::MasterOptions mo;
  mo.config = config;
  mo.expected_pservers = c.servers;
  mo.expected_workers = c.workers;
  mo.http_port = -1;
  mo.fs = fs.get();
  STRATA_ASSIGN_OR_RETURN(auto master, master::MasterServer::Create(mo));
  STRATA_RETURN_IF_ERROR(master->Start());

  std::vector<std::unique_ptr<pserver::PServer>> servers;
  transport::TransportOptions topts;
  topts.kind = c.transport;
  topts.inproc_network = transport::NewInProcNetwork();
  topts.rdma.slot_bytes = static_cast<uint32_t>(c.rdma_slot_kib) << 10;
  topts.rdma.busy_poll = absl::Microseconds(c.rdma_busy_poll_us);
  for (int i = 0; i < c.servers; ++i) {
    pserver::PServerOptions po;
    po.config = config;
    po.master_address = master->address();
    po.index = i;
    po.http_port = -1;
    po.transport = topts;
    po.apply_threads = c.apply_threads;
    po.fs = fs.get();
    STRATA_ASSIGN_OR_RETURN(auto ps, pserver::PServer::Create(po));
    STRATA_RETURN_IF_ERROR(ps->Start());
    servers.push_back(std::move(ps));
  }

  STRATA_ASSIGN_OR_RETURN(auto bc,
                          ConnectClients(master->address(), c.workers, topts,
                                         absl::Milliseconds(config.cluster.request_timeout_ms)));
  auto& clients = bc->clients;

  const uint64_t floats = c.bytes / 4;
  const bool push = c.mode == "push" || c.mode == "pushpull";
  const bool pull = c.mode == "pull" || c.mode == "pushpull";
  const uint64_t bytes_per_op = (push ? c.bytes : 0) + (pull ? c.bytes : 0);
  std::vector<std::vector<double>> lat(c.workers);
  std::vector<absl::Status> errors(c.workers);
  std::vector<uint64_t> ops(c.workers, 0);
  // One warm-up operation each (connections, first-touch of buffers).
  std::vector<std::vector<std::vector<float>>> grads(c.workers), params(c.workers);
  for (int i = 0; i < c.workers; ++i) {
    grads[i] = {std::vector<float>(floats, 1e-3f)};
    // As a worker does: pushes sent straight from the registered gradient.
    if (c.register_tensors) {
      STRATA_RETURN_IF_ERROR(
          bc->transports[i]->RegisterMemory(grads[i][0].data(), grads[i][0].size() * sizeof(float),
                                            transport::Transport::MemoryUse::kSendSource));
    }
    if (push) STRATA_RETURN_IF_ERROR(clients[i]->PushAll(grads[i], 0, 1).status());
    if (pull) {
      STRATA_RETURN_IF_ERROR(clients[i]->PullAll(0, &params[i]).status());
      // As a worker does: the pull destination registered once (rdma
      // writes the responses straight into it; a no-op on tcp).
      for (auto& t : params[i]) {
        if (!c.register_tensors) break;
        STRATA_RETURN_IF_ERROR(bc->transports[i]->RegisterMemory(
            t.data(), t.size() * sizeof(float),
            transport::Transport::MemoryUse::kReceiveDestination));
      }
    }
  }
  const absl::Time t0 = absl::Now();
  const absl::Time end = t0 + absl::Seconds(c.seconds);
  std::vector<std::thread> threads;
  for (int i = 0; i < c.workers; ++i) {
    threads.emplace_back([&, i] {
      while (ops[i] < 5 || absl::Now() < end) {
        const absl::Time s = absl::Now();
        if (push && pull) {  // each slice's pull right behind its push
          auto r = clients[i]->PushThenPull(grads[i], 0, 1, 0, &params[i]);
          if (!r.ok()) {
            errors[i] = r.status();
            return;
          }
        } else if (push) {
          auto r = clients[i]->PushAll(grads[i], 0, 1);
          if (!r.ok()) {
            errors[i] = r.status();
            return;
          }
        } else {
          auto r = clients[i]->PullAll(0, &params[i]);
          if (!r.ok()) {
            errors[i] = r.status();
            return;
          }
        }
        lat[i].push_back(absl::ToDoubleMicroseconds(absl::Now() - s));
        ++ops[i];
      }
    });
  }
  for (auto& t : threads) t.join();
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  for (const auto& e : errors) STRATA_RETURN_IF_ERROR(e);

  PushPullResult r;
  r.c = c;
  std::vector<double> all;
  for (int i = 0; i < c.workers; ++i) {
    r.operations += ops[i];
    all.insert(all.end(), lat[i].begin(), lat[i].end());
  }
  r.gbps = static_cast<double>(r.operations * bytes_per_op) / secs / 1e9;
  r.latency = Percentiles(std::move(all));
  bc.reset();
  for (auto& s : servers) s->Shutdown();
  master->Shutdown();
  return r;
}

namespace {

// The baseline for apply: one pass that reads and writes the same arrays
// as the optimizer, with the least arithmetic (what memory allows). Built
// like the optimizer kernels (-O3, AVX2 clone) so it vectorises too.
// (clang refuses noinline beside target_clones; its clones are never
// inlined anyway.)
#if defined(__clang__)
#define STRATA_STREAM_ATTRIBUTES __attribute__((target_clones("avx2", "default")))
#else
#define STRATA_STREAM_ATTRIBUTES __attribute__((noinline, target_clones("avx2", "default")))
#endif
STRATA_STREAM_ATTRIBUTES void Stream(float* __restrict p, const float* __restrict g,
                                     float* __restrict m, float* __restrict v, size_t n,
                                     int arrays) {
  if (arrays == 2) {
    for (size_t i = 0; i < n; ++i) p[i] += g[i];
  } else {
    for (size_t i = 0; i < n; ++i) {
      p[i] += g[i];
      m[i] += g[i];
      v[i] += g[i];
    }
  }
}

}  // namespace

absl::StatusOr<ApplyResult> RunApply(const std::string& optimizer, uint64_t floats, int threads) {
  OptimizerSection oc;
  oc.type = optimizer;
  oc.learning_rate = 1e-6;
  threads = std::max(1, threads);
  const uint64_t per = (floats + threads - 1) / threads;
  std::vector<std::unique_ptr<Optimizer>> opts;
  for (int t = 0; t < threads; ++t) {
    STRATA_ASSIGN_OR_RETURN(
        auto o, Optimizer::Create(oc, std::min<uint64_t>(per, floats - std::min(floats, t * per))));
    opts.push_back(std::move(o));
  }
  std::vector<float> p(floats, 0.5f), g(floats, 1e-3f), m(floats, 0.f), v(floats, 0.f);
  const int arrays = optimizer == "adam" ? 4 : (optimizer == "momentum" ? 3 : 2);
  auto parallel = [&](const std::function<void(uint64_t, uint64_t, int)>& fn) {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      const uint64_t b = std::min(floats, t * per), e = std::min(floats, b + per);
      ts.emplace_back([&, b, e, t] { fn(b, e, t); });
    }
    for (auto& t : ts) t.join();
  };
  auto time_it = [&](const std::function<void(uint64_t, uint64_t, int)>& fn) {
    parallel(fn);  // warm-up: first touch
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const absl::Time t0 = absl::Now();
      parallel(fn);
      best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t0));
    }
    return best;
  };
  const double t_opt = time_it([&](uint64_t b, uint64_t e, int t) {
    opts[t]->Apply(p.data() + b, g.data() + b, 1.0f, e - b);
  });
  const double t_base = time_it([&](uint64_t b, uint64_t e, int) {
    Stream(p.data() + b, g.data() + b, m.data() + b, v.data() + b, e - b, arrays == 2 ? 2 : 4);
  });
  ApplyResult r;
  r.optimizer = optimizer;
  r.floats = floats;
  r.gbps = floats * 4.0 / t_opt / 1e9;
  r.baseline_gbps = floats * 4.0 / t_base / 1e9;
  return r;
}

namespace {

using transport::Message;
using transport::MessageType;

// The key of a Zipf rank: a fixed mix, so that hot keys lie anywhere in
// the key space (and in the partitions).
uint64_t KeyOfRank(uint64_t rank) { return SplitMix64(rank); }

// Zipf(s) over the ranks [0, n), rank 0 the most frequent: rejection-
// inversion sampling (W. Hormann, G. Derflinger, "Rejection-inversion to
// generate variates from monotone discrete distributions", ACM TOMACS
// 1996), O(1) per draw and no table. REQUIRES: n >= 1, s > 0.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s)
      : n_(static_cast<double>(n)),
        s_(s),
        h_x1_(HIntegral(1.5) - 1.0),
        h_n_(HIntegral(n_ + 0.5)),
        shortcut_(2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0))) {}

  uint64_t operator()(std::mt19937_64& rng) const {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    while (true) {
      const double u = h_n_ + unit(rng) * (h_x1_ - h_n_);
      const double x = HIntegralInverse(u);
      const double k = std::clamp(std::floor(x + 0.5), 1.0, n_);
      if (k - x <= shortcut_ || u >= HIntegral(k + 0.5) - H(k)) {
        return static_cast<uint64_t>(k) - 1;
      }
    }
  }

 private:
  // h(x) = x^-s; HIntegral its antiderivative (x^(1-s) - 1) / (1 - s),
  // written to stay exact as s -> 1.
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  double HIntegral(double x) const {
    const double lx = std::log(x);
    return Helper2((1.0 - s_) * lx) * lx;
  }
  double HIntegralInverse(double x) const {
    const double t = std::max(-1.0, x * (1.0 - s_));
    return std::exp(Helper1(t) * x);
  }
  static double Helper1(double x) {  // log1p(x) / x
    return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Helper2(double x) {  // expm1(x) / x
    return std::abs(x) > 1e-8 ? std::expm1(x) / x
                              : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
  }

  const double n_, s_, h_x1_, h_n_, shortcut_;
};

// One batch as a worker sends it: its unique keys, grouped by partition
// (keys[offsets[p] .. offsets[p + 1]) go to partition p).
struct SparseBatch {
  std::vector<uint64_t> keys;
  std::vector<uint32_t> offsets;
};

// Groups `keys` by partition, stable: (grouped keys, offsets).
void GroupByPartition(const std::vector<uint64_t>& keys, uint32_t partitions,
                      std::vector<uint64_t>* out, std::vector<uint32_t>* offsets) {
  offsets->assign(partitions + 1, 0);
  for (uint64_t k : keys) ++(*offsets)[SparsePartitionOf(k, partitions) + 1];
  for (uint32_t p = 0; p < partitions; ++p) (*offsets)[p + 1] += (*offsets)[p];
  std::vector<uint32_t> next(offsets->begin(), offsets->end() - 1);
  out->resize(keys.size());
  for (uint64_t k : keys) (*out)[next[SparsePartitionOf(k, partitions)]++] = k;
}

// c.pool_batches batches of c.batch_keys Zipf draws, each de-duplicated
// (sort + unique, as a worker does) and grouped by partition.
std::vector<SparseBatch> DrawBatches(const SparseCase& c) {
  const ZipfSampler zipf(c.rows, c.zipf_s);
  std::mt19937_64 rng(c.seed);
  std::vector<SparseBatch> pool(c.pool_batches);
  std::vector<uint64_t> drawn;
  for (SparseBatch& b : pool) {
    drawn.resize(c.batch_keys);
    for (uint64_t& k : drawn) k = KeyOfRank(zipf(rng));
    std::sort(drawn.begin(), drawn.end());
    drawn.erase(std::unique(drawn.begin(), drawn.end()), drawn.end());
    GroupByPartition(drawn, c.partitions, &b.keys, &b.offsets);
  }
  return pool;
}

absl::Status StatusOf(const absl::StatusOr<Message>& r) {
  return r.ok() ? transport::ResponseStatus(*r) : r.status();
}

// Requests in flight from the bench's client, a batch at a time: slot s
// holds the requests of one batch (and owns its pull destination).
// Thread-safe: the main thread begins batches, the client transport's
// thread ends requests.
class BatchWindow {
 public:
  explicit BatchWindow(int slots) : slots_(slots), pending_(slots, 0) {}
  int slots() const { return slots_; }
  // Waits until slot `s` has nothing in flight, then counts `n` requests.
  void Begin(int s, int n) {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](int* p) { return *p == 0; }, &pending_[s]));
    pending_[s] = n;
  }
  void End(int s, const absl::Status& status) {
    absl::MutexLock l(&mu_);
    --pending_[s];
    if (!status.ok() && error_.ok()) error_ = status;
  }
  // Waits until nothing is in flight; the first error of any request.
  absl::Status Drain() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(this, &BatchWindow::IdleLocked));
    return error_;
  }
  absl::Status error() const {
    absl::MutexLock l(&mu_);
    return error_;
  }

 private:
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::all_of(pending_.begin(), pending_.end(), [](int n) { return n == 0; });
  }

  const int slots_;
  mutable absl::Mutex mu_;
  std::vector<int> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// The bench's worker side: sends batches over one connection, one request
// per partition with keys, c.in_flight batches at a time. Pushes are one
// sender's (sequence numbers increase in sending order). Not thread-safe:
// one thread sends; responses are counted on the transport's thread.
class SparseClient {
 public:
  static constexpr uint32_t kSenderId = 1;

  // `grads`: a gradient row per key of a batch (c.batch_keys rows),
  // borrowed; must outlive the client.
  SparseClient(std::shared_ptr<transport::Connection> conn, const SparseCase& c,
               const std::vector<float>* grads)
      : conn_(std::move(conn)), dim_(c.dim), grads_(grads), window_(c.in_flight) {
    for (int s = 0; s < c.in_flight; ++s) {
      pulled_.emplace_back(c.batch_keys * static_cast<size_t>(c.dim));
    }
  }
  SparseClient(const SparseClient&) = delete;
  SparseClient& operator=(const SparseClient&) = delete;
  ~SparseClient() { (void)window_.Drain(); }

  // Sends a batch's pull or push requests (waiting for a free slot first).
  void Send(const SparseBatch& b, bool push) {
    const int slot = static_cast<int>(batches_++ % window_.slots());
    const uint32_t partitions = static_cast<uint32_t>(b.offsets.size() - 1);
    int n = 0;
    for (uint32_t p = 0; p < partitions; ++p) n += b.offsets[p + 1] > b.offsets[p];
    window_.Begin(slot, n);
    for (uint32_t p = 0; p < partitions; ++p) {
      const size_t off = b.offsets[p], keys = b.offsets[p + 1] - off;
      if (keys == 0) continue;
      Message m;
      m.header.flags = transport::kFlagSparse;
      m.header.partition = p;
      m.header.sender_id = kSenderId;
      auto done = [this, slot](absl::StatusOr<Message> r) { window_.End(slot, StatusOf(r)); };
      if (push) {
        m.header.type = MessageType::kPushRequest;
        m.header.seq = ++seq_;
        m.header.count = 1;
        // Keys then their gradient rows, built here and borrowed by the
        // transport until Call returns.
        scratch_.resize(keys * (sizeof(uint64_t) + sizeof(float) * dim_));
        std::memcpy(scratch_.data(), b.keys.data() + off, keys * sizeof(uint64_t));
        std::memcpy(scratch_.data() + keys * sizeof(uint64_t), grads_->data() + off * dim_,
                    keys * dim_ * sizeof(float));
        m.payload_ref = scratch_.data();
        m.payload_ref_size = scratch_.size();
        conn_->Call(std::move(m), std::move(done));
      } else {
        m.header.type = MessageType::kPullRequest;
        m.payload_ref = reinterpret_cast<const char*>(b.keys.data() + off);
        m.payload_ref_size = keys * sizeof(uint64_t);
        conn_->CallInto(std::move(m), reinterpret_cast<char*>(pulled_[slot].data() + off * dim_),
                        keys * dim_ * sizeof(float), std::move(done));
      }
    }
  }

  // Pushes `n` keys to partition `p` with zero gradients (creates their
  // rows and changes no value), as one request in its own slot.
  void SendFill(uint32_t p, const uint64_t* keys, size_t n) {
    const int slot = static_cast<int>(batches_++ % window_.slots());
    window_.Begin(slot, 1);
    Message m;
    m.header.type = MessageType::kPushRequest;
    m.header.flags = transport::kFlagSparse;
    m.header.partition = p;
    m.header.sender_id = kSenderId;
    m.header.seq = ++seq_;
    m.header.count = 1;
    m.payload.assign(n * (sizeof(uint64_t) + sizeof(float) * dim_), '\0');
    std::memcpy(m.payload.data(), keys, n * sizeof(uint64_t));
    conn_->Call(std::move(m),
                [this, slot](absl::StatusOr<Message> r) { window_.End(slot, StatusOf(r)); });
  }

  struct Rate {
    uint64_t keys = 0;  // unique keys answered
    double seconds = 0;
  };
  // Sends batches from `pool` (from *next on, cycling) for `seconds`, then
  // waits for every answer.
  absl::StatusOr<Rate> Run(const std::vector<SparseBatch>& pool, size_t* next, bool push,
                           double seconds) {
    Rate r;
    const absl::Time t0 = absl::Now();
    const absl::Time end = t0 + absl::Seconds(seconds);
    while (absl::Now() < end && window_.error().ok()) {
      const SparseBatch& b = pool[(*next)++ % pool.size()];
      Send(b, push);
      r.keys += b.keys.size();
    }
    STRATA_RETURN_IF_ERROR(window_.Drain());
    r.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    return r;
  }

  absl::Status Drain() { return window_.Drain(); }
  uint64_t NextSeq() { return ++seq_; }

 private:
  const std::shared_ptr<transport::Connection> conn_;
  const int dim_;
  const std::vector<float>* const grads_;
  BatchWindow window_;
  std::vector<std::vector<float>> pulled_;  // pull destinations, one per slot
  std::string scratch_;                     // the push being sent
  uint64_t batches_ = 0;
  uint64_t seq_ = 0;
};

int64_t CpuNanos(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The CPU time of the thread that runs the bench pserver's requests (the
// transport's), and the part of it spent in the handler (the partition's
// work and sending its answer). Thread-safe: that thread reports, any
// thread reads.
class ServerCpu {
 public:
  // The handler's part, measured by the handler around its work.
  static int64_t HandlerNow() { return CpuNanos(CLOCK_THREAD_CPUTIME_ID); }
  void AddHandler(int64_t nanos) {
    if (!has_clock_.load(std::memory_order_acquire)) {
      clockid_t id;
      if (pthread_getcpuclockid(pthread_self(), &id) == 0) {
        clock_.store(id);
        has_clock_.store(true, std::memory_order_release);
      }
    }
    handler_nanos_.fetch_add(nanos);
  }
  // The server thread's CPU time so far (0 before its first request).
  int64_t thread_nanos() const {
    return has_clock_.load(std::memory_order_acquire) ? CpuNanos(clock_.load()) : 0;
  }
  int64_t handler_nanos() const { return handler_nanos_.load(); }

 private:
  std::atomic<bool> has_clock_{false};
  std::atomic<clockid_t> clock_{0};
  std::atomic<int64_t> handler_nanos_{0};
};

// Keeps only whether the answer was OK: direct calls into a Partition,
// without a transport. Not thread-safe (used on the calling thread).
class DropResponder : public transport::Responder {
 public:
  explicit DropResponder(bool* failed) : failed_(failed) {}
  void Respond(Message m) override {
    if (m.header.status != 0) *failed_ = true;
  }
  std::string peer() const override { return "bench"; }

 private:
  bool* const failed_;  // the caller's, outlives the responder
};

// Keys done and the time they took.
struct Tally {
  uint64_t keys = 0;
  double seconds = 0;
  double rate() const { return seconds > 0 ? keys / seconds : 0; }
};

// Runs fn(batch) over `pool` (from *next on, cycling) for `seconds`.
template <typename Fn>
Tally RunBatches(const std::vector<SparseBatch>& pool, size_t* next, double seconds, Fn fn) {
  Tally t;
  const absl::Time t0 = absl::Now();
  const absl::Time end = t0 + absl::Seconds(seconds);
  while (absl::Now() < end) {
    const SparseBatch& b = pool[(*next)++ % pool.size()];
    fn(b);
    t.keys += b.keys.size();
  }
  t.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  return t;
}

uint64_t TrimmedRss() {
  malloc_trim(0);  // freed buffers (the fill's requests) do not count
  return ProcStatusBytes(getpid(), "VmRSS");
}

// Where the baseline's loops leave a result, so that they are not optimised away.
volatile float g_sink = 0;

// The plain loop a sparse table is compared with: one std::unordered_map
// from key to row, used from one thread. Not thread-safe.
class PlainMap {
 public:
  virtual ~PlainMap() = default;
  // For each key of the batch: find, copy the row out.
  virtual void Pull(const SparseBatch& b) = 0;
  // For each key of the batch: find, row -= lr * its gradient row.
  virtual void Push(const SparseBatch& b) = 0;
};

// Row: std::array<float, dim> or std::vector<float>.
template <typename Row>
class PlainMapImpl : public PlainMap {
 public:
  // `grads` (a row per key of a batch) is borrowed and must outlive this.
  PlainMapImpl(const std::vector<uint64_t>& keys, const SparseCase& c,
               const std::vector<float>* grads)
      : dim_(static_cast<size_t>(c.dim)),
        lr_(static_cast<float>(c.learning_rate)),
        grads_(grads),
        out_(c.batch_keys * dim_) {
    map_.reserve(keys.size());
    for (uint64_t k : keys) {
      if constexpr (std::is_same_v<Row, std::vector<float>>) {
        map_.emplace(k, Row(dim_, 0.f));
      } else {
        map_.emplace(k, Row{});
      }
    }
  }
  void Pull(const SparseBatch& b) override {
    float* o = out_.data();
    for (uint64_t k : b.keys) {
      auto it = map_.find(k);
      if (it != map_.end()) {
        std::memcpy(o, it->second.data(), dim_ * sizeof(float));
      } else {
        std::memset(o, 0, dim_ * sizeof(float));
      }
      o += dim_;
    }
    g_sink = out_[0];
  }
  void Push(const SparseBatch& b) override {
    const float* g = grads_->data();
    for (uint64_t k : b.keys) {
      auto it = map_.find(k);
      if (it != map_.end()) {
        float* row = it->second.data();
        for (size_t j = 0; j < dim_; ++j) row[j] -= lr_ * g[j];
      }
      g += dim_;
    }
  }

 private:
  const size_t dim_;
  const float lr_;
  const std::vector<float>* const grads_;
  std::unordered_map<uint64_t, Row> map_;
  std::vector<float> out_;
};

std::unique_ptr<PlainMap> NewPlainMap(const std::vector<uint64_t>& keys, const SparseCase& c,
                                      const std::vector<float>* grads) {
  switch (c.dim) {
    case 8:
      return std::make_unique<PlainMapImpl<std::array<float, 8>>>(keys, c, grads);
    case 16:
      return std::make_unique<PlainMapImpl<std::array<float, 16>>>(keys, c, grads);
    case 32:
      return std::make_unique<PlainMapImpl<std::array<float, 32>>>(keys, c, grads);
    case 64:
      return std::make_unique<PlainMapImpl<std::array<float, 64>>>(keys, c, grads);
    default:
      return std::make_unique<PlainMapImpl<std::vector<float>>>(keys, c, grads);
  }
}

}  // namespace

absl::StatusOr<SparseResult> RunSparse(const SparseCase& c) {
  if (c.rows < 1 || c.partitions < 1 || c.dim < 1 || c.batch_keys < 1 || !(c.zipf_s > 0) ||
      c.in_flight < 1 || c.pool_batches < 1 || !(c.seconds > 0)) {
    return absl::InvalidArgumentError(
        "sparse bench: rows, partitions, dim, batch keys, in-flight batches, pool batches, "
        "seconds and the Zipf exponent must be > 0");
  }
  const uint32_t partitions = static_cast<uint32_t>(c.partitions);
  SparseResult r;
  r.c = c;

  // Everything drawn up front, before the memory baseline: the batches,
  // every key grouped by partition (the fill's order), the gradient rows.
  const std::vector<SparseBatch> pool = DrawBatches(c);
  for (const auto& b : pool) r.unique_keys_per_batch += b.keys.size();
  r.unique_keys_per_batch /= pool.size();
  std::vector<uint64_t> all_keys;
  std::vector<uint32_t> fill_offsets;
  {
    std::vector<uint64_t> keys(c.rows);
    for (uint64_t i = 0; i < c.rows; ++i) keys[i] = KeyOfRank(i);
    GroupByPartition(keys, partitions, &all_keys, &fill_offsets);
  }
  std::vector<float> grads(c.batch_keys * static_cast<size_t>(c.dim));
  {
    std::mt19937_64 rng(c.seed + 1);
    std::uniform_real_distribution<float> small(-1e-3f, 1e-3f);
    for (float& g : grads) g = small(rng);
  }

  // The pserver: sparse partitions behind one transport, whose thread runs
  // every request (no apply threads).
  RowOptimizerSection oc;
  oc.type = "sgd";
  oc.learning_rate = c.learning_rate;
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<const RowOptimizer> optimizer, RowOptimizer::Create(oc));
  STRATA_ASSIGN_OR_RETURN(const RowInitializer init,
                          RowInitializer::Create("normal", 0.01, /*table_id=*/0, c.seed));
  std::vector<std::unique_ptr<pserver::Partition>> parts;
  // Borrowed from `parts` (which own them); used only while no request is
  // in flight.
  std::vector<pserver::SparseTable*> tables;
  for (uint32_t p = 0; p < partitions; ++p) {
    pserver::SparseTableOptions to;
    to.dim = c.dim;
    to.optimizer = optimizer;
    to.initializer = &init;
    to.seed = c.seed + p;
    STRATA_ASSIGN_OR_RETURN(auto table, pserver::SparseTable::Create(to));
    tables.push_back(table.get());
    parts.push_back(std::make_unique<pserver::Partition>(p, "bench_sparse", std::move(table),
                                                         Consistency::kAsp));
  }
  r.stated_bytes_per_row = static_cast<double>(tables[0]->stated_bytes_per_row());

  transport::TransportOptions topts;
  topts.kind = c.transport;
  topts.inproc_network = transport::NewInProcNetwork();
  STRATA_ASSIGN_OR_RETURN(auto server, transport::CreateTransport(topts));
  absl::Cleanup stop_server = [&server] { server->Shutdown(); };
  ServerCpu server_cpu;
  STRATA_RETURN_IF_ERROR(server->Listen(
      "127.0.0.1", 0,
      [&parts, &server_cpu](Message req, std::shared_ptr<transport::Responder> responder) {
        const int64_t t0 = ServerCpu::HandlerNow();
        absl::Cleanup account = [&server_cpu, t0] {
          server_cpu.AddHandler(ServerCpu::HandlerNow() - t0);
        };
        const auto& h = req.header;
        if (h.partition >= parts.size() ||
            (h.type != MessageType::kPullRequest && h.type != MessageType::kPushRequest)) {
          responder->Respond(transport::MakeErrorResponse(
              h, transport::ResponseTypeFor(h.type),
              absl::InvalidArgumentError(
                  absl::StrCat("no partition ", h.partition, " or not a pull/push"))));
          return;
        }
        pserver::Partition& part = *parts[h.partition];
        if (h.type == MessageType::kPullRequest) {
          part.Pull(req, std::move(responder));
        } else {
          part.Push(req, std::move(responder));
        }
      }));
  STRATA_ASSIGN_OR_RETURN(auto client_transport, transport::CreateTransport(topts));
  absl::Cleanup stop_client = [&client_transport] { client_transport->Shutdown(); };
  STRATA_ASSIGN_OR_RETURN(auto conn, client_transport->Connect(server->listen_address()));
  auto client = std::make_unique<SparseClient>(conn, c, &grads);

  // Fill: every key pushed once, 8192 keys a request.
  const uint64_t rss_before = TrimmedRss();
  {
    constexpr size_t kFillKeys = 8192;
    const absl::Time t0 = absl::Now();
    for (uint32_t p = 0; p < partitions; ++p) {
      for (size_t i = fill_offsets[p]; i < fill_offsets[p + 1]; i += kFillKeys) {
        client->SendFill(p, all_keys.data() + i,
                         std::min<size_t>(kFillKeys, fill_offsets[p + 1] - i));
      }
    }
    STRATA_RETURN_IF_ERROR(client->Drain());
    r.fill_keys_per_sec = c.rows / absl::ToDoubleSeconds(absl::Now() - t0);
  }
  const uint64_t rss_after = TrimmedRss();
  auto count_rows = [&](uint64_t* memory_bytes) {
    uint64_t rows = 0;
    for (const auto& p : parts) {
      const pserver::SparseTableStats s = p->sparse_stats();
      rows += s.rows;
      if (memory_bytes != nullptr) *memory_bytes += s.memory_bytes;
    }
    return rows;
  };
  uint64_t allocated = 0;
  r.rows = count_rows(&allocated);
  if (r.rows != c.rows) {
    return absl::InternalError(
        absl::StrCat("sparse bench: the fill made ", r.rows, " rows of ", c.rows, " keys"));
  }
  r.bytes_per_row_rss = static_cast<double>(rss_after - rss_before) / r.rows;
  r.bytes_per_row_allocated = static_cast<double>(allocated) / r.rows;

  // The baseline map, after the fill so that the fill's growth is the
  // table's alone.
  std::unique_ptr<PlainMap> plain;
  {
    const uint64_t rss0 = TrimmedRss();
    plain = NewPlainMap(all_keys, c, &grads);
    r.baseline_bytes_per_row_rss = static_cast<double>(TrimmedRss() - rss0) / c.rows;
  }

  // Four ways over the same batches, in alternating rounds so that each
  // sees the same machine (a shared one's speed drifts by 2x over
  // seconds): through the transport; the plain map; the table alone and
  // through its partition on this thread (those two only while nothing is
  // in flight).
  bool failed = false;
  std::string push_payload;
  auto direct = [&](const SparseBatch& b, bool push) {
    for (uint32_t p = 0; p < partitions; ++p) {
      const size_t off = b.offsets[p], keys = b.offsets[p + 1] - off;
      if (keys == 0) continue;
      Message m;
      m.header.type = push ? MessageType::kPushRequest : MessageType::kPullRequest;
      m.header.flags = transport::kFlagSparse;
      m.header.partition = p;
      m.header.sender_id = SparseClient::kSenderId;
      if (push) {
        m.header.seq = client->NextSeq();
        m.header.count = 1;
        push_payload.resize(keys * (sizeof(uint64_t) + sizeof(float) * c.dim));
        std::memcpy(push_payload.data(), b.keys.data() + off, keys * sizeof(uint64_t));
        std::memcpy(push_payload.data() + keys * sizeof(uint64_t), grads.data() + off * c.dim,
                    keys * c.dim * sizeof(float));
        m.payload_ref = push_payload.data();
        m.payload_ref_size = push_payload.size();
        parts[p]->Push(m, std::make_shared<DropResponder>(&failed));
      } else {
        m.payload_ref = reinterpret_cast<const char*>(b.keys.data() + off);
        m.payload_ref_size = keys * sizeof(uint64_t);
        parts[p]->Pull(m, std::make_shared<DropResponder>(&failed));
      }
    }
  };
  std::vector<float> out(c.batch_keys * static_cast<size_t>(c.dim));
  auto table = [&](const SparseBatch& b, bool push) {
    for (uint32_t p = 0; p < partitions; ++p) {
      const size_t off = b.offsets[p], keys = b.offsets[p + 1] - off;
      if (push) {
        tables[p]->Update(b.keys.data() + off, keys, grads.data() + off * c.dim, 1.0f);
      } else {
        tables[p]->Lookup(b.keys.data() + off, keys, out.data() + off * c.dim);
      }
    }
  };
  constexpr double kRoundSeconds = 0.25;
  const int rounds = std::max(1, static_cast<int>(std::lround(c.seconds / kRoundSeconds)));
  const double slice = c.seconds / rounds;
  for (SparseOpResult* o : {&r.pull, &r.push}) {
    const bool push = o == &r.push;
    o->op = push ? "push" : "pull";
    o->rounds = rounds;
    size_t next_transport = 0, next_plain = 0, next_table = 0, next_partition = 0;
    auto plain_op = [&](const SparseBatch& b) { push ? plain->Push(b) : plain->Pull(b); };
    auto table_op = [&](const SparseBatch& b) { table(b, push); };
    auto partition_op = [&](const SparseBatch& b) { direct(b, push); };
    // Warm-up (connections, caches, the pages of the output buffers).
    const double warm = std::min(0.5, c.seconds) / 4;
    STRATA_RETURN_IF_ERROR(client->Run(pool, &next_transport, push, warm).status());
    RunBatches(pool, &next_plain, warm, plain_op);
    RunBatches(pool, &next_table, warm, table_op);
    RunBatches(pool, &next_partition, warm, partition_op);
    Tally via_transport, via_plain, via_table, via_partition;
    int64_t cpu = 0, handler = 0;
    o->ratio_min = 1e30;
    o->ratio_max = 0;
    for (int i = 0; i < rounds; ++i) {
      const int64_t cpu0 = server_cpu.thread_nanos(), handler0 = server_cpu.handler_nanos();
      STRATA_ASSIGN_OR_RETURN(const SparseClient::Rate rate,
                              client->Run(pool, &next_transport, push, slice));
      cpu += server_cpu.thread_nanos() - cpu0;
      handler += server_cpu.handler_nanos() - handler0;
      via_transport.keys += rate.keys;
      via_transport.seconds += rate.seconds;
      const Tally p = RunBatches(pool, &next_plain, slice, plain_op);
      via_plain.keys += p.keys;
      via_plain.seconds += p.seconds;
      const double ratio = (rate.keys / rate.seconds) / p.rate();
      o->ratio_min = std::min(o->ratio_min, ratio);
      o->ratio_max = std::max(o->ratio_max, ratio);
      const Tally t = RunBatches(pool, &next_table, slice, table_op);
      via_table.keys += t.keys;
      via_table.seconds += t.seconds;
      const Tally d = RunBatches(pool, &next_partition, slice, partition_op);
      via_partition.keys += d.keys;
      via_partition.seconds += d.seconds;
    }
    o->keys_per_sec = via_transport.rate();
    o->baseline_keys_per_sec = via_plain.rate();
    o->table_keys_per_sec = via_table.rate();
    o->partition_keys_per_sec = via_partition.rate();
    o->keys_per_server_cpu_sec = cpu > 0 ? via_transport.keys / (cpu * 1e-9) : 0;
    o->server_busy = cpu * 1e-9 / via_transport.seconds;
    o->handler_share = cpu > 0 ? static_cast<double>(handler) / cpu : 0;
  }
  if (failed) return absl::InternalError("sparse bench: a direct partition call failed");
  // Every key pushed was found: no row was added.
  if (const uint64_t rows = count_rows(nullptr); rows != c.rows) {
    return absl::InternalError(
        absl::StrCat("sparse bench: ", rows - c.rows, " rows appeared after the fill"));
  }
  return r;
}

absl::StatusOr<EncryptionResult> RunEncryption(uint64_t bytes, double seconds) {
  EncryptionResult r;
  r.bytes = bytes;
  const std::string secret = transport::RandomBytes(32);
  const std::string payload(bytes, 'p');
  for (const bool sealed : {false, true}) {
    transport::TransportOptions server_options, client_options;
    server_options.kind = client_options.kind = "tcp";
    if (sealed) {
      auto server_keys = std::make_shared<transport::MembershipKeys>();
      server_keys->Update(1, 1, transport::DeriveNodeKey(secret, 1), secret);
      auto client_keys = std::make_shared<transport::MembershipKeys>();
      client_keys->Update(2, 1, transport::DeriveNodeKey(secret, 2), "");
      server_options.membership = server_keys;
      client_options.membership = client_keys;
      server_options.encrypt_data_plane = client_options.encrypt_data_plane = true;
    }
    STRATA_ASSIGN_OR_RETURN(auto server, transport::CreateTransport(server_options));
    STRATA_ASSIGN_OR_RETURN(auto client, transport::CreateTransport(client_options));
    STRATA_RETURN_IF_ERROR(server->Listen(
        "127.0.0.1", 0, [](transport::Message req, std::shared_ptr<transport::Responder> resp) {
          transport::Message ack;
          ack.header.type = transport::ResponseTypeFor(req.header.type);
          resp->Respond(std::move(ack));
        }));
    STRATA_ASSIGN_OR_RETURN(auto conn, client->Connect(server->listen_address()));
    std::vector<double> lat;
    const absl::Time t0 = absl::Now();
    const absl::Time end = t0 + absl::Seconds(seconds);
    while (lat.size() < 5 || absl::Now() < end) {
      transport::Message m;
      m.header.type = transport::MessageType::kPushRequest;
      m.header.sender_id = 2;  // (the node the sealed connection belongs to)
      m.payload_ref = payload.data();
      m.payload_ref_size = payload.size();
      const absl::Time s = absl::Now();
      STRATA_RETURN_IF_ERROR(conn->CallSync(std::move(m), absl::Seconds(60)).status());
      lat.push_back(absl::ToDoubleMicroseconds(absl::Now() - s));
    }
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    const double gbps = static_cast<double>(lat.size() * bytes) / secs / 1e9;
    const double p50 = Percentiles(std::move(lat)).p50_us;
    (sealed ? r.sealed_gbps : r.plain_gbps) = gbps;
    (sealed ? r.sealed_p50_us : r.plain_p50_us) = p50;
    conn.reset();
    client->Shutdown();
    server->Shutdown();
  }
  return r;
}

}  // namespace strata::bench
