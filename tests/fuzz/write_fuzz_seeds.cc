// Writes the seed corpora of the fuzz targets whose inputs are serialized messages:
// expert_model/, request/, record/ and recovery/ under the corpus directory given (the
// xgboost_model seeds are written by write_xgboost_fuzz_corpus, tests/CMakeLists.txt).
// Each file is named for what it holds; the formats are in each target's header comment.
// The recovery seeds are real stores: the service runs a small scenario in a temporary
// directory, shuts down, and every record of the store is dumped.
//
//   cmake --build build --target write_fuzz_seeds
//   build/tests/fuzz/write_fuzz_seeds tests/fuzz/corpus
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <rocksdb/db.h>

#include "server/auth.h"
#include "server/clock.h"
#include "core/policy.h"
#include "server/conversions.h"
#include "server/decision_service.h"
#include "server/metrics.h"
#include "server/validation.h"
#include "storage/format.h"

namespace decision::server {
namespace {

namespace fs = std::filesystem;
namespace rec = storage::v1;

fs::path corpus;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(corpus / target);
  std::ofstream out(corpus / target / name, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) {
    std::fprintf(stderr, "cannot write %s/%s\n", target.c_str(), name.c_str());
    std::exit(1);
  }
}

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

std::string Byte(int b) { return std::string(1, static_cast<char>(b)); }
std::string Length16(size_t n) { return Byte(n & 255) + Byte(n >> 8 & 255); }

// ------------------------------------------------------------------------ expert_model

v1::ExpertModel LinearModel(int arms, int features) {
  v1::ExpertModel m;
  for (int i = 0; i < arms * features; ++i) m.mutable_linear_softmax()->add_weights(i % 3 - 1.0);
  for (int v = 0; v < arms; ++v) m.mutable_linear_softmax()->add_bias(0.1 * v);
  m.mutable_linear_softmax()->set_temperature(0.5);
  return m;
}

v1::ExpertModel TableModel(int arms, int rows, int key_feature) {
  v1::ExpertModel m;
  for (int r = 0; r < rows; ++r) {
    auto* row = m.mutable_table()->add_rows();
    for (int v = 0; v < arms; ++v) row->add_probabilities(v == r % arms ? 0.5 : 0.5 / (arms - 1));
  }
  m.mutable_table()->set_key_feature(key_feature);
  return m;
}

// Wire and record forms of `m` for shape index `shape` (expert_model_fuzz.cc's kShapes).
void ExpertModelSeed(const std::string& name, const v1::ExpertModel& m, int shape) {
  Write("expert_model", "wire_" + name, Byte(2 * shape) + m.SerializeAsString());
  absl::StatusOr<rec::ExpertModelRecord> r = ModelRecordFromWire(m);
  if (r.ok()) Write("expert_model", "record_" + name, Byte(2 * shape + 1) + r->SerializeAsString());
}

std::vector<std::pair<std::string, std::string>> ValidXgboostModels() {
  std::vector<std::pair<std::string, std::string>> models;
  for (const auto& e : fs::directory_iterator(corpus / "xgboost_model")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("valid_", 0) == 0) models.emplace_back(name.substr(6), Read(e.path()));
  }
  std::sort(models.begin(), models.end());
  return models;
}

void ExpertModelSeeds() {
  v1::ExpertModel uniform;
  uniform.mutable_uniform();
  ExpertModelSeed("uniform", uniform, 0);
  ExpertModelSeed("linear_3x4", LinearModel(3, 4), 0);
  ExpertModelSeed("linear_2x1", LinearModel(2, 1), 1);
  ExpertModelSeed("linear_5x3", LinearModel(5, 3), 3);
  ExpertModelSeed("table_3x4_one_row", TableModel(3, 1, 0), 0);
  ExpertModelSeed("table_3x4_three_rows", TableModel(3, 3, 2), 0);
  ExpertModelSeed("table_1x0", TableModel(1, 1, 0), 2);
  ExpertModelSeed("table_5x3_rows_bad_key", TableModel(5, 2, 3), 3);
  for (const auto& [name, bytes] : ValidXgboostModels()) {
    v1::ExpertModel m;
    m.mutable_xgboost()->set_model(bytes);
    ExpertModelSeed("xgboost_" + name, m, 0);
  }
}

// ----------------------------------------------------------------------------- request

