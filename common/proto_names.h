// Names of the control plane's enums as people read them ("pserver", not
// protobuf's "PSERVER"): in logs, events, metrics labels, the status page
// and the CLI.
#ifndef STRATA_COMMON_PROTO_NAMES_H_
#define STRATA_COMMON_PROTO_NAMES_H_

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

}  // namespace strata

#endif  // STRATA_COMMON_PROTO_NAMES_H_
