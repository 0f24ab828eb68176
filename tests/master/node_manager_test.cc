#include "master/node_manager.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/error_reason.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/placement.h"
#include "storage/file_system.h"
#include "tests/testing/status_matchers.h"

namespace strata::master {
namespace {

using ::strata::testing::IsOk;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Pair;

class NodeManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EventSink::Options so;
    so.fs = fs_.get();
    so.event_log = "/events.jsonl";
    so.clock = &clock_;
    sink_ = *EventSink::Open(std::move(so));
    job_ = std::make_unique<JobTracker>(
        JobTracker::Options{"unit", Consistency::kBsp, 1, Planted(), &clock_, sink_.get()});
  }
  // script_tables: the tables are declared by the workers (DeclareTables).
  NodeManager& Make(int pservers, int workers, int replication = 0, bool script_tables = false) {
    cluster_.replication = replication;
    cluster_.slice_bytes = 64;  // several partitions of the model's tables
    JobConfig config;
    nodes_ = std::make_unique<NodeManager>(
        NodeManager::Options{"master-host", pservers, workers, cluster_, 7,
                             script_tables ? std::vector<proto::TableInfo>()
                                           : MakeTableInfos(ModelTables(config.model), 2),
                             script_tables, 2, &security_, &clock_, job_.get(), &metrics_});
    return *nodes_;
  }
  // A DeclareTables request of `node`: dense tables {name, shape} and a
  // sparse one "emb" of dim 4.
  static proto::DeclareTablesRequest Declaration(
      uint32_t node, const std::vector<std::pair<std::string, std::vector<uint64_t>>>& dense,
      bool initialised = false) {
    proto::DeclareTablesRequest r;
    r.set_node_id(node);
    r.set_initialised(initialised);
    for (const auto& [name, shape] : dense) {
      proto::TableInfo* t = r.add_tables();
      t->set_name(name);
      for (uint64_t d : shape) t->add_shape(d);
    }
    proto::TableInfo* e = r.add_tables();
    e->set_name("emb");
    e->set_sparse(true);
    e->set_dim(4);
    return r;
  }
  // Registers (role, index) and returns its node id.
  uint32_t Join(proto::Role role, int index) {
    proto::RegisterRequest r;
    r.set_role(role);
    r.set_index(index);
    r.set_host("h");
    if (role == proto::PSERVER) {
      r.set_grpc_address(absl::StrCat("127.0.0.1:", 40000 + index));
      r.set_data_address(absl::StrCat("127.0.0.1:", 41000 + index));
    }
    EXPECT_THAT(nodes_->CheckReplaceable(r, "", "peer"), IsOk());
    return nodes_->Add(r, "", "peer").id();
  }
  absl::Status Beat(uint32_t id, std::vector<uint32_t> replicas = {}) {
    proto::HeartbeatRequest h;
    h.set_node_id(id);
    h.set_epoch(nodes_->View().epoch());  // (it holds the view)
    for (uint32_t p : replicas) h.add_replicas(p);
    return nodes_->Heartbeat(h).status();
  }
  // Places the partitions on the pservers registered.
  proto::ClusterView Place() {
    auto plan = nodes_->PlanPlacement();
    EXPECT_THAT(plan.status(), IsOk());
    if (!plan.ok() || !plan->has_value()) {
      ADD_FAILURE() << "nothing to place";
      return proto::ClusterView();
    }
    nodes_->CommitPlacement((*plan)->view);
    return nodes_->View();
  }
  std::vector<std::string> Events() { return job_->EventsFrom(0); }

  ClusterSection cluster_;
  FakeClock clock_{absl::FromUnixMillis(1764590000000)};
  std::unique_ptr<storage::FileSystem> fs_ = storage::NewMemoryFileSystem();
  std::unique_ptr<EventSink> sink_;
  std::unique_ptr<JobTracker> job_;
  ControlPlaneSecurity security_ = ControlPlaneSecurity::Plaintext();
  MetricsRegistry metrics_;
  std::unique_ptr<NodeManager> nodes_;
};

