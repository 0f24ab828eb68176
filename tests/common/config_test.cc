#include "common/config.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The smallest valid config: the required data section only (lines 1-5).
constexpr char kData[] =
    "data:\n"
    "  train_images: /d/train-images.gz\n"
    "  train_labels: /d/train-labels.gz\n"
    "  test_images: /d/test-images.gz\n"
    "  test_labels: /d/test-labels.gz\n";

// Parses kData followed by `extra` (whose first line is line 6).
absl::StatusOr<JobConfig> ParseWithData(const std::string& extra) {
  return ParseJobConfig(absl::StrCat(kData, extra), "local.yaml");
}

// Expects InvalidArgument whose message starts with `position` and contains
// every one of `parts`.
template <typename... Parts>
void ExpectError(const absl::StatusOr<JobConfig>& result, const std::string& position,
                 const Parts&... parts) {
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(StartsWith(position), HasSubstr(parts)...)));
}

TEST(ConsistencyNameTest, NamesEveryMode) {
  EXPECT_STREQ(ConsistencyName(Consistency::kBsp), "bsp");
  EXPECT_STREQ(ConsistencyName(Consistency::kSsp), "ssp");
  EXPECT_STREQ(ConsistencyName(Consistency::kAsp), "asp");
}

TEST(ParseJobConfigTest, FullExampleParsesEveryKey) {
  const std::string text = R"(# A complete config.
job:
  name: mnist-asp
  consistency: asp
  epochs: 3
  batch_size: 128
  progress_every_steps: 10
  seed: 18446744073709551615
model:
  type: mlp
  layers: [784, 512, 10]
  activation: tanh
optimizer:
  type: momentum
  learning_rate: 0.05
  momentum: 0.5
  beta1: 0.8
  beta2: 0.99
  epsilon: 1e-6
  weight_decay: 1e-4
data:
  format: idx
  train_images: /data/mnist/train-images-idx3-ubyte.gz
  train_labels: /data/mnist/train-labels-idx1-ubyte.gz
  test_images: /data/mnist/t10k-images-idx3-ubyte.gz
  test_labels: /data/mnist/t10k-labels-idx1-ubyte.gz
  task_records: 1000
  train_limit: 6000
cluster:
  transport: inproc
  slice_bytes: 1048576
  heartbeat_interval_ms: 200
  dead_timeout_ms: 2000
  task_lease_timeout_ms: 30000
  request_timeout_ms: 10000
  ports:
    master: 9000
    master_http: 9001
    pserver: 9100
    pserver_data: 9200
    pserver_http: 9300
    worker_http: 0
  rdma:
    device: mlx5_1
    port: 2
    gid_index: 3
)";
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseJobConfig(text, "full.yaml"));
  EXPECT_EQ(c.source, "");
  EXPECT_EQ(c.job.name, "mnist-asp");
  EXPECT_EQ(c.job.consistency, Consistency::kAsp);
  EXPECT_EQ(c.job.epochs, 3);
  EXPECT_EQ(c.job.batch_size, 128);
  EXPECT_EQ(c.job.progress_every_steps, 10);
  EXPECT_EQ(c.job.seed, UINT64_MAX);
  EXPECT_EQ(c.model.type, "mlp");
  EXPECT_THAT(c.model.layers, ElementsAre(784, 512, 10));
  EXPECT_EQ(c.model.activation, "tanh");
  EXPECT_EQ(c.optimizer.type, "momentum");
  EXPECT_DOUBLE_EQ(c.optimizer.learning_rate, 0.05);
  EXPECT_DOUBLE_EQ(c.optimizer.momentum, 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.optimizer.epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 1e-4);
  EXPECT_EQ(c.data.format, "idx");
  EXPECT_EQ(c.data.train_images, "/data/mnist/train-images-idx3-ubyte.gz");
  EXPECT_EQ(c.data.train_labels, "/data/mnist/train-labels-idx1-ubyte.gz");
  EXPECT_EQ(c.data.test_images, "/data/mnist/t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(c.data.test_labels, "/data/mnist/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(c.data.task_records, 1000);
  EXPECT_EQ(c.data.train_limit, 6000);
  EXPECT_EQ(c.cluster.transport, "inproc");
  EXPECT_EQ(c.cluster.slice_bytes, 1048576);
  EXPECT_EQ(c.cluster.heartbeat_interval_ms, 200);
  EXPECT_EQ(c.cluster.dead_timeout_ms, 2000);
  EXPECT_EQ(c.cluster.task_lease_timeout_ms, 30000);
  EXPECT_EQ(c.cluster.request_timeout_ms, 10000);
  EXPECT_EQ(c.cluster.ports.master, 9000);
  EXPECT_EQ(c.cluster.ports.master_http, 9001);
  EXPECT_EQ(c.cluster.ports.pserver, 9100);
  EXPECT_EQ(c.cluster.ports.pserver_data, 9200);
  EXPECT_EQ(c.cluster.ports.pserver_http, 9300);
  EXPECT_EQ(c.cluster.ports.worker_http, 0);
  EXPECT_EQ(c.cluster.rdma.device, "mlx5_1");
  EXPECT_EQ(c.cluster.rdma.port, 2);
  EXPECT_EQ(c.cluster.rdma.gid_index, 3);
}

TEST(ParseJobConfigTest, DataOnlyGetsAllDefaults) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseWithData(""));
  const JobConfig d;  // the header's defaults
  EXPECT_EQ(c.job.name, d.job.name);
  EXPECT_EQ(c.job.consistency, Consistency::kBsp);
  EXPECT_EQ(c.job.epochs, 1);
  EXPECT_EQ(c.job.batch_size, 64);
  EXPECT_EQ(c.job.progress_every_steps, 50);
  EXPECT_EQ(c.job.seed, 1u);
  EXPECT_EQ(c.model.type, "mlp");
  EXPECT_THAT(c.model.layers, ElementsAre(784, 256, 128, 10));
  EXPECT_EQ(c.model.activation, "relu");
  EXPECT_EQ(c.optimizer.type, "adam");
  EXPECT_DOUBLE_EQ(c.optimizer.learning_rate, 0.001);
  EXPECT_DOUBLE_EQ(c.optimizer.epsilon, 1e-8);
  EXPECT_EQ(c.data.format, "idx");
  EXPECT_EQ(c.data.train_images, "/d/train-images.gz");
  EXPECT_EQ(c.data.test_labels, "/d/test-labels.gz");
  EXPECT_EQ(c.data.task_records, 2000);
  EXPECT_EQ(c.data.train_limit, 0);
  EXPECT_EQ(c.cluster.transport, "tcp");
  EXPECT_EQ(c.cluster.slice_bytes, 4 << 20);
  EXPECT_EQ(c.cluster.chunk_bytes, 1 << 20);
  EXPECT_EQ(c.cluster.heartbeat_interval_ms, 500);
  EXPECT_EQ(c.cluster.dead_timeout_ms, 5000);
  EXPECT_EQ(c.cluster.ports.master, 7070);
  EXPECT_EQ(c.cluster.ports.worker_http, 7400);
}

TEST(ParseJobConfigTest, PartialSectionKeepsOtherDefaults) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseWithData("job:\n  epochs: 7\n"
                                                         "cluster:\n  ports:\n    master: 1234\n"
                                                         "model:\n"));  // empty section is allowed
  EXPECT_EQ(c.job.epochs, 7);
  EXPECT_EQ(c.job.batch_size, 64);
  EXPECT_EQ(c.cluster.ports.master, 1234);
  EXPECT_EQ(c.cluster.ports.master_http, 7071);
  EXPECT_EQ(c.cluster.transport, "tcp");
  EXPECT_THAT(c.model.layers, ElementsAre(784, 256, 128, 10));
}

