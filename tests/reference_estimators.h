// The literal reference implementation of the paper's estimators: each estimate is
// recomputed from scratch from the first t samples of the log, following eq. est1 / est2
// and their widths term by term, with no incremental state. It is the oracle the
// incremental estimators in core/ are tested against, and the baseline of the benchmarks.
// Cost O(N + t) per expert and call, O(N t) for all experts: for tests and baselines only.
#ifndef DECISION_TESTS_REFERENCE_ESTIMATORS_H_
#define DECISION_TESTS_REFERENCE_ESTIMATORS_H_

#include <cstdint>
#include <vector>

#include "core/divergence.h"
#include "core/estimator.h"
#include "core/sample_log.h"

namespace decision::reference {

// Clipped estimator (eq. est1) of expert k from samples [0, t), with its width (eq. ucb1).
ExpertEstimate Clipped(const SampleLog& log, int64_t t, const DivergenceMatrix& d,
                       const EstimatorOptions& options, int k);

// Median-of-means estimator (eq. est2) of expert k from samples [0, t), with its width.
// With first > 0 or samples in `excluded` (sorted), the estimate of an expert whose window
// starts at sample `first` and leaves those out: its groups keep only the window's
// samples, groups left empty are not in the median, and the width's t is the number of the
// window's samples (Estimator::NewExpertRows, ExpertRows::Skip).
ExpertEstimate MedianOfMeans(const SampleLog& log, int64_t t, const DivergenceMatrix& d,
                             const EstimatorOptions& options, int k, int64_t first = 0,
                             const std::vector<int64_t>& excluded = {});

// Dispatches on options.kind.
ExpertEstimate Estimate(const SampleLog& log, int64_t t, const DivergenceMatrix& d,
                        const EstimatorOptions& options, int k);

}  // namespace decision::reference

#endif  // DECISION_TESTS_REFERENCE_ESTIMATORS_H_
