#include "examples/trainer/synthetic_data.h"

#include "examples/trainer/variable_init.h"

namespace rdmaflow::exec {

SyntheticData::SyntheticData(int64_t features, int64_t classes, uint64_t seed)
    : features_(features), classes_(classes), seed_(seed) {
  SplitMix64 rng(seed_for("teacher", seed));
  teacher_.resize(static_cast<size_t>(features * classes));
  for (float& t : teacher_) t = rng.normal();
}

void SyntheticData::row(uint64_t step, int64_t r, float* x) const {
  SplitMix64 rng(seed_for("row", seed_ ^ (step * 0x9e3779b97f4a7c15ull) ^
                                     (static_cast<uint64_t>(r) * 0xc2b2ae3d27d4eb4full)));
  for (int64_t j = 0; j < features_; ++j) x[j] = rng.normal();
}

void SyntheticData::fill_features(uint64_t step, int64_t row0, int64_t rows, float* x) const {
  for (int64_t i = 0; i < rows; ++i) row(step, row0 + i, x + i * features_);
}

void SyntheticData::fill_labels(uint64_t step, int64_t row0, int64_t rows, int32_t* y) const {
  std::vector<float> x(static_cast<size_t>(features_));
  for (int64_t i = 0; i < rows; ++i) {
    row(step, row0 + i, x.data());
    int32_t best = 0;
    float best_score = 0;
    for (int64_t c = 0; c < classes_; ++c) {
      float score = 0;
      for (int64_t j = 0; j < features_; ++j) {
        score += x[static_cast<size_t>(j)] * teacher_[static_cast<size_t>(j * classes_ + c)];
      }
      if (c == 0 || score > best_score) {
        best = static_cast<int32_t>(c);
        best_score = score;
      }
    }
    y[i] = best;
  }
}

}  // namespace rdmaflow::exec
