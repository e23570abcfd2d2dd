// record_fuzz: the on-disk records a restart reads (storage/records.proto), decoded from the
// fuzzer's bytes and put, in memory, through what Problem::Load (server/recovery.cc) does
// with each: fast, no store (recovery_fuzz is the slow, faithful form with a real store).
//
// Input: byte 0 % 9 picks the record; then the ProblemRecord of the problem the record
// belongs to (2 length bytes, little-endian, then the bytes), which must pass
// CheckStoredProblem as at a restart; the rest is the record:
//   0  ProblemRecord (the rest; the first is ignored): CheckStoredProblem, and for a record
//      it accepts, the context reservoir, the estimator
//      options, DUcb, the batch schedule (NextRefresh), the first expert, the wire config;
//   1  ExpertRecord: BuildExpert with the problem's shape and the record's smoothing, as
//      LoadExperts does, then predictions (each a distribution);
//   2  CheckpointRecord: the divergence matrices and reservoir as LoadCheckpoint and
//      BuildEstimator check and use them (DUcb::FromLog, the context reservoir);
//   3  LogChunk: ChunkRowsOf's checks, the rows expanded, then every sample into a SampleLog
//      and D-UCB;
//   4  BackfillChunk: LoadBackfills' size check;
//   5  SampleRecord: RescoreTail's check, then a uniform and a table expert score it;
//   6  EventRecord: LoadPending's check of a pending event;
//   7  AuditRecord: ListAuditLog's conversion of the stored status code;
//   8  EstimatorStateRecord: RestoreEstimator's DUcb::Restore, then what a restored D-UCB
//      does (select, learn a sample, save again: the same bytes before the sample).
// Where recovery.cc checks a record, the same condition is written here (it is inline in
// the recovery steps): what passes it must then be usable without a crash.
// Seeds: corpus/record/, written by write_fuzz_seeds.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/divergence.h"
#include "core/policy.h"
#include "core/sample_log.h"
#include "server/conversions.h"
#include "server/problem.h"
#include "server/validation.h"
#include "storage/format.h"
#include "tests/fuzz/fuzz_support.h"

