// strata-step-bench: the time of one training step (forward and backward,
// no network) on a Strata device, as the worker computes it: the MLP
// (worker/mlp.cc: row blocks, gradients copied back to the host as they are
// ready) or the Wide & Deep CTR model (worker/wide_deep.cc: a batch's rows
// in, their gradients out). bench/step_bench.sh runs it beside the same
// model in PyTorch on the same device (bench/torch_step.py) and reports the
// ratio (docs/gpu.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/model_spec.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "worker/device.h"
#include "worker/mlp.h"
#include "worker/wide_deep.h"

DEFINE_string(model, "mlp", "mlp | wide_deep");
DEFINE_string(device, "cpu", "cpu | cuda | auto");
DEFINE_string(precision, "fp32", "fp32 | tf32 | bf16 (GPU matrix products)");
DEFINE_string(layers, "784,1024,1024,10",
              "mlp: widths, input first; wide_deep: the deep part's hidden widths");
DEFINE_int32(embedding_dim, 16, "wide_deep: embedding width");
DEFINE_int32(unique_keys, 0, "wide_deep: distinct keys a batch (0: half its 26 * batch)");
DEFINE_int32(batch, 256, "examples per step");
DEFINE_int32(steps, 50, "timed steps (after 5 to warm up)");
DEFINE_int32(cpu_threads, 1, "OpenBLAS threads");
DEFINE_int32(recompute_every, 0, "activation recomputation (worker.recompute_every)");
DEFINE_int32(row_blocks, 4, "blocks per weight (as partitions cut them), 1 = whole");

