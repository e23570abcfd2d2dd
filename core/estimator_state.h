// The byte form of an estimator's state (Estimator::Snapshot, RestoreEstimator): a flat
// little-endian encoding of integers, doubles and length-prefixed arrays, written and read
// in the same order by each estimator. The reader never trusts the bytes: every length is
// checked against what is left (and against a caller's bound) before anything is sized,
// so damaged bytes give DATA_LOSS, never a read out of bounds or a huge allocation.
// Internal to core: the server stores the bytes as they are (storage/records.proto).
#ifndef DECISION_CORE_ESTIMATOR_STATE_H_
#define DECISION_CORE_ESTIMATOR_STATE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/divergence.h"

namespace decision::internal {

// "DES" + format version; then one byte of EstimatorKind. Version 2 added round-robin
// median of means' windows, version 3 its retired experts; states of versions 1 (no
// windows) and 2 (nothing retired) are still read.
inline constexpr char kStateMagic[4] = {'D', 'E', 'S', '3'};
inline constexpr int kStateVersion = 3;

class StateWriter {
 public:
  explicit StateWriter(std::string* out) : out_(*out) {}
  void Int(int64_t v) { Raw(&v, sizeof(v)); }
  void Double(double v) { Raw(&v, sizeof(v)); }
  template <typename T>
  void Array(const std::vector<T>& v) {
    Int(static_cast<int64_t>(v.size()));
    if (!v.empty()) Raw(v.data(), v.size() * sizeof(T));
  }
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }

 private:
  static_assert(sizeof(double) == 8 && sizeof(int64_t) == 8);
  std::string& out_;
};

class StateReader {
 public:
  explicit StateReader(absl::string_view in) : in_(in) {}

  bool Int(int64_t* v) { return Raw(v, sizeof(*v)); }
  bool Double(double* v) { return Raw(v, sizeof(*v)); }
  // An array of exactly `expected` elements (its stored length must say so).
  template <typename T>
  bool Array(std::vector<T>* v, int64_t expected) {
    int64_t n;
    if (!Int(&n) || n != expected || n < 0 ||
        static_cast<uint64_t>(n) > in_.size() / sizeof(T)) {
      return Fail("an array of the wrong length");
    }
    v->resize(static_cast<size_t>(n));
    return n == 0 || Raw(v->data(), static_cast<size_t>(n) * sizeof(T));
  }
  // An array of at most `max` elements, whatever its length.
  template <typename T>
  bool ArrayUpTo(std::vector<T>* v, int64_t max) {
    int64_t n;
    if (!Int(&n) || n < 0 || n > max || static_cast<uint64_t>(n) > in_.size() / sizeof(T)) {
      return Fail("an array of the wrong length");
    }
    v->resize(static_cast<size_t>(n));
    return n == 0 || Raw(v->data(), static_cast<size_t>(n) * sizeof(T));
  }
  bool Raw(void* p, size_t n) {
    if (in_.size() < n) return Fail("truncated");
    std::memcpy(p, in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool Fail(absl::string_view why) {
    if (error_.empty()) error_ = std::string(why);
    return false;
  }
  bool AtEnd() const { return in_.empty(); }
  // The format version of the header (1 to kStateVersion), set by the reader of the header.
  int version() const { return version_; }
  void set_version(int version) { version_ = version; }

  // DATA_LOSS naming the first failure (or trailing bytes).
  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(
        "the estimator state is damaged: ", what, ": ", error_.empty() ? "bad value" : error_));
  }

 private:
  absl::string_view in_;
  std::string error_;
  int version_ = kStateVersion;
};

// Whether every value of `v` is finite and in [low, high].
inline bool AllWithin(const std::vector<double>& v, double low, double high) {
  for (double x : v) {
    if (!(x >= low && x <= high)) return false;  // NaN fails too
  }
  return true;
}
inline constexpr double kAnyFinite = 1.7976931348623157e308;

// The most experts a state may say it has: bounds what a damaged count can make a reader
// expect (the service allows 256).
inline constexpr int64_t kMaxStateExperts = 1 << 14;

inline void WriteDivergences(StateWriter& out, const DivergenceMatrix& d) {
  out.Int(d.num_experts);
  out.Array(d.m);
  out.Array(d.sigma);
}
// Reads a matrix of experts in [0, kMaxStateExperts]; its entries are checked by the caller
// (ValidateDivergenceMatrix).
inline bool ReadDivergences(StateReader& in, DivergenceMatrix* d) {
  int64_t n;
  if (!in.Int(&n) || n < 0 || n > kMaxStateExperts) return in.Fail("a bad number of experts");
  d->num_experts = static_cast<int>(n);
  return in.Array(&d->m, n * n) && in.Array(&d->sigma, n * n);
}

}  // namespace decision::internal

#endif  // DECISION_CORE_ESTIMATOR_STATE_H_