namespace decision::server {
namespace {

namespace rec = storage::v1;

// The experts a record's problem is taken to have (recovery knows them from the store).
constexpr int kExperts = 3;

template <typename Message>
bool Parse(absl::string_view bytes, Message* m) {
  return m->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

void Problem(const rec::ProblemRecord& r) {
  const absl::Status stored = CheckStoredProblem(r);
  FUZZ_CHECK(stored.ok() || stored.code() == absl::StatusCode::kDataLoss, "%s",
             stored.ToString().c_str());
  if (!stored.ok()) return;
  // What Problem's constructor and Problem::Load derive from the record.
  ContextReservoir reservoir(r.num_features(), r.divergence_reservoir());
  absl::StatusOr<DUcb> ducb = DUcb::Create(EstimatorOptionsOf(r), 0);
  if (ducb.ok()) {
    std::mt19937_64 gen(1);
    ducb->SelectExpert(gen);
  }
  ConfigFromRecord(r);
  for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{3} * r.num_arms(), int64_t{1000},
                    int64_t{1} << 40}) {
    NextRefresh(r, t);
  }
  MakeUniformExpert(r.num_arms(), r.num_features()).IgnoreError();
}

void Expert(const rec::ProblemRecord& r, const rec::ExpertRecord& er) {
  ExpertStatusToWire(er.status());
  if (r.num_features() > 4096) return;  // keeps an execution fast; the shape check is core's
  absl::StatusOr<std::unique_ptr<decision::Expert>> model =
      BuildExpert(er.model(), r.num_arms(), r.num_features(), er.smoothing());
  if (model.ok()) fuzz::CheckPredictions(**model, "stored expert");
}

void Checkpoint(const rec::ProblemRecord& r, const rec::CheckpointRecord& c) {
  // LoadCheckpoint.
  if (c.num_experts() < 0 || c.num_experts() > kExperts) return;
  const int n = c.num_experts();
  if (c.m_size() != n * n || c.sigma_size() != n * n) return;
  DivergenceMatrix divergences = DivergenceMatrix::Identity(n);
  divergences.m.assign(c.m().begin(), c.m().end());
  divergences.sigma.assign(c.sigma().begin(), c.sigma().end());
  const int d = r.num_features();
  const int64_t values = c.reservoir_size();
  if (values > 0 && (d == 0 || values % d != 0 || values / d > r.divergence_reservoir())) {
    return;
  }
  // BuildEstimator.
  absl::StatusOr<DUcb> ducb = DUcb::FromLog(EstimatorOptionsOf(r), SampleLog(n), divergences);
  if (ducb.ok()) {
    std::mt19937_64 gen(1);
    ducb->SelectExpert(gen);
  }
  if (values > 0 && r.divergence_reservoir() <= 65536) {
    ContextReservoir reservoir(d, r.divergence_reservoir());
    reservoir.Reset(std::vector<double>(c.reservoir().begin(), c.reservoir().end()),
                    c.reservoir_seen());
  }
}

void LogChunk(const rec::ProblemRecord& r, const rec::LogChunk& c) {
  constexpr int64_t kSamples = storage::kLogChunkSamples;
  const int width = c.num_experts();
  if (width < 0 || width > kExperts) return;
  // Problem::ChunkRowsOf's checks of the dropped (frozen) experts' columns.
  std::vector<bool> dropped(width, false);
  for (int i = 0; i < c.dropped_size(); ++i) {
    const int k = c.dropped(i);
    if (k < 0 || k >= width || (i > 0 && k <= c.dropped(i - 1))) return;
    dropped[k] = true;
  }
  const int stored = width - c.dropped_size();
  if (c.chooser_size() != kSamples || c.reward_size() != kSamples ||
      c.propensities_size() != kSamples * stored ||
      c.chooser_propensity_size() != (c.dropped_size() > 0 ? kSamples : 0)) {
    return;
  }
  // Then the full rows, as ChunkRows::Expand makes them: 1/K for a dropped expert, the
  // chooser's propensity where it chose.
  SampleLog log(width);
  std::vector<double> row(width);
  for (int i = 0; i < kSamples; ++i) {
    const int j = c.chooser(i);
    if (j < 0 || j >= width) return;  // DATA_LOSS
    int column = 0;
    for (int k = 0; k < width; ++k) {
      row[k] = dropped[k] ? 1.0 / r.num_arms() : c.propensities(i * stored + column++);
    }
    if (c.dropped_size() > 0) row[j] = c.chooser_propensity(i);
    if (!log.Append(j, c.reward(i), row).ok()) return;  // DATA_LOSS
  }
  absl::StatusOr<DUcb> ducb =
      DUcb::FromLog(EstimatorOptionsOf(r), std::move(log), DivergenceMatrix::Identity(width));
  if (ducb.ok()) {
    std::mt19937_64 gen(1);
    ducb->SelectExpert(gen);
  }
}

void Sample(const rec::ProblemRecord& r, const rec::SampleRecord& s) {
  if (s.features_size() != r.num_features() || s.arm() < 0 || s.arm() >= r.num_arms()) return;
  const absl::Span<const double> x(s.features().data(), s.features_size());
  std::vector<double> probs(r.num_arms());
  absl::StatusOr<std::unique_ptr<decision::Expert>> uniform =
      MakeUniformExpert(r.num_arms(), r.num_features());
  if (uniform.ok()) {
    const absl::Status scored = (*uniform)->Predict(x, absl::MakeSpan(probs));
    FUZZ_CHECK(scored.ok() || scored.code() == absl::StatusCode::kInvalidArgument, "%s",
               scored.ToString().c_str());
  }
  SampleLog log(1);
  log.Append(s.expert_id(), s.reward(), {probs.empty() ? 1.0 : probs[0]}).IgnoreError();
}

void EstimatorState(const rec::ProblemRecord& r, const rec::EstimatorStateRecord& s) {
  absl::StatusOr<DUcb> ducb =
      DUcb::Restore(EstimatorOptionsOf(r), s.state(),
                    {s.times_selected().begin(), s.times_selected().end()});
  FUZZ_CHECK(ducb.ok() || ducb.status().code() == absl::StatusCode::kDataLoss ||
                 ducb.status().code() == absl::StatusCode::kInvalidArgument,
             "%s", ducb.status().ToString().c_str());
  if (!ducb.ok() || ducb->num_experts() > 64) return;
  // A restored state saves as the same bytes (a state of an earlier format saves in the
  // current one, which then restores and saves as itself).
  absl::StatusOr<std::string> again = ducb->Snapshot();
  const bool first_format = s.state().size() >= 4 && s.state().compare(0, 3, "DES") == 0 &&
                            s.state()[3] >= '1' && s.state()[3] < '3';
  FUZZ_CHECK(again.ok() && (first_format || *again == s.state()),
             "a restored state saves as other bytes");
  if (first_format) {
    absl::StatusOr<DUcb> twice = DUcb::Restore(EstimatorOptionsOf(r), *again,
                                               {s.times_selected().begin(), s.times_selected().end()});
    FUZZ_CHECK(twice.ok(), "a state saved from an earlier format does not restore: %s",
               twice.status().ToString().c_str());
    absl::StatusOr<std::string> thrice = twice->Snapshot();
    FUZZ_CHECK(thrice.ok() && *thrice == *again, "an earlier format's state does not save stably");
  }
  std::mt19937_64 gen(1);
  ducb->SelectExpert(gen);
  if (ducb->num_experts() > 0) {
    ducb->Learn(0, 1.0, std::vector<double>(ducb->num_experts(), 0.5)).IgnoreError();
    ducb->SelectExpert(gen);
  }
}

void Run(uint8_t selector, const rec::ProblemRecord& r, absl::string_view bytes) {
  switch (selector % 9) {
    case 0: {
      rec::ProblemRecord record;
      if (Parse(bytes, &record)) Problem(record);
      break;
    }
    case 1: {
      rec::ExpertRecord record;
      if (Parse(bytes, &record)) Expert(r, record);
      break;
    }
    case 2: {
      rec::CheckpointRecord record;
      if (Parse(bytes, &record)) Checkpoint(r, record);
      break;
    }
    case 3: {
      rec::LogChunk record;
      if (Parse(bytes, &record)) LogChunk(r, record);
      break;
    }
    case 4: {
      rec::BackfillChunk record;
      Parse(bytes, &record);
      break;
    }
    case 5: {
      rec::SampleRecord record;
      if (Parse(bytes, &record)) Sample(r, record);
      break;
    }
    case 6: {
      rec::EventRecord record;
      Parse(bytes, &record);
      break;
    }
    case 7: {
      rec::AuditRecord record;
      if (Parse(bytes, &record)) {
        absl::StatusCodeToString(static_cast<absl::StatusCode>(record.code()));
      }
      break;
    }
    case 8: {
      rec::EstimatorStateRecord record;
      if (Parse(bytes, &record)) EstimatorState(r, record);
      break;
    }
  }
}

}  // namespace
}  // namespace decision::server

extern "C" int DECISION_FUZZ_ENTRY(const uint8_t* data, size_t size) {
  decision::fuzz::Input in(data, size);
  const uint8_t selector = in.Byte();
  decision::storage::v1::ProblemRecord problem;
  const absl::string_view problem_bytes = in.LongChunk();
  if (!problem.ParseFromArray(problem_bytes.data(), static_cast<int>(problem_bytes.size()))) {
    return 0;
  }
  // Problem::Load refuses a problem record that CreateProblem could not have written before
  // it reads any other record of the problem.
  const absl::Status stored = decision::server::CheckStoredProblem(problem);
  FUZZ_CHECK(stored.ok() || stored.code() == absl::StatusCode::kDataLoss, "%s",
             stored.ToString().c_str());
  if (!stored.ok() && selector % 9 != 0) return 0;
  decision::server::Run(selector, problem, in.Rest());
  return 0;
}