TEST(ParseJobConfigTest, DoubleFieldAcceptsInteger) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseWithData("optimizer:\n  learning_rate: 1\n"));
  EXPECT_DOUBLE_EQ(c.optimizer.learning_rate, 1.0);
}

TEST(ParseJobConfigTest, QuotedStringsAreStrings) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseWithData("job:\n  name: \"run #1: a\"\n"));
  EXPECT_EQ(c.job.name, "run #1: a");
}

TEST(ParseJobConfigTest, BspConsistency) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseWithData("job:\n  consistency: bsp\n"));
  EXPECT_EQ(c.job.consistency, Consistency::kBsp);
}

TEST(ParseJobConfigTest, SspConsistencyAndItsStaleness) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c,
                              ParseWithData("job:\n  consistency: ssp\n  staleness: 5\n"));
  EXPECT_EQ(c.job.consistency, Consistency::kSsp);
  EXPECT_EQ(c.job.staleness, 5);
  STRATA_ASSERT_OK_AND_ASSIGN(c, ParseWithData("job:\n  consistency: ssp\n"));
  EXPECT_EQ(c.job.staleness, 3);
}

// --- YAML syntax -----------------------------------------------------------

TEST(ParseJobConfigTest, SyntaxErrorHasOneBasedLineAndColumn) {
  // Line 2, column 8 (0-based 1:7) is the stray ':' after "foo".
  ExpectError(ParseJobConfig("job:\n  name: foo: bar\n", "bad.yaml"),
              "bad.yaml:2:", "invalid YAML");
  ExpectError(ParseJobConfig("model:\n  layers: [784, 10\n", "bad.yaml"),
              "bad.yaml:3:1: ", "invalid YAML");
}

TEST(ParseJobConfigTest, MultipleDocumentsRejected) {
  ExpectError(ParseWithData("---\njob:\n  epochs: 2\n"), "local.yaml:7:1: ", "one YAML document");
}

// --- structure ---------------------------------------------------------------

TEST(ParseJobConfigTest, UnknownTopLevelKeyNamesKeyAndChoices) {
  ExpectError(ParseWithData("\noptimzer:\n  type: sgd\n"), "local.yaml:7:1: ",
              "unknown key 'optimzer' (expected one of: job, model, "
              "optimizer, sparse, data, cluster, checkpoint, worker, s3, elastic, security)");
}

TEST(ParseJobConfigTest, SecurityIsMtlsUnlessTheConfigSaysPlaintext) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig def, ParseWithData(""));
  EXPECT_EQ(def.security.mode, "mtls");
  EXPECT_EQ(def.security.tls_dir, "/etc/strata/tls");
  EXPECT_EQ(def.security.token_file, "");
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c,
                              ParseWithData("security:\n  mode: mtls\n  tls_dir: /srv/tls\n"
                                            "  token_file: /srv/tokens\n  refresh_seconds: 5\n"
                                            "  encrypt_data_plane: true\n"));
  EXPECT_EQ(c.security.mode, "mtls");
  EXPECT_EQ(c.security.tls_dir, "/srv/tls");
  EXPECT_EQ(c.security.token_file, "/srv/tokens");
  EXPECT_EQ(c.security.refresh_seconds, 5);
  EXPECT_TRUE(c.security.encrypt_data_plane);
  EXPECT_FALSE(def.security.encrypt_data_plane);
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig plain, ParseWithData("security:\n  mode: plaintext\n"));
  EXPECT_EQ(plain.security.mode, "plaintext");
  ExpectError(ParseWithData("security:\n  mode: plaintext\n  encrypt_data_plane: true\n"),
              "local.yaml:8:23: ", "security.encrypt_data_plane: needs security.mode mtls");
  ExpectError(ParseWithData("security:\n  mode: none\n"), "local.yaml:7:9: ", "security.mode");
  ExpectError(ParseWithData("security:\n  refresh_seconds: 0\n"),
              "local.yaml:7:20: ", "security.refresh_seconds");
  ExpectError(ParseWithData("security:\n  tls_dir: \"\"\n"),
              "local.yaml:7:12: ", "security.tls_dir");
}

TEST(ParseJobConfigTest, S3SectionNamesTheStoreAndIsCheckedByField) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig off, ParseWithData(""));
  EXPECT_FALSE(off.s3.enabled);
  STRATA_ASSERT_OK_AND_ASSIGN(
      JobConfig c, ParseWithData("checkpoint:\n  dir: s3://ckpt-bucket/job\n"
                                 "s3:\n  endpoint: http://127.0.0.1:7480\n"
                                 "  addressing: virtual\n  credentials_file: /etc/strata/s3.cred\n"
                                 "  part_size_mb: 8\n  parallel_parts: 6\n  retries: 2\n"));
  EXPECT_TRUE(c.s3.enabled);
  EXPECT_EQ(c.s3.endpoint, "http://127.0.0.1:7480");
  EXPECT_EQ(c.s3.addressing, "virtual");
  EXPECT_EQ(c.s3.region, "us-east-1");
  EXPECT_EQ(c.s3.credentials_file, "/etc/strata/s3.cred");
  EXPECT_EQ(c.s3.part_size_mb, 8);
  EXPECT_EQ(c.s3.parallel_parts, 6);
  EXPECT_EQ(c.s3.retries, 2);
  ExpectError(ParseWithData("s3:\n  endpoint: 127.0.0.1:7480\n"), "local.yaml:7:", "s3.endpoint",
              "must start with http:// or https://");
  ExpectError(ParseWithData("s3:\n  endpoint: http://h\n  part_size_mb: 4\n"),
              "local.yaml:8:", "s3.part_size_mb");
  ExpectError(ParseWithData("s3:\n  region: eu\n"),
              "local.yaml:6:", "missing required key 's3.endpoint'");
}

TEST(ParseJobConfigTest, AnObjectStorePathWithoutTheS3SectionNamesTheKey) {
  ExpectError(ParseWithData("checkpoint:\n  dir: s3://ckpt-bucket/job\n"),
              "local.yaml:7:", "checkpoint.dir", "'s3://ckpt-bucket/job' is in an object store",
              "add an s3 section");
  ExpectError(ParseJobConfig("data:\n  train_images: s3://data-bucket/train.gz\n"
                             "  train_labels: /d/l\n  test_images: /d/ti\n  test_labels: /d/tl\n",
                             "x.yaml"),
              "x.yaml:2:", "data.train_images");
}

TEST(ParseJobConfigTest, WorkerSectionChoosesTheDeviceAndIsCheckedByField) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig defaults, ParseWithData(""));
  EXPECT_EQ(defaults.worker.device, "auto");
  EXPECT_EQ(defaults.worker.gpu, 0);
  EXPECT_EQ(defaults.worker.precision, "fp32");
  EXPECT_EQ(defaults.worker.recompute_every, 0);
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig set,
                              ParseWithData("worker:\n  device: cuda\n  gpu: 1\n  precision: bf16\n"
                                            "  recompute_every: 3\n"));
  EXPECT_EQ(set.worker.device, "cuda");
  EXPECT_EQ(set.worker.gpu, 1);
  EXPECT_EQ(set.worker.precision, "bf16");
  EXPECT_EQ(set.worker.recompute_every, 3);
  ExpectError(ParseWithData("worker:\n  device: gpu\n"), "local.yaml:7:11: ", "worker.device",
              "unknown value 'gpu' (allowed: auto, cpu, cuda)");
  ExpectError(ParseWithData("worker:\n  precision: fp16\n"),
              "local.yaml:7:14: ", "worker.precision", "allowed: fp32, tf32, bf16");
  ExpectError(ParseWithData("worker:\n  gpu: -1\n"), "local.yaml:7:8: ", "worker.gpu");
  ExpectError(ParseWithData("worker:\n  recompute_every: -2\n"),
              "local.yaml:7:20: ", "worker.recompute_every");
}

