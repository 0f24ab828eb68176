// The object-store backend against a real radosgw: the Ceph that
// tests/storage/ceph/ceph.sh brings up (the ctest fixture "ceph"), named by
// the env file in $CEPH_ENV. Skipped, saying why, without one.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_format.h"
#include "storage/s3_client.h"
#include "storage/s3_file_system.h"
#include "tests/testing/status_matchers.h"

namespace strata::storage {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;

std::map<std::string, std::string> CephEnv() {
  std::map<std::string, std::string> env;
  const char* path = std::getenv("CEPH_ENV");
  if (path == nullptr) return env;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(s.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return s;
}

class S3StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = CephEnv();
    if (env_.count("S3_ENDPOINT") == 0) {
      GTEST_SKIP() << "no Ceph here: $CEPH_ENV names no env file of tests/storage/ceph/ceph.sh "
                      "(run through ctest, which brings Ceph up as the fixture 'ceph')";
    }
    auto creds = LoadS3Credentials(env_["S3_CREDENTIALS"], [](const char*) { return nullptr; });
    ASSERT_THAT(creds.status(), IsOk());
    options_.endpoint = env_["S3_ENDPOINT"];
    options_.credentials = *creds;
    options_.retries = 3;
    options_.backoff_ms = 20;
    auto client = S3Client::Create(options_);
    ASSERT_THAT(client.status(), IsOk());
    client_ = std::move(*client);
    static std::atomic<int> counter{0};
    bucket_ = absl::StrCat("strata-test-", getpid(), "-", counter++);
    absl::Status made = client_->CreateBucket(bucket_);
    ASSERT_THAT(made, IsOk()) << made;
  }

  std::unique_ptr<FileSystem> NewFs(uint64_t part_bytes = 5 << 20, int parallel = 3,
                                    S3ClientOptions client = {}) {
    S3FileSystemOptions o;
    o.client = client.endpoint.empty() ? options_ : client;
    o.part_bytes = part_bytes;
    o.parallel_parts = parallel;
    auto fs = NewS3FileSystem(std::move(o));
    EXPECT_THAT(fs.status(), IsOk());
    return fs.ok() ? std::move(*fs) : nullptr;
  }

  std::string Url(const std::string& key) const { return absl::StrCat("s3://", bucket_, "/", key); }

  std::map<std::string, std::string> env_;
  S3ClientOptions options_;
  std::unique_ptr<S3Client> client_;
  std::string bucket_;
};

