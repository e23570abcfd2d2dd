// expert_model_fuzz: the loaders of every model kind, from bytes. The bytes are parsed as
// the wire decision.v1.ExpertModel (what RegisterExpert receives), converted with
// ModelRecordFromWire, or as the on-disk storage.v1.ExpertModelRecord (what a restart reads
// back), then BuildExpert (server/conversions.h) builds the expert for a few problem shapes
// and it predicts on fixed contexts: a loader must refuse with INVALID_ARGUMENT or give an
// expert whose every prediction is a distribution (finite, summing to 1). XGBoost models go
// through CheckXgboostModel inside BuildExpert.
//
// Input: byte 0 picks the message (even: wire, odd: record) and the shape (byte / 2 % 4,
// kShapes below); the rest is the serialized message. Seeds: corpus/expert_model/,
// written by write_fuzz_seeds.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/conversions.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

struct Shape {
  int num_arms;
  int num_features;
  double smoothing;
};
// 3 x 4 is the shape of the XGBoost seeds; the others reach the edges ValidateExpertShape
// allows (one arm, no feature, no or full smoothing).
constexpr Shape kShapes[] = {{3, 4, 0.05}, {2, 1, 0.0}, {1, 0, 1.0}, {5, 3, 0.5}};

}  // namespace

extern "C" int DECISION_FUZZ_ENTRY(const uint8_t* data, size_t size) {
  using namespace decision;
  fuzz::Input in(data, size);
  const uint8_t selector = in.Byte();
  const Shape& shape = kShapes[selector / 2 % 4];
  const absl::string_view bytes = in.Rest();
  storage::v1::ExpertModelRecord record;
  if (selector % 2 == 0) {
    v1::ExpertModel wire;
    if (!wire.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
    absl::StatusOr<storage::v1::ExpertModelRecord> converted =
        server::ModelRecordFromWire(wire);
    if (!converted.ok()) {
      FUZZ_CHECK(converted.status().code() == absl::StatusCode::kInvalidArgument, "%s",
                 converted.status().ToString().c_str());
      return 0;
    }
    record = *std::move(converted);
  } else if (!record.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return 0;
  }
  absl::StatusOr<std::unique_ptr<Expert>> expert =
      server::BuildExpert(record, shape.num_arms, shape.num_features, shape.smoothing);
  if (!expert.ok()) {
    FUZZ_CHECK(expert.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               expert.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK((*expert)->num_arms() == shape.num_arms &&
                 (*expert)->num_features() == shape.num_features,
             "built a %d x %d expert for a %d x %d problem", (*expert)->num_arms(),
             (*expert)->num_features(), shape.num_arms, shape.num_features);
  fuzz::CheckPredictions(**expert, absl::StrCat("model of kind ", record.kind_case()));
  return 0;
}
