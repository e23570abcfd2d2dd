// Security of the running decisiond (issue 13): the auth matrix (every RPC x every caller,
// with the exact status code), token reload on SIGHUP, scoped tokens, the audit log, TLS
// and mutual TLS with a certificate reload, and the refusal to serve a non-loopback address
// in plaintext or without tokens.
//
// Certificates are made at test time with the openssl command (Debian's openssl package,
// which ca-certificates brings).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "client/decision_client.h"
#include "tests/decisiond_fixture.h"

namespace decision::testing {
namespace {

using grpc::StatusCode;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The tokens of the matrix, and the file that grants them. "expired" expired in 2001.
const std::map<std::string, std::string> kTokens = {
    {"decider", "tok-decide-1"},  {"observer", "tok-observe-1"}, {"exporter", "tok-export-1"},
    {"admin", "tok-admin-1"},     {"expired", "tok-expired-1"},  {"scoped", "tok-scoped-1"},
};

std::string HashOf(const std::string& token) {
  // The same hash decisionctl hash-token prints; computed here with the openssl command so
  // that the test does not share the server's code for it.
  const std::string file = MakeTempDir() + "/t";
  WriteFile(file, token);
  const std::string out = file + ".hash";
  EXPECT_EQ(std::system(("openssl dgst -sha256 -r " + file + " > " + out).c_str()), 0);
  const std::string line = ReadText(out);
  return line.substr(0, 64);
}

std::string TokensFile() {
  std::string text = "# name roles hash [problems=] [expires=]\n";
  const std::map<std::string, std::string> roles = {
      {"decider", "decide"}, {"observer", "observe"}, {"exporter", "export"},
      {"admin", "admin"},    {"expired", "decide,observe,export,admin"},
      {"scoped", "decide,observe,admin"}};
  for (const auto& [name, token] : kTokens) {
    absl::StrAppend(&text, name, " ", roles.at(name), " sha256:", HashOf(token));
    if (name == "expired") absl::StrAppend(&text, " expires=2001-01-01T00:00:00Z");
    if (name == "scoped") absl::StrAppend(&text, " problems=p");
    absl::StrAppend(&text, "\n");
  }
  return text;
}

class SecurityTest : public DecisiondTest {
 protected:
  void StartWithTokens() {
    tokens_path_ = dir_ + "/../tokens-" + std::to_string(getpid()) + ".txt";
    WriteFile(tokens_path_, TokensFile());
    ASSERT_NO_FATAL_FAILURE(StartServer({"--tokens_file=" + tokens_path_}));
    // A problem "p" with one decision rewarded 1 and a second expert, made as admin.
    v1::CreateProblemRequest create;
    create.set_problem_id("p");
    create.mutable_config()->set_num_arms(3);
    create.mutable_config()->set_num_features(2);
    v1::Problem problem;
    ASSERT_EQ(Invoke("CreateProblem", "tok-admin-1", &create), StatusCode::OK);
    v1::ChooseRequest choose;
    choose.set_problem_id("p");
    choose.add_features(0.123456789);
    choose.add_features(-1.0);
    choose.set_event_id("evt-secret-42");
    grpc::ClientContext ctx;
    Authorize(&ctx, "tok-decide-1");
    v1::ChooseResponse chosen;
    ASSERT_GRPC_OK(stub_->Choose(&ctx, choose, &chosen));
  }

  static void Authorize(grpc::ClientContext* ctx, const std::string& token) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  }

