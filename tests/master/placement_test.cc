#include "master/placement.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata::master {
namespace {

using ::strata::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

proto::TableInfo Table(uint32_t id, uint64_t elements) {
  proto::TableInfo t;
  t.set_id(id);
  t.set_name("t" + std::to_string(id));
  t.set_num_elements(elements);
  return t;
}

TEST(MakeTableInfosTest, CopiesSpecsWithIdsInOrder) {
  ModelSection model;
  model.layers = {4, 3, 2};
  auto tables = MakeTableInfos(ModelTables(model));
  ASSERT_EQ(tables.size(), 4u);
  // fc0.weight {4,3} = 12, fc0.bias {3}, fc1.weight {3,2} = 6, fc1.bias {2}
  const std::vector<std::string> names = {"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"};
  const std::vector<uint64_t> sizes = {12, 3, 6, 2};
  for (size_t i = 0; i < tables.size(); ++i) {
    EXPECT_EQ(tables[i].id(), i);
    EXPECT_EQ(tables[i].name(), names[i]);
    EXPECT_EQ(tables[i].num_elements(), sizes[i]);
  }
  EXPECT_THAT(tables[0].shape(), ElementsAre(4u, 3u));
  EXPECT_EQ(tables[0].init(), "glorot_uniform");
  EXPECT_EQ(tables[0].fan_in(), 4u);
  EXPECT_EQ(tables[0].fan_out(), 3u);
  EXPECT_EQ(tables[1].init(), "zeros");
}

TEST(PlacePartitionsTest, AllreduceTablesGetNoPartitions) {
  // model.dense_sync allreduce: the workers keep the dense tables.
  ModelSection model;
  model.layers = {4, 3, 2};
  model.dense_sync = "allreduce";
  auto tables = MakeTableInfos(ModelTables(model));
  ASSERT_EQ(tables.size(), 4u);
  for (const auto& t : tables) EXPECT_TRUE(t.allreduce()) << t.name();
  STRATA_ASSERT_OK_AND_ASSIGN(auto parts, PlacePartitions(tables, 16, {1, 2}));
  EXPECT_TRUE(parts.empty());
  // Beside a table the pservers keep, only that one is placed.
  tables.push_back(Table(4, 10));
  STRATA_ASSERT_OK_AND_ASSIGN(parts, PlacePartitions(tables, 16, {1, 2}));
  ASSERT_EQ(parts.size(), 3u);
  for (const auto& p : parts) EXPECT_EQ(p.table_id(), 4u);
}

TEST(PlacePartitionsTest, CutsTableIntoSlicesOfAtMostSliceBytes) {
  // 10 elements, 16 bytes = 4 elements per slice: [0,4) [4,8) [8,10).
  STRATA_ASSERT_OK_AND_ASSIGN(auto parts, PlacePartitions({Table(0, 10)}, 16, {1}));
  ASSERT_EQ(parts.size(), 3u);
  const uint64_t offsets[] = {0, 4, 8}, lengths[] = {4, 4, 2};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(parts[i].id(), i);
    EXPECT_EQ(parts[i].table_id(), 0u);
    EXPECT_EQ(parts[i].offset(), offsets[i]) << i;
    EXPECT_EQ(parts[i].length(), lengths[i]) << i;
    EXPECT_EQ(parts[i].owner(), 1u);
  }
}

TEST(PlacePartitionsTest, SliceBytesRoundDownToWholeElements) {
  // 18 bytes hold 4 whole fp32 elements (4 * 4 = 16 <= 18 < 20).
  STRATA_ASSERT_OK_AND_ASSIGN(auto parts, PlacePartitions({Table(0, 9)}, 18, {1}));
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].length(), 4u);
  EXPECT_EQ(parts[1].length(), 4u);
  EXPECT_EQ(parts[2].length(), 1u);
  // Exactly 4 bytes: one element per partition.
  STRATA_ASSERT_OK_AND_ASSIGN(parts, PlacePartitions({Table(0, 3)}, 4, {1}));
  ASSERT_EQ(parts.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(parts[i].offset(), i);
    EXPECT_EQ(parts[i].length(), 1u);
  }
}

