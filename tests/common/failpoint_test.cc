#include "common/failpoint.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

TEST(FailpointTest, BadSpecsAreRefusedNamingTheItem) {
  EXPECT_THAT(Failpoints::Parse("a@0").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'a@0'")));
  EXPECT_THAT(Failpoints::Parse("@2").status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Failpoints::Parse("a@x").status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Failpoints::Parse("a~x").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NAME~MS")));
  EXPECT_TRUE(Failpoints::Parse("").ok());
}

TEST(FailpointTest, ADelayHoldsEveryPass) {
  auto f = Failpoints::Parse("slow~30,z");
  ASSERT_TRUE(f.ok());
  const absl::Time start = absl::Now();
  (*f)->Hit("slow");
  (*f)->Hit("slow");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(60));
  EXPECT_EQ((*f)->Delay("slow"), absl::Milliseconds(30));
  EXPECT_EQ((*f)->Delay("z"), absl::ZeroDuration());
}

// Runs `fn` in a child process; true when the child was killed by SIGKILL.
bool DiesOfSigkill(const std::function<void()>& fn) {
  pid_t pid = fork();
  if (pid == 0) {
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

TEST(FailpointTest, KillsTheProcessOnTheNthPassOfAnArmedPointOnly) {
  auto f = Failpoints::Parse("x.y@3,z");
  ASSERT_TRUE(f.ok());
  const Failpoints* fp = f->get();
  EXPECT_FALSE(DiesOfSigkill([fp] {
    fp->Hit("x.y");
    fp->Hit("x.y");
    fp->Hit("other");
    HitFailpoint(nullptr, "z");
  }));
  EXPECT_TRUE(DiesOfSigkill([fp] {
    for (int i = 0; i < 3; ++i) fp->Hit("x.y");
  }));
  EXPECT_TRUE(DiesOfSigkill([fp] { fp->Hit("z"); }));
}

}  // namespace
}  // namespace strata
