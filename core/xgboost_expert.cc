#include "core/xgboost_expert.h"

#include <xgboost/c_api.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <mutex>
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

class XgboostExpert final : public Expert {
 public:
  XgboostExpert(int num_arms, int num_features, BoosterHandle booster, bool inplace,
                double smoothing)
      : Expert(num_arms, num_features, smoothing), booster_(booster), inplace_(inplace) {}
  ~XgboostExpert() override { XGBoosterFree(booster_); }
  const char* kind() const override { return "xgboost"; }

 protected:
  absl::Status PredictRaw(absl::Span<const double> rows, size_t n,
                          absl::Span<double> probs) const override {
    absl::MutexLock lock(&mu_);
    buffer_.resize(rows.size());
    std::transform(rows.begin(), rows.end(), buffer_.begin(), XgboostFeature);
    char array_interface[256];
    std::snprintf(array_interface, sizeof(array_interface),
                  "{\"data\": [%llu, true], \"shape\": [%zu, %d], \"typestr\": \"<f4\", "
                  "\"version\": 3}",
                  static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(buffer_.data())),
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
      rc = XGBoosterPredictFromDense(booster_, array_interface, kConfig, nullptr, &shape, &dims,
                                     &result);
    } else {
      // gblinear has no in-place prediction in libxgboost 1.7: go through a DMatrix.
      DMatrixHandle matrix = nullptr;
      rc = XGDMatrixCreateFromMat(buffer_.data(), n, num_features(), NAN, &matrix);
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
    return absl::OkStatus();
  }

 private:
  mutable absl::Mutex mu_;
  BoosterHandle booster_ ABSL_GUARDED_BY(mu_);
  const bool inplace_;  // tree boosters predict in place; gblinear needs a DMatrix
  mutable std::vector<float> buffer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Expert>> MakeXgboostExpert(int num_arms, int num_features,
                                                          absl::string_view model_bytes,
                                                          double smoothing) {
  if (absl::Status s = ValidateExpertShape(num_arms, num_features, smoothing); !s.ok()) {
    return s;
  }
  if (model_bytes.empty()) {
    return absl::InvalidArgumentError("xgboost expert: the model bytes are empty");
  }
  // libxgboost trusts model files: nothing reaches it that the check has not accepted.
  if (absl::Status s = CheckXgboostModel(model_bytes, num_arms, num_features); !s.ok()) {
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
  XGBoosterSetParam(booster, "nthread", "1");
  return std::unique_ptr<Expert>(new XgboostExpert(num_arms, num_features, booster,
                                                   /*inplace=*/booster_kind != "gblinear",
                                                   smoothing));
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