TEST(ParseJobConfigTest, ElasticSection) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig d, ParseWithData(""));
  EXPECT_EQ(d.elastic.min_workers, 1);
  EXPECT_EQ(d.elastic.max_workers, 0);
  EXPECT_EQ(d.elastic.batch, "fixed_global");
  EXPECT_TRUE(d.elastic.provider.empty());
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c,
                              ParseWithData("elastic:\n  min_workers: 2\n  max_workers: 6\n"
                                            "  max_pservers: 3\n  batch: fixed_per_worker\n"
                                            "  provider: [p.sh, '{action}', '{role}', '{count}']\n"
                                            "  scale_timeout_seconds: 30\n  autoscale: true\n"
                                            "  cooldown_seconds: 0\n  queue_per_worker: 2\n"
                                            "  min_gain: 0.25\n  measure_seconds: 3\n"
                                            "  max_moves: 4\n  move_rate_mb_per_s: 8.5\n"));
  EXPECT_EQ(c.elastic.min_workers, 2);
  EXPECT_EQ(c.elastic.max_workers, 6);
  EXPECT_EQ(c.elastic.max_pservers, 3);
  EXPECT_EQ(c.elastic.batch, "fixed_per_worker");
  EXPECT_EQ(c.elastic.provider,
            (std::vector<std::string>{"p.sh", "{action}", "{role}", "{count}"}));
  EXPECT_EQ(c.elastic.scale_timeout_seconds, 30);
  EXPECT_TRUE(c.elastic.autoscale);
  EXPECT_EQ(c.elastic.cooldown_seconds, 0);
  EXPECT_EQ(c.elastic.queue_per_worker, 2);
  EXPECT_DOUBLE_EQ(c.elastic.min_gain, 0.25);
  EXPECT_EQ(c.elastic.measure_seconds, 3);
  EXPECT_EQ(c.elastic.max_moves, 4);
  EXPECT_DOUBLE_EQ(c.elastic.move_rate_mb_per_s, 8.5);
  EXPECT_EQ(d.elastic.max_moves, 2);
  EXPECT_FALSE(d.elastic.autoscale);
  ExpectError(ParseWithData("elastic:\n  min_workers: 3\n  max_workers: 2\n"),
              "local.yaml:8:16: ", "elastic.max_workers", "must be >= elastic.min_workers (3)");
  ExpectError(ParseWithData("elastic:\n  batch: fixed\n"), "local.yaml:7:10: ", "elastic.batch",
              "allowed: fixed_global, fixed_per_worker");
  ExpectError(ParseWithData("elastic:\n  provider: []\n"), "local.yaml:7:13: ", "elastic.provider",
              "is empty");
  ExpectError(ParseWithData("elastic:\n  min_pservers: 0\n"),
              "local.yaml:7:17: ", "elastic.min_pservers");
  ExpectError(ParseWithData("elastic:\n  move_rate_mb_per_s: 0\n"),
              "local.yaml:7:23: ", "elastic.move_rate_mb_per_s");
  ExpectError(ParseWithData("elastic:\n  max_moves: 0\n"),
              "local.yaml:7:14: ", "elastic.max_moves");
  // The autoscaler's pserver signals.
  EXPECT_EQ(d.elastic.pserver_signal_seconds, 30);
  EXPECT_DOUBLE_EQ(d.elastic.pserver_cpu_high, 0.8);
  STRATA_ASSERT_OK_AND_ASSIGN(
      JobConfig p, ParseWithData("elastic:\n  pserver_signal_seconds: 5\n"
                                 "  pserver_queue_high: 10\n  pserver_queue_low: 2\n"
                                 "  pserver_cpu_high: 0.5\n  pserver_cpu_low: 0.1\n"
                                 "  pserver_memory_high: 0.9\n  pserver_memory_low: 0.4\n"));
  EXPECT_EQ(p.elastic.pserver_signal_seconds, 5);
  EXPECT_DOUBLE_EQ(p.elastic.pserver_queue_high, 10);
  EXPECT_DOUBLE_EQ(p.elastic.pserver_queue_low, 2);
  EXPECT_DOUBLE_EQ(p.elastic.pserver_cpu_high, 0.5);
  EXPECT_DOUBLE_EQ(p.elastic.pserver_cpu_low, 0.1);
  EXPECT_DOUBLE_EQ(p.elastic.pserver_memory_high, 0.9);
  EXPECT_DOUBLE_EQ(p.elastic.pserver_memory_low, 0.4);
  ExpectError(ParseWithData("elastic:\n  pserver_cpu_high: 0.3\n  pserver_cpu_low: 0.3\n"),
              "local.yaml:8:20: ", "elastic.pserver_cpu_low",
              "must be < elastic.pserver_cpu_high (0.3), got 0.3");
  ExpectError(ParseWithData("elastic:\n  pserver_queue_high: 0\n"),
              "local.yaml:7:23: ", "elastic.pserver_queue_high", "must be > 0");
  ExpectError(ParseWithData("elastic:\n  pserver_signal_seconds: 0\n"),
              "local.yaml:7:27: ", "elastic.pserver_signal_seconds");
}

TEST(ParseJobConfigTest, ScriptModelTablesResolveInitAndFansAsPyTorch) {
  STRATA_ASSERT_OK_AND_ASSIGN(
      JobConfig c, ParseWithData("model:\n"
                                 "  type: script\n"
                                 "  tables:\n"
                                 "    - {name: conv.weight, shape: [16, 3, 5, 5]}\n"
                                 "    - {name: conv.bias, shape: [16], fan_in: 75}\n"
                                 "    - {name: scale, shape: [4]}\n"
                                 "    - {name: fc.weight, shape: [10, 20], init: glorot_uniform}\n"
                                 "    - {name: item, dim: 8}\n"
                                 "worker:\n  command: [/usr/bin/python3, x.py]\n"));
  const std::vector<TableSpec> t = ModelTables(c.model);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[0].name, "conv.weight");
  EXPECT_EQ(t[0].shape, (std::vector<uint64_t>{16, 3, 5, 5}));
  EXPECT_EQ(t[0].init, "torch_default");
  EXPECT_EQ(t[0].fan_in, 75u);  // in * 5 * 5
  EXPECT_EQ(t[0].fan_out, 400u);
  EXPECT_EQ(t[1].init, "torch_default");
  EXPECT_EQ(t[1].fan_in, 75u);
  EXPECT_EQ(t[2].init, "zeros");  // 1-d without a fan_in
  EXPECT_EQ(t[3].init, "glorot_uniform");
  EXPECT_EQ(t[3].fan_in, 20u);
  EXPECT_EQ(t[3].fan_out, 10u);
  EXPECT_TRUE(t[4].sparse);
  EXPECT_EQ(t[4].dim, 8);
  EXPECT_EQ(t[4].num_elements(), 0u);
}

