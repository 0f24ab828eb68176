// The master's components as one bundle, and what is put together from
// all of them: the state the state log keeps (each component saves its
// own part) and what the master reports (JobStatus, the summary).
//
// The bundle borrows the components; MasterServer owns them and calls
// these under its lock (MasterServer::mu_, which guards the task
// scheduler); each component takes its own lock inside.
#ifndef STRATA_MASTER_MASTER_PARTS_H_
#define STRATA_MASTER_MASTER_PARTS_H_

#include <string>

#include "master/checkpoint_coordinator.h"
#include "master/event_sink.h"
#include "master/job_tracker.h"
#include "master/node_manager.h"
#include "master/scaler.h"
#include "master/task_scheduler.h"
#include "proto/strata.pb.h"

namespace strata::master {

struct MasterParts {
  const NodeManager* nodes = nullptr;
  const JobTracker* job = nullptr;
  const CheckpointCoordinator* checkpoints = nullptr;
  const TaskScheduler* tasks = nullptr;  // guarded by the master's lock
  const Scaler* scaler = nullptr;        // guarded by the master's lock
  const EventSink* sink = nullptr;
  // What the master was started with.
  int expected_pservers = 1;
  int expected_workers = 1;
  std::string security;  // JobStatus.security: "plaintext", "mtls", ...
  bool checkpoints_on = false;
};

// The master's state for the state log (docs/reliability.md): each
// component's part; without `whole`, the small part only (no tasks done,
// leases or events: O(nodes), not O(tasks)).
proto::MasterState SaveMasterState(const MasterParts& parts, bool whole);

// The job's status (GetStatus, /status, the page, the history's points)
// and, at the end, its summary (summary.json).
proto::JobStatus MasterJobStatus(const MasterParts& parts);
proto::JobSummary MasterJobSummary(const MasterParts& parts);

}  // namespace strata::master

#endif  // STRATA_MASTER_MASTER_PARTS_H_
