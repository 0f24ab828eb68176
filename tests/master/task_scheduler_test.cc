#include "master/task_scheduler.h"

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata::master {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1000);
const absl::Duration kLease = absl::Seconds(10);

// Leases every pending task to `node` at `now`, in lease order.
std::vector<proto::DataTask> LeaseAll(TaskScheduler& s, uint32_t node, absl::Time now) {
  std::vector<proto::DataTask> out;
  while (auto t = s.Lease(node, now)) out.push_back(*t);
  return out;
}

TEST(TaskSchedulerTest, EachEpochCoversAllRecordsExactlyOnce) {
  // 10 records in tasks of 4: [0,4) [4,8) [8,10) per epoch; 3 epochs -> 9
  // tasks.
  TaskScheduler s(10, 4, 3, 7, kLease);
  EXPECT_EQ(s.total(), 9u);
  EXPECT_EQ(s.pending(), 9u);
  const auto tasks = LeaseAll(s, 1, kT0);
  ASSERT_EQ(tasks.size(), 9u);
  std::set<uint64_t> ids;
  for (int e = 0; e < 3; ++e) {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const auto& t : tasks) {
      if (t.epoch() == e) ranges.emplace_back(t.begin(), t.end());
    }
    std::sort(ranges.begin(), ranges.end());
    EXPECT_THAT(ranges, ElementsAre(Pair(0, 4), Pair(4, 8), Pair(8, 10))) << "epoch " << e;
  }
  for (const auto& t : tasks) ids.insert(t.id());
  EXPECT_EQ(ids, (std::set<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(s.pending(), 0u);
  EXPECT_EQ(s.leased(), 9u);
}

TEST(TaskSchedulerTest, ExactMultipleHasNoShortTask) {
  // 8 records in tasks of 4: two full tasks.
  TaskScheduler s(8, 4, 1, 1, kLease);
  auto tasks = LeaseAll(s, 1, kT0);
  ASSERT_EQ(tasks.size(), 2u);
  for (const auto& t : tasks) EXPECT_EQ(t.end() - t.begin(), 4);
}

TEST(TaskSchedulerTest, EpochsAreLeasedInOrder) {
  TaskScheduler s(10, 3, 2, 99, kLease);  // 4 tasks per epoch
  const auto tasks = LeaseAll(s, 1, kT0);
  ASSERT_EQ(tasks.size(), 8u);
  for (size_t i = 0; i < tasks.size(); ++i) {
    EXPECT_EQ(tasks[i].epoch(), i < 4 ? 0 : 1) << "lease " << i;
  }
}

TEST(TaskSchedulerTest, SameSeedSameOrder) {
  TaskScheduler a(100, 10, 2, 5, kLease), b(100, 10, 2, 5, kLease);
  const auto ta = LeaseAll(a, 1, kT0), tb = LeaseAll(b, 1, kT0);
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].begin(), tb[i].begin());
    EXPECT_EQ(ta[i].epoch(), tb[i].epoch());
  }
}

TEST(TaskSchedulerTest, LeaseAndComplete) {
  TaskScheduler s(10, 4, 1, 1, kLease);
  auto t = s.Lease(1, kT0);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(s.pending(), 2u);
  EXPECT_EQ(s.leased(), 1u);
  EXPECT_THAT(s.Complete(1, t->id()), IsOk());
  EXPECT_EQ(s.done(), 1u);
  EXPECT_EQ(s.leased(), 0u);
  EXPECT_EQ(s.pending(), 2u);
  EXPECT_FALSE(s.AllDone());
}

