// What a `strata` command produces, and the one place that prints it: as
// text for people or, under --json, as JSON for scripts.
#ifndef STRATA_TOOLS_CLI_RESULT_H_
#define STRATA_TOOLS_CLI_RESULT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace strata::tools::cli {

// A JSON value built as data, so that a command hands over its result and
// not a JSON string it formatted by hand. Objects keep their keys in the
// order they were set; numbers keep the precision the command gives them;
// `separator` (", " unless given) goes between an object's or an array's
// items. A plain value: not thread-safe, copyable.
class JsonValue {
 public:
  static JsonValue Object(std::string separator = ", ");
  static JsonValue Array(std::string separator = ", ");
  static JsonValue String(absl::string_view s);
  static JsonValue Bool(bool b);
  static JsonValue Int(int64_t n);
  // `v` with `decimals` digits after the point.
  static JsonValue Fixed(double v, int decimals);
  // A protobuf message as its JSON (protobuf's printer: every field, with
  // whitespace).
  static JsonValue FromProto(const google::protobuf::Message& m);

  // REQUIRES: an object. Adds `key`, after the keys set before.
  JsonValue& Set(absl::string_view key, JsonValue value);
  // REQUIRES: an array.
  JsonValue& Append(JsonValue value);

  std::string Serialize() const;

 private:
  enum class Kind { kScalar, kObject, kArray };
  Kind kind_ = Kind::kScalar;
  std::string scalar_ = "null";  // a scalar's JSON text
  std::string separator_;
  // An object's members in order; an array's items, with empty keys.
  std::vector<std::pair<std::string, JsonValue>> items_;
};

// A command's outcome. `data` is its result; `text` renders that same
// result for people (null: nothing to show without --json); `error`, when
// not empty, goes to stderr after the result, a newline after it.
struct CliResult {
  int exit_code = 0;
  std::optional<JsonValue> data;
  std::function<std::string()> text;
  std::string error;
};

// A failure that shows nothing on stdout: `message` (one or more lines,
// without the last newline) on stderr.
CliResult Failure(int exit_code, std::string message);

// A result shown as `text`, with no JSON form (for the commands whose
// output is read by people or by launch.sh only).
CliResult TextResult(std::string text, int exit_code = 0);

// Writes r's result to `out`: its JSON (a line) when `json`, else its
// text; then flushes `out`.
void PrintReport(const CliResult& r, bool json, std::ostream& out);

// PrintReport, then r.error on `err`; returns r.exit_code.
int PrintResult(const CliResult& r, bool json, std::ostream& out, std::ostream& err);

}  // namespace strata::tools::cli

#endif  // STRATA_TOOLS_CLI_RESULT_H_