TEST_F(NodeManagerTest, SilentNodesAreDeclaredDeadAfterTheTimeoutOnItsClock) {
  NodeManager& n = Make(1, 2);
  const uint32_t ps = Join(proto::PSERVER, 0);
  const uint32_t w0 = Join(proto::WORKER, 0);
  const uint32_t w1 = Join(proto::WORKER, 1);
  EXPECT_EQ(n.Count(proto::WORKER, false), 2);
  clock_.Advance(absl::Milliseconds(cluster_.dead_timeout_ms - 100));
  ASSERT_THAT(Beat(ps), IsOk());
  ASSERT_THAT(Beat(w0), IsOk());
  EXPECT_THAT(n.Unresponsive(), IsEmpty());
  clock_.Advance(absl::Milliseconds(200));  // worker 1 silent for longer than the timeout
  auto silent = n.Unresponsive();
  ASSERT_THAT(silent, ElementsAre(Pair(w1, HasSubstr("missed heartbeats"))));
  const uint64_t epoch = n.View().epoch();
  auto d = n.DeclareDead(w1, silent[0].second, /*job_over=*/false);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->node.index(), 1);
  EXPECT_THAT(d->lost, IsEmpty());
  EXPECT_GT(n.View().epoch(), epoch);
  EXPECT_FALSE(n.InJob(w1));
  EXPECT_FALSE(n.DeclareDead(w1, "again", false).has_value());  // once
  EXPECT_TRUE(HasReason(Beat(w1), proto::REASON_DECLARED_DEAD));
  EXPECT_TRUE(HasReason(n.LiveWorker(w1).status(), proto::REASON_DECLARED_DEAD));
  proto::HeartbeatRequest unknown;
  unknown.set_node_id(99);
  EXPECT_TRUE(HasReason(n.Heartbeat(unknown).status(), proto::REASON_UNKNOWN_NODE));
  EXPECT_THAT(Events().back(), HasSubstr("worker 1 (node 3, h) declared dead: missed heartbeats"));
}

TEST_F(NodeManagerTest, ReadyOncePlacedAndEveryWorkerRegistered) {
  NodeManager& n = Make(2, 1);
  Join(proto::PSERVER, 0);
  auto early = n.PlanPlacement();
  ASSERT_THAT(early.status(), IsOk());
  EXPECT_FALSE(early->has_value());  // one pserver of two
  Join(proto::PSERVER, 1);
  EXPECT_FALSE(n.MarkReady().has_value());  // not placed
  const proto::ClusterView v = Place();
  EXPECT_GT(v.partitions_size(), 2);
  EXPECT_TRUE(n.placed());
  EXPECT_FALSE(n.MarkReady().has_value());  // no worker
  Join(proto::WORKER, 0);
  const std::optional<uint64_t> epoch = n.MarkReady();
  ASSERT_TRUE(epoch.has_value());
  EXPECT_EQ(*epoch, n.View().epoch());
  EXPECT_TRUE(n.ready());
  EXPECT_FALSE(n.MarkReady().has_value());  // once
}

TEST_F(NodeManagerTest, APServersPartitionsFailOverToSyncedBackupsOrAreLostAndRestored) {
  NodeManager& n = Make(3, 1, /*replication=*/1);
  const uint32_t a = Join(proto::PSERVER, 0);
  const uint32_t b = Join(proto::PSERVER, 1);
  const uint32_t c = Join(proto::PSERVER, 2);
  const proto::ClusterView v = Place();
  // Every backup in sync, except those that pserver c holds.
  std::map<uint32_t, std::vector<uint32_t>> held;
  for (const auto& p : v.partitions()) {
    for (uint32_t backup : p.backups()) held[backup].push_back(p.id());
  }
  ASSERT_THAT(Beat(a, held[a]), IsOk());
  ASSERT_THAT(Beat(b, held[b]), IsOk());
  ASSERT_THAT(Beat(c, {}), IsOk());
  int owned_by_a = 0, backed_by_c = 0;
  for (const auto& p : v.partitions()) {
    if (p.owner() != a) continue;
    ++owned_by_a;
    backed_by_c += p.backups(0) == c;
  }
  ASSERT_GT(owned_by_a, 0);
  auto d = n.DeclareDead(a, "killed", /*job_over=*/false);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(static_cast<int>(d->lost.size()), backed_by_c);
  proto::JobStatus js;
  n.FillStatus(&js);
  EXPECT_EQ(static_cast<int>(js.failovers()), owned_by_a - backed_by_c);
  const proto::ClusterView after_failover = n.View();
  for (const auto& p : after_failover.partitions()) {
    if (d->lost.count(p.id())) continue;
    EXPECT_NE(p.owner(), a) << p.id();
    for (uint32_t backup : p.backups()) EXPECT_NE(backup, a) << p.id();
  }
  EXPECT_EQ(n.has_lost(), backed_by_c > 0);
  if (backed_by_c == 0) return;
  // Restored from a checkpoint that holds them at version 5, rejoining at 9.
  proto::CheckpointManifest m;
  m.set_seq(3);
  for (const auto& p : v.partitions()) {
    proto::CheckpointPartition* e = m.add_partitions();
    e->set_id(p.id());
    e->set_version(5);
  }
  ASSERT_THAT(n.RestoreLost(m, /*newest=*/9), IsOk());
  EXPECT_FALSE(n.has_lost());
  const proto::ClusterView restored = n.View();
  for (const auto& p : restored.partitions()) {
    if (!d->lost.count(p.id())) continue;
    EXPECT_NE(p.owner(), a);
    EXPECT_EQ(p.restore_seq(), 3u);
    EXPECT_EQ(p.restore_version(), 9u);
  }
  proto::JobStatus after;
  n.FillStatus(&after);
  EXPECT_EQ(static_cast<int>(after.partitions_restored()), backed_by_c);
  EXPECT_EQ(static_cast<int>(after.steps_lost()), 4 * backed_by_c);
}

