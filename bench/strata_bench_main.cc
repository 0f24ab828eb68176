// strata-bench: push/pull throughput and latency, server-side apply speed
// and a sparse table's pull/push rates, each against a baseline measured in
// the same run. See bench/bench.h and docs/performance.md.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench.h"
#include "common/vector_ops.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_string(mode, "all",
              "all | push | pull | pushpull | apply | memory (comma list allowed); or sparse, "
              "alone (not part of all: about 2 GB and a minute at the default 10M rows); or "
              "encryption, alone: the sealed tcp data plane against plain tcp");
DEFINE_int64(memory_model_bytes, 1ll << 30, "model size for --mode memory");
DEFINE_string(sizes, "4K,64K,1M,16M,64M", "value sizes (K, M suffixes)");
DEFINE_int32(workers, 1, "workers (client threads, each with its own transport)");
DEFINE_int32(servers, 1, "pservers (in this process)");
DEFINE_string(transport, "tcp", "tcp | rdma | auto | inproc");
DEFINE_int64(slice_bytes, 4 << 20, "partition size");
DEFINE_int64(chunk_bytes, 1 << 20, "cluster.chunk_bytes: the grain inside a partition (0: whole)");
DEFINE_double(seconds, 1.0, "measuring time per case (sparse: per op and way, default 3)");
DEFINE_int32(pserver_apply_threads, 1,
             "pserver apply threads (1 = transport thread, 0 = one per core)");
DEFINE_int64(apply_floats, 64ll << 20, "parameters for --mode apply");
DEFINE_int32(apply_threads, 0, "threads for apply (0 = hardware threads)");
DEFINE_int32(rdma_slot_kib, 64, "rdma: bytes per send/receive slot / 1024 (cluster.rdma.slot_kib)");
DEFINE_int32(rdma_busy_poll_us, 50,
             "rdma: busy polling after a completion (cluster.rdma.busy_poll_us)");
DEFINE_bool(register_tensors, true,
            "register the client's tensors as a worker does (rdma: zero-copy pushes, pulls "
            "written in place; false: both copied through the slots)");
DEFINE_bool(json, false, "print one JSON object instead of a table");
DEFINE_int64(sparse_rows, 10000000, "sparse: rows filled (keys = a mix of ranks 0..rows-1)");
DEFINE_int32(sparse_partitions, 16, "sparse: partitions behind the one transport thread");
DEFINE_int32(sparse_dim, 16, "sparse: floats per row");
DEFINE_int64(sparse_batch_keys, 8192, "sparse: Zipf draws per batch (before de-duplication)");
DEFINE_double(sparse_zipf, 1.05, "sparse: Zipf exponent over the key ranks");
DEFINE_int32(sparse_in_flight, 4, "sparse: batches in flight");
DEFINE_int32(sparse_pool_batches, 512, "sparse: batches drawn up front and cycled through");

namespace {

uint64_t ParseSize(const std::string& s) {
  uint64_t mult = 1;
  std::string num = s;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) mult = 1024, num.pop_back();
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) mult = 1024 * 1024, num.pop_back();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(num, &v) || v == 0) {
    std::cerr << "strata-bench: bad size '" << s << "'\n";
    exit(2);
  }
  return v * mult;
}

std::string Human(uint64_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return absl::StrCat(b >> 20, " MiB");
  if (b >= 1024 && b % 1024 == 0) return absl::StrCat(b >> 10, " KiB");
  return absl::StrCat(b, " B");
}

