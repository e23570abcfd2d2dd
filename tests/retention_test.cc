// Retention in the store (Store::ApplyRetention): the range deletions remove what they
// should and nothing else, the events' compaction filter drops only old events that are
// not pending (also where the event ids are in time order, by CompactEventsSoon), the cut
// survives a reopen, and a kill -9 during compaction loses nothing that was kept.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "storage/format.h"
#include "storage/store.h"

namespace decision::storage {
namespace {

constexpr int64_t kChunk = kLogChunkSamples;
constexpr int64_t kSamples = 3 * kChunk + 100;  // three whole chunks and part of one

std::string TempDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/retention_", name, "_", getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

std::string EventId(int64_t i) { return absl::StrCat("event-", i); }

// Problems 0 and 1, each with kSamples joined samples (event i decided at time i ms, but
// the last one at 0: a late join), their log chunks, two experts' backfill chunks, three
// pending decisions decided at 0 ms, and two expired events never joined, decided at 0 and
// at 3 kChunk ms.
void Fill(Store& store) {
  for (uint32_t problem : {0u, 1u}) {
    Store::WriteGroup group;
    for (int64_t i = 0; i < kSamples; ++i) {
      v1::EventRecord event;
      event.set_state(v1::EVENT_STATE_JOINED);
      event.set_decided_at_ms(i == kSamples - 1 ? 0 : i);
      event.set_sequence(i);
      v1::SampleRecord sample;
      sample.set_event_id(EventId(i));
      sample.set_reward(static_cast<double>(i % 2));
      sample.set_decided_at_ms(i);
      ASSERT_TRUE(store.AddJoin(&group, problem, EventId(i), event, i, sample, false).ok());
    }
    for (int i = 0; i < 3; ++i) {
      v1::EventRecord pending;
      pending.set_state(v1::EVENT_STATE_PENDING);
      pending.set_decided_at_ms(0);
      pending.set_deadline_ms(1000000 + i);
      ASSERT_TRUE(store.AddDecision(&group, problem, absl::StrCat("pending-", i), pending).ok());
    }
    for (const auto& [id, at] : {std::pair<std::string, int64_t>{"expired-old", 0},
                                 {"expired-new", 3 * kChunk}}) {
      v1::EventRecord expired;
      expired.set_state(v1::EVENT_STATE_EXPIRED);
      expired.set_decided_at_ms(at);
      expired.set_sequence(-1);
      ASSERT_TRUE(store.AddExpiry(&group, problem, id, expired, false).ok());
    }
    ASSERT_TRUE(store.Commit(&group).ok());
    for (int64_t c = 0; c * kChunk < kSamples; ++c) {
      v1::LogChunk chunk;
      chunk.set_num_experts(static_cast<int>(c));
      ASSERT_TRUE(store.PutLogChunk(problem, c, chunk).ok());
      for (uint32_t e : {0u, 1u}) {
        v1::BackfillChunk b;
        b.add_values(0.5);
        ASSERT_TRUE(store.PutBackfillChunk(problem, e, c, b).ok());
      }
    }
  }
}

std::set<int64_t> Samples(Store& store, uint32_t problem) {
  std::set<int64_t> seen;
  EXPECT_TRUE(store
                  .ForEachSample(problem, 0, 0,
                                 [&](int64_t seq, const v1::SampleRecord& s) {
                                   EXPECT_EQ(s.event_id(), EventId(seq));
                                   seen.insert(seq);
                                   return absl::OkStatus();
                                 })
                  .ok());
  return seen;
}
std::set<uint64_t> LogChunks(Store& store, uint32_t problem) {
  std::set<uint64_t> seen;
  EXPECT_TRUE(store
                  .ForEachLogChunk(problem,
                                   [&](uint64_t c, const v1::LogChunk& r) {
                                     EXPECT_EQ(r.num_experts(), static_cast<int>(c));
                                     seen.insert(c);
                                     return absl::OkStatus();
                                   })
                  .ok());
  return seen;
}
std::set<uint64_t> BackfillChunks(Store& store, uint32_t problem, uint32_t expert) {
  std::set<uint64_t> seen;
  EXPECT_TRUE(store
                  .ForEachBackfillChunk(problem, expert,
                                        [&](uint64_t c, const v1::BackfillChunk&) {
                                          seen.insert(c);
                                          return absl::OkStatus();
                                        })
                  .ok());
  return seen;
}
int64_t Events(Store& store, uint32_t problem, int64_t* oldest_joined) {
  int64_t count = 0;
  *oldest_joined = -1;
  // In pages of 3 ids, which the scan resumes after the last one.
  std::string after;
  for (bool more = true; more;) {
    absl::StatusOr<bool> page =
        store.ScanEventIds(problem, &after, 3, [&](absl::string_view id) {
          ++count;
          auto e = store.GetEvent(problem, id);
          ASSERT_TRUE(e.ok());
          if (e->state() == v1::EVENT_STATE_JOINED &&
              (*oldest_joined < 0 || e->decided_at_ms() < *oldest_joined)) {
            *oldest_joined = e->decided_at_ms();
          }
        });
    EXPECT_TRUE(page.ok()) << page.status();
    more = page.ok() && *page;
  }
  return count;
}

// What problem 0 must hold after a cut at sample 2 * kChunk with events before 2 * kChunk
// ms, and problem 1 untouched; `compacted`: the events filter has run.
void ExpectCut(Store& store, bool compacted) {
  std::set<int64_t> kept = Samples(store, 0);
  ASSERT_EQ(kept.size(), static_cast<size_t>(kSamples - 2 * kChunk));
  EXPECT_EQ(*kept.begin(), 2 * kChunk);
  EXPECT_EQ(*kept.rbegin(), kSamples - 1);
  EXPECT_EQ(LogChunks(store, 0), (std::set<uint64_t>{2, 3}));
  for (uint32_t e : {0u, 1u}) EXPECT_EQ(BackfillChunks(store, 0, e), (std::set<uint64_t>{2, 3}));
  EXPECT_EQ(Samples(store, 1).size(), static_cast<size_t>(kSamples));
  EXPECT_EQ(LogChunks(store, 1).size(), 4u);
  EXPECT_EQ(BackfillChunks(store, 1, 1).size(), 4u);
  int64_t oldest;
  const int64_t events = Events(store, 0, &oldest);
  if (compacted) {
    // The joined events of the deleted samples and the old expired one go; the pending
    // ones, the young expired one and the late join's (decided at 0, its sample kept) stay.
    EXPECT_EQ(events, kSamples - 2 * kChunk + 3 + 1);
    EXPECT_TRUE(absl::IsNotFound(store.GetEvent(0, "expired-old").status()));
  } else {
    EXPECT_GE(events, kSamples - 2 * kChunk + 3 + 1);
  }
  EXPECT_TRUE(store.GetEvent(0, "expired-new").ok());
  EXPECT_TRUE(store.GetEvent(0, EventId(kSamples - 1)).ok()) << "the late join's sample is kept";
  EXPECT_EQ(Events(store, 1, &oldest), kSamples + 3 + 2);
  EXPECT_EQ(oldest, 0);
  int pending = 0;
  EXPECT_TRUE(store
                  .ForEachPending(0,
                                  [&](int64_t, absl::string_view id) {
                                    ++pending;
                                    EXPECT_TRUE(store.GetEvent(0, id).ok()) << id;
                                    return absl::OkStatus();
                                  })
                  .ok());
  EXPECT_EQ(pending, 3);
}

// Sample i of `problem`, joined (decided at i ms), with `features` features.
void AddJoined(Store& store, Store::WriteGroup* group, uint32_t problem, const std::string& id,
               int64_t i, int features) {
  v1::EventRecord event;
  event.set_state(v1::EVENT_STATE_JOINED);
  event.set_decided_at_ms(i);
  event.set_sequence(i);
  v1::SampleRecord sample;
  sample.set_event_id(id);
  for (int f = 0; f < features; ++f) sample.add_features(static_cast<double>(i * 64 + f));
  ASSERT_TRUE(store.AddJoin(group, problem, id, event, i, sample, false).ok());
}

v1::RetentionRecord Cut(int64_t first_sample, int64_t events_before_ms) {
  v1::RetentionRecord cut;
  cut.set_first_sample(first_sample);
  cut.set_events_before_ms(events_before_ms);
  return cut;
}

// Family `name`'s sizes and files, as decisiond exports them (decision_store_sst_files,
// decision_store_live_sst_bytes); all zero if there is none of that name.
Store::FamilySize FamilyOf(Store& store, const std::string& name) {
  for (const Store::FamilySize& f : store.FamilySizes()) {
    if (name == f.family) return f;
  }
  return Store::FamilySize{"none", 0, 0, 0};
}

// The expert records of `problem` the store reads back, or -1 if it cannot.
int ExpertRecords(Store& store, uint32_t problem) {
  int experts = 0;
  const absl::Status s = store.ForEachExpert(problem, [&](uint32_t, const v1::ExpertRecord&) {
    ++experts;
    return absl::OkStatus();
  });
  return s.ok() ? experts : -1;
}

// Writes an expert and a joined sample, then flushes, twice: two table files in each of
// the experts, events and samples families.
void FlushTwoTableFiles(Store& store) {
  for (int flush = 0; flush < 2; ++flush) {
    v1::ExpertRecord expert;
    expert.set_name(absl::StrCat("e", flush));
    ASSERT_TRUE(store.PutExpert(0, static_cast<uint32_t>(flush), expert).ok());
    Store::WriteGroup group;
    AddJoined(store, &group, 0, EventId(flush), flush, /*features=*/4);
    ASSERT_TRUE(store.Commit(&group).ok());
    ASSERT_TRUE(store.Flush().ok());
  }
}

// The small families (records, checkpoints, audit, ...) are flushed a few KB at a time (at
// the WAL's cap, at every shutdown), and with keys in order RocksDB moves each file down
// whole: without CompactSmallFamiliesSoon they pile up (an open fd each) for good. The log's
// families are left alone (retention drops their files whole).
TEST(Store, SmallFamiliesKeepOneTableFile) {
  const std::string dir = TempDir("small_families");
  auto store = Store::Open(dir, StoreOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_NO_FATAL_FAILURE(FlushTwoTableFiles(**store));
  const auto files = [&](const std::string& family) {
    return FamilyOf(**store, family).sst_files;
  };
  (*store)->WaitForEventCompactions();  // whatever RocksDB started after the flushes
  EXPECT_EQ(files("experts"), 2u);        // moved down whole, not merged
  (*store)->CompactSmallFamiliesSoon();
  (*store)->WaitForEventCompactions();
  EXPECT_EQ(files("experts"), 1u);
  EXPECT_EQ(files("samples"), 2u);
  // Both records are in the one file.
  EXPECT_EQ(ExpertRecords(**store, 0), 2);
}

// The nice values of the threads of this process named `name` (none if there is none).
std::vector<int> NiceOfThreads(const std::string& name) {
  std::vector<int> nice;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string n;
    std::getline(comm, n);
    if (n != name) continue;
    // PRIO_PROCESS with a thread id: that thread's nice value (setpriority(2), NOTES).
    const id_t tid = static_cast<id_t>(std::stol(task.path().filename().string()));
    nice.push_back(getpriority(PRIO_PROCESS, tid));
  }
  return nice;
}

// With low_priority_compactions, RocksDB's compaction threads run at nice 19 once they
// have run a compaction (RocksDB applies the priority before a pool thread's next job);
// flushes keep the process's priority.
TEST(Store, LowPriorityCompactionsRunAtNice19) {
  const std::string dir = TempDir("compaction_priority");
  StoreOptions options;
  options.low_priority_compactions = true;
  auto store = Store::Open(dir, options);
  ASSERT_TRUE(store.ok()) << store.status();
  for (int flush = 0; flush < 2; ++flush) {
    v1::ExpertRecord expert;
    expert.set_name(absl::StrCat("e", flush));
    ASSERT_TRUE((*store)->PutExpert(0, static_cast<uint32_t>(flush), expert).ok());
    ASSERT_TRUE((*store)->Flush().ok());
  }
  ASSERT_TRUE((*store)->Compact().ok());
  const std::vector<int> low = NiceOfThreads("rocksdb:low");
  ASSERT_FALSE(low.empty());
  EXPECT_GE(*std::max_element(low.begin(), low.end()), 19);  // at least the one that ran
  const std::vector<int> high = NiceOfThreads("rocksdb:high");
  ASSERT_FALSE(high.empty());
  EXPECT_EQ(*std::max_element(high.begin(), high.end()), getpriority(PRIO_PROCESS, 0));
}

// A family of megabytes (the experts' models) is not rewritten at every flush: merged once
// the files besides its largest add up to half of it, or at four files.
TEST(Store, AFamilyOfMegabytesIsMergedOnceItsNewFilesAddUp) {
  const std::string dir = TempDir("large_family");
  auto store = Store::Open(dir, StoreOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  std::mt19937 gen(7);
  uint32_t next_expert = 0;
  // One expert of `bytes` incompressible model bytes, flushed into a file of its own.
  const auto put_and_flush = [&](size_t bytes) {
    v1::ExpertRecord expert;
    expert.set_name(absl::StrCat("e", next_expert));
    std::string* model = expert.mutable_model()->mutable_xgboost();
    model->resize(bytes);
    for (char& c : *model) c = static_cast<char>(gen());
    ASSERT_TRUE((*store)->PutExpert(0, next_expert++, expert).ok());
    ASSERT_TRUE((*store)->Flush().ok());
    (*store)->WaitForEventCompactions();  // RocksDB's own, at four files in level 0
    (*store)->CompactSmallFamiliesSoon();
    (*store)->WaitForEventCompactions();
  };
  const auto files = [&] { return FamilyOf(**store, "experts").sst_files; };
  put_and_flush(2 << 20);
  ASSERT_EQ(files(), 1u);
  put_and_flush(20 << 10);
  EXPECT_EQ(files(), 2u);  // 20 KB besides 2 MiB: not worth rewriting 2 MiB
  put_and_flush(20 << 10);
  EXPECT_EQ(files(), 3u);
  put_and_flush(20 << 10);
  EXPECT_EQ(files(), 1u);  // four files
  put_and_flush(1200 << 10);
  EXPECT_EQ(files(), 1u);  // 1.2 MiB besides 2.1: more than half
  EXPECT_EQ(ExpertRecords(**store, 0), 5);
}

// Every family of a store, to open its directory with RocksDB itself (handles[2]: experts).
std::vector<rocksdb::ColumnFamilyDescriptor> StoreFamilies() {
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  families.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());
  for (const char* name : kFamilyNames) families.emplace_back(name, rocksdb::ColumnFamilyOptions());
  return families;
}

// The experts family as RocksDB holds it (key -> value), read with the store closed.
std::map<std::string, std::string> RawExperts(const std::string& dir) {
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  std::map<std::string, std::string> out;
  const rocksdb::Status s =
      rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir, StoreFamilies(), &handles, &db);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return out;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[2]));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    out[it->key().ToString()] = it->value().ToString();
  }
  it.reset();
  for (rocksdb::ColumnFamilyHandle* h : handles) {
    EXPECT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  }
  delete db;
  return out;
}

