// strata-bench: push/pull throughput and latency and server-side apply
// speed, each against a baseline measured in the same run. See bench/bench.h
// and docs/performance.md.
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_string(mode, "all", "all | push | pull | pushpull | apply | memory (comma list allowed)");
DEFINE_int64(memory_model_bytes, 1ll << 30, "model size for --mode memory");
DEFINE_string(sizes, "4K,64K,1M,16M,64M", "value sizes (K, M suffixes)");
DEFINE_int32(workers, 1, "workers (client threads, each with its own transport)");
DEFINE_int32(servers, 1, "pservers (in this process)");
DEFINE_string(transport, "tcp", "tcp | rdma | auto | inproc");
DEFINE_int64(slice_bytes, 4 << 20, "partition size");
DEFINE_double(seconds, 1.0, "measuring time per case");
DEFINE_int32(pserver_apply_threads, 1, "pserver apply threads (1 = transport thread, 0 = one per core)");
DEFINE_int64(apply_floats, 64ll << 20, "parameters for --mode apply");
DEFINE_int32(apply_threads, 0, "threads for apply (0 = hardware threads)");
DEFINE_int32(rdma_slot_kib, 64, "rdma: bytes per send/receive slot / 1024 (cluster.rdma.slot_kib)");
DEFINE_int32(rdma_busy_poll_us, 50, "rdma: busy polling after a completion (cluster.rdma.busy_poll_us)");
DEFINE_bool(register_tensors, true,
            "register the client's tensors as a worker does (rdma: zero-copy pushes, pulls "
            "written in place; false: both copied through the slots)");
DEFINE_bool(json, false, "print one JSON object instead of a table");

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

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("strata-bench [--mode M] [--sizes 4K,1M] [--workers W] [--servers S] [--json]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_minloglevel = 2;  // the daemons' INFO/WARNING lines would drown the table
  google::InitGoogleLogging(argv[0]);

  std::vector<std::string> modes;
  for (auto m : absl::StrSplit(FLAGS_mode, ',')) {
    if (m == "all") {
      modes = {"memory", "push", "pull", "pushpull", "apply"};
      break;
    }
    if (m != "push" && m != "pull" && m != "pushpull" && m != "apply" && m != "memory") {
      std::cerr << "strata-bench: unknown mode '" << m << "'\n";
      return 2;
    }
    modes.emplace_back(m);
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
      std::printf("pserver memory, %s model, adam: resident %.1f MiB (peak %.1f MiB); "
                  "parameters + state %.1f MiB; bound 1.3x + 64 MiB = %.1f MiB; ratio %.3f\n\n",
                  Human(m->model_bytes).c_str(), m->rss_bytes / 1048576.0,
                  m->peak_rss_bytes / 1048576.0, (m->model_bytes + m->state_bytes) / 1048576.0,
                  m->bound_bytes / 1048576.0, ratio);
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
      std::printf("baseline: raw single-stream TCP over 127.0.0.1: %.2f GB/s (best of 128K/1M/16M writes)\n\n", raw_gbps);
      std::printf("%-9s %-8s %3s %3s  %9s %7s  %9s %9s %9s %7s\n", "mode", "size", "W", "S",
                  "GB/s", "ratio", "p50 us", "p99 us", "raw p50", "ratio");
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
            "\"ratio_p50\": %.4f, \"operations\": %d, \"slice_bytes\": %d}",
            mode, bytes, c.workers, c.servers, c.transport, r->gbps, r->latency.p50_us,
            r->latency.p99_us, raw_gbps, pp->p50_us, ratio, lratio, r->operations,
            c.slice_bytes);
      } else {
        std::printf("%-9s %-8s %3d %3d  %9.3f %7.3f  %9.1f %9.1f %9.1f %7.2f\n", mode.c_str(),
                    Human(bytes).c_str(), c.workers, c.servers, r->gbps, ratio,
                    r->latency.p50_us, r->latency.p99_us, pp->p50_us, lratio);
        std::fflush(stdout);
      }
    }
  }
  if (std::find(modes.begin(), modes.end(), "apply") != modes.end()) {
    const int threads = FLAGS_apply_threads > 0 ? FLAGS_apply_threads
                                                : static_cast<int>(std::thread::hardware_concurrency());
    if (!FLAGS_json) {
      std::printf("\napply over %lld floats, %d thread(s); baseline: a streaming loop over the same arrays\n",
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
    std::printf("{\"raw_tcp_gbps\": %.4f,\n  \"results\": [\n    %s\n  ],\n  \"apply\": [\n    %s\n  ],\n  \"memory\": %s\n}\n",
                raw_gbps, json_results.c_str(), json_apply.c_str(), json_memory.c_str());
  }
  return 0;
}
