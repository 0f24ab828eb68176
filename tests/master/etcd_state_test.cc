// The master's high availability against a real etcd (Debian's
// etcd-server): the client, the election and its fencing, and the state's
// records, snapshots and compaction in etcd.
#include "master/etcd_state.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "master/etcd_client.h"
#include "master/high_availability.h"
#include "master/leadership.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/read_file.h"
#include "tests/testing/test_certs.h"

namespace strata::master {
namespace {

using testing::EtcdProcess;
using ::testing::HasSubstr;

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::Installed()) GTEST_SKIP() << "no /usr/bin/etcd (etcd-server not installed)";
    etcd_ = std::make_unique<EtcdProcess>();
    etcd_client_ = Connect(etcd_->endpoint());
    ASSERT_NE(etcd_client_, nullptr);
  }

  // A client of the etcd at `endpoint`, once it answers (10 s at most).
  static std::unique_ptr<EtcdClient> Connect(const std::string& endpoint) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    absl::Status last;
    while (absl::Now() < deadline) {
      EtcdClient::Options o;
      o.endpoints = {endpoint};
      o.request_timeout = absl::Seconds(1);
      auto c = EtcdClient::Connect(o);
      if (c.ok()) return *std::move(c);
      last = c.status();
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << "etcd did not come up: " << last;
    return nullptr;
  }

  MasterLeadership::Options LeadOptions(const std::string& address, EtcdClient* c = nullptr) {
    MasterLeadership::Options o;
    o.etcd = c != nullptr ? c : etcd_client_.get();
    o.keys = "/strata-test/job/";
    o.address = address;
    o.lease_seconds = 2;
    o.poll = absl::Milliseconds(50);
    return o;
  }

  static proto::MasterState Delta(uint64_t task) {
    proto::MasterState d;
    d.set_delta(true);
    d.add_tasks_done(task);
    d.add_events(absl::StrCat("task ", task, " done"));
    return d;
  }
  static proto::MasterState Whole(int tasks) {
    proto::MasterState s;
    for (int i = 0; i < tasks; ++i) s.add_tasks_done(1000 + i);
    return s;
  }

  // The bytes of the values under `prefix` now.
  int64_t BytesUnder(const std::string& prefix) {
    etcdserverpb::RangeRequest r;
    r.set_key(prefix);
    r.set_range_end(PrefixRangeEnd(prefix));
    auto resp = etcd_client_->Range(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    int64_t bytes = 0;
    for (const auto& kv : resp->kvs()) bytes += kv.value().size();
    return bytes;
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
};

TEST(EtcdClientTest, AnUnreachableEtcdIsRefusedNamingEveryEndpoint) {
  EtcdClient::Options o;
  o.endpoints = {absl::StrCat("127.0.0.1:", testing::FreeLocalPort()),
                 absl::StrCat("http://127.0.0.1:", testing::FreeLocalPort())};
  o.request_timeout = absl::Milliseconds(300);
  auto c = EtcdClient::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("etcd (cluster.etcd.endpoints) cannot be reached"));
  EXPECT_THAT(c.status().message(), HasSubstr(strata::EtcdEndpointAddress(o.endpoints[0]).value()));
  EXPECT_THAT(c.status().message(), HasSubstr(strata::EtcdEndpointAddress(o.endpoints[1]).value()));

  o.endpoints = {"127.0.0.1"};
  EXPECT_THAT(EtcdClient::Connect(o).status().message(), HasSubstr("is not host:port"));
}

TEST_F(EtcdTest, ALeaseEndsWithoutRenewalsAndIsRenewedWithThem) {
  auto lease = etcd_client_->GrantLease(1);
  ASSERT_TRUE(lease.ok()) << lease.status();
  for (int i = 0; i < 4; ++i) {
    absl::SleepFor(absl::Milliseconds(400));
    auto ttl = etcd_client_->KeepAlive(*lease);
    ASSERT_TRUE(ttl.ok()) << i << ": " << ttl.status();
    EXPECT_GE(*ttl, 1);  // (etcd's least TTL is 1.5 election timeouts: 2 s here)
  }
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_TRUE(absl::IsNotFound(etcd_client_->KeepAlive(*lease).status()));
}

