// gmock matchers for absl::Status / absl::StatusOr (Debian's abseil has none).
#ifndef STRATA_TESTS_TESTING_STATUS_MATCHERS_H_
#define STRATA_TESTS_TESTING_STATUS_MATCHERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace strata::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = ::strata::testing::GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

// StatusIs(code) or StatusIs(code, message_matcher).
MATCHER_P(StatusIs, code, "") {
  const absl::Status& s = ::strata::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code;
}
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = ::strata::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

#define STRATA_ASSERT_OK(expr) ASSERT_THAT((expr), ::strata::testing::IsOk())
#define STRATA_EXPECT_OK(expr) EXPECT_THAT((expr), ::strata::testing::IsOk())
// STRATA_ASSERT_OK_AND_ASSIGN(auto x, StatusOrExpr);
#define STRATA_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  STRATA_ASSERT_OK_AND_ASSIGN_IMPL_(STRATA_CONCAT_T_(_sor_, __LINE__), lhs, expr)
#define STRATA_CONCAT_T_INNER_(a, b) a##b
#define STRATA_CONCAT_T_(a, b) STRATA_CONCAT_T_INNER_(a, b)
#define STRATA_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  ASSERT_TRUE(tmp.ok()) << tmp.status().ToString();       \
  lhs = std::move(tmp).value()

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_STATUS_MATCHERS_H_
