// Names of the control plane's enums as people read them ("pserver", not
// protobuf's "PSERVER"): in logs, events, metrics labels, the status page
// and the CLI.
#ifndef STRATA_COMMON_PROTO_NAMES_H_
#define STRATA_COMMON_PROTO_NAMES_H_

#include "absl/strings/string_view.h"
#include "proto/strata.pb.h"

namespace strata {

inline const char* NodeRoleName(proto::Role r) {
  switch (r) {
    case proto::MASTER:
      return "master";
    case proto::PSERVER:
      return "pserver";
    case proto::WORKER:
      return "worker";
    default:
      return "unknown";
  }
}

// "waiting", "running", "evaluating", "succeeded", "failed", "stopped";
// "unknown" for JOB_STATE_UNSPECIFIED.
inline const char* JobStateName(proto::JobState s) {
  switch (s) {
    case proto::JOB_WAITING:
      return "waiting";
    case proto::JOB_RUNNING:
      return "running";
    case proto::JOB_EVALUATING:
      return "evaluating";
    case proto::JOB_SUCCEEDED:
      return "succeeded";
    case proto::JOB_FAILED:
      return "failed";
    case proto::JOB_STOPPED:
      return "stopped";
    default:
      return "unknown";
  }
}

// The state a name stands for; JOB_STATE_UNSPECIFIED for one that is not
// a state's.
inline proto::JobState ParseJobStateName(absl::string_view name) {
  for (int s = proto::JOB_WAITING; s <= proto::JOB_STOPPED; ++s) {
    if (name == JobStateName(static_cast<proto::JobState>(s)))
      return static_cast<proto::JobState>(s);
  }
  return proto::JOB_STATE_UNSPECIFIED;
}

// Succeeded, failed or stopped: nothing more happens to the job.
inline bool IsJobOver(proto::JobState s) {
  return s == proto::JOB_SUCCEEDED || s == proto::JOB_FAILED || s == proto::JOB_STOPPED;
}

}  // namespace strata

#endif  // STRATA_COMMON_PROTO_NAMES_H_