namespace {

// *ms: milliseconds per step over --steps steps, after 5 to warm up, and
// *loss the last one's; false when a step failed (said on stderr).
bool TimeSteps(const std::function<absl::StatusOr<double>()>& step, double* ms, double* loss) {
  std::chrono::steady_clock::time_point t0;
  for (int i = 0; i < 5 + FLAGS_steps; ++i) {
    if (i == 5) t0 = std::chrono::steady_clock::now();
    absl::StatusOr<double> l = step();
    if (!l.ok()) {
      std::cerr << "strata-step-bench: " << l.status() << "\n";
      return false;
    }
    *loss = *l;
    if (i + 1 == 5 + FLAGS_steps) {
      *ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
          FLAGS_steps;
    }
  }
  return true;
}

int RunWideDeep(const std::vector<int>& hidden, strata::worker::Device* device) {
  using namespace strata;
  using namespace strata::worker;
  ModelSection model;
  model.type = "wide_deep";
  model.embedding_dim = FLAGS_embedding_dim;
  model.hidden = hidden;
  WideDeep net(model, Activation::kRelu, device);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 0.05f);
  for (auto& t : net.params()) {
    for (float& v : t) v = normal(rng);
  }
  const int batch = FLAGS_batch;
  const size_t occurrences = static_cast<size_t>(batch) * kCtrFields;
  const size_t unique =
      FLAGS_unique_keys > 0 ? FLAGS_unique_keys : std::max<size_t>(1, occurrences / 2);
  std::vector<float> dense(static_cast<size_t>(batch) * kCtrDenseFeatures), labels(batch);
  for (float& v : dense) v = normal(rng) * 20;
  for (float& v : labels) v = static_cast<float>(rng() % 2);
  std::vector<uint32_t> slot(occurrences);
  for (uint32_t& s : slot) s = static_cast<uint32_t>(rng() % unique);
  std::vector<float> wide_rows(unique), emb_rows(unique * model.embedding_dim);
  for (float& v : wide_rows) v = normal(rng);
  for (float& v : emb_rows) v = normal(rng);
  std::vector<float> wide_grad, emb_grad;
  double loss = 0, ms = 0;
  if (!TimeSteps(
          [&] {
            return net.TrainStep(dense.data(), slot.data(), labels.data(), batch, wide_rows.data(),
                                 emb_rows.data(), unique, &wide_grad, &emb_grad);
          },
          &ms, &loss)) {
    return 1;
  }
  std::printf(
      "{\"model\": \"wide_deep\", \"device\": \"%s\", \"precision\": \"%s\", "
      "\"hidden\": \"%s\", \"embedding_dim\": %d, \"batch\": %d, \"unique_keys\": %zu, "
      "\"ms_per_step\": %.4f, \"loss\": %.4f}\n",
      device->Describe().c_str(), FLAGS_precision.c_str(), FLAGS_layers.c_str(),
      FLAGS_embedding_dim, batch, unique, ms, loss / batch);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("strata-step-bench [flags]: ms per MLP training step on a device");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  using namespace strata::worker;
  std::vector<int> layers;
  for (absl::string_view w : absl::StrSplit(FLAGS_layers, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(w, &v) || v <= 0) {
      std::cerr << "strata-step-bench: bad --layers '" << FLAGS_layers << "'\n";
      return 2;
    }
    layers.push_back(v);
  }
  if ((FLAGS_model == "mlp" && layers.size() < 2) || FLAGS_batch <= 0 || FLAGS_steps <= 0) {
    std::cerr << "strata-step-bench: need two or more --layers (mlp), --batch > 0, --steps > 0\n";
    return 2;
  }
  if (FLAGS_model != "mlp" && FLAGS_model != "wide_deep") {
    std::cerr << "strata-step-bench: --model is mlp or wide_deep\n";
    return 2;
  }
  DeviceChoice choice;
  choice.device = FLAGS_device;
  choice.cpu_threads = FLAGS_cpu_threads;
  auto precision = ParsePrecision(FLAGS_precision);
  if (!precision.ok()) {
    std::cerr << "strata-step-bench: " << precision.status().message() << "\n";
    return 2;
  }
  choice.precision = *precision;
  auto device = NewDevice(choice);
  if (!device.ok()) {
    std::cerr << "strata-step-bench: " << device.status().message() << "\n";
    return 1;
  }
  if (FLAGS_model == "wide_deep") return RunWideDeep(layers, device->get());
  Mlp mlp(layers, Activation::kRelu, device->get());
  mlp.SetRecompute(FLAGS_recompute_every);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 0.05f);
  for (int t = 0; t < static_cast<int>(mlp.params().size()); ++t) {
    for (float& v : mlp.params()[t]) v = normal(rng);
    if (t % 2 == 0 && FLAGS_row_blocks > 1) {
      const int rows = layers[t / 2], cols = layers[t / 2 + 1];
      std::vector<uint64_t> starts;
      for (int b = 0; b < FLAGS_row_blocks; ++b) {
        starts.push_back(static_cast<uint64_t>(rows) * b / FLAGS_row_blocks * cols);
      }
      mlp.SetPartitionStarts(t, starts);
    }
  }
  std::vector<float> x(static_cast<size_t>(FLAGS_batch) * layers[0]);
  for (float& v : x) v = normal(rng) * 20;
  std::vector<int32_t> y(FLAGS_batch);
  for (int32_t& v : y) v = static_cast<int32_t>(rng() % layers.back());
  // The hooks a worker sets: every gradient block is announced as it is
  // ready (a worker sends it then).
  uint64_t announced = 0;
  Mlp::Hooks hooks;
  hooks.grads_ready = [&](int, uint64_t) {
    ++announced;
    return absl::OkStatus();
  };
  double loss = 0, ms = 0;
  if (!TimeSteps([&] { return mlp.TrainStep(x.data(), y.data(), FLAGS_batch, hooks); }, &ms,
                 &loss)) {
    return 1;
  }
  const Mlp::ActivationMemory m = mlp.activation_memory();
  std::printf(
      "{\"model\": \"mlp\", \"device\": \"%s\", \"precision\": \"%s\", \"layers\": \"%s\", "
      "\"batch\": %d, "
      "\"ms_per_step\": %.4f, \"loss\": %.4f, \"activation_bytes\": %llu, "
      "\"activation_bytes_without_recompute\": %llu}\n",
      (*device)->Describe().c_str(), FLAGS_precision.c_str(), FLAGS_layers.c_str(), FLAGS_batch, ms,
      loss / FLAGS_batch, static_cast<unsigned long long>(m.held),
      static_cast<unsigned long long>(m.without_recompute));
  return 0;
}
