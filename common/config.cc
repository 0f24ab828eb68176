#include "common/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace strata {

const char* ConsistencyName(Consistency c) {
  switch (c) {
    case Consistency::kBsp:
      return "bsp";
    case Consistency::kAsp:
      return "asp";
    case Consistency::kSsp:
      return "ssp";
  }
  return "unknown";
}

namespace {

// A range or membership rule on a parsed value: returns the reason the value
// is rejected ("must be > 0"), or nullopt if it is accepted.
template <typename T>
using Check = std::function<std::optional<std::string>(const T&)>;

Check<int64_t> IntAtLeast(int64_t min) {
  return [min](const int64_t& v) -> std::optional<std::string> {
    if (v >= min) return std::nullopt;
    if (min == 1) return std::string("must be > 0");
    return absl::StrCat("must be >= ", min);
  };
}

Check<int64_t> IntInRange(int64_t lo, int64_t hi) {
  return [lo, hi](const int64_t& v) -> std::optional<std::string> {
    if (v >= lo && v <= hi) return std::nullopt;
    return absl::StrCat("must be in [", lo, ", ", hi, "]");
  };
}

Check<double> DoublePositive() {
  return [](const double& v) -> std::optional<std::string> {
    if (v > 0) return std::nullopt;
    return std::string("must be > 0");
  };
}

Check<double> DoubleNonNegative() {
  return [](const double& v) -> std::optional<std::string> {
    if (v >= 0) return std::nullopt;
    return std::string("must be >= 0");
  };
}

// [0, 1): momentum and Adam's betas.
Check<double> DoubleUnitInterval() {
  return [](const double& v) -> std::optional<std::string> {
    if (v >= 0 && v < 1) return std::nullopt;
    return std::string("must be in [0, 1)");
  };
}

Check<std::string> NonEmpty() {
  return [](const std::string& v) -> std::optional<std::string> {
    if (!v.empty()) return std::nullopt;
    return std::string("must not be empty");
  };
}

// Formats a double the way a user would have written it (no trailing zeros).
std::string FormatDouble(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Short description of a node's kind for "expected X, got Y" messages.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "an empty value";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!") return absl::StrCat("quoted string \"", node.Scalar(), "\"");
      return absl::StrCat("'", node.Scalar(), "'");
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

// True for a plain (unquoted) scalar: only those may be read as numbers.
bool IsPlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

// Walks a parsed YAML document and fills a JobConfig, stopping at the first
// error. Errors are InvalidArgument "file:line:col: path: message".
// Not thread-safe; one instance parses one document.
class ConfigReader {
 public:
  explicit ConfigReader(const std::string& filename) : filename_(filename) {}

  ConfigReader(const ConfigReader&) = delete;
  ConfigReader& operator=(const ConfigReader&) = delete;

  absl::Status Read(const YAML::Node& root, JobConfig* config);

 private:
  // One key of a map section: its name and how to read its value.
  struct Field {
    std::string key;
    // `key` and `value` are the YAML nodes; `path` the dotted key path.
    std::function<absl::Status(const YAML::Node& key, const YAML::Node& value,
                               const std::string& path)>
        read;
  };

  // "file:line:col: " for a 0-based YAML mark (just "file: " if unknown).
  std::string Position(const YAML::Mark& mark) const;
  absl::Status Error(const YAML::Mark& mark, absl::string_view message) const;
  absl::Status PathError(const YAML::Mark& mark, const std::string& path,
                         absl::string_view message) const;

  // Where to point at a value: the value itself, or its key when the value
  // is empty (yaml-cpp gives empty values the position of the next token).
  static YAML::Mark ValueMark(const YAML::Node& key, const YAML::Node& value);

  // Reads a map section at `path` ("" for the document root) whose allowed
  // keys are `fields`. An empty (null) node is an empty map. `where` is used
  // for errors about the node as a whole.
  absl::Status ReadMap(const YAML::Node& node, const YAML::Mark& where, const std::string& path,
                       const std::vector<Field>& fields);

  // Field builders: read one typed value into `*out` and apply `check`.
  // The returned Field borrows `this` and `out`; use it only during Read().
  Field Int(const std::string& key, int* out, Check<int64_t> check);
  Field Int64(const std::string& key, int64_t* out, Check<int64_t> check);
  Field Uint64(const std::string& key, uint64_t* out);
  Field Double(const std::string& key, double* out, Check<double> check);
  Field String(const std::string& key, std::string* out, Check<std::string> check);
  Field Enum(const std::string& key, std::string* out, std::vector<std::string> allowed);
  Field Bool(const std::string& key, bool* out);
  // A sequence of non-empty strings.
  Field StringList(const std::string& key, std::vector<std::string>* out);
  Field Section(const std::string& key, std::function<std::vector<Field>()> fields);

  absl::StatusOr<int64_t> ParseInt(const YAML::Node& key, const YAML::Node& value,
                                   const std::string& path) const;
  absl::StatusOr<double> ParseDouble(const YAML::Node& key, const YAML::Node& value,
                                     const std::string& path) const;

  std::vector<Field> JobFields(JobSection* job);
  std::vector<Field> ModelFields(ModelSection* model);
  // One entry of model.tables at `at` (k: the model.tables key).
  absl::StatusOr<ScriptTableSection> ReadScriptTable(const YAML::Node& k, const YAML::Node& item,
                                                     const std::string& at);
  std::vector<Field> OptimizerFields(OptimizerSection* optimizer);
  std::vector<Field> SparseFields(SparseSection* sparse);
  std::vector<Field> DataFields(DataSection* data);
  std::vector<Field> ClusterFields(ClusterSection* cluster);
  std::vector<Field> PortsFields(PortsSection* ports);
  std::vector<Field> RdmaFields(RdmaSection* rdma);
  std::vector<Field> CheckpointFields(CheckpointSection* checkpoint);
  std::vector<Field> WorkerFields(WorkerSection* worker);
  std::vector<Field> ElasticFields(ElasticSection* elastic);
  std::vector<Field> S3Fields(S3Section* s3);

  // Checks that involve more than one key, once everything is read.
  absl::Status CrossCheck(const JobConfig& config) const;
  // model.dense_sync allreduce, and model.stages, against the rest.
  absl::Status CheckDenseSync(const JobConfig& config) const;
  absl::Status CheckPipeline(const JobConfig& config) const;
  // Where `key` was read (a null mark when it was not).
  YAML::Mark MarkOf(const char* key) const {
    auto it = marks_.find(key);
    return it != marks_.end() ? it->second : YAML::Mark::null_mark();
  }

  const std::string filename_;
  // Position of every key path read so far (of its key node, for sections).
  std::map<std::string, YAML::Mark> marks_;
};

std::string ConfigReader::Position(const YAML::Mark& mark) const {
  if (mark.is_null() || mark.line < 0) return absl::StrCat(filename_, ": ");
  return absl::StrCat(filename_, ":", mark.line + 1, ":", mark.column + 1, ": ");
}

absl::Status ConfigReader::Error(const YAML::Mark& mark, absl::string_view message) const {
  return absl::InvalidArgumentError(absl::StrCat(Position(mark), message));
}

absl::Status ConfigReader::PathError(const YAML::Mark& mark, const std::string& path,
                                     absl::string_view message) const {
  return Error(mark, absl::StrCat(path, ": ", message));
}

YAML::Mark ConfigReader::ValueMark(const YAML::Node& key, const YAML::Node& value) {
  if (value.IsNull() || value.Mark().is_null()) return key.Mark();
  return value.Mark();
}

absl::Status ConfigReader::ReadMap(const YAML::Node& node, const YAML::Mark& where,
                                   const std::string& path, const std::vector<Field>& fields) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) {
    if (path.empty()) {
      return Error(where, absl::StrCat("expected a map of sections, got ", Describe(node)));
    }
    return PathError(where, path, absl::StrCat("expected a map, got ", Describe(node)));
  }
  std::vector<std::string> names;
  names.reserve(fields.size());
  for (const Field& f : fields) names.push_back(f.key);

