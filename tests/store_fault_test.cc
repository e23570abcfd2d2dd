// Storage faults (issue 14): RocksDB's files fail as a full or failing disk makes them fail
// (tests/fault_injection_fs.h), in-process, and store open failures of the real decisiond.
// What must hold: no decision is handed out that cannot be kept, nothing acknowledged is
// lost, the service recovers without a restart when the disk does, and neither shutdown
// nor a failed open ever crashes.
//
// FaultMatrix prints the status codes seen for each fault and operation as a markdown
// table (README.md "Failure modes" holds a copy).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/log_limiter.h"
#include "storage/store.h"
#include "tests/fault_injection_fs.h"
#include "tests/service_fixture.h"

namespace decision::server {
namespace {

using ::decision::testing::FaultInjectionFs;
using ::testing::HasSubstr;

std::string Code(const absl::Status& s) { return absl::StatusCodeToString(s.code()); }

class StoreFaultTest : public ServiceTest {
 protected:
  StoreFaultTest() : fs_(std::make_shared<FaultInjectionFs>()) { store_env_ = fs_->NewEnv(); }

  void TearDown() override { fs_->Clear(); }

  // The event ids of the exported log of `problem`.
  std::set<std::string> LoggedEvents(const std::string& problem) {
    std::set<std::string> ids;
    for (const v1::LoggedSample& s : Export(problem)) ids.insert(s.event_id());
    return ids;
  }
  absl::Status TryChoose(const std::string& problem, v1::ChooseResponse* response,
                         const std::string& event_id = "") {
    v1::ChooseRequest req;
    req.set_problem_id(problem);
    req.set_event_id(event_id);
    for (int f = 0; f < kFeatures; ++f) req.add_features(f == 0 ? key_ : 0.25 * (f + 1));
    return service_->Choose(req, response);
  }
  absl::Status TryRegisterUniform(const std::string& problem) {
    v1::RegisterExpertRequest req;
    req.set_problem_id(problem);
    req.set_name("uniform");
    req.mutable_model()->mutable_uniform();
    v1::Expert e;
    return service_->RegisterExpert(req, &e);
  }
  absl::Status TryExport(const std::string& problem) {
    v1::ExportLogRequest req;
    req.set_problem_id(problem);
    return service_->ExportLog(req, [](const v1::LoggedSample&) { return absl::OkStatus(); });
  }
  // DecisionService::Open of dir_ as the fixture does it, but returning the failure.
  absl::Status TryOpen() {
    ServiceOptions options;
    options.data_dir = dir_;
    options.seed = 7;
    options.start_maintenance_thread = false;
    options.store_env = store_env_;
    auto s = DecisionService::Open(options, &clock_, &metrics_);
    if (s.ok()) service_ = *std::move(s);
    return s.status();
  }