TEST(ParseJobConfigTest, ScriptModelTablesErrorsNameTheTable) {
  const std::string script = "model:\n  type: script\n  tables:\n";
  const std::string command = "worker:\n  command: [/usr/bin/python3, x.py]\n";
  ExpectError(ParseWithData(script + "    - {name: a, shape: [2, 0]}\n" + command),
              "local.yaml:9:", "model.tables[0].shape[1]", "must be > 0");
  ExpectError(ParseWithData(script + "    - {name: a, shape: [2], dim: 4}\n" + command),
              "local.yaml:9:", "model.tables[0]", "table 'a'", "either shape", "or dim");
  ExpectError(ParseWithData(script + "    - {shape: [2]}\n" + command),
              "local.yaml:9:", "model.tables[0]", "needs a name");
  ExpectError(
      ParseWithData(script + "    - {name: h, shape: [4294967296, 4294967296]}\n" + command),
      "local.yaml:9:", "table 'h'", "more than 2^40 elements");
  ExpectError(
      ParseWithData(script + "    - {name: a, shape: [2]}\n    - {name: a, dim: 2}\n" + command),
      "local.yaml:10:", "model.tables[1]", "table 'a' is also model.tables[0]");
  ExpectError(
      ParseWithData(script + "    - {name: b, shape: [3], init: torch_default}\n" + command),
      "local.yaml:9:", "table 'b'", "init torch_default needs fan_in");
  ExpectError(ParseWithData(script + "    - {name: e, dim: 4, init: glorot_uniform}\n" + command),
              "local.yaml:9:", "table 'e'", "a sparse table's init is zeros");
  ExpectError(ParseWithData(script + "    - {name: a, shap: [2]}\n" + command),
              "local.yaml:9:", "unknown key 'model.tables[0].shap'");
  // Without model.tables the script declares them (docs/python.md).
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig declared,
                              ParseWithData("model:\n  type: script\n" + command));
  EXPECT_TRUE(ScriptDeclaresTables(declared.model));
  EXPECT_TRUE(ModelTables(declared.model).empty());
  ExpectError(ParseWithData(script + "    - {name: a, shape: [2]}\n"),
              "local.yaml:7:", "model.type", "set worker.command");
  ExpectError(ParseWithData("model:\n  tables:\n    - {name: a, shape: [2]}\n"),
              "local.yaml:8:", "model.tables", "is for model.type script");
}

TEST(ParseJobConfigTest, CheckpointSectionIsOffUnlessPresentAndReadsEveryKey) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig off, ParseWithData(""));
  EXPECT_FALSE(off.checkpoint.enabled);
  EXPECT_EQ(off.checkpoint.every_seconds, 900);
  STRATA_ASSERT_OK_AND_ASSIGN(
      JobConfig c, ParseWithData("checkpoint:\n  dir: /ck\n  every_steps: 200\n"
                                 "  every_seconds: 30\n  keep_last: 2\n  incremental: false\n"
                                 "  full_every: 4\n  compression_level: 3\n"
                                 "  grace_seconds: 20\n  timeout_seconds: 100\n"
                                 "  on_finish: false\n"));
  EXPECT_TRUE(c.checkpoint.enabled);
  EXPECT_EQ(c.checkpoint.dir, "/ck");
  EXPECT_EQ(c.checkpoint.every_steps, 200);
  EXPECT_EQ(c.checkpoint.every_seconds, 30);
  EXPECT_EQ(c.checkpoint.keep_last, 2);
  EXPECT_FALSE(c.checkpoint.incremental);
  EXPECT_EQ(c.checkpoint.full_every, 4);
  EXPECT_EQ(c.checkpoint.compression_level, 3);
  EXPECT_EQ(c.checkpoint.grace_seconds, 20);
  EXPECT_EQ(c.checkpoint.timeout_seconds, 100);
  EXPECT_FALSE(c.checkpoint.on_finish);
}

TEST(ParseJobConfigTest, CheckpointSectionErrorsNameTheKey) {
  ExpectError(ParseWithData("checkpoint:\n  every_steps: 10\n"),
              "local.yaml:", "missing required key 'checkpoint.dir'");
  ExpectError(ParseWithData("checkpoint:\n  dir: /ck\n  incremental: maybe\n"),
              "local.yaml:", "checkpoint.incremental", "expected true or false");
  ExpectError(ParseWithData("checkpoint:\n  dir: /ck\n  keep_last: 0\n"),
              "local.yaml:", "checkpoint.keep_last");
  ExpectError(ParseWithData("checkpoint:\n  dir: /ck\n  compression_level: 30\n"),
              "local.yaml:", "checkpoint.compression_level");
}

TEST(ParseJobConfigTest, UnknownNestedKeyNamesFullPath) {
  ExpectError(ParseWithData("cluster:\n  ports:\n    masterr: 1\n"),
              "local.yaml:8:5: ", "unknown key 'cluster.ports.masterr'", "pserver_data");
  ExpectError(ParseWithData("job:\n  epoch: 1\n"), "local.yaml:7:3: ", "unknown key 'job.epoch'",
              "progress_every_steps");
}

TEST(ParseJobConfigTest, DuplicateKeyRejected) {
  ExpectError(ParseWithData("job:\n  epochs: 1\n  epochs: 2\n"),
              "local.yaml:8:3: ", "duplicate key 'job.epochs'", "first given on line 7");
  ExpectError(ParseWithData("data:\n"),
              "local.yaml:6:1: ", "duplicate key 'data' (first given on line 1)");
}

TEST(ParseJobConfigTest, RootMustBeMap) {
  ExpectError(ParseJobConfig("- a\n- b\n", "x.yaml"),
              "x.yaml:1:1: ", "expected a map of sections, got a list");
}

TEST(ParseJobConfigTest, SectionMustBeMap) {
  ExpectError(ParseWithData("job: [1, 2]\n"),
              "local.yaml:6:6: ", "job: expected a map, got a list");
  ExpectError(ParseWithData("cluster:\n  ports: 7000\n"),
              "local.yaml:7:10: ", "cluster.ports: expected a map, got '7000'");
}

// --- types -------------------------------------------------------------------

TEST(ParseJobConfigTest, StringWhereIntExpected) {
  ExpectError(ParseWithData("job:\n  epochs: many\n"),
              "local.yaml:7:11: ", "job.epochs: expected an integer, got 'many'");
}

TEST(ParseJobConfigTest, FractionWhereIntExpected) {
  ExpectError(ParseWithData("job:\n  batch_size: 1.5\n"),
              "local.yaml:7:15: ", "job.batch_size: expected an integer, got '1.5'");
}

TEST(ParseJobConfigTest, OtherNumberSpellingsWhereIntExpected) {
  ExpectError(ParseWithData("job:\n  epochs: 1e3\n"),
              "local.yaml:7:11: ", "job.epochs: expected an integer, got '1e3'");
  ExpectError(ParseWithData("job:\n  epochs: 0x40\n"),
              "local.yaml:7:11: ", "job.epochs: expected an integer, got '0x40'");
}

TEST(ParseJobConfigTest, QuotedNumberWhereIntExpected) {
  ExpectError(ParseWithData("job:\n  epochs: \"5\"\n"),
              "local.yaml:7:11: ", "job.epochs: expected an integer, got quoted string \"5\"");
}

TEST(ParseJobConfigTest, EmptyValueWhereIntExpected) {
  ExpectError(ParseWithData("job:\n  epochs:\n"),
              "local.yaml:7:3: ", "job.epochs: expected an integer, got an empty value");
}

TEST(ParseJobConfigTest, IntOutOfRange) {
  ExpectError(ParseWithData("job:\n  epochs: 99999999999\n"),
              "local.yaml:7:11: ", "job.epochs: integer out of range");
  ExpectError(ParseWithData("job:\n  seed: -1\n"),
              "local.yaml:7:9: ", "job.seed: expected an integer in [0, ");
}

TEST(ParseJobConfigTest, MapWhereListExpected) {
  ExpectError(ParseWithData("model:\n  layers:\n    a: 1\n"),
              "local.yaml:8:5: ", "model.layers: expected a list of integers, got a map");
}

TEST(ParseJobConfigTest, ListElementMustBeInteger) {
  ExpectError(ParseWithData("model:\n  layers: [784, x, 10]\n"),
              "local.yaml:7:17: ", "model.layers[1]: expected an integer, got 'x'");
}

