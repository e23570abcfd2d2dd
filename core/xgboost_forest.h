// A gbtree or gblinear model as flat arrays, predicted without libxgboost.
//
// libxgboost 1.7.4's CPU predictor walks RegTree nodes through its generic C API: every call
// parses a JSON configuration, builds an adapter over the rows and dispatches per block,
// and a tree costs ~30 ns per row even in large batches (bench/README.md, "Scoring XGBoost
// experts"). Scoring is the cost of this method in production (every joined sample is
// scored by every active expert), so a tree model that CheckXgboostModel has accepted is
// also compiled here, into one array of 12-byte nodes, and predicted by a tight loop.
//
// The arithmetic is libxgboost 1.7.4's (src/predictor/cpu_predictor.cc, predict_fn.h,
// src/common/math.h), so that the probabilities are the same floats:
//   - features are floats (XgboostFeature); every feature is present (contexts are finite,
//     so default_left is never taken);
//   - at a split on feature f with condition c, the walk goes to left + !(x[f] < c);
//     (here a leaf is its own left child, with condition +inf: a walk that reached it stays,
//     so every walk takes a fixed number of steps, the tree's depth, without a branch, and
//     the walks of kInterleave trees advance together);
//   - each class's margin starts at base_score and adds, in tree order, the leaf value of
//     every tree of that class (tree_info), in float;
//   - softmax: the max margin m, e_v = expf(margin_v - m) in float, their sum in double,
//     p_v = e_v / (float)sum.
// A gblinear model (linear_weights) is libxgboost's GBLinear::Pred (src/gbm/gblinear.cc):
// each class's margin starts at its bias + base_score and adds x[f] * w[f][class] for
// f = 0, 1, ... in float (a product, then a sum: never a fused multiply-add); then the same
// softmax. libxgboost 1.7 predicts gblinear only through a DMatrix, whose construction
// reads two cgroup files per call; the compiled form reads nothing.
// tests/xgboost_expert_test.cc checks the probabilities against libxgboost's on trained
// models, bit for bit.
//
// The expert keeps only the forest: libxgboost loads the model once, at construction, as a
// check, and its booster is freed.
//
// Thread safety: a forest is immutable once built; PredictForest is reentrant.
#ifndef DECISION_CORE_XGBOOST_FOREST_H_
#define DECISION_CORE_XGBOOST_FOREST_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace decision {

struct XgboostForest {
  // Trees walked together, one step of each in turn: their walks are independent, so the
  // CPU overlaps their memory loads.
  static constexpr size_t kInterleave = 8;
  // Rows predicted together: each group of trees is walked by every row of a block before
  // the next group, so that a batch reads the trees' nodes from cache, not memory, once
  // per block rather than once per row.
  static constexpr size_t kRowBlock = 16;
  struct Node {
    uint32_t left;    // the left child's index in `nodes`; a leaf: its own index
    int32_t feature;  // the split's feature (a leaf: 0)
    float condition;  // the split condition (a leaf: +inf)
  };
  int num_class = 0;
  int num_features = 0;
  float base_score = 0.5f;
  std::vector<Node> nodes;           // every tree's nodes, children as indices into `nodes`
  std::vector<float> leaf_values;    // per node: its value if it is a leaf (else 0)
  std::vector<uint32_t> roots;       // index of each tree's root in `nodes`
  std::vector<int32_t> tree_class;   // tree_info: the class each tree adds to
  std::vector<uint16_t> depths;      // each tree's depth (steps from the root to its leaves)
  // A gblinear model instead of trees: (num_features + 1) x num_class weights, w[f][class]
  // at f * num_class + class, the last row the biases (gblinear's own layout). Empty for
  // a gbtree model.
  std::vector<float> linear_weights;
};

// Writes n x num_class probabilities (row-major) for the n rows of `rows` (n x num_features
// floats, row-major).
void PredictForest(const XgboostForest& forest, const float* rows, size_t n, float* probs);

}  // namespace decision

#endif  // DECISION_CORE_XGBOOST_FOREST_H_
