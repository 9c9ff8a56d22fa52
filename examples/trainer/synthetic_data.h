// Synthetic classification data for training runs and tests: features drawn
// from a normal distribution, labels from a fixed random linear "teacher"
// (argmax of x * T), so the task is learnable and the loss falls.
//
// Row r of step s is a function of (seed, s, r) only: a shard that generates
// rows [row0, row0 + n) gets exactly the rows the full batch has there, so
// sharded and single-process runs see the same data.
#pragma once

#include <cstdint>
#include <vector>

namespace rdmaflow::exec {

class SyntheticData {
 public:
  SyntheticData(int64_t features, int64_t classes, uint64_t seed);

  int64_t features() const { return features_; }
  int64_t classes() const { return classes_; }

  // x: rows x features, row-major.
  void fill_features(uint64_t step, int64_t row0, int64_t rows, float* x) const;
  void fill_labels(uint64_t step, int64_t row0, int64_t rows, int32_t* y) const;

 private:
  void row(uint64_t step, int64_t r, float* x) const;

  int64_t features_;
  int64_t classes_;
  uint64_t seed_;
  std::vector<float> teacher_;  // features x classes
};

}  // namespace rdmaflow::exec
