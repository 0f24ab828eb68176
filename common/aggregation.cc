#include "common/aggregation.h"

#include <algorithm>

#include "common/crc32c.h"
#include "glog/logging.h"

namespace strata {

uint32_t HostMember(const std::string& host) { return 0x80000000u | (Crc32c(host) & 0x7fffffffu); }

std::vector<uint32_t> HostWorkers(const proto::ClusterView& view, const std::string& host) {
  std::vector<uint32_t> ids;
  for (const auto& m : view.members()) {
    if (m.role() == proto::WORKER && m.state() == proto::ALIVE && m.host() == host) {
      ids.push_back(m.id());
    }
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::map<std::string, uint32_t> RingLeadersByHost(const proto::ClusterView& view) {
  // Per host: its lowest worker in the job (ALIVE or FINISHED). A worker
  // that runs out of data tasks stays its host's member: the ring's
  // optimizer shards and its place in the ring stay with it, and only a
  // death or a drain moves them (to a worker with none, which Form gives
  // them; node ids rise, so the new member never held an older state).
  std::map<std::string, uint32_t> leaders;
  for (const auto& m : view.members()) {
    if (m.role() != proto::WORKER) continue;
    if (m.state() != proto::ALIVE && m.state() != proto::FINISHED) continue;
    auto [it, fresh] = leaders.emplace(m.host(), m.id());
    if (!fresh) it->second = std::min(it->second, m.id());
  }
  return leaders;
}

std::map<uint32_t, PipelineSeat> PipelineSeats(const proto::ClusterView& view, int stages) {
  std::map<uint32_t, PipelineSeat> seats;
  if (stages < 1) return seats;
  // Each index's worker in the job (a restart's node while its previous
  // one is not yet declared dead: the newer, the higher id).
  std::map<int, uint32_t> by_index;
  for (const auto& m : view.members()) {
    if (m.role() == proto::WORKER && m.index() >= 0 &&
        (m.state() == proto::ALIVE || m.state() == proto::FINISHED ||
         m.state() == proto::JOINING)) {
      uint32_t& id = by_index[m.index()];
      id = std::max(id, m.id());
    }
  }
  std::map<int, std::vector<uint32_t>> groups;
  for (const auto& [index, id] : by_index) {
    std::vector<uint32_t>& group = groups[index / stages];
    group.resize(stages, 0);
    group[index % stages] = id;
  }
  for (const auto& [g, group] : groups) {
    if (std::count(group.begin(), group.end(), 0u) > 0) continue;  // not whole
    for (int s = 0; s < stages; ++s) seats[group[s]] = PipelineSeat{s, group};
  }
  return seats;
}

std::set<uint32_t> StepMembers(const proto::ClusterView& view, int stages,
                               std::map<uint32_t, uint32_t>* member_of) {
  member_of->clear();
  std::set<uint32_t> members;
  if (stages > 1) {
    std::set<uint32_t> alive;
    for (const auto& m : view.members()) {
      if (m.role() == proto::WORKER && m.state() == proto::ALIVE) alive.insert(m.id());
    }
    for (const auto& [id, seat] : PipelineSeats(view, stages)) {
      if (alive.count(seat.leader()) == 0) continue;
      members.insert(seat.leader());
      (*member_of)[id] = seat.leader();
    }
    return members;
  }
  std::map<uint32_t, std::string> host_of_member;
  const bool by_host = AggregatesByHost(view);
  for (const auto& m : view.members()) {
    if (m.role() != proto::WORKER) continue;
    if (m.state() != proto::ALIVE && !(by_host && m.state() == proto::FINISHED)) continue;
    if (!by_host) {
      members.insert(m.id());
      continue;
    }
    const uint32_t member = HostMember(m.host());
    // (A FINISHED worker pushes for its host while it is the host's ring
    // member, RingLeadersByHost: a member while the host has a live one.)
    if (m.state() == proto::FINISHED) {
      (*member_of)[m.id()] = member;
      continue;
    }
    auto [it, fresh] = host_of_member.emplace(member, m.host());
    // Two host names with one hash would be one member: their steps would
    // complete with either's push. (1 chance in 2^31 a pair.)
    LOG_IF(ERROR, !fresh && it->second != m.host())
        << "hosts " << it->second << " and " << m.host() << " hash to one aggregation member "
        << member << ": rename one of them or set cluster.aggregation: none";
    (*member_of)[m.id()] = member;
    members.insert(member);
  }
  return members;
}

}  // namespace strata
