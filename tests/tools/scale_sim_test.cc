#include "bench/scale_sim.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata::bench {
namespace {

using ::strata::testing::StatusIs;

// One layer of 1M floats, batch 10, 1 us per parameter-sample... scaled
// so that compute is 10 ms a step.
SimModel OneLayer() {
  SimModel m;
  m.name = "one layer";
  m.layer_params = {1e6};
  m.compute_s_per_param_sample = 1e-9;  // 10 samples x 1e6 x 1e-9 = 10 ms
  m.batch_per_gpu = 10;
  return m;
}

SimCluster Fast(int nodes, int gpus, int pservers) {
  SimCluster c;
  c.nodes = nodes;
  c.gpus_per_node = gpus;
  c.pservers = pservers;
  c.link_gbps = 1e6;  // (no link limit)
  c.message_seconds = 0;
  c.host_bytes_per_s = 1e18;
  c.apply_floats_per_s = 1e15;
  c.shm_bytes_per_s = 1e18;
  return c;
}

TEST(ScaleSimTest, WithoutCommunicationCostsAStepIsItsCompute) {
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(OneLayer(), Fast(4, 8, 2)));
  EXPECT_NEAR(r.compute_seconds, 0.010, 1e-9);
  EXPECT_NEAR(r.step_seconds, 0.010, 1e-5);
  EXPECT_NEAR(r.scaling_efficiency, 1.0, 1e-3);
  EXPECT_NEAR(r.samples_per_second, 32 * 10 / 0.010, 10);
  EXPECT_EQ(r.limit, "compute");
}

TEST(ScaleSimTest, APserversLinkBoundsTheStepAsItsBytesSay) {
  // Compute ~0; 4 nodes x 2 GPUs push 4 MB each to 1 pserver at 1 GB/s
  // (8 Gb/s): 32 MB in a step, 32 ms at least on its NIC; the pulls take
  // the other direction of it as long.
  SimModel m = OneLayer();
  m.compute_s_per_param_sample = 1e-15;
  SimCluster c = Fast(4, 2, 1);
  c.link_gbps = 8;
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(m, c));
  EXPECT_NEAR(r.pserver_bytes_in_per_step, 32e6, 1);
  EXPECT_GE(r.step_seconds, 0.032);
  EXPECT_LE(r.step_seconds, 0.032 * 2.1);  // push then pull, at worst not overlapped
  EXPECT_EQ(r.limit.rfind("pserver NIC", 0), 0u) << r.limit;
  EXPECT_LT(r.scaling_efficiency, 0.01);
}

TEST(ScaleSimTest, NodeAggregationDividesThePserversBytesByTheGpusOfANode) {
  SimModel m = OneLayer();
  SimCluster c = Fast(4, 8, 2);
  c.link_gbps = 8;
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult none, Simulate(m, c));
  c.node_aggregation = true;
  c.shm_bytes_per_s = 20e9;
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult node, Simulate(m, c));
  EXPECT_NEAR(none.pserver_bytes_in_per_step / node.pserver_bytes_in_per_step, 8, 1e-9);
  EXPECT_LT(node.step_seconds, none.step_seconds / 2);
  EXPECT_GT(node.scaling_efficiency, none.scaling_efficiency);
}

// As built, a node's sum is pushed once every worker's backward pass has
// ended and its parameters read once all are pulled: the compute, then the
// push (4 ms), a layer's pull behind its push (the last layer's 2 ms
// after it). Layer by layer, the compute overlaps the links too.
TEST(ScaleSimTest, AggregationAsBuiltDoesNotOverlapComputeWithTheLinks) {
  SimModel m = OneLayer();
  m.layer_params = {5e5, 5e5};  // 4 MB of gradient a node: 4 ms each way at 1 GB/s
  SimCluster c = Fast(1, 8, 1);
  c.link_gbps = 8;
  c.node_aggregation = true;
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult whole, Simulate(m, c));
  c.pipelined_aggregation = true;
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult layered, Simulate(m, c));
  EXPECT_GE(whole.step_seconds, 0.010 + 0.004 + 0.002 - 1e-4);
  EXPECT_LT(layered.step_seconds, whole.step_seconds);
}

// Sparse rows: a node's pushes are merged per key (half its GPUs' rows are
// shared: half the bytes in); its pulls are each GPU's own as built, so the
// pservers still send every GPU its rows, unless the pulls are merged too.
TEST(ScaleSimTest, NodeAggregationMergesSparsePushesAndPullsOnlyWhenAskedTo) {
  SimModel m = OneLayer();
  m.layer_params = {1};
  m.compute_s_per_param_sample = 1e-15;
  m.sparse_floats_per_sample = 1000;  // 10 samples: 40 kB of rows a GPU
  m.compute_s_per_sparse_float = 1e-15;
  m.node_row_overlap = 0.5;
  SimCluster c = Fast(4, 8, 1);
  c.link_gbps = 8;
  c.sparse_apply_floats_per_s = 1e15;
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult none, Simulate(m, c));
  c.node_aggregation = true;
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult node, Simulate(m, c));
  c.merged_sparse_pulls = true;
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult merged, Simulate(m, c));
  EXPECT_NEAR(none.pserver_bytes_in_per_step / node.pserver_bytes_in_per_step, 2, 1e-3);
  // 32 GPUs' rows out of the pserver (1.28 MB, 1.28 ms) bound the step
  // as built; merged, half of that.
  EXPECT_GE(node.step_seconds, 0.00128 - 1e-5);
  EXPECT_LT(merged.step_seconds, node.step_seconds * 0.75);
}

TEST(ScaleSimTest, PserverMemoryHoldsValuesAndOptimizerStateSplitOverThem) {
  SimModel m = OneLayer();
  m.sparse_params = 1e9;
  m.optimizer_state_floats = 1;
  STRATA_ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(m, Fast(1, 1, 4)));
  EXPECT_NEAR(r.pserver_memory_bytes, 4.0 * (1e9 + 1e6) * 2 / 4, 1);
}

TEST(ScaleSimTest, RefusesWhatMakesNoSense) {
  SimModel m = OneLayer();
  m.layer_params.clear();
  EXPECT_THAT(Simulate(m, Fast(1, 1, 1)), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Simulate(OneLayer(), Fast(0, 1, 1)), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Simulate(OneLayer(), Fast(1, 1, 1), 2), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata::bench
