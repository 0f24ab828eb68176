#include "tools/cli.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/audit_log.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"

namespace strata::tools {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

// Writes `text` to a file in the test's temp dir and returns its path.
std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/cli_test_" + name;
  std::ofstream f(path, std::ios::trunc);
  f << text;
  return path;
}

// Ports differ from the defaults so the plan shows they were read.
constexpr char kConfig[] =
    "job:\n"
    "  name: cli-test\n"
    "  consistency: asp\n"
    "model:\n"
    "  layers: [4, 3, 2]\n"
    "data:\n"
    "  train_images: /d/train-images.gz\n"
    "  train_labels: /d/train-labels.gz\n"
    "  test_images: /d/test-images.gz\n"
    "  test_labels: /d/test-labels.gz\n"
    "cluster:\n"
    "  ports:\n"
    "    master: 9000\n"
    "    master_http: 9001\n"
    "    pserver: 9100\n"
    "    pserver_data: 9200\n"
    "    pserver_http: 9300\n"
    "    worker_http: 9400\n";

constexpr char kHosts[] =
    "# two hosts\n"
    "127.0.0.1  master pserver=2 worker\n"
    "node-a     pserver worker=2\n";

struct Result {
  int code;
  std::string out, err;
};
Result RunStrata(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunCli(args, out, err);
  return {code, out.str(), err.str()};
}

TEST(CliTest, WaitRefusesABadProgressInterval) {
  for (const char* every : {"0", "-1", "soon"}) {
    const Result r = RunStrata({"wait", "--master", "127.0.0.1:1", "--every", every});
    EXPECT_EQ(r.code, 2) << every;
    EXPECT_THAT(r.err, HasSubstr("--every must be a positive number of seconds")) << every;
  }
}

TEST(CliTest, TheJobProgressLineHasTheFiguresAndTheTimeLeft) {
  proto::JobStatus j;
  j.set_state("running");
  j.set_job_state(proto::JOB_RUNNING);
  j.set_epoch(1);
  j.set_epochs(3);
  j.set_steps(420);
  j.set_tasks_done(30);
  j.set_tasks_total(90);
  j.set_samples_per_sec(5210.4);
  j.set_loss(0.42131);
  j.set_train_accuracy(0.8534);
  j.set_comm_share(0.123);
  j.set_wall_seconds(30);  // 1 s a task: 60 tasks left
  EXPECT_EQ(JobProgressLine(j),
            "epoch 2/3  step 420  tasks 30/90  samples/s 5210  loss 0.4213  accuracy 0.853  "
            "comm 12%  eta 1:00");
  // Evaluating: no time left to guess; the test accuracy once known.
  j.set_state("evaluating");
  j.set_job_state(proto::JOB_EVALUATING);
  j.set_epoch(3);
  j.set_tasks_done(90);
  j.set_has_test_accuracy(true);
  j.set_test_accuracy(0.8611);
  EXPECT_EQ(JobProgressLine(j),
            "epoch 3/3  step 420  tasks 90/90  samples/s 5210  loss 0.4213  accuracy 0.853  "
            "test accuracy 0.8611  comm 12%  evaluating");
  // Before any task is done: no guess either.
  proto::JobStatus fresh;
  fresh.set_state("running");
  fresh.set_job_state(proto::JOB_RUNNING);
  fresh.set_epochs(1);
  fresh.set_tasks_total(10);
  EXPECT_EQ(JobProgressLine(fresh), "epoch 1/1  step 0  tasks 0/10  samples/s 0  loss 0.0000");
}

TEST(CliTest, PlanListsEveryDaemonWithItsPorts) {
  const std::string cfg = WriteTemp("plan.yaml", kConfig);
  const std::string hosts = WriteTemp("plan.hosts", kHosts);
  const Result r = RunStrata({"plan", "--config", cfg, "--hosts", hosts});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  // Instance i of a role uses base + i, numbered across hosts in file order.
  EXPECT_EQ(r.out,
            "master 0 127.0.0.1 9000 - 9001\n"
            "pserver 0 127.0.0.1 9100 9200 9300\n"
            "pserver 1 127.0.0.1 9101 9201 9301\n"
            "pserver 2 node-a 9102 9202 9302\n"
            "worker 0 127.0.0.1 - - 9400\n"
            "worker 1 node-a - - 9401\n"
            "worker 2 node-a - - 9402\n");
}