TEST(PlacePartitionsTest, NumbersPartitionsInTableOrder) {
  // t0: 10 -> [0,4) [4,8) [8,10); t1: 3 -> [0,3); t2: 8 -> [0,4) [4,8)
  STRATA_ASSERT_OK_AND_ASSIGN(auto parts,
                              PlacePartitions({Table(0, 10), Table(1, 3), Table(2, 8)}, 16, {1}));
  ASSERT_EQ(parts.size(), 6u);
  const uint32_t tables[] = {0, 0, 0, 1, 2, 2};
  const uint64_t offsets[] = {0, 4, 8, 0, 0, 4};
  const uint64_t lengths[] = {4, 4, 2, 3, 4, 4};
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].id(), i);
    EXPECT_EQ(parts[i].table_id(), tables[i]) << i;
    EXPECT_EQ(parts[i].offset(), offsets[i]) << i;
    EXPECT_EQ(parts[i].length(), lengths[i]) << i;
  }
}

TEST(PlacePartitionsTest, LargestFirstOntoLeastLoadedLowerIdOnTies) {
  // Partitions (length): p0 4, p1 4, p2 2 (t0) and p3 3 (t1), pservers 5, 9.
  // Largest first (stable): p0 -> 5 (tie: lower id; 5 has 16 B)
  //                         p1 -> 9 (9 has 16 B)
  //                         p3 -> 5 (tie at 16; 5 has 28 B)
  //                         p2 -> 9 (9 has 24 B)
  STRATA_ASSERT_OK_AND_ASSIGN(auto parts, PlacePartitions({Table(0, 10), Table(1, 3)}, 16, {9, 5}));
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].owner(), 5u);
  EXPECT_EQ(parts[1].owner(), 9u);
  EXPECT_EQ(parts[2].owner(), 9u);
  EXPECT_EQ(parts[3].owner(), 5u);
}

// Bytes per pserver must differ by at most the largest partition.
void ExpectBalanced(const std::vector<proto::PartitionInfo>& parts,
                    const std::vector<uint32_t>& pservers) {
  std::map<uint32_t, uint64_t> bytes;
  for (uint32_t id : pservers) bytes[id] = 0;
  uint64_t largest = 0;
  for (const auto& p : parts) {
    ASSERT_TRUE(bytes.count(p.owner()))
        << "partition " << p.id() << " on unknown pserver " << p.owner();
    bytes[p.owner()] += p.length() * 4;
    largest = std::max<uint64_t>(largest, p.length() * 4);
  }
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& [id, b] : bytes) {
    lo = std::min(lo, b);
    hi = std::max(hi, b);
  }
  EXPECT_LE(hi - lo, largest);
}

TEST(PlacePartitionsTest, BalancesBytesAcrossPservers) {
  // An MLP 784-256-128-10 cut into 64 KiB slices.
  ModelSection model;
  auto tables = MakeTableInfos(ModelTables(model));
  for (const std::vector<uint32_t>& ps :
       {std::vector<uint32_t>{1, 2}, std::vector<uint32_t>{3, 1, 2}}) {
    STRATA_ASSERT_OK_AND_ASSIGN(auto parts, PlacePartitions(tables, 64 << 10, ps));
    // Covers every table exactly, contiguously.
    std::map<uint32_t, uint64_t> next;
    for (const auto& p : parts) {
      EXPECT_EQ(p.offset(), next[p.table_id()]) << "partition " << p.id();
      next[p.table_id()] += p.length();
      EXPECT_LE(p.length(), (64u << 10) / 4);
    }
    for (const auto& t : tables) EXPECT_EQ(next[t.id()], t.num_elements()) << t.name();
    ExpectBalanced(parts, ps);
    // Every pserver gets something.
    std::set<uint32_t> owners;
    for (const auto& p : parts) owners.insert(p.owner());
    EXPECT_EQ(owners.size(), ps.size());
  }
}