std::string ExpertKey(uint32_t problem, uint32_t expert) {
  std::string k(8, '\0');
  for (int i = 0; i < 4; ++i) {
    k[i] = static_cast<char>(problem >> (24 - 8 * i));
    k[4 + i] = static_cast<char>(expert >> (24 - 8 * i));
  }
  return k;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(gen());
  return bytes;
}

// A model is written once, at registration, under a key of its own: a rewrite of the
// expert's state (a status change, a retirement) writes the small record alone and leaves
// the model; readers get the record with its model; an unloaded expert's model is deleted.
TEST(Store, AModelIsStoredOnceApartFromItsExpertsRecord) {
  const std::string dir = TempDir("model_apart");
  const std::string model = RandomBytes(200 << 10, 3);
  {
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    v1::ExpertRecord registered;
    registered.set_name("trees");
    registered.set_status(v1::EXPERT_STATE_BACKFILLING);
    registered.mutable_model()->set_xgboost(model);
    ASSERT_TRUE((*store)->PutExpert(0, 1, registered).ok());
    v1::ExpertRecord active = registered;
    DropModelPayload(active.mutable_model());
    active.set_status(v1::EXPERT_STATE_ACTIVE);
    ASSERT_TRUE((*store)->PutExpert(0, 1, active).ok());
    absl::StatusOr<v1::ExpertRecord> read = (*store)->GetExpert(0, 1);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->status(), v1::EXPERT_STATE_ACTIVE);
    EXPECT_TRUE(read->model().xgboost() == model);
    int seen = 0;
    ASSERT_TRUE((*store)->ForEachExpert(0, [&](uint32_t id, const v1::ExpertRecord& r) {
      ++seen;
      EXPECT_EQ(id, 1u);
      EXPECT_TRUE(r.model().xgboost() == model);
      return absl::OkStatus();
    }).ok());
    EXPECT_EQ(seen, 1);
  }
  std::map<std::string, std::string> raw = RawExperts(dir);
  ASSERT_EQ(raw.size(), 2u);
  v1::ExpertRecord stored;
  ASSERT_TRUE(stored.ParseFromString(raw[ExpertKey(0, 1)]));
  EXPECT_LT(raw[ExpertKey(0, 1)].size(), 100u);  // the state alone
  EXPECT_TRUE(stored.model_apart());
  EXPECT_TRUE(stored.model().has_xgboost());  // its kind
  v1::ExpertModelRecord apart;
  ASSERT_TRUE(apart.ParseFromString(raw[ExpertKey(0, 1) + "m"]));
  EXPECT_TRUE(apart.xgboost() == model);
  {
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    v1::ExpertRecord unloaded = stored;
    unloaded.set_model_apart(false);
    unloaded.set_status(v1::EXPERT_STATE_RETIRED);
    unloaded.set_unloaded_at_sample(100);
    ASSERT_TRUE((*store)->PutExpert(0, 1, unloaded).ok());
    absl::StatusOr<v1::ExpertRecord> read = (*store)->GetExpert(0, 1);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(read->model().xgboost().empty());
    EXPECT_EQ(read->unloaded_at_sample(), 100);
  }
  EXPECT_EQ(RawExperts(dir).size(), 1u);  // the model is gone
}

