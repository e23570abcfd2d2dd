// A GoogleTest fixture that owns a temporary data directory and a decisiond process on it
// (tests/decisiond_process.h), with a client stub.
#ifndef DECISION_TESTS_DECISIOND_FIXTURE_H_
#define DECISION_TESTS_DECISIOND_FIXTURE_H_

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/decisiond_process.h"

namespace decision::testing {

class DecisiondTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override {
    process_.reset();  // SIGKILL if a test left it running
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Starts decisiond on dir_ (seed 1, plus `flags`) and a client stub for it.
  void StartServer(const std::vector<std::string>& flags = {}) {
    std::vector<std::string> all = {"--seed=1"};
    all.insert(all.end(), flags.begin(), flags.end());
    absl::StatusOr<std::unique_ptr<DecisiondProcess>> p = DecisiondProcess::Start(dir_, all);
    ASSERT_TRUE(p.ok()) << p.status();
    process_ = *std::move(p);
    stub_ = process_->NewStub();
  }

  // The whole joined log of `problem`, in join order; a failed stream fails the test.
  std::vector<v1::LoggedSample> ExportLog(const std::string& problem) {
    v1::ExportLogRequest request;
    request.set_problem_id(problem);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::unique_ptr<grpc::ClientReader<v1::LoggedSample>> reader =
        stub_->ExportLog(&ctx, request);
    std::vector<v1::LoggedSample> out;
    v1::LoggedSample sample;
    while (reader->Read(&sample)) out.push_back(sample);
    EXPECT_GRPC_OK(reader->Finish());
    return out;
  }

  std::string dir_;
  std::unique_ptr<DecisiondProcess> process_;
  std::unique_ptr<v1::DecisionService::Stub> stub_;
};

}  // namespace decision::testing

#endif  // DECISION_TESTS_DECISIOND_FIXTURE_H_