TEST(PlacePartitionsTest, UnevenSizesOnThreePservers) {
  // Slice 20 B = 5 elements. Lengths: p0..p3 = 5 (t0: 20), p4 = 3 (t1),
  // p5 = 1 (t2), p6 = 5, p7 = 2 (t3: 7). Largest first, stable:
  //   p0 -> 1 (20 B), p1 -> 2 (20 B), p2 -> 3 (20 B),
  //   p3 -> 1 (tie; 40 B), p6 -> 2 (40 B), p4 -> 3 (20 + 12 = 32 B),
  //   p7 -> 3 (32 + 8 = 40 B), p5 -> 1 (tie; 44 B).
  // Totals: 44, 40, 40 bytes; max - min = 4 <= 20.
  STRATA_ASSERT_OK_AND_ASSIGN(
      auto parts,
      PlacePartitions({Table(0, 20), Table(1, 3), Table(2, 1), Table(3, 7)}, 20, {1, 2, 3}));
  ASSERT_EQ(parts.size(), 8u);
  ExpectBalanced(parts, {1, 2, 3});
  std::map<uint32_t, uint64_t> bytes;
  for (const auto& p : parts) bytes[p.owner()] += p.length() * 4;
  EXPECT_EQ(bytes[1], 44u);
  EXPECT_EQ(bytes[2], 40u);
  EXPECT_EQ(bytes[3], 40u);
  EXPECT_EQ(parts[4].owner(), 3u);
  EXPECT_EQ(parts[5].owner(), 1u);
  EXPECT_EQ(parts[7].owner(), 3u);
}