TEST_F(NodeManagerTest, ALostPartitionTheCheckpointLacksIsAnError) {
  NodeManager& n = Make(2, 1);
  const uint32_t a = Join(proto::PSERVER, 0);
  Join(proto::PSERVER, 1);
  Place();
  auto d = n.DeclareDead(a, "killed", false);
  ASSERT_TRUE(d.has_value());
  ASSERT_FALSE(d->lost.empty());  // no backups at all
  proto::CheckpointManifest empty;
  empty.set_seq(1);
  EXPECT_THAT(n.RestoreLost(empty, 0).message(), HasSubstr("checkpoint 1 does not hold it"));
}

TEST_F(NodeManagerTest, SuspectsAreProbedOnceThenDeclaredWhenReportsGoOn) {
  NodeManager& n = Make(1, 1);
  const uint32_t ps = Join(proto::PSERVER, 0);
  const uint32_t w = Join(proto::WORKER, 0);
  proto::ReportSuspectRequest r;
  r.set_node_id(w);
  r.set_suspect(ps);
  r.set_reason("connection refused");
  ASSERT_THAT(n.ReportSuspect(r).status(), IsOk());
  EXPECT_EQ(n.DueProbes().size(), 1u);
  EXPECT_TRUE(n.DueProbes().empty());  // one probe, not one per call
  EXPECT_EQ(n.Suspicion(ps), std::optional<std::string>("connection refused"));
  // Reports for longer than the dead timeout (the master hears it all along).
  for (int t = 0; t < cluster_.dead_timeout_ms; t += 1000) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_THAT(Beat(ps), IsOk());
    ASSERT_THAT(Beat(w), IsOk());
    ASSERT_THAT(n.ReportSuspect(r).status(), IsOk());
  }
  clock_.Advance(absl::Milliseconds(100));
  EXPECT_THAT(n.Unresponsive(), ElementsAre(Pair(ps, HasSubstr("unreachable from workers"))));
  // Reports that stop are forgotten.
  clock_.Advance(absl::Seconds(3));
  ASSERT_THAT(Beat(ps), IsOk());
  ASSERT_THAT(Beat(w), IsOk());
  EXPECT_THAT(n.Unresponsive(), IsEmpty());
  EXPECT_FALSE(n.Suspicion(ps).has_value());
  // About a node that is not a pserver: refused.
  r.set_suspect(w);
  EXPECT_FALSE(n.ReportSuspect(r).ok());
}

TEST_F(NodeManagerTest, DrainRefusesWhatWouldLoseWorkAndTakesTheRest) {
  NodeManager& n = Make(2, 2);
  const uint32_t a = Join(proto::PSERVER, 0);
  const uint32_t b = Join(proto::PSERVER, 1);
  const uint32_t w0 = Join(proto::WORKER, 0);
  const uint32_t w1 = Join(proto::WORKER, 1);
  Place();
  proto::DrainRequest req;
  req.set_node_id(0);
  EXPECT_THAT(n.Drain(req, proto::JOB_RUNNING, 0).status().message(),
              HasSubstr("the master cannot be drained"));
  req.set_node_id(a);  // (its partitions move first: APServerLeaving...)
  auto leaving = n.Drain(req, proto::JOB_RUNNING, 0);
  ASSERT_THAT(leaving.status(), IsOk());
  EXPECT_THAT(leaving->response.message(), HasSubstr("its partitions move"));
  EXPECT_FALSE(leaving->departure.has_value());
  req.set_node_id(b);
  EXPECT_THAT(n.Drain(req, proto::JOB_RUNNING, 0).status().message(),
              HasSubstr("is the last pserver: draining it would remove the last copy"));
  req.set_node_id(w0);
  auto drained = n.Drain(req, proto::JOB_RUNNING, 0);
  ASSERT_THAT(drained.status(), IsOk());
  EXPECT_TRUE(drained->changed);
  EXPECT_TRUE(n.LiveWorker(w0)->draining());
  req.set_node_id(w1);  // the last one not draining
  EXPECT_THAT(n.Drain(req, proto::JOB_RUNNING, 0).status().message(),
              HasSubstr("is the last worker"));
  n.WorkerDrained(w0);
  EXPECT_TRUE(n.IsDrainedWorker(w0));
  EXPECT_TRUE(HasReason(n.LiveWorker(w0).status(), proto::REASON_DECLARED_DEAD));
  req.set_node_id(w0);
  auto again = n.Drain(req, proto::JOB_RUNNING, 0);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_FALSE(again->changed);
  EXPECT_THAT(again->response.message(), HasSubstr("already drained"));
  auto after_end = n.Drain(req, proto::JOB_SUCCEEDED, 0);  // (said even once the job ended)
  ASSERT_THAT(after_end.status(), IsOk());
  EXPECT_THAT(after_end->response.message(), HasSubstr("already drained"));
  req.set_node_id(w1);
  EXPECT_THAT(n.Drain(req, proto::JOB_SUCCEEDED, 0).status().message(),
              HasSubstr("has already ended"));
}