TEST(ParseJobConfigTest, ListWhereNumberExpected) {
  ExpectError(ParseWithData("optimizer:\n  learning_rate: [1]\n"),
              "local.yaml:7:18: ", "optimizer.learning_rate: expected a number, got a list");
  ExpectError(ParseWithData("optimizer:\n  learning_rate: fast\n"),
              "local.yaml:7:18: ", "optimizer.learning_rate: expected a number, got 'fast'");
  ExpectError(ParseWithData("optimizer:\n  learning_rate: nan\n"), "local.yaml:7:18: ",
              "optimizer.learning_rate: expected a "
              "finite number");
}

TEST(ParseJobConfigTest, MapWhereStringExpected) {
  ExpectError(ParseWithData("job:\n  name: {a: 1}\n"),
              "local.yaml:7:9: ", "job.name: expected a string, got a map");
}

// --- values ------------------------------------------------------------------

TEST(ParseJobConfigTest, UnknownConsistency) {
  ExpectError(ParseWithData("job:\n  consistency: foo\n"),
              "local.yaml:7:16: ", "job.consistency: unknown value 'foo' (allowed: bsp, ssp, asp)");
}

TEST(ParseJobConfigTest, BatchSplitBySpeedNotWithAsp) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseWithData("job:\n  batch_split: by_speed\n"));
  EXPECT_EQ(c.job.batch_split, "by_speed");
  ExpectError(ParseWithData("job:\n  consistency: asp\n  batch_split: by_speed\n"),
              "local.yaml:8:16: ", "job.batch_split: by_speed balances the workers' steps");
}

TEST(ParseJobConfigTest, NodeAggregationOnlyForBspMlpAndWideDeep) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseWithData("cluster:\n  aggregation: node\n"));
  EXPECT_EQ(c.cluster.aggregation, "node");
  STRATA_ASSERT_OK_AND_ASSIGN(c, ParseWithData(""));
  EXPECT_EQ(c.cluster.aggregation, "none");
  ExpectError(ParseWithData("cluster:\n  aggregation: rack\n"),
              "local.yaml:7:16: ", "cluster.aggregation");
  ExpectError(ParseWithData("job:\n  consistency: asp\ncluster:\n  aggregation: node\n"),
              "local.yaml:9:16: ", "cluster.aggregation: node sums a host's gradients",
              "bsp only; this job's consistency is asp");
  ExpectError(ParseWithData("job:\n  consistency: ssp\ncluster:\n  aggregation: node\n"),
              "local.yaml:9:16: ", "this job's consistency is ssp");
  // The CTR family merges its sparse rows per key on the host too; a
  // training script does not go through the host's segment.
  STRATA_ASSERT_OK_AND_ASSIGN(c,
                              ParseJobConfig("model:\n  type: wide_deep\ndata:\n  format: criteo\n"
                                             "  train: /d/train.txt\n  test: /d/test.txt\n"
                                             "cluster:\n  aggregation: node\n",
                                             "ctr.yaml"));
  EXPECT_EQ(c.cluster.aggregation, "node");
  ExpectError(ParseWithData("model:\n  type: script\nworker:\n  command: [/usr/bin/python3, t.py]\n"
                            "cluster:\n  aggregation: node\n"),
              "local.yaml:", "cluster.aggregation: node is built for model.type mlp and wide_deep",
              "model.type script runs a training script");
}

TEST(ParseJobConfigTest, DenseSyncAllreduceIsRefusedWhereItIsNotBuiltNamingTheKey) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseWithData(""));
  EXPECT_EQ(c.model.dense_sync, "ps");
  for (const TableSpec& t : ModelTables(c.model)) EXPECT_FALSE(t.allreduce) << t.name;
  STRATA_ASSERT_OK_AND_ASSIGN(c, ParseWithData("model:\n  dense_sync: allreduce\n"));
  EXPECT_EQ(c.model.dense_sync, "allreduce");
  for (const TableSpec& t : ModelTables(c.model)) EXPECT_TRUE(t.allreduce) << t.name;
  ExpectError(ParseWithData("model:\n  dense_sync: ring\n"),
              "local.yaml:7:15: ", "model.dense_sync", "(allowed: ps, allreduce)");
  ExpectError(ParseWithData("job:\n  consistency: asp\nmodel:\n  dense_sync: allreduce\n"),
              "local.yaml:9:15: ", "model.dense_sync: allreduce steps every worker together",
              "this job's consistency is asp");
  // The buckets that overlap the backward pass (0: none).
  EXPECT_EQ(c.model.allreduce_bucket_kib, 256);
  STRATA_ASSERT_OK_AND_ASSIGN(
      c, ParseWithData("model:\n  dense_sync: allreduce\n  allreduce_bucket_kib: 0\n"));
  EXPECT_EQ(c.model.allreduce_bucket_kib, 0);
  ExpectError(ParseWithData("model:\n  dense_sync: allreduce\n  allreduce_bucket_kib: -1\n"),
              "local.yaml:8:25: ", "model.allreduce_bucket_kib", "[0, 1048576]");
  // With node-local aggregation the ring is hierarchical.
  STRATA_ASSERT_OK_AND_ASSIGN(
      c, ParseWithData("model:\n  dense_sync: allreduce\ncluster:\n  aggregation: node\n"));
  EXPECT_EQ(c.cluster.aggregation, "node");
  // (Its tables are checkpointed by the workers' ring.)
  STRATA_ASSERT_OK_AND_ASSIGN(c, ParseWithData("model:\n  dense_sync: allreduce\n"
                                               "checkpoint:\n  dir: /tmp/ckpt\n"));
  EXPECT_TRUE(c.checkpoint.enabled);
  // A CTR model's dense tables by allreduce, its sparse ones on the
  // pservers; a training script's likewise, when model.tables lists them.
  STRATA_ASSERT_OK_AND_ASSIGN(
      c, ParseJobConfig("model:\n  type: wide_deep\n  dense_sync: allreduce\n"
                        "data:\n  format: criteo\n  train: /d/train.txt\n  test: /d/test.txt\n",
                        "ctr.yaml"));
  for (const TableSpec& t : ModelTables(c.model)) EXPECT_EQ(t.allreduce, !t.sparse) << t.name;
  STRATA_ASSERT_OK_AND_ASSIGN(
      c, ParseWithData("model:\n  type: script\n  dense_sync: allreduce\n  tables:\n"
                       "    - {name: w, shape: [3, 2]}\n    - {name: e, dim: 4}\n"
                       "worker:\n  command: [/usr/bin/python3, t.py]\n"));
  const std::vector<TableSpec> script_tables = ModelTables(c.model);
  ASSERT_EQ(script_tables.size(), 2u);
  EXPECT_TRUE(script_tables[0].allreduce);
  EXPECT_FALSE(script_tables[1].allreduce);
  ExpectError(ParseWithData("model:\n  type: script\n  dense_sync: allreduce\n"
                            "worker:\n  command: [/usr/bin/python3, t.py]\n"),
              "local.yaml:8:15: ", "allreduce with model.type script needs the script's tables",
              "model.tables");
}

