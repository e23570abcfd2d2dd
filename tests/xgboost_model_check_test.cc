// Tests of core/xgboost_model_check.h.
//
// Three kinds of model bytes are checked:
//  - models trained here by libxgboost 1.7.4 (the synthetic problem of xgboost_expert_test:
//    300 contexts of 4 features uniform in [0, 1), the label is the index of the largest of
//    features 0..2) and by the project's trainer (core/xgboost_trainer.h): they must pass;
//  - a small model written by hand in XGBoost 1.7.4's layout (CraftedModel below), rendered
//    as JSON the way JsonWriter writes it and as UBJSON the way UBJWriter does, and edited
//    into each defect: each must be rejected with a message that names it, in both formats;
//  - bytes made by hand for the parsers' limits (nesting, counts, markers).
// Where it is safe to do so, libxgboost itself is asked too: the crafted models the check
// accepts load and predict as their trees say, and some that it rejects libxgboost also
// refuses (so the check mirrors libxgboost and is not merely stricter).
//
// tests/fuzz/corpus/xgboost_model/ holds seed inputs for a fuzzer of CheckXgboostModel with
// num_arms 3 and num_features 4: files named valid_* pass, the others are rejected (the test
// FuzzCorpus checks this). They are written by CorpusFiles() below; to write them again:
//   cmake --build build --target write_xgboost_fuzz_corpus
//   build/tests/write_xgboost_fuzz_corpus tests/fuzz/corpus/xgboost_model
// (this file compiled with DECISION_WRITE_XGBOOST_FUZZ_CORPUS: its main() writes the files
// instead of running the tests).
#include "tests/xgboost_training_data.h"
#include "core/xgboost_model_check.h"

#include <xgboost/c_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/expert.h"
#include "core/xgboost_expert.h"
#include "core/xgboost_trainer.h"

namespace decision {
namespace {

using ::testing::HasSubstr;

constexpr int kRows = xgb_test::kXgbRows;
constexpr int kFeatures = xgb_test::kXgbFeatures;
constexpr int kClasses = xgb_test::kXgbClasses;
using TrainingData = xgb_test::XgbTrainingData;
const TrainingData& Data() { return xgb_test::XgbData(); }

// ---------------------------------------------------------------------------------------
// Models trained by libxgboost.


using Params = std::vector<std::pair<std::string, std::string>>;

Params TreeParams(int max_depth) {
  return {{"booster", "gbtree"}, {"objective", "multi:softprob"},
          {"num_class", "3"},    {"max_depth", std::to_string(max_depth)},
          {"eta", "0.3"},        {"nthread", "1"},
          {"seed", "1"},         {"verbosity", "0"}};
}

Params LinearParams() {
  return {{"booster", "gblinear"}, {"objective", "multi:softprob"}, {"num_class", "3"},
          {"eta", "0.5"},          {"nthread", "1"},                {"seed", "1"},
          {"verbosity", "0"}};
}

// Trains on Data() and returns the model in `format` ("json", "ubj" or "deprecated"), or
// "" after recording a failure.
std::string TrainModel(const Params& params, const std::string& format, int rounds) {
  const TrainingData& data = Data();
  DMatrixHandle dtrain = nullptr;
  BoosterHandle booster = nullptr;
  std::string bytes;
  auto ok = [](int rc, const std::string& what) {
    if (rc != 0) ADD_FAILURE() << what << " failed: " << XGBGetLastError();
    return rc == 0;
  };
  if (ok(XGDMatrixCreateFromMat(data.features.data(), kRows, kFeatures,
                                std::numeric_limits<float>::quiet_NaN(), &dtrain),
         "XGDMatrixCreateFromMat") &&
      ok(XGDMatrixSetFloatInfo(dtrain, "label", data.labels.data(), kRows), "labels") &&
      ok(XGBoosterCreate(&dtrain, 1, &booster), "XGBoosterCreate")) {
    bool trained = true;
    for (const auto& [name, value] : params) {
      trained = trained && ok(XGBoosterSetParam(booster, name.c_str(), value.c_str()), name);
    }
    for (int iter = 0; trained && iter < rounds; ++iter) {
      trained = ok(XGBoosterUpdateOneIter(booster, iter, dtrain), "XGBoosterUpdateOneIter");
    }
    const std::string config = "{\"format\": \"" + format + "\"}";
    bst_ulong len = 0;
    const char* buffer = nullptr;
    if (trained && ok(XGBoosterSaveModelToBuffer(booster, config.c_str(), &len, &buffer),
                      "XGBoosterSaveModelToBuffer")) {
      bytes.assign(buffer, len);
    }
  }
  if (booster != nullptr) XGBoosterFree(booster);
  if (dtrain != nullptr) XGDMatrixFree(dtrain);
  return bytes;
}

// Raw libxgboost predictions (margins through softmax) of `rows` rows of Data(), loading
// `bytes` without any check. Only for bytes this test trusts.
std::vector<float> RawPredict(const std::string& bytes, int rows) {
  std::vector<float> out;
  BoosterHandle booster = nullptr;
  DMatrixHandle matrix = nullptr;
  if (XGBoosterCreate(nullptr, 0, &booster) == 0 &&
      XGBoosterLoadModelFromBuffer(booster, bytes.data(), bytes.size()) == 0 &&
      XGDMatrixCreateFromMat(Data().features.data(), rows, kFeatures,
                             std::numeric_limits<float>::quiet_NaN(), &matrix) == 0) {
    static constexpr char kConfig[] =
        "{\"type\": 0, \"training\": false, \"iteration_begin\": 0, \"iteration_end\": 0, "
        "\"strict_shape\": false}";
    const bst_ulong* shape = nullptr;
    bst_ulong dims = 0;
    const float* result = nullptr;
    if (XGBoosterPredictFromDMatrix(booster, matrix, kConfig, &shape, &dims, &result) == 0) {
      size_t total = 1;
      for (bst_ulong i = 0; i < dims; ++i) total *= shape[i];
      out.assign(result, result + total);
    }
  }
  if (out.empty()) ADD_FAILURE() << "raw prediction failed: " << XGBGetLastError();
  if (matrix != nullptr) XGDMatrixFree(matrix);
  if (booster != nullptr) XGBoosterFree(booster);
  return out;
}

bool LibxgboostLoads(const std::string& bytes) {
  BoosterHandle booster = nullptr;
  if (XGBoosterCreate(nullptr, 0, &booster) != 0) return false;
  const bool loaded = XGBoosterLoadModelFromBuffer(booster, bytes.data(), bytes.size()) == 0;
  XGBoosterFree(booster);
  return loaded;
}

struct TrainedModels {
  std::string small_json, small_ubj;  // 1 round, depth 2: 3 trees
  std::string tree_json, tree_ubj, tree_legacy;
  std::string linear_json, linear_ubj, linear_legacy;
  std::string pruned_json, pruned_ubj;  // exact + gamma: trees with deleted nodes
  std::string forest_ubj;               // num_parallel_tree 2
  std::vector<std::string> by_depth;    // depth 1..10, alternately json and ubj
};

const TrainedModels& Trained() {
  static const TrainedModels* const models = [] {
    auto* m = new TrainedModels;
    m->small_json = TrainModel(TreeParams(2), "json", 1);
    m->small_ubj = TrainModel(TreeParams(2), "ubj", 1);
    m->tree_json = TrainModel(TreeParams(3), "json", 10);
    m->tree_ubj = TrainModel(TreeParams(3), "ubj", 10);
    m->tree_legacy = TrainModel(TreeParams(3), "deprecated", 10);
    m->linear_json = TrainModel(LinearParams(), "json", 10);
    m->linear_ubj = TrainModel(LinearParams(), "ubj", 10);
    m->linear_legacy = TrainModel(LinearParams(), "deprecated", 10);
    Params pruned = TreeParams(6);
    pruned.emplace_back("tree_method", "exact");
    pruned.emplace_back("gamma", "1");
    m->pruned_json = TrainModel(pruned, "json", 5);
    m->pruned_ubj = TrainModel(pruned, "ubj", 5);
    Params forest = TreeParams(4);
    forest.emplace_back("num_parallel_tree", "2");
    forest.emplace_back("subsample", "0.8");
    m->forest_ubj = TrainModel(forest, "ubj", 3);
    for (int depth = 1; depth <= 10; ++depth) {
      m->by_depth.push_back(TrainModel(TreeParams(depth), depth % 2 ? "json" : "ubj", 5));
    }
    return m;
  }();
  return *models;
}

void ExpectPasses(const std::string& bytes, int num_arms = kClasses,
                  int num_features = kFeatures) {
  ASSERT_FALSE(bytes.empty()) << "training failed";
  const absl::Status status = CheckXgboostModel(bytes, num_arms, num_features);
  EXPECT_TRUE(status.ok()) << status;
}

void ExpectRejectedBytes(const std::string& bytes, const std::string& word,
                         int num_arms = kClasses, int num_features = kFeatures,
                         const XgboostModelLimits& limits = {}) {
  const absl::Status status = CheckXgboostModel(bytes, num_arms, num_features, limits);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(word)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("xgboost model")) << status;
}

// ---------------------------------------------------------------------------------------
// A test-only JSON value, written as XGBoost 1.7.4's JsonWriter and UBJWriter write it.

struct J {
  enum class T { kNull, kBool, kInt, kFloat, kStr, kArr, kObj, kF32s, kU8s, kI32s, kI64s };
  T t = T::kNull;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<J> items;             // kArr; kObj: the values
  std::vector<std::string> keys;    // kObj
  std::vector<double> floats;       // kF32s
  std::vector<int64_t> ints;        // kU8s, kI32s, kI64s

