// A proto as a daemon's /status answer: JSON with every field printed.
#ifndef STRATA_COMMON_PROTO_JSON_H_
#define STRATA_COMMON_PROTO_JSON_H_

#include <string>

#include "common/http_server.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"

namespace strata {

inline HttpResponse ProtoJsonResponse(const google::protobuf::Message& m) {
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.add_whitespace = true;
  auto s = google::protobuf::util::MessageToJsonString(m, &json, o);
  if (!s.ok()) return HttpResponse{500, "text/plain", s.ToString()};
  return HttpResponse{200, "application/json", json};
}

}  // namespace strata

#endif  // STRATA_COMMON_PROTO_JSON_H_