TEST(ParseJobConfigTest, PipelineStagesAndTheirRefusalsNameTheKey) {
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseWithData(""));
  EXPECT_EQ(c.model.stages, 1);
  EXPECT_EQ(c.model.micro_batches, 0);
  STRATA_ASSERT_OK_AND_ASSIGN(c, ParseWithData("model:\n  stages: 3\n  micro_batches: 6\n"));
  EXPECT_EQ(c.model.stages, 3);
  EXPECT_EQ(c.model.micro_batches, 6);
  // The default model has 3 layers.
  ExpectError(ParseWithData("model:\n  stages: 4\n"),
              "local.yaml:7:11: ", "model.stages: 4 stages but model.layers makes 3 layers");
  ExpectError(ParseWithData("model:\n  stages: 0\n"), "local.yaml:7:11: ", "model.stages");
  ExpectError(ParseWithData("job:\n  consistency: asp\nmodel:\n  stages: 2\n"),
              "local.yaml:9:11: ", "model.stages: a pipeline's stages step together (bsp)",
              "consistency is asp");
  ExpectError(ParseWithData("model:\n  stages: 2\n  dense_sync: allreduce\n"), "local.yaml:",
              "model.stages: stages with model.dense_sync allreduce or cluster.aggregation node");
  ExpectError(ParseWithData("model:\n  stages: 2\ncluster:\n  aggregation: node\n"),
              "local.yaml:7:11: ", "are not built yet");
  ExpectError(ParseWithData("job:\n  batch_size: 100000\nmodel:\n  stages: 2\n"
                            "  micro_batches: 70000\n"),
              "local.yaml:10:18: ", "model.micro_batches: 70000 micro-batches: 65536 at most");
  ExpectError(ParseWithData("model:\n  micro_batches: 4\n"), "local.yaml:7:18: ",
              "model.micro_batches: cuts a pipeline's batch (model.stages > 1)");
  ExpectError(ParseWithData("job:\n  batch_size: 4\nmodel:\n  stages: 2\n  micro_batches: 5\n"),
              "local.yaml:10:18: ", "model.micro_batches: 5 micro-batches of a batch of 4");
  ExpectError(
      ParseJobConfig("model:\n  type: wide_deep\n  stages: 2\n"
                     "data:\n  format: criteo\n  train: /d/train.txt\n  test: /d/test.txt\n",
                     "ctr.yaml"),
      "ctr.yaml:3:11: ", "model.stages: pipeline stages are built for model.type mlp");
  // A training script's nn.Sequential: the script cuts it (and refuses
  // more stages than modules), so any count is taken here.
  STRATA_ASSERT_OK_AND_ASSIGN(c, ParseWithData("model:\n  type: script\n  stages: 7\n"
                                               "worker:\n  command: [/usr/bin/python3, t.py]\n"));
  EXPECT_EQ(c.model.stages, 7);
}

TEST(ParseJobConfigTest, StalenessOnlyWithSsp) {
  ExpectError(ParseWithData("job:\n  staleness: 2\n"), "local.yaml:7:14: ",
              "job.staleness: bounds an ssp job's staleness; this job's consistency is bsp "
              "(set job.consistency: ssp)");
  ExpectError(ParseWithData("job:\n  consistency: ssp\n  staleness: -1\n"),
              "local.yaml:8:14: ", "job.staleness:");
}

TEST(ParseJobConfigTest, RdmaTransportAndItsSettings) {
  STRATA_ASSERT_OK_AND_ASSIGN(
      JobConfig c, ParseWithData("cluster:\n  transport: auto\n  rdma:\n    device: rxe0\n"
                                 "    port: 1\n    gid_index: 1\n    recv_slots: 8\n"
                                 "    send_slots: 16\n    slot_kib: 256\n    busy_poll_us: 0\n"));
  EXPECT_EQ(c.cluster.transport, "auto");
  EXPECT_EQ(c.cluster.rdma.device, "rxe0");
  EXPECT_EQ(c.cluster.rdma.port, 1);
  EXPECT_EQ(c.cluster.rdma.gid_index, 1);
  EXPECT_EQ(c.cluster.rdma.recv_slots, 8);
  EXPECT_EQ(c.cluster.rdma.send_slots, 16);
  EXPECT_EQ(c.cluster.rdma.slot_kib, 256);
  EXPECT_EQ(c.cluster.rdma.busy_poll_us, 0);
  ExpectError(ParseWithData("cluster:\n  rdma:\n    recv_slots: 1\n"),
              "local.yaml:8:17: ", "cluster.rdma.recv_slots");
}

TEST(ParseJobConfigTest, EtcdSectionForStandbyMastersAndItsChecks) {
  STRATA_ASSERT_OK_AND_ASSIGN(
      JobConfig c,
      ParseWithData("cluster:\n  etcd:\n    endpoints: [10.0.0.1:2379, http://10.0.0.2:2379/]\n"
                    "    prefix: /jobs\n    lease_seconds: 5\n    request_timeout_ms: 900\n"
                    "    tls: true\n    compact: false\n"));
  EXPECT_THAT(c.cluster.etcd.endpoints, ElementsAre("10.0.0.1:2379", "http://10.0.0.2:2379/"));
  EXPECT_EQ(c.cluster.etcd.prefix, "/jobs");
  EXPECT_EQ(c.cluster.etcd.lease_seconds, 5);
  EXPECT_EQ(c.cluster.etcd.request_timeout_ms, 900);
  EXPECT_TRUE(c.cluster.etcd.tls);
  EXPECT_FALSE(c.cluster.etcd.compact);
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig none, ParseWithData(""));
  EXPECT_TRUE(none.cluster.etcd.endpoints.empty());  // one master, no etcd
  EXPECT_TRUE(none.cluster.etcd.compact);
  ExpectError(ParseWithData("cluster:\n  etcd:\n    prefix: /x\n"),
              "local.yaml:7:3: ", "cluster.etcd.endpoints", "is missing or empty");
  ExpectError(ParseWithData("cluster:\n  etcd:\n    endpoints: [10.0.0.1]\n"),
              "local.yaml:", "cluster.etcd.endpoints", "etcd endpoint '10.0.0.1' is not host:port");
  ExpectError(ParseWithData("cluster:\n  etcd:\n    endpoints: [a:1]\n    lease_seconds: 0\n"),
              "local.yaml:9:", "cluster.etcd.lease_seconds");
  EXPECT_EQ(EtcdEndpointAddress("https://e1:2379/").value(), "e1:2379");
  EXPECT_FALSE(EtcdEndpointAddress("e1:2379/v3").ok());
  EXPECT_FALSE(EtcdEndpointAddress("e1:99999").ok());
}

TEST(ParseJobConfigTest, SparseSectionAndItsChecks) {
  STRATA_ASSERT_OK_AND_ASSIGN(
      JobConfig c,
      ParseWithData("sparse:\n  partitions: 32\n  init:\n    type: uniform\n    scale: 0.05\n"
                    "  optimizer:\n    type: ftrl\n    learning_rate: 0.1\n    l1: 1\n"
                    "    l2: 0.5\n    ftrl_beta: 2\n"
                    "  admission:\n    min_count: 3\n    probability: 0.5\n"
                    "  eviction:\n    idle_updates: 1000\n    capacity_rows: 5000000\n"
                    "  cache:\n    rows: 100000\n    staleness_steps: 4\n"));
  EXPECT_EQ(c.sparse.partitions, 32);
  EXPECT_EQ(c.sparse.init.type, "uniform");
  EXPECT_DOUBLE_EQ(c.sparse.init.scale, 0.05);
  EXPECT_EQ(c.sparse.optimizer.type, "ftrl");
  EXPECT_DOUBLE_EQ(c.sparse.optimizer.l1, 1);
  EXPECT_DOUBLE_EQ(c.sparse.optimizer.l2, 0.5);
  EXPECT_DOUBLE_EQ(c.sparse.optimizer.ftrl_beta, 2);
  EXPECT_EQ(c.sparse.admission.min_count, 3);
  EXPECT_DOUBLE_EQ(c.sparse.admission.probability, 0.5);
  EXPECT_EQ(c.sparse.eviction.idle_updates, 1000u);
  EXPECT_EQ(c.sparse.eviction.capacity_rows, 5000000u);
  EXPECT_EQ(c.sparse.cache.rows, 100000);
  EXPECT_EQ(c.sparse.cache.staleness_steps, 4);
  // Defaults: admitted at first touch, never evicted, no cache.
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig d, ParseWithData(""));
  EXPECT_EQ(d.sparse.optimizer.type, "adagrad");
  EXPECT_EQ(d.sparse.admission.min_count, 1);
  EXPECT_EQ(d.sparse.eviction.capacity_rows, 0u);
  EXPECT_EQ(d.sparse.cache.rows, 0);
  ExpectError(ParseWithData("sparse:\n  admission:\n    probability: 0\n"),
              "local.yaml:8:18: ", "sparse.admission.probability: must be in (0, 1]");
  ExpectError(
      ParseWithData("sparse:\n  optimizer:\n    type: momentum\n"), "local.yaml:8:11: ",
      "sparse.optimizer.type: unknown value 'momentum' (allowed: sgd, adagrad, adam, ftrl)");
  ExpectError(ParseWithData("sparse:\n  partitions: 0\n"),
              "local.yaml:7:15: ", "sparse.partitions: must be in [1, 65536]");
  ExpectError(ParseWithData("sparse:\n  init:\n    type: glorot_uniform\n"),
              "local.yaml:8:11: ", "sparse.init.type");
}

