// The literal reference implementation of the paper's estimators: each estimate is
// recomputed from scratch from the first t samples of the log, following eq. est1 / est2
// and their widths term by term, with no incremental state. It is the oracle the
// incremental estimators in core/ are tested against, and the baseline of the benchmarks.
// Cost O(N + t) per expert and call, O(N t) for all experts: for tests and baselines only.
#ifndef DECISION_TESTS_REFERENCE_ESTIMATORS_H_
#define DECISION_TESTS_REFERENCE_ESTIMATORS_H_

#include <cstdint>

#include "core/divergence.h"
#include "core/estimator.h"
#include "core/sample_log.h"

namespace decision::reference {

// Clipped estimator (eq. est1) of expert k from samples [0, t), with its width (eq. ucb1).
ExpertEstimate Clipped(const SampleLog& log, int64_t t, const DivergenceMatrix& d,
                       const EstimatorOptions& options, int k);

// Median-of-means estimator (eq. est2) of expert k from samples [0, t), with its width.
// With first > 0, the estimate of an expert whose window starts at sample `first`: its
// groups keep only samples s >= first, groups left empty are not in the median, and the
// width's t is t - first (Estimator::NewExpertRows).
ExpertEstimate MedianOfMeans(const SampleLog& log, int64_t t, const DivergenceMatrix& d,
                             const EstimatorOptions& options, int k, int64_t first = 0);

// Dispatches on options.kind.
ExpertEstimate Estimate(const SampleLog& log, int64_t t, const DivergenceMatrix& d,
                        const EstimatorOptions& options, int k);

}  // namespace decision::reference

#endif  // DECISION_TESTS_REFERENCE_ESTIMATORS_H_