v1::ProblemConfig Config() {
  v1::ProblemConfig c;
  c.set_num_arms(3);
  c.set_num_features(4);
  c.set_reward_wait_ms(1000);
  c.set_default_reward(0.25);
  c.set_smoothing(0.1);
  c.set_batch_multiplier(7);
  c.set_divergence_reservoir(64);
  c.set_divergence_groups(4);
  c.mutable_estimator()->set_kind(v1::ESTIMATOR_KIND_CLIPPED);
  c.mutable_estimator()->set_c2(3);
  c.mutable_auto_train()->set_enabled(true);
  c.mutable_auto_train()->set_tree_experts(2);
  return c;
}

void RequestSeed(const std::string& name, int selector, const std::string& bytes) {
  Write("request", name, Byte(selector) + bytes);
}

void RequestSeeds() {
  v1::CreateProblemRequest create;
  create.set_problem_id("home-page.v1");
  *create.mutable_config() = Config();
  RequestSeed("create_problem", 0, create.SerializeAsString());
  create.mutable_config()->Clear();
  create.mutable_config()->set_num_arms(2);
  RequestSeed("create_problem_defaults", 0, create.SerializeAsString());
  v1::GetProblemRequest get;
  get.set_problem_id("p");
  RequestSeed("get_problem", 1, get.SerializeAsString());
  RequestSeed("list_problems", 2, "");
  v1::RegisterExpertRequest reg;
  reg.set_problem_id("p");
  reg.set_name("linear");
  *reg.mutable_model() = LinearModel(3, 4);
  reg.mutable_model()->set_smoothing(0.2);
  RequestSeed("register_linear", 3, reg.SerializeAsString());
  *reg.mutable_model() = TableModel(3, 3, 1);
  RequestSeed("register_table", 3, reg.SerializeAsString());
  for (const auto& [name, bytes] : ValidXgboostModels()) {
    reg.mutable_model()->Clear();
    reg.mutable_model()->mutable_xgboost()->set_model(bytes);
    RequestSeed("register_xgboost_" + name, 3, reg.SerializeAsString());
  }
  v1::ListExpertsRequest list;
  list.set_problem_id("p");
  RequestSeed("list_experts", 4, list.SerializeAsString());
  v1::RetireExpertRequest retire;
  retire.set_problem_id("p");
  retire.set_expert_id(2);
  RequestSeed("retire_expert", 5, retire.SerializeAsString());
  v1::ChooseRequest choose;
  choose.set_problem_id("p");
  choose.set_event_id("e-1");
  for (double x : {0.5, -1.0, 3.0, 0.0}) choose.add_features(x);
  RequestSeed("choose", 6, choose.SerializeAsString());
  v1::RewardRequest reward;
  reward.set_problem_id("p");
  reward.set_event_id("e-1");
  reward.set_value(0.75);
  RequestSeed("reward", 7, reward.SerializeAsString());
  v1::GetEstimatesRequest estimates;
  estimates.set_problem_id("p");
  RequestSeed("get_estimates", 8, estimates.SerializeAsString());
  v1::TrainExpertsRequest train;
  train.set_problem_id("p");
  train.set_tree_experts(3);
  train.set_linear_experts(1);
  RequestSeed("train_experts", 9, train.SerializeAsString());
  v1::ExportLogRequest export_log;
  export_log.set_problem_id("p");
  export_log.set_start(10);
  export_log.set_limit(100);
  RequestSeed("export_log", 10, export_log.SerializeAsString());
  v1::ListAuditLogRequest audit;
  audit.set_start(5);
  audit.set_limit(50);
  RequestSeed("list_audit_log", 11, audit.SerializeAsString());
  RequestSeed("tokens", 12,
              "# tokens\n"
              "ad-server  decide  sha256:" + Sha256Hex("secret-1") + " problems=home,search\n"
              "\n"
              "ops admin,observe,export\tsha256:" + Sha256Hex("secret-2") +
              " expires=2027-06-30T00:00:00Z  # the operators\n");
}

// ------------------------------------------------------------------------------ record

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}


rec::ProblemRecord ProblemRecord() {
  absl::StatusOr<rec::ProblemRecord> r = ProblemRecordFromConfig("p", Config());
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    std::exit(1);
  }
  r->set_created_at_ms(1'700'000'000'000);
  return *r;
}

void RecordSeed(const std::string& name, int selector, const google::protobuf::Message& m) {
  const std::string problem = ProblemRecord().SerializeAsString();
  Write("record", name, Byte(selector) + Length16(problem.size()) + problem + m.SerializeAsString());
}

