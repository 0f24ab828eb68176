// Writes the generated seeds of the fuzz corpora with the code's own
// writers: frames (EncodeFrameHeader), message bodies (pushes, pulls, a
// primary's replication records, rdma hellos), checkpoint manifests and
// partition files (checkpoint_seed.h, WritePartitionFile of partitions
// that trained a little), IDX files and Criteo lines, plain and gzipped.
// The config and host file seeds are copies of conf/ and hand-written
// (tests/fuzz/README.md).
//
//   build/tests/fuzz_make_seed_corpus tests/fuzz/corpus
//
// Writes only files named seed-*; the same bytes on every run (the
// partitions' proto maps hold one sender each, so their order is fixed).
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/initializer.h"
#include "common/optimizer.h"
#include "common/row_optimizer.h"
#include "glog/logging.h"
#include "proto/checkpoint.pb.h"
#include "pserver/partition.h"
#include "pserver/partition_files.h"
#include "pserver/replica_record.h"
#include "pserver/sparse_table.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"
#include "storage/ring_checkpoint.h"
#include "tests/fuzz/checkpoint_seed.h"
#include "transport/data_plane_auth.h"
#include "transport/rdma/rdma_hello.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace strata::fuzz {
namespace {

using pserver::Partition;
using transport::Message;
using transport::MessageHeader;
using transport::MessageType;

std::filesystem::path out_root;

void Write(const std::string& corpus, const std::string& name, const std::string& bytes) {
  const std::filesystem::path dir = out_root / corpus;
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CHECK(out.good()) << "writing " << (dir / name);
}

std::string Gzip(const std::string& raw) {
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  CHECK_EQ(deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
           Z_OK);
  std::string out(deflateBound(&zs, raw.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  CHECK_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

template <typename T>
std::string Raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// One frame as on the wire.
std::string Frame(const MessageHeader& h, const std::string& payload) {
  char head[transport::tcp::kFrameHeaderBytes];
  transport::tcp::EncodeFrameHeader(h, payload.size(), head);
  return std::string(head, sizeof(head)) + payload;
}

MessageHeader Header(MessageType type, uint32_t sender, uint64_t request_id) {
  MessageHeader h;
  h.type = type;
  h.sender_id = sender;
  h.epoch = 3;
  h.request_id = request_id;
  return h;
}

// ---------------------------------------------------------------------------
// Frames and messages. The partitions are those of message_fuzz.cc: dense
// 7 of "fc0.weight" (8 floats, adam), sparse 8 of "embedding" (dim 4,
// adagrad).

std::unique_ptr<Partition> Dense(uint32_t id, const char* optimizer, size_t n) {
  OptimizerSection o;
  o.type = optimizer;
  auto opt = Optimizer::Create(o, n);
  CHECK(opt.ok()) << opt.status();
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = 0.25f * static_cast<float>(i);
  return std::make_unique<Partition>(id, "fc0.weight", std::move(values), std::move(*opt),
                                     Consistency::kBsp);
}

std::unique_ptr<Partition> Sparse(uint32_t id, const char* optimizer, int dim) {
  RowOptimizerSection o;
  o.type = optimizer;
  auto opt = RowOptimizer::Create(o);
  CHECK(opt.ok()) << opt.status();
  auto init = RowInitializer::Create("uniform", 0.1, id, 7);
  CHECK(init.ok()) << init.status();
  pserver::SparseTableOptions so;
  so.dim = dim;
  so.optimizer = std::shared_ptr<const RowOptimizer>(std::move(*opt));
  so.initializer = &*init;
  so.admit_min_count = 2;  // so that checkpoints hold admission counts
  auto rows = pserver::SparseTable::Create(so);
  CHECK(rows.ok()) << rows.status();
  return std::make_unique<Partition>(id, "embedding", std::move(*rows), Consistency::kBsp);
}

class NullResponder : public transport::Responder {
 public:
  void Respond(Message response) override {}
  std::string peer() const override { return "seed:1"; }
};

class KeepSink : public pserver::ReplicaSink {
 public:
  void Send(Partition* partition, uint32_t backup, Message record) override {
    records.push_back(std::move(record));
  }
  std::vector<Message> records;
};

Message Push(uint32_t sender, uint64_t seq, uint64_t step, const std::string& payload,
             bool sparse) {
  Message m;
  m.header = Header(MessageType::kPushRequest, sender, 100 + seq);
  m.header.seq = seq;
  m.header.partition = sparse ? 8 : 7;
  m.header.version = step;
  m.header.count = 16;
  m.header.flags = sparse ? transport::kFlagSparse : 0;
  m.payload = payload;
  return m;
}

Message Pull(uint32_t sender, uint64_t min_version, const std::string& keys, bool sparse) {
  Message m;
  m.header = Header(MessageType::kPullRequest, sender, 200 + min_version);
  m.header.partition = sparse ? 8 : 7;
  m.header.version = min_version;
  m.header.flags = sparse ? transport::kFlagSparse : 0;
  m.payload = keys;
  return m;
}

std::string Frames(const std::vector<Message>& messages) {
  std::string out;
  for (const Message& m : messages) out += Frame(m.header, m.payload);
  return out;
}

void WriteFramesAndMessages() {
  const std::vector<float> grad = {0.5f, -0.25f, 1.0f, 0.0f, 2.0f, -1.0f, 0.125f, 3.0f};
  const std::vector<uint64_t> keys = {1, 42, 0xdeadbeefcafef00d};
  std::vector<float> rows(keys.size() * 4);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.01f * static_cast<float>(i);
  const Message dense_push = Push(1, 1, 0, Raw(grad), false);
  const Message sparse_push = Push(1, 1, 0, Raw(keys) + Raw(rows), true);
  const Message dense_pull = Pull(1, 0, "", false);
  const Message sparse_pull = Pull(2, 0, Raw(keys), true);
  Message ping;
  ping.header = Header(MessageType::kPing, 2, 7);

  // The frame corpus: streams of frames.
  Write("frame", "seed-pull", Frame(dense_pull.header, ""));
  Write("frame", "seed-push", Frame(dense_push.header, dense_push.payload));
  {
    // A header that claims the largest payload allowed, and 10 bytes of it:
    // reading it must cost about what was sent.
    char head[transport::tcp::kFrameHeaderBytes];
    transport::tcp::EncodeFrameHeader(dense_push.header, uint64_t{1} << 31, head);
    Write("frame", "seed-claims-2gib", std::string(head, sizeof(head)) + "0123456789");
  }
  {
    // The data-plane handshake's requests (transport/data_plane_auth.h):
    // node 1 of key epoch 5 says hello, then a proof (that cannot verify:
    // the server's nonce is fresh), then a pull.
    Message hello;
    hello.header = Header(MessageType::kAuthHello, 1, 1);
    hello.header.epoch = 5;
    hello.payload.assign(transport::kAuthNonceBytes, '\x11');
    Message proof;
    proof.header = Header(MessageType::kAuthProof, 1, 2);
    proof.header.epoch = 5;
    proof.payload.assign(transport::kAuthMacBytes, '\x22');
    Write("frame", "seed-auth-handshake", Frames({hello, proof, dense_pull}));
  }
  Write("frame", "seed-pushes-and-pulls",
        Frames({dense_push, sparse_push, dense_pull, sparse_pull, ping}));
  {
    Message error = transport::MakeErrorResponse(dense_push.header, MessageType::kPushResponse,
                                                 absl::FailedPreconditionError("stale"));
    error.header.request_id = 1;
    Message reply = dense_push;
    reply.header.type = MessageType::kPullResponse;
    reply.header.request_id = 3;
    reply.payload.resize(16);  // fits the client's destination
    Write("frame", "seed-responses", Frames({error, reply}));
  }
  {
    transport::rdma::HelloQp qp;
    qp.qpn = 0x1234;
    qp.psn = 7;
    qp.gid[10] = 0xff;
    qp.gid[11] = 0xff;
    qp.lid = 1;
    qp.recv_slots = 32;
    qp.slot_bytes = 64 << 10;
    Message hello;
    hello.header = Header(MessageType::kRdmaHello, 3, 1);
    hello.payload = transport::rdma::ReadyHello(qp).SerializeAsString();
    Message not_ready;
    not_ready.header = Header(MessageType::kRdmaHelloReply, 3, 1);
    not_ready.payload = transport::rdma::NotReadyHello("no device").SerializeAsString();
    Write("frame", "seed-rdma-hello", Frames({hello}));
    Write("message", "seed-rdma-hello", Frames({hello, not_ready}));
  }

  // The message corpus: what partitions receive.
  Write("message", "seed-dense-push", Frames({dense_push}));
  Write("message", "seed-sparse-push", Frames({sparse_push}));
  Write("message", "seed-pulls", Frames({dense_pull, sparse_pull}));
  {
    // A bsp step: both workers of the step set push, then a pull waits for it.
    Message second = Push(2, 1, 0, Raw(grad), false);
    Message second_sparse = Push(2, 1, 0, Raw(keys) + Raw(rows), true);
    Write("message", "seed-bsp-step",
          Frames({dense_push, sparse_push, Pull(1, 1, "", false), second, second_sparse,
                  Pull(1, 1, Raw(keys), true)}));
  }
  // A primary's records to a backup: the copy, then an update.
  for (bool sparse : {false, true}) {
    std::unique_ptr<Partition> primary = sparse ? Sparse(8, "adagrad", 4) : Dense(7, "adam", 8);
    KeepSink sink;
    primary->SetStepWorkers({1});
    primary->SetBackups({9}, &sink);
    primary->Push(sparse ? sparse_push : dense_push, std::make_shared<NullResponder>());
    CHECK_EQ(sink.records.size(), 2u);
    for (Message& m : sink.records) m.header.sender_id = 1;
    Message ack;
    ack.header = Header(MessageType::kReplicateResponse, 9, 0);
    ack.header.seq = 1;
    Write("message", sparse ? "seed-replicate-sparse" : "seed-replicate-dense",
          Frames({sink.records[0], sink.records[1], ack}));
    Write("frame", sparse ? "seed-replicate-sparse" : "seed-replicate-dense",
          Frames({sink.records[1]}));
  }
}

// ---------------------------------------------------------------------------
// Checkpoints.

void WriteCheckpoints() {
  const std::map<std::string, std::string> files = SeedPartitionFiles();
  proto::CheckpointManifest m = SeedManifest(files);
  Write("checkpoint_manifest", "seed-manifest", storage::EncodeManifest(m));
  m.set_precision("bf16");
  Write("checkpoint_manifest", "seed-manifest-export", storage::EncodeManifest(m));
  m = SeedManifest(files);
  m.set_seq(1);
  m.set_incremental(false);
  m.set_base_seq(1);
  m.mutable_partitions()->DeleteSubrange(1, 1);
  Write("checkpoint_manifest", "seed-manifest-dense-only", storage::EncodeManifest(m));
  Write("checkpoint_block", "seed-dense-sgd", files.at(kSeedDenseFile));
  Write("checkpoint_block", "seed-sparse-sgd", files.at(kSeedSparseFile));
  {
    // A ring shard's file (the allreduce tables': storage/ring_checkpoint.h),
    // the whole of a flat space of 6 floats with adam's state.
    std::unique_ptr<storage::FileSystem> ring_fs = storage::NewMemoryFileSystem();
    proto::CheckpointRingShardHeader h;
    h.set_format_version(storage::kCheckpointFormatVersion);
    h.set_job("seed");
    h.set_seq(1);
    h.set_ring_size(1);
    h.set_ring_epoch(2);
    h.set_end(6);
    h.set_total(6);
    h.set_optimizer("adam");
    h.set_state_vectors(2);
    h.set_state_count(true);
    h.set_step(4);
    h.set_updates(3);
    const std::vector<float> values = {0.5f, -1.f, 2.f, 0.25f, 0.f, -3.5f};
    std::string state;
    AppendRaw(&state, uint64_t{3});
    for (int i = 0; i < 12; ++i) AppendRaw(&state, 0.125f * static_cast<float>(i));
    absl::StatusOr<proto::CheckpointFile> f =
        storage::WriteRingShard(ring_fs.get(), "root", h, values, state, 3);
    CHECK(f.ok()) << f.status();
    absl::StatusOr<std::string> bytes = ring_fs->ReadFile(storage::JoinPath("root", f->path()));
    CHECK(bytes.ok()) << bytes.status();
    Write("checkpoint_block", "seed-ring-shard-adam", *bytes);
  }

  // Files of partitions that trained a little, written by the pserver's
  // own code: a dense adam partition, and a sparse one's full image and
  // the delta after it (removed keys, admission counts).
  std::unique_ptr<storage::FileSystem> fs = storage::NewMemoryFileSystem();
  auto snapshot = [](Partition* p, uint64_t seq, uint64_t base_seq) {
    absl::StatusOr<pserver::PartitionSnapshot> snap = absl::UnknownError("none");
    pserver::SnapshotRequest req;
    req.job = "seed";
    req.seq = seq;
    req.base_seq = base_seq;
    p->RequestSnapshot(
        req, [&snap](absl::StatusOr<pserver::PartitionSnapshot> s) { snap = std::move(s); });
    CHECK(snap.ok()) << snap.status();
    return *snap;
  };
  auto write = [&](Partition* p, uint64_t seq, uint64_t base_seq, int level, const char* name) {
    absl::StatusOr<proto::CheckpointFile> f =
        pserver::WritePartitionFile(fs.get(), "root", snapshot(p, seq, base_seq), level);
    CHECK(f.ok()) << f.status();
    absl::StatusOr<std::string> bytes = fs->ReadFile(storage::JoinPath("root", f->path()));
    CHECK(bytes.ok());
    Write("checkpoint_block", name, *bytes);
  };
  std::unique_ptr<Partition> dense = Dense(3, "adam", 6);
  dense->SetStepWorkers({1});
  dense->Push(Push(1, 1, 0, Raw(std::vector<float>(6, 0.5f)), false),
              std::make_shared<NullResponder>());
  write(dense.get(), 1, 0, 3, "seed-dense-adam");

  std::unique_ptr<Partition> sparse = Sparse(4, "adagrad", 2);
  sparse->SetStepWorkers({1});
  const std::vector<uint64_t> keys = {5, 6, 7};
  const std::vector<float> g(keys.size() * 2, 0.25f);
  for (uint64_t seq = 1; seq <= 2; ++seq) {  // admitted at the second sight
    sparse->Push(Push(1, seq, seq - 1, Raw(keys) + Raw(g), true),
                 std::make_shared<NullResponder>());
  }
  write(sparse.get(), 1, 0, 0, "seed-sparse-adagrad-full");
  const std::vector<uint64_t> more = {7, 8};
  sparse->Push(Push(1, 3, 2, Raw(more) + Raw(std::vector<float>(4, -1.f)), true),
               std::make_shared<NullResponder>());
  write(sparse.get(), 2, 1, 1, "seed-sparse-adagrad-delta");
}

// ---------------------------------------------------------------------------
// Datasets.

std::string Idx(const std::vector<uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(d >> shift));
  }
  return out + data;
}

void WriteDatasets() {
  std::string pixels;
  for (int i = 0; i < 2 * 3 * 3; ++i) pixels.push_back(static_cast<char>(i * 14));
  const std::string images = Idx({2, 3, 3}, pixels);
  const std::string labels = Idx({2}, std::string("\x03\x07", 2));
  Write("idx", "seed-images", images);
  Write("idx", "seed-labels", labels);
  Write("idx", "seed-images.gz", Gzip(images));
  Write("idx", "seed-labels.gz", Gzip(labels));
  // RFC 1952 allows several members; the shape probe then reads it whole.
  Write("idx", "seed-images-two-members.gz", Gzip(images.substr(0, 10)) + Gzip(images.substr(10)));

  // Criteo: label, 13 integers, 26 hex categories, TAB-separated.
  auto line = [](int label, int seed, bool missing) {
    std::string s = std::to_string(label);
    for (int j = 0; j < 13; ++j) {
      s += '\t';
      if (!(missing && j % 4 == 1)) s += std::to_string((j * 37 + seed) % 200 - 3);
    }
    static const char kHex[] = "0123456789abcdef";
    for (int c = 0; c < 26; ++c) {
      s += '\t';
      if (missing && c % 5 == 2) continue;
      uint32_t v = static_cast<uint32_t>(c * 2654435761u + seed);
      for (int d = 7; d >= 0; --d) s += kHex[(v >> (4 * d)) & 15];
    }
    return s;
  };
  const std::string lines = line(0, 1, false) + "\n" + line(1, 2, true) + "\n" + line(0, 3, true) +
                            "\r\n\n" + line(1, 4, false) + "\n";
  Write("criteo", "seed-lines", lines);
  Write("criteo", "seed-lines.gz", Gzip(lines));
  Write("criteo", "seed-bad-line", line(0, 5, false) + "\n2\tx\n" + line(1, 6, true));
}

}  // namespace
}  // namespace strata::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s tests/fuzz/corpus\n", argv[0]);
    return 1;
  }
  FLAGS_minloglevel = google::GLOG_ERROR;
  strata::fuzz::out_root = argv[1];
  strata::fuzz::WriteFramesAndMessages();
  strata::fuzz::WriteCheckpoints();
  strata::fuzz::WriteDatasets();
  std::printf("seed corpora written under %s\n", argv[1]);
  return 0;
}
