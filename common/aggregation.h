// Node-local aggregation's groups (cluster.aggregation: node;
// docs/architecture.md, "Node-local aggregation"): in a view that
// aggregates, the workers of one host are one member of the bsp step set.
// One of them (the host's aggregating worker: its lowest live node id; with
// a hierarchical ring, its ring member, RingLeadersByHost) pushes the
// host's summed gradient for all of them; a pserver counts
// that push for the host, so that a worker taking over mid-step cannot
// add the host's gradient twice. Pservers and workers derive both from the
// view alone.
#ifndef STRATA_COMMON_AGGREGATION_H_
#define STRATA_COMMON_AGGREGATION_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "proto/strata.pb.h"

namespace strata {

inline bool AggregatesByHost(const proto::ClusterView& view) { return view.aggregation_key() != 0; }
// The step-set member standing for the workers of `host`: bit 31 set (node
// ids never reach it) and 31 bits of the host name's CRC32C.
uint32_t HostMember(const std::string& host);
// The live (ALIVE) workers of `host` in `view`, by node id ascending: the
// first is the host's aggregating worker.
std::vector<uint32_t> HostWorkers(const proto::ClusterView& view, const std::string& host);

// Hierarchical allreduce (model.dense_sync allreduce with aggregation):
// the ring's member standing for each host, by host: its lowest worker in
// the job (ALIVE or FINISHED), so that a worker that runs out of data
// tasks keeps its seat and optimizer shards; only its death or drain
// moves them. It steps the host's sum through the ring from its
// aggregation thread (worker/host_aggregator.h), and its sparse pushes
// count for the host (StepMembers); a host whose workers have all
// finished still steps, with no samples, so that they evaluate the job's
// parameters.
std::map<std::string, uint32_t> RingLeadersByHost(const proto::ClusterView& view);

// Pipeline stages (model.stages > 1; worker/pipeline_runner.h): the view's
// workers that are in the job (ALIVE, FINISHED or JOINING) by their
// index, which a restart keeps: index i is stage i % stages of group
// i / stages. A group whose every index has a worker is whole; the
// workers of the others have no seat. A worker's seat: its stage, and its
// group's workers (node ids) by stage (the first, the leader, holds the
// data tasks).
struct PipelineSeat {
  int stage = 0;
  std::vector<uint32_t> group;
  uint32_t leader() const { return group.front(); }
};
std::map<uint32_t, PipelineSeat> PipelineSeats(const proto::ClusterView& view, int stages);

// The bsp step set of `view`: its live workers, each host's as one member
// (HostMember) when the view aggregates; then *member_of maps each of them,
// and each FINISHED worker, to its host's member (left empty otherwise).
// With stages > 1, a pipeline's group is one member, its leader, while the leader is ALIVE,
// and *member_of maps each of its workers to it.
std::set<uint32_t> StepMembers(const proto::ClusterView& view, int stages,
                               std::map<uint32_t, uint32_t>* member_of);

}  // namespace strata

#endif  // STRATA_COMMON_AGGREGATION_H_