TEST_F(EtcdTest, OneOfTwoMastersLeadsAndTheOtherRedirectsToIt) {
  MasterLeadership::Options ao = LeadOptions("10.0.0.1:7070");
  ao.http_address = "10.0.0.1:7071";
  MasterLeadership a(ao);
  MasterLeadership b(LeadOptions("10.0.0.2:7070"));  // (serving no HTTP)
  ASSERT_TRUE(a.Campaign([] { return false; }).ok());
  EXPECT_TRUE(a.leading());
  EXPECT_EQ(a.leader(), "10.0.0.1:7070");
  a.KeepLeading({[](const std::string&) { ADD_FAILURE() << "a paused"; }, [] {},
                 [](const std::string&) { ADD_FAILURE() << "a lost its lead"; }});
  // b does not lead while a renews, and knows a leads.
  std::atomic<bool> b_stop{false};
  absl::Status b_campaign;
  std::thread t([&] { b_campaign = b.Campaign([&] { return b_stop.load(); }); });
  absl::SleepFor(absl::Seconds(3));  // more than the lease: a renews it
  EXPECT_FALSE(b.leading());
  EXPECT_EQ(b.leader(), "10.0.0.1:7070");
  EXPECT_EQ(b.leader_http(), "10.0.0.1:7071");  // where its pages redirect
  // a resigns: b leads at once, under a newer revision.
  const absl::Time resigned = absl::Now();
  a.Resign();
  t.join();
  ASSERT_TRUE(b_campaign.ok()) << b_campaign;
  EXPECT_TRUE(b.leading());
  EXPECT_LT(absl::Now() - resigned, absl::Seconds(1));
  EXPECT_GT(b.revision(), a.revision());
  EXPECT_EQ(b.leader(), "10.0.0.2:7070");
  EXPECT_EQ(b.leader_http(), "");
}

TEST_F(EtcdTest, ALeaderWhoseRenewalsFailPausesAndActsAgainWhenNobodyElseWasElected) {
  MasterLeadership a(LeadOptions("10.0.0.1:7070"));
  ASSERT_TRUE(a.Campaign([] { return false; }).ok());
  absl::Notification paused, resumed;
  std::atomic<int64_t> last_renewal_ms{0};
  a.KeepLeading({[&](const std::string& why) {
                   EXPECT_THAT(why, HasSubstr("not renewed in time"));
                   paused.Notify();
                 },
                 [&] { resumed.Notify(); },
                 [](const std::string& why) { ADD_FAILURE() << "a lost its lead: " << why; }});
  absl::SleepFor(absl::Milliseconds(500));
  // etcd stops answering (a quorum lost, or the leader cut off from it):
  // a stops acting within its lease.
  const absl::Time cut = absl::Now();
  etcd_->Pause(true);
  ASSERT_TRUE(paused.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LE(absl::Now() - cut, absl::Seconds(2));  // (the lease: 2 s)
  EXPECT_FALSE(a.leading());
  // etcd back, and nobody else elected: a acts again.
  etcd_->Pause(false);
  ASSERT_TRUE(resumed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(a.leading());
}

TEST_F(EtcdTest, ADeposedLeadersStateWriteIsRefusedAndEndsItsLead) {
  MasterLeadership a(LeadOptions("10.0.0.1:7070"));
  ASSERT_TRUE(a.Campaign([] { return false; }).ok());
  std::atomic<bool> a_lost{false};
  a.KeepLeading({[](const std::string&) {}, [] {},
                 [&](const std::string& why) {
                   EXPECT_THAT(why, HasSubstr("no longer this master's"));
                   a_lost = true;
                 }});
  std::optional<proto::MasterState> replayed;
  auto store = EtcdStateStore::Open({etcd_client_.get(), &a, "/strata-test/job/"}, &replayed);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE(replayed.has_value());
  ASSERT_TRUE((*store)->Append(Whole(3)).ok());
  ASSERT_TRUE((*store)->Append(Delta(1)).ok());
  // The key is taken from under a (its lease revoked, as when it expires
  // while a is paused) and b is elected.
  auto v = etcd_client_->Get(a.leader_key());
  ASSERT_TRUE(v.ok() && v->found);
  ASSERT_TRUE(etcd_client_->RevokeLease(v->lease).ok());
  MasterLeadership b(LeadOptions("10.0.0.2:7070"));
  ASSERT_TRUE(b.Campaign([] { return false; }).ok());
  // a's next write is fenced: nothing of it lands, and a knows it lost.
  absl::Status s = (*store)->Append(Delta(2));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("another master leads"));
  EXPECT_TRUE(a_lost.load());
  std::optional<proto::MasterState> seen;
  auto b_store = EtcdStateStore::Open({etcd_client_.get(), &b, "/strata-test/job/"}, &seen);
  ASSERT_TRUE(b_store.ok()) << b_store.status();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->tasks_done_size(), 4);  // 3 + task 1; not task 2
  EXPECT_EQ(seen->events_size(), 1);
}