TEST(TaskSchedulerTest, HeldGivesANodesLeaseRenewedAndNothingForOthers) {
  TaskScheduler s(10, 4, 1, 1, kLease);
  EXPECT_FALSE(s.Held(1, kT0).has_value());
  auto t = s.Lease(1, kT0);
  ASSERT_TRUE(t.has_value());
  EXPECT_FALSE(s.Held(2, kT0).has_value());
  // Asked again just before it would expire: renewed from then.
  auto held = s.Held(1, kT0 + kLease - absl::Seconds(1), /*first_step=*/5);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->id(), t->id());
  EXPECT_EQ(s.ExpireLeases(kT0 + kLease + absl::Seconds(1)), 0);
  EXPECT_EQ(s.leased(), 1u);
  EXPECT_EQ(s.pending(), 2u);  // nothing new was leased
  EXPECT_THAT(s.Complete(1, t->id()), IsOk());
  EXPECT_FALSE(s.Held(1, kT0).has_value());
}

TEST(TaskSchedulerTest, LeaseReturnsNulloptWhenNothingPending) {
  TaskScheduler s(4, 4, 1, 1, kLease);
  ASSERT_TRUE(s.Lease(1, kT0).has_value());
  EXPECT_FALSE(s.Lease(2, kT0).has_value());
  EXPECT_FALSE(s.AllDone());  // the one task is leased, not done
}