  std::shared_ptr<FaultInjectionFs> fs_;
  // Feature 0 of TryChoose's contexts (the key of the table expert of the fault matrix).
  double key_ = 0.25;
};

// The main scenario of the issue: the WAL's disk fills up. The first write that fails
// stops the decisions; nothing answered is lost; when space returns the maintenance
// resumes the store (no restart), and every acknowledged reward is there after a restart.
// Twice: the second fault hits the first write into a fresh WAL after the recovery.
TEST_F(StoreFaultTest, WalOutOfSpaceStopsDecisionsAndRecoversWithoutRestart) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  std::set<std::string> acknowledged;
  for (int i = 0; i < 20; ++i) {
    const v1::ChooseResponse c = Choose("p");
    ASSERT_TRUE(Reward("p", c.event_id(), i % 2).ok());
    acknowledged.insert(c.event_id());
  }
  EXPECT_EQ(MetricValue("decision_store_healthy"), 1.0);
  for (int cycle = 0; cycle < 2; ++cycle) {
    SCOPED_TRACE(absl::StrCat("cycle ", cycle));
    const std::string pending = absl::StrCat("pending", cycle);
    Choose("p", pending);  // answered, not written yet (deferred)
    fs_->FailWrites(testing::kWalFile, FaultInjectionFs::NoSpace());
    const absl::Status reward = Reward("p", pending, 1.0);
    EXPECT_EQ(reward.code(), absl::StatusCode::kUnavailable) << reward;
    EXPECT_THAT(reward.message(), HasSubstr("No space left"));
    EXPECT_FALSE(service_->store_for_testing().Health().writable);
    v1::ChooseResponse c;
    const absl::Status choose = TryChoose("p", &c);
    EXPECT_EQ(choose.code(), absl::StatusCode::kUnavailable) << choose;
    EXPECT_THAT(choose.message(), HasSubstr("the store cannot write"));
    EXPECT_THAT(choose.message(), HasSubstr("decisions are refused until it recovers"));
    EXPECT_EQ(TryRegisterUniform("p").code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(TryExport("p").ok());  // reads work
    EXPECT_EQ(GetProblem("p").samples(), static_cast<int64_t>(acknowledged.size()));
    EXPECT_EQ(service_->RunMaintenance().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(MetricValue("decision_store_healthy"), 0.0);
    EXPECT_GE(MetricValue("decision_store_write_errors_total"), 1.0);

    fs_->Clear();  // space is back
    // The last attempt to resume was this round's: the next waits for the interval.
    EXPECT_EQ(service_->RunMaintenance().code(), absl::StatusCode::kUnavailable);
    clock_.AdvanceMs(1000);
    const absl::Status round = service_->RunMaintenance();
    EXPECT_TRUE(round.ok()) << round;
    EXPECT_EQ(MetricValue("decision_store_healthy"), 1.0);
    EXPECT_TRUE(TryChoose("p", &c).ok());
    ASSERT_TRUE(Reward("p", pending, 1.0).ok());  // its decision was kept in memory
    acknowledged.insert(pending);
  }
  EXPECT_EQ(service_->store_for_testing().Health().recoveries, 2);
  Reopen();
  EXPECT_EQ(LoggedEvents("p"), acknowledged);
  ExpectEstimatesMatchReference("p");
}

// An I/O error on the WAL is fatal to RocksDB (no DB::Resume): the store is reopened once
// the disk works again, the WAL replayed, and nothing acknowledged is lost. Shutdown while
// the disk still fails does not abort.
TEST_F(StoreFaultTest, WalIoErrorReopensTheStoreAndLosesNothingAcknowledged) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  std::set<std::string> acknowledged;
  for (int i = 0; i < 10; ++i) {
    const v1::ChooseResponse c = Choose("p");
    ASSERT_TRUE(Reward("p", c.event_id(), 1.0).ok());
    acknowledged.insert(c.event_id());
  }
  Choose("p", "pending");
  fs_->FailWrites(testing::kWalFile, FaultInjectionFs::Eio());
  EXPECT_EQ(Reward("p", "pending", 1.0).code(), absl::StatusCode::kUnavailable);
  clock_.AdvanceMs(1000);
  EXPECT_EQ(service_->RunMaintenance().code(), absl::StatusCode::kUnavailable);
  fs_->Clear();
  clock_.AdvanceMs(1000);
  const absl::Status round = service_->RunMaintenance();
  EXPECT_TRUE(round.ok()) << round;
  ASSERT_TRUE(Reward("p", "pending", 1.0).ok());
  acknowledged.insert("pending");
  PlayRounds("p", 3);
  Choose("p", "unwritten");
  fs_->FailWrites(testing::kWalFile, FaultInjectionFs::Eio());
  EXPECT_FALSE(Reward("p", "unwritten", 1.0).ok());
  const absl::Status shutdown = service_->Shutdown();  // the SIGTERM path, still failing
  EXPECT_EQ(shutdown.code(), absl::StatusCode::kUnavailable) << shutdown;
  service_.reset();
  fs_->Clear();
  Open();
  const std::set<std::string> logged = LoggedEvents("p");
  EXPECT_TRUE(std::includes(logged.begin(), logged.end(), acknowledged.begin(),
                            acknowledged.end()));
  EXPECT_EQ(logged.size(), acknowledged.size() + 3);
  ExpectEstimatesMatchReference("p");
}

// Shutdown (what SIGTERM runs) while the disk is full returns an error and never aborts;
// if space came back since the last maintenance round, it resumes and writes everything.
TEST_F(StoreFaultTest, ShutdownWhileTheStoreCannotWrite) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  PlayRounds("p", 5);
  Choose("p", "a");
  fs_->FailWrites(testing::kWalFile, FaultInjectionFs::NoSpace());
  EXPECT_FALSE(Reward("p", "a", 1.0).ok());
  const absl::Status faulted = service_->Shutdown();
  EXPECT_EQ(faulted.code(), absl::StatusCode::kUnavailable) << faulted;
  service_.reset();
  fs_->Clear();
  Open();
  EXPECT_EQ(GetProblem("p").samples(), 5);

