// The model sandbox (server/model_sandbox.h): how decisiond reads every way a probe process
// can end (stand-in probes written as shell scripts), the private protocol's decoder on
// malformed answers, and the real decision_model_probe on real and crafted models (every
// file of the fuzz corpus tests/fuzz/corpus/xgboost_model).
#include "server/model_sandbox.h"

#include <sys/stat.h>
#include <xgboost/c_api.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/xgboost_expert.h"
#include "core/xgboost_model_check.h"
#include "server/model_probe_protocol.h"
#include "tests/decisiond_process.h"

namespace decision::server {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A stand-in probe: a shell script with `body`.
std::string Script(const std::string& dir, const std::string& name, const std::string& body) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

ModelProbeRequest Request(absl::string_view model) {
  ModelProbeRequest r;
  r.num_arms = 3;
  r.num_features = 2;
  r.model = model;
  r.rows = ProbeRows({}, 2, 0);
  return r;
}

TEST(ProbeRowsTest, RealRowsFirstThenSyntheticOnesAllFinite) {
  const std::vector<double> real = {1, 2, 3, 4, 5, 6};
  const std::vector<double> rows = ProbeRows(real, 2, 2);
  ASSERT_EQ(rows.size() % 2, 0u);
  EXPECT_EQ(std::vector<double>(rows.begin(), rows.begin() + 4), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_GT(rows.size(), 4u + 2 * 8);
  for (double v : rows) EXPECT_TRUE(std::isfinite(v));
  EXPECT_TRUE(ProbeRows(real, 0, 3).empty());
}

TEST(ProbeProtocolTest, DecodesAnswersAndRefusesMalformedOnes) {
  const std::string ok = probe::EncodeResponse(absl::OkStatus(), "model-bytes");
  absl::StatusOr<std::string> decoded = probe::DecodeResponse(ok);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, "model-bytes");
  const std::string refused =
      probe::EncodeResponse(absl::InvalidArgumentError("tree 2 has a cycle"), "");
  EXPECT_EQ(probe::DecodeResponse(refused).status(),
            absl::InvalidArgumentError("tree 2 has a cycle"));
  // Every truncation, a trailing byte and a wrong magic are malformed (INTERNAL).
  for (size_t n = 0; n < ok.size(); ++n) {
    EXPECT_EQ(probe::DecodeResponse(ok.substr(0, n)).status().code(),
              absl::StatusCode::kInternal)
        << n;
  }
  EXPECT_EQ(probe::DecodeResponse(ok + "x").status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(probe::DecodeResponse("XXXX" + ok.substr(4)).status().code(),
            absl::StatusCode::kInternal);
  // A length field far past the end does not allocate it.
  std::string huge = ok;
  huge[8] = '\xff';
  EXPECT_EQ(probe::DecodeResponse(huge).status().code(), absl::StatusCode::kInternal);
}

class FakeProbeTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir(); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  absl::StatusOr<std::string> Run(const std::string& body, int64_t timeout_ms = 2000) {
    ModelSandboxOptions o;
    o.probe_path = Script(dir_, "probe", body);
    o.timeout_ms = timeout_ms;
    return ModelSandbox(o).Check(Request("model"));
  }
  std::string dir_;
};

TEST_F(FakeProbeTest, AProbeThatHangsIsKilledAtTheTimeLimit) {
  const absl::StatusOr<std::string> r = Run("exec /bin/sleep 60", 300);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("within 300 ms"));
}

TEST_F(FakeProbeTest, AProbeKilledByASignalIsReportedWithIt) {
  const absl::StatusOr<std::string> r = Run("kill -SEGV $$");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("signal 11"));
}

TEST_F(FakeProbeTest, AProbeThatExitsWithoutAnAnswerIsReported) {
  const absl::StatusOr<std::string> r = Run("exit 3");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("status 3"));
}

TEST_F(FakeProbeTest, GarbageAnswersAreMalformedAndUnreadInputIsNoDeadlock) {
  // The probe answers garbage without reading its (large) input.
  ModelSandboxOptions o;
  o.probe_path = Script(dir_, "probe", "echo garbage");
  o.timeout_ms = 5000;
  const std::string big(8 << 20, 'x');
  const absl::StatusOr<std::string> r = ModelSandbox(o).Check(Request(big));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
}

