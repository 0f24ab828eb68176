// strata-scale-sim: Strata's bsp step modelled at 8 to 256 nodes of 8 GPUs
// (bench/scale_sim.h), for a dense model of 100M parameters and a CTR model
// of 10^11 embedding parameters, with and without node aggregation, 2 to 8
// pservers, 100 Gb/s links. The pservers' per-core costs come from Strata's
// own benchmarks run here (--calibration: the JSON `strata-bench --json`
// writes; bench/scale_sim.sh runs both); the GPUs' compute from a stated
// throughput (--gpu_tflops), since no GPU is measured here.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/scale_sim.h"
#include "gflags/gflags.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

DEFINE_string(calibration, "",
              "strata-bench --json output: apply and transport costs measured here");
DEFINE_double(gpu_tflops, 400, "achieved dense TFLOP/s of one GPU (H200 bf16 at ~40% of peak)");
DEFINE_int32(pserver_cores, 32, "cores of one pserver applying updates");
DEFINE_double(link_gbps, 100, "each NIC, each direction");
DEFINE_bool(rdma, true, "RDMA (2 us a message, no host copies) or TCP (measured host costs)");
DEFINE_bool(pipelined_aggregation, false,
            "node aggregation layer by layer (false: the whole gradient, as Strata's is built)");
DEFINE_bool(merged_sparse_pulls, false,
            "node aggregation pulls a node's sparse rows once (false: each worker pulls its "
            "own, as Strata's is built)");
DEFINE_bool(json, false, "one JSON document instead of the table");
DEFINE_string(pservers, "2,4,8", "pserver counts to model; \"nodes\": one on every node");
DEFINE_int32(dense_batch, 32, "the dense model's samples (512 tokens each) per GPU per step");
DEFINE_int32(gradient_bytes, 4, "bytes per pushed gradient float (2: fp16 pushes)");
// A model and cluster of one's own in place of the two above (the
// shaped-link runs on this machine, bench/shaped_scale_bench.sh).
DEFINE_string(layers, "", "dense floats of each layer, e.g. 200960,2570: model that instead");
DEFINE_int32(batch, 64, "with --layers: samples per worker per step");
DEFINE_double(compute_s_per_param_sample, 1e-9, "with --layers: compute per parameter-sample");
DEFINE_string(nodes, "8,32,128,256", "node counts to model");
DEFINE_int32(gpus_per_node, 8, "workers on each node");
DEFINE_double(pserver_link_gbps, 0, "each pserver's NIC (0: --link_gbps)");