  // Calls `method` with a request that succeeds when the caller may make it; `create` is
  // used for CreateProblem if given. Returns the status code.
  StatusCode Invoke(const std::string& method, const std::string& token,
                    const v1::CreateProblemRequest* create = nullptr,
                    const std::string& problem = "p") {
    grpc::ClientContext ctx;
    Authorize(&ctx, token);
    if (method == "CreateProblem") {
      v1::CreateProblemRequest r;
      if (create != nullptr) {
        r = *create;
      } else {
        r.set_problem_id(absl::StrCat("c", ++created_));
        r.mutable_config()->set_num_arms(2);
        r.mutable_config()->set_num_features(1);
      }
      v1::Problem out;
      return stub_->CreateProblem(&ctx, r, &out).error_code();
    }
    if (method == "GetProblem") {
      v1::GetProblemRequest r;
      r.set_problem_id("p");
      v1::Problem out;
      return stub_->GetProblem(&ctx, r, &out).error_code();
    }
    if (method == "ListProblems") {
      v1::ListProblemsResponse out;
      return stub_->ListProblems(&ctx, v1::ListProblemsRequest(), &out).error_code();
    }
    if (method == "RegisterExpert") {
      v1::RegisterExpertRequest r;
      r.set_problem_id("p");
      r.set_name("u");
      r.mutable_model()->mutable_uniform();
      v1::Expert out;
      return stub_->RegisterExpert(&ctx, r, &out).error_code();
    }
    if (method == "ListExperts") {
      v1::ListExpertsRequest r;
      r.set_problem_id("p");
      v1::ListExpertsResponse out;
      return stub_->ListExperts(&ctx, r, &out).error_code();
    }
    if (method == "RetireExpert") {
      // Expert 0 stays the last selectable one: retiring the uniform expert 1 is a valid
      // call once RegisterExpert ran (the matrix runs RegisterExpert first).
      v1::RetireExpertRequest r;
      r.set_problem_id("p");
      r.set_expert_id(1);
      v1::Expert out;
      return stub_->RetireExpert(&ctx, r, &out).error_code();
    }
    if (method == "Choose") {
      v1::ChooseRequest r;
      r.set_problem_id("p");
      r.add_features(1.0);
      r.add_features(2.0);
      v1::ChooseResponse out;
      return stub_->Choose(&ctx, r, &out).error_code();
    }
    if (method == "Reward") {
      v1::RewardRequest r;
      r.set_problem_id("p");
      r.set_event_id("evt-secret-42");
      r.set_value(1.0);
      v1::RewardResponse out;
      return stub_->Reward(&ctx, r, &out).error_code();
    }
    if (method == "GetEstimates") {
      v1::GetEstimatesRequest r;
      r.set_problem_id("p");
      v1::Estimates out;
      return stub_->GetEstimates(&ctx, r, &out).error_code();
    }
    if (method == "TrainExperts") {
      v1::TrainExpertsRequest r;
      r.set_problem_id("p");
      r.set_tree_experts(1);
      r.set_linear_experts(0);
      v1::TrainExpertsResponse out;
      return stub_->TrainExperts(&ctx, r, &out).error_code();
    }
    if (method == "GetTrainingJob") {
      // Job 1 of "p": the matrix's TrainExperts (admin) queued it.
      v1::GetTrainingJobRequest r;
      r.set_problem_id(problem);
      r.set_job_id(1);
      v1::TrainingJob out;
      return stub_->GetTrainingJob(&ctx, r, &out).error_code();
    }
    if (method == "ExportLog") {
      v1::ExportLogRequest r;
      r.set_problem_id("p");
      auto reader = stub_->ExportLog(&ctx, r);
      v1::LoggedSample sample;
      while (reader->Read(&sample)) {
      }
      return reader->Finish().error_code();
    }
    if (method == "ListAuditLog") {
      v1::ListAuditLogResponse out;
      return stub_->ListAuditLog(&ctx, v1::ListAuditLogRequest(), &out).error_code();
    }
    if (method == "SetRetention") {
      v1::SetRetentionRequest r;
      r.set_problem_id("p");
      r.mutable_retention()->set_max_samples(1 << 20);
      v1::Problem out;
      return stub_->SetRetention(&ctx, r, &out).error_code();
    }
    if (method == "DeleteEvents") {
      v1::DeleteEventsRequest r;
      r.set_problem_id("p");
      r.add_event_ids("never-decided");
      v1::DeleteEventsResponse out;
      return stub_->DeleteEvents(&ctx, r, &out).error_code();
    }
    if (method == "Promote" || method == "Demote") {
      // Expert 1, registered by the matrix's RegisterExpert, before RetireExpert retires it.
      v1::PromoteRequest r;
      r.set_problem_id("p");
      r.set_expert_id(1);
      v1::Expert out;
      return (method == "Promote" ? stub_->Promote(&ctx, r, &out) : stub_->Demote(&ctx, r, &out))
          .error_code();
    }
    if (method == "EvaluateModel") {
      v1::EvaluateModelRequest r;
      r.set_problem_id("p");
      r.mutable_model()->mutable_uniform();
      v1::ModelEvaluation out;
      return stub_->EvaluateModel(&ctx, r, &out).error_code();
    }
    if (method == "ChooseSlate") {
      v1::ChooseSlateRequest r;
      r.set_problem_id("p");
      r.add_features(1.0);
      r.add_features(2.0);
      r.set_slots(2);
      v1::ChooseSlateResponse out;
      return stub_->ChooseSlate(&ctx, r, &out).error_code();
    }
    if (method == "ChooseBatch") {
      v1::ChooseBatchRequest r;
      v1::ChooseRequest* one = r.add_requests();
      one->set_problem_id("p");
      one->add_features(1.0);
      one->add_features(2.0);
      v1::ChooseBatchResponse out;
      return stub_->ChooseBatch(&ctx, r, &out).error_code();
    }
    if (method == "Activate") {
      v1::ActivateRequest r;
      r.set_problem_id("p");
      r.set_event_id("evt-secret-42");
      v1::ActivateResponse out;
      return stub_->Activate(&ctx, r, &out).error_code();
    }
    if (method == "Explain") {
      v1::ExplainRequest r;
      r.set_problem_id("p");
      r.set_event_id("evt-secret-42");
      v1::Explanation out;
      return stub_->Explain(&ctx, r, &out).error_code();
    }
    // A move of "p", last in the matrix: fenced, exported, then the fence lifted.
    if (method == "BeginMove") {
      v1::BeginMoveRequest r;
      r.set_problem_id("p");
      r.set_to_replica("replica-b");
      v1::BeginMoveResponse out;
      return stub_->BeginMove(&ctx, r, &out).error_code();
    }
    if (method == "ExportProblem") {
      v1::ExportProblemRequest r;
      r.set_problem_id("p");
      v1::ExportProblemResponse out;
      return stub_->ExportProblem(&ctx, r, &out).error_code();
    }
    if (method == "EndMove") {
      v1::EndMoveRequest r;
      r.set_problem_id("p");
      r.set_abort(true);
      v1::EndMoveResponse out;
      return stub_->EndMove(&ctx, r, &out).error_code();
    }
    if (method == "ImportProblem") {
      v1::ImportProblemRequest r;  // the start of an import (never committed)
      r.set_problem_id("moved-in");
      r.set_first(true);
      v1::ImportProblemResponse out;
      return stub_->ImportProblem(&ctx, r, &out).error_code();
    }
    ADD_FAILURE() << "no request for " << method;
    return StatusCode::UNKNOWN;
  }

