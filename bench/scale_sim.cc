#include "bench/scale_sim.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::bench {
namespace {

// A FIFO server: requests taken in the order they are offered (the model
// offers them in the order they become ready), each busy until done.
struct Server {
  double free_at = 0;
  double busy = 0;  // seconds busy within the measured window
};

// One message or apply waiting to be served: ready at `ready`, for the
// resources it holds.
struct Request {
  double ready;
  int from;       // index into the sender's servers
  int to;         // index into the receiver's servers
  double amount;  // a message: its bytes; an apply: its seconds
  double* done;   // where its end time goes (max-combined)
};

class Sim {
 public:
  Sim(const SimModel& m, const SimCluster& c)
      : m_(m), c_(c), layers_(static_cast<int>(m.layer_params.size())) {
    workers_ = c.nodes * c.gpus_per_node;
    node_out_.resize(c.nodes);
    node_in_.resize(c.nodes);
    ps_in_.resize(c.pservers);
    ps_out_.resize(c.pservers);
    ps_cpu_.resize(c.pservers);
    node_bytes_per_s_ = c.link_gbps * 1e9 / 8;
    ps_bytes_per_s_ = (c.pserver_link_gbps > 0 ? c.pserver_link_gbps : c.link_gbps) * 1e9 / 8;
    // (previous step's applies: at time 0 for the first step)
    applied_.assign(layers_, std::vector<double>(c.pservers, 0));
    sparse_applied_.assign(c.pservers, 0);
  }

  // A message's time on a NIC of `bytes_per_s`.
  double MessageSeconds(double bytes, double bytes_per_s) const {
    return c_.message_seconds + bytes / bytes_per_s + bytes / c_.host_bytes_per_s;
  }

  // Serves `reqs`: each sender's NIC takes its messages in the order they
  // become ready; each receiver's NIC takes them in the order their
  // senders start them (cut-through: a message ends on the receiver no
  // sooner than its time after its sender started it). An apply takes its
  // pserver's cores (no receiver).
  // (`*_rate`: the NICs' bytes per second; 0 for an apply, whose
  // `seconds` is its time.)
  void Serve(std::vector<Request>* reqs, std::vector<Server>* senders, double sender_rate,
             std::vector<Server>* receivers, double receiver_rate) {
    std::stable_sort(reqs->begin(), reqs->end(),
                     [](const Request& a, const Request& b) { return a.ready < b.ready; });
    for (Request& r : *reqs) {
      Server& s = (*senders)[r.from];
      const double t = sender_rate > 0 ? MessageSeconds(r.amount, sender_rate) : r.amount;
      r.ready = std::max(r.ready, s.free_at);  // (now: when the sender starts it)
      s.free_at = r.ready + t;
      if (measuring_) s.busy += t;
      if (receivers == nullptr) *r.done = std::max(*r.done, s.free_at);
    }
    if (receivers == nullptr) return;
    std::stable_sort(reqs->begin(), reqs->end(),
                     [](const Request& a, const Request& b) { return a.ready < b.ready; });
    for (Request& r : *reqs) {
      Server& d = (*receivers)[r.to];
      const double t = MessageSeconds(r.amount, receiver_rate);
      d.free_at = std::max(r.ready, d.free_at) + t;
      if (measuring_) d.busy += t;
      *r.done = std::max(*r.done, d.free_at);
    }
  }

