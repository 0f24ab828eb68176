// Job configuration: one YAML file describes a job and its cluster.
// The schema is documented key by key in docs/config.md. Parsing is strict:
// an unknown key, a wrong type or a bad value is an InvalidArgument error
// whose message starts with "file:line:column: " and names the key path
// (e.g. "conf/local.yaml:12:14: optimizer.learning_rate: must be > 0").
#ifndef STRATA_COMMON_CONFIG_H_
#define STRATA_COMMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

// bsp: every step waits for every live worker's gradient; ssp: updates
// apply on arrival, a worker's pull at clock c waits while the slowest
// live worker is more than job.staleness steps behind; asp: no waits.
enum class Consistency { kBsp, kAsp, kSsp };
const char* ConsistencyName(Consistency c);
// Whether a worker's pulls and pushes carry its step (bsp, ssp; the sparse
// tables' partitions all get a request every step): asp pulls whatever is
// there.
inline bool Stepped(Consistency c) { return c != Consistency::kAsp; }

struct JobSection {
  std::string name = "strata-job";
  Consistency consistency = Consistency::kBsp;
  int staleness = 3;  // ssp: >= 0 steps (0: a pull waits for every push before it)
  // How a step's global batch is split over the workers: "even", or
  // "by_speed" (in proportion to their measured compute speeds).
  std::string batch_split = "even";
  int epochs = 1;                 // > 0
  int batch_size = 64;            // > 0, per worker
  int progress_every_steps = 50;  // > 0
  uint64_t seed = 1;
};

// One table of a model.type "script" model (docs/config.md, model.tables):
// a dense tensor of `shape`, or a sparse table of rows of `dim` floats.
struct ScriptTableSection {
  std::string name;
  std::vector<uint64_t> shape;  // dense: each > 0
  int dim = 0;                  // sparse: > 0 (then shape is empty)
  // Dense: "torch_default" | "glorot_uniform" | "zeros"; sparse: "" (the
  // config's sparse.init) | "zeros".
  std::string init;
  uint64_t fan_in = 0;  // 0: from the shape (PyTorch's convention)
  uint64_t fan_out = 0;
};

struct ModelSection {
  // "mlp" | "wide_deep" | "script" (YAML); "dense" (programs)
  std::string type = "mlp";
  std::vector<int> layers{784, 256, 128, 10};  // mlp: >= 2 entries, each > 0
  std::string activation = "relu";             // relu | tanh | sigmoid
  // wide_deep (docs/sparse.md): the wide part is a sparse logistic
  // regression over the categorical features plus a linear term over the
  // dense ones; the deep part an MLP over [embeddings of every categorical
  // feature, dense features] with these hidden widths and one output.
  int embedding_dim = 8;            // > 0
  std::vector<int> hidden{64, 32};  // each > 0 (may be empty: linear)
  // type "dense" only, set by programs (bench/), not by YAML: one
  // zero-initialised fp32 table "dense<i>" of dense_tables[i] elements each.
  std::vector<uint64_t> dense_tables;
  // type "script": the training script's tables (worker.command), in order;
  // empty: the script declares them (its distribute(), docs/python.md) and
  // the first worker's values initialise them.
  std::vector<ScriptTableSection> tables;
  // How the dense tables are kept in step (docs/architecture.md,
  // "Collectives"): "ps", on the pservers (pushes and pulls); "allreduce",
  // among the workers, by Strata's ring allreduce, the optimizer sharded
  // over them (worker/dense_sync.h). mlp and wide_deep models, bsp jobs.
  std::string dense_sync = "ps";
  // dense_sync allreduce: the dense tables are reduced in buckets of about
  // this many KiB, each as soon as the backward pass has made its
  // gradients (the step overlaps the backward pass; worker/dense_sync.h);
  // 0: all of them at once after the backward pass.
  int allreduce_bucket_kib = 256;
  // Pipeline stages (docs/architecture.md, "Pipeline stages";
  // worker/pipeline.h): an mlp's layers cut into `stages` consecutive
  // groups, each trained by its own worker, a step's batch going through
  // them in micro_batches micro-batches scheduled one-forward-one-backward.
  // 1: no pipeline. micro_batches 0: 4 per stage.
  int stages = 1;         // >= 1, <= the model's layers
  int micro_batches = 0;  // >= 0, <= job.batch_size
};

