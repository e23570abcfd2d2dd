#include "core/xgboost_forest.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace decision {
namespace {

// fmaxf(a, m) as libxgboost's softmax takes it, inlined (GCC calls libm's fmaxf, which
// must honour NaNs): a NaN on either side gives the other. Only a max of +0 and -0 may
// differ in sign, and margin - max is then the same for every margin.
inline float MaxOf(float a, float m) { return a > m || m != m ? a : m; }

void Softmax(float* margins, int k) {
  float max_margin = margins[0];
  for (int v = 1; v < k; ++v) max_margin = MaxOf(margins[v], max_margin);
  double sum = 0.0;
  for (int v = 0; v < k; ++v) {
    margins[v] = std::exp(margins[v] - max_margin);  // float overload: expf
    sum += margins[v];
  }
  const float total = static_cast<float>(sum);
  for (int v = 0; v < k; ++v) margins[v] /= total;
}

// Classes whose margins PredictLinear keeps in registers at once.
constexpr size_t kLinearLanes = 8;

void PredictLinear(const XgboostForest& model, const float* rows, size_t n, float* probs) {
  const size_t k = static_cast<size_t>(model.num_class);
  const size_t d = static_cast<size_t>(model.num_features);
  const float* w = model.linear_weights.data();
  const float* bias = w + d * k;
  const size_t full = k - k % kLinearLanes;  // classes in whole groups of kLinearLanes
  for (size_t r = 0; r < n; ++r) {
    const float* x = rows + r * d;
    float* margins = probs + r * k;
    // Each class's margin is its own chain, bias + base_score then + x[f] w[f][v] for
    // f = 0, 1, ...: a group of classes walks the features together.
    for (size_t first = 0; first < full; first += kLinearLanes) {
      float acc[kLinearLanes];
      for (size_t j = 0; j < kLinearLanes; ++j) acc[j] = bias[first + j] + model.base_score;
      for (size_t f = 0; f < d; ++f) {
        const float xf = x[f];
        const float* wf = w + f * k + first;
        for (size_t j = 0; j < kLinearLanes; ++j) {
          const float term = xf * wf[j];
          acc[j] += term;
        }
      }
      for (size_t j = 0; j < kLinearLanes; ++j) margins[first + j] = acc[j];
    }
    for (size_t v = full; v < k; ++v) {
      float margin = bias[v] + model.base_score;
      for (size_t f = 0; f < d; ++f) {
        const float term = x[f] * w[f * k + v];
        margin += term;
      }
      margins[v] = margin;
    }
    Softmax(margins, static_cast<int>(k));
  }
}

}  // namespace

void PredictForest(const XgboostForest& forest, const float* rows, size_t n, float* probs) {
  if (!forest.linear_weights.empty()) {
    PredictLinear(forest, rows, n, probs);
    return;
  }
  constexpr size_t kGroup = XgboostForest::kInterleave;
  constexpr size_t kBlock = XgboostForest::kRowBlock;
  const int k = forest.num_class;
  const size_t d = static_cast<size_t>(forest.num_features);
  const XgboostForest::Node* nodes = forest.nodes.data();
  const float* leaf = forest.leaf_values.data();
  const size_t num_trees = forest.roots.size();
  for (size_t block = 0; block < n; block += kBlock) {
    const size_t block_end = std::min(n, block + kBlock);
    for (size_t r = block; r < block_end; ++r) {
      std::fill(probs + r * k, probs + (r + 1) * k, forest.base_score);
    }
    for (size_t first = 0; first < num_trees; first += kGroup) {
      const size_t count = std::min(kGroup, num_trees - first);
      int steps = 0;
      for (size_t j = 0; j < count; ++j) steps = std::max<int>(steps, forest.depths[first + j]);
      // The block's rows walk the group's trees one after the other, while their nodes
      // are in cache.
      for (size_t r = block; r < block_end; ++r) {
        const float* x = rows + r * d;
        uint32_t at[kGroup];
        for (size_t j = 0; j < kGroup; ++j) {
          // Past the last tree, a group walks its last tree again and ignores it.
          at[j] = forest.roots[first + std::min(j, count - 1)];
        }
        for (int step = 0; step < steps; ++step) {
          for (size_t j = 0; j < kGroup; ++j) {
            const XgboostForest::Node& node = nodes[at[j]];
            at[j] = node.left + !(x[node.feature] < node.condition);
          }
        }
        // In tree order: each class's margin is the same float sum as libxgboost's.
        float* margins = probs + r * k;
        for (size_t j = 0; j < count; ++j) margins[forest.tree_class[first + j]] += leaf[at[j]];
      }
    }
    for (size_t r = block; r < block_end; ++r) Softmax(probs + r * k, k);
  }
}

}  // namespace decision
