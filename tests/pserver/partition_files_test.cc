// Checkpoints of partitions: snapshots (full, incremental, at a bsp cut),
// their files, and restores that continue bit for bit.
#include "pserver/partition_files.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"
#include "tests/testing/status_matchers.h"
#include "transport/transport.h"

namespace strata::pserver {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;
using transport::Message;
using transport::MessageType;

constexpr uint32_t kId = 3;
constexpr char kRoot[] = "/ckpt";

class NullResponder : public transport::Responder {
 public:
  void Respond(Message) override {}
  std::string peer() const override { return "test:0"; }
};

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

Message Push(uint32_t sender, uint64_t seq, uint64_t step, std::string payload, bool sparse) {
  Message m;
  m.header.type = MessageType::kPushRequest;
  m.header.sender_id = sender;
  m.header.request_id = seq;
  m.header.seq = seq;
  m.header.partition = kId;
  m.header.version = step;
  m.header.count = 2;
  if (sparse) m.header.flags = transport::kFlagSparse;
  m.payload = std::move(payload);
  return m;
}

std::unique_ptr<Partition> Dense(Consistency c, size_t n = 1000) {
  OptimizerSection o;
  o.type = "adam";
  o.learning_rate = 0.01;
  auto opt = Optimizer::Create(o, n);
  CHECK(opt.ok());
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.001f * static_cast<float>(i);
  return std::make_unique<Partition>(kId, "fc0.weight", std::move(v), std::move(*opt), c);
}

std::unique_ptr<Partition> Sparse(Consistency c, uint64_t capacity = 0) {
  RowOptimizerSection o;
  o.type = "adagrad";
  o.learning_rate = 0.1;
  auto opt = RowOptimizer::Create(o);
  CHECK(opt.ok());
  auto init = RowInitializer::Create("normal", 0.1, 1, 7);
  CHECK(init.ok());
  SparseTableOptions so;
  so.dim = 4;
  so.optimizer = std::shared_ptr<const RowOptimizer>(std::move(*opt));
  so.initializer = &*init;
  so.capacity_rows = capacity;
  auto rows = SparseTable::Create(so);
  CHECK(rows.ok());
  return std::make_unique<Partition>(kId, "embedding", std::move(*rows), c);
}

void DensePush(Partition& p, uint32_t sender, uint64_t seq, uint64_t step, float scale) {
  std::vector<float> g(p.length());
  for (size_t i = 0; i < g.size(); ++i) g[i] = scale * std::sin(static_cast<float>(i + seq));
  p.Push(Push(sender, seq, step, Bytes(g.data(), g.size() * 4), false),
         std::make_shared<NullResponder>());
}

void SparsePush(Partition& p, uint32_t sender, uint64_t seq, const std::vector<uint64_t>& keys) {
  std::vector<float> g(keys.size() * 4);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::cos(static_cast<float>(i + seq));
  p.Push(Push(sender, seq, 0, Bytes(keys.data(), keys.size() * 8) + Bytes(g.data(), g.size() * 4),
              true),
         std::make_shared<NullResponder>());
}

std::vector<float> SparseRows(Partition& p, const std::vector<uint64_t>& keys) {
  // The rows as they are (a pull of keys never pushed returns initial
  // values, which both sides agree on too).
  struct Capture : transport::Responder {
    void Respond(Message m) override {
      m.OwnPayload();
      absl::MutexLock l(&mu);
      payload = m.payload;
    }
    std::string peer() const override { return "test:0"; }
    absl::Mutex mu;
    std::string payload;
  };
  auto c = std::make_shared<Capture>();
  Message m;
  m.header.type = MessageType::kPullRequest;
  m.header.partition = kId;
  m.header.flags = transport::kFlagSparse;
  m.payload = Bytes(keys.data(), keys.size() * 8);
  p.Pull(m, c);
  absl::MutexLock l(&c->mu);
  std::vector<float> out(c->payload.size() / 4);
  std::memcpy(out.data(), c->payload.data(), c->payload.size());
  return out;
}

// Takes a snapshot now and returns it.
absl::StatusOr<PartitionSnapshot> Snap(Partition& p, uint64_t seq, uint64_t base) {
  SnapshotRequest r;
  r.job = "test";
  r.seq = seq;
  r.base_seq = base;
  std::optional<absl::StatusOr<PartitionSnapshot>> got;
  p.RequestSnapshot(r, [&got](absl::StatusOr<PartitionSnapshot> s) { got = std::move(s); });
  CHECK(got.has_value());
  return std::move(*got);
}

class PartitionFilesTest : public ::testing::Test {
 protected:
  // Snapshot -> file; the entry chains it onto `entry` like the master does.
  void Checkpoint(Partition& p, uint64_t seq, uint64_t base, proto::CheckpointPartition* entry) {
    auto snap = Snap(p, seq, base);
    ASSERT_THAT(snap.status(), IsOk());
    ASSERT_THAT(fs_->CreateDirs(storage::JoinPath(kRoot, storage::CheckpointDirName(seq))), IsOk());
    entry->set_id(kId);
    if (snap->unchanged) return;
    auto f = WritePartitionFile(fs_.get(), kRoot, *snap, 3);
    ASSERT_THAT(f.status(), IsOk());
    if (f->full()) entry->clear_files();
    *entry->add_files() = *f;
  }
  std::unique_ptr<storage::FileSystem> fs_ = storage::NewMemoryFileSystem();
};

TEST_F(PartitionFilesTest, DenseRestoreIsBitIdenticalAndContinuesExactly) {
  auto a = Dense(Consistency::kAsp);
  for (uint64_t s = 1; s <= 5; ++s) DensePush(*a, 1, s, 0, 0.3f);
  proto::CheckpointPartition entry;
  Checkpoint(*a, 1, 0, &entry);
  ASSERT_EQ(entry.files_size(), 1);
  EXPECT_TRUE(entry.files(0).full());

  auto b = Dense(Consistency::kAsp);
  ASSERT_THAT(LoadPartition(fs_.get(), kRoot, entry, 1, b.get()), IsOk());
  EXPECT_EQ(b->stats().version, a->stats().version);
  auto va = a->ValuesForTesting(), vb = b->ValuesForTesting();
  ASSERT_EQ(va.size(), vb.size());
  EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * 4), 0);
  // Adam's moments and step count came back too: the next updates agree.
  for (uint64_t s = 6; s <= 8; ++s) {
    DensePush(*a, 1, s, 0, -0.2f);
    DensePush(*b, 1, s, 0, -0.2f);
  }
  va = a->ValuesForTesting();
  vb = b->ValuesForTesting();
  EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * 4), 0);
  // A push seen before the checkpoint is still recognised as a duplicate.
  DensePush(*b, 1, 3, 0, 1.f);
  EXPECT_EQ(b->stats().duplicate_pushes, 1u);
}

