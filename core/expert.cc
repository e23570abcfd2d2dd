#include "core/expert.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/kernels.h"

namespace decision {
namespace {

class UniformExpert final : public Expert {
 public:
  UniformExpert(int num_arms, int num_features) : Expert(num_arms, num_features, 0.0) {}
  const char* kind() const override { return "uniform"; }

 protected:
  absl::Status PredictRaw(absl::Span<const double>, size_t,
                          absl::Span<double> probs) const override {
    std::fill(probs.begin(), probs.end(), 1.0 / num_arms());
    return absl::OkStatus();
  }
};

class TableExpert final : public Expert {
 public:
  TableExpert(int num_arms, int num_features, std::vector<double> table, int num_rows,
              int key_feature, double smoothing)
      : Expert(num_arms, num_features, smoothing),
        table_(std::move(table)),
        num_rows_(num_rows),
        key_feature_(key_feature) {}
  const char* kind() const override { return "table"; }

 protected:
  absl::Status PredictRaw(absl::Span<const double> rows, size_t n,
                          absl::Span<double> probs) const override {
    const int k = num_arms();
    for (size_t i = 0; i < n; ++i) {
      int row = 0;
      if (num_rows_ > 1) {
        const double key = rows[i * num_features() + key_feature_];
        if (!(key >= 0.0 && key < num_rows_)) {
          return absl::InvalidArgumentError(
              absl::StrCat("table expert: key feature ", key_feature_, " = ", key,
                           " is outside the table's rows [0, ", num_rows_, ")"));
        }
        row = static_cast<int>(key);
      }
      std::copy_n(table_.begin() + static_cast<size_t>(row) * k, k, probs.begin() + i * k);
    }
    return absl::OkStatus();
  }

 private:
  const std::vector<double> table_;  // num_rows_ x num_arms, row-major
  const int num_rows_;
  const int key_feature_;
};

class LinearSoftmaxExpert final : public Expert {
 public:
  LinearSoftmaxExpert(int num_arms, int num_features, const std::vector<double>& weights,
                      std::vector<double> bias, double temperature, double smoothing)
      : Expert(num_arms, num_features, smoothing),
        weights_t_(Transpose(weights, num_arms, num_features)),
        bias_(std::move(bias)),
        inv_temperature_(1.0 / temperature) {}
  const char* kind() const override { return "linear_softmax"; }

 protected:
  absl::Status PredictRaw(absl::Span<const double> rows, size_t n,
                          absl::Span<double> probs) const override {
    const int k = num_arms();
    const int d = num_features();
    for (size_t i = 0; i < n; ++i) {
      const absl::Span<double> out = probs.subspan(i * k, k);
      LinearLogits(weights_t_, bias_, rows.subspan(i * d, d), out);
      for (int v = 0; v < k; ++v) {
        out[v] *= inv_temperature_;
        if (!std::isfinite(out[v])) {
          return absl::InvalidArgumentError(absl::StrCat(
              "linear_softmax expert: the logit of arm ", v, " overflows for this context"));
        }
      }
      SoftmaxInPlace(out);
    }
    return absl::OkStatus();
  }

 private:
  static std::vector<double> Transpose(const std::vector<double>& w, int k, int d) {
    std::vector<double> t(w.size());
    for (int v = 0; v < k; ++v) {
      for (int f = 0; f < d; ++f) {
        t[static_cast<size_t>(f) * k + v] = w[static_cast<size_t>(v) * d + f];
      }
    }
    return t;
  }

  const std::vector<double> weights_t_;  // d x K, row-major: the K x d weights transposed
  const std::vector<double> bias_;
  const double inv_temperature_;
};

absl::Status CheckAllFinite(absl::Span<const double> v, const char* what) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "] = ", v[i], " is not a finite number"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateExpertShape(int num_arms, int num_features, double smoothing) {
  if (num_arms < 1 || num_arms > kMaxArms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "number of arms must be in [1, ", kMaxArms, "], got ", num_arms));
  }
  if (num_features < 0 || num_features > kMaxFeatures) {
    return absl::InvalidArgumentError(absl::StrCat(
        "number of features must be in [0, ", kMaxFeatures, "], got ", num_features));
  }
  if (!(smoothing >= 0.0 && smoothing <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("smoothing eta must be in [0, 1], got ", smoothing));
  }
  return absl::OkStatus();
}

absl::Status ValidateContext(absl::Span<const double> x, int num_features) {
  if (x.size() != static_cast<size_t>(num_features)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context has ", x.size(), " features, expected ", num_features));
  }
  return CheckAllFinite(x, "feature");
}

absl::Status Expert::Predict(absl::Span<const double> x, absl::Span<double> probs) const {
  return PredictBatch(x, 1, probs);
}

