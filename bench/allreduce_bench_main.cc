// Strata's ring allreduce (transport/ring_allreduce.h) timed among W
// processes on this host over TCP (127.0.0.1), one thread of work each:
// the Strata side of bench/allreduce_bench.sh, which runs PyTorch's gloo
// allreduce (bench/gloo_allreduce.py) the same way beside it.
//
//   strata-allreduce-bench --ranks 4 --sizes 4K,64K,1M,16M,64M --iters 20
//
// Forks the ranks; each listens on a port of its own, connects to the next,
// and times `iters` allreduces of each size after `warmup` untimed ones
// (a barrier, an allreduce of one float, before each size). Prints one
// JSON line per size from rank 0: bytes, the median seconds per
// allreduce, and the bus bandwidth (2 (W - 1) / W x bytes / seconds).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gflags/gflags.h"
#include "transport/ring_allreduce.h"
#include "transport/transport.h"

DEFINE_int32(ranks, 4, "processes in the ring");
DEFINE_string(sizes, "4K,64K,256K,1M,4M,16M,64M", "buffer sizes (K, M suffixes: KiB, MiB)");
DEFINE_int32(iters, 20, "timed allreduces per size");
DEFINE_int32(warmup, 3, "untimed allreduces per size first");
DEFINE_int32(port_base, 0, "rank r listens on port_base + r (0: a free range from the pid)");
DEFINE_int32(chunk_kib, 256, "the ring's least chunk (RingAllreduce::Options::chunk_bytes), KiB");
DEFINE_int32(max_chunks, 8,
             "the most chunks of a segment (RingAllreduce::Options::max_chunks; 0: no bound)");

namespace strata {
namespace {

bool ParseSize(absl::string_view s, size_t* bytes) {
  size_t mult = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'M')) {
    mult = s.back() == 'K' ? 1024 : 1024 * 1024;
    s.remove_suffix(1);
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(s, &v) || v == 0) return false;
  *bytes = v * mult;
  return true;
}

int RunRank(int rank, int ranks, int port_base, const std::vector<size_t>& sizes) {
  transport::TransportOptions to;
  to.kind = "tcp";
  to.lend_request_payloads = true;  // chunks reduced from the connection's buffer
  auto t = transport::CreateTransport(to);
  if (!t.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, t.status().ToString().c_str());
    return 1;
  }
  transport::RingAllreduce::Options o;
  o.rank = rank;
  o.size = ranks;
  o.node_id = rank + 1;
  o.chunk_bytes = static_cast<size_t>(FLAGS_chunk_kib) << 10;
  o.max_chunks = static_cast<uint32_t>(FLAGS_max_chunks);
  auto ring = transport::RingAllreduce::Create(t->get(), o);
  if (!ring.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, ring.status().ToString().c_str());
    return 1;
  }
  transport::RingAllreduce* r = ring->get();
  // The transport stops before the ring goes (its listener calls the ring).
  absl::Cleanup stop = [&t] { (*t)->Shutdown(); };
  absl::Status s = (*t)->Listen("127.0.0.1", port_base + rank,
                                [r](transport::Message m, std::shared_ptr<transport::Responder> d) {
                                  r->Handle(std::move(m), std::move(d));
                                });
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  const std::string next = absl::StrCat("127.0.0.1:", port_base + (rank + 1) % ranks);
  for (int i = 0; i < 200; ++i) {  // (the next rank may not listen yet)
    s = r->ConnectNext(next);
    if (s.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  uint64_t op = 1;
  float one = 1;
  for (size_t bytes : sizes) {
    std::vector<float> buf(bytes / sizeof(float), 1.0f + rank);
    std::vector<double> times;
    s = r->Allreduce(&one, 1, op++);  // a barrier
    for (int i = 0; s.ok() && i < FLAGS_warmup + FLAGS_iters; ++i) {
      const absl::Time t0 = absl::Now();
      s = r->Allreduce(buf.data(), buf.size(), op++);
      if (i >= FLAGS_warmup) times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    }
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      return 1;
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    if (rank == 0) {
      std::printf(
          "{\"impl\": \"strata\", \"ranks\": %d, \"bytes\": %zu, \"seconds\": %.9f, "
          "\"bus_gb_per_s\": %.4f}\n",
          ranks, bytes, median, 2.0 * (ranks - 1) / ranks * bytes / median / 1e9);
      std::fflush(stdout);
    }
  }
  // (The previous rank may still wait for this one's last acknowledgements.)
  absl::SleepFor(absl::Milliseconds(300));
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  gflags::SetUsageMessage("strata-allreduce-bench --ranks W --sizes 4K,1M,64M --iters N");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(FLAGS_sizes, ',', absl::SkipEmpty())) {
    size_t bytes = 0;
    if (!strata::ParseSize(s, &bytes) || bytes % 4 != 0) {
      std::fprintf(stderr, "strata-allreduce-bench: --sizes: '%s' is not a size of floats\n",
                   std::string(s).c_str());
      return 2;
    }
    sizes.push_back(bytes);
  }
  if (FLAGS_ranks < 2 || FLAGS_iters < 1) {
    std::fprintf(stderr, "strata-allreduce-bench: --ranks >= 2 and --iters >= 1\n");
    return 2;
  }
  const int port_base = FLAGS_port_base > 0 ? FLAGS_port_base : 20000 + (getpid() % 2000) * 16;
  std::vector<pid_t> children;
  for (int r = 0; r < FLAGS_ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(strata::RunRank(r, FLAGS_ranks, port_base, sizes));
    children.push_back(pid);
  }
  int rc = 0;
  for (size_t r = 0; r < children.size(); ++r) {
    int st = 0;
    waitpid(children[r], &st, 0);
    if (WIFSIGNALED(st)) {
      std::fprintf(stderr, "strata-allreduce-bench: rank %zu killed by signal %d\n", r,
                   WTERMSIG(st));
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
