// A structural check of XGBoost model bytes, done before libxgboost ever sees them.
//
// libxgboost 1.7.4 (Debian 12) trusts its model files: a JSON document nested 500k deep
// overflows its recursive parser's stack, a tree count that disagrees with the trees array
// is an out-of-bounds read, a negative child index makes prediction loop forever and an
// out-of-range one is an out-of-bounds read at prediction. CheckXgboostModel parses the
// bytes with its own bounded parsers and checks every field libxgboost reads, so that a
// model it accepts loads and predicts safely. It mirrors what libxgboost 1.7.4 reads, from
// the v1.7.4 sources: src/learner.cc (LearnerIO::LoadModel, LearnerModelParamLegacy),
// src/common/json.cc and include/xgboost/json_io.h (JsonReader, UBJReader),
// src/gbm/gbtree_model.cc, src/gbm/gbtree.{h,cc}, src/gbm/gblinear_model.{h,cc},
// src/tree/tree_model.cc (RegTree::LoadModel), include/xgboost/tree_model.h,
// src/objective/multiclass_obj.cu and src/predictor/{cpu_predictor.cc,predict_fn.h}.
//
// Pure computation: no I/O and no libxgboost (this file is part of decision_core). The
// legacy binary format is not parsed here: it is converted to UBJSON by
// ConvertXgboostModelToUbjson (core/xgboost_expert.h) in a sandbox process, and the result
// is checked.
//
// Cost: time O(bytes); memory O(bytes): the parsers keep one 16-byte record per value
// outside typed arrays (every such value takes at least one input byte), copies of the
// strings that contain escapes, and per-tree scratch proportional to that tree's nodes.
// Nesting is tracked with an explicit stack; nothing recurses. Nothing throws on bad
// input (allocation failure aside).
//
// Thread safety: both functions are pure and reentrant.
#ifndef DECISION_CORE_XGBOOST_MODEL_CHECK_H_
#define DECISION_CORE_XGBOOST_MODEL_CHECK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/xgboost_forest.h"