struct OptimizerSection {
  std::string type = "adam";     // sgd | momentum | adam
  double learning_rate = 0.001;  // > 0
  double momentum = 0.9;         // [0, 1)
  double beta1 = 0.9;            // [0, 1)
  double beta2 = 0.999;          // [0, 1)
  double epsilon = 1e-8;         // > 0
  double weight_decay = 0.0;     // >= 0
};

// Sparse (embedding) tables: uint64 key -> row of `dim` floats, created on
// first touch (docs/config.md, section "sparse").
struct RowOptimizerSection {
  std::string type = "adagrad";      // sgd | adagrad | adam | ftrl
  double learning_rate = 0.05;       // > 0 (ftrl: alpha)
  double initial_accumulator = 0.0;  // adagrad, >= 0
  double beta1 = 0.9;                // adam, [0, 1)
  double beta2 = 0.999;              // adam, [0, 1)
  double epsilon = 1e-8;             // adagrad, adam; > 0
  double weight_decay = 0.0;         // sgd, adagrad, adam; >= 0
  double ftrl_beta = 1.0;            // ftrl, >= 0
  double l1 = 0.0;                   // ftrl, >= 0
  double l2 = 0.0;                   // ftrl, >= 0
};

struct SparseInitSection {
  std::string type = "normal";  // zeros | uniform | normal
  double scale = 0.01;          // uniform: [-scale, scale); normal: stddev; >= 0
};

// A key becomes a row once it was pushed min_count times; from then on each
// push of it is admitted with `probability`.
struct AdmissionSection {
  int min_count = 1;         // >= 1 (1: at first touch)
  double probability = 1.0;  // (0, 1]
};

struct EvictionSection {
  uint64_t idle_updates = 0;   // drop rows not updated for this many of their
                               // partition's updates; 0 = never
  uint64_t capacity_rows = 0;  // per table; beyond it the least frequently
                               // updated rows go first; 0 = unbounded
};

// The worker's cache of pulled rows (hot keys), reused for a bounded number
// of steps instead of being pulled again.
struct RowCacheSection {
  int64_t rows = 0;         // capacity; 0 = no cache
  int staleness_steps = 0;  // a cached row is reused for at most this many
                            // steps after it was pulled, >= 0
};

struct SparseSection {
  int partitions = 16;  // virtual partitions per sparse table, [1, 65536]
  SparseInitSection init;
  RowOptimizerSection optimizer;
  AdmissionSection admission;
  EvictionSection eviction;
  RowCacheSection cache;
};

// What strata-gen-ctr writes when a criteo data set is missing
// (docs/ctr-data.md): `strata-gen-ctr --config` and `launch.sh run` use it.
struct CtrGenerateSection {
  bool enabled = false;         // true when the section is present
  std::string out_dir;          // required: where train.txt etc. go
  int64_t train_rows = 200000;  // > 0
  int64_t test_rows = 50000;    // > 0
  uint64_t seed = 1;
  double zipf = 1.1;           // > 0
  double weight_scale = 0.24;  // >= 0
  int64_t max_vocab = 200000;  // cap of each field's vocabulary, [1, 200000]
};

struct DataSection {
  std::string format = "idx";  // idx (gzip or plain IDX files) | criteo
  std::string train_images;    // idx: required
  std::string train_labels;    // idx: required
  std::string test_images;     // idx: required
  std::string test_labels;     // idx: required
  std::string train;           // criteo: required (text, plain or gzip)
  std::string test;            // criteo: required
  // criteo: a planted.json of strata-gen-ctr; its planted_test_auc and
  // planted_test_logloss go into the job's summary. Optional.
  std::string planted;
  std::string bad_lines = "fail";  // criteo: fail | skip (counted, logged)
  CtrGenerateSection generate;
  int64_t task_records = 2000;  // records per data task, > 0
  int64_t train_limit = 0;      // use only the first N training records; 0 = all
};