  std::string tokens_path_;
  int created_ = 0;
};

// The role every RPC needs (the table of server/auth.h).
const std::vector<std::pair<std::string, std::string>> kRpcRoles = {
    {"Reward", "decider"},          {"Choose", "decider"},
    {"GetProblem", "observer"},     {"ListProblems", "observer"},
    {"ListExperts", "observer"},    {"GetEstimates", "observer"},
    {"ExportLog", "exporter"},      {"CreateProblem", "admin"},
    {"RegisterExpert", "admin"},    {"Demote", "admin"},
    {"Promote", "admin"},           {"RetireExpert", "admin"},
    {"EvaluateModel", "admin"},
    {"TrainExperts", "admin"},      {"ListAuditLog", "admin"},
    {"GetTrainingJob", "observer"},  // after TrainExperts, which queues the job it reads
    {"SetRetention", "admin"},      {"DeleteEvents", "admin"},
    {"Explain", "exporter"},  // it carries the context, as ExportLog does
    {"Activate", "decider"},        {"ChooseSlate", "decider"},
    {"ChooseBatch", "decider"},
    {"BeginMove", "admin"},         {"ExportProblem", "admin"},
    {"EndMove", "admin"},           {"ImportProblem", "admin"},
};

// The matrix covers every RPC of the service: a new one must say its role here.
TEST(SecurityMatrix, CoversEveryMethodOfTheService) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "decision.v1.DecisionService");
  ASSERT_NE(service, nullptr);
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string name = service->method(i)->name();
    EXPECT_TRUE(std::any_of(kRpcRoles.begin(), kRpcRoles.end(),
                            [&](const auto& entry) { return entry.first == name; }))
        << name << " has no role in the matrix";
  }
}