TEST_F(NodeManagerTest, APServerWithSyncedBackupsDrainsAndItsBackupsTakeOver) {
  NodeManager& n = Make(2, 1, /*replication=*/1);
  const uint32_t a = Join(proto::PSERVER, 0);
  const uint32_t b = Join(proto::PSERVER, 1);
  Join(proto::WORKER, 0);
  const proto::ClusterView v = Place();
  std::vector<uint32_t> on_b;
  for (const auto& p : v.partitions()) {
    if (p.owner() == a) on_b.push_back(p.id());
  }
  proto::DrainRequest req;
  req.set_node_id(a);
  ASSERT_THAT(Beat(b, on_b), IsOk());
  auto drained = n.Drain(req, proto::JOB_RUNNING, 0);
  ASSERT_THAT(drained.status(), IsOk());
  ASSERT_TRUE(drained->departure.has_value());
  EXPECT_THAT(drained->departure->lost, IsEmpty());
  const proto::ClusterView after = n.View();
  for (const auto& p : after.partitions()) EXPECT_EQ(p.owner(), b) << p.id();
  proto::HeartbeatRequest h;
  h.set_node_id(a);
  auto beat = n.Heartbeat(h);
  ASSERT_THAT(beat.status(), IsOk());
  EXPECT_TRUE(beat->drained);
}

// Live migration in the node manager: the moves a pserver's leaving plans
// (its partitions onto the other, extra backups first), the cut-over once
// the target reported the copy in sync in a view showing the move, and
// the emptied pserver drained.
TEST_F(NodeManagerTest, APServerLeavingMovesItsPartitionsThenIsDrained) {
  NodeManager& n = Make(2, 1);
  const uint32_t a = Join(proto::PSERVER, 0);
  const uint32_t b = Join(proto::PSERVER, 1);
  Join(proto::WORKER, 0);
  const proto::ClusterView v = Place();
  std::vector<uint32_t> on_a;
  for (const auto& p : v.partitions()) {
    if (p.owner() == a) on_a.push_back(p.id());
  }
  ASSERT_FALSE(on_a.empty());
  n.MarkLeaving({a}, "test");
  NodeManager::MigrateOptions o;
  o.max_moves = 1;
  o.credit = 1;  // one move: then out of credit
  NodeManager::Migration m = n.Migrate(o);
  EXPECT_TRUE(m.changed);
  EXPECT_EQ(m.in_progress, 1);
  EXPECT_EQ(m.waiting, static_cast<int>(on_a.size()) - 1);
  EXPECT_GT(m.started_bytes, 0u);
  // (Both are sent the view showing the move at once.)
  EXPECT_EQ(m.touched, (std::set<uint32_t>{a, b}));
  uint32_t moving = 0;
  const proto::ClusterView view0 = n.View();
  for (const auto& p : view0.partitions()) {
    if (p.move_to() == 0) continue;
    moving = p.id();
    EXPECT_EQ(p.move_from(), a);
    EXPECT_EQ(p.move_to(), b);
    EXPECT_EQ(p.owner(), a);
    EXPECT_THAT(p.backups(), ElementsAre(b));  // the target, as an extra backup
  }
  // Not in sync yet: nothing cuts over, nothing more starts (no credit).
  o.credit = 0;
  m = n.Migrate(o);
  EXPECT_FALSE(m.changed);
  EXPECT_EQ(m.in_progress, 1);
  // In sync, but a checkpoint is being written: held.
  ASSERT_THAT(Beat(b, {moving}), IsOk());
  o.hold_cutover = true;
  EXPECT_FALSE(n.Migrate(o).changed);
  // Then it cuts over. The rest wait until the new owner has applied the
  // view that made it one (a copy made meanwhile would pause the workers
  // in the same step as the cut-over): they are counted as waiting.
  o.hold_cutover = false;
  o.max_moves = 1 << 20;
  o.credit = 1e12;
  m = n.Migrate(o);
  EXPECT_TRUE(m.changed);
  const proto::ClusterView view1 = n.View();
  for (const auto& p : view1.partitions()) {
    if (p.id() == moving) {
      EXPECT_EQ(p.owner(), b);
      EXPECT_THAT(p.backups(), IsEmpty());
      EXPECT_EQ(p.move_to(), 0u);
    }
  }
  EXPECT_EQ(m.in_progress, 0);
  EXPECT_EQ(m.waiting, static_cast<int>(on_a.size()) - 1);
  m = n.Migrate(o);
  EXPECT_FALSE(m.changed);
  EXPECT_EQ(m.waiting, static_cast<int>(on_a.size()) - 1);
  n.ViewApplied({a}, view1.epoch());  // (the source's answer is not the one)
  EXPECT_FALSE(n.Migrate(o).changed);
  n.ViewApplied({b}, view1.epoch());  // the new owner's PushView answered: the rest follow
  m = n.Migrate(o);
  EXPECT_TRUE(m.changed);
  EXPECT_EQ(m.in_progress, static_cast<int>(on_a.size()) - 1);
  ASSERT_THAT(Beat(b, on_a), IsOk());
  m = n.Migrate(o);
  EXPECT_EQ(m.in_progress, 0);
  EXPECT_EQ(m.waiting, 0);
  ASSERT_EQ(m.departed.size(), 1u);
  EXPECT_EQ(m.departed[0].node.id(), a);
  EXPECT_THAT(m.departed[0].lost, IsEmpty());
  const proto::ClusterView view2 = n.View();
  for (const auto& p : view2.partitions()) EXPECT_EQ(p.owner(), b) << p.id();
  proto::HeartbeatRequest h;
  h.set_node_id(a);
  EXPECT_TRUE(n.Heartbeat(h)->drained);
  proto::JobStatus js;
  n.FillStatus(&js);
  EXPECT_EQ(js.moves_done(), on_a.size());
  EXPECT_GT(js.moved_bytes(), 0u);
  EXPECT_THAT(Events(), Contains(HasSubstr("drained: its partitions moved to the others")));
}