absl::Status Expert::PredictRawChecked(absl::Span<const double> rows, size_t n,
                                       absl::Span<double> probs) const {
  // Sizes are compared by division so that a huge n cannot wrap around.
  const bool rows_match = num_features_ == 0
                              ? rows.empty()
                              : rows.size() % num_features_ == 0 &&
                                    rows.size() / num_features_ == n;
  if (!rows_match) {
    return absl::InvalidArgumentError(
        absl::StrCat("context batch has ", rows.size(), " values, expected ", n, " rows x ",
                     num_features_, " features"));
  }
  if (probs.size() % num_arms_ != 0 || probs.size() / num_arms_ != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output has ", probs.size(), " slots, expected ", n, " x ", num_arms_, " arms"));
  }
  if (n == 0) return absl::OkStatus();
  if (absl::Status s = CheckAllFinite(rows, "feature"); !s.ok()) return s;
  return PredictRaw(rows, n, probs);
}

absl::Status Expert::PredictBatch(absl::Span<const double> rows, size_t n,
                                  absl::Span<double> probs) const {
  if (absl::Status s = PredictRawChecked(rows, n, probs); !s.ok()) return s;
  Smooth(probs);
  return absl::OkStatus();
}

absl::Status Expert::PredictEligible(absl::Span<const double> x,
                                     absl::Span<const int32_t> eligible,
                                     absl::Span<double> probs) const {
  const absl::Span<const int32_t> one[1] = {eligible};
  return PredictBatchEligible(x, 1, one, probs);
}

absl::Status Expert::PredictBatchEligible(absl::Span<const double> rows, size_t n,
                                          absl::Span<const absl::Span<const int32_t>> eligible,
                                          absl::Span<double> probs) const {
  if (eligible.empty()) return PredictBatch(rows, n, probs);
  if (eligible.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(eligible.size(), " eligible-arm sets for ", n, " rows"));
  }
  // Ascending, so that a set is checked in O(|E|), not O(K), per row.
  for (size_t r = 0; r < n; ++r) {
    const absl::Span<const int32_t> e = eligible[r];
    for (size_t i = 0; i < e.size(); ++i) {
      if (e[i] < 0 || e[i] >= num_arms_) {
        return absl::InvalidArgumentError(absl::StrCat("row ", r, ": eligible arm ", e[i],
                                                       " (entry ", i, ") is not an arm in [0, ",
                                                       num_arms_, ")"));
      }
      if (i > 0 && e[i] <= e[i - 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat("row ", r, ": eligible arms are not ascending at entry ", i, " (",
                         e[i], " after ", e[i - 1], ")"));
      }
    }
  }
  if (absl::Status s = PredictRawChecked(rows, n, probs); !s.ok() || n == 0) return s;
  for (size_t r = 0; r < n; ++r) {
    RestrictToEligible(eligible[r], smoothing_, probs.subspan(r * num_arms_, num_arms_));
  }
  return absl::OkStatus();
}

absl::Status ValidateEligibleArms(absl::Span<const int32_t> arms, int num_arms) {
  if (arms.empty()) return absl::OkStatus();
  std::vector<bool> seen(num_arms, false);
  for (size_t i = 0; i < arms.size(); ++i) {
    const int32_t a = arms[i];
    if (a < 0 || a >= num_arms) {
      return absl::InvalidArgumentError(absl::StrCat("eligible arm ", a, " (entry ", i,
                                                     ") is not an arm in [0, ", num_arms, ")"));
    }
    if (seen[a]) {
      return absl::InvalidArgumentError(
          absl::StrCat("eligible arm ", a, " is listed twice (entry ", i, ")"));
    }
    seen[a] = true;
  }
  return absl::OkStatus();
}

void RestrictToEligible(absl::Span<const int32_t> eligible, double smoothing,
                        absl::Span<double> probs) {
  const size_t k = probs.size();
  if (eligible.empty() || eligible.size() == k) {
    // Every arm: the plain smoothing (the same bits as Expert::Smooth).
    if (smoothing == 0.0) return;
    const double floor = smoothing / static_cast<double>(k);
    const double keep = 1.0 - smoothing;
    for (double& p : probs) p = keep * p + floor;
    return;
  }
  if (eligible.size() == 1) {  // certain (the sum below could round to 1 - 2^-53)
    std::fill(probs.begin(), probs.end(), 0.0);
    probs[eligible[0]] = 1.0;
    return;
  }
  double mass = 0.0;
  for (const int32_t a : eligible) mass += probs[a];
  const double floor = smoothing / static_cast<double>(eligible.size());
  // No mass on E (or a non-finite sum): uniform over E.
  const bool uniform = !(mass > 0.0 && std::isfinite(mass));
  const double keep = uniform ? 0.0 : (1.0 - smoothing) / mass;
  const double base = uniform ? 1.0 / static_cast<double>(eligible.size()) : floor;
  // Written through a copy of the eligible values: `probs` is cleared first.
  double kept[64];
  std::vector<double> heap;
  double* values = kept;
  if (eligible.size() > 64) {
    heap.resize(eligible.size());
    values = heap.data();
  }
  for (size_t i = 0; i < eligible.size(); ++i) values[i] = probs[eligible[i]];
  std::fill(probs.begin(), probs.end(), 0.0);
  // At most 1, whatever the rounding.
  for (size_t i = 0; i < eligible.size(); ++i) {
    probs[eligible[i]] = std::min(1.0, keep * values[i] + base);
  }
}

