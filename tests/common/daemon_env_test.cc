#include "common/daemon_env.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string WriteConfig(const std::string& name, const std::string& extra) {
  const std::string path = ::testing::TempDir() + "/daemon_env_test_" + name + ".yaml";
  std::ofstream(path) << "data:\n  train_images: /d/a\n  train_labels: /d/b\n"
                         "  test_images: /d/c\n  test_labels: /d/d\n"
                         "security:\n  mode: plaintext\n"
                      << extra;
  return path;
}

DaemonEnvOptions Options(const std::string& config) {
  DaemonEnvOptions o;
  o.role = "pserver";
  o.index = 0;
  o.config_path = config;
  return o;
}

TEST(DaemonEnvTest, LoadsTheConfigTheFileSystemTheSecurityAndTheFailpoints) {
  DaemonEnvOptions o = Options(WriteConfig("ok", ""));
  o.failpoints = "after_push@2";
  int code = -1;
  auto env = LoadDaemonEnv(o, &code);
  ASSERT_THAT(env.status(), IsOk());
  EXPECT_EQ(code, 0);
  EXPECT_NE(env->fs, nullptr);
  EXPECT_NE(env->failpoints, nullptr);
  EXPECT_EQ(env->config.data.train_images, "/d/a");
}

TEST(DaemonEnvTest, ABadConfigIsExitTwoNamingTheFileAndLine) {
  const std::string path = WriteConfig("bad", "optimizer:\n  learning_rate: -1\n");
  int code = -1;
  auto env = LoadDaemonEnv(Options(path), &code);
  EXPECT_THAT(env.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     AllOf(HasSubstr(path + ":9:"), HasSubstr("learning_rate"))));
  EXPECT_EQ(code, 2);
}

TEST(DaemonEnvTest, ABadFailpointIsExitTwo) {
  DaemonEnvOptions o = Options(WriteConfig("fp", ""));
  o.failpoints = "a@x";
  int code = -1;
  EXPECT_FALSE(LoadDaemonEnv(o, &code).ok());
  EXPECT_EQ(code, 2);
}

TEST(DaemonEnvTest, MissingCertificatesAreExitTwoNamingTheDirectory) {
  const std::string path = ::testing::TempDir() + "/daemon_env_test_mtls.yaml";
  std::ofstream(path) << "data:\n  train_images: /d/a\n  train_labels: /d/b\n"
                         "  test_images: /d/c\n  test_labels: /d/d\n"
                         "security:\n  mode: mtls\n  tls_dir: /nonexistent-strata-tls\n";
  int code = -1;
  const absl::Status s = LoadDaemonEnv(Options(path), &code).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent-strata-tls"));
  EXPECT_EQ(code, 2);
  // Without a control plane (a worker's --local) no certificate is read.
  DaemonEnvOptions local = Options(path);
  local.security = false;
  EXPECT_THAT(LoadDaemonEnv(local, &code).status(), IsOk());
}

TEST(DaemonEnvTest, AnUnusableCheckpointRootIsExitOne) {
  DaemonEnvOptions o =
      Options(WriteConfig("ckpt", "checkpoint:\n  dir: /proc/strata-no-such/checkpoints\n"));
  o.check_checkpoint_root = true;
  int code = -1;
  const absl::Status s = LoadDaemonEnv(o, &code).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("/proc/strata-no-such/checkpoints"));
  EXPECT_EQ(code, 1);
}

}  // namespace
}  // namespace strata