// With replication 1 on 2 pservers, the one leaving backs the other's
// partitions: no pserver stays to take those backups, so they go with it
// (the job started on 1 pserver runs on 1 again) and it drains.
TEST_F(NodeManagerTest, BackupsNoPServerLeftCouldTakeGoWithThePServerLeaving) {
  NodeManager& n = Make(2, 1, /*replication=*/1);
  const uint32_t a = Join(proto::PSERVER, 0);
  const uint32_t b = Join(proto::PSERVER, 1);
  Join(proto::WORKER, 0);
  const proto::ClusterView v = Place();
  std::vector<uint32_t> all;
  for (const auto& p : v.partitions()) {
    ASSERT_EQ(p.backups_size(), 1) << p.id();
    all.push_back(p.id());
  }
  n.MarkLeaving({a}, "test");
  NodeManager::MigrateOptions o;
  o.max_moves = 1 << 20;
  o.credit = 1e12;
  NodeManager::Migration m = n.Migrate(o);
  EXPECT_TRUE(m.changed);
  EXPECT_TRUE(m.departed.empty());  // (its primaries move first)
  ASSERT_THAT(Beat(b, all), IsOk());
  m = n.Migrate(o);
  EXPECT_EQ(m.in_progress, 0);
  ASSERT_EQ(m.departed.size(), 1u);
  EXPECT_EQ(m.departed[0].node.id(), a);
  EXPECT_THAT(m.departed[0].lost, IsEmpty());
  const proto::ClusterView after = n.View();
  for (const auto& p : after.partitions()) {
    EXPECT_EQ(p.owner(), b) << p.id();
    EXPECT_THAT(p.backups(), IsEmpty()) << p.id();
  }
  EXPECT_THAT(Events(), Contains(HasSubstr("dropped, no other pserver left to hold them")));
}