void RecordSeeds() {
  RecordSeed("problem", 0, ProblemRecord());
  rec::ExpertRecord expert;
  expert.set_name("linear");
  *expert.mutable_model() = *ModelRecordFromWire(LinearModel(3, 4));
  expert.set_smoothing(0.05);
  expert.set_status(rec::EXPERT_STATE_ACTIVE);
  expert.set_backfill_total(12);
  RecordSeed("expert_linear", 1, expert);
  *expert.mutable_model() = *ModelRecordFromWire(TableModel(3, 2, 3));
  expert.set_status(rec::EXPERT_STATE_BACKFILLING);
  RecordSeed("expert_table", 1, expert);
  rec::CheckpointRecord checkpoint;
  checkpoint.set_samples(20);
  checkpoint.set_num_experts(2);
  for (double v : {1.0, 1.5, 1.25, 1.0}) checkpoint.add_m(v);
  for (double v : {1.0, 2.0, 1.75, 1.0}) checkpoint.add_sigma(v);
  for (int i = 0; i < 8; ++i) checkpoint.add_reservoir(0.25 * i);
  checkpoint.set_reservoir_seen(20);
  checkpoint.set_next_refresh_at(40);
  checkpoint.set_decisions(22);
  RecordSeed("checkpoint", 2, checkpoint);
  // A complete chunk of one expert: the only form recovery accepts (4096 samples).
  rec::LogChunk chunk;
  chunk.set_num_experts(1);
  for (int i = 0; i < storage::kLogChunkSamples; ++i) {
    chunk.add_chooser(0);
    chunk.add_reward(i % 4 == 0 ? 1.0 : 0.0);
    chunk.add_propensities(i % 3 == 0 ? 1.0 : 0.5);
  }
  RecordSeed("log_chunk", 3, chunk);
  // The same samples over three experts, expert 1 frozen when the chunk started: no
  // column of it, the chooser's propensity apart (Problem::ChunkRows).
  rec::LogChunk dropped;
  dropped.set_num_experts(3);
  dropped.add_dropped(1);
  for (int i = 0; i < storage::kLogChunkSamples; ++i) {
    dropped.add_chooser(i % 5 == 0 ? 1 : 0);
    dropped.add_reward(i % 4 == 0 ? 1.0 : 0.0);
    dropped.add_propensities(i % 3 == 0 ? 1.0 : 0.5);
    dropped.add_propensities(0.25);
    dropped.add_chooser_propensity(i % 5 == 0 ? 0.75 : (i % 3 == 0 ? 1.0 : 0.5));
  }
  RecordSeed("log_chunk_dropped", 3, dropped);
  rec::BackfillChunk backfill;
  for (double v : {0.5, 0.25, 1.0}) backfill.add_values(v);
  RecordSeed("backfill_chunk", 4, backfill);
  rec::SampleRecord sample;
  sample.set_event_id("e-7");
  for (double x : {0.5, -1.0, 3.0, 0.0}) sample.add_features(x);
  sample.set_arm(2);
  sample.set_expert_id(0);
  sample.set_propensity(0.4);
  sample.set_reward(1);
  sample.set_decided_at_ms(1'700'000'000'000);
  sample.set_joined_at_ms(1'700'000'000'500);
  RecordSeed("sample", 5, sample);
  rec::EventRecord event;
  event.set_arm(1);
  event.set_expert_id(0);
  event.set_propensity(0.3);
  for (double x : {0.5, -1.0, 3.0, 0.0}) event.add_features(x);
  event.set_decided_at_ms(1'700'000'000'000);
  event.set_deadline_ms(1'700'000'001'000);
  event.set_state(rec::EVENT_STATE_PENDING);
  event.set_sequence(-1);
  RecordSeed("event", 6, event);
  rec::AuditRecord audit;
  audit.set_at_ms(1'700'000'000'000);
  audit.set_caller("ops");
  audit.set_method("RegisterExpert");
  audit.set_problem_id("p");
  audit.set_detail("expert 1");
  audit.set_code(3);
  audit.set_message("model: no model kind is set");
  RecordSeed("audit", 7, audit);
  // The state of a problem's estimator after 20 samples of 2 experts.
  absl::StatusOr<DUcb> ducb =
      DUcb::Create(EstimatorOptionsOf(ProblemRecord()), 2, DUcb::LogMode::kNone);
  Check(ducb.status(), "estimator");
  for (int t = 0; t < 20; ++t) {
    Check(ducb->Learn(t % 2, t % 3 == 0 ? 1.0 : 0.0, {0.5, t % 2 == 0 ? 0.25 : 0.75}),
          "learning");
  }
  rec::EstimatorStateRecord state;
  state.set_samples(20);
  state.set_state(ducb->Snapshot().value());
  state.add_times_selected(10);
  state.add_times_selected(10);
  state.set_positive_rewards(7);
  RecordSeed("estimator_state", 8, state);
}

