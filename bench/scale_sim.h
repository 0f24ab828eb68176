// A discrete-event model of Strata's bsp training step at scales this
// machine cannot run (docs/performance.md, "Scaling past one machine"):
// N nodes of G GPU workers each, S pservers, links of a stated bandwidth.
// Each worker computes the forward pass layer by layer (waiting for each
// layer's pull), then the backward pass, pushing each layer's gradient as
// soon as it is computed (to every pserver, a 1/S share each); a pserver
// applies a layer's share once every push of the step is in, then answers
// the next step's pulls. Node aggregation sums a node's G gradients in
// shared memory and pushes once per node (and fans the pulled parameters
// out the same way). Every resource is a FIFO server in the simulation:
// each node's and pserver's NIC (one per direction), each pserver's apply
// cores, each worker's compute; a message takes the sender's NIC and then
// (cut-through) the receiver's for its bytes at the link's rate plus a
// fixed per-message cost (RDMA or TCP).
#ifndef STRATA_BENCH_SCALE_SIM_H_
#define STRATA_BENCH_SCALE_SIM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::bench {

struct SimModel {
  std::string name;
  // Dense parameters (floats) of each layer, input side first.
  std::vector<double> layer_params;
  // Sparse tables: floats of distinct embedding rows a worker's batch
  // touches per sample (pulled before the forward pass, pushed after the
  // backward), and of all rows (their memory on the pservers).
  double sparse_floats_per_sample = 0;
  double sparse_params = 0;
  // The share of a node's rows that another GPU of the node touched too
  // (merged by node aggregation: each distinct row is pushed once; pulled
  // once with SimCluster::merged_sparse_pulls).
  double node_row_overlap = 0;
  // Seconds of compute per sample per dense parameter (forward and
  // backward together; 1/3 forward), on one GPU, and per sparse float.
  double compute_s_per_param_sample = 0;
  double compute_s_per_sparse_float = 0;
  int batch_per_gpu = 64;
  int optimizer_state_floats = 2;  // per parameter (Adam: 2)
};

struct SimCluster {
  int nodes = 1;
  int gpus_per_node = 8;
  int pservers = 2;
  double link_gbps = 100;           // each node's NIC, each direction
  double pserver_link_gbps = 0;     // each pserver's NIC (0: link_gbps)
  double message_seconds = 2e-6;    // fixed cost of one message (RDMA ~2 us)
  double host_bytes_per_s = 1e12;   // end-host cost per byte (TCP copies; RDMA: none)
  double apply_floats_per_s = 1e9;  // one pserver's dense apply
  double sparse_apply_floats_per_s = 2e8;
  double shm_bytes_per_s = 20e9;  // node aggregation's sum and fan-out
  double gradient_bytes = 4;      // per pushed float (2: fp16 gradients)
  bool node_aggregation = false;
  // Node aggregation layer by layer: a layer's sum pushed as soon as every
  // worker of the node has its gradient, a layer's pulled parameters read
  // as soon as they are in. False: as Strata's is built
  // (worker/host_aggregator.h): the node's sum of the whole gradient once
  // every worker's backward pass ended, its parameters once all are pulled.
  bool pipelined_aggregation = false;
  // Node aggregation of sparse rows: pushes are merged per node (each
  // distinct row pushed once) as built; the pulls are each worker's own
  // (its batch's rows), unless this merges them too (one pull a node of
  // the rows its GPUs touch, fanned out through shared memory).
  bool merged_sparse_pulls = false;
};

struct SimResult {
  double step_seconds = 0;     // steady state (the mean of the later steps)
  double compute_seconds = 0;  // one worker's compute in a step
  double samples_per_second = 0;
  // Samples/s over nodes x GPUs x one GPU computing alone (no waits).
  double scaling_efficiency = 0;
  double comm_share = 0;  // 1 - compute / step
  // Per step: bytes each pserver receives, and the memory each holds.
  double pserver_bytes_in_per_step = 0;
  double pserver_memory_bytes = 0;
  // The busiest resource over the measured steps, and its busy share.
  std::string limit;
  double limit_busy = 0;
};

// Simulates `steps` bsp steps (at least 3) and reports the mean of the
// steps after the first two. InvalidArgument for a model or cluster that
// makes no sense (no layers, nodes < 1, ...).
absl::StatusOr<SimResult> Simulate(const SimModel& model, const SimCluster& cluster, int steps = 6);

}  // namespace strata::bench

#endif  // STRATA_BENCH_SCALE_SIM_H_
