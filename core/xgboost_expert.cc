#include "core/xgboost_expert.h"

#include <xgboost/c_api.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/xgboost_model_check.h"

namespace decision {
namespace {

// Reads the string value of the first `"key":"value"` in a JSON text. The booster's saved
// config is machine-written JSON whose parameters are strings (learner_train_param holds
// "objective" and "booster"), so a substring scan is enough; a missing key gives "".
std::string ConfigValue(const std::string& json, absl::string_view key) {
  const std::string needle = absl::StrCat("\"", key, "\":\"");
  const size_t at = json.find(needle);
  if (at == std::string::npos) return "";
  const size_t start = at + needle.size();
  const size_t end = json.find('"', start);
  if (end == std::string::npos) return "";
  return json.substr(start, end - start);
}

}  // namespace

float XgboostFeature(double x) {
  return static_cast<float>(std::clamp(x, -static_cast<double>(FLT_MAX),
                                       static_cast<double>(FLT_MAX)));
}

namespace {

// libxgboost 1.7.4 and threads: what PredictRaw relies on, from the v1.7.4 sources.
//
// Concurrent predictions on one booster are safe once the booster is configured:
//   - src/c_api/c_api.cc XGBoosterPredictFromDense -> InplacePredictImpl ->
//     LearnerImpl::InplacePredict (src/learner.cc), and XGBoosterPredictFromDMatrix ->
//     LearnerImpl::Predict, write their results to learner->GetThreadLocal() (a
//     dmlc::ThreadLocalStore keyed by the booster: one prediction_entry and
//     prediction_shape per thread) and Predict's cache to GetPredictionCache() (also
//     thread-local). The pointers they return stay valid until this thread's next
//     prediction on this booster; PredictRaw copies them out at once.
//   - Both call LearnerConfiguration::Configure(), a double-checked lock on an atomic
//     need_configuration_ and config_lock_. MakeXgboostExpert configures the booster once,
//     with a first prediction, before the expert is shared: XGBoosterSetParam sets
//     need_configuration_ again, so nothing may call it afterwards.
//   - GBTree::InplacePredict (src/gbm/gbtree.h) is const; CPUPredictor::InplacePredict /
//     DispatchedInplacePredict (src/predictor/cpu_predictor.cc) keep their thread buffers
//     (thread_temp, workspace) on the stack; SoftmaxMultiClassObj::PredTransform
//     (src/objective/multiclass_obj.cu) transforms the thread's own output.
//   - GBLinear::PredictBatch (src/gbm/gblinear.cc) reads the model (LazyInitModel returns
//     at once for a loaded model). WART: its common::Monitor writes a map when the global
//     verbosity is 3 (debug, src/common/timer.cc); this process never sets it.
//   - Errors: API_END stores the message per thread (XGBAPIThreadLocalStore), so
//     XGBGetLastError reads this thread's.
// What is not shared: the DMatrixProxy that XGBoosterPredictFromDense fills.
// DispatchedInplacePredict writes its num_row_, and SetArrayData its adapter, so each call
// in flight has its own (Scratch below).
//
// Why the proxy is reused rather than passed as nullptr (which makes XGBoosterPredictFromDense
// create one per call): every DMatrix holds a Context (data::DMatrixProxy::ctx_,
// SimpleDMatrix::ctx_), whose constructor (GenericParameter::GenericParameter in
// src/learner.cc) calls common::GetCfsCPUCount (src/common/threading_utils.cc), which opens
// and reads /sys/fs/cgroup/cpu/cpu.cfs_quota_us and cpu.cfs_period_us: six system calls per
// prediction under cgroup v1 (strace, bench/README.md "Scoring XGBoost experts").

// The scratch of one prediction in flight: the rows as floats and, for tree boosters, the
// proxy DMatrix XGBoosterPredictFromDense attaches them to. Reused from call to call.
struct Scratch {
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (proxy != nullptr) XGDMatrixFree(proxy);
  }
  DMatrixHandle proxy = nullptr;
  std::vector<float> rows;
  std::vector<float> probs;  // the compiled forest's output
};

class XgboostExpert final : public Expert {
 public:
  XgboostExpert(int num_arms, int num_features, BoosterHandle booster, bool inplace,
                double smoothing, std::unique_ptr<const XgboostForest> forest)
      : Expert(num_arms, num_features, smoothing),
        booster_(booster),
        inplace_(inplace),
        forest_(std::move(forest)) {}
  ~XgboostExpert() override {
    free_scratch_.clear();  // the proxies before the booster
    if (booster_ != nullptr) XGBoosterFree(booster_);
  }
  const char* kind() const override { return "xgboost"; }

 protected:
  absl::Status PredictRaw(absl::Span<const double> rows, size_t n,
                          absl::Span<double> probs) const override {
    absl::StatusOr<std::unique_ptr<Scratch>> taken = TakeScratch();
    if (!taken.ok()) return taken.status();
    std::unique_ptr<Scratch> scratch = *std::move(taken);
    const absl::Status status = PredictWith(*scratch, rows, n, probs);
    ReturnScratch(std::move(scratch));
    return status;
  }