TEST_F(SecurityTest, AuthMatrixGivesTheExactCodeForEveryRoleAndRpc) {
  ASSERT_NO_FATAL_FAILURE(StartWithTokens());
  for (const auto& [method, role] : kRpcRoles) {
    SCOPED_TRACE(method);
    EXPECT_EQ(Invoke(method, ""), StatusCode::UNAUTHENTICATED) << "no token";
    EXPECT_EQ(Invoke(method, "not-a-token"), StatusCode::UNAUTHENTICATED) << "wrong token";
    EXPECT_EQ(Invoke(method, "tok-expired-1"), StatusCode::UNAUTHENTICATED) << "expired";
    for (const std::string caller : {"decider", "observer", "exporter", "admin"}) {
      const StatusCode expected =
          caller == role ? StatusCode::OK : StatusCode::PERMISSION_DENIED;
      EXPECT_EQ(Invoke(method, kTokens.at(caller)), expected) << caller;
    }
  }
  // A malformed authorization value is UNAUTHENTICATED too.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.AddMetadata("authorization", "Basic dG9rLWFkbWluLTE=");
  v1::ListProblemsResponse out;
  EXPECT_EQ(stub_->ListProblems(&ctx, v1::ListProblemsRequest(), &out).error_code(),
            StatusCode::UNAUTHENTICATED);
  // The health service stays open for probes.
  int health = -1;
  ASSERT_GRPC_OK(HealthCheck(process_->address(), "", &health));
  EXPECT_EQ(health, 1);
}

TEST_F(SecurityTest, ScopedTokenSeesAndChangesOnlyItsProblems) {
  ASSERT_NO_FATAL_FAILURE(StartWithTokens());
  v1::CreateProblemRequest other;
  other.set_problem_id("q");
  other.mutable_config()->set_num_arms(2);
  other.mutable_config()->set_num_features(0);
  ASSERT_EQ(Invoke("CreateProblem", "tok-admin-1", &other), StatusCode::OK);
  // Its own problem: allowed.
  EXPECT_EQ(Invoke("GetProblem", "tok-scoped-1"), StatusCode::OK);
  EXPECT_EQ(Invoke("Choose", "tok-scoped-1"), StatusCode::OK);
  EXPECT_EQ(Invoke("RegisterExpert", "tok-scoped-1"), StatusCode::OK);
  // Another problem: PERMISSION_DENIED, and creating one outside its list too.
  {
    grpc::ClientContext ctx;
    Authorize(&ctx, "tok-scoped-1");
    v1::GetProblemRequest r;
    r.set_problem_id("q");
    v1::Problem out;
    EXPECT_EQ(stub_->GetProblem(&ctx, r, &out).error_code(), StatusCode::PERMISSION_DENIED);
  }
  other.set_problem_id("r");
  EXPECT_EQ(Invoke("CreateProblem", "tok-scoped-1", &other), StatusCode::PERMISSION_DENIED);
  // The list shows only "p"; the audit log (all problems) is refused.
  grpc::ClientContext ctx;
  Authorize(&ctx, "tok-scoped-1");
  v1::ListProblemsResponse list;
  ASSERT_GRPC_OK(stub_->ListProblems(&ctx, v1::ListProblemsRequest(), &list));
  ASSERT_EQ(list.problems_size(), 1);
  EXPECT_EQ(list.problems(0).problem_id(), "p");
  EXPECT_EQ(Invoke("ListAuditLog", "tok-scoped-1"), StatusCode::PERMISSION_DENIED);
  // A training job of another problem is not shown, whether or not it exists.
  EXPECT_EQ(Invoke("GetTrainingJob", "tok-scoped-1", nullptr, "q"),
            StatusCode::PERMISSION_DENIED);
}