TEST_F(FakeProbeTest, AProbeThatAnswersTooMuchIsCutOff) {
  const absl::StatusOr<std::string> r = Run("exec /bin/cat /dev/zero", 5000);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("more than"));
}

TEST_F(FakeProbeTest, AMissingProbeIsTheServersFault) {
  ModelSandboxOptions o;
  o.probe_path = dir_ + "/no-such-probe";
  EXPECT_EQ(ModelSandbox(o).Check(Request("m")).status().code(), absl::StatusCode::kInternal);
}

// ------------------------------------------------------------------- the real probe

ModelSandbox RealProbe() {
  ModelSandboxOptions o;
  o.probe_path = DECISION_MODEL_PROBE_PATH;
  o.memory_mb = 1024;
  o.timeout_ms = 20'000;
  o.cpu_seconds = 20;
  return ModelSandbox(o);
}

const std::string kCorpus = std::string(DECISION_SOURCE_DIR) + "/tests/fuzz/corpus/xgboost_model";

// Every crafted model of the corpus ends in a clear refusal (or, for the few valid seeds, a
// model that checks), never a crash of this process or a hang.
TEST(RealProbeTest, EveryCorpusModelIsRefusedOrChecksOut) {
  int files = 0, refused = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kCorpus)) {
    const std::string bytes = ReadFile(entry.path());
    const std::string name = entry.path().filename();
    // The corpus is over problems of the seeds' shape; the file name says if it is valid.
    const bool valid = name.rfind("valid", 0) == 0;
    ++files;
    for (const int arms : {3}) {
      ModelProbeRequest r = Request(bytes);
      r.num_arms = arms;
      r.num_features = 4;
      r.rows = ProbeRows({}, 4, 0);
      const absl::StatusOr<std::string> checked = RealProbe().Check(r);
      if (valid) {
        EXPECT_TRUE(checked.ok()) << name << ": " << checked.status();
        if (checked.ok()) {
          EXPECT_TRUE(CheckXgboostModel(*checked, 3, 4).ok()) << name;
        }
      } else {
        ++refused;
        EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument)
            << name << ": " << checked.status();
        EXPECT_FALSE(checked.status().message().empty()) << name;
      }
    }
  }
  EXPECT_GT(files, 5);
  EXPECT_GT(refused, 5);
}

// A legacy binary model (converted from a corpus seed with libxgboost here) is converted
// to UBJSON in the probe: the answer checks, differs from the input, and predicts as the
// original does.
TEST(RealProbeTest, LegacyBinaryModelsComeBackAsCheckedUbjson) {
  const std::string json = ReadFile(kCorpus + "/valid_trained.json");
  BoosterHandle booster = nullptr;
  ASSERT_EQ(XGBoosterCreate(nullptr, 0, &booster), 0);
  ASSERT_EQ(XGBoosterLoadModelFromBuffer(booster, json.data(), json.size()), 0);
  bst_ulong len = 0;
  const char* bytes = nullptr;
  ASSERT_EQ(XGBoosterSaveModelToBuffer(booster, "{\"format\": \"deprecated\"}", &len, &bytes), 0);
  const std::string legacy(bytes, len);
  XGBoosterFree(booster);
  ASSERT_EQ(DetectXgboostModelFormat(legacy), XgboostModelFormat::kLegacyBinary);

  ModelProbeRequest r = Request(legacy);
  r.num_features = 4;
  r.rows = ProbeRows({}, 4, 0);
  const absl::StatusOr<std::string> canonical = RealProbe().Check(r);
  ASSERT_TRUE(canonical.ok()) << canonical.status();
  EXPECT_EQ(DetectXgboostModelFormat(*canonical), XgboostModelFormat::kUbjson);
  ASSERT_TRUE(CheckXgboostModel(*canonical, 3, 4).ok());
  auto from_json = MakeXgboostExpert(3, 4, json);
  auto from_probe = MakeXgboostExpert(3, 4, *canonical);
  ASSERT_TRUE(from_json.ok() && from_probe.ok());
  const size_t n = r.rows.size() / 4;
  std::vector<double> a(n * 3), b(n * 3);
  ASSERT_TRUE((*from_json)->PredictBatch(r.rows, n, absl::MakeSpan(a)).ok());
  ASSERT_TRUE((*from_probe)->PredictBatch(r.rows, n, absl::MakeSpan(b)).ok());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace decision::server