TEST(CliTest, PlanAcceptsKeyEqualsValueFlags) {
  const std::string cfg = WriteTemp("plan_eq.yaml", kConfig);
  const std::string hosts = WriteTemp("plan_eq.hosts", "localhost master pserver worker\n");
  const Result r = RunStrata({"plan", "--config=" + cfg, "--hosts=" + hosts});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "master 0 localhost 9000 - 9001\n"
            "pserver 0 localhost 9100 9200 9300\n"
            "worker 0 localhost - - 9400\n");
}

TEST(CliTest, PlanNeedsBothFiles) {
  const std::string cfg = WriteTemp("plan_only.yaml", kConfig);
  const Result r = RunStrata({"plan", "--config", cfg});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--hosts FILE"));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST(CliTest, ValidateReportsConfigAndHostFile) {
  const std::string cfg = WriteTemp("ok.yaml", kConfig);
  const std::string hosts = WriteTemp("ok.hosts", kHosts);
  // (--offline: node-a is not a real host.)
  const Result r = RunStrata({"validate", "--config", cfg, "--hosts", hosts, "--offline"});
  EXPECT_EQ(r.code, 0) << r.err;
  // layers [4, 3, 2]: 4*3 + 3 + 3*2 + 2 = 23 parameters.
  EXPECT_EQ(r.out, cfg + ": ok (job 'cli-test', asp, 23 dense parameters)\n" +
                       "model against data: not checked (model.layers[0] = 4 features; not on "
                       "this host: /d/train-images.gz, /d/train-labels.gz, /d/test-images.gz, "
                       "/d/test-labels.gz)\n" +
                       hosts +
                       ": ok (2 host(s), 3 pserver(s), 3 worker(s))\n"
                       "ports: ok (14 ports on 2 host(s), no two daemons share one)\n");
  EXPECT_THAT(r.err, IsEmpty());
}

// IDX images (n x 2 x 2, so 4 features each) and labels (n).
std::string IdxImages2x2(uint32_t n) {
  std::string s = {0, 0, 8, 3};
  for (uint32_t d : {n, 2u, 2u}) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>(d >> shift);
  }
  return s + std::string(n * 4, '\1');
}
std::string IdxLabels(uint32_t n) {
  std::string s = {0, 0, 8, 1};
  for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>(n >> shift);
  return s + std::string(n, '\1');
}
struct IdxFiles {
  std::string train_images, train_labels, test_images, test_labels;
};
std::string ConfigOver(const IdxFiles& d, const std::string& layers) {
  return "model:\n  layers: " + layers + "\ndata:\n  train_images: " + d.train_images +
         "\n  train_labels: " + d.train_labels + "\n  test_images: " + d.test_images +
         "\n  test_labels: " + d.test_labels + "\n";
}

// Found by a review: a first layer that does not fit the images was only
// caught when the workers started.
TEST(CliTest, ValidateChecksTheModelAgainstTheData) {
  const IdxFiles d = {
      WriteTemp("train-images", IdxImages2x2(6)), WriteTemp("train-labels", IdxLabels(6)),
      WriteTemp("test-images", IdxImages2x2(3)), WriteTemp("test-labels", IdxLabels(3))};
  Result r = RunStrata({"validate", "--config", WriteTemp("fits.yaml", ConfigOver(d, "[4, 2]"))});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("model against data: ok (model.layers[0] = 4 features)"));

  const std::string bad = WriteTemp("too_wide.yaml", ConfigOver(d, "[5, 2]"));
  r = RunStrata({"validate", "--config", bad});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(StartsWith(bad + ": model.layers[0] is 5"),
                           HasSubstr("data.train_images (" + d.train_images + ")"),
                           HasSubstr("4 features per example (2 x 2)")));
  EXPECT_THAT(r.out, IsEmpty());

  // Labels that do not match their images, named.
  WriteTemp("test-labels", IdxLabels(2));
  r = RunStrata({"validate", "--config", WriteTemp("fits2.yaml", ConfigOver(d, "[4, 2]"))});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("data.test_images"), HasSubstr("3 images"),
                           HasSubstr("labels (" + d.test_labels + ") 2")));
}