  static J Int(int64_t v) {
    J j;
    j.t = T::kInt;
    j.i = v;
    return j;
  }
  static J Float(double v) {
    J j;
    j.t = T::kFloat;
    j.f = v;
    return j;
  }
  static J Str(std::string v) {
    J j;
    j.t = T::kStr;
    j.s = std::move(v);
    return j;
  }
  static J Arr(std::vector<J> v = {}) {
    J j;
    j.t = T::kArr;
    j.items = std::move(v);
    return j;
  }
  static J Obj() {
    J j;
    j.t = T::kObj;
    return j;
  }
  static J F32s(std::vector<double> v) {
    J j;
    j.t = T::kF32s;
    j.floats = std::move(v);
    return j;
  }
  static J Ints(T type, std::vector<int64_t> v) {
    J j;
    j.t = type;
    j.ints = std::move(v);
    return j;
  }

  // The member `key`, added (as null) if absent.
  J& operator[](const std::string& key) {
    for (size_t m = 0; m < keys.size(); ++m) {
      if (keys[m] == key) return items[m];
    }
    keys.push_back(key);
    items.emplace_back();
    return items.back();
  }
  void Erase(const std::string& key) {
    for (size_t m = 0; m < keys.size(); ++m) {
      if (keys[m] == key) {
        keys.erase(keys.begin() + m);
        items.erase(items.begin() + m);
        return;
      }
    }
  }
  size_t Size() const {
    switch (t) {
      case T::kF32s: return floats.size();
      case T::kU8s:
      case T::kI32s:
      case T::kI64s: return ints.size();
      default: return items.size();
    }
  }
  // Drops the last element of any array.
  void PopBack() {
    if (t == T::kF32s) {
      floats.pop_back();
    } else if (t == T::kU8s || t == T::kI32s || t == T::kI64s) {
      ints.pop_back();
    } else {
      items.pop_back();
    }
  }
};

// A float as XGBoost's to_chars writes it: always with '.' or an exponent (so JsonReader
// reads it back as a float), NaN, Infinity, -Infinity.
std::string FloatText(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.9g", v);
  std::string text = buffer;
  if (text.find_first_of(".eE") == std::string::npos) text += "E0";
  return text;
}

void WriteJson(const J& j, std::string* out) {
  switch (j.t) {
    case J::T::kNull: *out += "null"; return;
    case J::T::kBool: *out += j.i ? "true" : "false"; return;
    case J::T::kInt: *out += std::to_string(j.i); return;
    case J::T::kFloat: *out += FloatText(j.f); return;
    case J::T::kStr: *out += "\"" + j.s + "\""; return;
    case J::T::kArr:
      *out += '[';
      for (size_t k = 0; k < j.items.size(); ++k) {
        if (k) *out += ',';
        WriteJson(j.items[k], out);
      }
      *out += ']';
      return;
    case J::T::kObj:
      *out += '{';
      for (size_t k = 0; k < j.items.size(); ++k) {
        if (k) *out += ',';
        *out += "\"" + j.keys[k] + "\":";
        WriteJson(j.items[k], out);
      }
      *out += '}';
      return;
    case J::T::kF32s:  // JsonWriter writes typed arrays as plain arrays
      *out += '[';
      for (size_t k = 0; k < j.floats.size(); ++k) {
        if (k) *out += ',';
        *out += FloatText(j.floats[k]);
      }
      *out += ']';
      return;
    case J::T::kU8s:
    case J::T::kI32s:
    case J::T::kI64s:
      *out += '[';
      for (size_t k = 0; k < j.ints.size(); ++k) {
        if (k) *out += ',';
        *out += std::to_string(j.ints[k]);
      }
      *out += ']';
      return;
  }
}

std::string ToJson(const J& j) {
  std::string out;
  WriteJson(j, &out);
  return out;
}

void PutBigEndian(uint64_t v, int bytes, std::string* out) {
  for (int b = bytes - 1; b >= 0; --b) out->push_back(static_cast<char>((v >> (8 * b)) & 0xff));
}

void PutFloat(double v, std::string* out) {
  const float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  PutBigEndian(bits, 4, out);
}

void PutUbjString(const std::string& s, std::string* out) {
  out->push_back('L');
  PutBigEndian(s.size(), 8, out);
  *out += s;
}

void WriteUbj(const J& j, std::string* out) {
  switch (j.t) {
    case J::T::kNull: out->push_back('Z'); return;
    case J::T::kBool: out->push_back(j.i ? 'T' : 'F'); return;
    case J::T::kInt:  // UBJWriter::Visit(JsonInteger const*)
      if (j.i > -128 && j.i < 127) {
        out->push_back('i');
        PutBigEndian(static_cast<uint64_t>(j.i), 1, out);
      } else if (j.i > -32768 && j.i < 32767) {
        out->push_back('I');
        PutBigEndian(static_cast<uint64_t>(j.i), 2, out);
      } else if (j.i > std::numeric_limits<int32_t>::min() &&
                 j.i < std::numeric_limits<int32_t>::max()) {
        out->push_back('l');
        PutBigEndian(static_cast<uint64_t>(j.i), 4, out);
      } else {
        out->push_back('L');
        PutBigEndian(static_cast<uint64_t>(j.i), 8, out);
      }
      return;
    case J::T::kFloat:
      out->push_back('d');
      PutFloat(j.f, out);
      return;
    case J::T::kStr:
      out->push_back('S');
      PutUbjString(j.s, out);
      return;
    case J::T::kArr:
      *out += "[#L";
      PutBigEndian(j.items.size(), 8, out);
      for (const J& item : j.items) WriteUbj(item, out);
      return;
    case J::T::kObj:
      out->push_back('{');
      for (size_t k = 0; k < j.items.size(); ++k) {
        PutUbjString(j.keys[k], out);
        WriteUbj(j.items[k], out);
      }
      out->push_back('}');
      return;
    case J::T::kF32s:
      *out += "[$d#L";
      PutBigEndian(j.floats.size(), 8, out);
      for (double v : j.floats) PutFloat(v, out);
      return;
    case J::T::kU8s:
    case J::T::kI32s:
    case J::T::kI64s: {
      const int size = j.t == J::T::kU8s ? 1 : j.t == J::T::kI32s ? 4 : 8;
      *out += j.t == J::T::kU8s ? "[$U#L" : j.t == J::T::kI32s ? "[$l#L" : "[$L#L";
      PutBigEndian(j.ints.size(), 8, out);
      for (int64_t v : j.ints) PutBigEndian(static_cast<uint64_t>(v), size, out);
      return;
    }
  }
}

std::string ToUbj(const J& j) {
  std::string out;
  WriteUbj(j, &out);
  return out;
}

// Turns every typed array into a plain array of integers or floats (what a UBJSON writer
// other than XGBoost's might produce; libxgboost reads both).
void Untype(J* j) {
  if (j->t == J::T::kF32s) {
    std::vector<J> items;
    for (double v : j->floats) items.push_back(J::Float(v));
    *j = J::Arr(std::move(items));
  } else if (j->t == J::T::kU8s || j->t == J::T::kI32s || j->t == J::T::kI64s) {
    std::vector<J> items;
    for (int64_t v : j->ints) items.push_back(J::Int(v));
    *j = J::Arr(std::move(items));
  }
  for (J& item : j->items) Untype(&item);
}

// ---------------------------------------------------------------------------------------
// The crafted model: six trees over 4 features and 3 classes.

struct TreeSpec {
  std::vector<int64_t> left, right, parent, split_index, default_left;
  std::vector<double> split_condition;  // thresholds of internal nodes, values of leaves
  int Size() const { return static_cast<int>(left.size()); }
  void Resize(int n) {
    left.assign(n, -1);
    right.assign(n, -1);
    parent.assign(n, 0);
    split_index.assign(n, 0);
    default_left.assign(n, 0);
    split_condition.assign(n, 0.0);
    parent[0] = 2147483647;
  }
  void Split(int v, int child, int feature, double threshold) {
    left[v] = child;
    right[v] = child + 1;
    parent[child] = parent[child + 1] = v;
    split_index[v] = feature;
    split_condition[v] = threshold;
    default_left[v] = 1;
  }
};

// A complete tree numbered breadth first: node i splits into 2i + 1 and 2i + 2.
TreeSpec FullTree(int depth, int seed) {
  TreeSpec s;
  const int n = (1 << (depth + 1)) - 1;
  s.Resize(n);
  for (int v = 0; 2 * v + 2 < n; ++v) {
    s.Split(v, 2 * v + 1, (v + seed) % kFeatures, 0.25 + 0.25 * ((v + seed) % 3));
  }
  for (int v = 0; v < n; ++v) {
    if (s.left[v] == -1) s.split_condition[v] = 0.1 * ((v * 7 + seed) % 11) - 0.5;
  }
  return s;
}

// A left spine: the deepest leaf is at `depth`, with 2 * depth + 1 nodes.
TreeSpec SpineTree(int depth, int seed) {
  TreeSpec s;
  s.Resize(2 * depth + 1);
  int v = 0;
  for (int level = 0; level < depth; ++level) {
    s.Split(v, 2 * level + 1, (level + seed) % kFeatures, 0.3 + 0.1 * (level % 4));
    v = 2 * level + 1;
  }
  for (int u = 0; u < s.Size(); ++u) {
    if (s.left[u] == -1) s.split_condition[u] = 0.05 * ((u * 5 + seed) % 13) - 0.3;
  }
  return s;
}

std::vector<TreeSpec> CraftedTrees() {
  TreeSpec leaf;
  leaf.Resize(1);
  leaf.split_condition[0] = 0.2;
  return {FullTree(2, 0), FullTree(1, 1), SpineTree(3, 2), FullTree(2, 3), leaf, FullTree(3, 5)};
}

// A tree object as RegTree::SaveModel writes it (typed arrays; keys in std::map order).
J TreeJ(const TreeSpec& s, int id) {
  const int n = s.Size();
  std::vector<double> base_weights(n), loss_changes(n), sum_hessian(n);
  for (int v = 0; v < n; ++v) {
    base_weights[v] = s.left[v] == -1 ? s.split_condition[v] : 0.125 * v;
    loss_changes[v] = s.left[v] == -1 ? 0.0 : 1.5 + v;
    sum_hessian[v] = 40.0 / (1 + v);
  }
  J t = J::Obj();
  t["base_weights"] = J::F32s(base_weights);
  t["categories"] = J::Ints(J::T::kI32s, {});
  t["categories_nodes"] = J::Ints(J::T::kI32s, {});
  t["categories_segments"] = J::Ints(J::T::kI64s, {});
  t["categories_sizes"] = J::Ints(J::T::kI64s, {});
  t["default_left"] = J::Ints(J::T::kU8s, s.default_left);
  t["id"] = J::Int(id);
  t["left_children"] = J::Ints(J::T::kI32s, s.left);
  t["loss_changes"] = J::F32s(loss_changes);
  t["parents"] = J::Ints(J::T::kI32s, s.parent);
  t["right_children"] = J::Ints(J::T::kI32s, s.right);
  t["split_conditions"] = J::F32s(s.split_condition);
  t["split_indices"] = J::Ints(J::T::kI32s, s.split_index);
  t["split_type"] = J::Ints(J::T::kU8s, std::vector<int64_t>(n, 0));
  t["sum_hessian"] = J::F32s(sum_hessian);
  J param = J::Obj();
  param["num_deleted"] = J::Str("0");
  param["num_feature"] = J::Str(std::to_string(kFeatures));
  param["num_nodes"] = J::Str(std::to_string(n));
  param["size_leaf_vector"] = J::Str("0");
  t["tree_param"] = param;
  return t;
}

J LearnerJ(J gradient_booster) {
  J learner = J::Obj();
  learner["attributes"] = J::Obj();
  learner["feature_names"] = J::Arr();
  learner["feature_types"] = J::Arr();
  learner["gradient_booster"] = std::move(gradient_booster);
  J param = J::Obj();
  param["base_score"] = J::Str("5E-1");
  param["boost_from_average"] = J::Str("1");
  param["num_class"] = J::Str(std::to_string(kClasses));
  param["num_feature"] = J::Str(std::to_string(kFeatures));
  param["num_target"] = J::Str("1");
  learner["learner_model_param"] = param;
  J objective = J::Obj();
  objective["name"] = J::Str("multi:softprob");
  objective["softmax_multiclass_param"] = J::Obj();
  objective["softmax_multiclass_param"]["num_class"] = J::Str(std::to_string(kClasses));
  learner["objective"] = objective;
  J model = J::Obj();
  model["learner"] = std::move(learner);
  model["version"] = J::Arr({J::Int(1), J::Int(7), J::Int(4)});
  return model;
}

J GbtreeJ(const std::vector<TreeSpec>& trees) {
  J booster = J::Obj();
  J model = J::Obj();
  J param = J::Obj();
  param["num_parallel_tree"] = J::Str("1");
  param["num_trees"] = J::Str(std::to_string(trees.size()));
  param["size_leaf_vector"] = J::Str("0");
  model["gbtree_model_param"] = param;
  J info = J::Arr();
  J trees_j = J::Arr();
  for (size_t t = 0; t < trees.size(); ++t) {
    info.items.push_back(J::Int(static_cast<int64_t>(t % kClasses)));
    trees_j.items.push_back(TreeJ(trees[t], static_cast<int>(t)));
  }
  model["tree_info"] = info;
  model["trees"] = trees_j;
  booster["model"] = model;
  booster["name"] = J::Str("gbtree");
  return LearnerJ(booster);
}

J CraftedModel() { return GbtreeJ(CraftedTrees()); }

std::vector<double> CraftedLinearWeights() {
  std::vector<double> w((kFeatures + 1) * kClasses);
  for (size_t k = 0; k < w.size(); ++k) w[k] = 0.1 * static_cast<double>(k % 7) - 0.3;
  return w;
}

J CraftedLinearModel() {
  J booster = J::Obj();
  booster["model"] = J::Obj();
  booster["model"]["boosted_rounds"] = J::Int(3);
  booster["model"]["weights"] = J::F32s(CraftedLinearWeights());
  booster["name"] = J::Str("gblinear");
  return LearnerJ(booster);
}

J& Booster(J& m) { return m["learner"]["gradient_booster"]; }
J& TreesOf(J& m) { return Booster(m)["model"]["trees"]; }
J& Tree(J& m, int t) { return TreesOf(m).items[t]; }

// What libxgboost should predict for the crafted trees: softmax over classes of
// base_score + the sum of the leaves each class's trees reach. A present value goes left
// if it is below the threshold.
std::vector<double> ExpectedProbabilities(const std::vector<TreeSpec>& trees,
                                          const std::vector<double>& x) {
  std::vector<double> margin(kClasses, 0.5);
  for (size_t t = 0; t < trees.size(); ++t) {
    const TreeSpec& s = trees[t];
    int v = 0;
    while (s.left[v] != -1) {
      v = x[s.split_index[v]] < static_cast<float>(s.split_condition[v]) ? s.left[v]
                                                                          : s.right[v];
    }
    margin[t % kClasses] += static_cast<float>(s.split_condition[v]);
  }
  double top = margin[0], total = 0;
  for (double m : margin) top = std::max(top, m);
  std::vector<double> p(kClasses);
  for (int k = 0; k < kClasses; ++k) total += p[k] = std::exp(margin[k] - top);
  for (double& q : p) q /= total;
  return p;
}

std::vector<double> Row(int i) {
  return std::vector<double>(Data().features.begin() + i * kFeatures,
                             Data().features.begin() + (i + 1) * kFeatures);
}

// Both renderings of a defective model are rejected with `word` in the message.
void ExpectRejected(const J& model, const std::string& word, int num_arms = kClasses,
                    int num_features = kFeatures, const XgboostModelLimits& limits = {}) {
  {
    SCOPED_TRACE("json");
    ExpectRejectedBytes(ToJson(model), word, num_arms, num_features, limits);
  }
  {
    SCOPED_TRACE("ubjson");
    ExpectRejectedBytes(ToUbj(model), word, num_arms, num_features, limits);
  }
}

J Edited(const std::function<void(J&)>& edit, J model = CraftedModel()) {
  edit(model);
  return model;
}

// ---------------------------------------------------------------------------------------
// Format detection (LearnerIO::LoadModel's dispatch).

TEST(DetectXgboostModelFormat, FollowsLibxgboostDispatch) {
  using F = XgboostModelFormat;
  EXPECT_EQ(DetectXgboostModelFormat("{\"learner\":{}}"), F::kJson);
  EXPECT_EQ(DetectXgboostModelFormat("{ \n\t\r\v\f\"learner\""), F::kJson);  // isspace
  EXPECT_EQ(DetectXgboostModelFormat(std::string("{L\0\0", 4)), F::kUbjson);
  EXPECT_EQ(DetectXgboostModelFormat("{ i"), F::kUbjson);
  EXPECT_EQ(DetectXgboostModelFormat(""), F::kLegacyBinary);
  EXPECT_EQ(DetectXgboostModelFormat("binf\x01\x02"), F::kLegacyBinary);
  EXPECT_EQ(DetectXgboostModelFormat("bs64"), F::kLegacyBinary);
  EXPECT_EQ(DetectXgboostModelFormat(" {\"learner\""), F::kLegacyBinary);
  EXPECT_EQ(DetectXgboostModelFormat("[1, 2]"), F::kLegacyBinary);
  // '{' then neither '"' nor a letter: libxgboost's JSON branch refuses it.
  EXPECT_EQ(DetectXgboostModelFormat("{"), F::kJson);
  EXPECT_EQ(DetectXgboostModelFormat("{}"), F::kJson);
  EXPECT_EQ(DetectXgboostModelFormat("{#L"), F::kJson);
  EXPECT_EQ(DetectXgboostModelFormat("{\xc3\xa9"), F::kJson);
}

TEST(DetectXgboostModelFormat, TrainedModels) {
  const TrainedModels& m = Trained();
  EXPECT_EQ(DetectXgboostModelFormat(m.tree_json), XgboostModelFormat::kJson);
  EXPECT_EQ(DetectXgboostModelFormat(m.tree_ubj), XgboostModelFormat::kUbjson);
  EXPECT_EQ(DetectXgboostModelFormat(m.tree_legacy), XgboostModelFormat::kLegacyBinary);
  EXPECT_EQ(DetectXgboostModelFormat(m.linear_legacy), XgboostModelFormat::kLegacyBinary);
}

// ---------------------------------------------------------------------------------------
// What must pass.

TEST(CheckXgboostModel, ModelsTrainedByLibxgboostPass) {
  const TrainedModels& m = Trained();
  for (const std::string* bytes : {&m.small_json, &m.small_ubj, &m.tree_json, &m.tree_ubj,
                                   &m.linear_json, &m.linear_ubj, &m.pruned_json,
                                   &m.pruned_ubj, &m.forest_ubj}) {
    ExpectPasses(*bytes);
  }
}

TEST(CheckXgboostModel, TreesOfDepthOneToTenPass) {
  const TrainedModels& m = Trained();
  ASSERT_EQ(m.by_depth.size(), 10u);
  for (size_t i = 0; i < m.by_depth.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("max_depth ", i + 1));
    ExpectPasses(m.by_depth[i]);
    // A limit below the trained depth refuses the deeper models: the walk does measure.
    if (i >= 2) {
      XgboostModelLimits shallow;
      shallow.max_tree_depth = 1;
      ExpectRejectedBytes(m.by_depth[i], "deeper than 1", kClasses, kFeatures, shallow);
    }
  }
}