TEST_F(S3StoreTest, PutGetHeadDeleteRoundTrip) {
  const std::string body = RandomBytes(100000, 1);
  ASSERT_THAT(client_->PutObject(bucket_, "a/b c+d.bin", body), IsOk());
  auto got = client_->GetObject(bucket_, "a/b c+d.bin");
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_EQ(*got, body);
  auto size = client_->HeadObject(bucket_, "a/b c+d.bin");
  ASSERT_THAT(size.status(), IsOk());
  EXPECT_EQ(*size, body.size());
  ASSERT_THAT(client_->DeleteObject(bucket_, "a/b c+d.bin"), IsOk());
  auto gone = client_->GetObject(bucket_, "a/b c+d.bin");
  EXPECT_THAT(gone.status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(absl::StrContains(gone.status().message(), Url("a/b c+d.bin"))) << gone.status();
  EXPECT_TRUE(absl::StrContains(gone.status().message(), "NoSuchKey")) << gone.status();
  // Deleting what is not there is fine (retention may race a crash).
  EXPECT_THAT(client_->DeleteObject(bucket_, "a/b c+d.bin"), IsOk());
}

TEST_F(S3StoreTest, RangedGetReadsOnlyTheRange) {
  const std::string body = RandomBytes(5000, 2);
  ASSERT_THAT(client_->PutObject(bucket_, "r", body), IsOk());
  auto mid = client_->GetObject(bucket_, "r", 1234, 100);
  ASSERT_THAT(mid.status(), IsOk());
  EXPECT_EQ(*mid, body.substr(1234, 100));
  auto tail = client_->GetObject(bucket_, "r", 4990);
  ASSERT_THAT(tail.status(), IsOk());
  EXPECT_EQ(*tail, body.substr(4990));
  auto fs = NewFs();
  auto over = fs->ReadFileRange(Url("r"), 4990, 100);  // short at the end
  ASSERT_THAT(over.status(), IsOk());
  EXPECT_EQ(*over, body.substr(4990));
  auto past = fs->ReadFileRange(Url("r"), 6000, 10);  // none past it
  ASSERT_THAT(past.status(), IsOk());
  EXPECT_EQ(*past, "");
}

TEST_F(S3StoreTest, ARangeOfAReplacedObjectIsRefusedNotMixed) {
  ASSERT_THAT(client_->PutObject(bucket_, "v", RandomBytes(1000, 7)), IsOk());
  std::string etag;
  auto size = client_->HeadObject(bucket_, "v", &etag);
  ASSERT_THAT(size.status(), IsOk());
  ASSERT_FALSE(etag.empty());
  std::string buf(100, '\0');
  ASSERT_THAT(client_->GetObjectInto(bucket_, "v", 10, 100, buf.data(), etag), IsOk());
  ASSERT_THAT(client_->PutObject(bucket_, "v", RandomBytes(1000, 8)), IsOk());  // replaced
  absl::Status s = client_->GetObjectInto(bucket_, "v", 10, 100, buf.data(), etag);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(absl::StrContains(s.message(), "replaced while it was read")) << s;
}

TEST_F(S3StoreTest, ListByPrefixWithDelimiterAndPages) {
  S3ClientOptions small = options_;
  small.list_page_keys = 3;
  auto client = S3Client::Create(small);
  ASSERT_THAT(client.status(), IsOk());
  for (int i = 0; i < 8; ++i) {
    ASSERT_THAT(client_->PutObject(bucket_, absl::StrCat("root/f", i), "x"), IsOk());
  }
  ASSERT_THAT(client_->PutObject(bucket_, "root/sub/one", "y"), IsOk());
  ASSERT_THAT(client_->PutObject(bucket_, "other", "z"), IsOk());
  auto l = (*client)->List(bucket_, "root/", "/");
  ASSERT_THAT(l.status(), IsOk());
  ASSERT_EQ(l->objects.size(), 8u);  // three pages
  EXPECT_EQ(l->objects[0].key, "root/f0");
  EXPECT_EQ(l->objects[0].size, 1u);
  ASSERT_EQ(l->prefixes.size(), 1u);
  EXPECT_EQ(l->prefixes[0], "root/sub/");
  auto all = (*client)->List(bucket_, "", "");
  ASSERT_THAT(all.status(), IsOk());
  EXPECT_EQ(all->objects.size(), 10u);

  auto fs = NewFs();
  auto names = fs->ListDir(Url("root"));
  ASSERT_THAT(names.status(), IsOk());
  EXPECT_EQ(names->size(), 9u);
  EXPECT_EQ(names->back(), "sub");
  EXPECT_TRUE(fs->IsDirectory(Url("root/sub")));
  EXPECT_FALSE(fs->IsDirectory(Url("root/f1")));
  EXPECT_TRUE(fs->Exists(Url("root/f1")));
  EXPECT_FALSE(fs->Exists(Url("root/nope")));
  EXPECT_THAT(fs->ListDir(Url("nothing")).status(), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(fs->DeleteRecursively(Url("root")), IsOk());
  EXPECT_FALSE(fs->Exists(Url("root/sub/one")));
  EXPECT_TRUE(fs->Exists(Url("other")));
}

TEST_F(S3StoreTest, DeleteRecursivelyListsOnceAndDeletesInBatches) {
  // 1100 objects under dir/: two multi-object deletes of at most 1000.
  std::vector<std::thread> putters;
  std::atomic<int> failed{0};
  for (int t = 0; t < 4; ++t) {
    putters.emplace_back([&, t] {
      for (int i = t; i < 1100; i += 4) {
        if (!client_->PutObject(bucket_, absl::StrCat("dir/", i % 7, "/o", i), "x").ok()) {
          ++failed;
        }
      }
    });
  }
  for (auto& p : putters) p.join();
  ASSERT_EQ(failed.load(), 0);
  ASSERT_THAT(client_->PutObject(bucket_, "dir", "the object of that name"), IsOk());
  ASSERT_THAT(client_->PutObject(bucket_, "dirx/keep", "a sibling prefix"), IsOk());
  ASSERT_THAT(client_->PutObject(bucket_, "dir&<odd>/keep", "escaped in the XML"), IsOk());
  auto fs = NewFs();
  ASSERT_THAT(fs->DeleteRecursively(Url("dir")), IsOk());
  auto left = client_->List(bucket_, "", "");
  ASSERT_THAT(left.status(), IsOk());
  std::vector<std::string> keys;
  for (const auto& o : left->objects) keys.push_back(o.key);
  EXPECT_THAT(keys, ::testing::UnorderedElementsAre("dirx/keep", "dir&<odd>/keep"));
  ASSERT_THAT(fs->DeleteRecursively(Url("dir&<odd>")), IsOk());
  EXPECT_FALSE(fs->Exists(Url("dir&<odd>/keep")));
  // Nothing there: fine. A whole bucket: refused.
  EXPECT_THAT(fs->DeleteRecursively(Url("dir")), IsOk());
  EXPECT_THAT(fs->DeleteRecursively(absl::StrCat("s3://", bucket_)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("whole bucket")));
  EXPECT_TRUE(fs->Exists(Url("dirx/keep")));
}

TEST_F(S3StoreTest, LargeFileGoesUpInParallelPartsAndComesBackInRanges) {
  auto fs = NewFs(5 << 20, 3);
  const std::string body = RandomBytes((23 << 20) + 12345, 3);  // 5 parts
  auto f = fs->NewWritableFile(Url("big/part.blk"));
  ASSERT_THAT(f.status(), IsOk());
  for (size_t off = 0; off < body.size(); off += 1000003) {
    ASSERT_THAT((*f)->Append(absl::string_view(body).substr(off, 1000003)), IsOk());
  }
  EXPECT_FALSE(fs->Exists(Url("big/part.blk"))) << "visible before Close";
  ASSERT_THAT((*f)->Sync(), IsOk());
  ASSERT_THAT((*f)->Close(), IsOk());
  auto size = fs->FileSize(Url("big/part.blk"));
  ASSERT_THAT(size.status(), IsOk());
  EXPECT_EQ(*size, body.size());
  auto back = fs->ReadFile(Url("big/part.blk"));
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_TRUE(*back == body) << "read back differs";
}

TEST_F(S3StoreTest, ABodyDamagedOnTheWayIsRefusedByTheStoreAndSentAgain) {
  // The first attempt of each PUT and part goes out with one bit flipped:
  // radosgw refuses it (BadDigest or XAmzContentSHA256Mismatch), the client
  // sends it again, and what is stored is the original.
  S3ClientOptions o = options_;
  o.damage_body_for_testing = [](absl::string_view, int attempt) { return attempt == 0; };
  auto client = S3Client::Create(o);
  ASSERT_THAT(client.status(), IsOk());
  const std::string body = RandomBytes(70000, 9);
  ASSERT_THAT((*client)->PutObject(bucket_, "damaged-once", body), IsOk());
  EXPECT_EQ((*client)->counters().retries, 1u);
  auto got = client_->GetObject(bucket_, "damaged-once");
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_TRUE(*got == body);
  auto fs = NewFs(5 << 20, 2, o);
  const std::string big = RandomBytes((11 << 20) + 7, 10);  // 3 parts
  auto f = fs->NewWritableFile(Url("damaged-parts"));
  ASSERT_THAT(f.status(), IsOk());
  ASSERT_THAT((*f)->Append(big), IsOk());
  ASSERT_THAT((*f)->Close(), IsOk());
  auto back = client_->GetObject(bucket_, "damaged-parts");
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_TRUE(*back == big) << "read back differs";
  // Damaged every time: a clear error after the retries, no object.
  S3ClientOptions always = options_;
  always.retries = 1;
  always.damage_body_for_testing = [](absl::string_view, int) { return true; };
  auto bad = S3Client::Create(always);
  ASSERT_THAT(bad.status(), IsOk());
  absl::Status s = (*bad)->PutObject(bucket_, "never", body);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "BadDigest") ||
              absl::StrContains(s.message(), "XAmzContentSHA256Mismatch"))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "(2 attempts)")) << s;
  EXPECT_THAT(client_->HeadObject(bucket_, "never").status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(S3StoreTest, AFailedPartIsRetriedAndTheUploadCompletes) {
  S3ClientOptions flaky = options_;
  std::atomic<int> injected{0};
  flaky.fault_for_testing = [&](absl::string_view op, int attempt) {
    if (op == "UploadPart" && attempt < 2) {
      ++injected;
      return absl::UnavailableError("injected: connection reset by peer");
    }
    return absl::OkStatus();
  };
  auto fs = NewFs(5 << 20, 2, flaky);
  const std::string body = RandomBytes((12 << 20) + 7, 4);  // 3 parts
  ASSERT_THAT(fs->WriteFileAtomic(Url("retried"), body), IsOk());
  EXPECT_EQ(injected.load(), 6);
  auto back = fs->ReadFile(Url("retried"));
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_TRUE(*back == body);
}

TEST_F(S3StoreTest, ACompletedUploadWhoseAnswerWasLostIsNotReportedAsFailed) {
  S3ClientOptions lossy = options_;
  lossy.lose_answer_for_testing = [](absl::string_view op, int attempt) {
    return op == "CompleteMultipartUpload" && attempt == 0;
  };
  auto fs = NewFs(5 << 20, 2, lossy);
  const std::string body = RandomBytes((11 << 20) + 5, 6);  // 3 parts
  // The retry of Complete gets NoSuchUpload: the object is there, whole.
  ASSERT_THAT(fs->WriteFileAtomic(Url("completed"), body), IsOk());
  auto back = fs->ReadFile(Url("completed"));
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_TRUE(*back == body);
}

TEST_F(S3StoreTest, APartFailingEveryRetryFailsCloseAndLeavesNoObject) {
  S3ClientOptions broken = options_;
  broken.retries = 2;
  broken.fault_for_testing = [](absl::string_view op, int) {
    return op == "UploadPart" ? absl::UnavailableError("injected: connection refused")
                              : absl::OkStatus();
  };
  auto fs = NewFs(5 << 20, 2, broken);
  auto f = fs->NewWritableFile(Url("never"));
  ASSERT_THAT(f.status(), IsOk());
  absl::Status s = (*f)->Append(RandomBytes(11 << 20, 5));
  if (s.ok()) s = (*f)->Close();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(absl::StrContains(s.message(), "3 attempts")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), Url("never"))) << s;
  EXPECT_FALSE(client_->HeadObject(bucket_, "never").ok());
}