  Choose("p", "b");
  fs_->FailWrites(testing::kWalFile, FaultInjectionFs::NoSpace());
  EXPECT_FALSE(Reward("p", "b", 1.0).ok());
  fs_->Clear();  // space is back before SIGTERM: shutdown resumes the store itself
  const absl::Status clean = service_->Shutdown();
  EXPECT_TRUE(clean.ok()) << clean;
  service_.reset();
  Open();
  EXPECT_EQ(GetProblem("p").pending(), 1);  // "b" was written by the shutdown
  ASSERT_TRUE(Reward("p", "b", 1.0).ok());
}

// A flush that cannot write its table file stops writes as the WAL does; resuming flushes
// again.
TEST_F(StoreFaultTest, FlushOutOfSpaceStopsWritesUntilResumed) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  PlayRounds("p", 10);
  storage::Store& store = service_->store_for_testing();
  fs_->FailWrites(testing::kTableFile, FaultInjectionFs::NoSpace());
  const absl::Status flush = store.Flush();
  EXPECT_FALSE(flush.ok());
  EXPECT_FALSE(store.Health().writable);
  v1::ChooseResponse c;
  EXPECT_EQ(TryChoose("p", &c).code(), absl::StatusCode::kUnavailable);
  clock_.AdvanceMs(1000);
  EXPECT_EQ(service_->RunMaintenance().code(), absl::StatusCode::kUnavailable);  // still full
  fs_->Clear();
  clock_.AdvanceMs(1000);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  PlayRounds("p", 10);
  fs_->Clear();
  Reopen();
  EXPECT_EQ(GetProblem("p").samples(), 20);
}

// A compaction that cannot write does not stop writes (RocksDB retries it by itself).
// WART: run in the same service after FlushOutOfSpaceStopsWritesUntilResumed's recovery, a
// failing CompactRange was seen to fail a flush as well (reason kFlushNoWAL), which does
// stop writes until the next recovery. Not investigated further.
TEST_F(StoreFaultTest, CompactionOutOfSpaceDoesNotStopWrites) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  storage::Store& store = service_->store_for_testing();
  for (int i = 0; i < 2; ++i) {  // two table files per family: a compaction must write
    PlayRounds("p", 10);
    ASSERT_TRUE(store.Flush().ok());
  }
  fs_->FailWrites(testing::kTableFile, FaultInjectionFs::NoSpace());
  EXPECT_FALSE(store.Compact().ok());
  EXPECT_TRUE(store.Health().writable) << store.Health().error;
  PlayRounds("p", 10);  // decisions and rewards go on
  fs_->Clear();
  Reopen();
  EXPECT_EQ(GetProblem("p").samples(), 30);
  ExpectEstimatesMatchReference("p");
}

// An I/O error reading a table file is a clear error of the call that read, not a crash;
// a restart that cannot read the store says so.
TEST_F(StoreFaultTest, ReadIoErrorIsAClearError) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  PlayRounds("p", 30);
  // The samples move to a table file, of which nothing was read (the block cache is empty).
  ASSERT_TRUE(service_->store_for_testing().Flush().ok());
  fs_->FailReads(testing::kTableFile, FaultInjectionFs::Eio());
  v1::ExportLogRequest req;
  req.set_problem_id("p");
  req.set_start(5);
  const absl::Status exported =
      service_->ExportLog(req, [](const v1::LoggedSample&) { return absl::OkStatus(); });
  EXPECT_EQ(exported.code(), absl::StatusCode::kInternal) << exported;
  EXPECT_THAT(exported.message(), HasSubstr("Input/output error"));
  EXPECT_GT(fs_->injected(), 0);
  EXPECT_TRUE(service_->store_for_testing().Health().writable);  // reads do not stop writes
  ASSERT_TRUE(service_->Shutdown().ok());
  service_.reset();
  const absl::Status reopened = TryOpen();
  EXPECT_EQ(reopened.code(), absl::StatusCode::kInternal) << reopened;
  EXPECT_THAT(reopened.message(), HasSubstr("Input/output error"));
  fs_->Clear();
  ASSERT_TRUE(TryOpen().ok());
  EXPECT_EQ(GetProblem("p").samples(), 30);
}