TEST(CheckXgboostModel, PrunedTreesWithDeletedNodesPass) {
  // tree_method exact with gamma prunes, and the pruner leaves deleted nodes in the
  // arrays (tree_param.num_deleted > 0): they are part of real models.
  const std::string& json = Trained().pruned_json;
  ASSERT_NE(json.find("\"num_deleted\":\""), std::string::npos);
  EXPECT_NE(json.find("2147483647,"), std::string::npos) << "no deleted node was written";
  ExpectPasses(json);
  ExpectPasses(Trained().pruned_ubj);
  auto expert = MakeXgboostExpert(kClasses, kFeatures, Trained().pruned_ubj, 0.0);
  ASSERT_TRUE(expert.ok()) << expert.status();
}

TEST(CheckXgboostModel, TrainerOutputPasses) {
  TrainingSet set;
  set.num_features = kFeatures;
  for (int i = 0; i < kRows; ++i) {
    set.Add(Row(i), static_cast<int>(Data().labels[i]), 1.0, 0.5);
  }
  for (int depth : {3, 6, 10}) {
    XgboostTrainOptions options;
    options.max_depth = depth;
    options.rounds = 10;
    options.colsample_bytree = 0.8;
    options.seed = 7;
    auto model = TrainXgboostModel(set, kClasses, options);
    ASSERT_TRUE(model.ok()) << model.status();
    SCOPED_TRACE(absl::StrCat("trainer, depth ", depth));
    EXPECT_EQ(DetectXgboostModelFormat(*model), XgboostModelFormat::kUbjson);
    ExpectPasses(*model);
    ExpectRejectedBytes(*model, "classes", kClasses + 1, kFeatures);
  }
  XgboostTrainOptions linear;
  linear.linear = true;
  linear.rounds = 10;
  auto model = TrainXgboostModel(set, kClasses, linear);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectPasses(*model);
}

