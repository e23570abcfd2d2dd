// recovery_fuzz: a restart from a store whose records are the fuzzer's bytes. The input is
// written, as raw keys and values, into a fresh RocksDB store with the service's column
// families (storage/format.h), then DecisionService::Open restores every problem from it
// (server/recovery.cc, through storage/store.cc's decoders). Open must return OK or an
// error (DATA_LOSS for records that do not fit together); a service that opened must then
// answer queries, a Choose, a maintenance round and a clean Shutdown without crashing.
//
// Input: records until the input ends, each
//   family byte (% the number of families: the index in kFamilyNames), key length byte, key,
//   value length (3 bytes, little-endian), value.
// Seeds: corpus/recovery/, real stores written by the service (write_fuzz_seeds dumps
// them in this form). Slow: one RocksDB store is created and opened per input.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <rocksdb/db.h>

#include "server/clock.h"
#include "server/decision_service.h"
#include "server/metrics.h"
#include "storage/format.h"
#include "tests/fuzz/fuzz_support.h"

namespace decision::server {
namespace {

constexpr int kFamilies = sizeof(storage::kFamilyNames) / sizeof(storage::kFamilyNames[0]);

const std::string& StoreDir() {
  static const std::string* const dir = [] {
    const char* base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    auto* d = new std::string(std::string(base) + "/decision-recovery-fuzz-" +
                              std::to_string(getpid()));
    std::atexit([] { std::filesystem::remove_all(StoreDir()); });
    return d;
  }();
  return *dir;
}

}  // namespace
}  // namespace decision::server

namespace decision::fuzz {

namespace {

std::vector<rocksdb::ColumnFamilyDescriptor> Families() {
  // Small memtables: the default 64 MiB ones allocate 8 MiB arena blocks per family.
  rocksdb::ColumnFamilyOptions family_options;
  family_options.write_buffer_size = 1 << 20;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  families.emplace_back(rocksdb::kDefaultColumnFamilyName, family_options);
  for (const char* name : decision::storage::kFamilyNames) {
    families.emplace_back(name, family_options);
  }
  return families;
}

// An empty store with every family, made once: creating the nine families (each writes and
// verifies RocksDB's OPTIONS file) was most of an execution's time.
const std::string& EmptyStore() {
  static const std::string* const dir = [] {
    auto* d = new std::string(std::filesystem::temp_directory_path() /
                              ("decision-recovery-fuzz-empty-" + std::to_string(getpid())));
    std::filesystem::remove_all(*d);
    rocksdb::Options options;
    options.create_if_missing = true;
    options.create_missing_column_families = true;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(options, *d, Families(), &handles, &db);
    FUZZ_CHECK(s.ok(), "creating the empty store: %s", s.ToString().c_str());
    for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
    s = db->Close();
    delete db;
    FUZZ_CHECK(s.ok(), "closing the empty store: %s", s.ToString().c_str());
    std::atexit([] { std::filesystem::remove_all(EmptyStore()); });
    return d;
  }();
  return *dir;
}

}  // namespace

// Writes the records of the input into a new store at `dir` (also used by the replay test).
void WriteFuzzStore(const uint8_t* data, size_t size, const std::string& dir) {
  Input in(data, size);
  std::filesystem::remove_all(dir);
  std::filesystem::copy(EmptyStore(), dir, std::filesystem::copy_options::recursive);
  rocksdb::Options options;
  // The service's Open replays the write-ahead log: no need to write table files here.
  options.avoid_flush_during_shutdown = true;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, Families(), &handles, &db);
  FUZZ_CHECK(s.ok(), "opening the store: %s", s.ToString().c_str());
  while (!in.empty()) {
    const int family = 1 + in.Byte() % server::kFamilies;
    const absl::string_view key = in.Chunk();
    size_t length = in.Byte();
    length |= static_cast<size_t>(in.Byte()) << 8;
    length |= static_cast<size_t>(in.Byte()) << 16;
    const absl::string_view value = in.Take(length);
    s = db->Put(rocksdb::WriteOptions(), handles[family],
                rocksdb::Slice(key.data(), key.size()), rocksdb::Slice(value.data(), value.size()));
    FUZZ_CHECK(s.ok(), "writing a record: %s", s.ToString().c_str());
  }
  for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
  s = db->Close();
  delete db;
  FUZZ_CHECK(s.ok(), "closing the store: %s", s.ToString().c_str());
}

}  // namespace decision::fuzz

namespace decision::server {
namespace {

void Exercise(DecisionService& service) {
  v1::ListProblemsResponse problems;
  FUZZ_CHECK(service.ListProblems({}, &problems).ok(), "ListProblems");
  for (const v1::Problem& p : problems.problems()) {
    v1::GetEstimatesRequest estimates;
    estimates.set_problem_id(p.problem_id());
    v1::Estimates e;
    service.GetEstimates(estimates, &e).IgnoreError();
    v1::ListExpertsRequest experts;
    experts.set_problem_id(p.problem_id());
    v1::ListExpertsResponse x;
    service.ListExperts(experts, &x).IgnoreError();
    v1::ChooseRequest choose;
    choose.set_problem_id(p.problem_id());
    choose.set_event_id("fuzz-choose");
    const int d = p.config().num_features();
    if (d >= 0 && d <= 1024) {
      for (int f = 0; f < d; ++f) choose.add_features(0.5);
    }
    v1::ChooseResponse chosen;
    if (service.Choose(choose, &chosen).ok()) {
      FUZZ_CHECK(chosen.arm() >= 0 && chosen.arm() < p.config().num_arms() &&
                     chosen.propensity() > 0 && chosen.propensity() <= 1,
                 "Choose answered arm %d with propensity %g", chosen.arm(),
                 chosen.propensity());
      v1::RewardRequest reward;
      reward.set_problem_id(p.problem_id());
      reward.set_event_id(chosen.event_id());
      reward.set_value(1.0);
      v1::RewardResponse rewarded;
      service.Reward(reward, &rewarded).IgnoreError();
    }
    v1::ExportLogRequest export_log;
    export_log.set_problem_id(p.problem_id());
    export_log.set_limit(16);
    service.ExportLog(export_log, [](const v1::LoggedSample&) { return absl::OkStatus(); })
        .IgnoreError();
  }
  service.RunMaintenance().IgnoreError();
  v1::ListAuditLogRequest audit;
  v1::ListAuditLogResponse audited;
  service.ListAuditLog(audit, &audited).IgnoreError();
}

}  // namespace
}  // namespace decision::server

extern "C" int DECISION_FUZZ_ENTRY(const uint8_t* data, size_t size) {
  using namespace decision::server;
  const std::string& dir = StoreDir();
  std::filesystem::remove_all(dir);
  decision::fuzz::WriteFuzzStore(data, size, dir);
  FakeClock clock;
  Metrics metrics;
  ServiceOptions options;
  options.data_dir = dir;
  options.seed = 1;
  options.start_maintenance_thread = false;
  absl::StatusOr<std::unique_ptr<DecisionService>> service =
      DecisionService::Open(options, &clock, &metrics);
  if (!service.ok()) {
    // A store that does not fit together is refused with a status naming the record.
    FUZZ_CHECK(!service.status().message().empty(), "Open failed without a message: %s",
               service.status().ToString().c_str());
    return 0;
  }
  Exercise(**service);
  (*service)->Shutdown().IgnoreError();
  return 0;
}