  std::map<std::string, int> seen;  // key -> 1-based line of first occurrence
  for (const auto& kv : node) {
    const YAML::Node& key = kv.first;
    const YAML::Node& value = kv.second;
    if (!key.IsScalar()) {
      return Error(key.Mark(), absl::StrCat(path.empty() ? "" : path + ": ",
                                            "keys must be plain names, got ", Describe(key)));
    }
    const std::string& name = key.Scalar();
    const std::string full = path.empty() ? name : absl::StrCat(path, ".", name);
    const Field* field = nullptr;
    for (const Field& f : fields) {
      if (f.key == name) field = &f;
    }
    if (field == nullptr) {
      return Error(key.Mark(), absl::StrCat("unknown key '", full, "' (expected one of: ",
                                            absl::StrJoin(names, ", "), ")"));
    }
    auto [it, inserted] = seen.emplace(name, key.Mark().line + 1);
    if (!inserted) {
      return Error(key.Mark(), absl::StrCat("duplicate key '", full, "' (first given on line ",
                                            it->second, ")"));
    }
    marks_[full] = ValueMark(key, value);
    STRATA_RETURN_IF_ERROR(field->read(key, value, full));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ConfigReader::ParseInt(const YAML::Node& key, const YAML::Node& value,
                                               const std::string& path) const {
  int64_t v = 0;
  if (IsPlainScalar(value) && absl::SimpleAtoi(value.Scalar(), &v)) return v;
  if (IsPlainScalar(value)) {
    // Digits only but unparsable: too large rather than not a number.
    absl::string_view s = value.Scalar();
    if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
    if (!s.empty() && std::all_of(s.begin(), s.end(), absl::ascii_isdigit)) {
      return PathError(value.Mark(), path, absl::StrCat("integer out of range: ", value.Scalar()));
    }
  }
  return PathError(ValueMark(key, value), path,
                   absl::StrCat("expected an integer, got ", Describe(value)));
}

absl::StatusOr<double> ConfigReader::ParseDouble(const YAML::Node& key, const YAML::Node& value,
                                                 const std::string& path) const {
  double v = 0;
  if (IsPlainScalar(value) && absl::SimpleAtod(value.Scalar(), &v)) {
    if (std::isfinite(v)) return v;
    return PathError(value.Mark(), path,
                     absl::StrCat("expected a finite number, got '", value.Scalar(), "'"));
  }
  return PathError(ValueMark(key, value), path,
                   absl::StrCat("expected a number, got ", Describe(value)));
}

ConfigReader::Field ConfigReader::Int(const std::string& key, int* out, Check<int64_t> check) {
  return {
      key,
      [this, out, check](const YAML::Node& k, const YAML::Node& v,
                         const std::string& path) -> absl::Status {
        STRATA_ASSIGN_OR_RETURN(int64_t value, ParseInt(k, v, path));
        if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
          return PathError(v.Mark(), path, absl::StrCat("integer out of range: ", value));
        }
        if (auto why = check(value)) {
          return PathError(v.Mark(), path, absl::StrCat(*why, ", got ", value));
        }
        *out = static_cast<int>(value);
        return absl::OkStatus();
      }};
}

ConfigReader::Field ConfigReader::Int64(const std::string& key, int64_t* out,
                                        Check<int64_t> check) {
  return {key,
          [this, out, check](const YAML::Node& k, const YAML::Node& v,
                             const std::string& path) -> absl::Status {
            STRATA_ASSIGN_OR_RETURN(int64_t value, ParseInt(k, v, path));
            if (auto why = check(value)) {
              return PathError(v.Mark(), path, absl::StrCat(*why, ", got ", value));
            }
            *out = value;
            return absl::OkStatus();
          }};
}

ConfigReader::Field ConfigReader::Uint64(const std::string& key, uint64_t* out) {
  return {key,
          [this, out](const YAML::Node& k, const YAML::Node& v,
                      const std::string& path) -> absl::Status {
            uint64_t value = 0;
            if (IsPlainScalar(v) && absl::SimpleAtoi(v.Scalar(), &value)) {
              *out = value;
              return absl::OkStatus();
            }
            return PathError(
                ValueMark(k, v), path,
                absl::StrCat("expected an integer in [0, ", std::numeric_limits<uint64_t>::max(),
                             "], got ", Describe(v)));
          }};
}

ConfigReader::Field ConfigReader::Double(const std::string& key, double* out, Check<double> check) {
  return {key,
          [this, out, check](const YAML::Node& k, const YAML::Node& v,
                             const std::string& path) -> absl::Status {
            STRATA_ASSIGN_OR_RETURN(double value, ParseDouble(k, v, path));
            if (auto why = check(value)) {
              return PathError(v.Mark(), path, absl::StrCat(*why, ", got ", FormatDouble(value)));
            }
            *out = value;
            return absl::OkStatus();
          }};
}

ConfigReader::Field ConfigReader::String(const std::string& key, std::string* out,
                                         Check<std::string> check) {
  return {key,
          [this, out, check](const YAML::Node& k, const YAML::Node& v,
                             const std::string& path) -> absl::Status {
            if (!v.IsScalar()) {
              return PathError(ValueMark(k, v), path,
                               absl::StrCat("expected a string, got ", Describe(v)));
            }
            if (check) {
              if (auto why = check(v.Scalar())) {
                return PathError(v.Mark(), path, *why);
              }
            }
            *out = v.Scalar();
            return absl::OkStatus();
          }};
}

ConfigReader::Field ConfigReader::Enum(const std::string& key, std::string* out,
                                       std::vector<std::string> allowed) {
  return {key,
          [this, out, allowed](const YAML::Node& k, const YAML::Node& v,
                               const std::string& path) -> absl::Status {
            if (!v.IsScalar()) {
              return PathError(ValueMark(k, v), path,
                               absl::StrCat("expected one of ", absl::StrJoin(allowed, ", "),
                                            ", got ", Describe(v)));
            }
            for (const std::string& a : allowed) {
              if (v.Scalar() == a) {
                *out = a;
                return absl::OkStatus();
              }
            }
            return PathError(v.Mark(), path,
                             absl::StrCat("unknown value '", v.Scalar(),
                                          "' (allowed: ", absl::StrJoin(allowed, ", "), ")"));
          }};
}

ConfigReader::Field ConfigReader::Bool(const std::string& key, bool* out) {
  return {key,
          [this, out](const YAML::Node& k, const YAML::Node& v,
                      const std::string& path) -> absl::Status {
            if (v.IsScalar() && (v.Scalar() == "true" || v.Scalar() == "false")) {
              *out = v.Scalar() == "true";
              return absl::OkStatus();
            }
            return PathError(ValueMark(k, v), path,
                             absl::StrCat("expected true or false, got ", Describe(v)));
          }};
}

ConfigReader::Field ConfigReader::StringList(const std::string& key,
                                             std::vector<std::string>* out) {
  return {key,
          [this, out](const YAML::Node& k, const YAML::Node& v,
                      const std::string& path) -> absl::Status {
            if (!v.IsSequence()) {
              return PathError(ValueMark(k, v), path,
                               absl::StrCat("expected a list of strings, got ", Describe(v)));
            }
            std::vector<std::string> items;
            for (const YAML::Node& item : v) {
              const std::string at = absl::StrCat(path, "[", items.size(), "]");
              if (!item.IsScalar() || item.Scalar().empty()) {
                return PathError(ValueMark(k, item), at,
                                 absl::StrCat("expected a non-empty string, got ", Describe(item)));
              }
              items.push_back(item.Scalar());
            }
            *out = std::move(items);
            return absl::OkStatus();
          }};
}

ConfigReader::Field ConfigReader::Section(const std::string& key,
                                          std::function<std::vector<Field>()> fields) {
  return {key,
          [this, fields](const YAML::Node& k, const YAML::Node& v,
                         const std::string& path) -> absl::Status {
            // Sections are located by their key: that is what a reader of
            // "missing required key" errors wants to see.
            marks_[path] = k.Mark();
            return ReadMap(v, ValueMark(k, v), path, fields());
          }};
}

std::vector<ConfigReader::Field> ConfigReader::JobFields(JobSection* job) {
  return {
      String("name", &job->name, NonEmpty()),
      {"consistency",
       [this, job](const YAML::Node& k, const YAML::Node& v,
                   const std::string& path) -> absl::Status {
         std::string name;
         STRATA_RETURN_IF_ERROR(Enum("consistency", &name, {"bsp", "ssp", "asp"}).read(k, v, path));
         job->consistency = name == "bsp"   ? Consistency::kBsp
                            : name == "ssp" ? Consistency::kSsp
                                            : Consistency::kAsp;
         return absl::OkStatus();
       }},
      Int("staleness", &job->staleness, IntInRange(0, 1000000)),
      Enum("batch_split", &job->batch_split, {"even", "by_speed"}),
      Int("epochs", &job->epochs, IntAtLeast(1)),
      Int("batch_size", &job->batch_size, IntAtLeast(1)),
      Int("progress_every_steps", &job->progress_every_steps, IntAtLeast(1)),
      Uint64("seed", &job->seed),
  };
}

std::vector<ConfigReader::Field> ConfigReader::ModelFields(ModelSection* model) {
  return {
      Enum("type", &model->type, {"mlp", "wide_deep", "script"}),
      Int("embedding_dim", &model->embedding_dim, IntInRange(1, 4096)),
      {"hidden",
       [this, model](const YAML::Node& k, const YAML::Node& v,
                     const std::string& path) -> absl::Status {
         if (!v.IsSequence()) {
           return PathError(ValueMark(k, v), path,
                            absl::StrCat("expected a list of integers, got ", Describe(v)));
         }
         std::vector<int> hidden;
         for (const YAML::Node& item : v) {
           int w = 0;
           STRATA_RETURN_IF_ERROR(Int("", &w, IntInRange(1, 1 << 16))
                                      .read(k, item, absl::StrCat(path, "[", hidden.size(), "]")));
           hidden.push_back(w);
         }
         model->hidden = std::move(hidden);
         return absl::OkStatus();
       }},
      {"layers",
       [this, model](const YAML::Node& k, const YAML::Node& v,
                     const std::string& path) -> absl::Status {
         if (!v.IsSequence()) {
           return PathError(ValueMark(k, v), path,
                            absl::StrCat("expected a list of integers, got ", Describe(v)));
         }
         if (v.size() < 2) {
           return PathError(v.Mark(), path,
                            absl::StrCat("needs at least 2 entries (input and "
                                         "output width), got ",
                                         v.size()));
         }
         std::vector<int> layers;
         for (const YAML::Node& item : v) {
           int w = 0;
           STRATA_RETURN_IF_ERROR(Int("", &w, IntAtLeast(1))
                                      .read(k, item, absl::StrCat(path, "[", layers.size(), "]")));
           layers.push_back(w);
         }
         model->layers = std::move(layers);
         return absl::OkStatus();
       }},
      Enum("activation", &model->activation, {"relu", "tanh", "sigmoid"}),
      Enum("dense_sync", &model->dense_sync, {"ps", "allreduce"}),
      Int("allreduce_bucket_kib", &model->allreduce_bucket_kib, IntInRange(0, 1 << 20)),
      Int("stages", &model->stages, IntAtLeast(1)),
      Int("micro_batches", &model->micro_batches, IntAtLeast(0)),
      {"tables",
       [this, model](const YAML::Node& k, const YAML::Node& v,
                     const std::string& path) -> absl::Status {
         if (!v.IsSequence() || v.size() == 0) {
           return PathError(ValueMark(k, v), path,
                            absl::StrCat("expected a non-empty list of tables ({name, shape} or "
                                         "{name, dim}), got ",
                                         Describe(v)));
         }
         std::vector<ScriptTableSection> tables;
         std::map<std::string, size_t> names;
         for (const YAML::Node& item : v) {
           const std::string at = absl::StrCat(path, "[", tables.size(), "]");
           STRATA_ASSIGN_OR_RETURN(ScriptTableSection t, ReadScriptTable(k, item, at));
           if (auto [it, fresh] = names.emplace(t.name, tables.size()); !fresh) {
             return PathError(item.Mark(), at,
                              absl::StrCat("table '", t.name, "' is also ", path, "[", it->second,
                                           "]: table names must be unique"));
           }
           tables.push_back(std::move(t));
         }
         model->tables = std::move(tables);
         return absl::OkStatus();
       }},
  };
}

absl::StatusOr<ScriptTableSection> ConfigReader::ReadScriptTable(const YAML::Node& k,
                                                                 const YAML::Node& item,
                                                                 const std::string& at) {
  ScriptTableSection t;
  bool has_shape = false;
  std::vector<Field> fields = {
      String("name", &t.name,
             [](const std::string& s) -> std::optional<std::string> {
               if (s.empty()) return "must not be empty";
               return std::nullopt;
             }),
      {"shape",
       [this, &t, &has_shape](const YAML::Node& sk, const YAML::Node& sv,
                              const std::string& path) -> absl::Status {
         if (!sv.IsSequence() || sv.size() == 0) {
           return PathError(ValueMark(sk, sv), path,
                            absl::StrCat("expected a non-empty list of sizes, got ", Describe(sv)));
         }
         for (const YAML::Node& d : sv) {
           const std::string dp = absl::StrCat(path, "[", t.shape.size(), "]");
           STRATA_ASSIGN_OR_RETURN(int64_t n, ParseInt(sk, d, dp));
           if (n < 1) return PathError(d.Mark(), dp, absl::StrCat("must be > 0, got ", n));
           t.shape.push_back(static_cast<uint64_t>(n));
         }
         has_shape = true;
         return absl::OkStatus();
       }},
      Int("dim", &t.dim, IntInRange(1, 65536)),
      Enum("init", &t.init, {"torch_default", "glorot_uniform", "zeros"}),
      Uint64("fan_in", &t.fan_in),
      Uint64("fan_out", &t.fan_out),
  };
  if (!item.IsMap()) {
    return PathError(
        ValueMark(k, item), at,
        absl::StrCat("expected a map {name, shape} or {name, dim}, got ", Describe(item)));
  }
  STRATA_RETURN_IF_ERROR(ReadMap(item, item.Mark(), at, fields));
  auto fail = [&](absl::string_view why) {
    return PathError(
        item.Mark(), at,
        absl::StrCat(t.name.empty() ? "" : absl::StrCat("table '", t.name, "': "), why));
  };
  if (t.name.empty()) return fail("needs a name (the script's parameter or embedding name)");
  if (has_shape == (t.dim > 0)) {
    return fail("needs either shape (a dense table) or dim (a sparse table's row width)");
  }
  if (t.dim > 0) {  // sparse: rows initialised as sparse.init says, or zeros
    if (t.init != "" && t.init != "zeros") {
      return fail("a sparse table's init is zeros or left out (sparse.init)");
    }
    if (t.fan_in != 0 || t.fan_out != 0) return fail("fan_in and fan_out are for dense tables");
    return t;
  }
  constexpr uint64_t kMaxElements = uint64_t{1} << 40;  // 4 TiB of floats
  uint64_t elements = 1;
  for (uint64_t d : t.shape) {
    if (d > kMaxElements || elements > kMaxElements / d) {
      return fail(absl::StrCat("shape has more than 2^40 elements"));
    }
    elements *= d;
  }
  // Fans as PyTorch counts them: a weight {out, in, k...} has fan_in
  // in * prod(k) and fan_out out * prod(k); a 1-d table has none of its own.
  if (t.shape.size() >= 2) {
    uint64_t receptive = 1;
    for (size_t i = 2; i < t.shape.size(); ++i) receptive *= t.shape[i];
    if (t.fan_in == 0) t.fan_in = t.shape[1] * receptive;
    if (t.fan_out == 0) t.fan_out = t.shape[0] * receptive;
  }
  if (t.init.empty()) t.init = t.fan_in > 0 ? "torch_default" : "zeros";
  if (t.init == "torch_default" && t.fan_in == 0) {
    return fail("init torch_default needs fan_in for a 1-d table (its layer's inputs)");
  }
  if (t.init == "glorot_uniform" && (t.fan_in == 0 || t.fan_out == 0)) {
    return fail("init glorot_uniform needs fan_in and fan_out for a 1-d table");
  }
  return t;
}

std::vector<ConfigReader::Field> ConfigReader::OptimizerFields(OptimizerSection* opt) {
  return {
      Enum("type", &opt->type, {"sgd", "momentum", "adam"}),
      Double("learning_rate", &opt->learning_rate, DoublePositive()),
      Double("momentum", &opt->momentum, DoubleUnitInterval()),
      Double("beta1", &opt->beta1, DoubleUnitInterval()),
      Double("beta2", &opt->beta2, DoubleUnitInterval()),
      Double("epsilon", &opt->epsilon, DoublePositive()),
      Double("weight_decay", &opt->weight_decay, DoubleNonNegative()),
  };
}

std::vector<ConfigReader::Field> ConfigReader::SparseFields(SparseSection* sparse) {
  return {
      Int("partitions", &sparse->partitions, IntInRange(1, 65536)),
      Section("init",
              [this, sparse] {
                SparseInitSection* init = &sparse->init;
                return std::vector<Field>{
                    Enum("type", &init->type, {"zeros", "uniform", "normal"}),
                    Double("scale", &init->scale, DoubleNonNegative()),
                };
              }),
      Section("optimizer",
              [this, sparse] {
                RowOptimizerSection* opt = &sparse->optimizer;
                return std::vector<Field>{
                    Enum("type", &opt->type, {"sgd", "adagrad", "adam", "ftrl"}),
                    Double("learning_rate", &opt->learning_rate, DoublePositive()),
                    Double("initial_accumulator", &opt->initial_accumulator, DoubleNonNegative()),
                    Double("beta1", &opt->beta1, DoubleUnitInterval()),
                    Double("beta2", &opt->beta2, DoubleUnitInterval()),
                    Double("epsilon", &opt->epsilon, DoublePositive()),
                    Double("weight_decay", &opt->weight_decay, DoubleNonNegative()),
                    Double("ftrl_beta", &opt->ftrl_beta, DoubleNonNegative()),
                    Double("l1", &opt->l1, DoubleNonNegative()),
                    Double("l2", &opt->l2, DoubleNonNegative()),
                };
              }),
      Section("admission",
              [this, sparse] {
                AdmissionSection* a = &sparse->admission;
                return std::vector<Field>{
                    Int("min_count", &a->min_count, IntAtLeast(1)),
                    Double("probability", &a->probability,
                           [](const double& v) -> std::optional<std::string> {
                             if (v > 0 && v <= 1) return std::nullopt;
                             return std::string("must be in (0, 1]");
                           }),
                };
              }),
      Section("eviction",
              [this, sparse] {
                EvictionSection* e = &sparse->eviction;
                return std::vector<Field>{
                    Uint64("idle_updates", &e->idle_updates),
                    Uint64("capacity_rows", &e->capacity_rows),
                };
              }),
      Section("cache",
              [this, sparse] {
                RowCacheSection* c = &sparse->cache;
                return std::vector<Field>{
                    Int64("rows", &c->rows, IntAtLeast(0)),
                    Int("staleness_steps", &c->staleness_steps, IntAtLeast(0)),
                };
              }),
  };
}

std::vector<ConfigReader::Field> ConfigReader::DataFields(DataSection* data) {
  return {
      Enum("format", &data->format, {"idx", "criteo"}),
      String("train_images", &data->train_images, NonEmpty()),
      String("train_labels", &data->train_labels, NonEmpty()),
      String("test_images", &data->test_images, NonEmpty()),
      String("test_labels", &data->test_labels, NonEmpty()),
      String("train", &data->train, NonEmpty()),
      String("test", &data->test, NonEmpty()),
      String("planted", &data->planted, NonEmpty()),
      Enum("bad_lines", &data->bad_lines, {"fail", "skip"}),
      Section("generate",
              [this, data] {
                CtrGenerateSection* g = &data->generate;
                g->enabled = true;
                return std::vector<Field>{
                    String("out_dir", &g->out_dir, NonEmpty()),
                    Int64("train_rows", &g->train_rows, IntAtLeast(1)),
                    Int64("test_rows", &g->test_rows, IntAtLeast(1)),
                    Uint64("seed", &g->seed),
                    Double("zipf", &g->zipf, DoublePositive()),
                    Double("weight_scale", &g->weight_scale, DoubleNonNegative()),
                    Int64("max_vocab", &g->max_vocab, IntInRange(1, 200000)),
                };
              }),
      Int64("task_records", &data->task_records, IntAtLeast(1)),
      Int64("train_limit", &data->train_limit, IntAtLeast(0)),
  };
}

std::vector<ConfigReader::Field> ConfigReader::ClusterFields(ClusterSection* cluster) {
  return {
      Enum("transport", &cluster->transport, {"tcp", "rdma", "auto", "inproc"}),
      Int64("slice_bytes", &cluster->slice_bytes, IntAtLeast(4)),
      Int64("chunk_bytes", &cluster->chunk_bytes, IntAtLeast(0)),
      Int("heartbeat_interval_ms", &cluster->heartbeat_interval_ms, IntAtLeast(1)),
      Int("dead_timeout_ms", &cluster->dead_timeout_ms, IntAtLeast(1)),
      Int("task_lease_timeout_ms", &cluster->task_lease_timeout_ms, IntAtLeast(1)),
      Int("request_timeout_ms", &cluster->request_timeout_ms, IntAtLeast(1)),
      Int("control_connect_ms", &cluster->control_connect_ms, IntInRange(100, 60000)),
      Int("replication", &cluster->replication, IntInRange(0, 8)),
      Enum("aggregation", &cluster->aggregation, {"none", "node"}),
      Section("ports", [this, cluster] { return PortsFields(&cluster->ports); }),
      Section("rdma", [this, cluster] { return RdmaFields(&cluster->rdma); }),
      Section("etcd",
              [this, cluster] {
                EtcdSection* e = &cluster->etcd;
                return std::vector<Field>{
                    StringList("endpoints", &e->endpoints),
                    String("prefix", &e->prefix, NonEmpty()),
                    Int("lease_seconds", &e->lease_seconds, IntInRange(1, 600)),
                    Int("request_timeout_ms", &e->request_timeout_ms, IntAtLeast(1)),
                    Bool("tls", &e->tls),
                    Bool("compact", &e->compact),
                };
              }),
  };
}

std::vector<ConfigReader::Field> ConfigReader::RdmaFields(RdmaSection* rdma) {
  return {
      String("device", &rdma->device,
             [](const std::string&) { return std::optional<std::string>(); }),
      Int("port", &rdma->port, IntAtLeast(0)),
      Int("gid_index", &rdma->gid_index, IntAtLeast(-1)),
      Int("recv_slots", &rdma->recv_slots, IntInRange(2, 4096)),
      Int("send_slots", &rdma->send_slots, IntInRange(2, 4096)),
      Int("slot_kib", &rdma->slot_kib, IntInRange(4, 16384)),
      Int("busy_poll_us", &rdma->busy_poll_us, IntAtLeast(0)),
  };
}

std::vector<ConfigReader::Field> ConfigReader::CheckpointFields(CheckpointSection* c) {
  c->enabled = true;
  return {
      String("dir", &c->dir, NonEmpty()),
      Int64("every_steps", &c->every_steps, IntAtLeast(0)),
      Int("every_seconds", &c->every_seconds, IntAtLeast(0)),
      Int("keep_last", &c->keep_last, IntAtLeast(1)),
      Bool("incremental", &c->incremental),
      Int("full_every", &c->full_every, IntAtLeast(1)),
      Int("compression_level", &c->compression_level, IntInRange(0, 19)),
      Int("grace_seconds", &c->grace_seconds, IntAtLeast(1)),
      Int("timeout_seconds", &c->timeout_seconds, IntAtLeast(1)),
      Bool("on_finish", &c->on_finish),
  };
}

std::vector<ConfigReader::Field> ConfigReader::S3Fields(S3Section* s) {
  s->enabled = true;
  return {
      String("endpoint", &s->endpoint,
             [](const std::string& v) -> std::optional<std::string> {
               if (v.rfind("http://", 0) == 0 || v.rfind("https://", 0) == 0) return std::nullopt;
               return std::string("must start with http:// or https://");
             }),
      String("region", &s->region, NonEmpty()),
      Enum("addressing", &s->addressing, {"path", "virtual"}),
      String("credentials_file", &s->credentials_file, NonEmpty()),
      Int("part_size_mb", &s->part_size_mb, IntInRange(5, 5120)),
      Int("parallel_parts", &s->parallel_parts, IntInRange(1, 64)),
      Int("connect_timeout_ms", &s->connect_timeout_ms, IntInRange(1, 3600000)),
      Int("timeout_seconds", &s->timeout_seconds, IntInRange(1, 86400)),
      Int("retries", &s->retries, IntInRange(0, 20)),
  };
}

std::vector<ConfigReader::Field> ConfigReader::WorkerFields(WorkerSection* w) {
  return {
      Enum("device", &w->device, {"auto", "cpu", "cuda"}),
      Int("gpu", &w->gpu, IntAtLeast(0)),
      Enum("precision", &w->precision, {"fp32", "tf32", "bf16"}),
      Int("recompute_every", &w->recompute_every, IntAtLeast(0)),
      StringList("command", &w->command),
  };
}

std::vector<ConfigReader::Field> ConfigReader::ElasticFields(ElasticSection* e) {
  return {
      Int("min_workers", &e->min_workers, IntAtLeast(1)),
      Int("max_workers", &e->max_workers, IntAtLeast(1)),
      Int("min_pservers", &e->min_pservers, IntAtLeast(1)),
      Int("max_pservers", &e->max_pservers, IntAtLeast(1)),
      Enum("batch", &e->batch, {"fixed_global", "fixed_per_worker"}),
      StringList("provider", &e->provider),
      Int("scale_timeout_seconds", &e->scale_timeout_seconds, IntInRange(1, 86400)),
      Bool("autoscale", &e->autoscale),
      Int("cooldown_seconds", &e->cooldown_seconds, IntInRange(0, 86400)),
      Int("queue_per_worker", &e->queue_per_worker, IntInRange(1, 1000000)),
      Double("min_gain", &e->min_gain, DoubleNonNegative()),
      Int("measure_seconds", &e->measure_seconds, IntInRange(1, 86400)),
      Double("pserver_queue_high", &e->pserver_queue_high, DoublePositive()),
      Double("pserver_queue_low", &e->pserver_queue_low, DoubleNonNegative()),
      Double("pserver_cpu_high", &e->pserver_cpu_high, DoublePositive()),
      Double("pserver_cpu_low", &e->pserver_cpu_low, DoubleNonNegative()),
      Double("pserver_memory_high", &e->pserver_memory_high, DoublePositive()),
      Double("pserver_memory_low", &e->pserver_memory_low, DoubleNonNegative()),
      Int("pserver_signal_seconds", &e->pserver_signal_seconds, IntInRange(1, 86400)),
      Int("max_moves", &e->max_moves, IntInRange(1, 1024)),
      Double("move_rate_mb_per_s", &e->move_rate_mb_per_s, DoublePositive()),
  };
}

std::vector<ConfigReader::Field> ConfigReader::PortsFields(PortsSection* ports) {
  const auto port = [] { return IntInRange(0, 65535); };
  return {
      Int("master", &ports->master, port()),
      Int("master_http", &ports->master_http, port()),
      Int("pserver", &ports->pserver, port()),
      Int("pserver_data", &ports->pserver_data, port()),
      Int("pserver_http", &ports->pserver_http, port()),
      Int("worker_http", &ports->worker_http, port()),
  };
}

absl::Status ConfigReader::CheckDenseSync(const JobConfig& config) const {
  if (config.model.dense_sync != "allreduce") return absl::OkStatus();
  // (The ring steps every worker at once: a bsp step. Sparse tables stay
  // on the pservers.)
  const YAML::Mark mark = MarkOf("model.dense_sync");
  if (config.job.consistency != Consistency::kBsp) {
    return PathError(mark, "model.dense_sync",
                     absl::StrCat("allreduce steps every worker together (bsp); this job's "
                                  "consistency is ",
                                  ConsistencyName(config.job.consistency), " (use ps)"));
  }
  if (config.model.type == "script" && config.model.tables.empty()) {
    // (The ring's tables are set when the worker registers, before a
    // script could declare them.)
    return PathError(mark, "model.dense_sync",
                     "allreduce with model.type script needs the script's tables listed in "
                     "model.tables (a script that declares its own tables uses ps)");
  }
  // (With cluster.aggregation node the ring is hierarchical: each host's
  // sum first, then a ring of one worker per host.)
  return absl::OkStatus();
}

absl::Status ConfigReader::CheckPipeline(const JobConfig& config) const {
  const ModelSection& model = config.model;
  if (marks_.count("model.micro_batches") > 0 && model.stages == 1) {
    return PathError(MarkOf("model.micro_batches"), "model.micro_batches",
                     "cuts a pipeline's batch (model.stages > 1); this model has one stage");
  }
  if (model.stages == 1) return absl::OkStatus();
  const YAML::Mark mark = MarkOf("model.stages");
  if (model.type != "mlp" && model.type != "script") {
    return PathError(mark, "model.stages",
                     absl::StrCat("pipeline stages are built for model.type mlp and for "
                                  "training scripts (model.type script) so far; model.type ",
                                  model.type, " runs as one stage (set 1)"));
  }
  // (A script's model is cut into its stages by the script, which refuses
  // more stages than its nn.Sequential has modules.)
  const int layers = static_cast<int>(model.layers.size()) - 1;
  if (model.type == "mlp" && model.stages > layers) {
    return PathError(mark, "model.stages",
                     absl::StrCat(model.stages, " stages but model.layers makes ", layers,
                                  " layers: each stage needs one at least"));
  }
  if (config.job.consistency != Consistency::kBsp) {
    return PathError(mark, "model.stages",
                     absl::StrCat("a pipeline's stages step together (bsp); this job's "
                                  "consistency is ",
                                  ConsistencyName(config.job.consistency)));
  }
  if (model.dense_sync != "ps" || config.cluster.aggregation == "node") {
    return PathError(mark, "model.stages",
                     "stages with model.dense_sync allreduce or cluster.aggregation node "
                     "are not built yet: use one or the other");
  }
  if (model.micro_batches > 65536) {
    return PathError(MarkOf("model.micro_batches"), "model.micro_batches",
                     absl::StrCat(model.micro_batches, " micro-batches: 65536 at most"));
  }
  if (model.micro_batches > config.job.batch_size) {
    return PathError(
        MarkOf("model.micro_batches"), "model.micro_batches",
        absl::StrCat(model.micro_batches, " micro-batches of a batch of ", config.job.batch_size,
                     " (job.batch_size): each needs one example at least"));
  }
  if (config.elastic.min_workers < model.stages && marks_.count("elastic.min_workers") > 0) {
    return PathError(MarkOf("elastic.min_workers"), "elastic.min_workers",
                     absl::StrCat(config.elastic.min_workers, " workers cannot hold ", model.stages,
                                  " pipeline stages (model.stages)"));
  }
  return absl::OkStatus();
}

absl::Status ConfigReader::CrossCheck(const JobConfig& config) const {
  if (config.security.mode == "plaintext" && config.security.encrypt_data_plane) {
    return PathError(MarkOf("security.encrypt_data_plane"), "security.encrypt_data_plane",
                     "needs security.mode mtls (the keys come over the mTLS control plane)");
  }
  auto mark_of = [this](const char* key) { return MarkOf(key); };
  if (marks_.count("job.staleness") > 0 && config.job.consistency != Consistency::kSsp) {
    return PathError(
        mark_of("job.staleness"), "job.staleness",
        absl::StrCat("bounds an ssp job's staleness; this job's consistency is ",
                     ConsistencyName(config.job.consistency), " (set job.consistency: ssp)"));
  }
  if (config.job.batch_split == "by_speed" && config.job.consistency == Consistency::kAsp) {
    return PathError(mark_of("job.batch_split"), "job.batch_split",
                     "by_speed balances the workers' steps against each other (bsp, ssp); "
                     "in asp nobody waits for a step: use even");
  }
  if (config.cluster.aggregation == "node") {
    if (config.job.consistency != Consistency::kBsp) {
      return PathError(mark_of("cluster.aggregation"), "cluster.aggregation",
                       absl::StrCat("node sums a host's gradients of one step before the push: "
                                    "bsp only; this job's consistency is ",
                                    ConsistencyName(config.job.consistency)));
    }
    if (config.model.type != "mlp" && config.model.type != "wide_deep") {
      return PathError(mark_of("cluster.aggregation"), "cluster.aggregation",
                       absl::StrCat("node is built for model.type mlp and wide_deep so far; "
                                    "model.type ",
                                    config.model.type, " runs a training script"));
    }
  }
  STRATA_RETURN_IF_ERROR(CheckDenseSync(config));
  STRATA_RETURN_IF_ERROR(CheckPipeline(config));
  const bool script = config.model.type == "script";
  if (script && config.worker.command.empty()) {
    return PathError(mark_of("model.type"), "model.type",
                     "a script model is trained by a training script: set worker.command "
                     "(e.g. [/usr/bin/python3, examples/torch/fmnist_cnn.py])");
  }
  if (!script && !config.model.tables.empty()) {
    return PathError(mark_of("model.tables"), "model.tables",
                     absl::StrCat("is for model.type script (a training script's tables); "
                                  "model.type ",
                                  config.model.type, " has tables of its own"));
  }
  const ElasticSection& e = config.elastic;
  if (e.max_workers != 0 && e.max_workers < e.min_workers) {
    return PathError(
        mark_of("elastic.max_workers"), "elastic.max_workers",
        absl::StrCat("must be >= elastic.min_workers (", e.min_workers, "), got ", e.max_workers));
  }
  if (e.max_pservers != 0 && e.max_pservers < e.min_pservers) {
    return PathError(mark_of("elastic.max_pservers"), "elastic.max_pservers",
                     absl::StrCat("must be >= elastic.min_pservers (", e.min_pservers, "), got ",
                                  e.max_pservers));
  }
  for (const auto& [low, high, lo, hi] :
       {std::tuple("pserver_queue_low", "pserver_queue_high", e.pserver_queue_low,
                   e.pserver_queue_high),
        std::tuple("pserver_cpu_low", "pserver_cpu_high", e.pserver_cpu_low, e.pserver_cpu_high),
        std::tuple("pserver_memory_low", "pserver_memory_high", e.pserver_memory_low,
                   e.pserver_memory_high)}) {
    if (lo >= hi) {
      const std::string key = absl::StrCat("elastic.", low);
      return PathError(mark_of(key.c_str()), key,
                       absl::StrCat("must be < elastic.", high, " (", hi, "), got ", lo));
    }
  }
  if (marks_.count("elastic.provider") > 0 && e.provider.empty()) {
    return PathError(mark_of("elastic.provider"), "elastic.provider",
                     "is empty (a command and its arguments, e.g. [scripts/my-provider.sh, "
                     "\"{action}\", \"{role}\", \"{count}\"])");
  }
  const ClusterSection& c = config.cluster;
  if (marks_.count("cluster.etcd") > 0 && c.etcd.endpoints.empty()) {
    return PathError(mark_of("cluster.etcd"), "cluster.etcd.endpoints",
                     "is missing or empty: list the etcd cluster's client URLs "
                     "(host:port or http://host:port), or drop cluster.etcd for one master");
  }
  for (const std::string& endpoint : c.etcd.endpoints) {
    if (auto a = EtcdEndpointAddress(endpoint); !a.ok()) {
      return PathError(mark_of("cluster.etcd.endpoints"), "cluster.etcd.endpoints",
                       std::string(a.status().message()));
    }
  }
  if (c.dead_timeout_ms <= c.heartbeat_interval_ms) {
    // Point at whichever of the two the file set (dead_timeout_ms first).
    YAML::Mark mark = YAML::Mark::null_mark();
    for (const char* key :
         {"cluster.dead_timeout_ms", "cluster.heartbeat_interval_ms", "cluster"}) {
      auto it = marks_.find(key);
      if (it != marks_.end()) {
        mark = it->second;
        break;
      }
    }
    return PathError(mark, "cluster.dead_timeout_ms",
                     absl::StrCat("must be > cluster.heartbeat_interval_ms (",
                                  c.heartbeat_interval_ms, "), got ", c.dead_timeout_ms));
  }
  if (c.chunk_bytes != 0) {
    auto it = marks_.find("cluster.chunk_bytes");
    const YAML::Mark mark = it != marks_.end() ? it->second : YAML::Mark::null_mark();
    if (c.chunk_bytes % 4 != 0) {
      return PathError(mark, "cluster.chunk_bytes",
                       absl::StrCat("must be a multiple of 4 (whole floats), got ", c.chunk_bytes));
    }
    const int64_t chunks = (c.slice_bytes + c.chunk_bytes - 1) / c.chunk_bytes;
    if (chunks > static_cast<int64_t>(kMaxChunksPerPartition)) {
      return PathError(mark, "cluster.chunk_bytes",
                       absl::StrCat(c.chunk_bytes, " cuts a slice of cluster.slice_bytes ",
                                    c.slice_bytes, " into ", chunks, " chunks; at most ",
                                    kMaxChunksPerPartition, " are allowed"));
    }
  }
  return absl::OkStatus();
}

absl::Status ConfigReader::Read(const YAML::Node& root, JobConfig* config) {
  // An empty document has no position; report errors about it at 1:1.
  YAML::Mark root_mark = root.Mark();
  if (root_mark.is_null() || root_mark.line < 0) {
    root_mark.line = 0;
    root_mark.column = 0;
  }
  const std::vector<Field> sections = {
      Section("job", [this, config] { return JobFields(&config->job); }),
      Section("model", [this, config] { return ModelFields(&config->model); }),
      Section("optimizer", [this, config] { return OptimizerFields(&config->optimizer); }),
      Section("sparse", [this, config] { return SparseFields(&config->sparse); }),
      Section("data", [this, config] { return DataFields(&config->data); }),
      Section("cluster", [this, config] { return ClusterFields(&config->cluster); }),
      Section("checkpoint", [this, config] { return CheckpointFields(&config->checkpoint); }),
      Section("worker", [this, config] { return WorkerFields(&config->worker); }),
      Section("s3", [this, config] { return S3Fields(&config->s3); }),
      Section("elastic", [this, config] { return ElasticFields(&config->elastic); }),
      Section("security",
              [this, config] {
                SecuritySection* sec = &config->security;
                return std::vector<Field>{
                    Enum("mode", &sec->mode, {"mtls", "plaintext"}),
                    String("tls_dir", &sec->tls_dir, NonEmpty()),
                    String("token_file", &sec->token_file, NonEmpty()),
                    Int("refresh_seconds", &sec->refresh_seconds, IntInRange(1, 86400)),
                    Bool("encrypt_data_plane", &sec->encrypt_data_plane),
                };
              }),
  };
  STRATA_RETURN_IF_ERROR(ReadMap(root, root_mark, "", sections));

  auto data = marks_.find("data");
  if (data == marks_.end()) {
    return Error(root_mark, "missing required section 'data'");
  }
  const bool criteo = config->data.format == "criteo";
  const std::vector<const char*> required =
      criteo
          ? std::vector<const char*>{"train", "test"}
          : std::vector<const char*>{"train_images", "train_labels", "test_images", "test_labels"};
  for (const char* key : required) {
    const std::string path = absl::StrCat("data.", key);
    if (marks_.count(path) == 0) {
      return Error(data->second, absl::StrCat("missing required key '", path, "'",
                                              criteo ? " (data.format criteo)" : ""));
    }
  }
  if (config->data.generate.enabled && marks_.count("data.generate.out_dir") == 0) {
    return Error(marks_["data.generate"], "missing required key 'data.generate.out_dir'");
  }
  if (config->checkpoint.enabled && marks_.count("checkpoint.dir") == 0) {
    return Error(marks_["checkpoint"], "missing required key 'checkpoint.dir'");
  }
  if (config->s3.enabled && marks_.count("s3.endpoint") == 0) {
    return Error(marks_["s3"], "missing required key 's3.endpoint'");
  }
  // An s3:// path without the s3 section would fail at the first read or
  // checkpoint; say so now, at the key.
  if (!config->s3.enabled) {
    for (const char* key : {"checkpoint.dir", "data.train_images", "data.train_labels",
                            "data.test_images", "data.test_labels", "data.train", "data.test"}) {
      auto it = marks_.find(key);
      if (it == marks_.end()) continue;
      const std::string& value =
          std::string(key) == "checkpoint.dir"      ? config->checkpoint.dir
          : std::string(key) == "data.train_images" ? config->data.train_images
          : std::string(key) == "data.train_labels" ? config->data.train_labels
          : std::string(key) == "data.test_images"  ? config->data.test_images
          : std::string(key) == "data.test_labels"  ? config->data.test_labels
          : std::string(key) == "data.train"        ? config->data.train
                                                    : config->data.test;
      if (value.rfind("s3://", 0) == 0) {
        return PathError(it->second, key,
                         absl::StrCat("'", value,
                                      "' is in an object store: add an s3 section (endpoint, "
                                      "credentials_file) to the config"));
      }
    }
  }
  // The model reads what the data format gives: an MLP images (idx), a
  // wide & deep model CTR rows (criteo).
  // A training script's model (type script) reads what its script reads.
  const bool wide_deep = config->model.type == "wide_deep";
  if (config->model.type != "script" && wide_deep != criteo) {
    auto it = marks_.find("model.type");
    return PathError(
        it != marks_.end() ? it->second : data->second, "model.type",
        absl::StrCat("model type '", config->model.type, "' does not read data.format '",
                     config->data.format, "' (mlp reads idx, wide_deep reads criteo)"));
  }
  return CrossCheck(*config);
}

// Reads a YAML stream's events without building nodes: notes where the
// second document's root node is. Not thread-safe; one per stream.
class SecondDocumentFinder : public YAML::EventHandler {
 public:
  const YAML::Mark& second_root() const { return second_root_; }

