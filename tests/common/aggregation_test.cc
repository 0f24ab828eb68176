// The bsp step set's members from the view (common/aggregation.h): each
// live worker, each host's workers as one, and a pipeline's group as one
// (its leader); and the pipeline's seats.
#include "common/aggregation.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

void AddWorker(proto::ClusterView* view, uint32_t id, proto::NodeState state,
               const std::string& host = "127.0.0.1", int index = -1) {
  proto::NodeInfo* m = view->add_members();
  m->set_id(id);
  m->set_index(index >= 0 ? index : static_cast<int>(id) - 1);
  m->set_role(proto::WORKER);
  m->set_state(state);
  m->set_host(host);
}

TEST(StepMembersTest, EachLiveWorkerWithoutAggregationOrStages) {
  proto::ClusterView view;
  AddWorker(&view, 4, proto::ALIVE);
  AddWorker(&view, 5, proto::FINISHED);
  AddWorker(&view, 6, proto::ALIVE);
  std::map<uint32_t, uint32_t> member_of;
  EXPECT_THAT(StepMembers(view, 1, &member_of), ElementsAre(4, 6));
  EXPECT_THAT(member_of, IsEmpty());
}

TEST(StepMembersTest, AHostsWorkersAreOneMember) {
  proto::ClusterView view;
  view.set_aggregation_key(9);
  AddWorker(&view, 4, proto::ALIVE, "a");
  AddWorker(&view, 5, proto::ALIVE, "a");
  AddWorker(&view, 6, proto::ALIVE, "b");
  std::map<uint32_t, uint32_t> member_of;
  EXPECT_THAT(StepMembers(view, 1, &member_of),
              UnorderedElementsAre(HostMember("a"), HostMember("b")));
  EXPECT_THAT(member_of, UnorderedElementsAre(Pair(4, HostMember("a")), Pair(5, HostMember("a")),
                                              Pair(6, HostMember("b"))));
}

// Hierarchical allreduce: each host's ring member is its lowest worker in
// the job, ALIVE or FINISHED (one that ran out of data tasks keeps its
// seat and optimizer shards); hosts with neither (dead, joining, drained)
// have none.
TEST(RingLeadersByHostTest, TheLowestWorkerInTheJob) {
  proto::ClusterView view;
  view.set_aggregation_key(9);
  AddWorker(&view, 3, proto::FINISHED, "a");
  AddWorker(&view, 5, proto::ALIVE, "a");
  AddWorker(&view, 4, proto::ALIVE, "a");
  AddWorker(&view, 8, proto::FINISHED, "b");
  AddWorker(&view, 6, proto::FINISHED, "b");
  AddWorker(&view, 2, proto::DEAD, "b");
  AddWorker(&view, 7, proto::JOINING, "c");
  AddWorker(&view, 1, proto::DRAINED, "c");
  EXPECT_THAT(RingLeadersByHost(view), ElementsAre(Pair("a", 3), Pair("b", 6)));
}

// A host's FINISHED worker (its ring member, which pushes the host's
// sparse rows) pushes for the host while the host has a live worker; a
// host with none is no member.
TEST(StepMembersTest, AFinishedWorkerPushesForItsHost) {
  proto::ClusterView view;
  view.set_aggregation_key(9);
  AddWorker(&view, 3, proto::FINISHED, "a");
  AddWorker(&view, 4, proto::ALIVE, "a");
  AddWorker(&view, 5, proto::FINISHED, "b");
  AddWorker(&view, 6, proto::DEAD, "b");
  std::map<uint32_t, uint32_t> member_of;
  EXPECT_THAT(StepMembers(view, 1, &member_of), ElementsAre(HostMember("a")));
  EXPECT_THAT(member_of, UnorderedElementsAre(Pair(3, HostMember("a")), Pair(4, HostMember("a")),
                                              Pair(5, HostMember("b"))));
}

// Seats by the workers' indices (a restart keeps its index): index i is
// stage i % K of group i / K; a group missing an index has no seats.
TEST(PipelineSeatsTest, WorkersInTheJobByIndexInGroups) {
  proto::ClusterView view;
  AddWorker(&view, 9, proto::ALIVE, "h", 1);
  AddWorker(&view, 3, proto::FINISHED, "h", 0);  // (a leader with no task)
  AddWorker(&view, 7, proto::JOINING, "h", 3);   // a restart of index 3
  AddWorker(&view, 5, proto::DEAD, "h", 3);      // its previous node
  AddWorker(&view, 4, proto::ALIVE, "h", 2);
  AddWorker(&view, 11, proto::ALIVE, "h", 4);  // group 2 is not whole
  const auto seats = PipelineSeats(view, 2);
  ASSERT_EQ(seats.size(), 4u);
  EXPECT_EQ(seats.at(3).stage, 0);
  EXPECT_THAT(seats.at(3).group, ElementsAre(3, 9));
  EXPECT_EQ(seats.at(9).stage, 1);
  EXPECT_EQ(seats.at(9).leader(), 3u);
  EXPECT_EQ(seats.at(4).stage, 0);
  EXPECT_THAT(seats.at(7).group, ElementsAre(4, 7));
  EXPECT_EQ(seats.count(11), 0u);
  EXPECT_EQ(seats.count(5), 0u);
  EXPECT_TRUE(PipelineSeats(view, 6).empty());
  // A restart registered before its previous node is declared dead: the
  // newer node takes the seat.
  AddWorker(&view, 12, proto::JOINING, "h", 1);
  EXPECT_THAT(PipelineSeats(view, 2).at(3).group, ElementsAre(3, 12));
}

TEST(StepMembersTest, APipelinesGroupIsOneMemberWhileItsLeaderIsAlive) {
  proto::ClusterView view;
  AddWorker(&view, 1, proto::ALIVE);
  AddWorker(&view, 2, proto::FINISHED);
  AddWorker(&view, 3, proto::FINISHED);  // a leader with no task: its group is out
  AddWorker(&view, 4, proto::ALIVE);
  AddWorker(&view, 5, proto::ALIVE);  // no seat
  std::map<uint32_t, uint32_t> member_of;
  EXPECT_THAT(StepMembers(view, 2, &member_of), ElementsAre(1));
  EXPECT_THAT(member_of, UnorderedElementsAre(Pair(1, 1), Pair(2, 1)));
}

}  // namespace
}  // namespace strata
