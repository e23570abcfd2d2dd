// What security costs (bench/README.md, "Security"):
//   - authorization on every RPC (server/auth.h): the open mode of development, against a
//     tokens file of 1, 100 and 10,000 tokens (the hash of the presented token, a
//     shared-pointer copy under a mutex, one hash-map lookup);
//   - registering an XGBoost model through the sandbox (server/model_sandbox.h: spawn
//     decision_model_probe, which checks, loads and scores it) against checking, loading
//     and scoring it in-process, for the trained seed model of the fuzz corpus.
//
//   build/bench/security_bench
#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/xgboost_expert.h"
#include "server/auth.h"
#include "server/model_sandbox.h"

namespace decision::server {
namespace {

std::string TokensFile(int n) {
  const std::string path = absl::StrCat("/tmp/auth_bench_tokens_", n, ".txt");
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    out << "t" << i << " decide,observe sha256:" << Sha256Hex(absl::StrCat("token-", i))
        << "\n";
  }
  return path;
}

void BM_AuthorizeOpen(benchmark::State& state) {
  auto auth = Authorizer::Open("");
  const std::string header = "Bearer token-0";
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        (*auth)->Authorize(&header, Role::kDecide, "problem", absl::Now()));
  }
}
BENCHMARK(BM_AuthorizeOpen);

void BM_AuthorizeToken(benchmark::State& state) {
  const std::string path = TokensFile(static_cast<int>(state.range(0)));
  auto auth = Authorizer::Open(path);
  if (!auth.ok()) {
    state.SkipWithError("tokens file");
    return;
  }
  const std::string header = "Bearer token-0";
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        (*auth)->Authorize(&header, Role::kDecide, "problem", absl::Now()));
  }
  std::remove(path.c_str());
}
BENCHMARK(BM_AuthorizeToken)->Arg(1)->Arg(100)->Arg(10000);

std::string SeedModel() {
  std::ifstream in(DECISION_SOURCE_DIR "/tests/fuzz/corpus/xgboost_model/valid_trained.json");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void BM_ModelInProcess(benchmark::State& state) {
  const std::string model = SeedModel();
  const std::vector<double> rows = ProbeRows({}, 4, 0);
  std::vector<double> probs(rows.size() / 4 * 3);
  for (auto _ : state) {
    auto expert = MakeXgboostExpert(3, 4, model);
    if (!expert.ok() || !(*expert)->PredictBatch(rows, rows.size() / 4, absl::MakeSpan(probs)).ok()) {
      state.SkipWithError("model");
      return;
    }
  }
}
BENCHMARK(BM_ModelInProcess)->Unit(benchmark::kMillisecond);

void BM_ModelThroughSandbox(benchmark::State& state) {
  const std::string model = SeedModel();
  ModelSandboxOptions options;
  options.probe_path = DECISION_MODEL_PROBE_PATH;
  const ModelSandbox sandbox(options);
  ModelProbeRequest request;
  request.num_arms = 3;
  request.num_features = 4;
  request.model = model;
  request.rows = ProbeRows({}, 4, 0);
  for (auto _ : state) {
    if (!sandbox.Check(request).ok()) {
      state.SkipWithError("sandbox");
      return;
    }
  }
}
BENCHMARK(BM_ModelThroughSandbox)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace decision::server

BENCHMARK_MAIN();
