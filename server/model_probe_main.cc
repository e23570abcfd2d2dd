// decision_model_probe: loads and scores one untrusted XGBoost model in a process of its
// own, for decisiond's model sandbox (server/model_sandbox.h).
//
//   decision_model_probe --memory_mb=N --cpu_seconds=N  < request  > response
//
// It limits itself before it reads a byte of the model, then answers on stdout in the
// format of server/model_probe_protocol.h and exits 0. A model that crashes, hangs or
// exhausts memory here kills only this process; decisiond reports how it died.
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/xgboost_expert.h"
#include "core/xgboost_model_check.h"
#include "server/model_probe_protocol.h"

namespace {

namespace probe = decision::server::probe;

// The largest request read: a model is at most decisiond's message size (a few MB by
// default); the cap only stops a runaway parent.
constexpr uint64_t kMaxInput = uint64_t{1} << 32;

void Limit(int resource, rlim_t value) {
  const rlimit limit{value, value};
  setrlimit(resource, &limit);
}

int64_t FlagValue(int argc, char** argv, const char* name, int64_t fallback) {
  const size_t len = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, len) == 0 && argv[i][len] == '=') {
      return std::strtoll(argv[i] + len + 1, nullptr, 10);
    }
  }
  return fallback;
}

bool ReadAll(int fd, std::string* out) {
  char buffer[1 << 16];
  while (true) {
    const ssize_t r = read(fd, buffer, sizeof(buffer));
    if (r == 0) return true;
    if (r < 0) return false;
    out->append(buffer, r);
    if (out->size() > kMaxInput) return false;
  }
}

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = write(fd, data.data() + done, data.size() - done);
    if (w <= 0) return;
    done += w;
  }
}

absl::StatusOr<std::string> Probe(absl::string_view input) {
  probe::Reader r(input);
  absl::string_view magic, model;
  uint32_t num_arms = 0, num_features = 0;
  uint64_t model_len = 0, num_rows = 0;
  if (!r.Bytes(4, &magic) || magic != absl::string_view(probe::kRequestMagic, 4) ||
      !r.Get(&num_arms) || !r.Get(&num_features) || !r.Get(&model_len) || !r.Get(&num_rows) ||
      !r.Bytes(model_len, &model)) {
    return absl::InternalError("model probe: malformed request");
  }
  if (num_features == 0 || num_rows > r.left() / sizeof(double) / num_features ||
      r.left() != num_rows * num_features * sizeof(double)) {
    return absl::InternalError("model probe: the probe rows do not match the request");
  }
  std::vector<double> rows(num_rows * num_features);
  std::memcpy(rows.data(), input.data() + (input.size() - r.left()), r.left());

  std::string canonical(model);
  if (decision::DetectXgboostModelFormat(model) == decision::XgboostModelFormat::kLegacyBinary) {
    // The one step where libxgboost reads unchecked bytes: here, in the sandbox.
    absl::StatusOr<std::string> converted = decision::ConvertXgboostModelToUbjson(model);
    if (!converted.ok()) return converted.status();
    canonical = *std::move(converted);
  }
  absl::StatusOr<std::unique_ptr<decision::Expert>> expert =
      decision::MakeXgboostExpert(num_arms, num_features, canonical);
  if (!expert.ok()) return expert.status();
  std::vector<double> probs(num_rows * num_arms);
  if (absl::Status s = (*expert)->PredictBatch(rows, num_rows, absl::MakeSpan(probs)); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("xgboost expert: the model cannot score the probe contexts: ", s.message()));
  }
  for (uint64_t i = 0; i < num_rows; ++i) {
    double total = 0.0;
    for (uint32_t v = 0; v < num_arms; ++v) {
      const double p = probs[i * num_arms + v];
      if (!std::isfinite(p) || p < 0.0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "xgboost expert: probe context ", i, " gets probability ", p, " for arm ", v));
      }
      total += p;
    }
    if (std::fabs(total - 1.0) > 1e-6) {
      return absl::InvalidArgumentError(absl::StrCat(
          "xgboost expert: probe context ", i, " gets probabilities summing to ", total));
    }
  }
  return canonical;
}

}  // namespace

int main(int argc, char** argv) {
  // Limits first, before a byte of the model is read.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (Sanitizer builds reserve terabytes of shadow address space at start: an address-space
  // limit would fail their every allocation. They keep the CPU and time limits.)
  Limit(RLIMIT_AS, static_cast<rlim_t>(FlagValue(argc, argv, "--memory_mb", 2048)) << 20);
#endif
  Limit(RLIMIT_CPU, static_cast<rlim_t>(FlagValue(argc, argv, "--cpu_seconds", 20)));
  Limit(RLIMIT_FSIZE, 0);
  Limit(RLIMIT_CORE, 0);
  Limit(RLIMIT_NOFILE, 16);
  std::string input;
  if (!ReadAll(0, &input)) return 3;
  absl::StatusOr<std::string> canonical = Probe(input);
  WriteAll(1, probe::EncodeResponse(canonical.status(), canonical.ok() ? *canonical : ""));
  return 0;
}
