// Offline evaluation metrics for binary classifiers (click-through-rate
// models): ROC AUC and log-loss over whole score vectors held in memory.
// Pure functions; thread-compatible (no shared state).
#ifndef STRATA_COMMON_EVAL_METRICS_H_
#define STRATA_COMMON_EVAL_METRICS_H_

#include <vector>

namespace strata {

// Area under the ROC curve of `scores` against 0/1 `labels` (a label > 0.5
// counts as positive), computed from ranks (Mann-Whitney U): the probability
// that a random positive scores above a random negative, a tie counting 1/2.
// Tied scores get the average of their ranks. O(n log n) time, O(n) memory.
// Returns 0.5 when only one class is present (or the input is empty): AUC is
// undefined there and 0.5 is "no better than chance".
// REQUIRES: scores.size() == labels.size() (CHECK); no NaN scores.
double Auc(const std::vector<float>& scores, const std::vector<float>& labels);

// Mean binary cross-entropy -[y log p + (1 - y) log(1 - p)] of predicted
// click probabilities `probs` against 0/1 `labels`, in nats; each p is
// clamped to [1e-7, 1 - 1e-7] first so a confident mistake costs ~16.1, not
// infinity. Returns 0 for empty input.
// REQUIRES: probs.size() == labels.size() (CHECK).
double LogLoss(const std::vector<float>& probs, const std::vector<float>& labels);

}  // namespace strata

#endif  // STRATA_COMMON_EVAL_METRICS_H_
