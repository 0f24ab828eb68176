#include "common/eval_metrics.h"

#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// The definition, O(n^2): P(score of a positive > score of a negative), a tie
// counting one half.
double PairwiseAuc(const std::vector<float>& scores, const std::vector<float>& labels) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (labels[i] != 1) continue;
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[j] != 0) continue;
      pairs += 1;
      if (scores[i] > scores[j]) wins += 1;
      if (scores[i] == scores[j]) wins += 0.5;
    }
  }
  return wins / pairs;
}

TEST(AucTest, PerfectRankingIsOne) {
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f, 0.8f, 0.9f}, {0, 0, 1, 1}), 1.0);
}

TEST(AucTest, ReversedRankingIsZero) {
  EXPECT_DOUBLE_EQ(Auc({0.9f, 0.8f, 0.2f, 0.1f}, {0, 0, 1, 1}), 0.0);
}

TEST(AucTest, HandComputedMixedRanking) {
  // Positives 0.35 and 0.8 against negatives 0.1 and 0.4: 3 of 4 pairs won.
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  // Order of the input does not matter.
  EXPECT_DOUBLE_EQ(Auc({0.8f, 0.35f, 0.4f, 0.1f}, {1, 1, 0, 0}), 0.75);
}

TEST(AucTest, TiesCountOneHalf) {
  // All scores equal: every pair is a tie.
  EXPECT_DOUBLE_EQ(Auc({0.5f, 0.5f, 0.5f, 0.5f}, {0, 1, 0, 1}), 0.5);
  // Positive 0.5 ties negative 0.5 (1/2) and beats 0.2 (1); positive 0.9
  // beats both (2): 3.5 of 4.
  EXPECT_DOUBLE_EQ(Auc({0.2f, 0.5f, 0.5f, 0.9f}, {0, 0, 1, 1}), 0.875);
}

TEST(AucTest, OneClassOrEmptyIsOneHalf) {
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.7f, 0.3f}, {1, 1, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.7f, 0.3f}, {0, 0, 0}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({}, {}), 0.5);
}

TEST(AucTest, MatchesPairwiseDefinitionWithManyTies) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> score(0, 9);  // coarse: many ties
  std::bernoulli_distribution label(0.3);
  std::vector<float> scores(500), labels(500);
  for (size_t i = 0; i < scores.size(); ++i) {
    scores[i] = score(rng) / 10.0f;
    labels[i] = label(rng) ? 1.0f : 0.0f;
  }
  EXPECT_NEAR(Auc(scores, labels), PairwiseAuc(scores, labels), 1e-12);
}

TEST(LogLossTest, HandComputedValues) {
  // -(log 0.8 + log(1 - 0.4)) / 2
  EXPECT_NEAR(LogLoss({0.8f, 0.4f}, {1, 0}), -(std::log(0.8) + std::log(0.6)) / 2, 1e-7);
  // A coin flip costs log 2 whatever the label.
  EXPECT_NEAR(LogLoss({0.5f, 0.5f, 0.5f}, {1, 0, 1}), std::log(2.0), 1e-9);
}

TEST(LogLossTest, ClampsCertainMistakes) {
  const double worst = -std::log(1e-7);  // ~16.118
  EXPECT_NEAR(LogLoss({0.0f}, {1}), worst, 1e-6);
  EXPECT_NEAR(LogLoss({1.0f}, {0}), worst, 1e-6);
  EXPECT_NEAR(LogLoss({1.0f, 0.0f}, {1, 0}), 1e-7, 1e-8);
}

TEST(LogLossTest, EmptyIsZero) { EXPECT_DOUBLE_EQ(LogLoss({}, {}), 0.0); }

}  // namespace
}  // namespace strata
