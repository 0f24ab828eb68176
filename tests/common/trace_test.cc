#include "common/trace.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

google::protobuf::ListValue ParseArray(const std::string& text) {
  google::protobuf::ListValue events;
  auto s = google::protobuf::util::JsonStringToMessage(text, &events);
  EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << text;
  return events;
}

std::string TempPath(const char* name) {
  return std::string(::testing::TempDir()) + "/" + name + ".json";
}

TEST(TraceWriterTest, WritesChromeTraceEvents) {
  const std::string path = TempPath("trace");
  auto w = TraceWriter::Open(path, 7, "worker \"0\"");
  ASSERT_TRUE(w.ok()) << w.status();
  (*w)->ThreadName(1, "steps");
  const absl::Time t0 = absl::FromUnixMicros(1700000000000000);
  (*w)->Span("forward", "compute", 1, t0, t0 + absl::Microseconds(250), "\"table\": 2");
  (*w)->Span("push", "comm", 2, t0 + absl::Microseconds(10), t0 + absl::Microseconds(30));
  ASSERT_TRUE((*w)->Close().ok());
  const google::protobuf::ListValue events = ParseArray(ReadAll(path));
  ASSERT_EQ(events.values_size(), 4);
  const auto& meta = events.values(0).struct_value().fields();
  EXPECT_EQ(meta.at("ph").string_value(), "M");
  EXPECT_EQ(meta.at("args").struct_value().fields().at("name").string_value(), "worker \"0\"");
  const auto& span = events.values(2).struct_value().fields();
  EXPECT_EQ(span.at("name").string_value(), "forward");
  EXPECT_EQ(span.at("ph").string_value(), "X");
  EXPECT_EQ(span.at("ts").number_value(), 1700000000000000.0);
  EXPECT_EQ(span.at("dur").number_value(), 250);
  EXPECT_EQ(span.at("pid").number_value(), 7);
  EXPECT_EQ(span.at("tid").number_value(), 1);
  EXPECT_EQ(span.at("args").struct_value().fields().at("table").number_value(), 2);
  EXPECT_FALSE(events.values(3).struct_value().fields().count("args"));
}

TEST(TraceWriterTest, DisabledDropsEventsAndAnUnclosedTraceIsStillAnArrayPrefix) {
  const std::string path = TempPath("cut");
  auto w = TraceWriter::Open(path, 1, "w");
  ASSERT_TRUE(w.ok());
  const absl::Time t0 = absl::Now();
  (*w)->set_enabled(false);
  (*w)->Span("dropped", "x", 1, t0, t0 + absl::Milliseconds(1));
  (*w)->set_enabled(true);
  (*w)->Span("kept", "x", 1, t0, t0 + absl::Milliseconds(1));
  ASSERT_TRUE((*w)->Close().ok());
  std::string text = ReadAll(path);
  EXPECT_EQ(text.find("dropped"), std::string::npos);
  EXPECT_EQ(ParseArray(text).values_size(), 2);
  // A trace cut short (no closing bracket) is what the array format allows:
  // closing it is all a reader needs.
  const size_t close = text.rfind(']');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(ParseArray(text.substr(0, close) + "]").values_size(), 2);
}

TEST(TraceWriterTest, UncreatableFileIsAnErrorNamingIt) {
  auto w = TraceWriter::Open("/nonexistent-dir/t.json", 1, "w");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("/nonexistent-dir/t.json"), std::string::npos);
}

}  // namespace
}  // namespace strata