TEST_F(PartitionFilesTest, UnchangedDensePartitionWritesNothingIncrementally) {
  auto a = Dense(Consistency::kAsp);
  DensePush(*a, 1, 1, 0, 1.f);
  proto::CheckpointPartition entry;
  Checkpoint(*a, 1, 0, &entry);
  auto snap = Snap(*a, 2, 1);
  ASSERT_THAT(snap.status(), IsOk());
  EXPECT_TRUE(snap->unchanged);
  DensePush(*a, 1, 2, 0, 1.f);
  snap = Snap(*a, 3, 2);
  ASSERT_THAT(snap.status(), IsOk());
  EXPECT_FALSE(snap->unchanged);
  EXPECT_TRUE(snap->header.full());  // a dense file is always a full image
}

TEST_F(PartitionFilesTest, SparseIncrementalWritesOnlyChangedRowsAndRestoresExactly) {
  auto a = Sparse(Consistency::kAsp);
  std::vector<uint64_t> all;
  for (uint64_t k = 1; k <= 2000; ++k) all.push_back(k * 7919);
  SparsePush(*a, 1, 1, all);
  proto::CheckpointPartition entry;
  Checkpoint(*a, 1, 0, &entry);
  const uint64_t full_size = entry.files(0).size();
  // Only 50 keys change, 10 new ones appear.
  std::vector<uint64_t> some(all.begin(), all.begin() + 50);
  for (uint64_t k = 1; k <= 10; ++k) some.push_back(k * 104729);
  SparsePush(*a, 1, 2, some);
  Checkpoint(*a, 2, 1, &entry);
  ASSERT_EQ(entry.files_size(), 2);
  EXPECT_FALSE(entry.files(1).full());
  EXPECT_LT(entry.files(1).size() * 10, full_size);

  auto b = Sparse(Consistency::kAsp);
  ASSERT_THAT(LoadPartition(fs_.get(), kRoot, entry, 2, b.get()), IsOk());
  std::vector<uint64_t> keys = all;
  keys.insert(keys.end(), some.begin(), some.end());
  EXPECT_EQ(b->sparse_stats().rows, a->sparse_stats().rows);
  auto ra = SparseRows(*a, keys), rb = SparseRows(*b, keys);
  EXPECT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * 4), 0);
  // Adagrad's accumulators came back: the same push moves both the same.
  SparsePush(*a, 1, 3, some);
  SparsePush(*b, 1, 3, some);
  ra = SparseRows(*a, keys);
  rb = SparseRows(*b, keys);
  EXPECT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * 4), 0);
}