TEST(CliTest, ValidateBadConfigExitsTwoNamingFileAndLine) {
  const std::string cfg = WriteTemp("bad.yaml",
                                    "data:\n"
                                    "  train_images: /d/a\n"
                                    "  train_labels: /d/b\n"
                                    "  test_images: /d/c\n"
                                    "  test_labels: /d/d\n"
                                    "optimizer:\n"
                                    "  learning_rate: -1\n");  // line 7
  const Result r = RunStrata({"validate", "--config", cfg});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(StartsWith(cfg + ":7:"), HasSubstr("optimizer.learning_rate"),
                           HasSubstr("must be > 0")));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST(CliTest, ValidateBadHostFileExitsTwoNamingFileAndLine) {
  const std::string cfg = WriteTemp("ok2.yaml", kConfig);
  const std::string hosts = WriteTemp("bad.hosts",
                                      "127.0.0.1 master pserver worker\n"
                                      "node-b gpu=2\n");  // line 2
  const Result r = RunStrata({"validate", "--config", cfg, "--hosts", hosts});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(StartsWith(hosts + ":2:"), HasSubstr("gpu")));
}

// A config whose replication the host file's pservers cannot hold is
// refused before anything starts (the master would refuse it too).
TEST(CliTest, ValidateRefusesMoreReplicasThanTheHostFilesPServers) {
  const std::string cfg = WriteTemp("replicated.yaml", std::string(kConfig) + "  replication: 1\n");
  const std::string hosts = WriteTemp("one-pserver.hosts", "127.0.0.1 master pserver worker\n");
  const Result r = RunStrata({"validate", "--config", cfg, "--hosts", hosts, "--offline"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr(cfg + ": cluster.replication 1 needs at least 2 pservers"),
                           HasSubstr(hosts)));
}

TEST(CliTest, ValidateMissingConfigExitsTwoNamingThePath) {
  const std::string missing = ::testing::TempDir() + "/cli_test_does_not_exist.yaml";
  const Result r = RunStrata({"validate", "--config", missing});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr(missing));
}

TEST(CliTest, DoctorReportsThisHostsRdmaReadiness) {
  // No RDMA device on the machines that run the tests (the Soft-RoCE guest
  // of tests/rdma runs the same command and expects "RDMA: ready").
  const Result r = RunStrata({"doctor"});
  if (r.code == 0) {
    EXPECT_THAT(r.out, HasSubstr("RDMA: ready"));
    return;
  }
  EXPECT_EQ(r.code, 1) << r.err;
  if (!r.err.empty()) {  // a build without libibverbs
    EXPECT_THAT(r.err, HasSubstr("no RDMA support"));
    return;
  }
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("RDMA devices:"), HasSubstr("FAIL"), HasSubstr("RDMA: NOT ready")));
}