void Expert::Smooth(absl::Span<double> probs) const {
  if (smoothing_ == 0.0) return;
  const double floor = smoothing_ / num_arms_;
  const double keep = 1.0 - smoothing_;
  for (double& p : probs) p = keep * p + floor;
}

absl::StatusOr<std::unique_ptr<Expert>> MakeUniformExpert(int num_arms, int num_features) {
  if (absl::Status s = ValidateExpertShape(num_arms, num_features, 0.0); !s.ok()) return s;
  return std::unique_ptr<Expert>(new UniformExpert(num_arms, num_features));
}

absl::StatusOr<std::unique_ptr<Expert>> MakeTableExpert(int num_arms, int num_features,
                                                        std::vector<std::vector<double>> rows,
                                                        int key_feature, double smoothing) {
  if (absl::Status s = ValidateExpertShape(num_arms, num_features, smoothing); !s.ok()) {
    return s;
  }
  if (rows.empty()) {
    return absl::InvalidArgumentError("table expert: the table has no rows");
  }
  if (rows.size() > 1 && (key_feature < 0 || key_feature >= num_features)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table expert: key feature ", key_feature, " is not a feature index in [0, ",
                     num_features, ")"));
  }
  std::vector<double> table;
  table.reserve(rows.size() * num_arms);
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<double>& row = rows[r];
    if (row.size() != static_cast<size_t>(num_arms)) {
      return absl::InvalidArgumentError(absl::StrCat("table expert: row ", r, " has ",
                                                     row.size(), " entries, expected ",
                                                     num_arms, " (one per arm)"));
    }
    double total = 0.0;
    for (int v = 0; v < num_arms; ++v) {
      if (!std::isfinite(row[v]) || row[v] < 0.0) {
        return absl::InvalidArgumentError(
            absl::StrCat("table expert: row ", r, " arm ", v, " has probability ", row[v],
                         "; probabilities must be finite and non-negative"));
      }
      total += row[v];
    }
    if (std::abs(total - 1.0) > 1e-6) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table expert: row ", r, " sums to ", total, "; a distribution must sum to 1"));
    }
    for (double p : row) table.push_back(p / total);
  }
  const int num_rows = static_cast<int>(rows.size());
  return std::unique_ptr<Expert>(
      new TableExpert(num_arms, num_features, std::move(table), num_rows, key_feature,
                      smoothing));
}

absl::StatusOr<std::unique_ptr<Expert>> MakeLinearSoftmaxExpert(
    int num_arms, int num_features, std::vector<double> weights, std::vector<double> bias,
    double temperature, double smoothing) {
  if (absl::Status s = ValidateExpertShape(num_arms, num_features, smoothing); !s.ok()) {
    return s;
  }
  const size_t want = static_cast<size_t>(num_arms) * num_features;
  if (weights.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "linear_softmax expert: ", weights.size(), " weights, expected ", num_arms,
        " arms x ", num_features, " features = ", want));
  }
  if (bias.size() != static_cast<size_t>(num_arms)) {
    return absl::InvalidArgumentError(absl::StrCat("linear_softmax expert: ", bias.size(),
                                                   " biases, expected ", num_arms,
                                                   " (one per arm)"));
  }
  if (absl::Status s = CheckAllFinite(weights, "linear_softmax expert: weight"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAllFinite(bias, "linear_softmax expert: bias"); !s.ok()) return s;
  if (!(std::isfinite(temperature) && temperature > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "linear_softmax expert: temperature must be finite and > 0, got ", temperature));
  }
  return std::unique_ptr<Expert>(new LinearSoftmaxExpert(
      num_arms, num_features, std::move(weights), std::move(bias), temperature, smoothing));
}

int SampleArm(absl::Span<const double> probs, double u) {
  double cumulative = 0.0;
  int last_positive = 0;
  for (size_t v = 0; v < probs.size(); ++v) {
    if (probs[v] <= 0.0) continue;
    last_positive = static_cast<int>(v);
    cumulative += probs[v];
    if (u < cumulative) return last_positive;
  }
  return last_positive;
}

}  // namespace decision