// A move whose target dies is abandoned (and planned again elsewhere); a
// new pserver gets its share when asked to rebalance.
TEST_F(NodeManagerTest, AMoveWhoseTargetDiesIsAbandonedAndNewPServersTakeAShare) {
  NodeManager& n = Make(1, 1);
  const uint32_t a = Join(proto::PSERVER, 0);
  Join(proto::WORKER, 0);
  const proto::ClusterView v = Place();
  const uint32_t b = Join(proto::PSERVER, 1);
  const uint32_t c = Join(proto::PSERVER, 2);
  NodeManager::MigrateOptions o;
  o.max_moves = 64;
  o.credit = 1e12;
  EXPECT_FALSE(n.Migrate(o).changed);  // no rebalance asked for
  o.rebalance = true;
  NodeManager::Migration m = n.Migrate(o);
  EXPECT_GT(m.in_progress, 0);
  std::map<uint32_t, std::vector<uint32_t>> to;
  const proto::ClusterView view3 = n.View();
  for (const auto& p : view3.partitions()) {
    if (p.move_to() != 0) to[p.move_to()].push_back(p.id());
  }
  EXPECT_THAT(to, ElementsAre(Pair(b, Not(IsEmpty())), Pair(c, Not(IsEmpty()))));
  ASSERT_TRUE(n.DeclareDead(c, "test", false).has_value());
  ASSERT_THAT(Beat(b, to[b]), IsOk());
  m = n.Migrate(o);
  EXPECT_THAT(Events(), Contains(HasSubstr("abandoned: node " + std::to_string(c) + " left")));
  std::map<uint32_t, int> owned;
  const proto::ClusterView view4 = n.View();
  for (const auto& p : view4.partitions()) {
    ++owned[p.owner()];
    for (uint32_t x : p.backups()) EXPECT_NE(x, c);
  }
  EXPECT_EQ(owned[b], static_cast<int>(to[b].size()));
  EXPECT_EQ(owned[a] + owned[b], v.partitions_size());
}

// With replication, backups move too: a third pserver gets its share of
// primaries and of backups, each partition keeps one backup off its owner,
// and once balanced nothing more moves.
TEST_F(NodeManagerTest, BackupsMoveTooAndBalancedPlacementsStayPut) {
  NodeManager& n = Make(2, 1, /*replication=*/1);
  const uint32_t a = Join(proto::PSERVER, 0);
  const uint32_t b = Join(proto::PSERVER, 1);
  Join(proto::WORKER, 0);
  Place();
  const uint32_t c = Join(proto::PSERVER, 2);
  NodeManager::MigrateOptions o;
  o.rebalance = true;
  o.max_moves = 1 << 20;
  o.credit = 1e12;
  int rounds = 0;
  for (; rounds < 20; ++rounds) {
    NodeManager::Migration m = n.Migrate(o);
    if (m.in_progress == 0 && m.waiting == 0) break;
    // Every pserver reports every partition it backs as in sync.
    std::map<uint32_t, std::vector<uint32_t>> backs;
    const proto::ClusterView v = n.View();
    for (const auto& p : v.partitions()) {
      for (uint32_t x : p.backups()) backs[x].push_back(p.id());
    }
    for (uint32_t x : {a, b, c}) ASSERT_THAT(Beat(x, backs[x]), IsOk());
  }
  EXPECT_LT(rounds, 6) << "the moves did not settle";
  std::map<uint32_t, uint64_t> owned, backed;
  const proto::ClusterView v = n.View();
  for (const auto& p : v.partitions()) {
    ASSERT_EQ(p.backups_size(), 1) << p.id();
    EXPECT_NE(p.backups(0), p.owner());
    owned[p.owner()] += PartitionWeight(p);
    backed[p.backups(0)] += PartitionWeight(p);
  }
  EXPECT_EQ(owned.size(), 3u);
  EXPECT_EQ(backed.size(), 3u);
  // Settled: another turn plans nothing.
  NodeManager::Migration m = n.Migrate(o);
  EXPECT_EQ(m.in_progress + m.waiting, 0);
  EXPECT_FALSE(m.changed);
}

