// A small CTR data set and the Wide & Deep job over it, for the tests that
// train the CTR family against real pservers (docs/sparse.md).
#ifndef STRATA_TESTS_TESTING_CTR_DATA_H_
#define STRATA_TESTS_TESTING_CTR_DATA_H_

#include <stdlib.h>

#include <algorithm>
#include <string>

#include "common/config.h"
#include "gtest/gtest.h"
#include "storage/file_system.h"
#include "tests/testing/inproc_cluster.h"
#include "tools/ctr_gen.h"

namespace strata::testing {

// 20 000 training and 4 000 test rows of the planted model (vocabularies
// of at most 1000 keys a field), in a fresh directory under /tmp; returns
// it (the caller removes it).
inline std::string GenerateCtr(storage::FileSystem* fs) {
  char tmpl[] = "/tmp/strata-ctr-test-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  EXPECT_NE(dir, nullptr);
  if (dir == nullptr) return "/nonexistent";
  tools::CtrGenOptions gen;
  gen.out_dir = dir;
  gen.train_rows = 20000;
  gen.test_rows = 4000;
  gen.seed = 3;
  for (int64_t& v : gen.vocab_sizes) v = std::min<int64_t>(v, 1000);
  const absl::Status s = tools::GenerateCtrData(gen, fs);
  EXPECT_TRUE(s.ok()) << s;
  return dir;
}

// A Wide & Deep job on GenerateCtr's data in `dir`: batch 256, embeddings
// of 4, 4 virtual partitions a sparse table, adagrad rows.
inline JobConfig SmallCtrConfig(const std::string& dir) {
  JobConfig c = SmallFashionMnistConfig();
  c.job.name = "test-ctr";
  c.job.batch_size = 256;
  c.model.type = "wide_deep";
  c.model.embedding_dim = 4;
  c.model.hidden = {16};
  c.sparse.partitions = 4;
  c.sparse.optimizer.type = "adagrad";
  c.sparse.optimizer.learning_rate = 0.05;
  c.sparse.optimizer.initial_accumulator = 0.1;
  c.data = DataSection();
  c.data.format = "criteo";
  c.data.train = dir + "/train.txt";
  c.data.test = dir + "/test.txt";
  c.data.task_records = 5000;
  return c;
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_CTR_DATA_H_