TEST(LogLimiterTest, PrintsTheFirstThenAtMostOncePerIntervalWithTheCount) {
  LogLimiter limiter(1000);
  int64_t held = -1;
  EXPECT_TRUE(limiter.ShouldPrint(0, &held));
  EXPECT_EQ(held, 0);
  for (int i = 1; i <= 49; ++i) EXPECT_FALSE(limiter.ShouldPrint(i * 20, &held));
  EXPECT_TRUE(limiter.ShouldPrint(1000, &held));
  EXPECT_EQ(held, 49);
  EXPECT_FALSE(limiter.ShouldPrint(1999, &held));
  limiter.Reset();
  EXPECT_TRUE(limiter.ShouldPrint(2000, &held));
  EXPECT_EQ(held, 0);
}

// ------------------------------------------------------------------- The fault matrix

struct Fault {
  const char* name;
  // Makes the fault happen: sets it in `fs` and, where a flush or compaction is what
  // meets it, runs one on `store`. Null for the one fault that is not the store's: an
  // expert that cannot score a context (FaultMatrix::InjectExpertFault).
  std::function<void(FaultInjectionFs& fs, storage::Store& store)> inject;
};

std::vector<Fault> Faults() {
  using testing::kManifestFile;
  using testing::kTableFile;
  using testing::kWalFile;
  return {
      {"WAL: ENOSPC",
       [](FaultInjectionFs& fs, storage::Store&) {
         fs.FailWrites(kWalFile, FaultInjectionFs::NoSpace());
       }},
      {"WAL: EIO",
       [](FaultInjectionFs& fs, storage::Store&) {
         fs.FailWrites(kWalFile, FaultInjectionFs::Eio());
       }},
      {"flush (table file): ENOSPC",
       [](FaultInjectionFs& fs, storage::Store& store) {
         fs.FailWrites(kTableFile, FaultInjectionFs::NoSpace());
         store.Flush().IgnoreError();
       }},
      {"compaction (table file): ENOSPC",
       [](FaultInjectionFs& fs, storage::Store& store) {
         store.Flush().IgnoreError();
         fs.FailWrites(kTableFile, FaultInjectionFs::NoSpace());
         store.Compact().IgnoreError();
       }},
      {"MANIFEST: ENOSPC",
       [](FaultInjectionFs& fs, storage::Store& store) {
         fs.FailWrites(kManifestFile, FaultInjectionFs::NoSpace());
         store.Flush().IgnoreError();
       }},
      {"table file read: EIO",
       [](FaultInjectionFs& fs, storage::Store& store) {
         store.Flush().IgnoreError();
         fs.FailReads(kTableFile, FaultInjectionFs::Eio());
       }},
      {"expert cannot score a context", nullptr},
  };
}

const char* const kColumns[] = {
    "Reward", "Choose", "RegisterExpert", "ExportLog (read)", "maintenance",
    "fault cleared: maintenance, Choose", "shutdown (SIGTERM) while faulted",
    "restart while faulted", "restart after: acknowledged rewards"};

std::map<std::string, std::map<std::string, std::string>>& Table() {
  static auto* table = new std::map<std::string, std::map<std::string, std::string>>();
  return *table;
}

class FaultMatrix : public StoreFaultTest, public ::testing::WithParamInterface<int> {
 protected:
  static void TearDownTestSuite() {
    std::ostringstream out;
    out << "| fault | " << absl::StrJoin(kColumns, " | ") << " |\n|---|";
    for (size_t i = 0; i < std::size(kColumns); ++i) out << "---|";
    out << "\n";
    for (const Fault& f : Faults()) {
      if (Table().count(f.name) == 0) continue;
      out << "| " << f.name << " |";
      for (const char* column : kColumns) out << " " << Table()[f.name][column] << " |";
      out << "\n";
    }
    std::printf("%s", out.str().c_str());
    if (const char* path = std::getenv("DECISION_FAULT_TABLE")) std::ofstream(path) << out.str();
  }

  // The expert fault: a table expert over key feature 0 (rows for keys [0, 2)), accepted
  // because every context seen so far fits it, then a context with key 7. It is quarantined
  // (at the Choose or at the join); the reward is learned by the others.
  void InjectExpertFault(std::set<std::string>* acknowledged) {
    if (expert_fault_injected_) return;  // it stays quarantined
    expert_fault_injected_ = true;
    std::vector<double> prefers_arm_0(kArms, 0.01);
    prefers_arm_0[0] = 1.0 - 0.01 * (kArms - 1);
    v1::Expert table;
    ASSERT_TRUE(service_->RegisterExpert(TableRequest("p", prefers_arm_0), &table).ok());
    RunMaintenanceUntilActive("p");
    key_ = 7.0;
    v1::ChooseResponse c;
    ASSERT_TRUE(TryChoose("p", &c).ok());
    ASSERT_TRUE(Reward("p", c.event_id(), 1.0).ok());
    acknowledged->insert(c.event_id());
    v1::ListExpertsRequest list;
    list.set_problem_id("p");
    v1::ListExpertsResponse experts;
    ASSERT_TRUE(service_->ListExperts(list, &experts).ok());
    EXPECT_EQ(experts.experts(table.expert_id()).status(), v1::EXPERT_STATUS_FAILED);
  }
  bool expert_fault_injected_ = false;
  void Inject(const Fault& fault, std::set<std::string>* acknowledged) {
    if (fault.inject == nullptr) return InjectExpertFault(acknowledged);
    fault.inject(*fs_, service_->store_for_testing());
  }
};