TEST_F(SecurityTest, SighupReloadsTheTokensAndABadFileKeepsTheOldOnes) {
  ASSERT_NO_FATAL_FAILURE(StartWithTokens());
  ASSERT_EQ(Invoke("ListProblems", "tok-observe-1"), StatusCode::OK);
  // Rotate: the observer's token is replaced by a new one.
  std::string text = TokensFile();
  const std::string old_line = "sha256:" + HashOf("tok-observe-1");
  text.replace(text.find(old_line), old_line.size(), "sha256:" + HashOf("tok-observe-2"));
  WriteFile(tokens_path_, text);
  ASSERT_EQ(kill(process_->pid(), SIGHUP), 0);
  // The reload is done when the new token works (bounded wait, no timing assumption).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Invoke("ListProblems", "tok-observe-2") != StatusCode::OK &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Invoke("ListProblems", "tok-observe-2"), StatusCode::OK);
  EXPECT_EQ(Invoke("ListProblems", "tok-observe-1"), StatusCode::UNAUTHENTICATED);
  // A malformed file: decisiond keeps the tokens in force, and reports it on stderr.
  WriteFile(tokens_path_, "this line is not a token\n");
  ASSERT_EQ(kill(process_->pid(), SIGHUP), 0);
  // Prove the signal was handled: a later SIGHUP with a good file (observe-3) takes effect,
  // and until then observe-2 kept working.
  EXPECT_EQ(Invoke("ListProblems", "tok-observe-2"), StatusCode::OK);
  text.replace(text.find("sha256:" + HashOf("tok-observe-2")), old_line.size(),
               "sha256:" + HashOf("tok-observe-3"));
  WriteFile(tokens_path_, text);
  ASSERT_EQ(kill(process_->pid(), SIGHUP), 0);
  while (Invoke("ListProblems", "tok-observe-3") != StatusCode::OK &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Invoke("ListProblems", "tok-observe-3"), StatusCode::OK);
  EXPECT_EQ(Invoke("ListProblems", "tok-observe-2"), StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, AuditLogRecordsWhoDidWhatAndTheResultAcrossARestart) {
  ASSERT_NO_FATAL_FAILURE(StartWithTokens());
  ASSERT_EQ(Invoke("RegisterExpert", "tok-admin-1"), StatusCode::OK);
  ASSERT_EQ(Invoke("RetireExpert", "tok-scoped-1"), StatusCode::OK);
  {
    // A refused registration is audited with its code.
    grpc::ClientContext ctx;
    Authorize(&ctx, "tok-admin-1");
    v1::RegisterExpertRequest r;
    r.set_problem_id("p");
    r.set_name("bad");
    r.mutable_model()->mutable_xgboost()->set_model("not a model");
    v1::Expert out;
    EXPECT_EQ(stub_->RegisterExpert(&ctx, r, &out).error_code(), StatusCode::INVALID_ARGUMENT);
  }
  // A denied call is not an action: not audited (and cannot flood the store).
  EXPECT_EQ(Invoke("RegisterExpert", "tok-decide-1"), StatusCode::PERMISSION_DENIED);
  const auto audit = [&] {
    grpc::ClientContext ctx;
    Authorize(&ctx, "tok-admin-1");
    v1::ListAuditLogResponse out;
    EXPECT_GRPC_OK(stub_->ListAuditLog(&ctx, v1::ListAuditLogRequest(), &out));
    return out;
  };
  // Records are appended after the answer: wait until all four are there.
  v1::ListAuditLogResponse log;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    log = audit();
  } while (log.entries_size() < 4 && std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(log.entries_size(), 4);
  EXPECT_EQ(log.entries(0).method(), "CreateProblem");
  EXPECT_EQ(log.entries(0).caller(), "admin");
  EXPECT_EQ(log.entries(0).problem_id(), "p");
  EXPECT_EQ(log.entries(0).code(), "OK");
  EXPECT_EQ(log.entries(1).method(), "RegisterExpert");
  EXPECT_EQ(log.entries(1).detail(), "name=u kind=uniform -> expert 1");
  EXPECT_EQ(log.entries(2).method(), "RetireExpert");
  EXPECT_EQ(log.entries(2).caller(), "scoped");
  EXPECT_EQ(log.entries(2).detail(), "expert 1");
  EXPECT_EQ(log.entries(3).code(), "INVALID_ARGUMENT");
  EXPECT_NE(log.entries(3).message(), "");
  EXPECT_GT(log.entries(3).at_ms(), 1'700'000'000'000);
  EXPECT_EQ(log.next_start(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(log.entries(i).sequence(), i);
  // Kept in the store: the same after a restart, and new entries continue the sequence.
  ASSERT_EQ(process_->Terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(StartServer({"--tokens_file=" + tokens_path_}));
  v1::ListAuditLogResponse again = audit();
  ASSERT_EQ(again.entries_size(), 4);
  EXPECT_EQ(again.entries(3).SerializeAsString(), log.entries(3).SerializeAsString());
  ASSERT_EQ(Invoke("RegisterExpert", "tok-admin-1"), StatusCode::OK);
  do {
    again = audit();
  } while (again.entries_size() < 5 && std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(again.entries_size(), 5);
  EXPECT_EQ(again.entries(4).sequence(), 4);
}

TEST_F(SecurityTest, MetricsExposeNoTokensEventIdsOrFeatures) {
  ASSERT_NO_FATAL_FAILURE(StartWithTokens());
  ASSERT_EQ(Invoke("Reward", "tok-decide-1"), StatusCode::OK);
  ASSERT_EQ(Invoke("ListProblems", "not-a-token"), StatusCode::UNAUTHENTICATED);
  absl::StatusOr<std::string> body = HttpGet(process_->metrics_address(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_NE(body->find("decision_rpc_errors_total"), std::string::npos);
  for (const auto& [name, token] : kTokens) {
    EXPECT_EQ(body->find(token), std::string::npos) << token;
  }
  EXPECT_EQ(body->find("evt-secret-42"), std::string::npos) << "an event id";
  EXPECT_EQ(body->find("0.123456789"), std::string::npos) << "a feature value";
}

// Every crafted model of the fuzz corpus, sent to a running decisiond: each valid seed is
// registered, every other one is INVALID_ARGUMENT with a reason, and the server stays up
// and serves (the crashes and hangs of issue 13 were all at registration or prediction).
TEST_F(SecurityTest, EveryCraftedModelIsRefusedAndTheServerStaysUp) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  v1::CreateProblemRequest create;
  create.set_problem_id("m");
  create.mutable_config()->set_num_arms(3);
  create.mutable_config()->set_num_features(4);
  v1::Problem problem;
  ASSERT_GRPC_OK(Call(&v1::DecisionService::Stub::CreateProblem, stub_.get(), create, &problem));
  int refused = 0, registered = 0;
  const std::string corpus = std::string(DECISION_SOURCE_DIR) + "/tests/fuzz/corpus/xgboost_model";
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    const std::string name = entry.path().filename();
    v1::RegisterExpertRequest r;
    r.set_problem_id("m");
    r.set_name(name.substr(0, 100));
    r.mutable_model()->mutable_xgboost()->set_model(ReadText(entry.path()));
    v1::Expert out;
    const grpc::Status s = Call(&v1::DecisionService::Stub::RegisterExpert, stub_.get(), r, &out,
                                std::chrono::seconds(60));
    if (name.rfind("valid", 0) == 0) {
      EXPECT_TRUE(s.ok()) << name << ": " << s.error_message();
      ++registered;
    } else {
      EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << name << ": " << s.error_message();
      EXPECT_NE(s.error_message(), "") << name;
      ++refused;
    }
  }
  EXPECT_GE(refused, 10);
  v1::ListExpertsRequest list;
  list.set_problem_id("m");
  v1::ListExpertsResponse experts;
  ASSERT_GRPC_OK(Call(&v1::DecisionService::Stub::ListExperts, stub_.get(), list, &experts));
  EXPECT_EQ(experts.experts_size(), 1 + registered);
  for (int i = 0; i < 20; ++i) {
    v1::ChooseRequest choose;
    choose.set_problem_id("m");
    for (int f = 0; f < 4; ++f) choose.add_features(i * 0.1 - f);
    v1::ChooseResponse chosen;
    ASSERT_GRPC_OK(Call(&v1::DecisionService::Stub::Choose, stub_.get(), choose, &chosen));
    v1::RewardRequest reward;
    reward.set_problem_id("m");
    reward.set_event_id(chosen.event_id());
    reward.set_value(1.0);
    v1::RewardResponse rewarded;
    ASSERT_GRPC_OK(Call(&v1::DecisionService::Stub::Reward, stub_.get(), reward, &rewarded));
  }
  EXPECT_EQ(process_->Terminate(), 0);
}

// Non-loopback addresses: plaintext and open access must be asked for.
TEST_F(SecurityTest, NonLoopbackNeedsTlsAndTokensOrExplicitFlags) {
  EXPECT_FALSE(DecisiondProcess::Start(dir_, {"--listen=0.0.0.0:0"}).ok());
  EXPECT_FALSE(
      DecisiondProcess::Start(dir_, {"--listen=0.0.0.0:0", "--insecure_plaintext"}).ok());
  auto p = DecisiondProcess::Start(
      dir_, {"--listen=0.0.0.0:0", "--insecure_plaintext", "--allow_unauthenticated"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->Terminate(), 0);
}

// ------------------------------------------------------------------------------- TLS

class TlsTest : public DecisiondTest {
 protected:
  void SetUp() override {
    DecisiondTest::SetUp();
    pki_ = MakeTempDir();
    // Two CAs; the server's certificate (for the name decisiond.test) from each; a client
    // certificate from the first.
    const std::string script = absl::StrCat(
        "set -e; cd ", pki_, "\n",
        "mk_ca() { openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=$1 "
        "-keyout $1.key -out $1.pem 2>/dev/null; }\n",
        "mk_cert() { openssl req -newkey rsa:2048 -nodes -subj /CN=$2 -keyout $1.key "
        "-out $1.csr 2>/dev/null; printf 'subjectAltName=DNS:%s\\n' $2 > $1.ext; "
        "openssl x509 -req -in $1.csr -CA $3.pem -CAkey $3.key -CAcreateserial -days 2 "
        "-extfile $1.ext -out $1.pem 2>/dev/null; }\n",
        "mk_ca ca1; mk_ca ca2\n",
        "mk_cert server1 decisiond.test ca1; mk_cert server2 decisiond.test ca2\n",
        "mk_cert client client.test ca1\n",
        "cp server1.pem server.pem; cp server1.key server.key\n");
    ASSERT_EQ(std::system(("sh -c '" + Escape(script) + "'").c_str()), 0);
  }
  void TearDown() override {
    DecisiondTest::TearDown();
    std::error_code ec;
    std::filesystem::remove_all(pki_, ec);
  }
  static std::string Escape(const std::string& s) {
    std::string out;
    for (const char c : s) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out += c;
      }
    }
    return out;
  }

  // ListProblems over a fresh TLS channel trusting `ca`, with the client certificate if
  // `client_cert`.
  StatusCode CallOverTls(const std::string& ca, bool client_cert) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadText(pki_ + "/" + ca + ".pem");
    if (client_cert) {
      ssl.pem_cert_chain = ReadText(pki_ + "/client.pem");
      ssl.pem_private_key = ReadText(pki_ + "/client.key");
    }
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("decisiond.test");
    // A fresh connection each time, so that a reloaded certificate is seen.
    args.SetInt("grpc.use_local_subchannel_pool", 1);
    auto channel = grpc::CreateCustomChannel(process_->address(), grpc::SslCredentials(ssl), args);
    auto stub = v1::DecisionService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListProblemsResponse out;
    return stub->ListProblems(&ctx, v1::ListProblemsRequest(), &out).error_code();
  }

  std::string pki_;
};

TEST_F(TlsTest, MutualTlsRefusesPlaintextAndAnonymousClientsAndReloadsCertificates) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--tls_cert=" + pki_ + "/server.pem",
                                       "--tls_key=" + pki_ + "/server.key",
                                       "--tls_client_ca=" + pki_ + "/ca1.pem",
                                       "--tls_reload_interval_s=1"}));
  // A plaintext client is refused on the TLS port.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListProblemsResponse out;
    EXPECT_EQ(stub_->ListProblems(&ctx, v1::ListProblemsRequest(), &out).error_code(),
              StatusCode::UNAVAILABLE);
  }
  // TLS without a client certificate is refused; with one it is served.
  EXPECT_EQ(CallOverTls("ca1", /*client_cert=*/false), StatusCode::UNAVAILABLE);
  EXPECT_EQ(CallOverTls("ca1", /*client_cert=*/true), StatusCode::OK);
  // A client that trusts only ca2 does not trust the current certificate...
  EXPECT_EQ(CallOverTls("ca2", true), StatusCode::UNAVAILABLE);
  // ...until the certificate is replaced on disk by one from ca2: no restart.
  std::filesystem::copy_file(pki_ + "/server2.key", pki_ + "/server.key.new");
  std::filesystem::copy_file(pki_ + "/server2.pem", pki_ + "/server.pem.new");
  std::filesystem::rename(pki_ + "/server.key.new", pki_ + "/server.key");
  std::filesystem::rename(pki_ + "/server.pem.new", pki_ + "/server.pem");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (CallOverTls("ca2", true) != StatusCode::OK &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(CallOverTls("ca2", true), StatusCode::OK);
  EXPECT_EQ(CallOverTls("ca1", true), StatusCode::UNAVAILABLE);
  EXPECT_EQ(process_->Terminate(), 0);
}

