#include "common/row_optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

class RowSgd : public RowOptimizer {
 public:
  explicit RowSgd(const RowOptimizerSection& c)
      : lr_(static_cast<float>(c.learning_rate)), wd_(static_cast<float>(c.weight_decay)) {}
  const char* name() const override { return "sgd"; }
  int slots() const override { return 0; }
  void InitState(float*, int) const override {}
  void Apply(float* w, float*, const float* g, float scale, int dim, uint32_t) const override {
    for (int j = 0; j < dim; ++j) w[j] -= lr_ * (scale * g[j] + wd_ * w[j]);
  }

 private:
  const float lr_, wd_;
};

class RowAdagrad : public RowOptimizer {
 public:
  explicit RowAdagrad(const RowOptimizerSection& c)
      : lr_(static_cast<float>(c.learning_rate)),
        wd_(static_cast<float>(c.weight_decay)),
        eps_(static_cast<float>(c.epsilon)),
        init_(static_cast<float>(c.initial_accumulator)) {}
  const char* name() const override { return "adagrad"; }
  int slots() const override { return 1; }
  void InitState(float* state, int dim) const override {
    for (int j = 0; j < dim; ++j) state[j] = init_;
  }
  void Apply(float* w, float* acc, const float* g, float scale, int dim, uint32_t) const override {
    for (int j = 0; j < dim; ++j) {
      const float gj = scale * g[j] + wd_ * w[j];
      acc[j] += gj * gj;
      w[j] -= lr_ * gj / (std::sqrt(acc[j]) + eps_);
    }
  }

 private:
  const float lr_, wd_, eps_, init_;
};

class RowAdam : public RowOptimizer {
 public:
  explicit RowAdam(const RowOptimizerSection& c)
      : lr_(c.learning_rate),
        b1_(c.beta1),
        b2_(c.beta2),
        eps_(c.epsilon),
        wd_(static_cast<float>(c.weight_decay)) {}
  const char* name() const override { return "adam"; }
  int slots() const override { return 2; }
  void InitState(float* state, int dim) const override {
    for (int j = 0; j < 2 * dim; ++j) state[j] = 0.f;
  }
  void Apply(float* w, float* state, const float* g, float scale, int dim,
             uint32_t t) const override {
    float* m = state;
    float* v = state + dim;
    const double c1 = 1.0 - std::pow(b1_, static_cast<double>(t));
    const double c2 = 1.0 - std::pow(b2_, static_cast<double>(t));
    const float step = static_cast<float>(lr_ / c1);
    const float inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
    const float b1 = static_cast<float>(b1_), b2 = static_cast<float>(b2_);
    const float eps = static_cast<float>(eps_);
    for (int j = 0; j < dim; ++j) {
      const float gj = scale * g[j] + wd_ * w[j];
      m[j] = b1 * m[j] + (1.f - b1) * gj;
      v[j] = b2 * v[j] + (1.f - b2) * gj * gj;
      w[j] -= step * m[j] / (std::sqrt(v[j]) * inv_sqrt_c2 + eps);
    }
  }

 private:
  const double lr_, b1_, b2_, eps_;
  const float wd_;
};

class RowFtrl : public RowOptimizer {
 public:
  explicit RowFtrl(const RowOptimizerSection& c)
      : alpha_(c.learning_rate), beta_(c.ftrl_beta), l1_(c.l1), l2_(c.l2) {}
  const char* name() const override { return "ftrl"; }
  int slots() const override { return 2; }
  void InitState(float* state, int dim) const override {
    for (int j = 0; j < 2 * dim; ++j) state[j] = 0.f;
  }
  void Apply(float* w, float* state, const float* g, float scale, int dim,
             uint32_t) const override {
    float* z = state;
    float* n = state + dim;
    for (int j = 0; j < dim; ++j) {
      // In double: sqrt(n + g^2) - sqrt(n) loses everything in float once n
      // has grown.
      const double gj = static_cast<double>(scale) * g[j];
      const double n_old = n[j];
      const double n_new = n_old + gj * gj;
      const double sigma = (std::sqrt(n_new) - std::sqrt(n_old)) / alpha_;
      const double z_new = z[j] + gj - sigma * w[j];
      z[j] = static_cast<float>(z_new);
      n[j] = static_cast<float>(n_new);
      if (std::abs(z_new) <= l1_) {
        w[j] = 0.f;
      } else {
        const double sign = z_new < 0 ? -1.0 : 1.0;
        w[j] =
            static_cast<float>(-(z_new - sign * l1_) / ((beta_ + std::sqrt(n_new)) / alpha_ + l2_));
      }
    }
  }

 private:
  const double alpha_, beta_, l1_, l2_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RowOptimizer>> RowOptimizer::Create(const RowOptimizerSection& c) {
  if (c.type == "sgd") return std::unique_ptr<RowOptimizer>(new RowSgd(c));
  if (c.type == "adagrad") return std::unique_ptr<RowOptimizer>(new RowAdagrad(c));
  if (c.type == "adam") return std::unique_ptr<RowOptimizer>(new RowAdam(c));
  if (c.type == "ftrl") return std::unique_ptr<RowOptimizer>(new RowFtrl(c));
  return absl::InvalidArgumentError(absl::StrCat("unknown sparse optimizer '", c.type,
                                                 "' (expected sgd, adagrad, adam or ftrl)"));
}

}  // namespace strata