TEST(CheckXgboostModel, CraftedModelPassesAndLibxgboostPredictsWhatItsTreesSay) {
  const std::vector<TreeSpec> trees = CraftedTrees();
  J untyped = CraftedModel();
  Untype(&untyped);
  J booleans = CraftedModel();  // default_left as JSON booleans (GetElem<Boolean>)
  Untype(&booleans);
  for (J& tree : TreesOf(booleans).items) {
    for (J& d : tree["default_left"].items) {
      d.t = J::T::kBool;
    }
  }
  J wide = CraftedModel();  // split_indices as int64 (RegTree's feature_is_64 form)
  for (J& tree : TreesOf(wide).items) tree["split_indices"].t = J::T::kI64s;
  J old = CraftedModel();   // no split_type: models from before categorical splits
  for (J& tree : TreesOf(old).items) tree.Erase("split_type");
  const std::vector<std::pair<std::string, std::string>> renderings = {
      {"json", ToJson(CraftedModel())},     {"ubj", ToUbj(CraftedModel())},
      {"ubj untyped", ToUbj(untyped)},      {"json booleans", ToJson(booleans)},
      {"ubj int64 indices", ToUbj(wide)},   {"json without split_type", ToJson(old)},
  };
  for (const auto& [name, bytes] : renderings) {
    SCOPED_TRACE(name);
    ExpectPasses(bytes);
    auto expert = MakeXgboostExpert(kClasses, kFeatures, bytes, 0.0);
    ASSERT_TRUE(expert.ok()) << expert.status();
    for (int i = 0; i < kRows; i += 3) {
      std::vector<double> probs(kClasses);
      ASSERT_TRUE((*expert)->Predict(Row(i), absl::MakeSpan(probs)).ok());
      const std::vector<double> want = ExpectedProbabilities(trees, Row(i));
      for (int k = 0; k < kClasses; ++k) EXPECT_NEAR(probs[k], want[k], 1e-6) << i;
    }
  }
}

TEST(CheckXgboostModel, CraftedDeletedNodesPassAndPredict) {
  // Node 2 of tree 0 was pruned to a leaf: its children 5 and 6 stay, deleted.
  std::vector<TreeSpec> trees = CraftedTrees();
  TreeSpec& s = trees[0];
  s.left[2] = s.right[2] = -1;
  s.split_condition[2] = 0.7;
  for (int v : {5, 6}) {
    s.split_index[v] = 2147483647;
    s.default_left[v] = 1;
  }
  J model = GbtreeJ(trees);
  Tree(model, 0)["tree_param"]["num_deleted"] = J::Str("2");
  for (const std::string& bytes : {ToJson(model), ToUbj(model)}) {
    ExpectPasses(bytes);
    auto expert = MakeXgboostExpert(kClasses, kFeatures, bytes, 0.0);
    ASSERT_TRUE(expert.ok()) << expert.status();
    std::vector<double> probs(kClasses);
    for (int i = 0; i < kRows; i += 7) {
      ASSERT_TRUE((*expert)->Predict(Row(i), absl::MakeSpan(probs)).ok());
      const std::vector<double> want = ExpectedProbabilities(trees, Row(i));
      for (int k = 0; k < kClasses; ++k) EXPECT_NEAR(probs[k], want[k], 1e-6) << i;
    }
  }
  // The count must match, and the deleted nodes must look deleted.
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["tree_param"]["num_deleted"] = J::Str("1"); },
                        model),
                 "tree 0 has 2 deleted nodes but tree_param.num_deleted is 1");
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["split_indices"].ints[6] = 1; }, model),
                 "tree 0 node 6 is not reachable from the root and not a deleted node");
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["parents"].ints[5] = 99; }, model),
                 "tree 0 node 5 has parent 99, outside [0, 7)");
}

TEST(CheckXgboostModel, CraftedLinearModelPasses) {
  for (const std::string& bytes : {ToJson(CraftedLinearModel()), ToUbj(CraftedLinearModel())}) {
    ExpectPasses(bytes);
    auto expert = MakeXgboostExpert(kClasses, kFeatures, bytes, 0.0);
    ASSERT_TRUE(expert.ok()) << expert.status();
  }
}

// ---------------------------------------------------------------------------------------
// The parsers' limits: nesting, counts, lengths.

std::string UbjKey(const std::string& key) {
  std::string out;
  PutUbjString(key, &out);
  return out;
}

TEST(CheckXgboostModel, RejectsJsonNestedHalfAMillionDeep) {
  constexpr int kDepth = 500000;
  std::string arrays = "{\"learner\":" + std::string(kDepth, '[') + std::string(kDepth, ']') + "}";
  ExpectRejectedBytes(arrays, "nest deeper than 64 levels");
  std::string objects;
  for (int i = 0; i < kDepth; ++i) objects += "{\"a\":";
  objects += "1" + std::string(kDepth, '}');
  ExpectRejectedBytes(objects, "nest deeper than 64 levels");
}

TEST(CheckXgboostModel, RejectsUbjsonNestedHalfAMillionDeep) {
  constexpr int kDepth = 500000;
  const std::string arrays =
      "{" + UbjKey("learner") + std::string(kDepth, '[') + std::string(kDepth, ']') + "}";
  ExpectRejectedBytes(arrays, "nest deeper than 64 levels");
  std::string objects;
  for (int i = 0; i < kDepth; ++i) objects += "{" + UbjKey("a");
  objects += "Z" + std::string(kDepth, '}');
  ExpectRejectedBytes(objects, "nest deeper than 64 levels");
}

TEST(CheckXgboostModel, NestingLimitIsExact) {
  // The real model nests 7 levels.
  XgboostModelLimits limits;
  limits.max_nesting_depth = 7;
  EXPECT_TRUE(CheckXgboostModel(ToJson(CraftedModel()), kClasses, kFeatures, limits).ok());
  EXPECT_TRUE(CheckXgboostModel(ToUbj(CraftedModel()), kClasses, kFeatures, limits).ok());
  limits.max_nesting_depth = 6;
  ExpectRejected(CraftedModel(), "nest deeper than 6", kClasses, kFeatures, limits);
}

std::string UbjArrayWithCount(const std::string& header, uint64_t count) {
  std::string out = "{" + UbjKey("learner") + header;
  PutBigEndian(count, 8, &out);
  return out + "iiii}";
}

TEST(CheckXgboostModel, RejectsHugeUbjsonCountsWithoutAllocating) {
  const uint64_t kHuge = uint64_t{1} << 60;
  ExpectRejectedBytes(UbjArrayWithCount("[#L", kHuge), "array count 1152921504606846976");
  ExpectRejectedBytes(UbjArrayWithCount("[$d#L", kHuge), "typed array's count");
  ExpectRejectedBytes(UbjArrayWithCount("[$U#L", kHuge), "typed array's count");
  ExpectRejectedBytes(UbjArrayWithCount("[$L#L", ~uint64_t{0} >> 1), "typed array's count");
  ExpectRejectedBytes(UbjArrayWithCount("[#L", ~uint64_t{0}), "negative");
  ExpectRejectedBytes(UbjArrayWithCount("[$l#L", uint64_t{1} << 63), "negative");
  ExpectRejectedBytes(UbjArrayWithCount("SL", kHuge), "string length 1152921504606846976");
  std::string key = "{L";
  PutBigEndian(kHuge, 8, &key);
  ExpectRejectedBytes(key + "learner}", "key length");
  // One element more than the bytes left: 6 bytes follow the count, a float is 4.
  ExpectRejectedBytes(UbjArrayWithCount("[$d#L", 2), "typed array's count 2 is more than");
  // Counts that UBJReader would not read: not 'L'.
  ExpectRejectedBytes("{" + UbjKey("learner") + "[#i\x02ii}", "int64 ('L')");
  ExpectRejectedBytes("{i\x07learner{}}", "key length is not written as an int64");
}