  void OnDocumentStart(const YAML::Mark& mark) override { ++documents_; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { OnNode(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { OnNode(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    OnNode(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    OnNode(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    OnNode(mark);
  }
  void OnMapEnd() override {}

 private:
  void OnNode(const YAML::Mark& mark) {
    if (documents_ == 2 && !seen_second_root_) {
      second_root_ = mark;
      seen_second_root_ = true;
    }
  }

  int documents_ = 0;
  bool seen_second_root_ = false;
  YAML::Mark second_root_ = YAML::Mark::null_mark();
};

// Documents counted at most; yaml-cpp 0.7 hands out empty documents
// forever on some malformed input (",o:j"), so YAML::LoadAll never returns
// there (found by tests/fuzz/config_fuzz.cc).
constexpr int kMaxDocumentsCounted = 8;

}  // namespace

absl::StatusOr<std::string> EtcdEndpointAddress(const std::string& endpoint) {
  absl::string_view e = endpoint;
  if (!absl::ConsumePrefix(&e, "http://")) absl::ConsumePrefix(&e, "https://");
  absl::ConsumeSuffix(&e, "/");
  const size_t colon = e.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(e.substr(colon + 1), &port) || port < 1 || port > 65535 ||
      e.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", endpoint, "' is not host:port or http(s)://host:port"));
  }
  return std::string(e);
}

absl::StatusOr<JobConfig> ParseJobConfig(const std::string& text, const std::string& filename) {
  JobConfig config;
  try {
    // Count the documents (a bounded number), then load the first.
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    SecondDocumentFinder finder;
    int documents = 0;
    while (documents <= kMaxDocumentsCounted && parser.HandleNextDocument(finder)) {
      ++documents;
    }
    if (documents > 1) {
      const YAML::Mark& mark = finder.second_root();
      std::string where = filename + ": ";
      if (!mark.is_null() && mark.line >= 0) {
        where = absl::StrCat(filename, ":", mark.line + 1, ":", mark.column + 1, ": ");
      }
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected one YAML document, found ",
          documents > kMaxDocumentsCounted ? absl::StrCat("more than ", kMaxDocumentsCounted)
                                           : absl::StrCat(documents)));
    }
    ConfigReader reader(filename);
    STRATA_RETURN_IF_ERROR(reader.Read(YAML::Load(text), &config));
  } catch (const YAML::Exception& e) {
    std::string where = filename + ": ";
    if (!e.mark.is_null() && e.mark.line >= 0) {
      where = absl::StrCat(filename, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ");
    }
    return absl::InvalidArgumentError(absl::StrCat(where, "invalid YAML: ", e.msg));
  }
  config.source.clear();
  return config;
}

absl::StatusOr<std::string> ReadLocalFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string why = std::generic_category().message(err);
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(path, ": ", why));
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory"));
  }
  std::ifstream in(path, std::ios::in | std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open: ", std::generic_category().message(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read failed"));
  }
  return text.str();
}

