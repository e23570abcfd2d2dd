// Vectorised kernels of the experts' hot path (every Reward scores every expert).
// Each loop is written so that the compiler vectorises it; the functions are compiled for
// AVX2 and for the baseline x86-64 (SSE2) and picked at load time. Neither variant contracts
// to FMA, so both give the same bits as the plain scalar loop in the same order.
// Pure functions; thread-safe.
#ifndef DECISION_CORE_KERNELS_H_
#define DECISION_CORE_KERNELS_H_

#include "absl/types/span.h"

namespace decision {

// exp(v_i) for every entry, in place, for v_i <= 0 (shifted logits of a softmax): within
// 2 ulp of std::exp; entries below -708 give exp(-708) (~3e-308) instead of a subnormal or
// 0. Several times faster than std::exp per entry.
// REQUIRES: every v_i <= 0 (or NaN, which stays NaN).
void ExpNonPositiveInPlace(absl::Span<double> v);

// softmax(z) in place: exp(z_v - max z) / sum_u exp(z_u - max z), exp as above.
// REQUIRES: !z.empty(), every z_v finite.
void SoftmaxInPlace(absl::Span<double> z);

// z_v = bias_v + sum_f x_f * weights_t[f * K + v] for v < K = z.size(), summed in the order
// f = 0, 1, ...: weights_t is the K x d weight matrix transposed (d x K, row-major).
// REQUIRES: bias.size() == z.size(), weights_t.size() == x.size() * z.size().
void LinearLogits(absl::Span<const double> weights_t, absl::Span<const double> bias,
                  absl::Span<const double> x, absl::Span<double> z);

// The two per-context terms of the divergences between experts i and j (core/divergence.h),
// for `rows` contexts of k arms each, stored row-major:
//   log_f1[r] = log sum_v pi_i(v) exp(pi_i(v) / pi_j(v) - 1)   (in log space, exp as above)
//   f2[r]     = sum_v pi_i(v) * (pi_i(v) / pi_j(v))
// `log_pi_i` holds log pi_i. `scratch` holds 2 * rows * k values.
// An arm with pi_i(v) = pi_j(v) = 0 (not eligible for that context) adds nothing (its
// exp term is exp(-708), ~3e-308, against a sum >= 1).
// REQUIRES: every pi_i and pi_j entry in [0, 1], pi_i(v) = 0 wherever pi_j(v) = 0, and
// every row with a positive entry.
void DivergenceTerms(const double* pi_i, const double* log_pi_i, const double* pi_j,
                     size_t rows, size_t k, double* scratch, double* log_f1, double* f2);

}  // namespace decision

#endif  // DECISION_CORE_KERNELS_H_
