#include "core/xgboost_forest.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace decision {
namespace {

void Softmax(float* margins, int k) {
  float max_margin = margins[0];
  for (int v = 1; v < k; ++v) max_margin = std::fmax(margins[v], max_margin);
  double sum = 0.0;
  for (int v = 0; v < k; ++v) {
    margins[v] = std::exp(margins[v] - max_margin);  // float overload: expf
    sum += margins[v];
  }
  const float total = static_cast<float>(sum);
  for (int v = 0; v < k; ++v) margins[v] /= total;
}

}  // namespace

void PredictForest(const XgboostForest& forest, const float* rows, size_t n, float* probs) {
  constexpr size_t kGroup = XgboostForest::kInterleave;
  const int k = forest.num_class;
  const size_t d = static_cast<size_t>(forest.num_features);
  const XgboostForest::Node* nodes = forest.nodes.data();
  const float* leaf = forest.leaf_values.data();
  const size_t num_trees = forest.roots.size();
  for (size_t r = 0; r < n; ++r) {
    const float* x = rows + r * d;
    float* margins = probs + r * k;
    std::fill(margins, margins + k, forest.base_score);
    for (size_t first = 0; first < num_trees; first += kGroup) {
      const size_t count = std::min(kGroup, num_trees - first);
      uint32_t at[kGroup];
      int steps = 0;
      for (size_t j = 0; j < kGroup; ++j) {
        // Past the last tree, a group walks its last tree again and ignores it.
        const size_t t = first + std::min(j, count - 1);
        at[j] = forest.roots[t];
        steps = std::max<int>(steps, forest.depths[t]);
      }
      for (int step = 0; step < steps; ++step) {
        for (size_t j = 0; j < kGroup; ++j) {
          const XgboostForest::Node& node = nodes[at[j]];
          at[j] = node.left + !(x[node.feature] < node.condition);
        }
      }
      // In tree order: each class's margin is the same float sum as libxgboost's.
      for (size_t j = 0; j < count; ++j) margins[forest.tree_class[first + j]] += leaf[at[j]];
    }
    Softmax(margins, k);
  }
}

}  // namespace decision