  // One bsp step: pulls (after the previous step's applies), forward,
  // backward with pushes, applies. Returns when the last worker's
  // backward pass ended.
  double Step() {
    const int g = c_.gpus_per_node, S = c_.pservers;
    const bool agg = c_.node_aggregation;
    const double gb = c_.gradient_bytes;
    const int pullers = agg ? c_.nodes : workers_;
    const double batch = m_.batch_per_gpu;
    // Sparse rows one pusher moves per step (a node merges its GPUs' rows),
    // and one sparse puller (a worker its own, or a node's merged rows).
    const double sparse_bytes =
        4 * batch * m_.sparse_floats_per_sample * (agg ? g * (1 - m_.node_row_overlap) : 1);
    const bool merged_pulls = agg && c_.merged_sparse_pulls;
    const double sparse_pull_bytes =
        merged_pulls ? sparse_bytes : 4 * batch * m_.sparse_floats_per_sample;
    const int sparse_pullers = merged_pulls ? c_.nodes : workers_;
    // Pulls: each layer's share from each pserver, to each puller.
    std::vector<std::vector<double>> pulled(pullers, std::vector<double>(layers_, 0));
    std::vector<double> sparse_pulled(sparse_pullers, 0);
    std::vector<Request> reqs;
    for (int p = 0; p < pullers; ++p) {
      const int node = agg ? p : p / g;
      for (int l = 0; l < layers_; ++l) {
        for (int s = 0; s < S; ++s) {
          reqs.push_back({applied_[l][s], s, node, 4 * m_.layer_params[l] / S, &pulled[p][l]});
        }
      }
    }
    if (sparse_pull_bytes > 0) {
      for (int p = 0; p < sparse_pullers; ++p) {
        const int node = merged_pulls ? p : p / g;
        for (int s = 0; s < S; ++s) {
          reqs.push_back({sparse_applied_[s], s, node, sparse_pull_bytes / S, &sparse_pulled[p]});
        }
      }
    }
    Serve(&reqs, &ps_out_, ps_bytes_per_s_, &node_in_, node_bytes_per_s_);
    // Forward and backward on each worker; gradients ready per layer.
    std::vector<std::vector<double>> grad_ready(workers_, std::vector<double>(layers_, 0));
    std::vector<double> backward_end(workers_, 0);
    double step_end = 0;
    // As built, a node's parameters are published once all are pulled.
    const bool whole = agg && !c_.pipelined_aggregation;
    double all_params = 0;
    for (int l = 0; l < layers_; ++l) all_params += m_.layer_params[l];
    for (int w = 0; w < workers_; ++w) {
      const int p = agg ? w / g : w;
      const int sp = merged_pulls ? w / g : w;
      double t = compute_free_[w];
      // (node aggregation: the leader's copy into shared memory, read in place)
      const double fanout = agg ? 1.0 / c_.shm_bytes_per_s : 0;
      const double sparse_fanout = merged_pulls ? fanout * sparse_bytes : 0;
      if (whole) {
        double in = 0;
        for (int l = 0; l < layers_; ++l) in = std::max(in, pulled[p][l]);
        t = std::max(t, in + fanout * 4 * all_params);
      }
      t = std::max(t, sparse_pulled[sp] + sparse_fanout);
      t += batch * m_.sparse_floats_per_sample * m_.compute_s_per_sparse_float / 3;
      for (int l = 0; l < layers_; ++l) {
        t = std::max(t, pulled[p][l] + fanout * 4 * m_.layer_params[l]);
        t += batch * m_.layer_params[l] * m_.compute_s_per_param_sample / 3;
      }
      for (int l = layers_ - 1; l >= 0; --l) {
        t += 2 * batch * m_.layer_params[l] * m_.compute_s_per_param_sample / 3;
        grad_ready[w][l] = t;
      }
      t += 2 * batch * m_.sparse_floats_per_sample * m_.compute_s_per_sparse_float / 3;
      backward_end[w] = t;
      compute_free_[w] = t;
      step_end = std::max(step_end, t);
    }
    // Pushes: per layer and pserver, from each worker, or once per node
    // after the node's sum.
    const int pushers = pullers;
    std::vector<std::vector<double>> arrived(layers_, std::vector<double>(S, 0));
    std::vector<double> sparse_arrived(S, 0);
    reqs.clear();
    for (int p = 0; p < pushers; ++p) {
      const int node = agg ? p : p / g;
      for (int l = 0; l < layers_; ++l) {
        double ready = 0;
        if (whole) {  // the whole gradient summed once every backward pass ended
          for (int k = 0; k < g; ++k) ready = std::max(ready, backward_end[p * g + k]);
          ready += g * 4 * all_params / c_.shm_bytes_per_s;
        } else if (agg) {
          for (int k = 0; k < g; ++k) ready = std::max(ready, grad_ready[p * g + k][l]);
          ready += g * 4 * m_.layer_params[l] / c_.shm_bytes_per_s;  // the sum
        } else {
          ready = grad_ready[p][l];
        }
        for (int s = 0; s < S; ++s) {
          reqs.push_back({ready, node, s, gb * m_.layer_params[l] / S, &arrived[l][s]});
          if (measuring_) bytes_in_ += gb * m_.layer_params[l] / S;
        }
      }
      if (sparse_bytes > 0) {
        double ready = 0;
        const int first = agg ? p * g : p, n = agg ? g : 1;
        for (int k = 0; k < n; ++k) ready = std::max(ready, backward_end[first + k]);
        for (int s = 0; s < S; ++s) {
          reqs.push_back({ready, node, s, sparse_bytes / S, &sparse_arrived[s]});
          if (measuring_) bytes_in_ += sparse_bytes / S;
        }
      }
    }
    Serve(&reqs, &node_out_, node_bytes_per_s_, &ps_in_, ps_bytes_per_s_);
    // Applies: a layer's share once all its pushes are in; the sparse rows
    // once every push of the step is.
    reqs.clear();
    for (int l = 0; l < layers_; ++l) {
      for (int s = 0; s < S; ++s) {
        applied_[l][s] = 0;
        reqs.push_back(
            {arrived[l][s], s, 0, m_.layer_params[l] / S / c_.apply_floats_per_s, &applied_[l][s]});
      }
    }
    for (int s = 0; s < S; ++s) {
      sparse_applied_[s] = 0;
      if (sparse_bytes > 0) {
        reqs.push_back({sparse_arrived[s], s, 0,
                        pushers * sparse_bytes / S / 4 / c_.sparse_apply_floats_per_s,
                        &sparse_applied_[s]});
      }
    }
    Serve(&reqs, &ps_cpu_, 0, nullptr, 0);
    return step_end;
  }