TEST(ParseJobConfigTest, WideDeepOnCriteoData) {
  const std::string ctr =
      "model:\n  type: wide_deep\n  embedding_dim: 4\n  hidden: [32, 16]\n"
      "data:\n  format: criteo\n  train: /d/train.txt\n  test: /d/test.txt\n"
      "  planted: /d/planted.json\n  bad_lines: skip\n"
      "  generate:\n    out_dir: /d\n    train_rows: 1000\n    test_rows: 100\n    seed: 9\n";
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, ParseJobConfig(ctr, "ctr.yaml"));
  EXPECT_EQ(c.model.type, "wide_deep");
  EXPECT_EQ(c.model.embedding_dim, 4);
  EXPECT_EQ(c.model.hidden, (std::vector<int>{32, 16}));
  EXPECT_EQ(c.data.format, "criteo");
  EXPECT_EQ(c.data.train, "/d/train.txt");
  EXPECT_EQ(c.data.planted, "/d/planted.json");
  EXPECT_EQ(c.data.bad_lines, "skip");
  EXPECT_TRUE(c.data.generate.enabled);
  EXPECT_EQ(c.data.generate.out_dir, "/d");
  EXPECT_EQ(c.data.generate.train_rows, 1000);
  EXPECT_EQ(c.data.generate.seed, 9u);
  EXPECT_THAT(ParseJobConfig("model:\n  type: wide_deep\ndata:\n  format: criteo\n"
                             "  test: /d/test.txt\n",
                             "ctr.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("missing required key 'data.train' (data.format criteo)")));
  // A model must read the data's format.
  EXPECT_THAT(ParseJobConfig("model:\n  type: mlp\ndata:\n  format: criteo\n"
                             "  train: /t\n  test: /t\n",
                             "ctr.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(StartsWith("ctr.yaml:2:9: model.type"),
                             HasSubstr("mlp reads idx, wide_deep reads criteo"))));
  EXPECT_THAT(ParseJobConfig("data:\n  format: criteo\n  train: /t\n  test: /t\n"
                             "  generate:\n    seed: 3\n",
                             "ctr.yaml"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("missing required key 'data.generate.out_dir'")));
  EXPECT_THAT(
      ParseJobConfig(std::string("model:\n  type: wide_deep\n  hidden: [0]\n") + kData, "ctr.yaml"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.hidden[0]")));
}

TEST(ParseJobConfigTest, UnknownEnumsNameAllowedValues) {
  ExpectError(ParseWithData("model:\n  type: cnn\n"), "local.yaml:7:9: ",
              "model.type: unknown value 'cnn' (allowed: mlp, wide_deep, script)");
  ExpectError(ParseWithData("model:\n  activation: gelu\n"), "local.yaml:7:15: ",
              "model.activation: unknown value 'gelu' (allowed: relu, tanh, "
              "sigmoid)");
  ExpectError(ParseWithData("optimizer:\n  type: adagrad\n"), "local.yaml:7:9: ",
              "optimizer.type: unknown value 'adagrad' (allowed: sgd, "
              "momentum, adam)");
  ExpectError(ParseWithData("cluster:\n  transport: verbs\n"), "local.yaml:7:14: ",
              "cluster.transport: unknown value 'verbs' (allowed: tcp, rdma, auto, inproc)");
  ExpectError(ParseWithData("cluster:\n  rdma:\n    slot_kib: 2\n"),
              "local.yaml:8:15: ", "cluster.rdma.slot_kib");
  ExpectError(ParseJobConfig(absl::StrCat(kData, "  format: csv\n"), "f.yaml"),
              "f.yaml:6:11: ", "data.format: unknown value 'csv' (allowed: idx, criteo)");
}

TEST(ParseJobConfigTest, NonPositiveIntegers) {
  ExpectError(ParseWithData("job:\n  epochs: -2\n"),
              "local.yaml:7:11: ", "job.epochs: must be > 0, got -2");
  ExpectError(ParseWithData("job:\n  progress_every_steps: 0\n"),
              "local.yaml:7:25: ", "job.progress_every_steps: must be > 0");
  ExpectError(ParseWithData("cluster:\n  request_timeout_ms: 0\n"),
              "local.yaml:7:23: ", "cluster.request_timeout_ms: must be > 0");
  ExpectError(ParseJobConfig(absl::StrCat(kData, "  task_records: 0\n"), "f"),
              "f:6:17: ", "data.task_records: must be > 0, got 0");
  ExpectError(ParseJobConfig(absl::StrCat(kData, "  train_limit: -1\n"), "f"),
              "f:6:16: ", "data.train_limit: must be >= 0, got -1");
}

TEST(ParseJobConfigTest, PortOutOfRange) {
  ExpectError(ParseWithData("cluster:\n  ports:\n    pserver_data: 70000\n"),
              "local.yaml:8:19: ", "cluster.ports.pserver_data: must be in [0, 65535], got 70000");
  ExpectError(ParseWithData("cluster:\n  ports:\n    master: -1\n"),
              "local.yaml:8:13: ", "cluster.ports.master: must be in [0, 65535]");
}

TEST(ParseJobConfigTest, OptimizerRanges) {
  ExpectError(ParseWithData("optimizer:\n  learning_rate: 0\n"),
              "local.yaml:7:18: ", "optimizer.learning_rate: must be > 0, got 0");
  ExpectError(ParseWithData("optimizer:\n  momentum: 1.0\n"),
              "local.yaml:7:13: ", "optimizer.momentum: must be in [0, 1), got 1");
  ExpectError(ParseWithData("optimizer:\n  beta2: -0.5\n"),
              "local.yaml:7:10: ", "optimizer.beta2: must be in [0, 1), got -0.5");
  ExpectError(ParseWithData("optimizer:\n  epsilon: 0\n"),
              "local.yaml:7:12: ", "optimizer.epsilon: must be > 0");
  ExpectError(ParseWithData("optimizer:\n  weight_decay: -0.1\n"),
              "local.yaml:7:17: ", "optimizer.weight_decay: must be >= 0");
}

TEST(ParseJobConfigTest, LayersNeedTwoPositiveEntries) {
  ExpectError(ParseWithData("model:\n  layers: [784]\n"),
              "local.yaml:7:11: ", "model.layers: needs at least 2 entries", "got 1");
  ExpectError(ParseWithData("model:\n  layers: [784, 0, 10]\n"),
              "local.yaml:7:17: ", "model.layers[1]: must be > 0, got 0");
}

TEST(ParseJobConfigTest, SliceBytesAtLeastFour) {
  ExpectError(ParseWithData("cluster:\n  slice_bytes: 3\n"),
              "local.yaml:7:16: ", "cluster.slice_bytes: must be >= 4, got 3");
}

TEST(ParseJobConfigTest, ChunkBytesAreWholeFloatsAndFewEnoughChunks) {
  ExpectError(ParseWithData("cluster:\n  chunk_bytes: 6\n"), "local.yaml:7:16: ",
              "cluster.chunk_bytes: must be a multiple of 4 (whole floats), got 6");
  ExpectError(ParseWithData("cluster:\n  chunk_bytes: -4\n"),
              "local.yaml:7:16: ", "cluster.chunk_bytes: must be >= 0, got -4");
  // 4 MiB slices in 4-byte chunks: a million chunks.
  ExpectError(ParseWithData("cluster:\n  chunk_bytes: 4\n"), "local.yaml:7:16: ",
              "cluster.chunk_bytes: 4 cuts a slice of cluster.slice_bytes 4194304 into 1048576 "
              "chunks; at most 65536 are allowed");
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig off,
                              ParseWithData("cluster:\n  chunk_bytes: 0\n  slice_bytes: 64\n"));
  EXPECT_EQ(off.cluster.chunk_bytes, 0);
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig one_float,
                              ParseWithData("cluster:\n  chunk_bytes: 4\n  slice_bytes: 64\n"));
  EXPECT_EQ(one_float.cluster.chunk_bytes, 4);
}

