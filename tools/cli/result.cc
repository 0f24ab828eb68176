#include "tools/cli/result.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"
#include "google/protobuf/util/json_util.h"

namespace strata::tools::cli {

JsonValue JsonValue::Object(std::string separator) {
  JsonValue v;
  v.kind_ = Kind::kObject;
  v.separator_ = std::move(separator);
  return v;
}

JsonValue JsonValue::Array(std::string separator) {
  JsonValue v;
  v.kind_ = Kind::kArray;
  v.separator_ = std::move(separator);
  return v;
}

JsonValue JsonValue::String(absl::string_view s) {
  JsonValue v;
  v.scalar_ = absl::StrCat("\"", JsonEscape(s), "\"");
  return v;
}

JsonValue JsonValue::Bool(bool b) {
  JsonValue v;
  v.scalar_ = b ? "true" : "false";
  return v;
}

JsonValue JsonValue::Int(int64_t n) {
  JsonValue v;
  v.scalar_ = absl::StrCat(n);
  return v;
}

JsonValue JsonValue::Fixed(double x, int decimals) {
  JsonValue v;
  v.scalar_ = absl::StrFormat("%.*f", decimals, x);
  return v;
}

JsonValue JsonValue::FromProto(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.add_whitespace = true;
  JsonValue v;
  v.scalar_.clear();  // (the printer appends)
  // (A message of the binary's own types always prints.)
  (void)google::protobuf::util::MessageToJsonString(m, &v.scalar_, o);
  return v;
}

JsonValue& JsonValue::Set(absl::string_view key, JsonValue value) {
  items_.emplace_back(std::string(key), std::move(value));
  return *this;
}

JsonValue& JsonValue::Append(JsonValue value) {
  items_.emplace_back(std::string(), std::move(value));
  return *this;
}

std::string JsonValue::Serialize() const {
  if (kind_ == Kind::kScalar) return scalar_;
  std::string s = kind_ == Kind::kObject ? "{" : "[";
  for (size_t i = 0; i < items_.size(); ++i) {
    if (i > 0) s += separator_;
    if (kind_ == Kind::kObject) absl::StrAppend(&s, "\"", JsonEscape(items_[i].first), "\": ");
    s += items_[i].second.Serialize();
  }
  s += kind_ == Kind::kObject ? "}" : "]";
  return s;
}

CliResult Failure(int exit_code, std::string message) {
  CliResult r;
  r.exit_code = exit_code;
  r.error = std::move(message);
  return r;
}

CliResult TextResult(std::string text, int exit_code) {
  CliResult r;
  r.exit_code = exit_code;
  r.text = [text = std::move(text)] { return text; };
  return r;
}

void PrintReport(const CliResult& r, bool json, std::ostream& out) {
  if (json && r.data) {
    const std::string s = r.data->Serialize();
    // (Protobuf's printer ends its JSON with a newline already.)
    out << s << (absl::EndsWith(s, "\n") ? "" : "\n");
  } else if (!json && r.text) {
    out << r.text();
  }
  out << std::flush;
}

int PrintResult(const CliResult& r, bool json, std::ostream& out, std::ostream& err) {
  PrintReport(r, json, out);
  if (!r.error.empty()) err << r.error << "\n";
  return r.exit_code;
}

}  // namespace strata::tools::cli