// --mode sparse: runs it and prints a table or one JSON object.
int RunSparseMode() {
  strata::bench::SparseCase c;
  c.rows = static_cast<uint64_t>(std::max<int64_t>(0, FLAGS_sparse_rows));
  c.partitions = FLAGS_sparse_partitions;
  c.dim = FLAGS_sparse_dim;
  c.batch_keys = static_cast<uint64_t>(std::max<int64_t>(0, FLAGS_sparse_batch_keys));
  c.zipf_s = FLAGS_sparse_zipf;
  c.in_flight = FLAGS_sparse_in_flight;
  c.pool_batches = FLAGS_sparse_pool_batches;
  c.transport = FLAGS_transport;
  if (!gflags::GetCommandLineFlagInfoOrDie("seconds").is_default) c.seconds = FLAGS_seconds;
  auto r = strata::bench::RunSparse(c);
  if (!r.ok()) {
    std::cerr << "sparse failed: " << r.status() << "\n";
    return 1;
  }
  const double mem_ratio = r->bytes_per_row_rss / r->stated_bytes_per_row;
  if (FLAGS_json) {
    std::string ops;
    for (const auto* o : {&r->pull, &r->push}) {
      if (!ops.empty()) ops += ", ";
      ops += absl::StrFormat(
          "{\"op\": \"%s\", \"keys_per_sec\": %.0f, \"baseline_keys_per_sec\": %.0f, "
          "\"ratio\": %.4f, \"keys_per_server_cpu_sec\": %.0f, \"ratio_per_core\": %.4f, "
          "\"server_busy\": %.3f, \"handler_share\": %.3f, \"ratio_min\": %.4f, "
          "\"ratio_max\": %.4f, \"rounds\": %d, \"table_keys_per_sec\": %.0f, "
          "\"partition_keys_per_sec\": %.0f}",
          o->op, o->keys_per_sec, o->baseline_keys_per_sec,
          o->keys_per_sec / o->baseline_keys_per_sec, o->keys_per_server_cpu_sec,
          o->keys_per_server_cpu_sec / o->baseline_keys_per_sec, o->server_busy, o->handler_share,
          o->ratio_min, o->ratio_max, o->rounds, o->table_keys_per_sec, o->partition_keys_per_sec);
    }
    std::fputs(
        absl::StrFormat(
            "{\"sparse\": [%s],\n  \"memory\": {\"rows\": %d, \"bytes_per_row_rss\": %.2f, "
            "\"bytes_per_row_allocated\": %.2f, \"stated_bytes_per_row\": %.0f, \"ratio\": %.4f, "
            "\"baseline_bytes_per_row_rss\": %.2f},\n  \"fill_keys_per_sec\": %.0f,\n"
            "  \"rows\": %d, \"partitions\": %d, \"dim\": %d, \"optimizer\": \"sgd\", "
            "\"batch_keys\": %d, \"unique_keys_per_batch\": %.1f, \"zipf_s\": %.3f, "
            "\"in_flight_batches\": %d, \"pool_batches\": %d, \"seconds\": %.2f, "
            "\"transport\": \"%s\"}\n",
            ops, r->rows, r->bytes_per_row_rss, r->bytes_per_row_allocated, r->stated_bytes_per_row,
            mem_ratio, r->baseline_bytes_per_row_rss, r->fill_keys_per_sec, c.rows, c.partitions,
            c.dim, c.batch_keys, r->unique_keys_per_batch, c.zipf_s, c.in_flight, c.pool_batches,
            c.seconds, c.transport)
            .c_str(),
        stdout);
    return 0;
  }
  std::printf(
      "sparse table: %llu rows, dim %d, sgd, %d partitions on one %s transport thread; batches "
      "of %llu Zipf(%.2f) draws = %.0f unique keys, %d in flight\n",
      static_cast<unsigned long long>(r->rows), c.dim, c.partitions, c.transport.c_str(),
      static_cast<unsigned long long>(c.batch_keys), c.zipf_s, r->unique_keys_per_batch,
      c.in_flight);
  std::printf("fill (one push of every key through the transport): %.2f M keys/s\n\n",
              r->fill_keys_per_sec / 1e6);
  std::printf("M keys/s  %9s %9s %6s %11s  %9s %6s %8s  %9s %9s\n", "transport", "baseline",
              "ratio", "(rounds)", "/srv CPU", "busy", "handler", "table", "partition");
  for (const auto* o : {&r->pull, &r->push}) {
    std::printf("%-5s     %9.3f %9.3f %6.3f %5.2f-%-5.2f  %9.3f %6.2f %8.2f  %9.3f %9.3f\n",
                o->op.c_str(), o->keys_per_sec / 1e6, o->baseline_keys_per_sec / 1e6,
                o->keys_per_sec / o->baseline_keys_per_sec, o->ratio_min, o->ratio_max,
                o->keys_per_server_cpu_sec / 1e6, o->server_busy, o->handler_share,
                o->table_keys_per_sec / 1e6, o->partition_keys_per_sec / 1e6);
  }
  std::printf(
      "\ntransport: through the pserver's transport thread; baseline: a std::unordered_map loop\n"
      "on one thread; ratio: transport / baseline (min-max over %d alternating rounds); /srv CPU:\n"
      "keys per second of the pserver thread's CPU time, busy: that CPU time / wall time,\n"
      "handler: its share in the request handler (the partition and sending the answer);\n"
      "table, partition: SparseTable::Lookup/Update and Partition::Pull/Push called directly.\n",
      r->pull.rounds);
  std::printf(
      "memory per row: resident growth during the fill %.1f B, allocated %.1f B, stated %.0f B; "
      "ratio %.3f (baseline map: %.1f B resident)\n",
      r->bytes_per_row_rss, r->bytes_per_row_allocated, r->stated_bytes_per_row, mem_ratio,
      r->baseline_bytes_per_row_rss);
  return 0;
}

}  // namespace