// A store written before models were kept apart has each model inline in its expert's
// record: it reads as before, and the record's next rewrite moves the model apart.
TEST(Store, AModelStoredInlineIsMovedApartAtItsRecordsNextRewrite) {
  const std::string dir = TempDir("model_inline");
  const std::string model = RandomBytes(50 << 10, 4);
  {
    auto store = Store::Open(dir, StoreOptions());  // creates the families
    ASSERT_TRUE(store.ok()) << store.status();
  }
  v1::ExpertRecord old_format;
  old_format.set_name("trees");
  old_format.set_status(v1::EXPERT_STATE_BACKFILLING);
  old_format.mutable_model()->set_xgboost(model);
  {
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, StoreFamilies(), &handles, &db).ok());
    EXPECT_TRUE(db->Put(rocksdb::WriteOptions(), handles[2], ExpertKey(0, 1),
                        old_format.SerializeAsString())
                    .ok());
    for (rocksdb::ColumnFamilyHandle* h : handles) {
      EXPECT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
    }
    delete db;
  }
  {
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<v1::ExpertRecord> read = (*store)->GetExpert(0, 1);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(read->model().xgboost() == model);
    v1::ExpertRecord active = *read;
    DropModelPayload(active.mutable_model());
    active.set_status(v1::EXPERT_STATE_ACTIVE);
    ASSERT_TRUE((*store)->PutExpert(0, 1, active).ok());
    read = (*store)->GetExpert(0, 1);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->status(), v1::EXPERT_STATE_ACTIVE);
    EXPECT_TRUE(read->model().xgboost() == model);
  }
  std::map<std::string, std::string> raw = RawExperts(dir);
  ASSERT_EQ(raw.size(), 2u);
  EXPECT_LT(raw[ExpertKey(0, 1)].size(), 100u);
  v1::ExpertModelRecord apart;
  ASSERT_TRUE(apart.ParseFromString(raw[ExpertKey(0, 1) + "m"]));
  EXPECT_TRUE(apart.xgboost() == model);
}