TEST(ParseJobConfigTest, WorkerCommandIsAListOfStrings) {
  STRATA_ASSERT_OK_AND_ASSIGN(
      JobConfig c,
      ParseWithData("worker:\n  command: [/usr/bin/python3, examples/torch/x.py, --flag]\n"));
  EXPECT_EQ(c.worker.command,
            (std::vector<std::string>{"/usr/bin/python3", "examples/torch/x.py", "--flag"}));
  ExpectError(ParseWithData("worker:\n  command: python3 x.py\n"), "local.yaml:7:12: ",
              "worker.command: expected a list of strings, got 'python3 x.py'");
  ExpectError(ParseWithData("worker:\n  command: [python3, [x]]\n"), "",
              "worker.command[1]: expected a non-empty string");
}

TEST(ParseJobConfigTest, DeadTimeoutMustExceedHeartbeat) {
  ExpectError(ParseWithData("cluster:\n  dead_timeout_ms: 500\n"), "local.yaml:7:20: ",
              "cluster.dead_timeout_ms: must be > "
              "cluster.heartbeat_interval_ms (500), got 500");
  // Only the heartbeat set: the error points at it.
  ExpectError(ParseWithData("cluster:\n  heartbeat_interval_ms: 6000\n"), "local.yaml:7:26: ",
              "cluster.dead_timeout_ms: must be > "
              "cluster.heartbeat_interval_ms (6000)");
}

TEST(ParseJobConfigTest, EmptyNameRejected) {
  ExpectError(ParseWithData("job:\n  name: \"\"\n"),
              "local.yaml:7:9: ", "job.name: must not be empty");
}

// --- required keys
// -------------------------------------------------------------

TEST(ParseJobConfigTest, MissingDataSection) {
  ExpectError(ParseJobConfig("job:\n  epochs: 1\n", "nodata.yaml"),
              "nodata.yaml:1:1: ", "missing required section 'data'");
  ExpectError(ParseJobConfig("", "empty.yaml"),
              "empty.yaml:1:1: ", "missing required section 'data'");
  ExpectError(ParseJobConfig("# only a comment\n", "c.yaml"),
              "c.yaml:1:1: ", "missing required section 'data'");
}

TEST(ParseJobConfigTest, MissingDataPathNamesKey) {
  ExpectError(ParseJobConfig("job:\n  epochs: 1\ndata:\n"
                             "  train_images: a\n  train_labels: b\n"
                             "  test_images: c\n",
                             "m.yaml"),
              "m.yaml:3:1: ", "missing required key 'data.test_labels'");
  ExpectError(ParseJobConfig("data:\n  format: idx\n", "m.yaml"),
              "m.yaml:1:1: ", "missing required key 'data.train_images'");
}

TEST(ParseJobConfigTest, EmptyDataPathRejected) {
  ExpectError(ParseJobConfig("data:\n  train_images: ''\n", "m.yaml"),
              "m.yaml:2:17: ", "data.train_images: must not be empty");
}

// --- files
// -----------------------------------------------------------------------

TEST(LoadJobConfigTest, MissingFileIsNotFoundNamingPath) {
  const std::string path = ::testing::TempDir() + "/no-such-config.yaml";
  EXPECT_THAT(LoadJobConfig(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(LoadJobConfigTest, DirectoryIsInvalidArgument) {
  EXPECT_THAT(LoadJobConfig(::testing::TempDir()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(::testing::TempDir())));
}

TEST(LoadJobConfigTest, ReadsFileAndSetsSource) {
  const std::string path = ::testing::TempDir() + "/config_test_ok.yaml";
  {
    std::ofstream out(path);
    out << kData << "job:\n  epochs: 4\n";
  }
  STRATA_ASSERT_OK_AND_ASSIGN(JobConfig c, LoadJobConfig(path));
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.job.epochs, 4);
  std::remove(path.c_str());
}

TEST(LoadJobConfigTest, ErrorsNameThePath) {
  const std::string path = ::testing::TempDir() + "/config_test_bad.yaml";
  {
    std::ofstream out(path);
    out << kData << "job:\n  epochs: 0\n";
  }
  EXPECT_THAT(LoadJobConfig(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                            StartsWith(path + ":7:11: job.epochs: must be > 0")));
  std::remove(path.c_str());
}

TEST(CheckClusterSizeTest, PipelineStagesNeedWholeGroupsOfWorkers) {
  JobConfig c;
  c.source = "job.yaml";
  c.model.stages = 2;
  EXPECT_THAT(CheckClusterSize(c, 1, 1).message(),
              HasSubstr("job.yaml: model.stages is 2; the job starts with 1 workers, which cannot "
                        "hold every stage"));
  EXPECT_THAT(CheckClusterSize(c, 1, 3).message(), HasSubstr("do not make whole groups"));
  EXPECT_TRUE(CheckClusterSize(c, 1, 2).ok());
  EXPECT_TRUE(CheckClusterSize(c, 1, 4).ok());
}

TEST(CheckClusterSizeTest, NeedsOneOfEachAndMorePServersThanReplicas) {
  JobConfig c;
  c.source = "job.yaml";
  EXPECT_TRUE(CheckClusterSize(c, 1, 1).ok());
  EXPECT_THAT(CheckClusterSize(c, 0, 1).message(),
              HasSubstr("at least one pserver and one worker"));
  EXPECT_FALSE(CheckClusterSize(c, 1, 0).ok());
  c.cluster.replication = 2;
  EXPECT_THAT(CheckClusterSize(c, 2, 4).message(),
              HasSubstr("job.yaml: cluster.replication 2 needs at least 3 pservers; the cluster "
                        "has 2"));
  EXPECT_TRUE(CheckClusterSize(c, 3, 1).ok());
  // A job that grows its pservers gets its backups as they join.
  c.elastic.max_pservers = 3;
  EXPECT_TRUE(CheckClusterSize(c, 1, 1).ok());
  c.elastic.max_pservers = 2;
  EXPECT_THAT(CheckClusterSize(c, 1, 1).message(),
              HasSubstr("the cluster has 1 and elastic.max_pservers is 2"));
  c.elastic.max_pservers = 0;
  c.cluster.replication = 0;
  c.elastic.min_workers = 2;
  c.elastic.max_pservers = 2;
  EXPECT_THAT(CheckClusterSize(c, 2, 1).message(),
              HasSubstr("elastic.min_workers is 2; the job starts with 1 workers"));
  EXPECT_THAT(CheckClusterSize(c, 3, 2).message(),
              HasSubstr("elastic.max_pservers is 2; the job starts with 3 pservers"));
}

}  // namespace
}  // namespace strata
