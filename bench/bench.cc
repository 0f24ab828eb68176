#include "bench/bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "master/master_server.h"
#include "proto/strata.grpc.pb.h"
#include "common/optimizer.h"
#include "pserver/pserver.h"
#include "storage/file_system.h"
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
    proto::ClusterView v;
    STRATA_RETURN_IF_ERROR(
        FromGrpcStatus(stub->GetClusterView(&ctx, proto::GetClusterViewRequest(), &v)));
    return v;
  };
}

// The master reads the training-set size from a labels file: one record.
absl::Status WriteBenchLabels(storage::FileSystem* fs) {
  return fs->WriteFileAtomic("/labels", std::string("\0\0\x08\x01\0\0\0\x01\x00", 9));
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
  bc->stub = proto::Master::NewStub(grpc::CreateChannel(master, grpc::InsecureChannelCredentials()));
  auto fetch_view = ViewFetcher(bc->stub.get());
  for (int i = 0; i < n; ++i) {
    proto::RegisterRequest req;
    req.set_role(proto::WORKER);
    req.set_index(i);
    req.set_host("127.0.0.1");
    proto::RegisterResponse resp;
    grpc::ClientContext ctx;
    STRATA_RETURN_IF_ERROR(FromGrpcStatus(bc->stub->Register(&ctx, req, &resp)));
    STRATA_ASSIGN_OR_RETURN(auto t, transport::CreateTransport(topts));
    bc->clients.push_back(std::make_unique<worker::ParamClient>(t.get(), resp.node_id(),
                                                                fetch_view, request_timeout));
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
  STRATA_ASSIGN_OR_RETURN(auto bc, ConnectClients(addr, 1, transport::TransportOptions(),
                                                  absl::Seconds(120)));
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
  const JobConfig config = BenchConfig(c.bytes, "sgd", c.slice_bytes);

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
    STRATA_ASSIGN_OR_RETURN(auto ps, pserver::PServer::Create(po));
    STRATA_RETURN_IF_ERROR(ps->Start());
    servers.push_back(std::move(ps));
  }

  STRATA_ASSIGN_OR_RETURN(
      auto bc, ConnectClients(master->address(), c.workers, topts,
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
      STRATA_RETURN_IF_ERROR(bc->transports[i]->RegisterMemory(
          grads[i][0].data(), grads[i][0].size() * sizeof(float),
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
            t.data(), t.size() * sizeof(float), transport::Transport::MemoryUse::kReceiveDestination));
      }
    }
  }
  std::atomic<int> go{0};
  const absl::Time t0 = absl::Now();
  const absl::Time end = t0 + absl::Seconds(c.seconds);
  std::vector<std::thread> threads;
  for (int i = 0; i < c.workers; ++i) {
    threads.emplace_back([&, i] {
      while (ops[i] < 5 || absl::Now() < end) {
        const absl::Time s = absl::Now();
        if (push && pull) {  // each slice's pull right behind its push
          auto r = clients[i]->PushThenPull(grads[i], 0, 1, 0, &params[i]);
          if (!r.ok()) { errors[i] = r.status(); return; }
        } else if (push) {
          auto r = clients[i]->PushAll(grads[i], 0, 1);
          if (!r.ok()) { errors[i] = r.status(); return; }
        } else {
          auto r = clients[i]->PullAll(0, &params[i]);
          if (!r.ok()) { errors[i] = r.status(); return; }
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
__attribute__((noinline, target_clones("avx2", "default"))) void Stream(float* __restrict p, const float* __restrict g,
                                      float* __restrict m, float* __restrict v,
                                      size_t n, int arrays) {
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

absl::StatusOr<ApplyResult> RunApply(const std::string& optimizer, uint64_t floats,
                                     int threads) {
  OptimizerSection oc;
  oc.type = optimizer;
  oc.learning_rate = 1e-6;
  threads = std::max(1, threads);
  const uint64_t per = (floats + threads - 1) / threads;
  std::vector<std::unique_ptr<Optimizer>> opts;
  for (int t = 0; t < threads; ++t) {
    STRATA_ASSIGN_OR_RETURN(auto o, Optimizer::Create(
                                        oc, std::min<uint64_t>(per, floats - std::min(floats, t * per))));
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
    Stream(p.data() + b, g.data() + b, m.data() + b, v.data() + b, e - b,
           arrays == 2 ? 2 : 4);
  });
  ApplyResult r;
  r.optimizer = optimizer;
  r.floats = floats;
  r.gbps = floats * 4.0 / t_opt / 1e9;
  r.baseline_gbps = floats * 4.0 / t_base / 1e9;
  return r;
}

}  // namespace strata::bench
