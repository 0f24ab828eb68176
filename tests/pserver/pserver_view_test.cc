// PServer::ApplyView on views that arrive out of order: a view from before
// placement (no partitions), fetched by a heartbeat's refresh while a slow
// restore was installing the placed view, must not take the restored
// partitions away (they would come back empty: the model silently lost).
// And partitions that move away: freed once nothing holds them, not before.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "pserver/partition.h"
#include "pserver/pserver.h"
#include "storage/file_system.h"
#include "tests/testing/queue_sink.h"
#include "tests/testing/recording_responder.h"
#include "tests/testing/status_matchers.h"

namespace strata::pserver {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::QueueSink;
using ::strata::testing::RecordingResponder;
using transport::Message;
using transport::MessageType;

proto::ClusterView PlacedView(uint64_t epoch) {
  proto::ClusterView view;
  view.set_epoch(epoch);
  view.set_seed(1);
  proto::TableInfo* t = view.add_tables();
  t->set_id(0);
  t->set_name("w");
  t->add_shape(8);
  t->set_num_elements(8);
  t->set_init("zeros");
  t->set_fan_in(8);
  t->set_fan_out(1);
  proto::PartitionInfo* p = view.add_partitions();
  p->set_id(0);
  p->set_table_id(0);
  p->set_offset(0);
  p->set_length(8);
  p->set_owner(0);  // this pserver before it registers
  return view;
}

// PlacedView plus partition 1: all of a sparse table of dim 4.
proto::ClusterView PlacedViewWithSparse(uint64_t epoch) {
  proto::ClusterView view = PlacedView(epoch);
  proto::TableInfo* t = view.add_tables();
  t->set_id(1);
  t->set_name("emb");
  t->set_sparse(true);
  t->set_dim(4);
  t->set_partitions(1);
  proto::PartitionInfo* p = view.add_partitions();
  p->set_id(1);
  p->set_table_id(1);
  p->set_offset(0);
  p->set_owner(0);
  return view;
}

// The view of `epoch` in which every partition of `view` moved to node 42.
proto::ClusterView MovedAway(proto::ClusterView view, uint64_t epoch) {
  view.set_epoch(epoch);
  for (auto& p : *view.mutable_partitions()) p.set_owner(42);
  return view;
}

// Brings `backup` (node `node` of `primary`) in sync: the copy, the
// caught-up marker.
void Sync(Partition& primary, Partition& backup, uint32_t node) {
  QueueSink sink;
  primary.SetBackups({node}, &sink);
  for (auto records = sink.Take(); !records.empty(); records = sink.Take()) {
    for (auto& [to, record] : records) {
      auto r = std::make_shared<RecordingResponder>();
      backup.ApplyReplica(record, r);
      ASSERT_EQ(r->responses().size(), 1u);
      ASSERT_THAT(transport::ResponseStatus(r->responses()[0]), IsOk());
      primary.OnReplicaAck(to, record.header.seq);
    }
  }
  primary.SetBackups({}, &sink);
}

// A PServer that is never started (its master is never contacted): views
// are applied to it directly.
std::unique_ptr<PServer> Unstarted(storage::FileSystem* fs) {
  PServerOptions o;
  o.master_address = "127.0.0.1:1";
  o.fs = fs;
  o.http_port = -1;
  auto server = PServer::Create(std::move(o));
  EXPECT_THAT(server.status(), IsOk());
  return server.ok() ? std::move(*server) : nullptr;
}

TEST(PServerViewTest, AViewFromBeforePlacementDoesNotDropPartitions) {
  auto fs = storage::NewMemoryFileSystem();
  std::unique_ptr<PServer> server = Unstarted(fs.get());
  ASSERT_NE(server, nullptr);
  ASSERT_THAT(server->ApplyView(PlacedView(5)), IsOk());
  ASSERT_NE(server->FindPartition(0), nullptr);

  proto::ClusterView unplaced = PlacedView(5);  // same epoch: a node joined meanwhile
  unplaced.clear_partitions();
  ASSERT_THAT(server->ApplyView(unplaced), IsOk());
  EXPECT_NE(server->FindPartition(0), nullptr) << "an unplaced view took the partition away";
  EXPECT_EQ(server->Status().partitions_size(), 1);

  // A placed view that moves the partition elsewhere still does.
  proto::ClusterView moved = PlacedView(6);
  moved.mutable_partitions(0)->set_owner(42);
  ASSERT_THAT(server->ApplyView(moved), IsOk());
  EXPECT_EQ(server->Status().partitions_size(), 0);
}

// A view change stalls only the requests of the partitions it moves: a
// worker's request of an older view is served by a node that has been its
// partition's primary since that view (HandleRequest), refused elsewhere.
TEST(PServerViewTest, ARequestOfAnOlderViewIsServedWhereItsPartitionStayed) {
  auto fs = storage::NewMemoryFileSystem();
  std::unique_ptr<PServer> server = Unstarted(fs.get());
  ASSERT_NE(server, nullptr);
  ASSERT_THAT(server->ApplyView(PlacedViewWithSparse(5)), IsOk());
  EXPECT_TRUE(server->PrimarySince(0, 5));
  EXPECT_FALSE(server->PrimarySince(0, 4)) << "not its primary before it came";
  // Partition 1 moves away; partition 0 stays.
  proto::ClusterView six = PlacedViewWithSparse(6);
  six.mutable_partitions(1)->set_owner(42);
  ASSERT_THAT(server->ApplyView(six), IsOk());
  EXPECT_TRUE(server->PrimarySince(0, 5));
  EXPECT_FALSE(server->PrimarySince(1, 5));
  EXPECT_FALSE(server->PrimarySince(1, 6));
  // It comes back: served from that view on, not for the views between.
  ASSERT_THAT(server->ApplyView(PlacedViewWithSparse(7)), IsOk());
  EXPECT_FALSE(server->PrimarySince(1, 6));
  EXPECT_TRUE(server->PrimarySince(1, 7));
  EXPECT_TRUE(server->PrimarySince(0, 5));
  // A backup here is no primary: its partition's requests are refused.
  proto::ClusterView eight = PlacedViewWithSparse(8);
  eight.mutable_partitions(0)->set_owner(42);
  eight.mutable_partitions(0)->add_backups(0);
  ASSERT_THAT(server->ApplyView(eight), IsOk());
  EXPECT_FALSE(server->PrimarySince(0, 7));
  EXPECT_FALSE(server->PrimarySince(0, 8));
}

TEST(PServerViewTest, PartitionsThatMoveAwayAreFreed) {
  auto fs = storage::NewMemoryFileSystem();
  std::unique_ptr<PServer> server = Unstarted(fs.get());
  ASSERT_NE(server, nullptr);
  ASSERT_THAT(server->ApplyView(PlacedViewWithSparse(5)), IsOk());
  EXPECT_EQ(server->partitions_held(), 2);
  std::weak_ptr<Partition> dense = server->FindPartition(0);
  std::weak_ptr<Partition> sparse = server->FindPartition(1);
  ASSERT_FALSE(dense.expired());
  ASSERT_FALSE(sparse.expired());
  ASSERT_TRUE(sparse.lock()->sparse());

  ASSERT_THAT(server->ApplyView(MovedAway(PlacedViewWithSparse(5), 6)), IsOk());
  EXPECT_EQ(server->FindPartition(0), nullptr);
  EXPECT_TRUE(dense.expired()) << "a dense partition that moved away is still in memory";
  EXPECT_TRUE(sparse.expired()) << "a sparse partition that moved away is still in memory";
  EXPECT_EQ(server->partitions_held(), 0);
}

TEST(PServerViewTest, ARequestInFlightKeepsAPartitionThatMovedAway) {
  auto fs = storage::NewMemoryFileSystem();
  std::unique_ptr<PServer> server = Unstarted(fs.get());
  ASSERT_NE(server, nullptr);
  ASSERT_THAT(server->ApplyView(PlacedView(5)), IsOk());
  // What a request handler holds between its lookup and its apply.
  std::shared_ptr<Partition> in_flight = server->FindPartition(0);
  ASSERT_NE(in_flight, nullptr);

  ASSERT_THAT(server->ApplyView(MovedAway(PlacedView(5), 6)), IsOk());
  EXPECT_EQ(server->FindPartition(0), nullptr);
  EXPECT_EQ(server->Status().partitions_size(), 0);
  EXPECT_EQ(server->partitions_held(), 1) << "freed while a request still held it";

  // The request completes on the partition it found.
  Message pull;
  pull.header.type = MessageType::kPullRequest;
  pull.header.request_id = 9;
  pull.header.partition = 0;
  auto responder = std::make_shared<RecordingResponder>();
  in_flight->Pull(pull, responder);
  const std::vector<Message> responses = responder->responses();
  ASSERT_EQ(responses.size(), 1u);
  EXPECT_THAT(transport::ResponseStatus(responses[0]), IsOk());
  ASSERT_EQ(responses[0].payload.size(), 8 * sizeof(float));
  std::vector<float> values(8, 1.f);
  std::memcpy(values.data(), responses[0].payload.data(), responses[0].payload.size());
  EXPECT_EQ(values, std::vector<float>(8, 0.f));  // the "zeros" initializer

  in_flight.reset();  // the request is done: the last holder lets go
  EXPECT_EQ(server->partitions_held(), 0);
}

// Found by fault_migration_kill_test: a backup that kept its state when
// its partition got a new owner (a move's cut-over, a failover) held the
// old owner's record index, refused the new owner's copy, and the acks it
// held back stalled the job. A new owner means a fresh backup.
TEST(PServerViewTest, ABackupWhosePartitionGetsANewOwnerStartsAFreshCopy) {
  auto fs = storage::NewMemoryFileSystem();
  std::unique_ptr<PServer> server = Unstarted(fs.get());
  ASSERT_NE(server, nullptr);
  proto::ClusterView view = PlacedView(5);
  view.mutable_partitions(0)->set_owner(42);
  view.mutable_partitions(0)->add_backups(0);  // this pserver
  ASSERT_THAT(server->ApplyView(view), IsOk());
  std::weak_ptr<Partition> first = server->FindPartition(0);
  ASSERT_FALSE(first.expired());
  EXPECT_EQ(first.lock()->role(), PartitionRole::kBackup);

  view.set_epoch(6);  // same owner: the same backup
  ASSERT_THAT(server->ApplyView(view), IsOk());
  EXPECT_EQ(server->FindPartition(0), first.lock());

  view.set_epoch(7);
  view.mutable_partitions(0)->set_owner(43);
  ASSERT_THAT(server->ApplyView(view), IsOk());
  std::shared_ptr<Partition> second = server->FindPartition(0);
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(first.expired()) << "the backup of the old owner's stream is still here";
  EXPECT_EQ(second->role(), PartitionRole::kBackup);
  EXPECT_FALSE(second->synced());  // until the new owner's copy
}

// Found by fault_migration_kill_test: a move's cut-over gave the
// partition's backups a fresh copy to take from the new owner, so the new
// owner dying before it came lost the partition (replication 1, and the
// job failed). The backup keeps the copy in sync with the old owner until
// the new owner's is in, and takes over from it if need be.
TEST(PServerViewTest, ABackupKeepsItsOldCopyUntilTheNewOwnersCopyIsIn) {
  auto fs = storage::NewMemoryFileSystem();
  std::unique_ptr<PServer> old_owner = Unstarted(fs.get());
  std::unique_ptr<PServer> new_owner = Unstarted(fs.get());
  std::unique_ptr<PServer> server = Unstarted(fs.get());
  ASSERT_NE(server, nullptr);
  ASSERT_THAT(old_owner->ApplyView(PlacedView(5)), IsOk());
  ASSERT_THAT(new_owner->ApplyView(PlacedView(5)), IsOk());
  proto::ClusterView view = PlacedView(5);
  view.mutable_partitions(0)->set_owner(42);
  view.mutable_partitions(0)->add_backups(0);  // this pserver
  ASSERT_THAT(server->ApplyView(view), IsOk());
  std::shared_ptr<Partition> old_copy = server->FindPartition(0);
  Sync(*old_owner->FindPartition(0), *old_copy, 0);
  ASSERT_TRUE(old_copy->synced());

  // The cut-over: node 43 owns it, and sends a fresh copy.
  view.set_epoch(6);
  view.mutable_partitions(0)->set_owner(43);
  ASSERT_THAT(server->ApplyView(view), IsOk());
  std::shared_ptr<Partition> fresh = server->FindPartition(0);
  ASSERT_NE(fresh, old_copy);
  EXPECT_FALSE(fresh->holds_copy());
  std::weak_ptr<Partition> kept = old_copy;
  old_copy.reset();
  EXPECT_FALSE(kept.expired()) << "the copy in sync with the old owner went first";
  // Node 43 dies before its copy came: this pserver takes over from the
  // old copy.
  view.set_epoch(7);
  view.mutable_partitions(0)->set_owner(0);
  view.mutable_partitions(0)->clear_backups();
  ASSERT_THAT(server->ApplyView(view), IsOk());
  EXPECT_EQ(server->FindPartition(0), kept.lock());
  EXPECT_EQ(kept.lock()->role(), PartitionRole::kPrimary);

  // Again, and the new owner's copy comes first: it serves, the old goes.
  view.set_epoch(8);
  view.mutable_partitions(0)->set_owner(42);
  view.mutable_partitions(0)->add_backups(0);
  ASSERT_THAT(server->ApplyView(view), IsOk());
  Sync(*old_owner->FindPartition(0), *server->FindPartition(0), 0);
  kept = server->FindPartition(0);
  view.set_epoch(9);
  view.mutable_partitions(0)->set_owner(43);
  ASSERT_THAT(server->ApplyView(view), IsOk());
  fresh = server->FindPartition(0);
  Sync(*new_owner->FindPartition(0), *fresh, 0);
  view.set_epoch(10);
  view.mutable_partitions(0)->set_owner(0);
  view.mutable_partitions(0)->clear_backups();
  ASSERT_THAT(server->ApplyView(view), IsOk());
  EXPECT_EQ(server->FindPartition(0), fresh);
  EXPECT_EQ(fresh->role(), PartitionRole::kPrimary);
  EXPECT_TRUE(kept.expired()) << "the old copy outlived the new one's promotion";
}

}  // namespace
}  // namespace strata::pserver
