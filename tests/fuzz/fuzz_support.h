// What the fuzz targets of tests/fuzz/ share: the entry point's name, a check that aborts
// (so that libFuzzer, or the replay test, reports the input), a small reader of the fuzzer's
// bytes, and the property every expert must keep whatever it was built from.
//
// Each target is one file, <name>_fuzz.cc, that defines
//   extern "C" int DECISION_FUZZ_ENTRY(const uint8_t* data, size_t size);
// tests/fuzz/CMakeLists.txt names the entry LLVMFuzzerTestOneInput in a fuzzing build and
// DecisionFuzz_<name> in the replay test (fuzz_corpus_test.cc), so that the targets can be
// linked into one executable.
#ifndef DECISION_TESTS_FUZZ_FUZZ_SUPPORT_H_
#define DECISION_TESTS_FUZZ_FUZZ_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "core/expert.h"

// Aborts with a message if `condition` is false: a finding. Never use it for what the input
// may legitimately cause (an error status is fine; a crash, a hang or a broken invariant is
// not).
#define FUZZ_CHECK(condition, ...)                                          \
  do {                                                                      \
    if (!(condition)) {                                                     \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__,      \
                   __LINE__, #condition);                                   \
      std::fprintf(stderr, __VA_ARGS__);                                    \
      std::fprintf(stderr, "\n");                                           \
      std::abort();                                                         \
    }                                                                       \
  } while (0)

namespace decision::fuzz {

// Reads the fuzzer's bytes front to back. Past the end, every read returns zeros/empty.
class Input {
 public:
  Input(const uint8_t* data, size_t size)
      : rest_(reinterpret_cast<const char*>(data), size) {}
  uint8_t Byte() {
    if (rest_.empty()) return 0;
    const uint8_t b = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return b;
  }
  // A length byte n, then n bytes (fewer if the input ends).
  absl::string_view Chunk() { return Take(Byte()); }
  // Two length bytes (little-endian), then that many bytes.
  absl::string_view LongChunk() {
    const size_t n = Byte();
    return Take(n | static_cast<size_t>(Byte()) << 8);
  }
  absl::string_view Rest() {
    const absl::string_view all = rest_;
    rest_ = {};
    return all;
  }
  bool empty() const { return rest_.empty(); }
  // The next n bytes (fewer if the input ends).
  absl::string_view Take(size_t n) {
    const absl::string_view part = rest_.substr(0, n);
    rest_.remove_prefix(part.size());
    return part;
  }

 private:
  absl::string_view rest_;
};

// Predicts with `expert` on a fixed set of contexts (zeros, small integers, which index the
// rows of a table expert, fractions, negatives, huge and tiny magnitudes) and aborts unless
// every prediction that succeeds is a probability distribution: num_arms finite entries in
// [0, 1] summing to 1 (within 1e-9), each at least smoothing / num_arms. A prediction may
// fail with INVALID_ARGUMENT (a table key outside the table, a logit that overflows), never
// with another code. `what` names the expert in the message.
void CheckPredictions(const Expert& expert, const std::string& what);

}  // namespace decision::fuzz

#endif  // DECISION_TESTS_FUZZ_FUZZ_SUPPORT_H_