// The descriptors a store holds on its own directory (RocksDB's directory handles).
int DirectoryHandles(const std::string& dir) {
  int n = 0;
  const std::filesystem::path target = std::filesystem::canonical(dir);
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::filesystem::path to = std::filesystem::read_symlink(fd.path(), ec);
    n += !ec && to == target;
  }
  return n;
}

// RocksDB holds a directory handle per column family it creates until the database
// closes: a new store is created, closed and opened again, so that its first incarnation
// holds the descriptors every later one does.
TEST(Store, ANewStoreHoldsTheDescriptorsOfAReopenedOne) {
  const std::string dir = TempDir("descriptors");
  auto store = Store::Open(dir, StoreOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  const int created = DirectoryHandles(dir);
  ASSERT_TRUE((*store)->Close().ok());
  store = Store::Open(dir, StoreOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  const int reopened = DirectoryHandles(dir);
  EXPECT_EQ(created, reopened);
  EXPECT_GE(reopened, 1);
  EXPECT_LE(reopened, 2);
}

// Records the threads that open the table files named in `names` (RocksDB opens a
// table file for reading once, into its table cache).
class TableOpenRecorder final : public rocksdb::FileSystemWrapper {
 public:
  explicit TableOpenRecorder(std::set<std::string> names)
      : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()), names_(std::move(names)) {}
  const char* Name() const override { return "TableOpenRecorder"; }
  rocksdb::IOStatus NewRandomAccessFile(const std::string& f,
                                        const rocksdb::FileOptions& options,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* r,
                                        rocksdb::IODebugContext* dbg) override {
    if (names_.count(std::filesystem::path(f).filename().string()) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      openers_.push_back(std::this_thread::get_id());
    }
    return target()->NewRandomAccessFile(f, options, r, dbg);
  }
  std::vector<std::thread::id> openers() {
    std::lock_guard<std::mutex> lock(mu_);
    return openers_;
  }

 private:
  const std::set<std::string> names_;
  std::mutex mu_;
  std::vector<std::thread::id> openers_;
};

// RocksDB opens a database's table files on max_file_opening_threads threads, and starts
// that many less one for every column family at each open, however few files there are:
// a store of a few files opens them on the thread that opens it (FileOpeningThreads).
TEST(Store, AStoreOfAFewTableFilesOpensThemOnTheOpeningThread) {
  const std::string dir = TempDir("file_opening_threads");
  {
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_NO_FATAL_FAILURE(FlushTwoTableFiles(**store));
    ASSERT_TRUE((*store)->Close().ok());
  }
  std::set<std::string> tables;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".sst") tables.insert(entry.path().filename().string());
  }
  ASSERT_GE(tables.size(), 4u);
  auto recorder = std::make_shared<TableOpenRecorder>(tables);
  StoreOptions options;
  options.env = rocksdb::NewCompositeEnv(recorder);
  auto store = Store::Open(dir, options);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::vector<std::thread::id> openers = recorder->openers();
  EXPECT_EQ(openers.size(), tables.size());
  for (const std::thread::id& id : openers) EXPECT_EQ(id, std::this_thread::get_id());
  ASSERT_TRUE((*store)->Close().ok());
  // The rule: one thread per 32 files, at most RocksDB's default.
  EXPECT_EQ(FileOpeningThreads(0), 1);
  EXPECT_EQ(FileOpeningThreads(63), 1);
  EXPECT_EQ(FileOpeningThreads(64), 2);
  EXPECT_EQ(FileOpeningThreads(100000), 16);
}

