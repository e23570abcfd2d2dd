// The replay test of the fuzz targets: every file of corpus/<target>/ goes through its
// target's entry point, as libFuzzer would give it. A target aborts (FUZZ_CHECK, a
// sanitizer report in the ASan build, a crash) on a finding, which ends this test with a
// failure; so every seed and every crash input kept as a regression input is checked by
// the normal ctest run and by the ASan stage of deploy/test.sh, without clang or libFuzzer.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "server/clock.h"
#include "server/decision_service.h"
#include "server/metrics.h"

extern "C" int DecisionFuzz_xgboost_model(const uint8_t* data, size_t size);
extern "C" int DecisionFuzz_expert_model(const uint8_t* data, size_t size);
extern "C" int DecisionFuzz_request(const uint8_t* data, size_t size);
extern "C" int DecisionFuzz_record(const uint8_t* data, size_t size);
extern "C" int DecisionFuzz_recovery(const uint8_t* data, size_t size);

namespace decision::fuzz {
// recovery_fuzz.cc: writes a recovery input's records into a new store at `dir`.
void WriteFuzzStore(const uint8_t* data, size_t size, const std::string& dir);
}  // namespace decision::fuzz

namespace {

using Entry = int (*)(const uint8_t*, size_t);

// Runs every file of corpus/<target>/ through `entry`; returns how many there were.
int Replay(const std::string& target, Entry entry) {
  const std::filesystem::path dir = std::filesystem::path(DECISION_FUZZ_CORPUS_DIR) / target;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const std::filesystem::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream content;
    content << in.rdbuf();
    const std::string bytes = content.str();
    SCOPED_TRACE(file.string());
    // Logged first: if the target aborts, the last line names the input.
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
    EXPECT_EQ(entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
  }
  return static_cast<int>(files.size());
}

TEST(FuzzReplay, XgboostModel) { EXPECT_GT(Replay("xgboost_model", DecisionFuzz_xgboost_model), 0); }
TEST(FuzzReplay, ExpertModel) { EXPECT_GT(Replay("expert_model", DecisionFuzz_expert_model), 0); }
TEST(FuzzReplay, Request) { EXPECT_GT(Replay("request", DecisionFuzz_request), 0); }
TEST(FuzzReplay, Record) { EXPECT_GT(Replay("record", DecisionFuzz_record), 0); }
TEST(FuzzReplay, Recovery) { EXPECT_GT(Replay("recovery", DecisionFuzz_recovery), 0); }

// The crash inputs of recovery_fuzz are stores a restart must refuse: not only no crash (the
// replay above), but DATA_LOSS naming what is wrong (a key too short to hold its integers,
// a negative backfill_total).
TEST(FuzzReplay, RecoveryCrashInputsAreDataLoss) {
  const std::filesystem::path corpus = std::filesystem::path(DECISION_FUZZ_CORPUS_DIR) / "recovery";
  const std::string dir = ::testing::TempDir() + "/fuzz-replay-store";
  int crashes = 0;
  for (const auto& e : std::filesystem::directory_iterator(corpus)) {
    if (e.path().filename().string().rfind("crash-", 0) != 0) continue;
    ++crashes;
    SCOPED_TRACE(e.path().string());
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream content;
    content << in.rdbuf();
    const std::string bytes = content.str();
    std::filesystem::remove_all(dir);
    decision::fuzz::WriteFuzzStore(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                   dir);
    decision::server::FakeClock clock;
    decision::server::Metrics metrics;
    decision::server::ServiceOptions options;
    options.data_dir = dir;
    options.start_maintenance_thread = false;
    absl::StatusOr<std::unique_ptr<decision::server::DecisionService>> service =
        decision::server::DecisionService::Open(options, &clock, &metrics);
    // A record that does not parse stops the store's scan (DATA_LOSS); one that parses
    // but does not fit fails its problem alone: the service opens with it FAILED.
    if (!service.ok()) {
      EXPECT_EQ(service.status().code(), absl::StatusCode::kDataLoss) << service.status();
      continue;
    }
    decision::v1::ListProblemsResponse list;
    ASSERT_TRUE((*service)->ListProblems({}, &list).ok());
    int failed = 0;
    for (const decision::v1::Problem& p : list.problems()) {
      failed += (*service)->ProblemLoadStatus(p.problem_id()).code() ==
                absl::StatusCode::kDataLoss;
    }
    EXPECT_GT(failed, 0);
  }
  std::filesystem::remove_all(dir);
  EXPECT_GT(crashes, 0);
}

}  // namespace