struct PortsSection {
  int master = 7070;        // master gRPC
  int master_http = 7071;   // master HTTP (/metrics, /healthz, /status)
  int pserver = 7100;       // pserver gRPC admin port of instance 0; i -> base+i
  int pserver_data = 7200;  // pserver data-plane port of instance 0
  int pserver_http = 7300;  // pserver HTTP port of instance 0
  int worker_http = 7400;   // worker HTTP port of instance 0
};

// RDMA device choice (docs/config.md); empty / 0 / -1 choose automatically.
struct RdmaSection {
  std::string device;  // "mlx5_0", "rxe0"
  int port = 0;        // 1-based
  int gid_index = -1;
  int recv_slots = 32;    // receive slots per connection, [2, 4096]
  int send_slots = 32;    // send slots per connection, [2, 4096]
  int slot_kib = 64;      // bytes per slot / 1024, [4, 16384]
  int busy_poll_us = 50;  // busy polling after the last completion, >= 0
};

// Master high availability (docs/reliability.md, "Master high
// availability"): the masters of a host file that lists several elect a
// leader through a lease in etcd and keep the master's state there. Off
// (one master, its state in --state_dir) while endpoints is empty.
struct EtcdSection {
  // etcd's client URLs, host:port or http(s)://host:port; every member of
  // the etcd cluster, so that losing one is survived.
  std::vector<std::string> endpoints;
  // Keys live under PREFIX/JOB/ (job.name): several jobs share one etcd.
  std::string prefix = "/strata";
  // The leader's lease, >= 1: a dead leader's host is replaced this long
  // after its last renewal, and a cut-off leader stops acting before then.
  int lease_seconds = 3;
  // One etcd request gives up after this, > 0 (then the next endpoint).
  int request_timeout_ms = 2000;
  // mTLS to etcd with the master's certificate (ca.crt, master.crt,
  // master.key of security.tls_dir); etcd must trust that CA. Plain text
  // when false.
  bool tls = false;
  // Compact etcd's history after each snapshot of the job's state (etcd
  // keeps every revision until compacted, and compaction is the whole
  // etcd's). false: an etcd shared with others, compacted by its own
  // --auto-compaction-retention.
  bool compact = true;
};

// An etcd endpoint as gRPC dials it: "host:port" from "host:port",
// "http://host:port" or "https://host:port" (a trailing "/" dropped).
// InvalidArgument naming the endpoint otherwise.
absl::StatusOr<std::string> EtcdEndpointAddress(const std::string& endpoint);

// The most chunks one dense partition is cut into (the chunk index is 16
// bits of the data plane's header flags, docs/wire-protocol.md).
inline constexpr uint32_t kMaxChunksPerPartition = 1u << 16;

struct ClusterSection {
  std::string transport = "tcp";  // tcp | rdma | auto | inproc
  int64_t slice_bytes = 4 << 20;  // max bytes of one dense partition, >= 4
  // The data plane's grain inside a dense partition (docs/performance.md):
  // pushes and pulls go as chunks of this many bytes, each applied and
  // answered on its own as it arrives. A multiple of 4; 0 = whole
  // partitions. At most kMaxChunksPerPartition chunks per slice.
  int64_t chunk_bytes = 1 << 20;
  int heartbeat_interval_ms = 500;     // > 0
  int dead_timeout_ms = 5000;          // > heartbeat_interval_ms
  int task_lease_timeout_ms = 120000;  // > 0
  int request_timeout_ms = 60000;      // data-plane request timeout, > 0
  // The least time a control-plane connection attempt (TCP and the TLS
  // handshake) gets, also the pause between attempts: short, so nodes
  // find a restarted master at once; longer on very slow (emulated) hosts.
  int control_connect_ms = 1000;
  // Backups per partition (docs/reliability.md), >= 0: a primary
  // acknowledges an update once its backups hold it; 0 = a lost partition is
  // restored from the last checkpoint. Needs more pservers than this.
  int replication = 0;
  // Node-local aggregation (docs/architecture.md, "Node-local aggregation"):
  // "node" = the workers of one host sum their gradients in shared memory
  // and one of them pushes the host's sum once per step and shares the
  // pulled parameters; "none" = every worker pushes its own. bsp, dense
  // models (model.type mlp) only.
  std::string aggregation = "none";
  PortsSection ports;
  RdmaSection rdma;
  EtcdSection etcd;
};