TEST_F(NodeManagerTest, ACertificateRegistersOnlyItsRoleHostAndIndex) {
  proto::RegisterRequest r;
  r.set_role(proto::WORKER);
  r.set_index(3);
  r.set_host("node-b");
  Identity who;
  who.source = "certificate";
  who.role = Role::kWorker;
  who.name = "worker-3@node-b";
  auto ok = RegistrationIdentity(r, "peer", who);
  ASSERT_THAT(ok.status(), IsOk());
  EXPECT_EQ(*ok, who.ToString());
  r.set_index(4);
  EXPECT_EQ(RegistrationIdentity(r, "peer", who).status().code(),
            absl::StatusCode::kPermissionDenied);
  r.set_index(3);
  r.set_host("node-c");
  EXPECT_EQ(RegistrationIdentity(r, "peer", who).status().code(),
            absl::StatusCode::kPermissionDenied);
  r.set_role(proto::PSERVER);
  EXPECT_EQ(RegistrationIdentity(r, "peer", who).status().code(),
            absl::StatusCode::kInvalidArgument);  // a pserver gives its addresses
  // A live instance is replaced by the same identity only.
  NodeManager& n = Make(1, 1);
  proto::RegisterRequest w;
  w.set_role(proto::WORKER);
  w.set_index(0);
  n.Add(w, "worker-0@h", "peer");
  EXPECT_EQ(n.CheckReplaceable(w, "worker-1@h", "peer").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(n.CheckReplaceable(w, "worker-0@h", "peer"), IsOk());
  EXPECT_THAT(n.LiveInstances(proto::WORKER, 0), ::testing::SizeIs(1));
}

TEST_F(NodeManagerTest, ARestartedMasterGivesEveryoneTimeToReconnect) {
  NodeManager& n = Make(1, 1);
  Join(proto::PSERVER, 0);
  const uint32_t w = Join(proto::WORKER, 0);
  Place();
  proto::MasterState st;
  n.Save(&st);
  for (const auto& m : st.view().members()) EXPECT_EQ(m.last_heartbeat_unix_ms(), 0);
  clock_.Advance(absl::Minutes(5));  // the master was down
  NodeManager& again = Make(1, 1);
  again.Restore(st);
  EXPECT_TRUE(again.placed());
  EXPECT_GT(again.View().epoch(), st.view().epoch());
  EXPECT_EQ(again.next_node_id(), st.next_node_id());
  clock_.Advance(absl::Milliseconds(cluster_.dead_timeout_ms));
  EXPECT_THAT(again.Unresponsive(), IsEmpty());  // twice the timeout from the restart
  clock_.Advance(absl::Milliseconds(cluster_.dead_timeout_ms + 1));
  EXPECT_EQ(again.Unresponsive().size(), 2u);
  EXPECT_TRUE(again.InJob(w));
}

// A restarted instance's registration: its predecessor is declared dead
// and handed over (the master requeues its tasks) before the new member
// is added; another identity may not replace a live instance.
TEST_F(NodeManagerTest, RegisterReplacesThePredecessorBeforeAddingTheNewInstance) {
  NodeManager& n = Make(1, 1);
  Join(proto::PSERVER, 0);
  const uint32_t old_worker = Join(proto::WORKER, 0);
  proto::RegisterRequest r;
  r.set_role(proto::WORKER);
  r.set_index(0);
  r.set_host("h");
  std::vector<uint32_t> departed;
  int members_when_departed = -1;
  auto fresh =
      n.Register(r, "peer", Identity(), /*job_over=*/false, [&](const NodeManager::Departure& d) {
        departed.push_back(d.node.id());
        members_when_departed = n.View().members_size();
      });
  ASSERT_THAT(fresh.status(), IsOk());
  EXPECT_THAT(departed, ElementsAre(old_worker));
  EXPECT_EQ(members_when_departed, 3);  // master, pserver, the old worker
  EXPECT_NE(fresh->id(), old_worker);
  EXPECT_TRUE(n.InJob(fresh->id()));
  EXPECT_FALSE(n.InJob(old_worker));
  proto::RegisterRequest bad = r;
  bad.set_role(proto::MASTER);
  EXPECT_FALSE(
      n.Register(bad, "peer", Identity(), false, [](const NodeManager::Departure&) {}).ok());
}

// A failed probe declares a pserver dead only while it is still suspected.
TEST_F(NodeManagerTest, DeclareUnreachableOnlyWhileSuspected) {
  NodeManager& n = Make(1, 1);
  const uint32_t ps = Join(proto::PSERVER, 0);
  const uint32_t w = Join(proto::WORKER, 0);
  const absl::Status probe = absl::UnavailableError("pserver node 1: connection refused");
  EXPECT_FALSE(n.DeclareUnreachable(ps, probe, false).has_value());  // nobody reported it
  proto::ReportSuspectRequest r;
  r.set_node_id(w);
  r.set_suspect(ps);
  r.set_reason("connection refused");
  ASSERT_THAT(n.ReportSuspect(r).status(), IsOk());
  auto d = n.DeclareUnreachable(ps, probe, false);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->node.id(), ps);
  EXPECT_FALSE(n.InJob(ps));
  EXPECT_THAT(Events().back(), HasSubstr("the master's probe failed too"));
  EXPECT_FALSE(n.DeclareUnreachable(ps, probe, false).has_value());  // once
}

}  // namespace
}  // namespace strata::master

