// strata-bench: data-plane and server-side apply benchmarks, each reported
// as a ratio to a baseline measured in the same run (raw TCP over
// 127.0.0.1; a plain streaming loop over the same memory).
#ifndef STRATA_BENCH_BENCH_H_
#define STRATA_BENCH_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::bench {

struct Latency {
  double p50_us = 0;
  double p99_us = 0;
};

// Raw single-stream TCP over 127.0.0.1: the best GB/s of sending `total`
// bytes with writes of 128 KiB, 1 MiB and 16 MiB.
absl::StatusOr<double> RawTcpThroughputGbps(uint64_t total_bytes);
// Raw TCP ping-pong of `bytes` each way (one round trip per sample).
absl::StatusOr<Latency> RawTcpPingPong(uint64_t bytes, double seconds);

struct PushPullCase {
  std::string mode;  // push | pull | pushpull
  uint64_t bytes = 0;
  int workers = 1;
  int servers = 1;
  std::string transport = "tcp";
  int64_t slice_bytes = 4 << 20;
  int64_t chunk_bytes = 1 << 20;  // cluster.chunk_bytes (0: whole partitions)
  double seconds = 1.0;           // measuring time per case (at least 5 operations)
  int apply_threads = 1;          // PServerOptions::apply_threads
  int rdma_slot_kib = 64;         // cluster.rdma.slot_kib (transport rdma/auto)
  int rdma_busy_poll_us = 50;     // cluster.rdma.busy_poll_us
  // Register the client's gradient and parameter tensors with the transport,
  // as a worker does (rdma: zero-copy pushes, pulls written in place).
  bool register_tensors = true;
};

struct PushPullResult {
  PushPullCase c;
  double gbps = 0;  // payload bytes over the wire per second
  Latency latency;  // per operation (pushpull: push then pull)
  uint64_t operations = 0;
};

// Starts a master, `servers` pservers and `workers` clients in this process
// (threads; real gRPC and the chosen data-plane transport over 127.0.0.1)
// holding one dense table of c.bytes, and measures c.mode.
absl::StatusOr<PushPullResult> RunPushPull(const PushPullCase& c);

struct ApplyResult {
  std::string optimizer;  // sgd | adam
  uint64_t floats = 0;
  double gbps = 0;           // gradient bytes applied per second
  double baseline_gbps = 0;  // a plain loop over the same arrays, same bytes
};

// Server-side apply over `floats` parameters, as a pserver partition does it
// (sum of gradients scaled by 1/count, optimizer step), against a streaming
// loop that reads and writes the same arrays.
absl::StatusOr<ApplyResult> RunApply(const std::string& optimizer, uint64_t floats, int threads);

struct EncryptionResult {
  uint64_t bytes = 0;      // payload of each request
  double plain_gbps = 0;   // tcp transport, no handshake, frames in the clear
  double sealed_gbps = 0;  // membership handshake, every frame AES-256-GCM sealed
  double plain_p50_us = 0;
  double sealed_p50_us = 0;
};

// The cost of security.encrypt_data_plane: requests of `bytes` (answered
// empty, as pushes are) over one tcp connection on 127.0.0.1, for
// `seconds` each way, in the clear and sealed (transport/data_plane_auth.h).
absl::StatusOr<EncryptionResult> RunEncryption(uint64_t bytes, double seconds);

struct MemoryResult {
  uint64_t model_bytes = 0;
  uint64_t state_bytes = 0;     // optimizer state
  uint64_t rss_bytes = 0;       // pserver resident set after push and pull
  uint64_t peak_rss_bytes = 0;  // VmHWM
  double bound_bytes = 0;       // 1.3 x (model + state) + 64 MiB
};

// Forks a pserver process (before this process has any thread), starts a
// master and one client here, pushes and pulls a dense table of
// `model_bytes` with `optimizer` (asp), and reads the pserver's resident
// set from /proc. REQUIRES: no thread has been started in this process.
absl::StatusOr<MemoryResult> RunMemory(uint64_t model_bytes, const std::string& optimizer);

struct SparseCase {
  uint64_t rows = 10'000'000;  // keys filled before measuring (every row exists)
  int partitions = 16;         // sparse Partitions behind the one transport thread
  int dim = 16;                // floats per row
  uint64_t batch_keys = 8192;  // Zipf draws per batch, before de-duplication
  double zipf_s = 1.05;        // Zipf exponent over the key ranks
  double seconds = 3.0;        // measuring time per op (after a warm-up)
  int in_flight = 4;           // batches in flight (each one request per partition)
  int pool_batches = 512;      // batches drawn up front and cycled through
  std::string transport = "tcp";
  double learning_rate = 0.01;  // sgd
  uint64_t seed = 1;
};

// The four ways over the same batches run in alternating rounds (each
// c.seconds in all), so that a shared machine's drift hits them alike.
struct SparseOpResult {
  std::string op;  // pull | push
  int rounds = 0;
  double keys_per_sec = 0;           // through the transport to the partitions
  double baseline_keys_per_sec = 0;  // the plain hash-map loop, same batches
  // keys_per_sec / baseline_keys_per_sec within each round: the noise.
  double ratio_min = 0, ratio_max = 0;
  // Without the transport, on the bench's thread while nothing is in
  // flight: the tables alone (SparseTable::Lookup / Update) and through
  // their Partitions (Pull / Push; a responder that drops the answer).
  double table_keys_per_sec = 0;
  double partition_keys_per_sec = 0;
  // The pserver thread's side: keys per second of its CPU time (user and
  // system), the share of the wall time it was on a core, and the share of
  // its CPU time spent in the request handler (the partition's work and
  // sending the answer; the rest is epoll and reading the requests).
  double keys_per_server_cpu_sec = 0;
  double server_busy = 0;
  double handler_share = 0;
};

struct SparseResult {
  SparseCase c;
  double unique_keys_per_batch = 0;  // mean over the pool
  double fill_keys_per_sec = 0;      // the fill's pushes (every row created)
  SparseOpResult pull, push;
  // Memory: VmRSS growth during the fill / rows; the partitions'
  // SparseTableStats::memory_bytes / rows; SparseTable::stated_bytes_per_row.
  uint64_t rows = 0;
  double bytes_per_row_rss = 0;
  double bytes_per_row_allocated = 0;
  double stated_bytes_per_row = 0;
  double baseline_bytes_per_row_rss = 0;  // VmRSS growth building the baseline map
};

// One pserver's sparse table in this process: a transport listening (its
// own thread does all the pserver work) in front of c.partitions sparse
// Partitions (asp, sgd, init normal 0.01, admission at first touch, no
// eviction), filled with c.rows keys by pushes through the transport; then
// pull and push rates (unique keys/s) of Zipf batches, de-duplicated and
// grouped by partition as a worker sends them, against a single-threaded
// std::unordered_map loop over the same keys and batches. Needs about
// 200 bytes of memory per row (table and baseline map).
absl::StatusOr<SparseResult> RunSparse(const SparseCase& c);

}  // namespace strata::bench

#endif  // STRATA_BENCH_BENCH_H_