// The client library: TLS with a CA file, a client certificate, a server name override and
// a bearer token, against mutual TLS and a tokens file.
TEST_F(TlsTest, ClientLibrarySpeaksMutualTlsWithAToken) {
  const std::string tokens = pki_ + "/tokens.txt";
  WriteFile(tokens, "ops admin,observe sha256:" + HashOf("tok-ops") + "\n");
  ASSERT_NO_FATAL_FAILURE(StartServer({"--tls_cert=" + pki_ + "/server.pem",
                                       "--tls_key=" + pki_ + "/server.key",
                                       "--tls_client_ca=" + pki_ + "/ca1.pem",
                                       "--tokens_file=" + tokens}));
  client::ClientOptions options;
  options.address = process_->address();
  options.tls.enabled = true;
  options.tls.ca_file = pki_ + "/ca1.pem";
  options.tls.cert_file = pki_ + "/client.pem";
  options.tls.key_file = pki_ + "/client.key";
  options.tls.server_name = "decisiond.test";
  options.token = "tok-ops";
  client::DecisionClient c(options);
  ASSERT_TRUE(c.status().ok()) << c.status();
  v1::ProblemConfig config;
  config.set_num_arms(2);
  ASSERT_TRUE(c.CreateProblem("tls", config).ok());
  const auto listed = c.ListProblems();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->problems_size(), 1);
  // Without the token: UNAUTHENTICATED; with an unreadable CA file: a clear local error.
  options.token.clear();
  EXPECT_EQ(client::DecisionClient(options).ListProblems().status().code(),
            absl::StatusCode::kUnauthenticated);
  options.tls.ca_file = pki_ + "/no-such-ca.pem";
  EXPECT_EQ(client::DecisionClient(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TlsTest, ServerOnlyTlsServesClientsWithoutCertificates) {
  ASSERT_NO_FATAL_FAILURE(StartServer(
      {"--tls_cert=" + pki_ + "/server.pem", "--tls_key=" + pki_ + "/server.key"}));
  EXPECT_EQ(CallOverTls("ca1", /*client_cert=*/false), StatusCode::OK);
  EXPECT_EQ(CallOverTls("ca2", false), StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace decision::testing