TEST(PlacePartitionsTest, NoPserverIsInvalidArgument) {
  EXPECT_THAT(PlacePartitions({Table(0, 10)}, 16, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no pserver")));
}

TEST(PlacePartitionsTest, SliceBytesBelowFourIsInvalidArgument) {
  EXPECT_THAT(PlacePartitions({Table(0, 10)}, 3, {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 3")));
  EXPECT_THAT(PlacePartitions({Table(0, 10)}, 0, {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slice_bytes")));
  EXPECT_THAT(PlacePartitions({Table(0, 10)}, -8, {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got -8")));
}

TEST(PlacePartitionsTest, SparseTablesAreDealtOutInVirtualPartitions) {
  ModelSection model;
  model.type = "wide_deep";
  model.embedding_dim = 4;
  model.hidden = {8};
  auto tables = MakeTableInfos(ModelTables(model), 5);
  ASSERT_GE(tables.size(), 3u);
  EXPECT_TRUE(tables[0].sparse());
  EXPECT_EQ(tables[0].name(), "wide");
  EXPECT_EQ(tables[0].dim(), 1u);
  EXPECT_EQ(tables[1].name(), "embedding");
  EXPECT_EQ(tables[1].dim(), 4u);
  EXPECT_EQ(tables[1].partitions(), 5u);
  EXPECT_EQ(tables[1].num_elements(), 0u);
  EXPECT_FALSE(tables[2].sparse());
  STRATA_ASSERT_OK_AND_ASSIGN(auto parts, PlacePartitions(tables, 1 << 20, {7, 3}));
  std::map<uint32_t, std::map<uint32_t, int>> per_table_owner;  // table -> owner -> count
  std::map<uint32_t, std::set<uint64_t>> virtual_index;
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].id(), i);
    if (!tables[parts[i].table_id()].sparse()) continue;
    EXPECT_EQ(parts[i].length(), 0u);
    ++per_table_owner[parts[i].table_id()][parts[i].owner()];
    virtual_index[parts[i].table_id()].insert(parts[i].offset());
  }
  for (uint32_t t : {0u, 1u}) {
    EXPECT_EQ(virtual_index[t], (std::set<uint64_t>{0, 1, 2, 3, 4})) << t;
    // Five partitions of each table over two pservers: 3 and 2.
    int total = 0;
    for (const auto& [owner, n] : per_table_owner[t]) {
      EXPECT_GE(n, 2);
      total += n;
    }
    EXPECT_EQ(total, 5);
  }
}

TEST(TopUpBackupsTest, BalancesBackupsAndReplacesDeadOnes) {
  google::protobuf::RepeatedPtrField<proto::PartitionInfo> parts;
  for (uint32_t i = 0; i < 6; ++i) {
    proto::PartitionInfo* p = parts.Add();
    p->set_id(i);
    p->set_length(100);
    p->set_owner(1 + i % 3);  // owners 1, 2, 3
  }
  EXPECT_EQ(TopUpBackups(&parts, {1, 2, 3}, 1), 6);
  std::map<uint32_t, int> held;
  for (const auto& p : parts) {
    ASSERT_EQ(p.backups_size(), 1);
    EXPECT_NE(p.backups(0), p.owner());
    ++held[p.backups(0)];
  }
  EXPECT_THAT(held, ElementsAre(Pair(1, 2), Pair(2, 2), Pair(3, 2)));
  // Node 3 dies: its backups go to the others, never onto the owner.
  for (auto& p : parts) {
    if (p.owner() == 3) p.set_owner(p.backups(0));
  }
  EXPECT_GT(TopUpBackups(&parts, {1, 2}, 1), 0);
  for (const auto& p : parts) {
    ASSERT_EQ(p.backups_size(), 1);
    EXPECT_NE(p.backups(0), p.owner());
    EXPECT_NE(p.backups(0), 3u);
  }
  // More backups than pservers allow: as many as there are.
  EXPECT_EQ(TopUpBackups(&parts, {1, 2}, 3), 0);
  for (const auto& p : parts) EXPECT_EQ(p.backups_size(), 1);
}

google::protobuf::RepeatedPtrField<proto::PartitionInfo> Dense(int n, uint32_t owner) {
  google::protobuf::RepeatedPtrField<proto::PartitionInfo> parts;
  for (int i = 0; i < n; ++i) {
    proto::PartitionInfo* p = parts.Add();
    p->set_id(static_cast<uint32_t>(i));
    p->set_length(1 << 20);  // 4 MiB
    p->set_owner(owner);
  }
  return parts;
}

// The placement after `moves`, as the master would cut them over.
void Apply(const std::vector<Move>& moves,
           google::protobuf::RepeatedPtrField<proto::PartitionInfo>* parts) {
  for (const Move& m : moves) {
    proto::PartitionInfo& p = (*parts)[static_cast<int>(m.partition)];
    auto* b = p.mutable_backups();
    b->erase(std::remove(b->begin(), b->end(), m.to), b->end());
    if (m.primary) {
      ASSERT_EQ(p.owner(), m.from);
      p.set_owner(m.to);
    } else {
      ASSERT_NE(std::find(b->begin(), b->end(), m.from), b->end());
      b->erase(std::remove(b->begin(), b->end(), m.from), b->end());
      p.add_backups(m.to);
    }
  }
}

std::map<uint32_t, int> Owned(const google::protobuf::RepeatedPtrField<proto::PartitionInfo>& ps) {
  std::map<uint32_t, int> n;
  for (const auto& p : ps) ++n[p.owner()];
  return n;
}

TEST(PlanMovesTest, NewPServersGetAnEvenShareOneMovePerPartition) {
  auto parts = Dense(9, 1);
  const std::vector<Move> moves = PlanMoves(parts, {1, 2, 3}, {});
  EXPECT_EQ(moves.size(), 6u);
  std::set<uint32_t> moved;
  for (const Move& m : moves) {
    EXPECT_TRUE(m.primary);
    EXPECT_EQ(m.from, 1u);
    EXPECT_EQ(m.bytes, 4u << 20);
    EXPECT_TRUE(moved.insert(m.partition).second) << "partition " << m.partition << " twice";
  }
  Apply(moves, &parts);
  EXPECT_THAT(Owned(parts), ElementsAre(Pair(1, 3), Pair(2, 3), Pair(3, 3)));
  // Balanced: nothing more to do.
  EXPECT_TRUE(PlanMoves(parts, {1, 2, 3}, {}).empty());
}

// Sparse virtual partitions weigh what their owners measured: one big
// partition balances three small ones; unmeasured, they weigh alike.
TEST(PlanMovesTest, SparsePartitionsWeighTheBytesTheirOwnersMeasured) {
  google::protobuf::RepeatedPtrField<proto::PartitionInfo> parts;
  for (uint32_t i = 0; i < 4; ++i) {
    proto::PartitionInfo* p = parts.Add();
    p->set_id(i);
    p->set_owner(1);  // (length 0: sparse)
  }
  const MeasuredBytes measured = {{0, 30u << 20}, {1, 10u << 20}, {2, 10u << 20}, {3, 10u << 20}};
  EXPECT_EQ(PartitionWeight(parts[0], measured), 30u << 20);
  EXPECT_EQ(PartitionWeight(parts[0]), kSparsePartitionWeight);
  std::vector<Move> moves = PlanMoves(parts, {1, 2}, {}, measured);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].partition, 0u);
  EXPECT_EQ(moves[0].bytes, 30u << 20);
  // Unmeasured: two of the four move.
  EXPECT_EQ(PlanMoves(parts, {1, 2}, {}).size(), 2u);
}

TEST(PlanMovesTest, LeavingPServersAreEmptiedPreferringBackupsThatHoldACopy) {
  auto parts = Dense(4, 1);
  parts[0].set_owner(3);
  parts[1].set_owner(3);
  parts[0].add_backups(2);  // a synced copy: promoted rather than copied
  parts[2].add_backups(3);  // a backup on the leaving one moves too
  const std::vector<Move> moves = PlanMoves(parts, {1, 2}, {3});
  bool promoted = false;
  for (const Move& m : moves) {
    EXPECT_NE(m.to, 3u);
    promoted = promoted || (m.partition == 0 && m.to == 2 && m.primary);
  }
  EXPECT_TRUE(promoted);
  Apply(moves, &parts);
  for (const auto& p : parts) {
    EXPECT_NE(p.owner(), 3u);
    for (uint32_t b : p.backups()) EXPECT_NE(b, 3u) << "partition " << p.id();
  }
  EXPECT_THAT(Owned(parts), ElementsAre(Pair(1, 2), Pair(2, 2)));
}

TEST(PlanMovesTest, BackupsAreRebalancedAndMovingPartitionsLeftAlone) {
  // Two pservers with replication 1 grow to three: the newcomer gets
  // primaries and backups.
  auto parts = Dense(6, 1);
  for (int i = 0; i < 6; ++i) {
    parts[i].set_owner(i % 2 == 0 ? 1 : 2);
    parts[i].add_backups(i % 2 == 0 ? 2 : 1);
  }
  parts[5].set_move_to(3);  // already on its way to 3
  parts[5].set_move_from(2);
  parts[5].add_backups(3);
  const std::vector<Move> moves = PlanMoves(parts, {1, 2, 3}, {});
  std::map<uint32_t, int> held;
  for (const Move& m : moves) EXPECT_NE(m.partition, 5u);
  parts[5].set_owner(3);  // (its move done)
  parts[5].mutable_backups()->RemoveLast();
  parts[5].clear_move_to();
  Apply(moves, &parts);
  for (const auto& p : parts) {
    ++held[p.owner()];
    for (uint32_t b : p.backups()) ++held[b];
  }
  EXPECT_THAT(Owned(parts), ElementsAre(Pair(1, 2), Pair(2, 2), Pair(3, 2)));
  EXPECT_THAT(held, ElementsAre(Pair(1, 4), Pair(2, 4), Pair(3, 4)));
}

TEST(PlanMovesTest, NothingWhenNoPServerStays) {
  auto parts = Dense(2, 1);
  EXPECT_TRUE(PlanMoves(parts, {}, {1}).empty());
}

TEST(TopUpBackupsTest, LeavingPServersKeepTheirBackupsButGetNoNewOne) {
  auto parts = Dense(4, 1);
  parts[0].add_backups(3);
  EXPECT_EQ(TopUpBackups(&parts, {1, 2, 3}, 1, {3}), 3);
  EXPECT_THAT(parts[0].backups(), ElementsAre(3u));
  for (int i = 1; i < 4; ++i) EXPECT_THAT(parts[i].backups(), ElementsAre(2u));
}

}  // namespace
}  // namespace strata::master
