// strata-state-log-bench: what the master's state log (master/state_log.h)
// costs per completed data task, and how long a restarted master takes to
// replay it, for a job of --tasks data tasks. It drives the task scheduler
// and the state log as the master does (master_server.cc, PersistLocked):
// each completed task is one record, synced before the completion is
// acknowledged. --mode whole writes the whole state in every record (what
// the state log did before it recorded changes); --mode delta writes what
// changed (the master today). --store etcd --etcd HOST:PORT writes the
// records to etcd instead (master/etcd_state.h: each one a transaction
// fenced by the leader key, as a leading master of several writes them);
// bench/state_store_bench.sh compares the two. docs/performance.md has the
// figures.
//
// Every task is completed, but only --samples of them, evenly spread over
// the job, are recorded and timed (writing the whole state a million times
// would take days): the mean over them is the mean over the job.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gflags/gflags.h"
#include "master/etcd_client.h"
#include "master/etcd_state.h"
#include "master/leadership.h"
#include "master/state_log.h"
#include "master/task_scheduler.h"
#include "proto/strata.pb.h"
#include "storage/file_system.h"

DEFINE_int64(tasks, 1000000, "data tasks in the job");
DEFINE_int32(samples, 200, "completions recorded and timed, spread over the job");
DEFINE_string(mode, "delta", "whole | delta");
DEFINE_string(dir, "", "the state directory (made under /tmp when empty; removed after)");
DEFINE_int32(pservers, 8, "nodes in the view (its size is in every record)");
DEFINE_int32(workers, 8, "");
DEFINE_int32(partitions, 64, "");
DEFINE_string(store, "file", "file (a state directory) | etcd");
DEFINE_string(etcd, "", "--store etcd: the etcd endpoint (host:port)");

