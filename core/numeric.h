// Numerical building blocks of the estimators: the Lambert W function, the paper's
// w(x) inverse, log-sum-exp and the median used by every median-of-means estimate.
// Pure functions; thread-safe.
#ifndef DECISION_CORE_NUMERIC_H_
#define DECISION_CORE_NUMERIC_H_

#include <vector>

#include "absl/types/span.h"

namespace decision {

// Principal branch W0 of the Lambert W function: the w >= -1 with w * exp(w) = z.
// REQUIRES: z >= -1/e. Returns +inf for z = +inf. Accurate to a few ulps (Halley).
double LambertW0(double z);

// The paper's w(x): the y in (0, 2) with y / log(2 / y) = x, for x > 0.
// Closed form w(x) = x * W0(2 / x). w(0) = 0 and w(+inf) = 2 (the limits); w is increasing.
// REQUIRES: x >= 0.
double InverseLogRatio(double x);

// log(sum_i exp(v_i)), computed without overflow. Returns -inf for an empty span.
double LogSumExp(absl::Span<const double> v);

// Median of `v`: the middle value for an odd count, the mean of the two middle values for
// an even count. Reorders `v`. REQUIRES: !v.empty().
double MedianInPlace(absl::Span<double> v);

}  // namespace decision

#endif  // DECISION_CORE_NUMERIC_H_