absl::Status CheckClusterSize(const JobConfig& config, int pservers, int workers) {
  if (pservers < 1 || workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cluster needs at least one pserver and one worker; it has ", pservers,
                     " pserver(s) and ", workers, " worker(s)"));
  }
  const int replication = config.cluster.replication;
  // (A job that may grow its pservers gets its backups as they join.)
  const int most_pservers = std::max(pservers, config.elastic.max_pservers);
  if (replication >= most_pservers) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source.empty() ? "config" : config.source, ": cluster.replication ", replication,
        " needs at least ", replication + 1, " pservers; the cluster has ", pservers,
        config.elastic.max_pservers > 0
            ? absl::StrCat(" and elastic.max_pservers is ", config.elastic.max_pservers)
            : std::string(" (or grows to that many: elastic.max_pservers)")));
  }
  const ElasticSection& e = config.elastic;
  const std::string src = config.source.empty() ? "config" : config.source;
  const int stages = config.model.stages;
  if (stages > 1 && (workers < stages || workers % stages != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        src, ": model.stages is ", stages, "; the job starts with ", workers, " workers, which ",
        workers < stages ? "cannot hold every stage" : "do not make whole groups",
        " (each stage is a worker of its own: the workers must be a multiple of ", stages, ")"));
  }
  for (const auto& [role, n, lo, hi] :
       {std::tuple<const char*, int, int, int>{"workers", workers, e.min_workers, e.max_workers},
        {"pservers", pservers, e.min_pservers, e.max_pservers}}) {
    if (n < lo) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": elastic.min_", role, " is ", lo,
                                                     "; the job starts with ", n, " ", role));
    }
    if (hi != 0 && n > hi) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": elastic.max_", role, " is ", hi,
                                                     "; the job starts with ", n, " ", role));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadLocalFile(path));
  STRATA_ASSIGN_OR_RETURN(JobConfig config, ParseJobConfig(text, path));
  config.source = path;
  return config;
}

}  // namespace strata
