// The joined samples the estimators learn from (DESIGN.md section 2): for every sample s,
// in arrival order of its reward, the expert j(s) that chose it, the reward Y_s in [0, 1],
// and for every expert k the propensity pi_k(V_s | X_s) of the arm that was played.
//
// Storage is row-major (one row of N propensities per sample) in fixed-size chunks: every
// per-reward operation reads or writes one contiguous row, and appending never copies the
// log. Registering an expert rewrites the rows with one more column (O(N t), at batch
// boundaries only). Memory: 8 (N + 1.5) bytes per sample.
//
// Thread safety: not thread-safe; callers serialise access. The exception is SharedPrefix():
// the prefix may be read by one thread while another keeps appending to the original.
#ifndef DECISION_CORE_SAMPLE_LOG_H_
#define DECISION_CORE_SAMPLE_LOG_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/chunked_rows.h"

namespace decision {

class SampleLog {
 public:
  explicit SampleLog(int num_experts = 0)
      : num_experts_(num_experts), propensity_(num_experts), count_(num_experts, 0) {}

  int num_experts() const { return num_experts_; }
  int64_t size() const { return static_cast<int64_t>(chooser_.rows()); }

  // Samples [c * kChunkSamples, (c + 1) * kChunkSamples) as shared read-only storage: one
  // row-major array per column, valid and unchanged while the log grows.
  static constexpr int64_t kChunkSamples = ChunkedRows<double>::kRowsPerChunk;
  struct SharedChunk {
    int num_experts = 0;
    std::shared_ptr<const int32_t[]> chooser;
    std::shared_ptr<const double[]> reward;
    std::shared_ptr<const double[]> propensities;  // [sample][expert]
  };
  // REQUIRES: (c + 1) * kChunkSamples <= size() (a complete chunk). O(1).
  SharedChunk Chunk(int64_t c) const {
    return {num_experts_, chooser_.SharedChunk(c), reward_.SharedChunk(c),
            propensity_.SharedChunk(c)};
  }

  // The samples stored so far, as a read-only log that shares their storage (O(size() /
  // 4096), no copy of the rows). It does not change when this log grows, gains an expert or
  // is destroyed. Append and AddExpert on it return FAILED_PRECONDITION.
  SampleLog SharedPrefix() const;

  // Appends a sample. propensities[k] = pi_k(V|X) for every expert k.
  // Returns INVALID_ARGUMENT (and appends nothing) unless 0 <= chooser < num_experts(),
  // reward is in [0, 1], propensities.size() == num_experts() and each is in (0, 1].
  absl::Status Append(int chooser, double reward, absl::Span<const double> propensities);

  // Adds an expert whose propensity for each stored sample, in order, is given.
  // Returns INVALID_ARGUMENT (and changes nothing) unless propensities.size() == size() and
  // each is in (0, 1].
  absl::Status AddExpert(absl::Span<const double> propensities);

  // REQUIRES: 0 <= s < size(), 0 <= k < num_experts().
  int chooser(int64_t s) const { return *chooser_.row(s); }
  double reward(int64_t s) const { return *reward_.row(s); }
  double propensity(int k, int64_t s) const { return propensity_.row(s)[k]; }
  // Sample s's propensities for all experts.
  const double* propensities(int64_t s) const { return propensity_.row(s); }
  // n_j: the number of samples chosen by expert j.
  int64_t count(int j) const { return count_[j]; }
  // The bytes of the rows' chunks (whole 4096-row chunks, shared ones included).
  int64_t memory_bytes() const {
    const int64_t chunks = (size() + kChunkSamples - 1) / kChunkSamples;
    return chunks * kChunkSamples * static_cast<int64_t>(4 + 8 + 8 * num_experts_);
  }

 private:
  int num_experts_;
  ChunkedRows<int32_t> chooser_;
  ChunkedRows<double> reward_;
  ChunkedRows<double> propensity_;  // [sample][expert]
  std::vector<int64_t> count_;
  bool read_only_ = false;  // a SharedPrefix(): its last chunk is still the original's
};

}  // namespace decision

#endif  // DECISION_CORE_SAMPLE_LOG_H_