TEST(CliTest, DoctorWithABadConfigExitsTwoNamingIt) {
  const Result r = RunStrata({"doctor", "--config", "/nonexistent/job.yaml"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/job.yaml"));
}

TEST(CliTest, UnknownCommandExitsTwoWithUsage) {
  const Result r = RunStrata({"frobnicate"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("unknown command 'frobnicate'"), HasSubstr("usage: strata")));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST(CliTest, NoArgumentsIsUsageErrorAndHelpIsNot) {
  Result r = RunStrata({});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("usage: strata"));
  r = RunStrata({"help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("usage: strata"));
  EXPECT_THAT(r.err, IsEmpty());
}

TEST(CliTest, EveryCommandHasHelp) {
  for (const char* cmd : {"status", "top", "logs", "drain", "stop", "wait", "validate", "plan",
                          "prometheus-config", "doctor", "checkpoint", "audit"}) {
    const Result r = RunStrata({cmd, "--help"});
    EXPECT_EQ(r.code, 0) << cmd << ": " << r.err;
    EXPECT_THAT(r.out, AllOf(HasSubstr(std::string("usage: strata ") + cmd),
                             HasSubstr(std::string("  ") + cmd + " ")))
        << cmd;
    EXPECT_THAT(r.err, IsEmpty()) << cmd;
  }
  // Only that command's lines.
  const Result top = RunStrata({"top", "-h"});
  EXPECT_THAT(top.out, HasSubstr("steps/s"));
  EXPECT_THAT(top.out, Not(HasSubstr("validate")));
  // checkpoint: all of its forms.
  const Result ck = RunStrata({"checkpoint", "list", "--help"});
  EXPECT_THAT(ck.out, AllOf(HasSubstr("checkpoint list"), HasSubstr("checkpoint verify")));
  EXPECT_EQ(RunStrata({"frobnicate", "--help"}).code, 2);
}

TEST(CliTest, EveryCommandHasJson) {
  for (const char* cmd : {"status", "top", "logs", "drain", "stop", "wait", "validate", "plan",
                          "prometheus-config", "doctor", "checkpoint", "audit"}) {
    const Result r = RunStrata({cmd, "--help"});
    EXPECT_THAT(r.out, HasSubstr("--json")) << cmd;
  }
  const std::string cfg = WriteTemp("json.yaml", kConfig);
  const std::string hosts = WriteTemp("json.hosts", kHosts);
  Result r = RunStrata({"plan", "--config", cfg, "--hosts", hosts, "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              AllOf(StartsWith("[{\"role\": \"master\", \"index\": 0, \"host\": \"127.0.0.1\", "
                               "\"port\": 9000, \"data_port\": -1, \"http_port\": 9001}"),
                    HasSubstr("{\"role\": \"worker\", \"index\": 2, \"host\": \"node-a\"")));
  r = RunStrata({"prometheus-config", "--config", cfg, "--hosts", hosts, "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("\"scrape_interval\": \"5s\""),
                    HasSubstr("{\"targets\": [\"node-a:9302\"], \"labels\": {\"strata_job\": "
                              "\"cli-test\", \"role\": \"pserver\", \"index\": \"2\"}}")));
  // The config is mtls (the default): the daemons serve HTTPS to people's
  // roles, and Prometheus scrapes with a viewer's certificate.
  EXPECT_THAT(r.out, HasSubstr("\"scheme\": \"https\", \"tls_config\": {\"ca_file\": "
                               "\"/etc/prometheus/strata-tls/ca.crt\", \"cert_file\": "
                               "\"/etc/prometheus/strata-tls/client.crt\""));
  r = RunStrata({"prometheus-config", "--config", cfg, "--hosts", hosts, "--tls-dir", "/p"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("    scheme: https"), HasSubstr("      key_file: /p/client.key")));
  const std::string plain =
      WriteTemp("plain.yaml", std::string(kConfig) + "security:\n  mode: plaintext\n");
  r = RunStrata({"prometheus-config", "--config", plain, "--hosts", hosts});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("https")));
  r = RunStrata({"validate", "--config", cfg, "--hosts", hosts, "--offline", "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              AllOf(StartsWith("{\"config\": {\"file\": \"" + cfg + "\", \"ok\": true"),
                    HasSubstr("\"pservers\": 3, \"workers\": 3}"), HasSubstr("\"checks\": []}")));
}

// A port of this host, held by a listening socket until the test ends.
struct HeldPort {
  int fd = -1;
  int port = 0;
  HeldPort() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd, 1);
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~HeldPort() { close(fd); }
};

// kConfig with every port moved to one that is free now (the host checks
// bind them): master, master_http, pserver, pserver_data, pserver_http,
// worker_http in *ports; the master's is `master_port` when given.
std::string ConfigWithFreePorts(std::vector<int>* ports, int master_port = 0) {
  std::vector<std::unique_ptr<HeldPort>> held;
  ports->clear();
  for (int i = 0; i < 6; ++i) {
    held.push_back(std::make_unique<HeldPort>());
    ports->push_back(i == 0 && master_port > 0 ? master_port : held.back()->port);
  }
  std::string c = kConfig;
  const char* keys[] = {"master: 9000",       "master_http: 9001",  "pserver: 9100",
                        "pserver_data: 9200", "pserver_http: 9300", "worker_http: 9400"};
  for (int i = 0; i < 6; ++i) {
    const std::string k = keys[i];
    const std::string name = k.substr(0, k.find(':'));
    c.replace(c.find(k), k.size(), name + ": " + std::to_string((*ports)[i]));
  }
  return c;  // (the held sockets close here: the ports are free again)
}

TEST(CliTest, ValidateRefusesTwoDaemonsOnOnePort) {
  // Three pservers on one host count up from 9100 into the data ports at 9101.
  std::string c = kConfig;
  c.replace(c.find("pserver_data: 9200"), 18, "pserver_data: 9101");
  const std::string cfg = WriteTemp("collide.yaml", c);
  const std::string hosts = WriteTemp("collide.hosts", "127.0.0.1 master pserver=3 worker\n");
  const Result r = RunStrata({"validate", "--config", cfg, "--hosts", hosts, "--offline"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr(hosts + ": host 127.0.0.1: port 9101 would be both "
                                       "pserver-0's data port and pserver-1's port"));
  EXPECT_THAT(r.err, HasSubstr("move cluster.ports in " + cfg));
}

TEST(CliTest, ValidateFindsAPortInUseOnALocalHost) {
  HeldPort held;
  std::vector<int> ports;
  const std::string cfg = WriteTemp("inuse.yaml", ConfigWithFreePorts(&ports, held.port));
  const std::string hosts = WriteTemp("inuse.hosts", "127.0.0.1 master pserver worker\n");
  const Result r = RunStrata({"validate", "--config", cfg, "--hosts", hosts});
  EXPECT_EQ(r.code, 1);
  const std::string http = std::to_string(ports[1]);
  EXPECT_THAT(r.out, AllOf(HasSubstr("127.0.0.1: FAILED"),
                           HasSubstr("FAIL  port " + std::to_string(held.port) +
                                     ": 127.0.0.1:" + std::to_string(held.port) + " is in use"),
                           HasSubstr("ok    port " + http + ": 127.0.0.1:" + http + " is free")));
  EXPECT_THAT(r.err, HasSubstr("1 of 1 host(s) failed their checks"));
}

// A stand-in for ssh: runs the command here (or fails as ssh does when it
// cannot reach the host), recording the host it was given.
std::string FakeSsh(const std::string& name, bool reachable) {
  const std::string log = ::testing::TempDir() + "/cli_test_" + name + ".log";
  const std::string path = WriteTemp(
      name, reachable
                ? "#!/bin/bash\necho \"$1\" >> " + log + "\nshift\nexec bash -c \"$*\"\n"
                : "#!/bin/bash\necho \"ssh: connect to host $1 port 22: Connection refused\" >&2\n"
                  "exit 255\n");
  chmod(path.c_str(), 0755);
  std::remove(log.c_str());
  return path;
}

TEST(CliTest, ValidateChecksRemoteHostsThroughTheRemoteCommand) {
  const std::string ssh = FakeSsh("fake-ssh", true);
  std::vector<int> ports;
  const std::string cfg = WriteTemp("remote.yaml", ConfigWithFreePorts(&ports));
  const std::string master = std::to_string(ports[0]);
  const std::string hosts = WriteTemp("remote.hosts", "127.0.0.1 master pserver worker\n");
  // The cli_test binary is not strata: the remote command runs this
  // build's bin/strata when there is one.
  const std::string strata = std::string(STRATA_BIN_DIR) + "/strata";
  if (access(strata.c_str(), X_OK) != 0) GTEST_SKIP() << strata << " is not built";
  Result r = RunStrata({"validate", "--config", cfg, "--hosts", hosts, "--remote-all",
                        "--remote-cmd", ssh, "--strata-path", strata});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("127.0.0.1: ok\n  ok    reach: through `" + ssh + "`"),
                    HasSubstr("ok    port " + master + ": 127.0.0.1:" + master + " is free")));
  std::ifstream log(::testing::TempDir() + "/cli_test_fake-ssh.log");
  std::string line;
  EXPECT_TRUE(std::getline(log, line) && line == "127.0.0.1") << line;

  const std::string down = FakeSsh("down-ssh", false);
  r = RunStrata({"validate", "--config", cfg, "--hosts", hosts, "--remote-all", "--remote-cmd",
                 down, "--json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("{\"host\": \"127.0.0.1\", \"ok\": false"),
                    HasSubstr("FAIL  reach: cannot reach 127.0.0.1 through `" + down +
                              "`: ssh: connect to host 127.0.0.1 port 22: Connection refused")));
}