TEST(Retention, DeletesWhatItShouldAndNothingElse) {
  const std::string dir = TempDir("deletes");
  {
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    Fill(**store);
    EXPECT_TRUE(absl::IsNotFound((*store)->GetRetention(0).status()));
    // Refused: a cut inside a chunk; nothing is deleted.
    EXPECT_EQ((*store)->ApplyRetention(0, {0, 1}, Cut(kChunk + 1, 0)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Samples(**store, 0).size(), static_cast<size_t>(kSamples));
    ASSERT_TRUE((*store)->ApplyRetention(0, {0, 1}, Cut(kChunk, kChunk)).ok());
    ASSERT_TRUE((*store)->ApplyRetention(0, {0, 1}, Cut(2 * kChunk, 2 * kChunk)).ok());
    // Refused: a cut that moves back.
    EXPECT_EQ((*store)->ApplyRetention(0, {0, 1}, Cut(kChunk, 2 * kChunk)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*store)->ApplyRetention(0, {0, 1}, Cut(2 * kChunk, kChunk)).code(),
              absl::StatusCode::kInvalidArgument);
    ExpectCut(**store, /*compacted=*/false);
    ASSERT_TRUE((*store)->Close().ok());
  }
  // The cut is kept, and compactions after the reopen apply it to the events.
  auto store = Store::Open(dir, StoreOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  auto cut = (*store)->GetRetention(0);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->first_sample(), 2 * kChunk);
  ASSERT_TRUE((*store)->Compact().ok());
  ExpectCut(**store, /*compacted=*/true);
  EXPECT_TRUE(absl::IsNotFound((*store)->GetEvent(0, EventId(0)).status()));
  EXPECT_TRUE(absl::IsNotFound((*store)->GetEvent(0, EventId(2 * kChunk - 1)).status()));
  EXPECT_TRUE((*store)->GetEvent(0, EventId(2 * kChunk)).ok());
  EXPECT_TRUE((*store)->GetEvent(1, EventId(0)).ok());
}

// The bytes of the store's table files.
int64_t SstBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".sst") total += static_cast<int64_t>(entry.file_size());
  }
  return total;
}