// Checkpoints (docs/checkpoint-format.md): on when the section is present.
struct CheckpointSection {
  bool enabled = false;
  std::string dir;            // required: the checkpoint root, seen by every node
  int64_t every_steps = 0;    // >= 0; 0 = not by steps
  int every_seconds = 900;    // >= 0; 0 = not by time
  int keep_last = 3;          // complete checkpoints kept, >= 1
  bool incremental = true;    // write only what changed since the last one
  int full_every = 8;         // a full checkpoint after this many increments, >= 1
  int compression_level = 1;  // zstd level, [0, 19]; 0 = uncompressed
  int grace_seconds = 60;     // SIGTERM: time for the last checkpoint, >= 1
  int timeout_seconds = 600;  // one checkpoint gives up after this, >= 1
  bool on_finish = true;      // a last checkpoint when training ends
};

// The S3-compatible object store (AWS S3, MinIO, Ceph's radosgw) that
// s3://bucket/prefix paths in checkpoint.dir and data.* name
// (docs/storage.md). The keys come from credentials_file or from
// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in each daemon's environment,
// never from this file.
struct S3Section {
  bool enabled = false;  // true when the section is present
  std::string endpoint;  // required: http(s)://host[:port]
  std::string region = "us-east-1";
  std::string addressing = "path";  // path | virtual (bucket.host)
  std::string credentials_file;     // AWS shared-credentials format; "" = environment
  int part_size_mb = 8;             // multipart part size, [5, 5120]
  int parallel_parts = 8;           // parts or ranged reads in flight per file, [1, 64]
  int connect_timeout_ms = 5000;    // > 0
  int timeout_seconds = 30;         // a request that moves nothing for this long fails, >= 1
  int retries = 4;                  // attempts after the first, [0, 20]
};

// Where the workers compute (docs/gpu.md).
struct WorkerSection {
  std::string device = "auto";     // auto (the GPU when there is one) | cpu | cuda
  int gpu = 0;                     // which GPU, >= 0
  std::string precision = "fp32";  // GPU matrix products: fp32 | tf32 | bf16
  // Activation recomputation (MLP): keep every recompute_every-th layer's
  // output in the forward pass and recompute the others in the backward
  // pass; 0 = off, 1 = every layer kept (the same as off).
  int recompute_every = 0;  // >= 0
  // A training script that is the worker instead of the built-in model
  // (docs/python.md): the program and its arguments, e.g.
  // [/usr/bin/python3, examples/torch/fmnist_mlp.py]. strata-worker runs
  // it in its place (exec), with STRATA_CONFIG, STRATA_MASTER,
  // STRATA_INDEX, STRATA_TLS_DIR and PYTHONPATH set. Empty: the built-in model.
  std::vector<std::string> command;
};