TEST_P(FaultMatrix, StatusCodesOfEachOperation) {
  const Fault fault = Faults()[GetParam()];
  std::map<std::string, std::string>& row = Table()[fault.name];
  CreateProblem("p", /*wait_ms=*/1'000'000);
  std::set<std::string> acknowledged;
  storage::Store& store = service_->store_for_testing();
  for (int i = 0; i < 20; ++i) {
    // A table file per family before the fault, so that a compaction has two to merge.
    if (i == 10) {
      ASSERT_TRUE(store.Flush().ok());
    }
    const v1::ChooseResponse c = Choose("p");
    ASSERT_TRUE(Reward("p", c.event_id(), 1.0).ok());
    acknowledged.insert(c.event_id());
  }
  Choose("p", "pending");
  Inject(fault, &acknowledged);

  const absl::Status reward = Reward("p", "pending", 1.0);
  if (reward.ok()) acknowledged.insert("pending");
  row["Reward"] = Code(reward);
  v1::ChooseResponse c;
  const absl::Status choose = TryChoose("p", &c);
  row["Choose"] = Code(choose);
  row["RegisterExpert"] = Code(TryRegisterUniform("p"));
  row["ExportLog (read)"] = Code(TryExport("p"));
  clock_.AdvanceMs(1000);
  row["maintenance"] = Code(service_->RunMaintenance());
  const bool stopped = !store.Health().writable;
  // Whatever the fault, a Choose answered OK is a decision the store can keep.
  EXPECT_EQ(choose.ok(), !stopped) << choose;
  if (stopped) {
    EXPECT_THAT(choose.message(), HasSubstr("decisions are refused until"));
  }

  fs_->Clear();
  if (key_ == 7.0) {
    // The expert fault "clears" as contexts fit again; the expert stays quarantined.
    key_ = 0.25;
  }
  clock_.AdvanceMs(1000);
  const absl::Status round = service_->RunMaintenance();
  const absl::Status choose_after = TryChoose("p", &c);
  row["fault cleared: maintenance, Choose"] = absl::StrCat(Code(round), ", ", Code(choose_after));
  if (choose_after.ok()) {
    ASSERT_TRUE(Reward("p", c.event_id(), 0.0).ok());
    acknowledged.insert(c.event_id());
  }

  // SIGTERM while faulted: the same fault again, met by a write.
  Choose("p", "late");  // answered now only if the store recovered
  Inject(fault, &acknowledged);
  if (Reward("p", "late", 1.0).ok()) acknowledged.insert("late");
  row["shutdown (SIGTERM) while faulted"] = Code(service_->Shutdown());
  service_.reset();
  const absl::Status restart = TryOpen();
  row["restart while faulted"] = Code(restart);
  if (restart.ok()) {
    service_->Shutdown().IgnoreError();
    service_.reset();
  }
  fs_->Clear();
  ASSERT_TRUE(TryOpen().ok());
  const std::set<std::string> logged = LoggedEvents("p");
  const bool all_there = std::includes(logged.begin(), logged.end(), acknowledged.begin(),
                                       acknowledged.end());
  EXPECT_TRUE(all_there);
  row["restart after: acknowledged rewards"] =
      absl::StrCat(all_there ? "all " : "MISSING ", acknowledged.size(), " present");
}

INSTANTIATE_TEST_SUITE_P(Faults, FaultMatrix, ::testing::Range(0, 7));

// --------------------------------------------------------------- Store open failures

struct Exit {
  int code = -1;    // exit status, or -1
  int signal = 0;   // the signal that ended it, or 0
  std::string err;  // its stderr
};