TEST(CheckXgboostModel, RejectsUbjsonMarkersLibxgboostDoesNotRead) {
  const std::string prefix = "{" + UbjKey("learner");
  ExpectRejectedBytes(prefix + "D" + std::string(8, '\0') + "}", "float64 ('D')");
  ExpectRejectedBytes(prefix + "H" + "}", "high-precision");
  ExpectRejectedBytes(prefix + "N" + "Z}", "no-op ('N')");
  ExpectRejectedBytes(prefix + "x}", "unknown marker (byte 0x78)");
  ExpectRejectedBytes(prefix + "[$i#L" + std::string(8, '\0') + "}", "typed array of 'i'");
  ExpectRejectedBytes(prefix + "[$d" + "L}", "without a count");
}

TEST(CheckXgboostModel, ValueLimit) {
  XgboostModelLimits limits;
  limits.max_values = 100;
  ExpectRejected(CraftedModel(), "more than 100 values", kClasses, kFeatures, limits);
}

TEST(CheckXgboostModel, TruncatedModelsAreRejectedAtEveryLength) {
  const TrainedModels& m = Trained();
  for (const std::string* bytes : {&m.small_json, &m.small_ubj}) {
    ASSERT_FALSE(bytes->empty());
    ASSERT_LT(bytes->size(), 8000u) << "keep this model small: every prefix is checked";
    for (size_t length = 0; length < bytes->size(); ++length) {
      const absl::Status status =
          CheckXgboostModel(absl::string_view(*bytes).substr(0, length), kClasses, kFeatures);
      ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
          << "prefix of " << length << " bytes: " << status;
    }
    ExpectPasses(*bytes);
  }
}

// ---------------------------------------------------------------------------------------
// Crafted defects.

TEST(CheckXgboostModel, RejectsTreeCountMismatches) {
  // num_trees vs trees: the mismatch libxgboost turns into an out-of-bounds read.
  ExpectRejected(Edited([](J& m) {
                   Booster(m)["model"]["gbtree_model_param"]["num_trees"] = J::Str("9");
                 }),
                 "num_trees is 9 but the trees array has 6 trees");
  ExpectRejected(Edited([](J& m) {
                   TreesOf(m).PopBack();
                 }),
                 "num_trees is 6 but the trees array has 5 trees");
  ExpectRejected(Edited([](J& m) { Booster(m)["model"]["tree_info"].PopBack(); }),
                 "num_trees is 6 but tree_info has 5 entries");
  ExpectRejected(Edited([](J& m) {
                   Booster(m)["model"]["gbtree_model_param"]["num_trees"] = J::Str("7");
                 }),
                 "not a multiple of num_class * num_parallel_tree = 3");
  ExpectRejected(Edited([](J& m) {
                   Booster(m)["model"]["gbtree_model_param"]["num_parallel_tree"] = J::Str("4");
                 }),
                 "not a multiple of num_class * num_parallel_tree = 12");
  ExpectRejected(Edited([](J& m) {
                   Booster(m)["model"]["gbtree_model_param"]["num_parallel_tree"] = J::Str("0");
                 }),
                 "num_parallel_tree is 0, outside [1, 65536]");
  ExpectRejected(Edited([](J& m) {
                   Booster(m)["model"]["gbtree_model_param"]["num_trees"] = J::Str("-3");
                 }),
                 "num_trees is -3");
  ExpectRejected(Edited([](J& m) {
                   Booster(m)["model"]["gbtree_model_param"]["num_trees"] = J::Str("6 ");
                 }),
                 "not a decimal integer");
  ExpectRejected(Edited([](J& m) { Booster(m)["model"]["gbtree_model_param"].Erase("num_trees"); }),
                 "has no \"num_trees\"");
  XgboostModelLimits limits;
  limits.max_trees = 3;
  ExpectRejected(CraftedModel(), "num_trees is 6, outside [0, 3]", kClasses, kFeatures, limits);
}

TEST(CheckXgboostModel, RejectsBadTreeInfoAndIds) {
  ExpectRejected(Edited([](J& m) { Booster(m)["model"]["tree_info"].items[4] = J::Int(3); }),
                 "tree_info[4] is 3, not a class in [0, 3)");
  ExpectRejected(Edited([](J& m) { Booster(m)["model"]["tree_info"].items[1] = J::Int(-1); }),
                 "tree_info[1] is -1");
  ExpectRejected(Edited([](J& m) { Booster(m)["model"]["tree_info"].items[2] = J::Float(1); }),
                 "tree_info[2] is a float, not an integer");
  ExpectRejected(Edited([](J& m) { Tree(m, 2)["id"] = J::Int(1); }),
                 "tree 2 has id 1");
  ExpectRejected(Edited([](J& m) { Tree(m, 2).Erase("id"); }), "tree 2 has no \"id\"");
}

TEST(CheckXgboostModel, RejectsNegativeChild) {
  // The defect that makes libxgboost's prediction loop forever.
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["left_children"].ints[1] = -5; }),
                 "tree 0 node 1 has left child -5, outside [1, 7)");
  ExpectRejected(Edited([](J& m) { Tree(m, 3)["right_children"].ints[0] = -2; }),
                 "tree 3 node 0 has right child -2, outside [1, 7)");
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["right_children"].ints[3] = 4; }),
                 "tree 0 node 3 is a leaf (left child -1) with right child 4");
}

TEST(CheckXgboostModel, RejectsChildOutOfRange) {
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["left_children"].ints[2] = 7; }),
                 "tree 0 node 2 has left child 7, outside [1, 7)");
  ExpectRejected(Edited([](J& m) {
                   Tree(m, 0)["left_children"].ints[2] = 6;
                   Tree(m, 0)["right_children"].ints[2] = 7;
                 }),
                 "tree 0 node 2 has right child 7, outside [1, 7)");
  ExpectRejected(Edited([](J& m) { Tree(m, 5)["left_children"].ints[0] = 0; }),
                 "tree 5 node 0 has left child 0, outside [1, 15)");
  ExpectRejected(Edited([](J& m) { Tree(m, 5)["left_children"].ints[0] = 2147483647; }),
                 "left child 2147483647");
}

TEST(CheckXgboostModel, RejectsRightChildThatIsNotLeftPlusOne) {
  // libxgboost predicts with left + 1 for the right branch: children 1 and 2 swapped would
  // be read as a different tree from the one the arrays describe.
  ExpectRejected(Edited([](J& m) {
                   Tree(m, 0)["left_children"].ints[0] = 2;
                   Tree(m, 0)["right_children"].ints[0] = 1;
                 }),
                 "tree 0 node 0 has children 2 and 1; libxgboost 1.7.4 predicts with left "
                 "child + 1 as the right child, so it must be 3");
}

TEST(CheckXgboostModel, RejectsCycle) {
  // Node 3 (a child of node 1) points back to 1 and 2.
  ExpectRejected(Edited([](J& m) {
                   J& t = Tree(m, 0);
                   t["left_children"].ints[3] = 1;
                   t["right_children"].ints[3] = 2;
                   t["split_conditions"].floats[3] = 0.5;
                 }),
                 "tree 0 has a cycle: node 3 has child 1, which is its ancestor");
  ExpectRejected(Edited([](J& m) {
                   J& t = Tree(m, 5);
                   t["left_children"].ints[1] = 1;
                   t["right_children"].ints[1] = 2;
                 }),
                 "tree 5 has a cycle: node 1 has child 1");
}

TEST(CheckXgboostModel, RejectsSharedChild) {
  ExpectRejected(Edited([](J& m) {
                   J& t = Tree(m, 0);
                   t["left_children"].ints[2] = 3;
                   t["right_children"].ints[2] = 4;
                 }),
                 "tree 0 node 3 is a shared child: a child of both node 1 and node 2");
}

TEST(CheckXgboostModel, RejectsInconsistentParents) {
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["parents"].ints[4] = 2; }),
                 "tree 0 node 4 has parent 2 but is a child of node 1");
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["parents"].ints[0] = 0; }),
                 "tree 0 root has parent 0");
  // -1 is also a root (Node::IsRoot), though 1.7.4 writes 2147483647.
  J minus_one = Edited([](J& m) { Tree(m, 0)["parents"].ints[0] = -1; });
  ExpectPasses(ToJson(minus_one));
}

TEST(CheckXgboostModel, RejectsUnreachableNodes) {
  ExpectRejected(Edited([](J& m) {
                   J& t = Tree(m, 0);
                   t["left_children"].ints[2] = -1;
                   t["right_children"].ints[2] = -1;
                 }),
                 "tree 0 node 5 is not reachable from the root and not a deleted node");
}

TEST(CheckXgboostModel, RejectsTreesDeeperThanTheLimit) {
  std::vector<TreeSpec> trees = CraftedTrees();
  trees[2] = SpineTree(64, 2);
  ExpectPasses(ToUbj(GbtreeJ(trees)));
  trees[2] = SpineTree(65, 2);
  ExpectRejected(GbtreeJ(trees),
                 "tree 2 is deeper than 64 levels (the limit): node 129 is at depth 65");
  XgboostModelLimits limits;
  limits.max_tree_depth = 2;
  ExpectRejected(CraftedModel(), "tree 2 is deeper than 2 levels", kClasses, kFeatures, limits);
}

TEST(CheckXgboostModel, RejectsSplitIndexOutOfRange) {
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["split_indices"].ints[1] = kFeatures; }),
                 "tree 0 node 1 has split index 4, not a feature in [0, 4)");
  ExpectRejected(Edited([](J& m) { Tree(m, 5)["split_indices"].ints[6] = -1; }),
                 "tree 5 node 6 has split index -1");
  // A leaf's split index is not read at prediction, but the deleted marker is refused.
  ExpectRejected(Edited([](J& m) {
                   Tree(m, 0)["split_indices"].ints[3] = 2147483647;
                   Tree(m, 0)["default_left"].ints[3] = 1;
                 }),
                 "tree 0 leaf 3 has split index 2147483647");
  // The model, not the problem, says how many features there are.
  ExpectRejectedBytes(ToJson(CraftedModel()), "features", kClasses, kFeatures - 1);
}