namespace strata::bench {
namespace {

struct Costs {
  double apply_floats_per_s_core = 2.5e8;  // adam, one core (overridden by --calibration)
  double tcp_bytes_per_s = 2e9;            // loopback push+pull of 64 KiB messages
  double tcp_message_seconds = 30e-6;
  std::string source = "defaults";
};

Costs LoadCosts(const std::string& path) {
  Costs c;
  if (path.empty()) return c;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::Struct doc;
  if (!in || !google::protobuf::util::JsonStringToMessage(text.str(), &doc).ok()) {
    std::fprintf(stderr, "%s: cannot read it as JSON; using the default costs\n", path.c_str());
    return c;
  }
  auto field = [](const google::protobuf::Struct& s, const char* key) {
    auto it = s.fields().find(key);
    return it != s.fields().end() ? it->second : google::protobuf::Value();
  };
  const google::protobuf::Value apply = field(doc, "apply"), results = field(doc, "results");
  for (const auto& a : apply.list_value().values()) {
    if (field(a.struct_value(), "optimizer").string_value() == "adam") {
      c.apply_floats_per_s_core = field(a.struct_value(), "gbps").number_value() * 1e9 / 8 / 4;
    }
  }
  for (const auto& v : results.list_value().values()) {
    const google::protobuf::Struct& r = v.struct_value();
    if (field(r, "mode").string_value() != "pushpull") continue;
    const double bytes = field(r, "bytes").number_value();
    if (bytes == 65536) c.tcp_bytes_per_s = field(r, "gbps").number_value() * 1e9 / 8;
    if (bytes == 4096) c.tcp_message_seconds = field(r, "p50_us").number_value() * 1e-6;
  }
  c.source = path;
  return c;
}

SimModel Dense100M() {
  SimModel m;
  m.name = "dense 100M";
  m.layer_params.assign(8, 12.5e6);  // 8 blocks of 12.5M
  // A sample of 512 tokens: 6 FLOP per parameter per token.
  m.compute_s_per_param_sample = 6.0 * 512 / (FLAGS_gpu_tflops * 1e12);
  m.batch_per_gpu = FLAGS_dense_batch;
  return m;
}

SimModel Ctr1e11() {
  SimModel m;
  m.name = "CTR 1e11";
  // Wide & Deep's MLP over 26 fields x 16: 416-1024-512-256-1.
  m.layer_params = {416.0 * 1024, 1024.0 * 512, 512.0 * 256, 256};
  m.compute_s_per_param_sample = 6.0 / (FLAGS_gpu_tflops * 1e12);
  m.sparse_params = 1e11;
  // 26 rows of 16 floats a sample, 40% of them distinct within a GPU's
  // batch (Zipf), and half of a node's repeated on another GPU of it.
  m.sparse_floats_per_sample = 26 * 16 * 0.4;
  m.node_row_overlap = 0.5;
  m.compute_s_per_sparse_float = 6.0 / (FLAGS_gpu_tflops * 1e12);
  m.batch_per_gpu = 4096;
  m.optimizer_state_floats = 1;  // Adagrad
  return m;
}

SimModel Custom() {
  SimModel m;
  m.name = "custom";
  for (absl::string_view f : absl::StrSplit(FLAGS_layers, ',')) {
    double v = 0;
    if (absl::SimpleAtod(f, &v) && v > 0) m.layer_params.push_back(v);
  }
  m.compute_s_per_param_sample = FLAGS_compute_s_per_param_sample;
  m.batch_per_gpu = FLAGS_batch;
  return m;
}

int Main() {
  const Costs costs = LoadCosts(FLAGS_calibration);
  std::vector<int> node_counts;
  for (absl::string_view f : absl::StrSplit(FLAGS_nodes, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(f, &n) || n < 1) {
      std::cerr << "--nodes: '" << f << "' is not a node count\n";
      return 2;
    }
    node_counts.push_back(n);
  }
  const std::vector<SimModel> models = FLAGS_layers.empty()
                                           ? std::vector<SimModel>{Dense100M(), Ctr1e11()}
                                           : std::vector<SimModel>{Custom()};
  std::vector<std::string> rows;  // --json
  if (!FLAGS_json) {
    std::printf("costs: %s; apply %.0f M floats/s per core x %d cores; %s; GPU %.0f TFLOP/s\n",
                costs.source.c_str(), costs.apply_floats_per_s_core / 1e6, FLAGS_pserver_cores,
                FLAGS_rdma
                    ? "RDMA (2 us a message)"
                    : absl::StrFormat("TCP (%.1f us a message, %.1f GB/s host copies)",
                                      costs.tcp_message_seconds * 1e6, costs.tcp_bytes_per_s / 1e9)
                          .c_str(),
                FLAGS_gpu_tflops);
    std::printf("%-10s %5s %3s %-5s %9s %9s %7s %7s %11s %9s  %s\n", "model", "nodes", "ps", "agg",
                "step ms", "samples/s", "eff",
                absl::StrCat("vs ", node_counts.front(), "n").c_str(), "ps in MB", "ps GB",
                "limit");
  }
  for (const SimModel& model : models) {
    for (absl::string_view ps : absl::StrSplit(FLAGS_pservers, ',')) {
      for (bool agg : {false, true}) {
        double per_node_at_fewest = 0;
        for (int nodes : node_counts) {
          int pservers = nodes;
          if (ps != "nodes" && !absl::SimpleAtoi(ps, &pservers)) {
            std::cerr << "--pservers: '" << ps << "' is not a count or \"nodes\"\n";
            return 2;
          }
          SimCluster c;
          c.nodes = nodes;
          c.gpus_per_node = FLAGS_gpus_per_node;
          c.pservers = pservers;
          c.link_gbps = FLAGS_link_gbps;
          c.pserver_link_gbps = FLAGS_pserver_link_gbps;
          c.node_aggregation = agg;
          c.pipelined_aggregation = FLAGS_pipelined_aggregation;
          c.merged_sparse_pulls = FLAGS_merged_sparse_pulls;
          c.gradient_bytes = FLAGS_gradient_bytes;
          c.apply_floats_per_s = costs.apply_floats_per_s_core * FLAGS_pserver_cores;
          c.sparse_apply_floats_per_s = c.apply_floats_per_s / 4;  // hashing, row lookups
          if (FLAGS_rdma) {
            c.message_seconds = 2e-6;
            c.host_bytes_per_s = 1e15;
          } else {
            c.message_seconds = costs.tcp_message_seconds;
            c.host_bytes_per_s = costs.tcp_bytes_per_s;
          }
          absl::StatusOr<SimResult> r = Simulate(model, c);
          if (!r.ok()) {
            std::cerr << r.status() << "\n";
            return 1;
          }
          if (nodes == node_counts.front()) per_node_at_fewest = r->samples_per_second / nodes;
          const double vs8 = r->samples_per_second / (per_node_at_fewest * nodes);
          if (FLAGS_json) {
            rows.push_back(absl::StrFormat(
                "{\"model\": \"%s\", \"nodes\": %d, \"gpus_per_node\": %d, \"pservers\": %d, "
                "\"aggregation\": \"%s\", \"step_seconds\": %.6g, \"compute_seconds\": %.6g, "
                "\"samples_per_second\": %.6g, \"scaling_efficiency\": %.4f, "
                "\"efficiency_vs_fewest_nodes\": %.4f, \"comm_share\": %.4f, "
                "\"pserver_bytes_in_per_step\": %.6g, \"pserver_memory_bytes\": %.6g, "
                "\"limit\": \"%s\", \"limit_busy\": %.3f}",
                model.name, nodes, FLAGS_gpus_per_node, pservers, agg ? "node" : "none",
                r->step_seconds, r->compute_seconds, r->samples_per_second, r->scaling_efficiency,
                vs8, r->comm_share, r->pserver_bytes_in_per_step, r->pserver_memory_bytes, r->limit,
                r->limit_busy));
          } else {
            std::printf(
                "%-10s %5d %3d %-5s %9.2f %9.0f %6.1f%% %6.1f%% %11.1f %9.1f  %s (%.0f%%)\n",
                model.name.c_str(), nodes, pservers, agg ? "node" : "none", r->step_seconds * 1e3,
                r->samples_per_second, 100 * r->scaling_efficiency, 100 * vs8,
                r->pserver_bytes_in_per_step / 1e6, r->pserver_memory_bytes / 1e9, r->limit.c_str(),
                100 * r->limit_busy);
          }
        }
      }
    }
  }
  if (FLAGS_json) std::cout << "[\n  " << absl::StrJoin(rows, ",\n  ") << "\n]\n";
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return strata::bench::Main();
}