TEST_F(S3StoreTest, WrongKeysArePermissionDeniedNamingTheCause) {
  S3ClientOptions bad = options_;
  bad.credentials.secret_key = "not-the-secret";
  auto c1 = S3Client::Create(bad);
  ASSERT_THAT(c1.status(), IsOk());
  absl::Status s = (*c1)->CheckBucket(bucket_);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_TRUE(absl::StrContains(s.message(), "SignatureDoesNotMatch")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "not-the-secret")) << s;

  bad.credentials.access_key = "NOSUCHKEY";
  auto c2 = S3Client::Create(bad);
  ASSERT_THAT(c2.status(), IsOk());
  s = (*c2)->PutObject(bucket_, "x", "y");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_TRUE(absl::StrContains(s.message(), "InvalidAccessKeyId")) << s;
  EXPECT_EQ((*c2)->counters().retries, 0u) << "a refused key is not worth retrying";
}

TEST_F(S3StoreTest, MissingBucketIsNamedWhenTheCheckpointRootIsMade) {
  auto fs = NewFs();
  absl::Status s = fs->CreateDirs("s3://strata-no-such-bucket/ckpt");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(absl::StrContains(s.message(), "bucket strata-no-such-bucket does not exist")) << s;
  EXPECT_THAT(fs->CreateDirs(Url("ckpt")), IsOk());
}