TEST_F(PartitionFilesTest, RowsEvictedBetweenCheckpointsStayDeletedAfterRestore) {
  auto a = Sparse(Consistency::kAsp, /*capacity=*/100);
  std::vector<uint64_t> first;
  for (uint64_t k = 1; k <= 90; ++k) first.push_back(k);
  SparsePush(*a, 1, 1, first);
  proto::CheckpointPartition entry;
  Checkpoint(*a, 1, 0, &entry);
  std::vector<uint64_t> second;
  for (uint64_t k = 1000; k < 1060; ++k) second.push_back(k);  // over capacity: evictions
  SparsePush(*a, 1, 2, second);
  ASSERT_GT(a->sparse_stats().evicted_capacity, 0u);
  Checkpoint(*a, 2, 1, &entry);
  auto b = Sparse(Consistency::kAsp, 100);
  ASSERT_THAT(LoadPartition(fs_.get(), kRoot, entry, 2, b.get()), IsOk());
  EXPECT_EQ(b->sparse_stats().rows, a->sparse_stats().rows);
  std::vector<uint64_t> keys = first;
  keys.insert(keys.end(), second.begin(), second.end());
  auto ra = SparseRows(*a, keys), rb = SparseRows(*b, keys);
  EXPECT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * 4), 0);
}

TEST_F(PartitionFilesTest, IncrementalOverAnotherBaseIsWrittenFull) {
  auto a = Sparse(Consistency::kAsp);
  SparsePush(*a, 1, 1, {1, 2, 3});
  proto::CheckpointPartition entry;
  Checkpoint(*a, 1, 0, &entry);
  // Checkpoint 2 failed elsewhere: 3 is incremental over 1, but this
  // partition's baseline is 2, so it writes a full image.
  ASSERT_THAT(Snap(*a, 2, 1).status(), IsOk());
  auto snap = Snap(*a, 3, 1);
  ASSERT_THAT(snap.status(), IsOk());
  EXPECT_TRUE(snap->header.full());
}

TEST_F(PartitionFilesTest, BspSnapshotWaitsForItsCutAndRefusesOnePassed) {
  auto p = Dense(Consistency::kBsp, 10);
  p->SetStepWorkers({1});
  SnapshotRequest r;
  r.seq = 1;
  r.at_version = true;
  r.version = 2;
  std::optional<absl::StatusOr<PartitionSnapshot>> got;
  p->RequestSnapshot(r, [&got](absl::StatusOr<PartitionSnapshot> s) { got = std::move(s); });
  EXPECT_FALSE(got.has_value());
  DensePush(*p, 1, 1, 0, 1.f);  // step 0 -> version 1
  EXPECT_FALSE(got.has_value());
  DensePush(*p, 1, 2, 1, 1.f);  // version 2: the cut
  ASSERT_TRUE(got.has_value());
  ASSERT_THAT(got->status(), IsOk());
  EXPECT_EQ((*got)->header.version(), 2u);
  DensePush(*p, 1, 3, 2, 1.f);
  // A cut already passed.
  r.seq = 2;
  got.reset();
  p->RequestSnapshot(r, [&got](absl::StatusOr<PartitionSnapshot> s) { got = std::move(s); });
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(got->status(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("past")));
  // One waiting is cancelled.
  r.seq = 3;
  r.version = 10;
  got.reset();
  p->RequestSnapshot(r, [&got](absl::StatusOr<PartitionSnapshot> s) { got = std::move(s); });
  EXPECT_FALSE(got.has_value());
  p->CancelSnapshot(3);
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(got->status(), StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(PartitionFilesTest, CorruptOrForeignFilesAreRefusedNamingThem) {
  auto a = Dense(Consistency::kAsp, 64);
  DensePush(*a, 1, 1, 0, 1.f);
  proto::CheckpointPartition entry;
  Checkpoint(*a, 1, 0, &entry);
  const std::string path = storage::JoinPath(kRoot, entry.files(0).path());
  // A dense partition of another size refuses it.
  auto other = Dense(Consistency::kAsp, 65);
  EXPECT_THAT(LoadPartition(fs_.get(), kRoot, entry, 1, other.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  // A sparse partition with the same id refuses it too.
  auto sparse = Sparse(Consistency::kAsp);
  EXPECT_THAT(LoadPartition(fs_.get(), kRoot, entry, 1, sparse.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  // A flipped byte.
  auto data = fs_->ReadFile(path);
  ASSERT_THAT(data.status(), IsOk());
  std::string bad = *data;
  bad[bad.size() / 2] ^= 0x40;
  ASSERT_THAT(fs_->WriteFileAtomic(path, bad), IsOk());
  auto b = Dense(Consistency::kAsp, 64);
  EXPECT_THAT(LoadPartition(fs_.get(), kRoot, entry, 1, b.get()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  // Truncated.
  ASSERT_THAT(fs_->WriteFileAtomic(path, data->substr(0, data->size() - 9)), IsOk());
  EXPECT_THAT(LoadPartition(fs_.get(), kRoot, entry, 1, b.get()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  // Missing.
  ASSERT_THAT(fs_->DeleteFile(path), IsOk());
  EXPECT_THAT(LoadPartition(fs_.get(), kRoot, entry, 1, b.get()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

}  // namespace
}  // namespace strata::pserver
