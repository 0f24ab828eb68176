#include "common/optimizer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// The kernels: plain loops over restrict pointers that the compiler
// vectorises; cloned for AVX2 and picked at load time by the CPU.
#define STRATA_VECTOR_KERNEL __attribute__((target_clones("avx2", "default")))

STRATA_VECTOR_KERNEL void SgdKernel(float* __restrict p, const float* __restrict g, float scale,
                                    float lr, float wd, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] -= lr * (scale * g[i] + wd * p[i]);
}

STRATA_VECTOR_KERNEL void MomentumKernel(float* __restrict p, const float* __restrict g,
                                         float* __restrict v, float scale, float lr, float mu,
                                         float wd, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    v[i] = mu * v[i] + scale * g[i] + wd * p[i];
    p[i] -= lr * v[i];
  }
}

STRATA_VECTOR_KERNEL void AdamKernel(float* __restrict p, const float* __restrict g,
                                     float* __restrict m, float* __restrict v, float scale,
                                     float step, float inv_sqrt_c2, float b1, float b2, float eps,
                                     float wd, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = scale * g[i] + wd * p[i];
    m[i] = b1 * m[i] + (1.f - b1) * gi;
    v[i] = b2 * v[i] + (1.f - b2) * gi * gi;
    p[i] -= step * m[i] / (__builtin_sqrtf(v[i]) * inv_sqrt_c2 + eps);
  }
}

// State layout: [u64 step count (adam only)][vector 0][vector 1]..., each
// vector n floats in memory order.
// A vector's floats as bytes.
absl::string_view Bytes(const std::vector<float>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

absl::Status RestoreVectors(absl::string_view in, const char* name, uint64_t* t,
                            const std::vector<std::vector<float>*>& vs) {
  size_t want = t != nullptr ? sizeof(uint64_t) : 0;
  for (const auto* v : vs) want += v->size() * 4;
  if (in.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " optimizer state of ", in.size(), " bytes; this partition's is ", want,
                     " bytes (another optimizer or partition size?)"));
  }
  const char* p = in.data();
  if (t != nullptr) {
    std::memcpy(t, p, sizeof(*t));
    p += sizeof(*t);
  }
  for (auto* v : vs) {
    std::memcpy(v->data(), p, v->size() * 4);
    p += v->size() * 4;
  }
  return absl::OkStatus();
}

// p -= lr * (g + wd * p)
class Sgd : public Optimizer {
 public:
  explicit Sgd(const OptimizerSection& c) : lr_(c.learning_rate), wd_(c.weight_decay) {}
  void Update(size_t, float* p, const float* g, float scale, size_t n, uint64_t) override {
    SgdKernel(p, g, scale, lr_, wd_, n);
  }
  const char* name() const override { return "sgd"; }
  size_t state_bytes_per_param() const override { return 0; }
  std::vector<absl::string_view> StateViews() const override { return {}; }
  absl::Status RestoreState(absl::string_view s) override {
    return RestoreVectors(s, "sgd", nullptr, {});
  }

 private:
  const float lr_, wd_;
};

// v = mu * v + (g + wd * p); p -= lr * v   (PyTorch SGD with momentum)
class Momentum : public Optimizer {
 public:
  Momentum(const OptimizerSection& c, size_t n)
      : lr_(c.learning_rate), mu_(c.momentum), wd_(c.weight_decay), v_(n, 0.f) {}
  void Update(size_t offset, float* p, const float* g, float scale, size_t n, uint64_t) override {
    MomentumKernel(p, g, v_.data() + offset, scale, lr_, mu_, wd_, n);
  }
  const char* name() const override { return "momentum"; }
  size_t state_bytes_per_param() const override { return 4; }
  std::vector<absl::string_view> StateViews() const override { return {Bytes(v_)}; }
  absl::Status RestoreState(absl::string_view s) override {
    return RestoreVectors(s, "momentum", nullptr, {&v_});
  }

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
      : lr_(c.learning_rate),
        b1_(c.beta1),
        b2_(c.beta2),
        eps_(c.epsilon),
        wd_(c.weight_decay),
        m_(n, 0.f),
        v_(n, 0.f) {}
  // The bias correction is the update's (`update`), so every chunk of one
  // update is corrected alike.
  void Update(size_t offset, float* p, const float* g, float scale, size_t n,
              uint64_t update) override {
    const double c1 = 1.0 - std::pow(b1_, static_cast<double>(update));
    const double c2 = 1.0 - std::pow(b2_, static_cast<double>(update));
    AdamKernel(p, g, m_.data() + offset, v_.data() + offset, scale, static_cast<float>(lr_ / c1),
               static_cast<float>(1.0 / std::sqrt(c2)), static_cast<float>(b1_),
               static_cast<float>(b2_), static_cast<float>(eps_), static_cast<float>(wd_), n);
  }
  const char* name() const override { return "adam"; }
  size_t state_bytes_per_param() const override { return 8; }
  std::vector<absl::string_view> StateViews() const override {
    return {absl::string_view(reinterpret_cast<const char*>(&updates_), sizeof(updates_)),
            Bytes(m_), Bytes(v_)};
  }
  absl::Status RestoreState(absl::string_view s) override {
    return RestoreVectors(s, "adam", &updates_, {&m_, &v_});
  }

 private:
  const double lr_, b1_, b2_, eps_, wd_;
  std::vector<float> m_, v_;
};

}  // namespace

std::string Optimizer::SaveState() const {
  const std::vector<absl::string_view> parts = StateViews();
  size_t bytes = 0;
  for (absl::string_view p : parts) bytes += p.size();
  std::string out;
  out.reserve(bytes);
  for (absl::string_view p : parts) out.append(p.data(), p.size());
  return out;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerSection& c, size_t n) {
  if (c.type == "sgd") return std::unique_ptr<Optimizer>(new Sgd(c));
  if (c.type == "momentum") return std::unique_ptr<Optimizer>(new Momentum(c, n));
  if (c.type == "adam") return std::unique_ptr<Optimizer>(new Adam(c, n));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", c.type, "' (expected sgd, momentum or adam)"));
}

}  // namespace strata
