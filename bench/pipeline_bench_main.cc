// strata-pipeline-bench: an MLP's training steps as K pipeline stages
// (worker/pipeline.h: 1F1B micro-batches, activations and their gradients
// over the tcp transport on 127.0.0.1), each stage a thread with a CPU
// device and a transport of its own, against the same model's steps on
// one device (Mlp::TrainStep on the whole batch), measured alternately in
// the same run. Reports samples/s of each, their ratio (medians over the
// rounds), and the bubble: the share of the stages' time not spent
// computing, measured, beside (K - 1) / (M + K - 1), the 1F1B schedule's.
// The pservers are left out on both sides: this is the pipeline's cost and
// gain, not the parameter exchange's (docs/performance.md, "Pipeline
// stages").
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gflags/gflags.h"
#include "transport/transport.h"
#include "worker/device.h"
#include "worker/mlp.h"
#include "worker/pipeline.h"

DEFINE_string(layers, "784,2048,2048,2048,2048,10", "the MLP's widths");
DEFINE_int32(batch, 256, "examples per step");
DEFINE_int32(stages, 2, "pipeline stages (one thread and core each)");
DEFINE_string(micro, "2,4,8", "micro-batch counts to measure");
DEFINE_int32(steps, 10, "steps per measurement");
DEFINE_int32(rounds, 3, "alternated measurements (medians reported)");