// Range deletions free no disk until compactions reach the files under them, and with keys
// in sequence order the oldest files are the last a compaction reaches. The files wholly
// before a cut are dropped at once; a file that straddles it stays, and reads past the cut
// are unchanged.
TEST(Retention, FilesWhollyBeforeTheCutAreDroppedAtOnce) {
  const std::string dir = TempDir("files");
  auto store = Store::Open(dir, StoreOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  // One table file per chunk of samples, below level 0 (where old data lives; RocksDB drops
  // no level-0 file by range): each chunk is flushed and compacted down, next to the
  // earlier ones, whose keys it does not overlap. Contexts of 64 features make the samples
  // most of the bytes.
  for (int64_t c = 0; c < 3; ++c) {
    Store::WriteGroup group;
    for (int64_t i = c * kChunk; i < (c + 1) * kChunk; ++i) {
      AddJoined(**store, &group, 0, EventId(i), i, /*features=*/64);
    }
    ASSERT_TRUE((*store)->Commit(&group).ok());
    ASSERT_TRUE((*store)->Flush().ok());
    ASSERT_TRUE((*store)->Compact().ok());
  }
  const int64_t before = SstBytes(dir);
  // What decisiond exports of it (decision_store_sst_files, decision_store_live_sst_bytes).
  const Store::FamilySize three = FamilyOf(**store, "samples");
  EXPECT_EQ(three.sst_files, 3u);
  EXPECT_GT(three.live_sst_bytes, 0u);
  ASSERT_TRUE((*store)->ApplyRetention(0, {}, Cut(2 * kChunk, 0)).ok());
  const int64_t after = SstBytes(dir);
  // Two of the three samples' files are gone, without a compaction.
  EXPECT_LT(after, before / 2) << before << " -> " << after;
  const Store::FamilySize one = FamilyOf(**store, "samples");
  EXPECT_EQ(one.sst_files, 1u);
  EXPECT_LT(one.live_sst_bytes, three.live_sst_bytes / 2);
  EXPECT_GT(one.live_sst_bytes, 0u);
  const std::set<int64_t> kept = Samples(**store, 0);
  ASSERT_EQ(kept.size(), static_cast<size_t>(kChunk));
  EXPECT_EQ(*kept.begin(), 2 * kChunk);
  EXPECT_TRUE(absl::IsNotFound((*store)->GetSample(0, 2 * kChunk - 1).status()));
  EXPECT_TRUE((*store)->GetSample(0, 3 * kChunk - 1).ok());
  // Nothing comes back after a reopen.
  ASSERT_TRUE((*store)->Close().ok());
  store = Store::Open(dir, StoreOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(Samples(**store, 0).size(), static_cast<size_t>(kChunk));
  EXPECT_TRUE(absl::IsNotFound((*store)->GetSample(0, 0).status()));
}

// A kill -9 at any point of a compaction that applies the cut: the reopened store holds
// what was kept, intact, and compacting again finishes the deletion.
// Event ids in time order (a counter, a time-based id): the files of old events do not
// overlap new ones, so RocksDB's compactions move them down whole and the events' filter
// never sees them. CompactEventsSoon rewrites the problem's events, the bottom level
// included: the cut ones go, the kept ones and the other problem's stay.
TEST(Retention, ACompactionOfAProblemsEventsDropsTheCutOnes) {
  const std::string dir = TempDir("event_compaction");
  auto store = Store::Open(dir, StoreOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  const auto id = [](int64_t i) { return absl::StrCat("t", 1000000000 + i); };
  for (int64_t c = 0; c < 3; ++c) {
    for (uint32_t problem : {0u, 1u}) {
      Store::WriteGroup group;
      for (int64_t i = c * kChunk; i < (c + 1) * kChunk; ++i) {
        AddJoined(**store, &group, problem, id(i), i, /*features=*/0);
      }
      ASSERT_TRUE((*store)->Commit(&group).ok());
    }
    ASSERT_TRUE((*store)->Flush().ok());
    ASSERT_TRUE((*store)->Compact().ok());  // to the bottom level, before any cut
  }
  int64_t oldest;
  ASSERT_TRUE((*store)->ApplyRetention(0, {}, Cut(2 * kChunk, 0)).ok());
  EXPECT_EQ(Events(**store, 0, &oldest), 3 * kChunk);  // the cut alone drops no event
  (*store)->CompactEventsSoon(0);
  (*store)->WaitForEventCompactions();
  EXPECT_EQ((*store)->event_compactions().done, 1);
  EXPECT_EQ((*store)->event_compactions().failed, 0);
  EXPECT_EQ(Events(**store, 0, &oldest), kChunk);
  EXPECT_EQ(oldest, 2 * kChunk);
  EXPECT_TRUE(absl::IsNotFound((*store)->GetEvent(0, id(2 * kChunk - 1)).status()));
  EXPECT_TRUE((*store)->GetEvent(0, id(2 * kChunk)).ok());
  EXPECT_EQ(Events(**store, 1, &oldest), 3 * kChunk);
  EXPECT_EQ(oldest, 0);
  // A close with compactions asked for ends them (cancelled or done), without waiting
  // for more.
  (*store)->CompactEventsSoon(0);
  (*store)->CompactEventsSoon(1);
  ASSERT_TRUE((*store)->Close().ok());
}

TEST(Retention, AKillDuringCompactionLosesNothingKept) {
  for (int trial = 0; trial < 3; ++trial) {
    const std::string dir = TempDir(absl::StrCat("kill", trial));
    {
      auto store = Store::Open(dir, StoreOptions());
      ASSERT_TRUE(store.ok());
      Fill(**store);
      ASSERT_TRUE((*store)->Flush().ok());  // so that compactions have files to rewrite
      ASSERT_TRUE((*store)->Close().ok());
    }
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      dup2(ready[1], 1);
      const std::string first = absl::StrCat(2 * kChunk);
      execl(RETENTION_COMPACTOR_PATH, RETENTION_COMPACTOR_PATH, dir.c_str(), first.c_str(),
            first.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(ready[1]);
    char byte = 0;
    ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the helper could not apply the cut";
    close(ready[0]);
    // Where it dies varies (the helper compacts in a loop); any point must do.
    usleep(static_cast<useconds_t>(trial * 30000));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    ExpectCut(**store, /*compacted=*/false);
    ASSERT_TRUE((*store)->Compact().ok());
    ExpectCut(**store, /*compacted=*/true);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace decision::storage