namespace strata::master {
namespace {

TEST_F(NodeManagerTest, TheFirstDeclarationIsTheJobsTablesAndItsWorkerWritesTheirValues) {
  NodeManager& n = Make(1, 2, 0, /*script_tables=*/true);
  const uint32_t ps = Join(proto::PSERVER, 0);
  const uint32_t w0 = Join(proto::WORKER, 0);
  const uint32_t w1 = Join(proto::WORKER, 1);
  // Nothing to place before a worker declares the tables.
  auto none = n.PlanPlacement();
  ASSERT_THAT(none.status(), IsOk());
  EXPECT_FALSE(none->has_value());
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> model = {{"fc.weight", {8, 4}},
                                                                            {"fc.bias", {8}}};
  bool changed = false;
  auto first = n.DeclareTables(Declaration(w1, model), &changed);
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_TRUE(first->initialise());
  EXPECT_FALSE(first->initialised());
  EXPECT_TRUE(changed);
  const proto::ClusterView declared = n.View();
  ASSERT_EQ(declared.tables_size(), 3);
  EXPECT_EQ(declared.tables(0).num_elements(), 32u);
  EXPECT_EQ(declared.tables(0).init(), "worker");
  EXPECT_EQ(declared.tables(2).partitions(), 2u);
  EXPECT_EQ(declared.tables_declared_by(), w1);
  EXPECT_EQ(n.AwaitedInitialValues(), "worker 1 (node 3)");
  // The other worker waits for the values; a different model is refused
  // naming the table.
  auto other = n.DeclareTables(Declaration(w0, model), &changed);
  ASSERT_THAT(other.status(), IsOk());
  EXPECT_FALSE(other->initialise() || other->initialised());
  EXPECT_FALSE(changed);
  auto wrong =
      n.DeclareTables(Declaration(w0, {{"fc.weight", {8, 4}}, {"fc.bias", {9}}}), &changed);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("table 1 is fc.bias (dense [9]) in the model of worker 0 (node 2), "
                        "fc.bias (dense [8]) in the tables declared by worker 1 (node 3)"));
  auto fewer = n.DeclareTables(Declaration(w0, {{"fc.weight", {8, 4}}}), &changed);
  EXPECT_THAT(fewer.status().message(), HasSubstr("table 1 is emb (sparse of dim 4)"));
  // Malformed declarations are named.
  auto bad = n.DeclareTables(Declaration(w0, {{"fc.weight", {8, 0}}}), &changed);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("worker 0 (node 2): table 0 (fc.weight): shape"));
  auto twice = n.DeclareTables(Declaration(w0, {{"emb", {2}}}), &changed);
  EXPECT_THAT(twice.status().message(), HasSubstr("table 1 (emb): declared twice"));
  // Values "written" before placement do not count; after it they do, and
  // only then is the view ready.
  auto early = n.DeclareTables(Declaration(w1, model, true), &changed);
  ASSERT_THAT(early.status(), IsOk());
  EXPECT_FALSE(early->initialised());
  const proto::ClusterView placed = Place();
  EXPECT_GT(placed.partitions_size(), 2);
  EXPECT_FALSE(n.MarkReady().has_value());
  auto done = n.DeclareTables(Declaration(w1, model, true), &changed);
  ASSERT_THAT(done.status(), IsOk());
  EXPECT_TRUE(done->initialised());
  EXPECT_TRUE(changed);
  EXPECT_EQ(n.AwaitedInitialValues(), std::nullopt);
  EXPECT_TRUE(n.MarkReady().has_value());
  auto later = n.DeclareTables(Declaration(w0, model), &changed);
  ASSERT_THAT(later.status(), IsOk());
  EXPECT_TRUE(later->initialised());
  EXPECT_FALSE(later->initialise());
  // A pserver is no worker: its declaration is refused.
  auto from_ps = n.DeclareTables(Declaration(ps, model), &changed);
  EXPECT_EQ(from_ps.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(NodeManagerTest, WhenTheDeclaringWorkerLeavesFirstTheNextWritesTheValues) {
  NodeManager& n = Make(1, 2, 0, /*script_tables=*/true);
  Join(proto::PSERVER, 0);
  const uint32_t w0 = Join(proto::WORKER, 0);
  const uint32_t w1 = Join(proto::WORKER, 1);
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> model = {{"w", {3}}};
  bool changed = false;
  ASSERT_TRUE(n.DeclareTables(Declaration(w0, model), &changed)->initialise());
  EXPECT_FALSE(n.DeclareTables(Declaration(w1, model), &changed)->initialise());
  ASSERT_TRUE(n.DeclareDead(w0, "killed", false).has_value());
  auto next = n.DeclareTables(Declaration(w1, model), &changed);
  ASSERT_THAT(next.status(), IsOk());
  EXPECT_TRUE(next->initialise());
  EXPECT_TRUE(changed);
  EXPECT_EQ(n.View().tables_declared_by(), w1);
  EXPECT_THAT(n.DeclareTables(Declaration(w0, model), &changed).status().message(),
              HasSubstr("not a live worker"));
}

TEST_F(NodeManagerTest, TablesOfTheConfigAreCheckedNotReplaced) {
  NodeManager& n = Make(1, 1);
  const uint32_t w0 = Join(proto::WORKER, 0);
  bool changed = false;
  auto r = n.DeclareTables(Declaration(w0, {{"fc0.weight", {784, 256}}}), &changed);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("in the config's model.tables"));
  EXPECT_FALSE(changed);
}

}  // namespace
}  // namespace strata::master
