#include "pserver/optimizer.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata::pserver {
namespace {

// p -= lr * (g + wd * p)
class Sgd : public Optimizer {
 public:
  explicit Sgd(const OptimizerSection& c) : lr_(c.learning_rate), wd_(c.weight_decay) {}
  void Apply(float* p, const float* g, size_t n) override {
    for (size_t i = 0; i < n; ++i) p[i] -= lr_ * (g[i] + wd_ * p[i]);
  }
  const char* name() const override { return "sgd"; }
  size_t state_bytes_per_param() const override { return 0; }

 private:
  const float lr_, wd_;
};

// v = mu * v + (g + wd * p); p -= lr * v   (PyTorch SGD with momentum)
class Momentum : public Optimizer {
 public:
  Momentum(const OptimizerSection& c, size_t n)
      : lr_(c.learning_rate), mu_(c.momentum), wd_(c.weight_decay), v_(n, 0.f) {}
  void Apply(float* p, const float* g, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      v_[i] = mu_ * v_[i] + g[i] + wd_ * p[i];
      p[i] -= lr_ * v_[i];
    }
  }
  const char* name() const override { return "momentum"; }
  size_t state_bytes_per_param() const override { return 4; }

 private:
  const float lr_, mu_, wd_;
  std::vector<float> v_;
};

// Adam (Kingma & Ba) with bias correction:
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; t += 1
// p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
class Adam : public Optimizer {
 public:
  Adam(const OptimizerSection& c, size_t n)
      : lr_(c.learning_rate), b1_(c.beta1), b2_(c.beta2), eps_(c.epsilon),
        wd_(c.weight_decay), m_(n, 0.f), v_(n, 0.f) {}
  void Apply(float* p, const float* g, size_t n) override {
    ++t_;
    const double c1 = 1.0 - std::pow(b1_, static_cast<double>(t_));
    const double c2 = 1.0 - std::pow(b2_, static_cast<double>(t_));
    const float step = static_cast<float>(lr_ / c1);
    const float inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
    const float b1 = b1_, b2 = b2_, eps = eps_, wd = wd_;
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] + wd * p[i];
      m_[i] = b1 * m_[i] + (1.f - b1) * gi;
      v_[i] = b2 * v_[i] + (1.f - b2) * gi * gi;
      p[i] -= step * m_[i] / (std::sqrt(v_[i]) * inv_sqrt_c2 + eps);
    }
  }
  const char* name() const override { return "adam"; }
  size_t state_bytes_per_param() const override { return 8; }

 private:
  const double lr_, b1_, b2_, eps_, wd_;
  uint64_t t_ = 0;
  std::vector<float> m_, v_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const OptimizerSection& c, size_t n) {
  if (c.type == "sgd") return std::unique_ptr<Optimizer>(new Sgd(c));
  if (c.type == "momentum") return std::unique_ptr<Optimizer>(new Momentum(c, n));
  if (c.type == "adam") return std::unique_ptr<Optimizer>(new Adam(c, n));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", c.type, "' (expected sgd, momentum or adam)"));
}

}  // namespace strata::pserver