TEST(TaskSchedulerTest, CompletingATaskLeasedElsewhereIsFailedPrecondition) {
  TaskScheduler s(10, 4, 1, 1, kLease);
  auto t = s.Lease(1, kT0);
  ASSERT_TRUE(t.has_value());
  EXPECT_THAT(s.Complete(2, t->id()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not leased to node 2")));
  EXPECT_EQ(s.done(), 0u);
  EXPECT_EQ(s.leased(), 1u);
  // A pending (never leased) task cannot be completed either.
  auto next = s.Lease(1, kT0);
  ASSERT_TRUE(next.has_value());
  const auto pending = LeaseAll(s, 3, kT0);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(s.ReleaseNode(3), 1);
  EXPECT_THAT(s.Complete(1, pending[0].id()), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(TaskSchedulerTest, UnknownTaskIsNotFound) {
  TaskScheduler s(10, 4, 1, 1, kLease);  // ids 0..2
  EXPECT_THAT(s.Complete(1, 3),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown data task 3")));
}

TEST(TaskSchedulerTest, CompleteIsIdempotent) {
  TaskScheduler s(10, 4, 1, 1, kLease);
  auto t = s.Lease(1, kT0);
  ASSERT_TRUE(t.has_value());
  EXPECT_THAT(s.Complete(1, t->id()), IsOk());
  EXPECT_THAT(s.Complete(1, t->id()), IsOk());
  EXPECT_EQ(s.done(), 1u);
}

TEST(TaskSchedulerTest, ReleaseNodeReturnsItsLeasesToTheFront) {
  TaskScheduler s(20, 4, 1, 1, kLease);  // 5 tasks
  auto a1 = s.Lease(1, kT0), b = s.Lease(2, kT0), a2 = s.Lease(1, kT0);
  ASSERT_TRUE(a1 && b && a2);
  EXPECT_EQ(s.pending(), 2u);
  EXPECT_EQ(s.ReleaseNode(1), 2);
  EXPECT_EQ(s.pending(), 4u);
  EXPECT_EQ(s.leased(), 1u);
  // Node 1's tasks are leased again before the never-leased ones.
  auto n1 = s.Lease(3, kT0), n2 = s.Lease(3, kT0);
  ASSERT_TRUE(n1 && n2);
  EXPECT_THAT((std::vector<uint64_t>{n1->id(), n2->id()}),
              UnorderedElementsAre(a1->id(), a2->id()));
  // Node 1 lost them: completing is refused; node 3 may.
  EXPECT_THAT(s.Complete(1, a1->id()), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(s.Complete(3, a1->id()), IsOk());
  EXPECT_EQ(s.ReleaseNode(1), 0);
}

TEST(TaskSchedulerTest, ExpireLeasesAtTheLeaseTimeout) {
  TaskScheduler s(10, 4, 1, 1, kLease);
  auto a = s.Lease(1, kT0);                     // expires at T0 + 10 s
  auto b = s.Lease(2, kT0 + absl::Seconds(5));  // expires at T0 + 15 s
  ASSERT_TRUE(a && b);
  EXPECT_EQ(s.ExpireLeases(kT0 + absl::Seconds(9)), 0);
  EXPECT_EQ(s.ExpireLeases(kT0 + absl::Milliseconds(9999)), 0);
  EXPECT_EQ(s.ExpireLeases(kT0 + absl::Seconds(10)), 1);  // a: expires <= now
  EXPECT_EQ(s.leased(), 1u);
  EXPECT_EQ(s.pending(), 2u);
  EXPECT_THAT(s.Complete(1, a->id()), StatusIs(absl::StatusCode::kFailedPrecondition));
  // The expired task is next in line.
  auto again = s.Lease(3, kT0 + absl::Seconds(11));  // expires at T0 + 21 s
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->id(), a->id());
  EXPECT_EQ(s.ExpireLeases(kT0 + absl::Seconds(15)), 1);  // b
  EXPECT_EQ(s.ExpireLeases(kT0 + absl::Seconds(20)), 0);
  EXPECT_THAT(s.Complete(3, again->id()), IsOk());
}

// The state log records what changed (master/state_log.h): completions,
// leases given (with their holder now) and ended, and nothing twice.
TEST(TaskSchedulerTest, TakeChangesSaysWhatChangedSinceTheLastCall) {
  TaskScheduler s(20, 4, 1, 1, kLease);  // 5 tasks
  auto untracked = s.Lease(1, kT0);
  ASSERT_TRUE(untracked.has_value());
  EXPECT_TRUE(s.TakeChanges().empty());  // nothing kept before TrackChanges
  s.TrackChanges();
  auto a = s.Lease(1, kT0), b = s.Lease(2, kT0);
  ASSERT_TRUE(a && b);
  ASSERT_THAT(s.Complete(1, untracked->id()), IsOk());
  TaskScheduler::Changes c = s.TakeChanges();
  EXPECT_THAT(c.done, ElementsAre(untracked->id()));
  EXPECT_THAT(c.leased, UnorderedElementsAre(Pair(a->id(), 1u), Pair(b->id(), 2u)));
  EXPECT_THAT(c.ended, ElementsAre(untracked->id()));
  EXPECT_TRUE(s.TakeChanges().empty());
  // A lease taken back and given to another node is one change: its holder.
  EXPECT_EQ(s.ReleaseNode(1), 1);
  auto again = s.Lease(3, kT0 + absl::Seconds(1));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->id(), a->id());
  EXPECT_EQ(s.ExpireLeases(kT0 + kLease), 1);           // b's
  ASSERT_THAT(s.Complete(1, untracked->id()), IsOk());  // again: no change
  c = s.TakeChanges();
  EXPECT_TRUE(c.done.empty());
  EXPECT_THAT(c.leased, ElementsAre(Pair(a->id(), 3u)));
  EXPECT_THAT(c.ended, ElementsAre(b->id()));
  // Resuming from a checkpoint's cut completes tasks too.
  ASSERT_THAT(s.Resume({b->id()}, {}), IsOk());
  EXPECT_THAT(s.TakeChanges().done, ElementsAre(b->id()));
}

// Tasks taken back from a departed node are counted with their records;
// an expired lease is not a departure and is not counted.
TEST(TaskSchedulerTest, ReleaseNodeCountsTheTasksRequeuedAndTheirRecords) {
  TaskScheduler s(10, 4, 1, 1, kLease);  // tasks of 4, 4 and 2 records
  auto a = s.Lease(1, kT0), b = s.Lease(1, kT0), c = s.Lease(2, kT0);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(s.ExpireLeases(kT0 + kLease), 3);
  EXPECT_EQ(s.requeued(), 0u);
  a = s.Lease(1, kT0 + kLease);
  b = s.Lease(1, kT0 + kLease);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(s.ReleaseNode(1), 2);
  EXPECT_EQ(s.requeued(), 2u);
  EXPECT_EQ(s.records_requeued(), s.RecordsOf(a->id()) + s.RecordsOf(b->id()));
  proto::JobStatus js;
  s.FillStatus(&js);
  EXPECT_EQ(js.tasks_requeued(), 2u);
  EXPECT_EQ(js.tasks_total(), 3u);
  EXPECT_EQ(js.tasks_done(), 0u);
}

// The state log's part: saved (small and whole), recorded as changes,
// and taken up by a restarted master, which keeps the leases of the nodes
// still in the job only.
TEST(TaskSchedulerTest, SaveRecordAndRestoreTheTasksAndLeases) {
  TaskScheduler s(20, 4, 1, 1, kLease);  // 5 tasks
  s.TrackChanges();
  auto a = s.Lease(1, kT0), b = s.Lease(2, kT0), c = s.Lease(3, kT0);
  ASSERT_TRUE(a && b && c);
  ASSERT_THAT(s.Complete(1, a->id()), IsOk());
  EXPECT_EQ(s.ReleaseNode(3), 1);
  const proto::MasterState record = s.TakeChangeRecord();
  EXPECT_THAT(record.tasks_done(), ElementsAre(a->id()));
  EXPECT_THAT(record.task_leases(), UnorderedElementsAre(Pair(b->id(), 2u)));
  EXPECT_THAT(record.leases_ended(), UnorderedElementsAre(a->id(), c->id()));
  EXPECT_EQ(s.TakeChangeRecord().ByteSizeLong(), 0u);

  proto::MasterState small;
  s.Save(&small, /*whole=*/false);
  EXPECT_EQ(small.tasks_requeued(), 1u);
  EXPECT_EQ(small.tasks_done_size(), 0);
  EXPECT_EQ(small.task_leases_size(), 0);
  proto::MasterState whole;
  s.Save(&whole, /*whole=*/true);
  EXPECT_THAT(whole.tasks_done(), ElementsAre(a->id()));
  EXPECT_THAT(whole.task_leases(), UnorderedElementsAre(Pair(b->id(), 2u)));
  (*whole.mutable_task_leases())[c->id()] = 3;  // node 3 has left the job

  TaskScheduler restarted(20, 4, 1, 1, kLease);
  ASSERT_THAT(restarted.Restore(
                  whole, [](uint32_t node) { return node != 3; }, kT0 + absl::Seconds(1)),
              IsOk());
  EXPECT_EQ(restarted.done(), 1u);
  EXPECT_EQ(restarted.requeued(), 1u);
  EXPECT_THAT(restarted.Leases(), ElementsAre(Pair(b->id(), 2u)));
  EXPECT_EQ(restarted.pending(), 3u);  // c's task is pending again
  proto::MasterState bad = whole;
  bad.add_tasks_done(99);
  TaskScheduler other(20, 4, 1, 1, kLease);
  EXPECT_THAT(other.Restore(
                  bad, [](uint32_t) { return true; }, kT0),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// A checkpoint's manifest: the tasks done and partly done at the cut, and
// the samples in the parameters there.
TEST(TaskSchedulerTest, FillManifestCountsTheSamplesAtTheCut) {
  TaskScheduler s(20, 4, 1, 1, kLease);  // 5 tasks of 4 records
  auto a = s.Lease(1, kT0, /*first_step=*/0);
  ASSERT_TRUE(a.has_value());
  ASSERT_THAT(s.Complete(1, a->id(), /*last_step=*/1), IsOk());  // steps 0, 1 (batch 2)
  auto b = s.Lease(1, kT0, /*first_step=*/2);
  ASSERT_TRUE(b.has_value());
  proto::CheckpointManifest m;
  s.FillManifest(/*step=*/3, /*batch_size=*/2, &m);  // steps 0..2 applied
  EXPECT_THAT(m.tasks_done(), ElementsAre(a->id()));
  ASSERT_EQ(m.tasks_partial_size(), 1);
  EXPECT_EQ(m.tasks_partial(0).id(), b->id());
  EXPECT_EQ(m.tasks_partial(0).trained_records(), 2);
  EXPECT_EQ(m.samples(), 6u);
  // A job resumed from it: a done, b's first two records skipped.
  TaskScheduler resumed(20, 4, 1, 1, kLease);
  ASSERT_THAT(resumed.ResumeFrom(m), IsOk());
  EXPECT_EQ(resumed.done(), 1u);
  bool found = false;
  while (auto t = resumed.Lease(2, kT0)) {
    if (t->id() != b->id()) continue;
    EXPECT_EQ(t->skip_records(), 2);
    found = true;
  }
  EXPECT_TRUE(found);
}

// A task leased with its own batch (elastic.batch fixed_global: the
// global batch split over the workers there are) is cut by that batch.
TEST(TaskSchedulerTest, ATaskLeasedWithItsOwnBatchIsCutByIt) {
  TaskScheduler s(20, 4, 1, 1, kLease);  // 5 tasks of 4 records
  auto a = s.Lease(1, kT0, /*first_step=*/0, /*batch_size=*/1);
  auto b = s.Lease(2, kT0, /*first_step=*/0);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(s.BatchOf(a->id()), 1);
  EXPECT_EQ(s.BatchOf(b->id()), 0);
  EXPECT_EQ(s.Held(1, kT0, /*first_step=*/0).value().id(), a->id());
  EXPECT_EQ(s.BatchOf(a->id()), 1);  // (held again: the same batch)
  const TaskScheduler::Cut cut = s.CutAt(/*step=*/3, /*batch_size=*/2);
  EXPECT_THAT(cut.partial, ElementsAre(Pair(a->id(), 3)));  // 3 steps of 1 record
  EXPECT_THAT(cut.done, ElementsAre(b->id()));              // 3 steps of 2: all 4 records
}

TEST(TaskSchedulerTest, JobTasksCutByRecordsOrByBytes) {
  JobConfig config;
  config.job.epochs = 2;
  config.data.task_records = 4;
  config.cluster.task_lease_timeout_ms = 1000;
  TrainingSetSize by_records;
  by_records.records = 10;
  EXPECT_EQ(JobTasks(by_records, config).total(), 6u);  // 3 per epoch
  TrainingSetSize by_bytes;
  by_bytes.records = 100;
  by_bytes.split = TaskScheduler::ByteSplit{1000, 250, 10};
  EXPECT_EQ(JobTasks(by_bytes, config).total(), 8u);  // 4 per epoch
}

TEST(TaskSchedulerTest, AllDoneAndCurrentEpoch) {
  TaskScheduler s(10, 4, 2, 3, kLease);  // 3 tasks per epoch, 2 epochs
  EXPECT_EQ(s.current_epoch(), 0);
  const auto tasks = LeaseAll(s, 1, kT0);
  ASSERT_EQ(tasks.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(s.current_epoch(), i < 3 ? 0 : 1) << "after " << i << " completions";
    EXPECT_FALSE(s.AllDone());
    EXPECT_THAT(s.Complete(1, tasks[i].id()), IsOk());
  }
  EXPECT_TRUE(s.AllDone());
  EXPECT_EQ(s.done(), 6u);
  EXPECT_EQ(s.current_epoch(), 2);  // == epochs once all done
}

TEST(TaskSchedulerTest, CurrentEpochWaitsForTheSlowestTaskOfTheEpoch) {
  TaskScheduler s(10, 4, 2, 3, kLease);
  const auto tasks = LeaseAll(s, 1, kT0);
  // Complete all of epoch 1 and two of epoch 0: still epoch 0.
  for (size_t i : {0u, 1u, 3u, 4u, 5u}) EXPECT_THAT(s.Complete(1, tasks[i].id()), IsOk());
  EXPECT_EQ(s.current_epoch(), 0);
  EXPECT_THAT(s.Complete(1, tasks[2].id()), IsOk());
  EXPECT_EQ(s.current_epoch(), 2);
}

TEST(TaskSchedulerTest, ByteSplitTilesTheFileEachEpochWithRecordEstimates) {
  // 1000 bytes at 10 bytes per record, tasks of 300 bytes: 4 per epoch.
  TaskScheduler s(TaskScheduler::ByteSplit{1000, 300, 10.0}, 2, 7, kLease);
  EXPECT_EQ(s.total(), 8u);
  const auto tasks = LeaseAll(s, 1, kT0);
  for (int e = 0; e < 2; ++e) {
    std::vector<std::pair<int64_t, int64_t>> bytes, records;
    for (const auto& t : tasks) {
      if (t.epoch() != e) continue;
      EXPECT_TRUE(t.by_bytes());
      bytes.emplace_back(t.byte_begin(), t.byte_end());
      records.emplace_back(t.begin(), t.end());
    }
    std::sort(bytes.begin(), bytes.end());
    std::sort(records.begin(), records.end());
    EXPECT_THAT(bytes, ElementsAre(Pair(0, 300), Pair(300, 600), Pair(600, 900), Pair(900, 1000)));
    EXPECT_THAT(records, ElementsAre(Pair(0, 30), Pair(30, 60), Pair(60, 90), Pair(90, 100)));
  }
  // The records a worker reports replace the estimate.
  ASSERT_THAT(s.Complete(1, tasks[0].id(), 5, /*records=*/41), IsOk());
  EXPECT_EQ(s.RecordsOf(tasks[0].id()), 41);
  EXPECT_EQ(s.RecordsDone(), 41);
  EXPECT_EQ(s.RecordsOf(tasks[1].id()), tasks[1].end() - tasks[1].begin());
}

TEST(TaskSchedulerTest, AByteTaskStaysPartialAtACutUntilItsSizeIsKnown) {
  TaskScheduler s(TaskScheduler::ByteSplit{1000, 1000, 10.0}, 1, 7, kLease);
  auto t = s.Lease(1, kT0, /*first_step=*/10);
  ASSERT_TRUE(t.has_value());
  // 20 steps of 8: 160 records, more than the estimate of 100. Its real
  // size is unknown: partial, so a resumed worker skips what it had.
  TaskScheduler::Cut cut = s.CutAt(30, 8);
  EXPECT_TRUE(cut.done.empty());
  EXPECT_THAT(cut.partial, ElementsAre(Pair(t->id(), 160)));
  // Completed after the cut with 170 records: still partial at step 30.
  ASSERT_THAT(s.Complete(1, t->id(), 31, 170), IsOk());
  EXPECT_THAT(s.CutAt(30, 8).partial, ElementsAre(Pair(t->id(), 160)));
  // With 160 records it was done at the cut.
  TaskScheduler s2(TaskScheduler::ByteSplit{1000, 1000, 10.0}, 1, 7, kLease);
  auto t2 = s2.Lease(1, kT0, 10);
  ASSERT_THAT(s2.Complete(1, t2->id(), 31, 160), IsOk());
  EXPECT_THAT(s2.CutAt(30, 8).done, ElementsAre(t2->id()));

  // Resumed: the skip is kept whatever the estimate, and the task is leased.
  TaskScheduler r(TaskScheduler::ByteSplit{1000, 1000, 10.0}, 1, 7, kLease);
  ASSERT_THAT(r.Resume({}, {{0, 160}}), IsOk());
  EXPECT_EQ(r.pending(), 1u);
  auto again = r.Lease(1, kT0);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->skip_records(), 160);
}

}  // namespace
}  // namespace strata::master