TEST_F(EtcdTest, TheStateReplaysFromSnapshotPartsAndLogAndItsKeysStayBounded) {
  MasterLeadership a(LeadOptions("10.0.0.1:7070"));
  ASSERT_TRUE(a.Campaign([] { return false; }).ok());
  const std::string keys = "/strata-test/job/";
  EtcdStateStore::Options o{etcd_client_.get(), &a, keys};
  o.part_bytes = 1000;  // a snapshot of many parts
  o.min_log_bytes = 4000;
  std::optional<proto::MasterState> replayed;
  auto store = EtcdStateStore::Open(o, &replayed);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Append(Whole(500)).ok());  // about 3 KB: several parts
  double most = 0;                                 // the keys' bytes over the state's, at most
  for (uint64_t t = 0; t < 400; ++t) {
    std::vector<proto::MasterState> batch;
    batch.push_back(Delta(t));
    if (t % 3 == 0) batch.push_back(Delta(100000 + t));  // group commit: 2 in one
    ASSERT_TRUE((*store)->Append(std::move(batch)).ok()) << t;
    const double state_bytes = EncodeStateRecord((*store)->state()).size();
    most = std::max(most, BytesUnder(keys + "state/") / state_bytes);
  }
  // Snapshots replaced the log as it grew: the keys hold about twice the
  // state at most (the snapshot, and a log as big), never every record.
  EXPECT_LT(most, 2.2) << "the log was not replaced by snapshots";
  // And the history of what was replaced is compacted away.
  etcdserverpb::RangeRequest old;
  old.set_key(keys + "state/head");
  old.set_revision(2);
  EXPECT_FALSE(etcd_client_->Range(old).ok()) << "revision 2 is still in etcd's history";

  const proto::MasterState want = (*store)->state();
  std::optional<proto::MasterState> again;
  auto reopened = EtcdStateStore::Open(o, &again);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->tasks_done_size(), want.tasks_done_size());
  EXPECT_EQ(again->tasks_done_size(), 500 + 400 + 134);
  EXPECT_EQ(again->events_size(), 400 + 134);
  EXPECT_EQ(again->record_seq(), want.record_seq());
}

// cluster.etcd.compact false (an etcd shared with others, compacted by
// its own policy): the snapshots replace the log, but etcd's history is
// left alone.
TEST_F(EtcdTest, WithoutCompactionEtcdsHistoryIsLeftToItsOwnPolicy) {
  MasterLeadership a(LeadOptions("10.0.0.1:7070"));
  ASSERT_TRUE(a.Campaign([] { return false; }).ok());
  const std::string keys = "/strata-test/job/";
  EtcdStateStore::Options o{etcd_client_.get(), &a, keys};
  o.min_log_bytes = 2000;
  o.compact = false;
  std::optional<proto::MasterState> replayed;
  auto store = EtcdStateStore::Open(o, &replayed);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Append(Whole(100)).ok());
  for (uint64_t t = 0; t < 200; ++t) ASSERT_TRUE((*store)->Append(Delta(t)).ok()) << t;
  EXPECT_LT(BytesUnder(keys + "state/") / EncodeStateRecord((*store)->state()).size(), 2.2);
  etcdserverpb::RangeRequest old;
  old.set_key(keys + "state/head");
  old.set_revision(2);
  EXPECT_TRUE(etcd_client_->Range(old).ok()) << "etcd was compacted";
}

TEST_F(EtcdTest, AStandbyFollowsTheStateAndReadsOnlyWhatIsNewWhenElected) {
  MasterLeadership a(LeadOptions("10.0.0.1:7070"));
  ASSERT_TRUE(a.Campaign([] { return false; }).ok());
  const std::string keys = "/strata-test/job/";
  EtcdStateStore::Options o{etcd_client_.get(), &a, keys};
  o.min_log_bytes = 2000;
  std::optional<proto::MasterState> replayed;
  auto store = EtcdStateStore::Open(o, &replayed);
  ASSERT_TRUE(store.ok()) << store.status();
  EtcdStateReader standby(etcd_client_.get(), keys);
  ASSERT_TRUE(standby.Follow().ok());
  EXPECT_FALSE(standby.state().has_value());  // nothing written yet
  ASSERT_TRUE((*store)->Append(Whole(20)).ok());
  for (uint64_t t = 0; t < 5; ++t) ASSERT_TRUE((*store)->Append(Delta(t)).ok());
  ASSERT_TRUE(standby.Follow().ok());
  ASSERT_TRUE(standby.state().has_value());
  EXPECT_EQ(standby.state()->tasks_done_size(), 25);
  const uint64_t generation = standby.generation();
  // Three more records: the next look reads those three only.
  for (uint64_t t = 5; t < 8; ++t) ASSERT_TRUE((*store)->Append(Delta(t)).ok());
  ASSERT_TRUE(standby.Follow().ok());
  EXPECT_EQ(standby.records_read(), 3);
  EXPECT_EQ(standby.generation(), generation);
  EXPECT_EQ(standby.state()->record_seq(), (*store)->state().record_seq());
  // Enough records for a new snapshot: the standby reads that one.
  for (uint64_t t = 8; t < 200; ++t) ASSERT_TRUE((*store)->Append(Delta(t)).ok());
  ASSERT_TRUE(standby.Follow().ok());
  EXPECT_NE(standby.generation(), generation);
  EXPECT_EQ(standby.state()->tasks_done_size(), 220);
  EXPECT_EQ(standby.state()->events_size(), 200);
  // A few more, then it is elected: it reads those few, and the state is
  // the leader's.
  ASSERT_TRUE((*store)->Append(Delta(500)).ok());
  ASSERT_TRUE((*store)->Append(Delta(501)).ok());
  std::optional<proto::MasterState> elected;
  auto b_store = EtcdStateStore::Open(o, &elected, &standby);
  ASSERT_TRUE(b_store.ok()) << b_store.status();
  EXPECT_EQ(standby.records_read(), 2);
  ASSERT_TRUE(elected.has_value());
  EXPECT_EQ(elected->SerializeAsString(), (*store)->state().SerializeAsString());
}