// STRATA_REMOTE_CMD is read through the getenv RunCli is handed (found by a
// review: it called std::getenv itself).
TEST(CliTest, ValidateTakesTheRemoteCommandFromTheEnvironmentItIsGiven) {
  const std::string down = FakeSsh("env-ssh", false);
  std::vector<int> ports;
  const std::string cfg = WriteTemp("env.yaml", ConfigWithFreePorts(&ports));
  const std::string hosts = WriteTemp("env.hosts", "127.0.0.1 master pserver worker\n");
  std::ostringstream out, err;
  const int code =
      RunCli({"validate", "--config", cfg, "--hosts", hosts, "--remote-all"}, out, err,
             [&down](const char* name) -> const char* {
               return std::string(name) == "STRATA_REMOTE_CMD" ? down.c_str() : nullptr;
             });
  EXPECT_EQ(code, 1) << out.str() << err.str();
  EXPECT_THAT(out.str(), HasSubstr("FAIL  reach: cannot reach 127.0.0.1 through `" + down + "`"));
}

TEST(CliTest, ValidateRunsTheRdmaPreflightOfEachHostForTheRdmaTransport) {
  std::vector<int> ports;
  std::string c = ConfigWithFreePorts(&ports);
  c.replace(c.find("cluster:\n"), 9, "cluster:\n  transport: rdma\n");
  const std::string cfg = WriteTemp("rdma.yaml", c);
  const std::string hosts = WriteTemp("rdma.hosts", "127.0.0.1 master pserver worker\n");
  const Result r = RunStrata({"validate", "--config", cfg, "--hosts", hosts});
  // This host may or may not have a verbs device: either way its findings
  // are there, after the ports'.
  EXPECT_THAT(r.out, testing::ContainsRegex("  (ok   |FAIL ) devices: "));
  EXPECT_THAT(r.out, HasSubstr("ok    port " + std::to_string(ports[0]) + ":"));
  if (r.code != 0) EXPECT_THAT(r.err, HasSubstr("1 of 1 host(s) failed their checks"));
  // The tcp transport: no RDMA findings.
  const Result tcp =
      RunStrata({"validate", "--config", WriteTemp("tcp.yaml", ConfigWithFreePorts(&ports)),
                 "--hosts", hosts});
  EXPECT_THAT(tcp.out, Not(HasSubstr("devices:")));
}