  absl::StatusOr<SimResult> Run(int steps) {
    compute_free_.assign(workers_, 0);
    std::vector<double> ends;
    double compute = 0;
    for (int l = 0; l < layers_; ++l) compute += m_.layer_params[l];
    compute = m_.batch_per_gpu * (compute * m_.compute_s_per_param_sample +
                                  m_.sparse_floats_per_sample * m_.compute_s_per_sparse_float);
    for (int k = 0; k < steps; ++k) {
      measuring_ = k >= 2;
      ends.push_back(Step());
    }
    SimResult r;
    const int measured = steps - 2;
    r.step_seconds = (ends.back() - ends[1]) / measured;
    r.compute_seconds = compute;
    r.samples_per_second = workers_ * m_.batch_per_gpu / r.step_seconds;
    r.scaling_efficiency = compute / r.step_seconds;
    r.comm_share = 1 - r.scaling_efficiency;
    r.pserver_bytes_in_per_step = bytes_in_ / measured / c_.pservers;
    double dense = 0;
    for (double p : m_.layer_params) dense += p;
    r.pserver_memory_bytes =
        4.0 * (dense + m_.sparse_params) * (1 + m_.optimizer_state_floats) / c_.pservers;
    const double window = ends.back() - ends[1];
    auto most = [&](const std::vector<Server>& v) {
      double b = 0;
      for (const Server& s : v) b = std::max(b, s.busy);
      return b / window;
    };
    const std::vector<std::pair<std::string, double>> shares = {
        {"compute", std::min(1.0, compute / r.step_seconds)},
        {"node NIC out", most(node_out_)},
        {"node NIC in", most(node_in_)},
        {"pserver NIC in", most(ps_in_)},
        {"pserver NIC out", most(ps_out_)},
        {"pserver apply", most(ps_cpu_)}};
    for (const auto& [name, busy] : shares) {
      if (busy > r.limit_busy) {
        r.limit = name;
        r.limit_busy = busy;
      }
    }
    return r;
  }

 private:
  const SimModel& m_;
  const SimCluster& c_;
  const int layers_;
  int workers_ = 0;
  double node_bytes_per_s_ = 0, ps_bytes_per_s_ = 0;
  bool measuring_ = false;
  double bytes_in_ = 0;
  std::vector<Server> node_out_, node_in_, ps_in_, ps_out_, ps_cpu_;
  std::vector<double> compute_free_;
  std::vector<std::vector<double>> applied_;
  std::vector<double> sparse_applied_;
};

}  // namespace

absl::StatusOr<SimResult> Simulate(const SimModel& model, const SimCluster& cluster, int steps) {
  if (model.layer_params.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", model.name, ": no dense layers"));
  }
  if (cluster.nodes < 1 || cluster.gpus_per_node < 1 || cluster.pservers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cluster: nodes ", cluster.nodes, ", gpus ",
                                                   cluster.gpus_per_node, ", pservers ",
                                                   cluster.pservers, " (each must be >= 1)"));
  }
  if (cluster.link_gbps <= 0 || cluster.gradient_bytes <= 0 || cluster.apply_floats_per_s <= 0 ||
      cluster.shm_bytes_per_s <= 0 || cluster.host_bytes_per_s <= 0 || model.batch_per_gpu < 1 ||
      steps < 3) {
    return absl::InvalidArgumentError(
        "link_gbps, apply and shm rates, host bytes/s, the batch and steps (>= 3) must be > 0");
  }
  Sim sim(model, cluster);
  return sim.Run(steps);
}

}  // namespace strata::bench