 private:
  // A free scratch, or a new one if every one is in use (so at most one per thread that
  // predicts at once). Creating a proxy reads the cgroup files once.
  absl::StatusOr<std::unique_ptr<Scratch>> TakeScratch() const {
    {
      absl::MutexLock lock(&scratch_mu_);
      if (!free_scratch_.empty()) {
        std::unique_ptr<Scratch> scratch = std::move(free_scratch_.back());
        free_scratch_.pop_back();
        return scratch;
      }
    }
    auto scratch = std::make_unique<Scratch>();
    if (inplace_ && forest_ == nullptr && XGProxyDMatrixCreate(&scratch->proxy) != 0) {
      return absl::InternalError(
          absl::StrCat("xgboost: cannot create a proxy DMatrix: ", XGBGetLastError()));
    }
    return scratch;
  }

  void ReturnScratch(std::unique_ptr<Scratch> scratch) const {
    absl::MutexLock lock(&scratch_mu_);
    free_scratch_.push_back(std::move(scratch));
  }

  absl::Status PredictWith(Scratch& scratch, absl::Span<const double> rows, size_t n,
                           absl::Span<double> probs) const {
    std::vector<float>& buffer = scratch.rows;
    buffer.resize(rows.size());
    std::transform(rows.begin(), rows.end(), buffer.begin(), XgboostFeature);
    const size_t k = num_arms();
    if (forest_ != nullptr) {
      scratch.probs.resize(n * k);
      PredictForest(*forest_, buffer.data(), n, scratch.probs.data());
      Normalise(scratch.probs.data(), n, probs);
      return absl::OkStatus();
    }
    char array_interface[256];
    std::snprintf(array_interface, sizeof(array_interface),
                  "{\"data\": [%llu, true], \"shape\": [%zu, %d], \"typestr\": \"<f4\", "
                  "\"version\": 3}",
                  static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(buffer.data())),
                  n, num_features());
    // libxgboost 1.7 requires every one of these keys.
    static constexpr char kConfig[] =
        "{\"type\": 0, \"training\": false, \"cache_id\": 0, \"iteration_begin\": 0, "
        "\"iteration_end\": 0, \"strict_shape\": true, \"missing\": NaN}";
    const bst_ulong* shape = nullptr;
    bst_ulong dims = 0;
    const float* result = nullptr;
    int rc;
    if (inplace_) {
      rc = XGBoosterPredictFromDense(booster_, array_interface, kConfig, scratch.proxy, &shape,
                                     &dims, &result);
    } else {
      // gblinear has no in-place prediction in libxgboost 1.7: go through a DMatrix.
      DMatrixHandle matrix = nullptr;
      rc = XGDMatrixCreateFromMat(buffer.data(), n, num_features(), NAN, &matrix);
      if (rc == 0) {
        rc = XGBoosterPredictFromDMatrix(booster_, matrix, kConfig, &shape, &dims, &result);
      }
      if (matrix != nullptr) XGDMatrixFree(matrix);
    }
    if (rc != 0) {
      return absl::InternalError(absl::StrCat("xgboost prediction failed: ", XGBGetLastError()));
    }
    if (dims != 2 || shape[0] != n || shape[1] != static_cast<bst_ulong>(num_arms())) {
      return absl::InternalError("xgboost prediction has an unexpected shape");
    }
    Normalise(result, n, probs);
    return absl::OkStatus();
  }

  // The n x K probabilities as doubles, renormalised (non-finite or negative entries 0).
  void Normalise(const float* result, size_t n, absl::Span<double> probs) const {
    const size_t k = num_arms();
    for (size_t i = 0; i < n; ++i) {
      double total = 0.0;
      for (size_t v = 0; v < k; ++v) {
        const double p = result[i * k + v];
        probs[i * k + v] = std::isfinite(p) && p > 0.0 ? p : 0.0;
        total += probs[i * k + v];
      }
      if (!(total > 0.0)) {
        // WART: no finite probability for this context (a diverged booster). The expert
        // plays uniformly here rather than failing every request that reaches it; the
        // trainer refuses models that do this on their training rows.
        for (size_t v = 0; v < k; ++v) probs[i * k + v] = 1.0 / k;
        continue;
      }
      for (size_t v = 0; v < k; ++v) probs[i * k + v] /= total;
    }
  }