TEST(CliTest, AuditVerifyChecksTheChainAndNamesTheBrokenLine) {
  const std::string path = ::testing::TempDir() + "/cli_test_audit.jsonl";
  std::remove(path.c_str());
  {
    std::unique_ptr<storage::FileSystem> fs = storage::NewPosixFileSystem();
    auto log = storage::AuditLog::Open(fs.get(), path);
    ASSERT_TRUE(log.ok()) << log.status();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(
          (*log)
              ->Append({"admin:admin", "ipv4:127.0.0.1:1", "stop", "job", "ok", ""}, absl::Now())
              .ok());
    }
  }
  Result r = RunStrata({"audit", "verify", "--file", path});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(StartsWith(path + ": ok: 3 records"), HasSubstr("head 3 ")));
  r = RunStrata({"audit", "verify", "--file", path, "--json"});
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"ok\": true, \"records\": 3, \"head\": \"")));
  // The second record taken out.
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  const std::string cut = WriteTemp("audit_cut.jsonl", lines[0] + "\n" + lines[2] + "\n");
  r = RunStrata({"audit", "verify", "--file", cut});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr(cut + ":2: seq 3 where 2 was due"));
  EXPECT_EQ(RunStrata({"audit", "verify"}).code, 2);
  EXPECT_EQ(RunStrata({"audit"}).code, 2);
}