TEST(CheckXgboostModel, RejectsNonFiniteFloats) {
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  const double kInf = std::numeric_limits<double>::infinity();
  ExpectRejected(Edited([&](J& m) { Tree(m, 0)["split_conditions"].floats[3] = kNan; }),
                 "tree 0 node 3 has leaf value nan");
  ExpectRejected(Edited([&](J& m) { Tree(m, 1)["split_conditions"].floats[2] = -kInf; }),
                 "tree 1 node 2 has leaf value -inf");
  ExpectRejected(Edited([&](J& m) { Tree(m, 1)["split_conditions"].floats[0] = kInf; }),
                 "tree 1 node 0 has split condition inf");
  ExpectRejected(Edited([&](J& m) { Tree(m, 3)["base_weights"].floats[5] = kNan; }),
                 "tree 3 node 5 has base_weights nan");
  ExpectRejected(Edited([&](J& m) { Tree(m, 3)["loss_changes"].floats[0] = kInf; }),
                 "tree 3 node 0 has loss_changes inf");
  ExpectRejected(Edited([&](J& m) { Tree(m, 4)["sum_hessian"].floats[0] = kNan; }),
                 "tree 4 node 0 has sum_hessian nan");
  // A JSON float too large for a float is infinite for libxgboost (strtof).
  std::string json = ToJson(CraftedModel());
  const std::string leaf = FloatText(CraftedTrees()[4].split_condition[0]);
  const std::string needle = "\"split_conditions\":[" + leaf + "]";
  ASSERT_NE(json.find(needle), std::string::npos) << needle;
  json.replace(json.find(needle), needle.size(), "\"split_conditions\":[1E39]");
  ExpectRejectedBytes(json, "tree 4 node 0 has leaf value inf");
}

TEST(CheckXgboostModel, RejectsWrongClassesAndFeatures) {
  ExpectRejectedBytes(ToJson(CraftedModel()), "the model has 3 classes", kClasses + 1, kFeatures);
  ExpectRejectedBytes(ToUbj(CraftedModel()), "the problem has 2 arms", 2, kFeatures);
  ExpectRejectedBytes(ToJson(CraftedModel()), "the model has 4 features", kClasses, 5);
  ExpectRejectedBytes(Trained().linear_ubj, "the model has 4 features", kClasses, 3);
  ExpectRejected(Edited([](J& m) {
                   m["learner"]["objective"]["softmax_multiclass_param"]["num_class"] =
                       J::Str("4");
                 }),
                 "softmax_multiclass_param.num_class is 4 but the model has 3 classes");
  ExpectRejected(Edited([](J& m) { Tree(m, 1)["tree_param"]["num_feature"] = J::Str("5"); }),
                 "tree 1: tree_param.num_feature is 5 but the model has 4 features");
  ExpectRejected(Edited([](J& m) {
                   m["learner"]["learner_model_param"]["num_feature"] = J::Str("0");
                 }),
                 "features", kClasses, 0);
  ExpectRejected(Edited([](J& m) {
                   m["learner"]["learner_model_param"]["num_target"] = J::Str("2");
                 }),
                 "num_target is 2");
}

TEST(CheckXgboostModel, RejectsWrongObjectiveAndBooster) {
  for (const char* objective : {"binary:logistic", "multi:softmax", "reg:squarederror", ""}) {
    ExpectRejected(Edited([&](J& m) { m["learner"]["objective"]["name"] = J::Str(objective); }),
                   absl::StrCat("the objective is '", objective,
                                "'; a stochastic expert needs multi:softprob"));
  }
  ExpectRejected(Edited([](J& m) { Booster(m)["name"] = J::Str("dart"); }),
                 "the booster is dart, which is not accepted");
  ExpectRejected(Edited([](J& m) { Booster(m)["name"] = J::Str("gbtree_"); }),
                 "the booster is 'gbtree_'");
  ExpectRejected(Edited([](J& m) { Booster(m)["name"] = J::Int(1); }),
                 "learner.gradient_booster.name is an integer, not a string");
  // The real trained ones (the expert's tests use the same).
  const std::string softmax = TrainModel(
      [] {
        Params p = TreeParams(3);
        p[1].second = "multi:softmax";
        return p;
      }(),
      "ubj", 2);
  ExpectRejectedBytes(softmax, "multi:softprob");
}

TEST(CheckXgboostModel, RejectsCategoricalSplits) {
  ExpectRejected(Edited([](J& m) { Tree(m, 3)["split_type"].ints[1] = 1; }),
                 "tree 3 node 1 is a categorical split (split_type 1); categorical splits "
                 "are not accepted");
  ExpectRejected(Edited([](J& m) {
                   J& t = Tree(m, 0);
                   t["categories_nodes"].ints = {0};
                   t["categories_segments"].ints = {0};
                   t["categories_sizes"].ints = {1};
                   t["categories"].ints = {2};
                 }),
                 "tree 0 has categorical split data");
  ExpectRejected(Edited([](J& m) { Tree(m, 0).Erase("categories"); }),
                 "tree 0 has no categories");
}

TEST(CheckXgboostModel, RejectsEveryPerNodeArrayOfTheWrongLength) {
  for (const std::string key : {"left_children", "right_children", "parents", "split_indices",
                                "split_conditions", "split_type", "default_left", "base_weights",
                                "loss_changes", "sum_hessian"}) {
    SCOPED_TRACE(key);
    ExpectRejected(Edited([&](J& m) { Tree(m, 5)[key].PopBack(); }),
                   absl::StrCat("tree 5: ", key, " has 14 entries, tree_param.num_nodes is 15"));
    if (key == "split_type") continue;  // optional: models before 1.6 have none
    ExpectRejected(Edited([&](J& m) { Tree(m, 5).Erase(key); }),
                   absl::StrCat("tree 5 has no ", key));
  }
  ExpectRejected(Edited([](J& m) { Tree(m, 1)["tree_param"]["num_nodes"] = J::Str("4"); }),
                 "tree 1: loss_changes has 3 entries, tree_param.num_nodes is 4");
  ExpectRejected(Edited([](J& m) { Tree(m, 1)["tree_param"]["num_nodes"] = J::Str("0"); }),
                 "tree_param.num_nodes is 0, outside [1, 1048576]");
  XgboostModelLimits limits;
  limits.max_total_nodes = 30;
  ExpectRejected(CraftedModel(), "more than 30 nodes in all", kClasses, kFeatures, limits);
}

TEST(CheckXgboostModel, RejectsWrongArrayTypes) {
  // A typed tree (loss_changes is typed) must be typed throughout, with the element types
  // RegTree::LoadModel reads; a generic tree must hold integers and floats where it reads
  // them.
  J model = CraftedModel();
  J generic_left = Edited([](J& m) { Untype(&Tree(m, 0)["left_children"]); });
  ExpectRejectedBytes(ToUbj(generic_left),
                      "tree 0: left_children is an array, not a typed array of int32");
  ExpectRejectedBytes(
      ToUbj(Edited([](J& m) { Tree(m, 0)["left_children"].t = J::T::kI64s; })),
      "left_children is a typed array of int64, not a typed array of int32");
  ExpectRejectedBytes(
      ToUbj(Edited([](J& m) { Tree(m, 0)["default_left"].t = J::T::kI32s; })),
      "default_left is a typed array of int32, not a typed array of uint8");
  J untyped = CraftedModel();
  Untype(&untyped);
  Tree(untyped, 0)["parents"] = J::Ints(J::T::kI32s, Tree(model, 0)["parents"].ints);
  ExpectRejectedBytes(ToUbj(untyped), "tree 0: parents is a typed array, not an array");
  J integer_float = CraftedModel();
  Untype(&integer_float);
  Tree(integer_float, 1)["sum_hessian"].items[1] = J::Int(3);
  ExpectRejected(integer_float,
                 "tree 1: sum_hessian[1] is an integer; libxgboost 1.7.4 reads only floats");
  J float_int = CraftedModel();
  Untype(&float_int);
  Tree(float_int, 1)["left_children"].items[0] = J::Float(1);
  ExpectRejected(float_int, "tree 1: left_children[0] is a float, not an integer");
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["default_left"].ints[0] = 2; }),
                 "tree 0 node 0 has default_left 2, not 0 or 1");
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["tree_param"]["num_nodes"] = J::Int(7); }),
                 "tree_param.num_nodes is an integer, not a string");
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["tree_param"]["extra"] = J::Int(7); }),
                 "tree_param.extra is an integer, not a string");
  ExpectRejected(Edited([](J& m) { Tree(m, 0)["tree_param"]["size_leaf_vector"] = J::Str("1"); }),
                 "size_leaf_vector is 1");
}

TEST(CheckXgboostModel, RejectsBadLearnerFields) {
  ExpectRejected(Edited([](J& m) {
                   m["learner"]["learner_model_param"]["base_score"] = J::Str("NaN");
                 }),
                 "base_score is \"NaN\", not a finite float");
  ExpectRejected(Edited([](J& m) {
                   m["learner"]["learner_model_param"]["base_score"] = J::Str("1E39");
                 }),
                 "not a finite float");
  ExpectRejected(Edited([](J& m) { m["learner"].Erase("attributes"); }),
                 "learner has no \"attributes\"");
  ExpectRejected(Edited([](J& m) { m["learner"]["attributes"]["best_iteration"] = J::Int(3); }),
                 "learner.attributes.best_iteration is an integer, not a string");
  ExpectRejected(Edited([](J& m) { m["learner"]["feature_names"].items.push_back(J::Int(1)); }),
                 "learner.feature_names[0] is an integer, not a string");
  ExpectRejected(Edited([](J& m) { m.Erase("version"); }), "has no \"version\"");
  ExpectRejected(Edited([](J& m) { m["version"].PopBack(); }), "version has 2 entries");
  ExpectRejected(Edited([](J& m) { m.Erase("learner"); }), "the document has no \"learner\"");
  ExpectRejected(Edited([](J& m) { m["learner"] = J::Arr(); }),
                 "learner is an array, not an object");
}