// Scaling a running job (docs/operations.md, "Scaling"): how far `strata
// scale` may take it, who starts the daemons it adds, and what the batch
// does when the workers change.
struct ElasticSection {
  int min_workers = 1;   // >= 1
  int max_workers = 0;   // >= min_workers; 0: the host file's room
  int min_pservers = 1;  // >= 1
  int max_pservers = 0;  // >= min_pservers; 0: the host file's room
  // fixed_global: the global batch stays job.batch_size times the workers
  // the job started with, split over the workers there are (so accuracy
  // does not depend on the scale); fixed_per_worker: each worker's batch
  // stays job.batch_size and the global batch follows the workers.
  std::string batch = "fixed_global";
  // The command the master runs to start (action "add") or release
  // (action "remove") daemons, its arguments' {action}, {role} (worker or
  // pserver), {count} and {indices} (comma-separated) replaced; e.g.
  // [scripts/my-provider.sh, "{action}", "{role}", "{count}"]. Empty: the
  // launcher's (launch.sh passes its own), else the operator starts them.
  std::vector<std::string> provider;
  // How long daemons a scale adds have to register (then the scale is
  // given up, an event says so), and the provider command to end.
  int scale_timeout_seconds = 300;  // >= 1
  // The autoscaler (master/autoscaler.h): grows the workers by one while
  // the data-task queue holds queue_per_worker tasks a worker, until one
  // it added raised samples/s (measured over measure_seconds) by less
  // than min_gain of the per-worker average; releases workers idle at the
  // job's tail; one decision per cooldown_seconds.
  bool autoscale = false;
  int cooldown_seconds = 30;  // >= 0
  int queue_per_worker = 4;   // >= 1
  double min_gain = 0.5;      // >= 0
  int measure_seconds = 10;   // >= 1
  // The autoscaler's pservers: one added when a pserver's apply queue
  // (requests waiting for its apply threads), CPU use (a share of the
  // cores it may use) or memory (a share of the most it may use), each
  // averaged over pserver_signal_seconds, is at or over its _high; one
  // removed when every pserver's three have been under their _low that
  // long and the others would stay under the _highs without it.
  double pserver_queue_high = 32;    // > 0
  double pserver_queue_low = 1;      // >= 0, < pserver_queue_high
  double pserver_cpu_high = 0.8;     // > 0
  double pserver_cpu_low = 0.2;      // >= 0, < pserver_cpu_high
  double pserver_memory_high = 0.8;  // > 0
  double pserver_memory_low = 0.3;   // >= 0, < pserver_memory_high
  int pserver_signal_seconds = 30;   // >= 1
  // Live partition migration (a pserver scale, a pserver drained): at most
  // max_moves partitions copied at once, and copies started at no more
  // than move_rate_mb_per_s (MiB of partition a second), so migration
  // takes a bounded share of the pservers' bandwidth.
  int max_moves = 2;               // >= 1
  double move_rate_mb_per_s = 64;  // > 0
};

// Who may talk to the cluster (docs/security.md).
struct SecuritySection {
  // mtls: TLS with client certificates on every gRPC channel, callers
  // checked against the role policy. plaintext: no TLS and no
  // authentication at all, said on every status.
  std::string mode = "mtls";
  // ca.crt and this host's <role>.crt/.key (scripts/gen-certs.sh). Daemons'
  // --tls_dir overrides it.
  std::string tls_dir = "/etc/strata/tls";
  // People's bearer tokens, "name role token" lines (mode 0600); "" = none.
  std::string token_file;
  int refresh_seconds = 60;  // certificate and token files re-read, >= 1
  // mtls only: seal the TCP data plane's frames too (AES-256-GCM after the
  // membership handshake; docs/security.md gives its cost).
  bool encrypt_data_plane = false;
};

struct JobConfig {
  std::string source;  // file the config came from ("" if from a string)
  JobSection job;
  ModelSection model;
  WorkerSection worker;
  OptimizerSection optimizer;
  SparseSection sparse;
  DataSection data;
  ClusterSection cluster;
  CheckpointSection checkpoint;
  S3Section s3;
  SecuritySection security;
  ElasticSection elastic;
};

// Parses YAML text. `filename` is used in error messages only.
absl::StatusOr<JobConfig> ParseJobConfig(const std::string& text, const std::string& filename);

// Reads and parses `path`. A missing or unreadable file is NotFound /
// InvalidArgument naming the path.
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path);

// Whether `config` can run on a cluster of `pservers` and `workers` (the
// host file's, started with the job): at least one of each, more pservers
// than cluster.replication (each partition's backups on other pservers),
// and within elastic's minima and maxima.
// InvalidArgument naming the config and the field otherwise.
absl::Status CheckClusterSize(const JobConfig& config, int pservers, int workers);

// The whole of a local file (a config, a host file): NotFound for a path
// that is not there, InvalidArgument for a directory or a file that cannot
// be read; the error names the path.
absl::StatusOr<std::string> ReadLocalFile(const std::string& path);

}  // namespace strata

#endif  // STRATA_COMMON_CONFIG_H_