TEST(CliTest, StrayArgumentIsUsageError) {
  const Result r = RunStrata({"status", "localhost:7070"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("unexpected argument 'localhost:7070'"));
}

TEST(CliTest, StatusNeedsMaster) {
  const Result r = RunStrata({"status"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--master HOST:PORT is required"));
}

TEST(CliTest, StatusOfUnreachableMasterExitsOneNamingTheAddress) {
  // Nothing listens on port 1 of the loopback: the connection is refused.
  const Result r = RunStrata({"status", "--master", "127.0.0.1:1"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(StartsWith("strata status: "), HasSubstr("127.0.0.1:1")));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST(CliTest, WaitOnUnreachableMasterTimesOutWithTheLastError) {
  const Result r = RunStrata({"wait", "--master", "127.0.0.1:1", "--timeout", "0.3"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("timed out after 0.3 s"), HasSubstr("127.0.0.1:1")));
}

TEST(CliTest, WaitRejectsNonNumericTimeout) {
  const Result r = RunStrata({"wait", "--master", "127.0.0.1:1", "--timeout", "soon"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--timeout must be a number"));
}

TEST(CliTest, ScaleRejectsBadCountsAndSaysHowToCallIt) {
  Result r = RunStrata({"scale", "--master", "127.0.0.1:1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("usage: strata scale --master HOST:PORT [--workers N|+k|-k]"));
  r = RunStrata({"scale", "--master", "127.0.0.1:1", "--workers", "x"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--workers 'x': expected N (a number), +k or -k"));
  r = RunStrata({"scale", "--master", "127.0.0.1:1", "--pservers", "+"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--pservers '+': expected N (a number), +k or -k"));
  r = RunStrata({"scale", "--master", "127.0.0.1:1", "--autoscale", "maybe"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--autoscale 'maybe': expected on or off"));
  r = RunStrata({"scale", "--master", "127.0.0.1:1", "--workers", "2", "--timeout", "soon"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--timeout must be a number of seconds"));
  r = RunStrata({"scale", "--master", "127.0.0.1:1", "--workers", "+1"});  // nobody there
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(StartsWith("strata scale: "), HasSubstr("127.0.0.1:1")));
}

// A checkpoint root with one complete checkpoint (one partition file of
// one block), one unfinished: what `strata checkpoint list|verify` read.
std::string MakeCheckpointRoot(const std::string& name) {
  auto fs = storage::NewPosixFileSystem();
  const std::string root = ::testing::TempDir() + "/cli_test_" + name;
  EXPECT_TRUE(fs->DeleteRecursively(root).ok());
  const std::string dir = storage::JoinPath(root, storage::CheckpointDirName(1));
  EXPECT_TRUE(fs->CreateDirs(dir).ok());
  EXPECT_TRUE(fs->CreateDirs(storage::JoinPath(root, storage::CheckpointDirName(2))).ok());
  proto::CheckpointPartitionHeader h;
  h.set_id(0);
  h.set_table("fc0.weight");
  h.set_length(2);
  h.set_version(5);
  auto w = storage::BlockFileWriter::Create(fs.get(), dir + "/p00000.blk", 1);
  EXPECT_TRUE(w.ok());
  EXPECT_TRUE((*w)->Add(storage::BlockType::kHeader, h.SerializeAsString()).ok());
  const float values[2] = {1.5f, -2.f};
  EXPECT_TRUE((*w)->Add(storage::BlockType::kDenseValues,
                        std::string(reinterpret_cast<const char*>(values), 8))
                  .ok());
  auto info = (*w)->Finish();
  EXPECT_TRUE(info.ok());
  proto::CheckpointManifest m;
  m.set_format_version(storage::kCheckpointFormatVersion);
  m.set_job("cli-test");
  m.set_seq(1);
  m.set_step(5);
  m.set_reason("request");
  m.set_raw_bytes(8);
  m.set_bytes_written(info->size);
  proto::CheckpointPartition* p = m.add_partitions();
  p->set_id(0);
  proto::CheckpointFile* f = p->add_files();
  f->set_path(storage::CheckpointDirName(1) + "/p00000.blk");
  f->set_size(info->size);
  f->set_crc32c(info->crc32c);
  f->set_seq(1);
  f->set_full(true);
  EXPECT_TRUE(storage::WriteManifest(fs.get(), dir, m).ok());
  return root;
}

TEST(CliTest, CheckpointListShowsCompleteAndUnfinishedOnes) {
  const std::string root = MakeCheckpointRoot("list");
  Result r = RunStrata({"checkpoint", "list", "--dir", root});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("1        full"));
  EXPECT_THAT(r.out, HasSubstr("request"));
  EXPECT_THAT(r.out, HasSubstr("2        unfinished  no MANIFEST"));
  r = RunStrata({"checkpoint", "list", "--dir", root, "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  // One JSON array: each manifest's JSON as protobuf prints it, nothing before.
  EXPECT_THAT(r.out, StartsWith("[{\n"));
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"job\": \"cli-test\""), HasSubstr("\"seq\": 2")));
  EXPECT_EQ(RunStrata({"checkpoint", "list"}).code, 2);
}

TEST(CliTest, CheckpointVerifyChecksEveryBlockAndNamesABadFile) {
  const std::string root = MakeCheckpointRoot("verify");
  const std::string dir = root + "/ckpt-00000001";
  Result r = RunStrata({"checkpoint", "verify", "--dir", dir});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("ok (full, job 'cli-test', step 5, 1 partitions, 1 files"),
                           HasSubstr("state digest")));
  // The same state verifies to the same digest; a flipped byte is named.
  Result again = RunStrata({"checkpoint", "verify", "--dir", dir, "--json"});
  EXPECT_THAT(again.out, HasSubstr("\"state_digest\""));
  {
    std::fstream f(dir + "/p00000.blk", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x7f');
  }
  r = RunStrata({"checkpoint", "verify", "--dir", dir});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr(dir + "/p00000.blk"), HasSubstr("corrupt")));
  r = RunStrata({"checkpoint", "verify", "--dir", root + "/ckpt-00000002"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("MANIFEST"));
}

TEST(CliTest, CheckpointExportWritesA16BitCopyThatVerifies) {
  const std::string root = MakeCheckpointRoot("export");
  const std::string out_dir = ::testing::TempDir() + "/cli_test_export_out/fp16";
  Result r = RunStrata({"checkpoint", "export", "--dir", root + "/ckpt-00000001", "--out", out_dir,
                        "--precision", "fp16"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("fp16 export of"));
  r = RunStrata({"checkpoint", "verify", "--dir", out_dir});
  EXPECT_EQ(r.code, 0) << r.err;
  r = RunStrata({"checkpoint", "export", "--dir", root + "/ckpt-00000001", "--out", out_dir,
                 "--precision", "int8"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("expected bf16 or fp16"));
}

TEST(CliTest, CheckpointOfUnreachableMasterExitsOneNamingIt) {
  Result r = RunStrata({"checkpoint", "--master", "127.0.0.1:1", "--timeout", "2"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1"));
  EXPECT_EQ(RunStrata({"checkpoint"}).code, 2);
}

}  // namespace
}  // namespace strata::tools