TEST(CheckXgboostModel, RejectsBadLinearModels) {
  ExpectRejected(Edited([](J& m) { Booster(m)["model"]["weights"].PopBack(); },
                        CraftedLinearModel()),
                 "weights has 14 entries, not (num_feature + 1) * num_class = 15");
  ExpectRejected(Edited([](J& m) {
                   Booster(m)["model"]["weights"].floats[7] =
                       std::numeric_limits<double>::quiet_NaN();
                 },
                        CraftedLinearModel()),
                 "weights[7] is nan");
  ExpectRejected(Edited([](J& m) { Booster(m)["model"].Erase("weights"); }, CraftedLinearModel()),
                 "has no \"weights\"");
  ExpectRejected(Edited([](J& m) { Booster(m)["model"]["boosted_rounds"] = J::Int(-1); },
                        CraftedLinearModel()),
                 "boosted_rounds is -1");
  ExpectRejectedBytes(ToJson(CraftedLinearModel()), "classes", 4, kFeatures);
}

TEST(CheckXgboostModel, RejectsDuplicateKeysAndTrailingBytes) {
  // libxgboost's JSON reader keeps the last of two equal keys, its UBJSON reader the first.
  J duplicate = CraftedModel();
  J& tree = Tree(duplicate, 0);
  const J copy = tree["left_children"];
  tree.keys.push_back("left_children");
  tree.items.push_back(copy);
  ExpectRejected(duplicate, "the key \"left_children\" twice");
  ExpectRejectedBytes(ToJson(CraftedModel()) + "x", "bytes follow the end of the document");
  ExpectRejectedBytes(ToUbj(CraftedModel()) + "Z", "bytes follow the end of the document");
}

TEST(CheckXgboostModel, JsonWhitespaceAfterTheDocumentIsAccepted) {
  ExpectPasses(ToJson(CraftedModel()) + " \n");
}

TEST(CheckXgboostModel, RejectsMalformedJson) {
  const std::string head = "{\"learner\":";
  ExpectRejectedBytes(head + "[ ]}", "unexpected character");  // JsonReader refuses "[ ]"
  ExpectRejectedBytes(head + "[1,]}", "unexpected character");
  ExpectRejectedBytes(head + "01}", "leading zero");
  ExpectRejectedBytes(head + "1.}", "digit after '.'");
  ExpectRejectedBytes(head + "1e}", "digit in an exponent");
  ExpectRejectedBytes(head + "+1}", "unexpected character");
  ExpectRejectedBytes(head + "-NaN}", "expected a digit");
  ExpectRejectedBytes(head + "9223372036854775808}", "overflows int64");
  ExpectRejectedBytes(head + "1e400}", "out of range");
  ExpectRejectedBytes(head + "\"a\\/b\"}", "the escape \\/");
  ExpectRejectedBytes(head + "\"a\tb\"}", "byte 0x9 inside a string");
  ExpectRejectedBytes(head + "\"a\xff\"}", "byte 0xff inside a string");
  ExpectRejectedBytes(head + "\"abc}", "not terminated");
  ExpectRejectedBytes(head + "tru}", "expected true, false or null");
  ExpectRejectedBytes(head + "{\"a\" 1}}", "expected ':'");
  ExpectRejectedBytes(head + "{\"a\":1 \"b\":2}}", "expected ',' or '}'");
  ExpectRejectedBytes(head + "{1:2}}", "expected '\"' to start a key");
  ExpectRejectedBytes("{\"a\":1}", "the document has no \"version\"");
  ExpectRejectedBytes("{\"learner\": 1, \"version\": [1, 7, 4]}", "learner is an integer");
  ExpectRejectedBytes("{}", "neither JSON");
  ExpectRejectedBytes("{ }", "neither JSON");
  ExpectRejectedBytes("not a model at all", "legacy binary");
  ExpectRejectedBytes("", "legacy binary");
}

TEST(CheckXgboostModel, KeysWithEscapesAreReadAsLibxgboostReadsThem) {
  // JsonReader keeps "\u" and the four characters after it as they are, so
  // "le\u0066t_children" is not "left_children" for libxgboost, nor for the check.
  std::string json = ToJson(CraftedModel());
  const size_t at = json.find("\"left_children\"");
  ASSERT_NE(at, std::string::npos);
  json.replace(at, 15, "\"le\\u0066t_children\"");
  ExpectRejectedBytes(json, "tree 0 has no left_children");
  EXPECT_FALSE(LibxgboostLoads(json));
  // Escapes libxgboost does read are decoded before keys are compared.
  std::string escaped = ToJson(CraftedModel());
  const size_t name = escaped.find("\"attributes\"");
  ASSERT_NE(name, std::string::npos);
  escaped.replace(name, 12, "\"attri\\tbutes\"");
  ExpectRejectedBytes(escaped, "learner has no \"attributes\"");
}

TEST(CheckXgboostModel, RejectsBadArguments) {
  const std::string model = ToJson(CraftedModel());
  EXPECT_EQ(CheckXgboostModel(model, 0, kFeatures).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckXgboostModel(model, kClasses, -1).code(), absl::StatusCode::kInvalidArgument);
  for (int field = 0; field < 6; ++field) {
    XgboostModelLimits limits;
    switch (field) {
      case 0: limits.max_nesting_depth = 0; break;
      case 1: limits.max_values = -1; break;
      case 2: limits.max_trees = 0; break;
      case 3: limits.max_nodes_per_tree = 0; break;
      case 4: limits.max_total_nodes = 0; break;
      case 5: limits.max_tree_depth = -3; break;
    }
    const absl::Status status = CheckXgboostModel(model, kClasses, kFeatures, limits);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(status.message()), HasSubstr("limits")) << field;
  }
}

// ---------------------------------------------------------------------------------------
// Agreement with libxgboost on bytes it refuses safely (an error, not a crash).

TEST(CheckXgboostModel, LibxgboostRefusesWhatTheCheckRefusesForTypeErrors) {
  J integer_float = CraftedModel();
  Untype(&integer_float);
  Tree(integer_float, 1)["sum_hessian"].items[1] = J::Int(3);
  J generic_left = Edited([](J& m) { Untype(&Tree(m, 0)["left_children"]); });
  J short_loss = Edited([](J& m) { Tree(m, 2)["loss_changes"].PopBack(); });
  J zero_nodes = Edited([](J& m) { Tree(m, 1)["tree_param"]["num_nodes"] = J::Str("0"); });
  J no_attributes = Edited([](J& m) { m["learner"].Erase("attributes"); });
  J short_version = Edited([](J& m) { m["version"].PopBack(); });
  J unknown_objective = Edited([](J& m) { m["learner"]["objective"]["name"] = J::Str("x"); });
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"integer in a float array", ToJson(integer_float)},
      {"generic array in a typed tree", ToUbj(generic_left)},
      {"loss_changes too short", ToJson(short_loss)},
      {"num_nodes 0", ToUbj(zero_nodes)},
      {"no attributes", ToJson(no_attributes)},
      {"version of two", ToJson(short_version)},
      {"unknown objective", ToUbj(unknown_objective)},
      {"[ ] with a space", [] {
         std::string json = ToJson(CraftedModel());
         json.replace(json.find("\"feature_names\":[]"), 18, "\"feature_names\":[ ]");
         return json;
       }()},
      {"float64 marker", [] {
         // The version's first integer (i 1) as a float64 1.0.
         std::string ubj = ToUbj(CraftedModel());
         std::string version = UbjKey("version") + "[#L";
         PutBigEndian(3, 8, &version);
         version += "i";
         version.push_back('\x01');
         const size_t at = ubj.find(version);
         if (at == std::string::npos) return std::string();
         std::string f64 = "D";
         PutBigEndian(0x3ff0000000000000, 8, &f64);
         ubj.replace(at + version.size() - 2, 2, f64);
         return ubj;
       }()},
  };
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    ASSERT_FALSE(bytes.empty());
    EXPECT_FALSE(CheckXgboostModel(bytes, kClasses, kFeatures).ok());
    EXPECT_FALSE(LibxgboostLoads(bytes));
  }
}

// ---------------------------------------------------------------------------------------
// Random mutations of valid models: the check never crashes, and what it accepts
// libxgboost loads and predicts with.

TEST(CheckXgboostModel, MutatedModelsNeverCrashAndWhatPassesPredicts) {
  std::mt19937 gen(20240611);
  const std::vector<std::string> seeds = {ToJson(CraftedModel()), ToUbj(CraftedModel()),
                                          Trained().small_json, Trained().small_ubj};
  int accepted = 0, loaded = 0;
  for (const std::string& seed : seeds) {
    for (int round = 0; round < 1500; ++round) {
      std::string bytes = seed;
      const int edits = 1 + static_cast<int>(gen() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at = gen() % bytes.size();
        switch (gen() % 4) {
          case 0: bytes[at] = static_cast<char>(gen() & 0xff); break;
          case 1: bytes[at] = "0123456789-,[]{}\":1"[gen() % 19]; break;
          case 2: bytes.erase(at, 1 + gen() % 8); break;
          case 3: bytes.insert(at, bytes.substr(gen() % bytes.size(), 1 + gen() % 8)); break;
        }
        if (bytes.empty()) bytes = "{";
      }
      const absl::Status status = CheckXgboostModel(bytes, kClasses, kFeatures);
      if (!status.ok()) {
        ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
        continue;
      }
      ++accepted;
      auto expert = MakeXgboostExpert(kClasses, kFeatures, bytes, 0.0);
      // The check accepts only what libxgboost loads.
      ASSERT_TRUE(expert.ok()) << expert.status();
      ++loaded;
      std::vector<double> probs(kClasses);
      for (int i = 0; i < 20; ++i) {
        EXPECT_TRUE((*expert)->Predict(Row(i), absl::MakeSpan(probs)).ok());
      }
    }
  }
  // Most mutations are refused; some (a changed digit of a float) are not.
  std::printf("mutated models: %d of %zu accepted by the check, %d of those loaded\n",
              accepted, 1500 * seeds.size(), loaded);
  EXPECT_GT(accepted, 0);
}