namespace decision {

// The three encodings libxgboost 1.7.4's XGBoosterLoadModelFromBuffer accepts.
enum class XgboostModelFormat { kJson, kUbjson, kLegacyBinary };

// Which reader libxgboost 1.7.4 would hand `bytes` to. This is exactly the dispatch of
// LearnerIO::LoadModel(dmlc::Stream*) in src/learner.cc:
//   - the first byte is not '{' (or there is none): the legacy binary format (this includes
//     the old "binf" header, and "bs64", which libxgboost refuses);
//   - '{' followed, after any bytes for which std::isspace is true in the C locale
//     (space, \t, \n, \v, \f, \r), by '"': JSON;
//   - by an ASCII letter: UBJSON (XGBoost's writer puts the 'L' of the first key there);
//   - by anything else, or by nothing: libxgboost's JSON branch refuses the bytes ("Invalid
//     model format"). They are reported as kJson; CheckXgboostModel rejects them.
XgboostModelFormat DetectXgboostModelFormat(absl::string_view bytes);

// Bounds on what CheckXgboostModel accepts, all positive. The defaults are far above what
// the trainer (core/xgboost_trainer.h) produces. Whatever the limits, the check's memory is
// at most about 16 bytes per input byte; the limits bound what libxgboost is then asked to
// allocate and walk.
struct XgboostModelLimits {
  // Containers (objects and arrays) open at once; the top-level object is level 1. A real
  // gbtree model nests 7 levels (learner, gradient_booster, model, trees, a tree,
  // tree_param), gblinear 5.
  int max_nesting_depth = 64;
  // Values in the document: every scalar, container and element of a typed array. Each
  // takes at least one input byte; this bounds the parse absolutely, not only relative to
  // the input. A JSON tree model has about 10 values per tree node, so the default admits
  // max_total_nodes nodes in JSON.
  int64_t max_values = int64_t{1} << 28;
  // gradient_booster.model.gbtree_model_param.num_trees.
  int64_t max_trees = 65536;
  // tree_param.num_nodes of one tree (deleted nodes included).
  int64_t max_nodes_per_tree = int64_t{1} << 20;
  // The sum of num_nodes over all trees.
  int64_t max_total_nodes = int64_t{1} << 24;
  // Edges from a tree's root to its deepest leaf. The trainer grows trees of depth <= 10.
  int max_tree_depth = 64;
};

// Returns OK only if `bytes` is a JSON or UBJSON XGBoost model that libxgboost 1.7.4 loads
// and can predict with safely, whose objective is multi:softprob with num_class ==
// num_arms, whose learner_model_param.num_feature == num_features, and which is within
// `limits`.
//
// Otherwise returns INVALID_ARGUMENT with a message, starting "xgboost model: ", that names
// the first problem found (for example "xgboost model: tree 3 node 7 has left child -5,
// outside [1, 15)"). Also INVALID_ARGUMENT if num_arms or num_features is outside what
// ValidateExpertShape (core/expert.h) allows, or if a limit is not positive.
//
// Bytes in the legacy binary format are rejected ("the legacy binary format is checked
// after conversion; see ConvertXgboostModelToUbjson"). Also rejected: the dart booster, and
// anything libxgboost would refuse or read differently from this check (duplicate keys,
// which its JSON reader resolves to the last and its UBJSON reader to the first; trailing
// bytes; numbers that overflow; UBJSON markers it does not read: N, D, H, optimized
// objects, counts and string lengths not written as int64 'L').
//
// What is checked, in the order libxgboost reads it:
//   - the document: a "version" array of three integers and a "learner" object;
//   - learner_model_param (string values, as 1.7 writes them): num_class == num_arms,
//     num_feature == num_features (> 0), num_target 1 if present, boost_from_average 0 or
//     1 if present, base_score a finite float;
//   - objective: name "multi:softprob", softmax_multiclass_param.num_class == num_class;
//   - gradient_booster: name "gbtree" or "gblinear";
//   - gblinear: weights of length (num_feature + 1) * num_class, all finite;
//   - gbtree: gbtree_model_param.num_trees == len(trees) == len(tree_info), a multiple of
//     num_class * num_parallel_tree; size_leaf_vector 0; tree_info values in
//     [0, num_class); trees[t].id == t;
//   - each tree: either all per-node arrays are typed (UBJSON) or none is, with the element
//     types libxgboost reads; every one of them (left_children, right_children, parents,
//     split_indices, split_conditions, default_left, base_weights, loss_changes,
//     sum_hessian, and split_type if present) has tree_param.num_nodes entries;
//     tree_param.num_feature == num_features, size_leaf_vector 0; every split is numerical
//     (split_type 0, categories arrays empty); from the root, each node is a leaf (both
//     children -1) or has left child l in [1, num_nodes) and right child l + 1 (libxgboost
//     1.7.4's predictor computes the right child as left + 1); each node is reached once
//     (no cycle, no shared child), within max_tree_depth; internal nodes split on a feature
//     in [0, num_features); the parents array agrees with the children (the root's parent is
//     2147483647 or -1); nodes not reached are exactly the deleted ones libxgboost's pruner
//     leaves behind (split index 2147483647, default left, no children), and there are
//     tree_param.num_deleted of them; every float is finite;
//   - attributes: an object of strings; feature_names and feature_types, if present, arrays
//     of strings.
//
// If `forest` is not null and the model is accepted, it receives the model compiled for
// PredictForest (core/xgboost_forest.h): the trees of a gbtree model, the weights of a
// gblinear one. Otherwise it is left empty (num_class 0).
absl::Status CheckXgboostModel(absl::string_view bytes, int num_arms, int num_features,
                               const XgboostModelLimits& limits = {},
                               XgboostForest* forest = nullptr);

}  // namespace decision

#endif  // DECISION_CORE_XGBOOST_MODEL_CHECK_H_
