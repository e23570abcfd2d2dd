// xgboost_model_fuzz: model bytes -> CheckXgboostModel(bytes, 3 arms, 4 features), and for
// the bytes it accepts, MakeXgboostExpert and predictions on fixed contexts. This is the
// target that tests the promise of core/xgboost_model_check.h: whatever the bytes, the
// check returns (no crash, no hang, bounded memory), and libxgboost, which trusts its
// model files, only ever sees bytes it loads and predicts with safely; the distributions
// it then gives are finite and sum to 1.
//
// Input: the model bytes, whole. Seeds: corpus/xgboost_model/ (valid_* pass the check).
// ConvertXgboostModelToUbjson is never called: it trusts its input by design (it runs in
// the model sandbox).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/strings/string_view.h"
#include "core/xgboost_expert.h"
#include "core/xgboost_model_check.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int DECISION_FUZZ_ENTRY(const uint8_t* data, size_t size) {
  using namespace decision;
  constexpr int kArms = 3;
  constexpr int kFeatures = 4;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const XgboostModelFormat format = DetectXgboostModelFormat(bytes);
  const absl::Status checked = CheckXgboostModel(bytes, kArms, kFeatures);
  if (!checked.ok()) {
    FUZZ_CHECK(checked.code() == absl::StatusCode::kInvalidArgument, "check: %s",
               checked.ToString().c_str());
    return 0;
  }
  // The check accepts JSON and UBJSON only, as DetectXgboostModelFormat tells them apart.
  FUZZ_CHECK(format != XgboostModelFormat::kLegacyBinary,
             "the check accepted bytes the dispatch reads as the legacy binary format");
  absl::StatusOr<std::unique_ptr<Expert>> expert = MakeXgboostExpert(kArms, kFeatures, bytes);
  // The check promises that what it accepts loads: a refusal by libxgboost here is a
  // difference between the check and libxgboost 1.7.4's reader.
  FUZZ_CHECK(expert.ok(), "the check accepted a model libxgboost refuses: %s",
             expert.status().ToString().c_str());
  fuzz::CheckPredictions(**expert, "xgboost model");
  return 0;
}