// ---------------------------------------------------------------------------- recovery


// Every record of the store at `dir`, in recovery_fuzz.cc's input form.
std::string Dump(const std::string& dir) {
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  families.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());
  for (const char* name : storage::kFamilyNames) {
    families.emplace_back(name, rocksdb::ColumnFamilyOptions());
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir, families, &handles, &db);
  if (!s.ok()) {
    std::fprintf(stderr, "dump: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  std::string out;
  for (size_t f = 1; f < handles.size(); ++f) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[f]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const size_t v = it->value().size();
      out += Byte(static_cast<int>(f - 1)) + Byte(static_cast<int>(it->key().size())) +
             it->key().ToString() + Byte(v & 255) + Byte(v >> 8 & 255) + Byte(v >> 16 & 255) +
             it->value().ToString();
    }
  }
  for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
  delete db;
  return out;
}

// A small history: two problems, experts registered and retired, joined samples, pending
// decisions, an audit record; `backfilled` runs the maintenance (backfill, refresh).
std::string Scenario(bool backfilled) {
  const std::string dir = (fs::temp_directory_path() / "decision-fuzz-seed-store").string();
  fs::remove_all(dir);
  FakeClock clock;
  Metrics metrics;
  ServiceOptions options;
  options.data_dir = dir;
  options.seed = 3;
  options.start_maintenance_thread = false;
  options.durable_choose = true;
  absl::StatusOr<std::unique_ptr<DecisionService>> opened =
      DecisionService::Open(options, &clock, &metrics);
  Check(opened.status(), "open");
  DecisionService& service = **opened;
  v1::Problem problem;
  v1::CreateProblemRequest create;
  create.set_problem_id("p");
  *create.mutable_config() = Config();
  create.mutable_config()->set_num_features(2);
  create.mutable_config()->mutable_auto_train()->set_enabled(false);
  create.mutable_config()->set_divergence_reservoir(16);
  Check(service.CreateProblem(create, &problem), "create p");
  create.set_problem_id("q");
  create.mutable_config()->set_num_arms(2);
  create.mutable_config()->set_num_features(1);
  Check(service.CreateProblem(create, &problem), "create q");
  v1::RegisterExpertRequest reg;
  reg.set_problem_id("p");
  reg.set_name("linear");
  *reg.mutable_model() = LinearModel(3, 2);
  v1::Expert expert;
  Check(service.RegisterExpert(reg, &expert), "register linear");
  for (int i = 0; i < 10; ++i) {
    for (const char* id : {"p", "q"}) {
      v1::ChooseRequest choose;
      choose.set_problem_id(id);
      choose.set_event_id(std::string(id) + "-e" + std::to_string(i));
      for (int f = 0; f < (id[0] == 'p' ? 2 : 1); ++f) choose.add_features(0.1 * i - f);
      v1::ChooseResponse chosen;
      Check(service.Choose(choose, &chosen), "choose");
      if (i % 4 == 3) continue;  // left pending
      v1::RewardRequest reward;
      reward.set_problem_id(id);
      reward.set_event_id(chosen.event_id());
      reward.set_value(i % 2);
      v1::RewardResponse rewarded;
      Check(service.Reward(reward, &rewarded), "reward");
    }
    clock.AdvanceMs(10);
  }
  reg.set_name("table");
  *reg.mutable_model() = TableModel(3, 2, 0);
  Check(service.RegisterExpert(reg, &expert), "register table");
  if (backfilled) {
    Check(service.RunMaintenance(), "maintenance");
    v1::RetireExpertRequest retire;
    retire.set_problem_id("p");
    retire.set_expert_id(1);
    Check(service.RetireExpert(retire, &expert), "retire");
  }
  rec::AuditRecord audit;
  audit.set_at_ms(clock.NowMs());
  audit.set_caller("ops");
  audit.set_method("RetireExpert");
  audit.set_problem_id("p");
  audit.set_detail("expert 1");
  service.RecordAudit(audit);
  Check(service.Shutdown(), "shutdown");
  opened->reset();
  std::string dump = Dump(dir);
  fs::remove_all(dir);
  return dump;
}

void RecoverySeeds() {
  Write("recovery", "store_pending_and_backfilling", Scenario(false));
  Write("recovery", "store_backfilled_and_retired", Scenario(true));
}

}  // namespace
}  // namespace decision::server

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  decision::server::corpus = argv[1];
  decision::server::ExpertModelSeeds();
  decision::server::RequestSeeds();
  decision::server::RecordSeeds();
  decision::server::RecoverySeeds();
  return 0;
}