// Structure-aware mutations of the crafted trees: whatever the check accepts, libxgboost
// predicts exactly what the arrays say (with right_children as the right branch). A tree
// the check wrongly accepted would hang here, crash, or predict something else.
TEST(CheckXgboostModel, StructuralMutationsThatPassPredictAsTheirArraysSay) {
  std::mt19937 gen(7);
  int accepted = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<TreeSpec> trees = CraftedTrees();
    TreeSpec& s = trees[gen() % trees.size()];
    const int n = s.Size();
    const int v = static_cast<int>(gen() % n);
    const int64_t candidates[] = {-5, -1, 0, 1, 2, v, v + 1, n - 1, n, n + 1,
                                  static_cast<int64_t>(gen() % n), 2147483647};
    const int64_t value = candidates[gen() % 12];
    switch (gen() % 6) {
      case 0: s.left[v] = value; break;
      case 1: s.right[v] = value; break;
      case 2: s.parent[v] = value; break;
      case 3: s.split_index[v] = value; break;
      case 4:  // a consistent edit: node v becomes a split into (value, value + 1)
        s.left[v] = value;
        s.right[v] = value + 1;
        break;
      case 5:  // the children swapped: still a tree, but not one libxgboost reads as such
        std::swap(s.left[v], s.right[v]);
        break;
    }
    const std::string bytes = gen() % 2 ? ToJson(GbtreeJ(trees)) : ToUbj(GbtreeJ(trees));
    if (!CheckXgboostModel(bytes, kClasses, kFeatures).ok()) continue;
    ++accepted;
    auto expert = MakeXgboostExpert(kClasses, kFeatures, bytes, 0.0);
    ASSERT_TRUE(expert.ok()) << expert.status();
    std::vector<double> probs(kClasses);
    for (int i = 0; i < kRows; i += 29) {
      ASSERT_TRUE((*expert)->Predict(Row(i), absl::MakeSpan(probs)).ok());
      const std::vector<double> want = ExpectedProbabilities(trees, Row(i));
      for (int k = 0; k < kClasses; ++k) ASSERT_NEAR(probs[k], want[k], 1e-6) << round;
    }
  }
  // Edits that keep a tree (a leaf's split index, a root parent of -1, ...) pass.
  std::printf("structural mutations accepted by the check: %d of 3000\n", accepted);
  EXPECT_GT(accepted, 100);
  EXPECT_LT(accepted, 3000);
}

// ---------------------------------------------------------------------------------------
// The legacy binary format: refused by the check, converted in the sandbox.

TEST(ConvertXgboostModelToUbjson, LegacyModelsConvertToCheckedUbjsonThatPredictsTheSame) {
  const TrainedModels& m = Trained();
  for (const std::string* legacy : {&m.tree_legacy, &m.linear_legacy}) {
    ASSERT_FALSE(legacy->empty());
    ExpectRejectedBytes(*legacy, "legacy binary format is checked after conversion; see "
                                 "ConvertXgboostModelToUbjson");
    absl::StatusOr<std::string> converted = ConvertXgboostModelToUbjson(*legacy);
    ASSERT_TRUE(converted.ok()) << converted.status();
    EXPECT_EQ(DetectXgboostModelFormat(*converted), XgboostModelFormat::kUbjson);
    ExpectPasses(*converted);
    const std::vector<float> before = RawPredict(*legacy, 50);
    const std::vector<float> after = RawPredict(*converted, 50);
    ASSERT_EQ(before.size(), 50u * kClasses);
    EXPECT_EQ(before, after);
    auto expert = MakeXgboostExpert(kClasses, kFeatures, *converted, 0.0);
    ASSERT_TRUE(expert.ok()) << expert.status();
    std::vector<double> probs(kClasses);
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE((*expert)->Predict(Row(i), absl::MakeSpan(probs)).ok());
      for (int k = 0; k < kClasses; ++k) {
        EXPECT_NEAR(probs[k], before[i * kClasses + k], 1e-6) << i;
      }
    }
  }
}

TEST(ConvertXgboostModelToUbjson, ConvertsJsonAndUbjsonToo) {
  for (const std::string* bytes : {&Trained().tree_json, &Trained().tree_ubj}) {
    absl::StatusOr<std::string> converted = ConvertXgboostModelToUbjson(*bytes);
    ASSERT_TRUE(converted.ok()) << converted.status();
    ExpectPasses(*converted);
    EXPECT_EQ(RawPredict(*bytes, 30), RawPredict(*converted, 30));
  }
}

TEST(ConvertXgboostModelToUbjson, RefusesWhatLibxgboostRefuses) {
  for (const std::string& bytes : {std::string(), std::string("not a model at all"),
                                   std::string("{\"learner\": 1}")}) {
    absl::StatusOr<std::string> converted = ConvertXgboostModelToUbjson(bytes);
    EXPECT_EQ(converted.status().code(), absl::StatusCode::kInvalidArgument)
        << converted.status();
  }
}

// ---------------------------------------------------------------------------------------
// The fuzzer's seed corpus.

// The crafted defects kept as files, named by defect.
std::vector<std::pair<std::string, std::string>> CorpusFiles() {
  std::vector<std::pair<std::string, std::string>> files = {
      {"valid_trained.json", Trained().small_json},
      {"valid_trained.ubj", Trained().small_ubj},
      {"valid_crafted_linear.json", ToJson(CraftedLinearModel())},
      {"negative_child.json",
       ToJson(Edited([](J& m) { Tree(m, 0)["left_children"].ints[1] = -5; }))},
      {"child_out_of_range.ubj",
       ToUbj(Edited([](J& m) { Tree(m, 0)["left_children"].ints[2] = 7; }))},
      {"right_not_left_plus_one.json", ToJson(Edited([](J& m) {
         Tree(m, 0)["left_children"].ints[0] = 2;
         Tree(m, 0)["right_children"].ints[0] = 1;
       }))},
      {"cycle.json", ToJson(Edited([](J& m) {
         Tree(m, 0)["left_children"].ints[3] = 1;
         Tree(m, 0)["right_children"].ints[3] = 2;
       }))},
      {"shared_child.ubj", ToUbj(Edited([](J& m) {
         Tree(m, 0)["left_children"].ints[2] = 3;
         Tree(m, 0)["right_children"].ints[2] = 4;
       }))},
      {"tree_count_mismatch.json", ToJson(Edited([](J& m) {
         Booster(m)["model"]["gbtree_model_param"]["num_trees"] = J::Str("9");
       }))},
      {"tree_info_short.ubj",
       ToUbj(Edited([](J& m) { Booster(m)["model"]["tree_info"].PopBack(); }))},
      {"split_index_out_of_range.json",
       ToJson(Edited([](J& m) { Tree(m, 0)["split_indices"].ints[1] = kFeatures; }))},
      {"nan_leaf.ubj", ToUbj(Edited([](J& m) {
         Tree(m, 0)["split_conditions"].floats[3] = std::numeric_limits<double>::quiet_NaN();
       }))},
      {"categorical_split.json",
       ToJson(Edited([](J& m) { Tree(m, 3)["split_type"].ints[1] = 1; }))},
      {"array_length_mismatch.ubj",
       ToUbj(Edited([](J& m) { Tree(m, 5)["parents"].PopBack(); }))},
      {"dart.json", ToJson(Edited([](J& m) { Booster(m)["name"] = J::Str("dart"); }))},
      {"duplicate_key.ubj", [] {
         J m = CraftedModel();
         m.keys.push_back("learner");
         m.items.push_back(CraftedLinearModel()["learner"]);
         return ToUbj(m);
       }()},
      {"deep_nesting.json", "{\"learner\":" + std::string(100, '[') + std::string(100, ']') + "}"},
      {"deep_nesting.ubj", "{" + UbjKey("learner") + std::string(100, '[') +
                               std::string(100, ']') + "}"},
      {"huge_count.ubj", UbjArrayWithCount("[$d#L", uint64_t{1} << 60)},
      {"truncated.ubj", Trained().small_ubj.substr(0, Trained().small_ubj.size() / 2)},
  };
  return files;
}

std::string CorpusDir() { return DECISION_SOURCE_DIR "/tests/fuzz/corpus/xgboost_model"; }

TEST(FuzzCorpus, FilesAreJudgedAsNamed) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(CorpusDir())) {
    const std::string name = entry.path().filename().string();
    ++files;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream content;
    content << in.rdbuf();
    const std::string bytes = content.str();
    EXPECT_LE(bytes.size(), 8192u) << name << ": keep seed files small";
    const absl::Status status = CheckXgboostModel(bytes, kClasses, kFeatures);
    if (name.rfind("valid_", 0) == 0) {
      EXPECT_TRUE(status.ok()) << name << ": " << status;
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name << ": " << status;
    }
  }
  EXPECT_GE(files, static_cast<int>(CorpusFiles().size()));
}

}  // namespace
}  // namespace decision

#ifdef DECISION_WRITE_XGBOOST_FUZZ_CORPUS
// write_xgboost_fuzz_corpus DIR: writes CorpusFiles() into DIR (not a test).
int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR (tests/fuzz/corpus/xgboost_model)\n", argv[0]);
    return 2;
  }
  for (const auto& [name, bytes] : decision::CorpusFiles()) {
    std::ofstream out(std::string(argv[1]) + "/" + name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (bytes.empty() || !out.good()) {
      std::fprintf(stderr, "%s: cannot write %zu bytes\n", name.c_str(), bytes.size());
      return 1;
    }
  }
  return 0;
}
#endif