  // Configured at load and never changed again (see above): predictions need no lock.
  const BoosterHandle booster_;  // null when forest_ predicts
  const bool inplace_;  // tree boosters predict in place; gblinear needs a DMatrix
  // A tree model's compiled form: when set, predictions never reach libxgboost.
  const std::unique_ptr<const XgboostForest> forest_;
  // Scratch not in use. The lock is held only to take or return one.
  mutable absl::Mutex scratch_mu_;
  mutable std::vector<std::unique_ptr<Scratch>> free_scratch_ ABSL_GUARDED_BY(scratch_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Expert>> MakeXgboostExpert(int num_arms, int num_features,
                                                          absl::string_view model_bytes,
                                                          double smoothing,
                                                          XgboostPredictor predictor) {
  if (absl::Status s = ValidateExpertShape(num_arms, num_features, smoothing); !s.ok()) {
    return s;
  }
  if (model_bytes.empty()) {
    return absl::InvalidArgumentError("xgboost expert: the model bytes are empty");
  }
  // libxgboost trusts model files: nothing reaches it that the check has not accepted.
  auto forest = std::make_unique<XgboostForest>();
  if (absl::Status s = CheckXgboostModel(model_bytes, num_arms, num_features, {}, forest.get());
      !s.ok()) {
    return s;
  }
  BoosterHandle booster = nullptr;
  if (XGBoosterCreate(nullptr, 0, &booster) != 0) {
    return absl::InternalError(absl::StrCat("xgboost: cannot create a booster: ",
                                            XGBGetLastError()));
  }
  auto fail = [&](absl::Status status) {
    XGBoosterFree(booster);
    return status;
  };
  if (XGBoosterLoadModelFromBuffer(booster, model_bytes.data(), model_bytes.size()) != 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "xgboost expert: the model bytes are not a loadable XGBoost model: ",
        XGBGetLastError())));
  }
  bst_ulong config_len = 0;
  const char* config_str = nullptr;
  if (XGBoosterSaveJsonConfig(booster, &config_len, &config_str) != 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("xgboost expert: cannot read the model's config: ", XGBGetLastError())));
  }
  const std::string config(config_str, config_len);
  // learner_train_param holds the objective and booster names as plain strings.
  const std::string objective = ConfigValue(config, "objective");
  if (objective != "multi:softprob") {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "xgboost expert: the model's objective is '", objective,
        "'; a stochastic expert needs multi:softprob (per-arm probabilities)")));
  }
  const std::string num_class = ConfigValue(config, "num_class");
  if (num_class != std::to_string(num_arms)) {
    return fail(absl::InvalidArgumentError(absl::StrCat("xgboost expert: the model has ",
                                                        num_class, " classes, the problem has ",
                                                        num_arms, " arms")));
  }
  bst_ulong model_features = 0;
  if (XGBoosterGetNumFeature(booster, &model_features) != 0 ||
      model_features != static_cast<bst_ulong>(num_features)) {
    return fail(absl::InvalidArgumentError(absl::StrCat("xgboost expert: the model has ",
                                                        model_features,
                                                        " features, the problem has ",
                                                        num_features)));
  }
  const std::string booster_kind = ConfigValue(config, "booster");
  // One thread per prediction: a single context is far too small to share across threads.
  // The last parameter set: predictions may run concurrently only after this.
  XGBoosterSetParam(booster, "nthread", "1");
  const bool trees = booster_kind != "gblinear";
  if (forest->num_class == 0 || predictor == XgboostPredictor::kLibxgboost) {
    forest.reset();
  } else {
    // libxgboost has loaded and accepted the model; the compiled form predicts from now
    // on, so the booster's copy of the model is not kept.
    XGBoosterFree(booster);
    booster = nullptr;
  }
  auto expert = std::make_unique<XgboostExpert>(num_arms, num_features, booster,
                                                /*inplace=*/trees, smoothing,
                                                std::move(forest));  // owns the booster from here
  // The first prediction configures the booster (LearnerConfiguration::Configure) while no
  // other thread can see it, and leaves one scratch for the next call.
  const std::vector<double> zeros(num_features, 0.0);
  std::vector<double> probs(num_arms);
  if (absl::Status s = expert->Predict(zeros, absl::MakeSpan(probs)); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "xgboost expert: the model loads but cannot predict: ", s.message()));
  }
  return std::unique_ptr<Expert>(std::move(expert));
}

absl::StatusOr<std::string> ConvertXgboostModelToUbjson(absl::string_view model_bytes) {
  if (model_bytes.empty()) {
    return absl::InvalidArgumentError("xgboost conversion: the model bytes are empty");
  }
  BoosterHandle booster = nullptr;
  if (XGBoosterCreate(nullptr, 0, &booster) != 0) {
    return absl::InternalError(absl::StrCat("xgboost: cannot create a booster: ",
                                            XGBGetLastError()));
  }
  std::string ubjson;
  absl::Status status;
  // UNCHECKED: see the header. This is the one place libxgboost reads untrusted bytes.
  if (XGBoosterLoadModelFromBuffer(booster, model_bytes.data(), model_bytes.size()) != 0) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "xgboost conversion: the model bytes are not a loadable XGBoost model: ",
        XGBGetLastError()));
  } else {
    bst_ulong len = 0;
    const char* buffer = nullptr;
    if (XGBoosterSaveModelToBuffer(booster, "{\"format\": \"ubj\"}", &len, &buffer) != 0) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "xgboost conversion: cannot save the model as UBJSON: ", XGBGetLastError()));
    } else {
      ubjson.assign(buffer, len);  // the buffer belongs to the booster: copy before freeing
    }
  }
  XGBoosterFree(booster);
  if (!status.ok()) return status;
  return ubjson;
}

}  // namespace decision
