#include "core/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// Built with -fno-trapping-math (core/CMakeLists.txt): without it GCC keeps the clamp below
// as a branch and vectorises nothing. Nothing here reads floating-point exception flags.

namespace decision {

// Cody-Waite reduction x = k ln2 + r with |r| <= ln2 / 2, then the Taylor polynomial of
// exp(r) to degree 13 (truncation below 5e-18 relative; Estrin's scheme) and an exact
// scaling by 2^k built from the bits of the rounding constant, so that every step
// vectorises.
__attribute__((target_clones("avx2", "default"))) void ExpNonPositiveInPlace(
    absl::Span<double> v) {
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2, high 32 bits
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi
  constexpr double kShift = 0x1.8p52;  // adding it rounds to an integer, kept in the low bits
  int64_t shift_bits;
  std::memcpy(&shift_bits, &kShift, sizeof shift_bits);
  double* data = v.data();
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) {
    const double x = std::max(data[i], -708.0);  // NaN stays NaN
    const double t = x * kLog2e + kShift;
    const double k = t - kShift;  // round(x / ln 2), in [-1022, 0]
    const double r = (x - k * kLn2Hi) - k * kLn2Lo;
    // Estrin's scheme: the same polynomial as Horner's rule, in independent pairs joined
    // by r^2, r^4 and r^8, so that the dependency chain is 5 steps deep instead of 14.
    const double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    const double p01 = 1.0 + r;
    const double p23 = 0.5 + r * (1.0 / 6.0);
    const double p45 = 1.0 / 24.0 + r * (1.0 / 120.0);
    const double p67 = 1.0 / 720.0 + r * (1.0 / 5040.0);
    const double p89 = 1.0 / 40320.0 + r * (1.0 / 362880.0);
    const double p1011 = 1.0 / 3628800.0 + r * (1.0 / 39916800.0);
    const double p1213 = 1.0 / 479001600.0 + r * (1.0 / 6227020800.0);
    const double p03 = p01 + r2 * p23;
    const double p47 = p45 + r2 * p67;
    const double p811 = p89 + r2 * p1011;
    const double p813 = p811 + r4 * p1213;
    const double p07 = p03 + r4 * p47;
    const double p = p07 + r8 * p813;
    int64_t t_bits;
    std::memcpy(&t_bits, &t, sizeof t_bits);
    // 2^k, a normal number. Shifted unsigned: for a NaN input the exponent field is out of
    // range, and a left shift of it as int64_t would be undefined (the result is NaN
    // either way).
    const uint64_t scale_bits = static_cast<uint64_t>(t_bits - shift_bits + 1023) << 52;
    double scale;
    std::memcpy(&scale, &scale_bits, sizeof scale);
    data[i] = p * scale;
  }
}

namespace {

// Max and sum of v[0, n) over four interleaved accumulators (i mod 4): the lanes vectorise
// and the dependency chains are a quarter as long. The order is fixed, so every build gives
// the same bits. Inlined into each clone, so they are compiled for its instruction set.
// REQUIRES (max): n >= 1.
inline __attribute__((always_inline)) double InterleavedMax(const double* v, size_t n) {
  double m[4] = {v[0], v[0], v[0], v[0]};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int l = 0; l < 4; ++l) m[l] = std::max(m[l], v[i + l]);
  }
  for (; i < n; ++i) m[0] = std::max(m[0], v[i]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

inline __attribute__((always_inline)) double InterleavedSum(const double* v, size_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int l = 0; l < 4; ++l) s[l] += v[i + l];
  }
  for (; i < n; ++i) s[0] += v[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Four doubles; loads and stores through it need no alignment. The baseline build splits
// its operations into SSE2 halves.
typedef double V4 __attribute__((vector_size(32), aligned(8), may_alias));

}  // namespace

__attribute__((target_clones("avx2", "default"))) void SoftmaxInPlace(absl::Span<double> z) {
  double* data = z.data();
  const size_t n = z.size();
  const double max_z = InterleavedMax(data, n);
  for (size_t i = 0; i < n; ++i) data[i] -= max_z;
  ExpNonPositiveInPlace(z);
  const double total = InterleavedSum(data, n);
  for (size_t i = 0; i < n; ++i) data[i] /= total;
}

__attribute__((target_clones("avx2", "default"))) void DivergenceTerms(
    const double* pi_i, const double* log_pi_i, const double* pi_j, size_t rows, size_t k,
    double* scratch, double* log_f1, double* f2) {
  const size_t n = rows * k;
  double* t = scratch;       // log pi_i + ratio - 1, then shifted by its row's max
  double* q = scratch + n;   // pi_i * ratio
  for (size_t e = 0; e < n; ++e) {
    // An arm that was not eligible has pi_i = pi_j = 0: its terms are 0 (t = -inf).
    const double ratio = pi_j[e] > 0.0 ? pi_i[e] / pi_j[e] : 0.0;
    t[e] = log_pi_i[e] + ratio - 1.0;
    q[e] = pi_i[e] * ratio;
  }
  for (size_t r = 0; r < rows; ++r) {
    double* row = t + r * k;
    const double max_t = InterleavedMax(row, k);
    for (size_t v = 0; v < k; ++v) row[v] -= max_t;
    log_f1[r] = max_t;  // the shift; the log of the sum is added below
  }
  ExpNonPositiveInPlace(absl::MakeSpan(t, n));
  for (size_t r = 0; r < rows; ++r) {
    log_f1[r] += std::log(InterleavedSum(t + r * k, k));
    f2[r] = InterleavedSum(q + r * k, k);
  }
}

__attribute__((target_clones("avx2", "default"))) void LinearLogits(
    absl::Span<const double> weights_t, absl::Span<const double> bias,
    absl::Span<const double> x, absl::Span<double> z) {
  const size_t k = z.size(), d = x.size();
  const double* w = weights_t.data();
  double* out = z.data();
  // Eight arms at a time, accumulated in registers over the features (adding into `out`
  // for every feature is bound by the store-to-load round trip), then four, then one.
  // Every arm still sums bias + x_0 w_0 + x_1 w_1 + ... in that order.
  size_t v = 0;
  for (; v + 8 <= k; v += 8) {
    V4 a0 = *reinterpret_cast<const V4*>(bias.data() + v);
    V4 a1 = *reinterpret_cast<const V4*>(bias.data() + v + 4);
    for (size_t f = 0; f < d; ++f) {
      const V4 xf = {x[f], x[f], x[f], x[f]};
      const double* row = w + f * k + v;
      a0 += xf * *reinterpret_cast<const V4*>(row);
      a1 += xf * *reinterpret_cast<const V4*>(row + 4);
    }
    *reinterpret_cast<V4*>(out + v) = a0;
    *reinterpret_cast<V4*>(out + v + 4) = a1;
  }
  for (; v + 4 <= k; v += 4) {
    V4 a = *reinterpret_cast<const V4*>(bias.data() + v);
    for (size_t f = 0; f < d; ++f) {
      const V4 xf = {x[f], x[f], x[f], x[f]};
      a += xf * *reinterpret_cast<const V4*>(w + f * k + v);
    }
    *reinterpret_cast<V4*>(out + v) = a;
  }
  for (; v < k; ++v) {
    double acc = bias[v];
    for (size_t f = 0; f < d; ++f) acc += x[f] * w[f * k + v];
    out[v] = acc;
  }
}

}  // namespace decision
