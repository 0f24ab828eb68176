// PServer::ApplyView on views that arrive out of order: a view from before
// placement (no partitions), fetched by a heartbeat's refresh while a slow
// restore was installing the placed view, must not take the restored
// partitions away (they would come back empty: the model silently lost).
#include <memory>

#include "gtest/gtest.h"
#include "pserver/pserver.h"
#include "storage/file_system.h"
#include "tests/testing/status_matchers.h"

namespace strata::pserver {
namespace {

using ::strata::testing::IsOk;

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

TEST(PServerViewTest, AViewFromBeforePlacementDoesNotDropPartitions) {
  auto fs = storage::NewMemoryFileSystem();
  PServerOptions o;
  o.master_address = "127.0.0.1:1";  // never contacted: not started
  o.fs = fs.get();
  o.http_port = -1;
  auto server = PServer::Create(std::move(o));
  ASSERT_THAT(server.status(), IsOk());
  ASSERT_THAT((*server)->ApplyView(PlacedView(5)), IsOk());
  ASSERT_NE((*server)->FindPartition(0), nullptr);

  proto::ClusterView unplaced = PlacedView(5);  // same epoch: a node joined meanwhile
  unplaced.clear_partitions();
  ASSERT_THAT((*server)->ApplyView(unplaced), IsOk());
  EXPECT_NE((*server)->FindPartition(0), nullptr) << "an unplaced view took the partition away";
  EXPECT_EQ((*server)->Status().partitions_size(), 1);

  // A placed view that moves the partition elsewhere still does.
  proto::ClusterView moved = PlacedView(6);
  moved.mutable_partitions(0)->set_owner(42);
  ASSERT_THAT((*server)->ApplyView(moved), IsOk());
  EXPECT_EQ((*server)->Status().partitions_size(), 0);
}

}  // namespace
}  // namespace strata::pserver