// --mode encryption: the data plane sealed (security.encrypt_data_plane)
// against the same transport in the clear, measured in the same run.
int RunEncryptionMode() {
  std::vector<std::string> rows;
  if (!FLAGS_json) {
    std::printf(
        "tcp data plane, one connection on 127.0.0.1, requests answered empty (as pushes)\n");
    std::printf("%-8s  %11s %11s %7s  %11s %11s\n", "size", "plain GB/s", "sealed GB/s", "ratio",
                "plain p50", "sealed p50");
  }
  for (auto s : absl::StrSplit(FLAGS_sizes, ',')) {
    const uint64_t bytes = ParseSize(std::string(s));
    auto r = strata::bench::RunEncryption(bytes, FLAGS_seconds);
    if (!r.ok()) {
      std::cerr << "encryption failed: " << r.status() << "\n";
      return 1;
    }
    const double ratio = r->plain_gbps > 0 ? r->sealed_gbps / r->plain_gbps : 0;
    if (FLAGS_json) {
      rows.push_back(absl::StrFormat(
          "{\"bytes\": %d, \"plain_gbps\": %.4f, \"sealed_gbps\": %.4f, \"ratio\": %.4f, "
          "\"plain_p50_us\": %.1f, \"sealed_p50_us\": %.1f}",
          bytes, r->plain_gbps, r->sealed_gbps, ratio, r->plain_p50_us, r->sealed_p50_us));
    } else {
      std::printf("%-8s  %11.3f %11.3f %7.3f  %9.0fus %9.0fus\n", Human(bytes).c_str(),
                  r->plain_gbps, r->sealed_gbps, ratio, r->plain_p50_us, r->sealed_p50_us);
    }
  }
  if (FLAGS_json) std::printf("{\"encryption\": [%s]}\n", absl::StrJoin(rows, ", ").c_str());
  return 0;
}

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "strata-bench [--mode M] [--sizes 4K,1M] [--workers W] [--servers S] [--json]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_minloglevel = 2;  // the daemons' INFO/WARNING lines would drown the table
  google::InitGoogleLogging(argv[0]);
  strata::FlushDenormalsToZero();  // as the daemons (InitDaemon)

  std::vector<std::string> modes;
  for (auto m : absl::StrSplit(FLAGS_mode, ',')) {
    if (m == "all") {
      modes = {"memory", "push", "pull", "pushpull", "apply"};
      break;
    }
    if (m != "push" && m != "pull" && m != "pushpull" && m != "apply" && m != "memory" &&
        m != "sparse" && m != "encryption") {
      std::cerr << "strata-bench: unknown mode '" << m << "'\n";
      return 2;
    }
    modes.emplace_back(m);
  }
  if (std::find(modes.begin(), modes.end(), "encryption") != modes.end()) {
    if (modes.size() != 1) {
      std::cerr << "strata-bench: --mode encryption runs alone\n";
      return 2;
    }
    return RunEncryptionMode();
  }
  if (std::find(modes.begin(), modes.end(), "sparse") != modes.end()) {
    if (modes.size() != 1) {
      std::cerr << "strata-bench: --mode sparse runs alone\n";
      return 2;
    }
    return RunSparseMode();
  }
  std::vector<uint64_t> sizes;
  for (auto s : absl::StrSplit(FLAGS_sizes, ',')) sizes.push_back(ParseSize(std::string(s)));

  std::string json_results, json_apply, json_memory = "null";
  // First, while this process has no thread yet: it forks a pserver.
  if (std::find(modes.begin(), modes.end(), "memory") != modes.end()) {
    auto m = strata::bench::RunMemory(FLAGS_memory_model_bytes, "adam");
    if (!m.ok()) {
      std::cerr << "memory failed: " << m.status() << "\n";
      return 1;
    }
    const double ratio = m->rss_bytes / m->bound_bytes;
    if (FLAGS_json) {
      json_memory = absl::StrFormat(
          "{\"model_bytes\": %d, \"optimizer\": \"adam\", \"state_bytes\": %d, "
          "\"rss_bytes\": %d, \"peak_rss_bytes\": %d, \"bound_bytes\": %.0f, "
          "\"ratio_to_bound\": %.4f}",
          m->model_bytes, m->state_bytes, m->rss_bytes, m->peak_rss_bytes, m->bound_bytes, ratio);
    } else {
      std::printf(
          "pserver memory, %s model, adam: resident %.1f MiB (peak %.1f MiB); "
          "parameters + state %.1f MiB; bound 1.3x + 64 MiB = %.1f MiB; ratio %.3f\n\n",
          Human(m->model_bytes).c_str(), m->rss_bytes / 1048576.0, m->peak_rss_bytes / 1048576.0,
          (m->model_bytes + m->state_bytes) / 1048576.0, m->bound_bytes / 1048576.0, ratio);
    }
  }
  bool any_pp = false;
  for (const auto& m : modes) any_pp |= m != "apply" && m != "memory";
  double raw_gbps = 0;
  if (any_pp) {
    auto raw = strata::bench::RawTcpThroughputGbps(2ull << 30);
    if (!raw.ok()) {
      std::cerr << "baseline failed: " << raw.status() << "\n";
      return 1;
    }
    raw_gbps = *raw;
    if (!FLAGS_json) {
      std::printf(
          "baseline: raw single-stream TCP over 127.0.0.1: %.2f GB/s (best of 128K/1M/16M "
          "writes)\n\n",
          raw_gbps);
      std::printf("%-9s %-8s %3s %3s  %9s %7s  %9s %9s %9s %7s\n", "mode", "size", "W", "S", "GB/s",
                  "ratio", "p50 us", "p99 us", "raw p50", "ratio");
    }
  }
  for (uint64_t bytes : sizes) {
    if (!any_pp) break;
    // The latency baseline: one raw round trip of the same size.
    auto pp = strata::bench::RawTcpPingPong(bytes, std::min(0.5, FLAGS_seconds));
    if (!pp.ok()) {
      std::cerr << "ping-pong baseline failed: " << pp.status() << "\n";
      return 1;
    }
    for (const auto& mode : modes) {
      if (mode == "apply" || mode == "memory") continue;
      strata::bench::PushPullCase c;
      c.mode = mode;
      c.bytes = bytes;
      c.workers = FLAGS_workers;
      c.servers = FLAGS_servers;
      c.transport = FLAGS_transport;
      c.slice_bytes = FLAGS_slice_bytes;
      c.chunk_bytes = FLAGS_chunk_bytes;
      c.seconds = FLAGS_seconds;
      c.apply_threads = FLAGS_pserver_apply_threads;
      c.rdma_slot_kib = FLAGS_rdma_slot_kib;
      c.rdma_busy_poll_us = FLAGS_rdma_busy_poll_us;
      c.register_tensors = FLAGS_register_tensors;
      auto r = strata::bench::RunPushPull(c);
      if (!r.ok()) {
        std::cerr << mode << " " << Human(bytes) << " failed: " << r.status() << "\n";
        return 1;
      }
      const double ratio = r->gbps / raw_gbps;
      const double lratio = r->latency.p50_us / pp->p50_us;
      if (FLAGS_json) {
        if (!json_results.empty()) json_results += ",\n    ";
        json_results += absl::StrFormat(
            "{\"mode\": \"%s\", \"bytes\": %d, \"workers\": %d, \"servers\": %d, "
            "\"transport\": \"%s\", \"gbps\": %.4f, \"p50_us\": %.1f, \"p99_us\": %.1f, "
            "\"baseline_gbps\": %.4f, \"baseline_p50_us\": %.1f, \"ratio_gbps\": %.4f, "
            "\"ratio_p50\": %.4f, \"operations\": %d, \"slice_bytes\": %d, "
            "\"chunk_bytes\": %d}",
            mode, bytes, c.workers, c.servers, c.transport, r->gbps, r->latency.p50_us,
            r->latency.p99_us, raw_gbps, pp->p50_us, ratio, lratio, r->operations, c.slice_bytes,
            c.chunk_bytes);
      } else {
        std::printf("%-9s %-8s %3d %3d  %9.3f %7.3f  %9.1f %9.1f %9.1f %7.2f\n", mode.c_str(),
                    Human(bytes).c_str(), c.workers, c.servers, r->gbps, ratio, r->latency.p50_us,
                    r->latency.p99_us, pp->p50_us, lratio);
        std::fflush(stdout);
      }
    }
  }
  if (std::find(modes.begin(), modes.end(), "apply") != modes.end()) {
    const int threads = FLAGS_apply_threads > 0
                            ? FLAGS_apply_threads
                            : static_cast<int>(std::thread::hardware_concurrency());
    if (!FLAGS_json) {
      std::printf(
          "\napply over %lld floats, %d thread(s); baseline: a streaming loop over the same "
          "arrays\n",
          static_cast<long long>(FLAGS_apply_floats), threads);
      std::printf("%-9s %9s %9s %7s\n", "optimizer", "GB/s", "baseline", "ratio");
    }
    for (const char* opt : {"sgd", "adam"}) {
      auto r = strata::bench::RunApply(opt, FLAGS_apply_floats, threads);
      if (!r.ok()) {
        std::cerr << "apply " << opt << " failed: " << r.status() << "\n";
        return 1;
      }
      if (FLAGS_json) {
        if (!json_apply.empty()) json_apply += ",\n    ";
        json_apply += absl::StrFormat(
            "{\"optimizer\": \"%s\", \"floats\": %d, \"threads\": %d, \"gbps\": %.4f, "
            "\"baseline_gbps\": %.4f, \"ratio\": %.4f}",
            opt, r->floats, threads, r->gbps, r->baseline_gbps, r->gbps / r->baseline_gbps);
      } else {
        std::printf("%-9s %9.3f %9.3f %7.3f\n", opt, r->gbps, r->baseline_gbps,
                    r->gbps / r->baseline_gbps);
      }
    }
  }
  if (FLAGS_json) {
    std::printf(
        "{\"raw_tcp_gbps\": %.4f,\n  \"results\": [\n    %s\n  ],\n  \"apply\": [\n    %s\n  ],\n  "
        "\"memory\": %s\n}\n",
        raw_gbps, json_results.c_str(), json_apply.c_str(), json_memory.c_str());
  }
  return 0;
}