TEST_F(S3StoreTest, VirtualHostAddressingPutsTheBucketInTheHostName) {
  S3ClientOptions vh = options_;
  const std::string port = options_.endpoint.substr(options_.endpoint.rfind(':') + 1);
  vh.endpoint = absl::StrCat("http://s3.strata.test:", port);  // radosgw's rgw_dns_name
  vh.virtual_host = true;
  vh.connect_to_for_testing = absl::StrCat("127.0.0.1:", port);
  auto c = S3Client::Create(vh);
  ASSERT_THAT(c.status(), IsOk());
  ASSERT_THAT((*c)->PutObject(bucket_, "vhost/key", "virtual"), IsOk());
  auto got = client_->GetObject(bucket_, "vhost/key");  // read back path-style
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_EQ(*got, "virtual");
  auto l = (*c)->List(bucket_, "vhost/", "/");
  ASSERT_THAT(l.status(), IsOk());
  ASSERT_EQ(l->objects.size(), 1u);
}

TEST_F(S3StoreTest, NoServerIsUnavailableAfterTheRetries) {
  S3ClientOptions none = options_;
  none.endpoint = "http://127.0.0.1:1";  // nothing listens there
  none.retries = 2;
  auto c = S3Client::Create(none);
  ASSERT_THAT(c.status(), IsOk());
  absl::Status s = (*c)->PutObject(bucket_, "x", "y");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(absl::StrContains(s.message(), "http://127.0.0.1:1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "3 attempts")) << s;
  EXPECT_EQ((*c)->counters().retries, 2u);
}

TEST_F(S3StoreTest, CheckpointsLiveInTheBucketAndACorruptPartIsCaught) {
  auto fs = NewFs();
  const std::string root = Url("job/ckpt");
  ASSERT_THAT(fs->CreateDirs(root), IsOk());
  std::vector<std::pair<std::string, BlockFileInfo>> files;
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    const std::string dir = JoinPath(root, CheckpointDirName(seq));
    auto w = BlockFileWriter::Create(fs.get(), JoinPath(dir, "p00000.blk"), 1);
    ASSERT_THAT(w.status(), IsOk());
    proto::CheckpointPartitionHeader header;
    header.set_format_version(kCheckpointFormatVersion);
    header.set_seq(seq);
    header.set_full(true);
    ASSERT_THAT((*w)->Add(BlockType::kHeader, header.SerializeAsString()), IsOk());
    ASSERT_THAT((*w)->Add(BlockType::kDenseValues, RandomBytes(3 << 20, seq), true), IsOk());
    auto info = (*w)->Finish();
    ASSERT_THAT(info.status(), IsOk());
    proto::CheckpointManifest m;
    m.set_format_version(kCheckpointFormatVersion);
    m.set_seq(seq);
    auto* f = m.add_partitions()->add_files();
    f->set_path(JoinPath(CheckpointDirName(seq), "p00000.blk"));
    f->set_size(info->size);
    f->set_crc32c(info->crc32c);
    f->set_seq(seq);
    f->set_full(true);
    if (seq < 3) ASSERT_THAT(WriteManifest(fs.get(), dir, m), IsOk());
  }
  // Checkpoint 3 has no manifest yet: retention keeps it and keeps 2.
  auto deleted = ApplyRetention(fs.get(), root, 1);
  ASSERT_THAT(deleted.status(), IsOk());
  ASSERT_EQ(deleted->size(), 1u);
  EXPECT_EQ((*deleted)[0], JoinPath(root, CheckpointDirName(1)));
  auto list = ListCheckpoints(fs.get(), root);
  ASSERT_THAT(list.status(), IsOk());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_TRUE((*list)[0].complete);
  EXPECT_FALSE((*list)[1].complete);

  auto m = ReadManifest(fs.get(), JoinPath(root, CheckpointDirName(2)));
  ASSERT_THAT(m.status(), IsOk());
  const std::string part = JoinPath(root, m->partitions(0).files(0).path());
  ASSERT_THAT(ReadBlockFile(fs.get(), part, &m->partitions(0).files(0)).status(), IsOk());
  // One byte flipped in the bucket: refused, naming the object.
  auto bytes = client_->GetObject(bucket_, "job/ckpt/" + m->partitions(0).files(0).path());
  ASSERT_THAT(bytes.status(), IsOk());
  (*bytes)[bytes->size() / 2] ^= 0x40;
  ASSERT_THAT(client_->PutObject(bucket_, "job/ckpt/" + m->partitions(0).files(0).path(), *bytes),
              IsOk());
  auto bad = ReadBlockFile(fs.get(), part, &m->partitions(0).files(0));
  EXPECT_THAT(bad.status(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(bad.status().message(), part)) << bad.status();
}

TEST(S3RoutingTest, AnS3PathWithoutTheSectionSaysWhatIsMissing) {
  auto fs = NewRoutingFileSystem(NewMemoryFileSystem(), nullptr);
  auto r = fs->ReadFile("s3://bucket/x");
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(absl::StrContains(r.status().message(), "needs the s3 section")) << r.status();
  ASSERT_THAT(fs->WriteFileAtomic("/local/x", "data"), IsOk());
  auto local = fs->ReadFile("/local/x");
  ASSERT_THAT(local.status(), IsOk());
  EXPECT_EQ(*local, "data");
}

}  // namespace
}  // namespace strata::storage
