#include "tests/fuzz/fuzz_support.h"

#include <xgboost/c_api.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "google/protobuf/stubs/logging.h"

namespace decision::fuzz {
namespace {

// Quiet: protobuf logs every string field with invalid UTF-8 it parses, libxgboost warns
// about old JSON models; at thousands of inputs a second the logging is most of the time.
[[maybe_unused]] const bool kQuiet = [] {
  google::protobuf::SetLogHandler(nullptr);
  XGBSetGlobalConfig("{\"verbosity\": 0}");
  return true;
}();

std::vector<std::vector<double>> Contexts(int d) {
  std::vector<std::vector<double>> contexts;
  auto add = [&](auto value_of) {
    std::vector<double> x(d);
    for (int f = 0; f < d; ++f) x[f] = value_of(f);
    contexts.push_back(std::move(x));
  };
  add([](int) { return 0.0; });
  add([](int) { return 1.0; });
  add([](int f) { return static_cast<double>(f % 3); });
  add([](int f) { return 0.25 + 0.125 * f; });
  add([](int f) { return f % 2 == 0 ? -1.5 : 2.5; });
  add([](int f) { return f % 2 == 0 ? 1e300 : -1e300; });
  add([](int) { return 5e-324; });
  add([](int f) { return f % 2 == 0 ? 3.4e38 : -7.0; });
  return contexts;
}

}  // namespace

void CheckPredictions(const Expert& expert, const std::string& what) {
  const int k = expert.num_arms();
  std::vector<double> probs(k);
  for (const std::vector<double>& x : Contexts(expert.num_features())) {
    const absl::Status s = expert.Predict(x, absl::MakeSpan(probs));
    if (!s.ok()) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, "%s (%s): Predict: %s",
                 what.c_str(), expert.kind(), s.ToString().c_str());
      continue;
    }
    const double floor = expert.smoothing() / k;
    double total = 0.0;
    for (int v = 0; v < k; ++v) {
      FUZZ_CHECK(std::isfinite(probs[v]) && probs[v] >= floor * (1 - 1e-12) &&
                     probs[v] <= 1.0 + 1e-12,
                 "%s (%s): arm %d of %d has probability %.17g (smoothing %g)", what.c_str(),
                 expert.kind(), v, k, probs[v], expert.smoothing());
      total += probs[v];
    }
    FUZZ_CHECK(std::abs(total - 1.0) <= 1e-9, "%s (%s): the %d probabilities sum to %.17g",
               what.c_str(), expert.kind(), k, total);
  }
}

}  // namespace decision::fuzz