namespace {

namespace proto = ::strata::proto;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// A view of a running job of that size.
proto::ClusterView View() {
  proto::ClusterView v;
  v.set_epoch(7);
  v.set_ready(true);
  uint32_t id = 1;
  for (int i = 0; i < FLAGS_pservers + FLAGS_workers; ++i) {
    proto::NodeInfo* n = v.add_members();
    n->set_id(id++);
    n->set_role(i < FLAGS_pservers ? proto::PSERVER : proto::WORKER);
    n->set_index(i < FLAGS_pservers ? i : i - FLAGS_pservers);
    n->set_host(absl::StrCat("node-", i));
    n->set_grpc_address(absl::StrCat("10.0.0.", i, ":7000"));
    n->set_data_address(absl::StrCat("10.0.0.", i, ":7001"));
    n->set_state(proto::ALIVE);
  }
  for (int p = 0; p < FLAGS_partitions; ++p) {
    proto::PartitionInfo* part = v.add_partitions();
    part->set_id(p);
    part->set_table_id(p % 4);
    part->set_offset(p * 262144);
    part->set_length(262144);
    part->set_owner(1 + p % FLAGS_pservers);
    part->add_backups(1 + (p + 1) % FLAGS_pservers);
  }
  return v;
}

// The master's state without its tasks (StateLocked's small part).
proto::MasterState Small(const proto::ClusterView& view, uint64_t done) {
  proto::MasterState st;
  *st.mutable_view() = view;
  st.set_next_node_id(FLAGS_pservers + FLAGS_workers + 1);
  st.set_placed(true);
  st.set_job_state(proto::JOB_RUNNING);
  st.set_max_last_step(done * 4);
  st.set_next_checkpoint_seq(3);
  st.set_start_unix_ms(1764633600000);
  return st;
}

int Run() {
  std::string dir = FLAGS_dir;
  if (dir.empty()) {
    std::string templ = "/tmp/strata_state_bench.XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      std::cerr << "strata-state-log-bench: cannot make a directory under /tmp\n";
      return 1;
    }
    dir = templ;
  }
  const bool whole = FLAGS_mode == "whole";
  if (!whole && FLAGS_mode != "delta") {
    std::cerr << "strata-state-log-bench: --mode " << FLAGS_mode << ": whole or delta\n";
    return 2;
  }
  std::unique_ptr<strata::storage::FileSystem> fs = strata::storage::NewPosixFileSystem();
  std::optional<proto::MasterState> saved;
  // etcd: this process leads a job of its own (keys of its pid) and writes
  // as a leading master does.
  const bool in_etcd = FLAGS_store == "etcd";
  std::unique_ptr<strata::master::EtcdClient> etcd;
  std::unique_ptr<strata::master::MasterLeadership> lead;
  const std::string keys = absl::StrCat("/strata-bench/", getpid(), "/");
  if (in_etcd) {
    auto c = strata::master::EtcdClient::Connect({{FLAGS_etcd}, nullptr, absl::Seconds(5)});
    if (!c.ok()) {
      std::cerr << "strata-state-log-bench: " << c.status() << "\n";
      return 1;
    }
    etcd = *std::move(c);
    lead = std::make_unique<strata::master::MasterLeadership>(
        strata::master::MasterLeadership::Options{etcd.get(), keys, "bench:0", "", 10});
    if (absl::Status s = lead->Campaign([] { return false; }); !s.ok()) {
      std::cerr << "strata-state-log-bench: " << s << "\n";
      return 1;
    }
  } else if (FLAGS_store != "file") {
    std::cerr << "strata-state-log-bench: --store " << FLAGS_store << ": file or etcd\n";
    return 2;
  }
  auto open = [&]() -> absl::StatusOr<std::unique_ptr<strata::master::StateStore>> {
    if (in_etcd) {
      return strata::master::EtcdStateStore::Open({etcd.get(), lead.get(), keys}, &saved);
    }
    return strata::master::StateLog::Open(fs.get(), dir, &saved);
  };
  absl::StatusOr<std::unique_ptr<strata::master::StateStore>> log = open();
  if (!log.ok()) {
    std::cerr << "strata-state-log-bench: " << log.status() << "\n";
    return 1;
  }
  // One worker: a task is leased, then completed, then the next.
  strata::master::TaskScheduler tasks(FLAGS_tasks, 1, 1, 42, absl::Hours(1));
  if (!whole) tasks.TrackChanges();
  const proto::ClusterView view = View();
  const absl::Time now = absl::Now();
  const int64_t every = std::max<int64_t>(1, FLAGS_tasks / std::max(1, FLAGS_samples));
  double write_seconds = 0;
  uint64_t bytes = 0;
  int recorded = 0;
  // The record of what changed since the record before (the delta mode's),
  // or the whole state (the first record, and every one in whole mode).
  std::string last_view;
  auto record = [&](bool first) {
    proto::MasterState st = Small(view, tasks.done());
    if (whole || first) {
      for (uint64_t id : tasks.DoneIds()) st.add_tasks_done(id);
      for (const auto& [id, node] : tasks.Leases()) (*st.mutable_task_leases())[id] = node;
      (void)tasks.TakeChanges();
      last_view = st.view().SerializeAsString();
      return st;
    }
    st.set_delta(true);
    if (st.view().SerializeAsString() == last_view) st.clear_view();
    strata::master::TaskScheduler::Changes c = tasks.TakeChanges();
    for (uint64_t id : c.done) st.add_tasks_done(id);
    for (const auto& [id, node] : c.leased) (*st.mutable_task_leases())[id] = node;
    for (uint64_t id : c.ended) st.add_leases_ended(id);
    return st;
  };
  if (absl::Status s = (*log)->Append(record(/*first=*/true)); !s.ok()) {
    std::cerr << "strata-state-log-bench: " << s << "\n";
    return 1;
  }
  for (int64_t i = 0; i < FLAGS_tasks; ++i) {
    const bool timed = i % every == every / 2;
    // In delta mode the completions between two timed ones go into one
    // record, not timed (so that replay finds every task); in whole mode
    // the next record holds them anyway.
    if (timed && !whole) {
      if (absl::Status s = (*log)->Append(record(false)); !s.ok()) {
        std::cerr << "strata-state-log-bench: " << s << "\n";
        return 1;
      }
    }
    std::optional<proto::DataTask> t = tasks.Lease(9, now);
    if (!t.has_value() || !tasks.Complete(9, t->id(), i).ok()) {
      std::cerr << "strata-state-log-bench: the scheduler ran out of tasks at " << i << "\n";
      return 1;
    }
    if (!timed) continue;
    const Clock::time_point t0 = Clock::now();
    proto::MasterState st = record(false);
    bytes += st.ByteSizeLong();
    absl::Status s = (*log)->Append(std::move(st));
    write_seconds += Seconds(t0);
    if (!s.ok()) {
      std::cerr << "strata-state-log-bench: " << s << "\n";
      return 1;
    }
    ++recorded;
  }
  log->reset();
  uint64_t snapshot_bytes = fs->FileSize(dir + "/snapshot").value_or(0);
  uint64_t log_bytes = fs->FileSize(dir + "/log").value_or(0);
  if (in_etcd) {  // the values of the snapshot's and the log's keys
    for (auto [prefix, out] : {std::pair{keys + "state/snap/", &snapshot_bytes},
                               std::pair{keys + "state/log/", &log_bytes}}) {
      etcdserverpb::RangeRequest r;
      r.set_key(prefix);
      r.set_range_end(strata::master::PrefixRangeEnd(prefix));
      auto resp = etcd->Range(r);
      if (!resp.ok()) continue;
      for (const auto& kv : resp->kvs()) *out += kv.value().size();
    }
  }
  const Clock::time_point r0 = Clock::now();
  log = open();
  const double replay = Seconds(r0);
  if (!log.ok() || !saved.has_value()) {
    std::cerr << "strata-state-log-bench: replay: " << log.status() << "\n";
    return 1;
  }
  std::printf(
      "store %s, mode %s: %lld tasks, %d completions recorded: %.1f us and %.0f bytes per "
      "completed task (record built, written, synced); replay %.3f s of a %.1f MB snapshot and a "
      "%.1f MB log (%d tasks done in the replayed state)\n",
      FLAGS_store.c_str(), FLAGS_mode.c_str(), static_cast<long long>(FLAGS_tasks), recorded,
      1e6 * write_seconds / recorded, static_cast<double>(bytes) / recorded, replay,
      snapshot_bytes / 1e6, log_bytes / 1e6, saved->tasks_done_size());
  log->reset();
  if (FLAGS_dir.empty()) (void)fs->DeleteRecursively(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("the master's state log: cost per completed task and replay time");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return Run();
}
