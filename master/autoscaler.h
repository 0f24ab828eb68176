// The autoscaler (elastic.autoscale; docs/operations.md, "Scaling"):
// decides, on the master's ticks, when the job's workers should grow or
// shrink, from what it measures; the master carries a decision out as a
// `strata scale` of its own (master/scaler.h), with the reason as its
// event.
//
// - Grow by one while the data-task queue is deep (at least
//   elastic.queue_per_worker pending tasks a worker) and below the most
//   the job may have; once a worker it added has trained for
//   elastic.measure_seconds, the gain is measured: the job's samples/s
//   after against before, as a fraction of the per-worker average before.
//   Under elastic.min_gain it grows no further (the machine, the pservers
//   or the network is the limit, not the workers).
// - Shrink by the workers idle at the job's tail (no data task left for
//   them), so that their nodes are released.
// - Pservers (from their heartbeats: apply queue, CPU, memory; each
//   averaged over elastic.pserver_signal_seconds): one added when a
//   pserver's average is at or over its elastic.pserver_*_high, up to the
//   most the job may have; one removed (the highest index, its partitions
//   moved away first) when every pserver is under the _lows and the
//   others would stay under the _highs without it. The windows start over
//   after every scale, so a decision always weighs the shape there is.
// - One decision per elastic.cooldown_seconds, none while a scale is in
//   progress; `strata scale --autoscale off` stops it (kept in the state
//   log).
//
// Not thread-safe: the master's lock guards it (MasterServer::mu_).
#ifndef STRATA_MASTER_AUTOSCALER_H_
#define STRATA_MASTER_AUTOSCALER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/config.h"
#include "proto/strata.pb.h"

namespace strata::master {

class Autoscaler {
 public:
  explicit Autoscaler(const ElasticSection& elastic) : e_(elastic), enabled_(elastic.autoscale) {}

  // What the master sees at a tick.
  struct Input {
    absl::Time now;
    proto::JobState state = proto::JOB_WAITING;
    bool scaling = false;  // a scale in progress
    int workers = 0;       // in the job (training, joining or idle)
    int idle = 0;          // of those, with no data task left (finished)
    int most = 0;          // the most the job may have (elastic, the host file)
    uint64_t pending = 0;  // data tasks waiting in the queue
    uint64_t samples = 0;  // trained so far
    // The pservers serving (node ids; not those being emptied), and the
    // fewest and most the job may have.
    std::vector<uint32_t> pservers;
    int least_pservers = 1;
    int most_pservers = 0;
  };
  // A decision: `delta` workers or pservers (0: a measurement to report,
  // no scale) and why.
  struct Decision {
    proto::Role role = proto::WORKER;
    int delta = 0;
    std::string reason;
  };
  std::optional<Decision> Tick(const Input& in);

  // A pserver's heartbeat, with its load (apply_queue, cpu_seconds,
  // cpu_cores, rss_bytes, memory_limit_bytes), at `now`.
  void PServerBeat(uint32_t node, absl::Time now, const proto::HeartbeatRequest& beat);
  // The pservers' load averaged over what the windows hold, the highest
  // of each ("pservers: apply queue 3.1, CPU 42%, memory 5%"); "" before
  // any heartbeat told it.
  std::string PServerLoad() const;

  // The master could not carry out the last +1 (refused, or the scale was
  // given up): nothing to measure.
  void Refused();
  // `strata scale --autoscale on|off`.
  void SetEnabled(bool on);
  bool enabled() const { return enabled_; }
  // For the status ("autoscale on, growing", "off"...).
  std::string Describe() const;

 private:
  // The job's samples/s over the `window` before `now` (nullopt when the
  // history does not reach back that far).
  std::optional<double> Rate(absl::Time now, absl::Duration window) const;

  // A pserver's load, one sample a heartbeat (CPU since the one before).
  struct Sample {
    absl::Time at;
    double queue = 0;
    double cpu = 0;     // a share of the cores it may use
    double memory = 0;  // a share of the most it may use
  };
  struct PServerWindow {
    absl::Time last_beat = absl::InfinitePast();
    double last_cpu_seconds = 0;
    absl::Time since = absl::InfiniteFuture();  // the first sample kept
    std::deque<Sample> samples;
  };
  struct Means {
    double queue = 0, cpu = 0, memory = 0;
  };
  static Means Average(const PServerWindow& w);
  std::optional<Decision> PServerTick(const Input& in);

  const ElasticSection e_;
  bool enabled_;
  std::deque<std::pair<absl::Time, uint64_t>> history_;  // (time, samples)
  absl::Time last_decision_ = absl::InfinitePast();
  absl::Time last_scale_end_ = absl::InfinitePast();
  bool was_scaling_ = false;
  // The add being measured: the rate and workers before it, and when the
  // scale ended (InfiniteFuture while it goes on).
  struct Measuring {
    double rate_before = 0;
    int workers_before = 0;
    absl::Time since = absl::InfiniteFuture();
  };
  std::optional<Measuring> measuring_;
  bool growth_stopped_ = false;
  std::map<uint32_t, PServerWindow> pservers_;  // by node id
};

}  // namespace strata::master

#endif  // STRATA_MASTER_AUTOSCALER_H_