// Runs decisiond on `data_dir` (as `user` if not empty, via setpriv) until it exits; kills
// it after 60 s (a decisiond that serves instead of failing is a failure of the test).
Exit RunDecisiond(const std::string& data_dir, const std::vector<std::string>& prefix = {}) {
  const std::string err_path = testing::MakeTempDir() + "/stderr";
  std::vector<std::string> args = prefix;
  args.insert(args.end(), {DECISIOND_PATH, "--listen=127.0.0.1:0", "--metrics_listen=",
                           "--data_dir=" + data_dir});
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDERR_FILENO);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  Exit exit;
  int status = 0;
  for (int i = 0; i < 600; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (i == 599) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (WIFEXITED(status)) exit.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) exit.signal = WTERMSIG(status);
  std::ifstream in(err_path);
  std::stringstream text;
  text << in.rdbuf();
  exit.err = text.str();
  return exit;
}

// One line, "decisiond: cannot open the store at DIR: ..." containing `reason`; exit 1.
void ExpectOneClearLine(const Exit& exit, const std::string& dir, const std::string& reason) {
  EXPECT_EQ(exit.signal, 0) << exit.err;
  EXPECT_EQ(exit.code, 1) << exit.err;
  const std::vector<std::string> lines = absl::StrSplit(exit.err, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << exit.err;
  EXPECT_THAT(lines[0], ::testing::StartsWith("decisiond: cannot open the store at " + dir + ": "));
  EXPECT_THAT(lines[0], HasSubstr(reason));
}

// A data directory written by a real decisiond, stopped cleanly.
std::string StoreMadeByDecisiond() {
  const std::string dir = testing::MakeTempDir() + "/data";
  auto process = testing::DecisiondProcess::Start(dir);
  EXPECT_TRUE(process.ok()) << process.status();
  if (process.ok()) {
    auto stub = (*process)->NewStub();
    v1::CreateProblemRequest req;
    req.set_problem_id("p");
    req.mutable_config()->set_num_arms(2);
    req.mutable_config()->set_num_features(1);
    v1::Problem created;
    EXPECT_GRPC_OK(testing::Call(&v1::DecisionService::Stub::CreateProblem, stub.get(), req,
                                 &created));
    EXPECT_EQ((*process)->Terminate(), 0);
  }
  return dir;
}

TEST(StoreOpenFailureTest, DataDirIsAFile) {
  const std::string dir = testing::MakeTempDir() + "/file";
  std::ofstream(dir) << "not a directory";
  ExpectOneClearLine(RunDecisiond(dir), dir, "it is not a directory");
}

TEST(StoreOpenFailureTest, ReadOnlyDataDir) {
  const std::string dir = StoreMadeByDecisiond();
  std::vector<std::string> prefix;
  if (geteuid() == 0) {
    // root writes anywhere: run decisiond as nobody, to whom the directory is read-only.
    if (access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "root without setpriv";
    prefix = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
    for (std::string d = dir; d.size() > 1; d = d.substr(0, d.rfind('/'))) {
      if (d == "/tmp" || d.empty()) break;
      chmod(d.c_str(), 0755);
    }
    // decisiond's files, readable by all.
    for (const auto& e : std::filesystem::directory_iterator(dir)) chmod(e.path().c_str(), 0644);
  }
  chmod(dir.c_str(), 0555);
  ExpectOneClearLine(RunDecisiond(dir, prefix), dir, "not writable");
  chmod(dir.c_str(), 0755);
}

TEST(StoreOpenFailureTest, LockHeldByAnotherDecisiond) {
  const std::string dir = testing::MakeTempDir() + "/data";
  auto first = testing::DecisiondProcess::Start(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectOneClearLine(RunDecisiond(dir), dir, "another process holds its lock");
  EXPECT_EQ((*first)->Terminate(), 0);  // the first one is unharmed
}

TEST(StoreOpenFailureTest, CorruptCurrent) {
  const std::string dir = StoreMadeByDecisiond();
  std::ofstream(dir + "/CURRENT", std::ios::trunc) << "garbage\n";
  ExpectOneClearLine(RunDecisiond(dir), dir, "Corruption");
}

TEST(StoreOpenFailureTest, CorruptManifest) {
  const std::string dir = StoreMadeByDecisiond();
  std::string manifest;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("MANIFEST-", 0) == 0) manifest = e.path().string();
  }
  ASSERT_FALSE(manifest.empty());
  {
    std::fstream f(manifest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    const std::string junk(64, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  ExpectOneClearLine(RunDecisiond(dir), dir, "Corruption");
}

}  // namespace
}  // namespace decision::server