namespace strata {
namespace {

using worker::Mlp;
using worker::PipelineStage;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Fill(std::vector<float>* v, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  for (float& f : *v) f = d(rng);
}

struct Data {
  std::vector<float> x;
  std::vector<int32_t> y;
};

// The whole model's steps on one device: samples/s.
double OneDevice(const std::vector<int>& layers, const Data& d, int steps) {
  auto dev = worker::NewCpuDevice(1);
  Mlp m(layers, worker::Activation::kRelu, dev.get());
  for (size_t t = 0; t < m.params().size(); ++t) Fill(&m.params()[t], t, 0.02f);
  (void)m.TrainStep(d.x.data(), d.y.data(), FLAGS_batch);  // warm-up
  const absl::Time t0 = absl::Now();
  for (int s = 0; s < steps; ++s) {
    auto loss = m.TrainStep(d.x.data(), d.y.data(), FLAGS_batch);
    if (!loss.ok()) {
      std::fprintf(stderr, "step: %s\n", loss.status().ToString().c_str());
      return 0;
    }
  }
  return steps * FLAGS_batch / absl::ToDoubleSeconds(absl::Now() - t0);
}

struct PipelineRun {
  double samples_per_second = 0;
  double bubble = 0;  // measured: 1 - busy / (stages x wall)
};

struct Pipeline {
  std::vector<std::unique_ptr<worker::Device>> devices;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<std::unique_ptr<Mlp>> models;
  std::vector<std::unique_ptr<PipelineStage>> stages;
  ~Pipeline() {
    for (auto& t : transports) t->Shutdown();
    stages.clear();
  }
};

absl::StatusOr<std::unique_ptr<Pipeline>> MakePipeline(const std::vector<int>& layers, int k) {
  auto p = std::make_unique<Pipeline>();
  auto bounds = worker::StageBounds(layers, k);
  if (!bounds.ok()) return bounds.status();
  transport::TransportOptions to;
  to.kind = "tcp";
  std::vector<std::string> addresses;
  for (int s = 0; s < k; ++s) {
    p->devices.push_back(worker::NewCpuDevice(1));
    auto t = transport::CreateTransport(to);
    if (!t.ok()) return t.status();
    p->transports.push_back(*std::move(t));
    p->models.push_back(std::make_unique<Mlp>(worker::StageWidths(layers, *bounds, s),
                                              worker::Activation::kRelu, p->devices.back().get()));
    for (size_t t2 = 0; t2 < p->models.back()->params().size(); ++t2) {
      Fill(&p->models.back()->params()[t2], 100 * s + t2, 0.02f);
    }
    PipelineStage::Options o;
    o.stage = s;
    o.stages = k;
    o.node_id = 1 + s;
    auto st = PipelineStage::Create(p->transports.back().get(), o, p->models.back().get());
    if (!st.ok()) return st.status();
    p->stages.push_back(*std::move(st));
    PipelineStage* stage = p->stages.back().get();
    absl::Status ls = p->transports.back()->Listen(
        "127.0.0.1", 0, [stage](transport::Message m, std::shared_ptr<transport::Responder> r) {
          stage->Handle(std::move(m), std::move(r));
        });
    if (!ls.ok()) return ls;
    addresses.push_back(p->transports.back()->listen_address());
  }
  for (int s = 0; s + 1 < k; ++s) {
    absl::Status c = p->stages[s]->ConnectNext(addresses[s + 1]);
    if (!c.ok()) return c;
  }
  return p;
}

absl::StatusOr<PipelineRun> Pipelined(Pipeline* p, const Data& d, int micro, int steps,
                                      uint64_t first_step) {
  const int k = static_cast<int>(p->stages.size());
  std::vector<absl::Duration> busy(k);
  std::vector<absl::Status> errors(k);
  auto run = [&](int n_steps, uint64_t from) {
    std::vector<std::thread> threads;
    for (int s = 0; s < k; ++s) {
      threads.emplace_back([&, s] {
        for (int i = 0; i < n_steps; ++i) {
          auto r = s == 0 ? p->stages[0]->Step(from + i, from + i, d.x.data(), d.y.data(),
                                               FLAGS_batch, micro)
                          : p->stages[s]->Step(PipelineStage::Next{from + i, from + i});
          if (!r.ok()) {
            errors[s] = r.status();
            return;
          }
          busy[s] += r->busy;
        }
      });
    }
    for (auto& t : threads) t.join();
  };
  run(1, first_step);  // warm-up
  std::fill(busy.begin(), busy.end(), absl::ZeroDuration());
  const absl::Time t0 = absl::Now();
  run(steps, first_step + 1);
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  for (const auto& e : errors) {
    if (!e.ok()) return e;
  }
  PipelineRun out;
  out.samples_per_second = steps * FLAGS_batch / wall;
  double total_busy = 0;
  for (auto b : busy) total_busy += absl::ToDoubleSeconds(b);
  out.bubble = 1.0 - total_busy / (k * wall);
  return out;
}

int Main() {
  std::vector<int> layers;
  for (absl::string_view w : absl::StrSplit(FLAGS_layers, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(w, &v) || v <= 0) {
      std::fprintf(stderr, "--layers: '%s' is not a width\n", std::string(w).c_str());
      return 2;
    }
    layers.push_back(v);
  }
  std::vector<int> micros;
  for (absl::string_view m : absl::StrSplit(FLAGS_micro, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(m, &v) || v <= 0 || v > FLAGS_batch) {
      std::fprintf(stderr, "--micro: '%s' is not a count in [1, --batch]\n",
                   std::string(m).c_str());
      return 2;
    }
    micros.push_back(v);
  }
  Data d;
  d.x.resize(static_cast<size_t>(FLAGS_batch) * layers.front());
  Fill(&d.x, 7, 1.f);
  for (int i = 0; i < FLAGS_batch; ++i) d.y.push_back(i % layers.back());
  auto p = MakePipeline(layers, FLAGS_stages);
  if (!p.ok()) {
    std::fprintf(stderr, "pipeline: %s\n", p.status().ToString().c_str());
    return 1;
  }
  std::printf("model %s, batch %d, %d stages, %d steps x %d rounds (alternated)\n",
              FLAGS_layers.c_str(), FLAGS_batch, FLAGS_stages, FLAGS_steps, FLAGS_rounds);
  uint64_t step = 0;
  for (int micro : micros) {
    std::vector<double> one, piped, bubble;
    for (int r = 0; r < FLAGS_rounds; ++r) {
      one.push_back(OneDevice(layers, d, FLAGS_steps));
      auto run = Pipelined(p->get(), d, micro, FLAGS_steps, step);
      step += FLAGS_steps + 1;
      if (!run.ok()) {
        std::fprintf(stderr, "pipelined steps: %s\n", run.status().ToString().c_str());
        return 1;
      }
      piped.push_back(run->samples_per_second);
      bubble.push_back(run->bubble);
    }
    const double k = FLAGS_stages;
    const double schedule_bubble = (k - 1) / (micro + k - 1);
    std::printf(
        "micro_batches %2d: one device %8.1f samples/s, %d stages %8.1f samples/s, ratio %.2f; "
        "bubble measured %.2f, 1F1B schedule %.2f\n",
        micro, Median(one), FLAGS_stages, Median(piped), Median(piped) / Median(one),
        Median(bubble), schedule_bubble);
    std::printf(
        "{\"bench\": \"pipeline\", \"stages\": %d, \"micro_batches\": %d, \"batch\": %d, "
        "\"one_device_sps\": %.1f, \"pipeline_sps\": %.1f, \"ratio\": %.3f, "
        "\"bubble_measured\": %.3f, \"bubble_schedule\": %.3f}\n",
        FLAGS_stages, micro, FLAGS_batch, Median(one), Median(piped), Median(piped) / Median(one),
        Median(bubble), schedule_bubble);
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return strata::Main();
}