TEST_F(EtcdTest, ASnapshotThatDoesNotDecodeIsDataLossNamingItsKey) {
  MasterLeadership a(LeadOptions("10.0.0.1:7070"));
  ASSERT_TRUE(a.Campaign([] { return false; }).ok());
  const std::string keys = "/strata-test/job/";
  std::optional<proto::MasterState> replayed;
  auto store = EtcdStateStore::Open({etcd_client_.get(), &a, keys}, &replayed);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Append(Whole(10)).ok());
  // Damage the snapshot's one part.
  etcdserverpb::RangeRequest r;
  r.set_key(keys + "state/snap/");
  r.set_range_end(PrefixRangeEnd(keys + "state/snap/"));
  auto parts = etcd_client_->Range(r);
  ASSERT_TRUE(parts.ok() && parts->kvs_size() == 1);
  etcdserverpb::TxnRequest txn;
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(parts->kvs(0).key());
  put->set_value(parts->kvs(0).value().substr(0, 12));
  ASSERT_TRUE(etcd_client_->Txn(txn).ok());
  auto bad = EtcdStateStore::Open({etcd_client_.get(), &a, keys}, &replayed);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
  EXPECT_THAT(bad.status().message(), HasSubstr(keys + "state/snap/"));
  EXPECT_THAT(bad.status().message(), HasSubstr("to start the master afresh"));
}

// cluster.etcd.tls: the master shows etcd its own certificate, and trusts
// etcd's by the cluster's CA; etcd refuses a client without one.
TEST(EtcdTlsTest, AMasterTalksToEtcdOverMutualTlsWithItsOwnCertificate) {
  if (!EtcdProcess::Installed()) GTEST_SKIP() << "no /usr/bin/etcd (etcd-server not installed)";
  const std::string dir = "/tmp/strata-etcd-tls-test-" + std::to_string(getpid());
  ASSERT_TRUE(testing::MakeTestCerts(dir).ok());
  const std::string host = dir + "/127.0.0.1/";
  // (etcd serves with the host's master certificate: 127.0.0.1 is in it.)
  EtcdProcess::Tls tls{host + "master.crt", host + "master.key", host + "ca.crt"};
  EtcdProcess etcd(&tls);
  MasterOptions o;
  o.config.cluster.etcd.tls = true;
  o.security.plaintext = false;
  o.security.ca_file = host + "ca.crt";
  o.security.cert_file = host + "master.crt";
  o.security.key_file = host + "master.key";
  auto creds = EtcdCredentials(o);
  ASSERT_TRUE(creds.ok()) << creds.status();
  ASSERT_NE(*creds, nullptr);
  std::unique_ptr<EtcdClient> c;
  for (int i = 0; i < 100 && c == nullptr; ++i) {
    auto got = EtcdClient::Connect({{etcd.endpoint()}, *creds, absl::Seconds(1)});
    if (got.ok())
      c = *std::move(got);
    else
      absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_NE(c, nullptr) << "no mTLS connection to etcd";
  MasterLeadership::Options lo;
  lo.etcd = c.get();
  lo.keys = "/strata-test/tls/";
  lo.address = "127.0.0.1:7070";
  MasterLeadership lead(lo);
  ASSERT_TRUE(lead.Campaign([] { return false; }).ok());
  // Plain text, or TLS without a client certificate: refused.
  EXPECT_FALSE(EtcdClient::Connect({{etcd.endpoint()}, nullptr, absl::Milliseconds(500)}).ok());
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = testing::ReadFileForTesting(host + "ca.crt");
  EXPECT_FALSE(EtcdClient::Connect(
                   {{etcd.endpoint()}, grpc::SslCredentials(no_cert), absl::Milliseconds(500)})
                   .ok());
  // tls without an mTLS cluster: refused naming the key.
  o.security.plaintext = true;
  EXPECT_THAT(EtcdCredentials(o).status().message(), HasSubstr("cluster.etcd.tls"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace strata::master
