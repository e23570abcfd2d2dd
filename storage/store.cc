#include "storage/store.h"

#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/table.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "storage/format.h"
#include "storage/retention.h"

namespace decision::storage {
namespace {

// The one place where rocksdb::Status becomes absl::Status.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat(what, ": not found"));
  return absl::InternalError(absl::StrCat("storage: ", what, ": ", s.ToString()));
}

void AppendU32(std::string* key, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) key->push_back(static_cast<char>(v >> shift));
}
void AppendU64(std::string* key, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) key->push_back(static_cast<char>(v >> shift));
}
uint64_t ReadU64(absl::string_view bytes) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(bytes[i]);
  return v;
}
uint32_t ReadU32(absl::string_view bytes) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(bytes[i]);
  return v;
}

std::string Key32(uint32_t a) {
  std::string k;
  AppendU32(&k, a);
  return k;
}
std::string PendingKey(uint32_t problem, int64_t deadline_ms, absl::string_view event_id) {
  std::string k = Key32(problem);
  AppendU64(&k, static_cast<uint64_t>(deadline_ms));
  k.append(event_id.data(), event_id.size());
  return k;
}

// The first key past every key of `problem`'s prefix (the last index has no successor:
// past every 4-byte-prefixed key).
std::string PrefixEnd(uint32_t problem) {
  return problem == UINT32_MAX ? std::string(5, '\xff') : Key32(problem + 1);
}

std::string Key32x2(uint32_t a, uint32_t b) {
  std::string k = Key32(a);
  AppendU32(&k, b);
  return k;
}

// Where an expert's model payload is kept (ExpertRecord.model_apart): just after its record.
std::string ExpertModelKey(uint32_t problem, uint32_t expert) {
  std::string k = Key32x2(problem, expert);
  k.push_back('m');
  return k;
}

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::Status OpenFailure(const std::string& path, absl::string_view reason) {
  return absl::InternalError(absl::StrCat("cannot open the store at ", path, ": ", reason));
}

// Whether `path` can hold the store (creating it if asked): the failures an operator makes
// (a file where the directory should be, a read-only directory), named before RocksDB
// reports them in its own words ("While renaming a file to .../LOG.old...").
absl::Status CheckDirectory(const std::string& path, bool create) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (std::filesystem::exists(st)) {
    if (!std::filesystem::is_directory(st)) return OpenFailure(path, "it is not a directory");
  } else if (create) {
    std::filesystem::create_directories(path, ec);
    if (ec) return OpenFailure(path, absl::StrCat("cannot create the directory: ", ec.message()));
  } else {
    return OpenFailure(path, "it does not exist");
  }
  if (access(path.c_str(), R_OK | W_OK | X_OK) != 0) {
    return OpenFailure(path, absl::StrCat("the directory is not writable (",
                                          std::error_code(errno, std::generic_category()).message(),
                                          ")"));
  }
  return absl::OkStatus();
}

// How much of a record's value an export page gives, from `offset`, when it holds `bytes`
// of `max_bytes` already: the rest if the record fits; nothing if it does not (it starts
// the next page); a part of a page if it is larger than a page on its own.
std::optional<int64_t> ExportedLength(size_t key_size, size_t value_size, int64_t offset,
                                      int64_t bytes, int64_t max_bytes) {
  const int64_t rest = static_cast<int64_t>(value_size) - offset;
  const int64_t key = static_cast<int64_t>(key_size);
  if (bytes + key + rest <= max_bytes) return rest;
  if (bytes > 0) return std::nullopt;
  return std::min(rest, std::max<int64_t>(1, max_bytes - key));
}

// Gives `fn` `length` bytes of `value` from `offset` as the record `key` of `family` (a
// part if that is not the whole value), and moves the cursor past them.
void GiveExported(int family, absl::string_view key, absl::string_view value, int64_t offset,
                  int64_t length, Store::ExportCursor* cursor,
                  const std::function<void(const Store::ProblemEntry&)>& fn) {
  Store::ProblemEntry e;
  e.family = family;
  e.key.assign(key.data(), key.size());
  e.value.assign(value.data() + offset, static_cast<size_t>(length));
  const bool whole = offset == 0 && length == static_cast<int64_t>(value.size());
  if (!whole) {
    e.value_offset = offset;
    e.value_size = static_cast<int64_t>(value.size());
  }
  fn(e);
  cursor->family = family;
  cursor->started = true;
  cursor->after = e.key;
  cursor->offset = offset + length < static_cast<int64_t>(value.size()) ? offset + length : 0;
}

absl::Status PartGone() {
  return absl::AbortedError(
      "storage: the record being exported in parts changed or is gone since its first part");
}

}  // namespace

// RocksDB's background errors as Store::Health() reports them. Written by the listener
// (on RocksDB's threads, or on the thread whose write failed, before its write returns)
// and by Store::Recover.
class StoreHealthTracker {
 public:
  explicit StoreHealthTracker(std::function<int64_t()> now_ms) : now_ms_(std::move(now_ms)) {}

  // `stops_writes`: RocksDB refuses writes until the error is cleared.
  void OnError(const rocksdb::Status& error, bool stops_writes, bool fatal) {
    absl::MutexLock lock(&mu_);
    fatal_ = fatal_ || fatal;
    // RocksDB reports errors milder than the one in force too: the first error that stops
    // writes is kept, else the first error.
    if (!health_.writable || (!health_.error.ok() && !stops_writes)) return;
    if (health_.error.ok()) health_.since_ms = now_ms_();
    health_.error = absl::UnavailableError(error.ToString());
    if (stops_writes) {
      health_.writable = false;
      writable_.store(false);
    }
  }
  void OnRecovered() {
    absl::MutexLock lock(&mu_);
    if (!health_.writable) ++health_.recoveries;
    health_.writable = true;
    writable_.store(true);
    health_.error = absl::OkStatus();
    health_.since_ms = 0;
    fatal_ = false;
  }
  void CountWriteError() {
    absl::MutexLock lock(&mu_);
    ++health_.write_errors;
  }
  StoreHealth Get() const {
    absl::MutexLock lock(&mu_);
    return health_;
  }
  bool fatal() const {
    absl::MutexLock lock(&mu_);
    return fatal_;
  }
  bool writable() const { return writable_.load(); }

 private:
  const std::function<int64_t()> now_ms_;
  mutable absl::Mutex mu_;
  StoreHealth health_ ABSL_GUARDED_BY(mu_);
  bool fatal_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> writable_{true};
};

namespace {

// Tells the tracker about RocksDB's background errors and their end, and turns RocksDB's
// automatic recovery off for the errors that stop writes (Store::Recover is the one way
// out: see store.h). Called with no RocksDB lock held.
class HealthListener final : public rocksdb::EventListener {
 public:
  explicit HealthListener(std::shared_ptr<StoreHealthTracker> tracker)
      : tracker_(std::move(tracker)) {}

  void OnBackgroundError(rocksdb::BackgroundErrorReason reason,
                         rocksdb::Status* error) override {
    // RocksDB 7.8 rates the error before this call, except for the "retryable" I/O errors,
    // which reach here unrated (kNoError) and then stop writes, unless they came from a
    // compaction (which RocksDB reschedules itself).
    const rocksdb::Status::Severity severity = error->severity();
    const bool stops_writes =
        severity >= rocksdb::Status::Severity::kHardError ||
        (severity == rocksdb::Status::Severity::kNoError &&
         reason != rocksdb::BackgroundErrorReason::kCompaction);
    tracker_->OnError(*error, stops_writes,
                      severity >= rocksdb::Status::Severity::kFatalError);
  }
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status error,
                            bool* auto_recovery) override {
    if (error.severity() >= rocksdb::Status::Severity::kHardError) *auto_recovery = false;
  }
  void OnErrorRecoveryEnd(const rocksdb::BackgroundErrorRecoveryInfo& info) override {
    if (info.new_bg_error.ok()) tracker_->OnRecovered();
  }

 private:
  const std::shared_ptr<StoreHealthTracker> tracker_;
};

// A write RocksDB refused: UNAVAILABLE if RocksDB stopped writing (the caller may retry
// once the store recovers), else as FromRocks.
absl::Status WriteError(StoreHealthTracker& health, const rocksdb::Status& s,
                        absl::string_view what) {
  health.CountWriteError();
  if (!health.writable()) {
    return absl::UnavailableError(
        absl::StrCat("the store cannot write (", what, "): ", s.ToString()));
  }
  return FromRocks(s, what);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path,
                                                   const StoreOptions& options) {
  if (absl::Status s = CheckDirectory(path, options.create_if_missing); !s.ok()) return s;
  std::unique_ptr<Store> store(new Store());
  store->path_ = path;
  store->options_ = options;
  store->health_ = std::make_shared<StoreHealthTracker>(
      options.now_ms ? options.now_ms : std::function<int64_t()>(SystemNowMs));
  store->cuts_ = std::make_shared<RetentionCuts>();
  store->event_filter_ = NewEventRetentionFilter(store->cuts_);
  std::unique_lock<std::shared_mutex> lock(store->db_mu_);
  if (absl::Status s = store->OpenDbLocked(); !s.ok()) return s;
  std::unique_ptr<rocksdb::Iterator> last(
      store->db_->NewIterator(rocksdb::ReadOptions(), store->audit_));
  last->SeekToLast();
  if (last->Valid()) {
    if (last->key().size() != 8) {
      return absl::DataLossError("storage: an audit key is not 8 bytes");
    }
    absl::MutexLock audit(&store->audit_mu_);
    store->next_audit_ =
        static_cast<int64_t>(ReadU64(absl::string_view(last->key().data(), 8))) + 1;
  }
  if (!last->status().ok()) {
    return OpenFailure(path, absl::StrCat("reading the audit log: ", last->status().ToString()));
  }
  return store;
}

int FileOpeningThreads(int table_files) { return std::clamp(table_files / 32, 1, 16); }

absl::Status Store::OpenDbLocked() {
  rocksdb::Options db_options;
  db_options.create_if_missing = options_.create_if_missing;
  db_options.create_missing_column_families = true;
  db_options.IncreaseParallelism(2);
  if (options_.env != nullptr) db_options.env = options_.env.get();
  // A directory that does not list (a new store) has no table files.
  std::vector<std::string> children;
  int table_files = 0;
  if (db_options.env->GetChildren(path_, &children).ok()) {
    for (const std::string& name : children) table_files += absl::EndsWith(name, ".sst");
  }
  db_options.max_file_opening_threads = FileOpeningThreads(table_files);
  // Memory: one budget for all memtables and one block cache shared by every family
  // (RocksDB's defaults give each of the ten families its own 64 MiB memtables and
  // 8 MiB cache). The memtables fill and flush in a sawtooth that RSS follows (they are
  // freed at their flush): 32 MiB, not 64, halves its swing, at no cost measured in
  // throughput or CPU per request (bench/README.md, "Soak").
  db_options.db_write_buffer_size = 32 << 20;
  // The WAL is kept until every family with data in it is flushed, and the small families
  // (checkpoints, experts) rarely fill a memtable: without a cap the WAL grows to 4x the
  // write buffers of all ten families (320 MiB) before RocksDB flushes them, and a restart
  // replays all of it.
  db_options.max_total_wal_size = 128 << 20;
  db_options.enable_pipelined_write = false;  // one committer per problem: nothing to pipeline
  db_options.listeners.push_back(std::make_shared<HealthListener>(health_));
  if (options_.low_priority_compactions) {
    // Not supported by every Env (a test's wrapper may not forward it): then they stay.
    db_options.env
        ->LowerThreadPoolCPUPriority(rocksdb::Env::Priority::LOW, rocksdb::CpuPriority::kLow)
        .PermitUncheckedError();
  }
  rocksdb::BlockBasedTableOptions table;
  block_cache_ = rocksdb::NewLRUCache(32 << 20);
  table.block_cache = block_cache_;
  // Most event lookups miss (every Choose with a new caller event id): Bloom filters in the
  // files and in the memtables answer those without a search.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  rocksdb::ColumnFamilyOptions family_options;
  family_options.write_buffer_size = 8 << 20;
  family_options.memtable_whole_key_filtering = true;
  family_options.memtable_prefix_bloom_size_ratio = 0.02;
  family_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  families.emplace_back(rocksdb::kDefaultColumnFamilyName, family_options);
  for (const char* name : kFamilyNames) families.emplace_back(name, family_options);
  // Retention drops old events as the events family compacts (retention.h).
  families[3].options.compaction_filter = event_filter_.get();
  // RocksDB opens a directory handle for each column family it creates, held until the
  // database closes, where an open of existing families shares one: a store created here
  // is closed and opened again, so that every incarnation holds the same descriptors
  // (ten fewer for a new store's first).
  std::vector<std::string> existing;
  if (options_.create_if_missing &&
      (!rocksdb::DB::ListColumnFamilies(db_options, path_, &existing).ok() ||
       existing.size() < families.size())) {
    rocksdb::DB* created = nullptr;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::Status s = rocksdb::DB::Open(db_options, path_, families, &handles, &created);
    if (s.ok()) {
      for (rocksdb::ColumnFamilyHandle* h : handles) {
        if (s.ok()) s = created->DestroyColumnFamilyHandle(h);
      }
      if (s.ok()) s = created->Close();
    }
    delete created;
    // A failure here fails the open below the same way, which says why.
  }
  rocksdb::Status s = rocksdb::DB::Open(db_options, path_, families, &handles_, &db_);
  if (!s.ok()) {
    db_ = nullptr;
    handles_.clear();
    // WART: RocksDB says "lock" only in its message (an IOError either way).
    if (s.IsIOError() && absl::StrContains(s.ToString(), "lock")) {
      return OpenFailure(path_, absl::StrCat("another process holds its lock (is another "
                                             "decisiond running on it?): ", s.ToString()));
    }
    return OpenFailure(path_, s.ToString());
  }
  problems_ = handles_[1];
  experts_ = handles_[2];
  events_ = handles_[3];
  samples_ = handles_[4];
  backfill_ = handles_[5];
  checkpoints_ = handles_[6];
  pending_ = handles_[7];
  logchunks_ = handles_[8];
  audit_ = handles_[9];
  training_jobs_ = handles_[10];
  // The problems' retention cuts, for the compaction filter (before this, compactions keep
  // every event: the filter errs on keeping).
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), checkpoints_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (it->key().size() != 8 || ReadU32(absl::string_view(it->key().data() + 4, 4)) != 2) {
      continue;
    }
    v1::RetentionRecord cut;
    if (!cut.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      continue;  // reported by GetRetention, where the problem loads
    }
    cuts_->Set(ReadU32(absl::string_view(it->key().data(), 4)),
               {cut.first_sample(), cut.events_before_ms()});
  }
  if (!it->status().ok()) {
    return OpenFailure(path_, absl::StrCat("reading the retention cuts: ", it->status().ToString()));
  }
  return absl::OkStatus();
}

absl::Status Store::CloseDbLocked() {
  EndWatchesLocked();  // RocksDB refuses to close with a snapshot held
  absl::Status status = absl::OkStatus();
  if (health_->writable()) {
    status = FromRocks(db_->FlushWAL(/*sync=*/true), "flushing the WAL");
  } else {
    // Syncing a WAL whose writer failed trips an assertion in RocksDB (see Close in store.h).
    status = absl::UnavailableError(absl::StrCat(
        "storage: closed without syncing the WAL: the store cannot write: ",
        health_->Get().error.message()));
  }
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    rocksdb::Status s = db_->DestroyColumnFamilyHandle(h);
    if (status.ok()) status = FromRocks(s, "closing a column family");
  }
  handles_.clear();
  rocksdb::Status s = db_->Close();
  if (status.ok()) status = FromRocks(s, "closing");
  delete db_;
  db_ = nullptr;
  return status;
}

Store::~Store() { Close().IgnoreError(); }

bool Store::Writable() const { return health_ == nullptr || health_->writable(); }

StoreHealth Store::Health() const { return health_ == nullptr ? StoreHealth() : health_->Get(); }

absl::Status Store::NotOpen() const {
  if (closed_) return absl::FailedPreconditionError("storage is closed");
  return absl::UnavailableError(absl::StrCat(
      "the store cannot write and is being reopened: ", health_->Get().error.message()));
}

bool Store::MemtablesEmptyLocked() {
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    uint64_t active = 0, immutable = 0;
    if (!db_->GetIntProperty(h, rocksdb::DB::Properties::kNumEntriesActiveMemTable, &active) ||
        !db_->GetIntProperty(h, rocksdb::DB::Properties::kNumImmutableMemTable, &immutable) ||
        active > 0 || immutable > 0) {
      return false;
    }
  }
  return true;
}

absl::Status Store::Recover() {
  // A compaction of events running would hold db_mu_ until it ends: cancel it.
  compact_canceled_ = true;
  std::unique_lock<std::shared_mutex> lock(db_mu_);
  compact_canceled_ = false;
  if (closed_) return absl::FailedPreconditionError("storage is closed");
  if (health_->writable()) return absl::OkStatus();
  absl::Status failed;
  // DB::Resume flushes the memtables, and a flush starts a new WAL: with every memtable
  // empty (the write that failed was the first into its WAL) nothing is flushed, RocksDB
  // 7.8 keeps writing to the WAL that failed, and its next append trips an assertion. Such
  // a store, and one whose error RocksDB cannot resume from (an I/O error on the WAL), is
  // closed and opened again instead: what a restart of decisiond would do (the WAL is
  // replayed), without the restart.
  if (db_ != nullptr && !health_->fatal() && !MemtablesEmptyLocked()) {
    const rocksdb::Status s = db_->Resume();
    // OK: RocksDB cleared the error (the listener has seen it), or had none to clear.
    if (s.ok()) health_->OnRecovered();
    if (!s.ok()) failed = absl::UnavailableError(absl::StrCat("resuming: ", s.ToString()));
  } else {
    if (db_ != nullptr) CloseDbLocked().IgnoreError();
    failed = OpenDbLocked();
    if (failed.ok()) health_->OnRecovered();
  }
  if (health_->writable()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("the store cannot write: ",
                                             health_->Get().error.message(), "; ",
                                             failed.message()));
}

absl::Status Store::Close() {
  StopEventCompactions();
  std::unique_lock<std::shared_mutex> lock(db_mu_);
  closed_ = true;
  if (db_ == nullptr) return absl::OkStatus();
  return CloseDbLocked();
}

absl::Status Store::Put(rocksdb::ColumnFamilyHandle* Store::*family, const std::string& key,
                        const google::protobuf::MessageLite& record, absl::string_view what) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  rocksdb::ColumnFamilyHandle* const cf = this->*family;  // read under the lock: Recover
                                                          // replaces the handles
  if (options_.fault_injection) {
    if (absl::Status s = options_.fault_injection(what); !s.ok()) return s;
  }
  rocksdb::WriteOptions write;
  write.sync = options_.sync;
  std::shared_lock<std::shared_mutex> watch(watch_mu_);
  const rocksdb::Status s = db_->Put(write, cf, key, record.SerializeAsString());
  if (s.ok() && watch_count_.load(std::memory_order_relaxed) > 0) {
    NoteWatchedKey(cf->GetID(), key);
  }
  return s.ok() ? absl::OkStatus() : WriteError(*health_, s, what);
}

template <typename Record>
absl::Status Store::Scan(rocksdb::ColumnFamilyHandle* Store::*family, const std::string& prefix,
                         const std::string& start, int64_t limit, size_t suffix_bytes,
                         const std::function<absl::Status(absl::string_view, const Record&)>& fn,
                         size_t skip_suffix_bytes) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  rocksdb::ColumnFamilyHandle* const cf = this->*family;  // under the lock, as in Put
  // A scan reads each block once (a backfill, a training set, an export, a restart): its
  // blocks are not worth the block cache, which keeps the point lookups' (late rewards,
  // event ids, log chunks). RocksDB's advice for bulk scans (ReadOptions::fill_cache).
  rocksdb::ReadOptions read;
  read.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read, cf));
  int64_t visited = 0;
  Record record;
  for (it->Seek(start); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    if (skip_suffix_bytes != 0 && it->key().size() - prefix.size() == skip_suffix_bytes) continue;
    if (limit > 0 && visited >= limit) break;
    if (!record.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError("storage: a record does not parse");
    }
    absl::string_view suffix(it->key().data() + prefix.size(), it->key().size() - prefix.size());
    // The callers decode the suffix as fixed-width integers: a damaged key is not read past.
    if (suffix.size() != suffix_bytes) {
      return absl::DataLossError(absl::StrCat("storage: a key has ", suffix.size(),
                                              " bytes after its prefix, expected ",
                                              suffix_bytes));
    }
    if (absl::Status s = fn(suffix, record); !s.ok()) return s;
    ++visited;
  }
  return FromRocks(it->status(), "scan");
}

absl::Status Store::ForEachProblem(
    const std::function<absl::Status(uint32_t, const v1::ProblemRecord&)>& fn,
    const std::function<absl::Status(uint32_t, const absl::Status&)>& damaged) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), problems_));
  v1::ProblemRecord record;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (it->key().size() != 4) {
      return absl::DataLossError(absl::StrCat("storage: a problem key has ", it->key().size(),
                                              " bytes, expected 4"));
    }
    const uint32_t index = ReadU32(absl::string_view(it->key().data(), 4));
    absl::Status s;
    if (record.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      s = fn(index, record);
    } else {
      const absl::Status loss = absl::DataLossError(
          absl::StrCat("storage: the record of problem index ", index, " does not parse"));
      s = damaged ? damaged(index, loss) : loss;
    }
    if (!s.ok()) return s;
  }
  return FromRocks(it->status(), "scan");
}

void DropModelPayload(v1::ExpertModelRecord* model) {
  using v1::ExpertModelRecord;
  // A fresh record of the same kind, moved in: clearing the fields in place would keep
  // their buffers (protobuf reuses them), which is the memory this is for.
  ExpertModelRecord kept;
  switch (model->kind_case()) {
    case ExpertModelRecord::kUniform: kept.set_uniform(model->uniform()); break;
    case ExpertModelRecord::kTable:
      kept.mutable_table()->set_key_feature(model->table().key_feature());
      break;
    case ExpertModelRecord::kLinearSoftmax:
      kept.mutable_linear_softmax()->set_temperature(model->linear_softmax().temperature());
      break;
    case ExpertModelRecord::kXgboost: kept.set_xgboost(std::string()); break;
    default: break;
  }
  *model = std::move(kept);
}

bool HasModelPayload(const v1::ExpertModelRecord& model) {
  switch (model.kind_case()) {
    case v1::ExpertModelRecord::kTable: return model.table().rows_size() > 0;
    case v1::ExpertModelRecord::kLinearSoftmax:
      return model.linear_softmax().weights_size() > 0 || model.linear_softmax().bias_size() > 0;
    case v1::ExpertModelRecord::kXgboost: return !model.xgboost().empty();
    default: return false;  // uniform, or no model
  }
}

absl::Status Store::PutExpert(uint32_t problem, uint32_t expert,
                              const v1::ExpertRecord& record) {
  const std::string key = Key32x2(problem, expert);
  const std::string model_key = ExpertModelKey(problem, expert);
  v1::ExpertRecord out = record;
  std::string model;  // to write under model_key
  bool delete_model = false;
  if (HasModelPayload(out.model())) {  // a registration
    model = out.model().SerializeAsString();
    DropModelPayload(out.mutable_model());
    out.set_model_apart(true);
  } else if (out.has_unloaded_at_sample()) {  // nothing loads the model again
    delete_model = true;
    out.set_model_apart(false);
  } else {
    // A rewrite of the expert's state: the stored record (small, unless it was written
    // before models were kept apart) says where the model is.
    absl::StatusOr<v1::ExpertRecord> stored =
        Get<v1::ExpertRecord>(&Store::experts_, key, "expert");
    if (!stored.ok() && !absl::IsNotFound(stored.status())) return stored.status();
    out.set_model_apart(stored.ok() && stored->model_apart());
    if (stored.ok() && !stored->model_apart() && HasModelPayload(stored->model())) {
      model = stored->model().SerializeAsString();
      out.set_model_apart(true);
    }
  }
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::WriteBatch batch;
  rocksdb::Status s;
  if (!model.empty()) s = batch.Put(experts_, model_key, model);
  if (delete_model) s = batch.Delete(experts_, model_key);
  if (s.ok()) s = batch.Put(experts_, key, out.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "expert");
  lock.unlock();
  return Write(&batch, "expert");
}

absl::Status Store::AttachModel(uint32_t problem, uint32_t expert, v1::ExpertRecord* record) {
  if (!record->model_apart()) return absl::OkStatus();
  absl::StatusOr<v1::ExpertModelRecord> model = Get<v1::ExpertModelRecord>(
      &Store::experts_, ExpertModelKey(problem, expert), "expert model");
  if (absl::IsNotFound(model.status())) {
    return absl::DataLossError(
        absl::StrCat("storage: the model of expert ", expert, " of problem index ", problem,
                     " is missing"));
  }
  if (!model.ok()) return model.status();
  *record->mutable_model() = *std::move(model);
  record->set_model_apart(false);
  return absl::OkStatus();
}

absl::StatusOr<v1::ExpertRecord> Store::GetExpert(uint32_t problem, uint32_t expert) {
  absl::StatusOr<v1::ExpertRecord> record =
      Get<v1::ExpertRecord>(&Store::experts_, Key32x2(problem, expert), "expert");
  if (!record.ok()) return record;
  if (absl::Status s = AttachModel(problem, expert, &*record); !s.ok()) return s;
  return record;
}

absl::Status Store::ForEachExpert(
    uint32_t problem, const std::function<absl::Status(uint32_t, const v1::ExpertRecord&)>& fn) {
  // The records first (without their payloads they are small), then each with its model,
  // read outside the scan (which holds db_mu_).
  std::vector<std::pair<uint32_t, v1::ExpertRecord>> records;
  const std::string prefix = Key32(problem);
  absl::Status s = Scan<v1::ExpertRecord>(
      &Store::experts_, prefix, prefix, 0, 4,
      [&](absl::string_view key, const v1::ExpertRecord& r) {
        records.emplace_back(ReadU32(key), r);
        return absl::OkStatus();
      },
      /*skip_suffix_bytes=*/5);
  for (auto& [expert, record] : records) {
    if (s.ok()) s = AttachModel(problem, expert, &record);
    if (s.ok()) s = fn(expert, record);
    if (!s.ok()) return s;
    record.Clear();  // its model
  }
  return s;
}

absl::StatusOr<v1::EventRecord> Store::GetEvent(uint32_t problem, absl::string_view event_id) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  std::string value;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), events_, absl::StrCat(Key32(problem), event_id), &value);
  if (!s.ok()) return FromRocks(s, absl::StrCat("event ", event_id));
  v1::EventRecord record;
  if (!record.ParseFromString(value)) return absl::DataLossError("storage: event does not parse");
  return record;
}

absl::StatusOr<bool> Store::ScanEventIds(uint32_t problem, std::string* after, int64_t limit,
                                         const std::function<void(absl::string_view)>& fn) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  const std::string prefix = Key32(problem);
  const std::string start = absl::StrCat(prefix, *after);
  rocksdb::ReadOptions read;
  read.fill_cache = false;  // a bulk scan, as in Scan
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read, events_));
  it->Seek(start);
  if (!after->empty() && it->Valid() && it->key() == start) it->Next();
  int64_t visited = 0;
  for (; visited < limit && it->Valid() && it->key().starts_with(prefix); it->Next()) {
    after->assign(it->key().data() + prefix.size(), it->key().size() - prefix.size());
    fn(*after);
    ++visited;
  }
  if (absl::Status s = FromRocks(it->status(), "event id scan"); !s.ok()) return s;
  return visited == limit && it->Valid() && it->key().starts_with(prefix);
}

absl::Status Store::Write(rocksdb::WriteBatch* batch, absl::string_view what) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  if (options_.fault_injection) {
    if (absl::Status s = options_.fault_injection(what); !s.ok()) return s;
  }
  rocksdb::WriteOptions write;
  write.sync = options_.sync;
  std::shared_lock<std::shared_mutex> watch(watch_mu_);
  const rocksdb::Status s = db_->Write(write, batch);
  if (s.ok() && watch_count_.load(std::memory_order_relaxed) > 0) NoteWatchedWrites(batch);
  return s.ok() ? absl::OkStatus() : WriteError(*health_, s, what);
}

Store::WriteGroup::WriteGroup() : batch_(std::make_unique<rocksdb::WriteBatch>()) {}
Store::WriteGroup::~WriteGroup() = default;

absl::StatusOr<bool> Store::ExportProblemPage(
    uint32_t problem, ExportCursor* cursor, int64_t max_bytes,
    const std::function<void(const ProblemEntry&)>& fn, bool at_snapshot) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  const std::string prefix = Key32(problem);
  rocksdb::ReadOptions read;
  read.fill_cache = false;  // a bulk scan, as in Scan
  if (at_snapshot) {
    absl::MutexLock watches(&watches_mu_);
    auto it = watches_.find(problem);
    if (it == watches_.end() || it->second.snapshot == nullptr) {
      return absl::AbortedError(
          "storage: the problem's snapshot is gone (not watched, or the store reopened)");
    }
    read.snapshot = it->second.snapshot;  // released only under db_mu_ held exclusively
  }
  int64_t bytes = 0;
  for (; cursor->family >= 0 && cursor->family < kProblemFamilies;
       ++cursor->family, cursor->started = false, cursor->after.clear(), cursor->offset = 0) {
    const std::string start = absl::StrCat(prefix, cursor->after);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read, handles_[cursor->family + 1]));
    it->Seek(start);
    int64_t offset = 0;  // into the first record's value: the rest of a record given in part
    const bool at_after = cursor->started && it->Valid() && it->key() == start;
    if (cursor->offset > 0) {
      if (!at_after || cursor->offset >= static_cast<int64_t>(it->value().size())) {
        return PartGone();
      }
      offset = cursor->offset;
    } else if (at_after) {
      it->Next();
    }
    for (; it->Valid() && it->key().starts_with(prefix); it->Next(), offset = 0) {
      const absl::string_view key(it->key().data() + prefix.size(),
                                  it->key().size() - prefix.size());
      const absl::string_view value(it->value().data(), it->value().size());
      const std::optional<int64_t> length =
          ExportedLength(key.size(), value.size(), offset, bytes, max_bytes);
      if (!length.has_value()) return true;
      GiveExported(cursor->family, key, value, offset, *length, cursor, fn);
      if (cursor->offset > 0) return true;
      bytes += static_cast<int64_t>(key.size()) + *length;
    }
    if (absl::Status s = FromRocks(it->status(), "problem export"); !s.ok()) return s;
  }
  return false;
}

absl::Status Store::WatchProblem(uint32_t problem) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  // No write is between its write and its note: each is in the snapshot or noted.
  std::unique_lock<std::shared_mutex> writes(watch_mu_);
  absl::MutexLock watches(&watches_mu_);
  if (watches_.count(problem) > 0) {
    return absl::FailedPreconditionError("storage: the problem is watched already");
  }
  watches_[problem].snapshot = db_->GetSnapshot();
  watch_count_.store(static_cast<int>(watches_.size()));
  return absl::OkStatus();
}

void Store::UnwatchProblem(uint32_t problem) {
  // Exclusively: no export reads at the snapshot while it is released.
  std::unique_lock<std::shared_mutex> lock(db_mu_);
  absl::MutexLock watches(&watches_mu_);
  auto it = watches_.find(problem);
  if (it == watches_.end()) return;
  if (it->second.snapshot != nullptr && db_ != nullptr) db_->ReleaseSnapshot(it->second.snapshot);
  watches_.erase(it);
  watch_count_.store(static_cast<int>(watches_.size()));
}

void Store::EndWatchesLocked() {
  absl::MutexLock watches(&watches_mu_);
  for (auto& [problem, watch] : watches_) {
    if (watch.snapshot != nullptr) db_->ReleaseSnapshot(watch.snapshot);
    watch.snapshot = nullptr;  // its changes are unknown from now on
  }
}

int Store::ProblemFamilyOf(uint32_t column_family_id) const {
  for (int f = 0; f < kProblemFamilies; ++f) {
    if (handles_[f + 1]->GetID() == column_family_id) return f;
  }
  return -1;
}

void Store::NoteWatchedKey(uint32_t column_family_id, absl::string_view key) {
  if (key.size() < 4) return;
  const int family = ProblemFamilyOf(column_family_id);
  if (family < 0) return;
  absl::MutexLock watches(&watches_mu_);
  auto it = watches_.find(ReadU32(key));
  if (it != watches_.end()) it->second.keys.emplace(family, std::string(key.substr(4)));
}

void Store::NoteWatchedWrites(rocksdb::WriteBatch* batch) {
  class Recorder final : public rocksdb::WriteBatch::Handler {
   public:
    explicit Recorder(Store* store) : store_(store) {}
    rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice& key,
                          const rocksdb::Slice&) override {
      store_->NoteWatchedKey(cf, absl::string_view(key.data(), key.size()));
      return rocksdb::Status::OK();
    }
    rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
      store_->NoteWatchedKey(cf, absl::string_view(key.data(), key.size()));
      return rocksdb::Status::OK();
    }
    rocksdb::Status SingleDeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
      return DeleteCF(cf, key);
    }
    rocksdb::Status MergeCF(uint32_t cf, const rocksdb::Slice& key,
                            const rocksdb::Slice& value) override {
      return PutCF(cf, key, value);
    }
    rocksdb::Status DeleteRangeCF(uint32_t cf, const rocksdb::Slice& begin,
                                  const rocksdb::Slice& end) override {
      if (begin.size() < 4) return rocksdb::Status::OK();
      const int family = store_->ProblemFamilyOf(cf);
      if (family < 0) return rocksdb::Status::OK();
      const absl::string_view b(begin.data(), begin.size()), e(end.data(), end.size());
      absl::MutexLock watches(&store_->watches_mu_);
      auto it = store_->watches_.find(ReadU32(b));
      if (it == store_->watches_.end()) return rocksdb::Status::OK();
      // An end past the problem's prefix deletes to the end of it.
      const bool within = e.size() >= 4 && e.substr(0, 4) == b.substr(0, 4);
      it->second.ranges.emplace_back(family, std::string(b.substr(4)),
                                     within ? std::string(e.substr(4)) : std::string());
      return rocksdb::Status::OK();
    }

   private:
    Store* store_;
  };
  Recorder recorder(this);
  batch->Iterate(&recorder).PermitUncheckedError();
}

absl::StatusOr<bool> Store::ExportProblemChanges(
    uint32_t problem, ExportCursor* cursor, int64_t max_bytes,
    const std::function<void(const ProblemEntry&)>& fn) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  std::vector<std::pair<int, std::string>> keys;  // this page's, copied out of the lock
  std::vector<ProblemEntry> ranges;
  {
    absl::MutexLock watches(&watches_mu_);
    auto it = watches_.find(problem);
    if (it == watches_.end()) {
      return absl::FailedPreconditionError("storage: the problem is not watched");
    }
    if (it->second.snapshot == nullptr) {
      return absl::AbortedError("storage: the store reopened since the copy began: its "
                                "changes are unknown");
    }
    if (cursor->family == 0 && !cursor->started) {
      for (const auto& [family, from, to] : it->second.ranges) {
        ProblemEntry e;
        e.op = ProblemEntry::kDeleteRange;
        e.family = family;
        e.key = from;
        e.range_end = to;
        ranges.push_back(std::move(e));
      }
    }
    // A record given in part is next again, for its rest.
    const std::pair<int, std::string> after{cursor->family, cursor->after};
    auto k = !cursor->started     ? it->second.keys.lower_bound({cursor->family, std::string()})
             : cursor->offset > 0 ? it->second.keys.lower_bound(after)
                                  : it->second.keys.upper_bound(after);
    int64_t bytes = 0;
    for (; k != it->second.keys.end() && bytes < max_bytes; ++k) {
      keys.push_back(*k);
      bytes += static_cast<int64_t>(k->second.size()) + 64;  // the value is not known yet
    }
  }
  for (ProblemEntry& e : ranges) fn(e);
  const std::string prefix = Key32(problem);
  int64_t bytes = 0;
  for (size_t given = 0; given < keys.size(); ++given) {
    const auto& [family, key] = keys[given];
    const int64_t offset = given == 0 ? cursor->offset : 0;
    std::string value;
    const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), handles_[family + 1],
                                       absl::StrCat(prefix, key), &value);
    if (s.IsNotFound()) {
      if (offset > 0) return PartGone();
      if (bytes > 0 && bytes + static_cast<int64_t>(key.size()) > max_bytes) break;
      ProblemEntry e;
      e.op = ProblemEntry::kDelete;
      e.family = family;
      e.key = key;
      fn(e);
      cursor->family = family;
      cursor->started = true;
      cursor->after = key;
      bytes += static_cast<int64_t>(key.size());
      continue;
    }
    if (!s.ok()) return FromRocks(s, "problem changes");
    if (offset > 0 && (family != cursor->family || key != cursor->after ||
                       offset >= static_cast<int64_t>(value.size()))) {
      return PartGone();
    }
    const std::optional<int64_t> length =
        ExportedLength(key.size(), value.size(), offset, bytes, max_bytes);
    if (!length.has_value()) break;
    GiveExported(family, key, value, offset, *length, cursor, fn);
    if (cursor->offset > 0) return true;
    bytes += static_cast<int64_t>(key.size()) + *length;
  }
  absl::MutexLock watches(&watches_mu_);
  auto it = watches_.find(problem);
  if (it == watches_.end()) return absl::AbortedError("storage: the watch ended");
  const std::set<std::pair<int, std::string>>& noted = it->second.keys;
  return (cursor->started ? noted.upper_bound({cursor->family, cursor->after})
                          : noted.begin()) != noted.end();
}

absl::Status Store::ImportProblemEntries(uint32_t problem,
                                         const std::vector<ProblemEntry>& entries) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::WriteBatch batch;
  std::optional<v1::RetentionRecord> cut;
  const std::string prefix = Key32(problem);
  const std::string retention_key = Key32x2(0, 2).substr(4);
  for (const ProblemEntry& e : entries) {
    if (e.family < 1 || e.family >= kProblemFamilies) {
      return absl::InvalidArgumentError(absl::StrCat(
          "an imported record must be of a family 1..", kProblemFamilies - 1, "; got ",
          e.family));
    }
    rocksdb::ColumnFamilyHandle* const cf = handles_[e.family + 1];
    const std::string key = absl::StrCat(prefix, e.key);
    rocksdb::Status s;
    switch (e.op) {
      case ProblemEntry::kPut: s = batch.Put(cf, key, e.value); break;
      case ProblemEntry::kDelete: s = batch.Delete(cf, key); break;
      case ProblemEntry::kDeleteRange:
        s = batch.DeleteRange(cf, key,
                              e.range_end.empty() ? PrefixEnd(problem)
                                                  : absl::StrCat(prefix, e.range_end));
        break;
    }
    if (!s.ok()) return FromRocks(s, "problem import");
    if (e.op != ProblemEntry::kPut) continue;
    if (kFamilyNames[e.family] == absl::string_view("checkpoints") && e.key == retention_key) {
      cut.emplace();
      if (!cut->ParseFromString(e.value)) {
        return absl::InvalidArgumentError("an imported retention record does not parse");
      }
    }
  }
  lock.unlock();
  if (absl::Status s = Write(&batch, "problem import"); !s.ok()) return s;
  if (cut.has_value()) cuts_->Set(problem, {cut->first_sample(), cut->events_before_ms()});
  return absl::OkStatus();
}

absl::Status Store::DeleteProblem(uint32_t problem, const v1::ProblemRecord* stub) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::WriteBatch batch;
  const std::string begin = Key32(problem);
  const std::string end = PrefixEnd(problem);
  for (int f = 0; f < kProblemFamilies; ++f) {
    const rocksdb::Status s = batch.DeleteRange(handles_[f + 1], begin, end);
    if (!s.ok()) return FromRocks(s, "problem deletion");
  }
  if (stub != nullptr) {
    // After the range deletion in the batch: the stub survives it.
    const rocksdb::Status s = batch.Put(problems_, begin, stub->SerializeAsString());
    if (!s.ok()) return FromRocks(s, "problem deletion");
  }
  lock.unlock();
  if (absl::Status s = Write(&batch, "problem deletion"); !s.ok()) return s;
  cuts_->Set(problem, {});
  return absl::OkStatus();
}

absl::Status Store::AddProblem(WriteGroup* group, uint32_t problem,
                               const v1::ProblemRecord& record,
                               const v1::ExpertRecord& first_expert,
                               const v1::CheckpointRecord& checkpoint,
                               const v1::EstimatorStateRecord& state) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::WriteBatch& batch = *group->batch_;
  rocksdb::Status s = batch.Put(problems_, Key32(problem), record.SerializeAsString());
  if (s.ok()) s = batch.Put(experts_, Key32x2(problem, 0), first_expert.SerializeAsString());
  if (s.ok()) s = batch.Put(checkpoints_, Key32(problem), checkpoint.SerializeAsString());
  if (s.ok()) s = batch.Put(checkpoints_, Key32x2(problem, 1), state.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "problem batch");
  ++group->size_;
  return absl::OkStatus();
}

absl::Status Store::AddEventUpdate(WriteGroup* group, uint32_t problem,
                                   absl::string_view event_id, const v1::EventRecord& record) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::Status s = group->batch_->Put(events_, absl::StrCat(Key32(problem), event_id),
                                         record.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "event batch");
  ++group->size_;
  return absl::OkStatus();
}

absl::Status Store::AddDecision(WriteGroup* group, uint32_t problem, absl::string_view event_id,
                                const v1::EventRecord& record) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::Status s = group->batch_->Put(events_, absl::StrCat(Key32(problem), event_id),
                                         record.SerializeAsString());
  if (s.ok()) {
    s = group->batch_->Put(pending_, PendingKey(problem, record.deadline_ms(), event_id), "");
  }
  if (!s.ok()) return FromRocks(s, "decision batch");
  ++group->size_;
  return absl::OkStatus();
}

absl::Status Store::AddJoin(WriteGroup* group, uint32_t problem, absl::string_view event_id,
                            const v1::EventRecord& event, int64_t sequence,
                            const v1::SampleRecord& sample, bool decision_stored) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  std::string sample_key = Key32(problem);
  AppendU64(&sample_key, static_cast<uint64_t>(sequence));
  rocksdb::WriteBatch& batch = *group->batch_;
  rocksdb::Status s = batch.Put(events_, absl::StrCat(Key32(problem), event_id),
                                event.SerializeAsString());
  if (s.ok() && decision_stored) {
    s = batch.Delete(pending_, PendingKey(problem, event.deadline_ms(), event_id));
  }
  if (s.ok()) s = batch.Put(samples_, sample_key, sample.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "join batch");
  ++group->size_;
  return absl::OkStatus();
}

absl::Status Store::Commit(WriteGroup* group) {
  if (group->size_ == 0) return absl::OkStatus();
  return Write(group->batch_.get(), "group");
}

absl::Status Store::AddExpiry(WriteGroup* group, uint32_t problem, absl::string_view event_id,
                              const v1::EventRecord& record, bool decision_stored) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::WriteBatch& batch = *group->batch_;
  rocksdb::Status s = batch.Put(events_, absl::StrCat(Key32(problem), event_id),
                                record.SerializeAsString());
  if (s.ok() && decision_stored) {
    s = batch.Delete(pending_, PendingKey(problem, record.deadline_ms(), event_id));
  }
  if (!s.ok()) return FromRocks(s, "expiry batch");
  ++group->size_;
  return absl::OkStatus();
}

absl::Status Store::ForEachPending(
    uint32_t problem,
    const std::function<absl::Status(int64_t, absl::string_view)>& fn) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  const std::string prefix = Key32(problem);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), pending_));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    if (it->key().size() < prefix.size() + 8) return absl::DataLossError("bad pending key");
    const absl::string_view key(it->key().data(), it->key().size());
    const int64_t deadline = static_cast<int64_t>(ReadU64(key.substr(prefix.size(), 8)));
    if (absl::Status st = fn(deadline, key.substr(prefix.size() + 8)); !st.ok()) return st;
  }
  return FromRocks(it->status(), "pending scan");
}

absl::Status Store::ForEachSample(
    uint32_t problem, int64_t start, int64_t limit,
    const std::function<absl::Status(int64_t, const v1::SampleRecord&)>& fn) {
  const std::string prefix = Key32(problem);
  std::string first = prefix;
  AppendU64(&first, static_cast<uint64_t>(start));
  return Scan<v1::SampleRecord>(&Store::samples_, prefix, first, limit, 8,
                                [&](absl::string_view key, const v1::SampleRecord& r) {
                                  return fn(static_cast<int64_t>(ReadU64(key)), r);
                                });
}

absl::StatusOr<v1::SampleRecord> Store::GetSample(uint32_t problem, int64_t sequence) {
  std::string key = Key32(problem);
  AppendU64(&key, static_cast<uint64_t>(sequence));
  return Get<v1::SampleRecord>(&Store::samples_, key, "sample");
}

absl::Status Store::PutBackfillChunk(uint32_t problem, uint32_t expert, uint64_t chunk,
                                     const v1::BackfillChunk& record) {
  std::string key = Key32x2(problem, expert);
  AppendU64(&key, chunk);
  return Put(&Store::backfill_, key, record, "backfill chunk");
}

absl::Status Store::ForEachBackfillChunk(
    uint32_t problem, uint32_t expert,
    const std::function<absl::Status(uint64_t, const v1::BackfillChunk&)>& fn,
    uint64_t start_chunk) {
  const std::string prefix = Key32x2(problem, expert);
  std::string start = prefix;
  AppendU64(&start, start_chunk);
  return Scan<v1::BackfillChunk>(
      &Store::backfill_, prefix, start, 0, 8,
      [&](absl::string_view key, const v1::BackfillChunk& r) { return fn(ReadU64(key), r); });
}

absl::Status Store::PutLogChunk(uint32_t problem, uint64_t chunk, const v1::LogChunk& record) {
  std::string key = Key32(problem);
  AppendU64(&key, chunk);
  return Put(&Store::logchunks_, key, record, "log chunk");
}

absl::Status Store::ForEachLogChunk(
    uint32_t problem, const std::function<absl::Status(uint64_t, const v1::LogChunk&)>& fn,
    uint64_t start_chunk) {
  const std::string prefix = Key32(problem);
  std::string start = prefix;
  AppendU64(&start, start_chunk);
  return Scan<v1::LogChunk>(
      &Store::logchunks_, prefix, start, 0, 8,
      [&](absl::string_view key, const v1::LogChunk& r) { return fn(ReadU64(key), r); });
}

absl::Status Store::PutCheckpoint(uint32_t problem, const v1::CheckpointRecord& record,
                                  const v1::EstimatorStateRecord* state) {
  if (state == nullptr) return Put(&Store::checkpoints_, Key32(problem), record, "checkpoint");
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.Put(checkpoints_, Key32(problem), record.SerializeAsString());
  if (s.ok()) s = batch.Put(checkpoints_, Key32x2(problem, 1), state->SerializeAsString());
  if (!s.ok()) return FromRocks(s, "checkpoint");
  lock.unlock();
  return Write(&batch, "checkpoint");
}

absl::Status Store::DeleteEstimatorState(uint32_t problem) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::WriteBatch batch;
  const rocksdb::Status s = batch.Delete(checkpoints_, Key32x2(problem, 1));
  if (!s.ok()) return FromRocks(s, "estimator state");
  lock.unlock();
  return Write(&batch, "estimator state");
}

absl::StatusOr<v1::EstimatorStateRecord> Store::GetEstimatorState(uint32_t problem) {
  return Get<v1::EstimatorStateRecord>(&Store::checkpoints_, Key32x2(problem, 1),
                                       "estimator state");
}

template <typename Record>
absl::StatusOr<Record> Store::Get(rocksdb::ColumnFamilyHandle* Store::*family,
                                  const std::string& key, absl::string_view what) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), this->*family, key, &value);
  if (!s.ok()) return FromRocks(s, what);
  Record record;
  if (!record.ParseFromString(value)) {
    return absl::DataLossError(absl::StrCat("storage: ", what, " does not parse"));
  }
  return record;
}

absl::StatusOr<v1::CheckpointRecord> Store::GetCheckpoint(uint32_t problem) {
  return Get<v1::CheckpointRecord>(&Store::checkpoints_, Key32(problem), "checkpoint");
}

absl::Status Store::PutProblem(uint32_t problem, const v1::ProblemRecord& record) {
  return Put(&Store::problems_, Key32(problem), record, "problem");
}

absl::Status Store::ApplyRetention(uint32_t problem, const std::vector<uint32_t>& backfilled,
                                   const v1::RetentionRecord& cut) {
  if (cut.first_sample() < 0 || cut.first_sample() % kLogChunkSamples != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retention cut at sample ", cut.first_sample(), ": not a multiple of ",
        kLogChunkSamples));
  }
  absl::StatusOr<v1::RetentionRecord> stored = GetRetention(problem);
  if (!stored.ok() && !absl::IsNotFound(stored.status())) return stored.status();
  if (stored.ok() && (cut.first_sample() < stored->first_sample() ||
                      cut.events_before_ms() < stored->events_before_ms())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retention cut (sample ", cut.first_sample(), ", events before ",
        cut.events_before_ms(), " ms) moves back from the stored one (",
        stored->first_sample(), ", ", stored->events_before_ms(), ")"));
  }
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  // Range tombstones alone free nothing until compactions reach the files under them, and
  // with keys in sequence order the oldest files, at the bottom level, are the last a
  // compaction reaches: 100M samples with 10M kept had left 8 GB in the samples family.
  // So the first cut, and then one every kDropFilesChunks chunks, also drops the table files
  // wholly before it (DeleteFilesInRange). Its tombstones then cover everything before the cut, so that the
  // keys of a file straddling it stay deleted whichever older tombstones go with the
  // dropped files; the other cuts delete only what the last one left ([from, to)), since
  // nested tombstones cost the table readers memory until compactions drop them.
  constexpr uint64_t kDropFilesChunks = 64;
  const uint64_t from = stored.ok() ? static_cast<uint64_t>(stored->first_sample()) : 0;
  const uint64_t to = static_cast<uint64_t>(cut.first_sample());
  const bool drop_files = !stored.ok() || from / kLogChunkSamples / kDropFilesChunks !=
                                             to / kLogChunkSamples / kDropFilesChunks;
  const uint64_t begin = drop_files ? 0 : from;
  struct Range {
    rocksdb::ColumnFamilyHandle* family;
    std::string begin, end;
  };
  std::vector<Range> ranges;
  const auto add = [&](rocksdb::ColumnFamilyHandle* family, const std::string& prefix,
                       uint64_t first, uint64_t end) {
    if (first >= end) return;
    Range r{family, prefix, prefix};
    AppendU64(&r.begin, first);
    AppendU64(&r.end, end);
    ranges.push_back(std::move(r));
  };
  add(samples_, Key32(problem), begin, to);
  add(logchunks_, Key32(problem), begin / kLogChunkSamples, to / kLogChunkSamples);
  for (uint32_t e : backfilled) {
    add(backfill_, Key32x2(problem, e), begin / kLogChunkSamples, to / kLogChunkSamples);
  }
  rocksdb::WriteBatch batch;
  rocksdb::Status s;
  for (const Range& r : ranges) {
    if (s.ok()) s = batch.DeleteRange(r.family, r.begin, r.end);
  }
  if (s.ok()) s = batch.Put(checkpoints_, Key32x2(problem, 2), cut.SerializeAsString());
  if (!s.ok()) return FromRocks(s, "retention");
  lock.unlock();
  if (absl::Status w = Write(&batch, "retention"); !w.ok()) return w;
  cuts_->Set(problem, {cut.first_sample(), cut.events_before_ms()});
  // The files wholly before the cut, once its tombstones are durable (a crash must not
  // find files gone and the cut not written). The new tombstones are in the memtable, not
  // in any file this can drop.
  if (!drop_files) return absl::OkStatus();
  lock.lock();
  if (db_ == nullptr) return NotOpen();
  s = db_->FlushWAL(/*sync=*/true);
  for (const Range& r : ranges) {
    if (!s.ok()) break;
    const rocksdb::Slice lo(r.begin), hi(r.end);
    s = rocksdb::DeleteFilesInRange(db_, r.family, &lo, &hi, /*include_end=*/false);
  }
  if (!s.ok()) return WriteError(*health_, s, "retention file deletion");
  return absl::OkStatus();
}

absl::Status Store::DeleteEvents(uint32_t problem, const std::vector<Redaction>& redactions) {
  std::shared_lock<std::shared_mutex> lock(db_mu_);  // the family handles
  if (db_ == nullptr) return NotOpen();
  rocksdb::WriteBatch batch;
  rocksdb::Status s;
  for (const Redaction& r : redactions) {
    s = batch.Delete(events_, absl::StrCat(Key32(problem), r.event_id));
    if (s.ok() && r.sequence >= 0) {
      std::string key = Key32(problem);
      AppendU64(&key, static_cast<uint64_t>(r.sequence));
      s = batch.Put(samples_, key, r.sample.SerializeAsString());
    }
    if (!s.ok()) return FromRocks(s, "event deletion");
  }
  lock.unlock();
  return Write(&batch, "event deletion");
}

absl::StatusOr<v1::RetentionRecord> Store::GetRetention(uint32_t problem) {
  return Get<v1::RetentionRecord>(&Store::checkpoints_, Key32x2(problem, 2), "retention");
}

absl::StatusOr<v1::LogChunk> Store::GetLogChunk(uint32_t problem, uint64_t chunk) {
  std::string key = Key32(problem);
  AppendU64(&key, chunk);
  return Get<v1::LogChunk>(&Store::logchunks_, key, "log chunk");
}

absl::StatusOr<v1::BackfillChunk> Store::GetBackfillChunk(uint32_t problem, uint32_t expert,
                                                          uint64_t chunk) {
  std::string key = Key32x2(problem, expert);
  AppendU64(&key, chunk);
  return Get<v1::BackfillChunk>(&Store::backfill_, key, "backfill chunk");
}

absl::Status Store::AppendAudit(const v1::AuditRecord& record) {
  absl::MutexLock lock(&audit_mu_);
  std::string key;
  AppendU64(&key, static_cast<uint64_t>(next_audit_));
  if (absl::Status s = Put(&Store::audit_, key, record, "audit"); !s.ok()) return s;
  ++next_audit_;
  return absl::OkStatus();
}

absl::Status Store::ForEachAudit(
    int64_t start, int64_t limit,
    const std::function<absl::Status(int64_t, const v1::AuditRecord&)>& fn) {
  std::string from;
  AppendU64(&from, static_cast<uint64_t>(std::max<int64_t>(start, 0)));
  return Scan<v1::AuditRecord>(&Store::audit_, "", from, limit, 8,
                               [&](absl::string_view key, const v1::AuditRecord& r) {
                                 return fn(static_cast<int64_t>(ReadU64(key)), r);
                               });
}

absl::Status Store::Flush() {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  rocksdb::FlushOptions flush;
  flush.wait = true;
  const rocksdb::Status s = db_->Flush(flush, handles_);
  return s.ok() ? absl::OkStatus() : WriteError(*health_, s, "flush");
}

absl::Status Store::Compact() {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return NotOpen();
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    const rocksdb::Status s = db_->CompactRange(rocksdb::CompactRangeOptions(), h, nullptr, nullptr);
    if (!s.ok()) return WriteError(*health_, s, "compaction");
  }
  return absl::OkStatus();
}

void Store::CompactEventsSoon(uint32_t problem) {
  absl::MutexLock lock(&compact_mu_);
  if (compact_stop_) return;
  if (std::find(compact_queue_.begin(), compact_queue_.end(), problem) != compact_queue_.end()) {
    return;
  }
  compact_queue_.push_back(problem);
  if (!compactor_.joinable()) compactor_ = std::thread([this] { CompactEventsLoop(); });
}

namespace {
// Whether a record family is merged into one file now. Each flush at the WAL's cap or at a
// shutdown adds a file to every family (the soak's descriptors followed a sawtooth of six
// families at 1 to 3 files each before merges), and a merge rewrites the whole family:
// - under 1 MiB a merge costs nothing: merged at two files;
// - larger (the experts' models, the checkpoints of large problems), merged once the files
//   besides the largest add up to half of it, or at four files. Merging at every flush
//   rewrote letter's models ten times over in one replay (312 MB written for 29 MB flushed,
//   4.5 s of the one core's CPU: bench/README.md, "Merging the record families");
// - from one table file's worth (64 MiB) on, RocksDB's own compactions look after it.
constexpr uint64_t kCheapMergeBytes = uint64_t{1} << 20;
constexpr uint64_t kMergeAtMostBytes = uint64_t{64} << 20;
constexpr size_t kMergeAtFiles = 4;

bool WantsMerge(const rocksdb::ColumnFamilyMetaData& meta) {
  if (meta.file_count < 2 || meta.size >= kMergeAtMostBytes) return false;
  if (meta.size < kCheapMergeBytes || meta.file_count >= kMergeAtFiles) return true;
  uint64_t largest = 0;
  for (const rocksdb::LevelMetaData& level : meta.levels) {
    for (const rocksdb::SstFileMetaData& file : level.files) {
      largest = std::max<uint64_t>(largest, file.size);
    }
  }
  return meta.size - largest >= largest / 2;
}
}  // namespace

std::vector<rocksdb::ColumnFamilyHandle*> Store::SmallFamiliesLocked() const {
  return {handles_[0], problems_, experts_, checkpoints_, pending_, audit_, training_jobs_};
}

void Store::CompactSmallFamiliesSoon() {
  bool due = false;
  {
    std::shared_lock<std::shared_mutex> lock(db_mu_);
    if (db_ == nullptr) return;
    for (rocksdb::ColumnFamilyHandle* h : SmallFamiliesLocked()) {
      rocksdb::ColumnFamilyMetaData meta;
      db_->GetColumnFamilyMetaData(h, &meta);
      due |= WantsMerge(meta);
    }
  }
  if (!due) return;
  absl::MutexLock lock(&compact_mu_);
  if (compact_stop_ || compact_small_) return;
  compact_small_ = true;
  if (!compactor_.joinable()) compactor_ = std::thread([this] { CompactEventsLoop(); });
}

void Store::CompactSmallFamilies() {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  if (db_ == nullptr) return;
  for (rocksdb::ColumnFamilyHandle* h : SmallFamiliesLocked()) {
    if (compact_canceled_) return;
    rocksdb::ColumnFamilyMetaData meta;
    db_->GetColumnFamilyMetaData(h, &meta);
    if (!WantsMerge(meta)) continue;
    // The table files as they are, into the deepest level among them. Not CompactRange: it
    // flushes the family's memtable first, and the family that takes a record every few
    // hundred ms (the checkpoints) then had a new file at every merge, merged again at the
    // next call: about once a second in a letter replay. Bounded by WantsMerge's 64 MiB, a
    // merge takes well under a second, which Close waits for.
    std::vector<std::string> files;
    int output_level = 0;
    bool busy = false;
    for (const rocksdb::LevelMetaData& level : meta.levels) {
      for (const rocksdb::SstFileMetaData& file : level.files) {
        busy |= file.being_compacted;
        files.push_back(file.name);
        output_level = level.level;
      }
    }
    if (busy) continue;  // RocksDB's own compaction has some of them: the next call asks
    // A failure (a RocksDB compaction took a file meanwhile) leaves the files as they were;
    // the next call asks again. A write error is RocksDB's background error (Health()).
    rocksdb::CompactionOptions options;
    options.compression = rocksdb::kDisableCompressionOption;  // the family's own
    db_->CompactFiles(options, h, files, output_level).PermitUncheckedError();
  }
}

void Store::WaitForEventCompactions() {
  {
    absl::MutexLock lock(&compact_mu_);
    compact_mu_.Await(absl::Condition(
        +[](Store* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->compact_mu_) {
          return s->compact_stop_ ||
                 (s->compact_queue_.empty() && !s->compact_small_ && !s->compact_running_);
        },
        this));
  }
  // Then RocksDB's own: a flush that brings a level to its trigger schedules one. At most
  // a minute (a store with a background error keeps its compactions pending).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (std::chrono::steady_clock::now() < deadline) {
    std::shared_lock<std::shared_mutex> lock(db_mu_);
    if (db_ == nullptr) return;
    // A compaction is pending per family (the property without a family is the default
    // family's): a flush of another family can have scheduled one not yet running.
    uint64_t pending = 0, running = 0;
    for (rocksdb::ColumnFamilyHandle* family : handles_) {
      uint64_t family_pending = 0;
      db_->GetIntProperty(family, rocksdb::DB::Properties::kCompactionPending, &family_pending);
      pending += family_pending;
    }
    db_->GetIntProperty(rocksdb::DB::Properties::kNumRunningCompactions, &running);
    if (pending == 0 && running == 0) return;
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Store::EventCompactions Store::event_compactions() {
  absl::MutexLock lock(&compact_mu_);
  return compactions_;
}

void Store::StopEventCompactions() {
  {
    absl::MutexLock lock(&compact_mu_);
    compact_stop_ = true;
    compact_queue_.clear();
  }
  compact_canceled_ = true;
  if (compactor_.joinable()) compactor_.join();
}

void Store::CompactEventsLoop() {
  for (;;) {
    std::optional<uint32_t> problem;
    {
      absl::MutexLock lock(&compact_mu_);
      compact_running_ = false;
      compact_mu_.Await(absl::Condition(
          +[](Store* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->compact_mu_) {
            return s->compact_stop_ || !s->compact_queue_.empty() || s->compact_small_;
          },
          this));
      if (compact_stop_) return;
      if (!compact_queue_.empty()) {
        problem = compact_queue_.front();
        compact_queue_.pop_front();
      } else {
        compact_small_ = false;
      }
      compact_running_ = true;
    }
    if (problem.has_value()) {
      CompactEventsOf(*problem);
    } else {
      CompactSmallFamilies();
    }
  }
}

void Store::CompactEventsOf(uint32_t problem) {
  rocksdb::Status s = rocksdb::Status::Aborted("the store is not open");
  {
    std::shared_lock<std::shared_mutex> lock(db_mu_);
    if (db_ != nullptr) {
      rocksdb::CompactRangeOptions options;
      options.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
      options.exclusive_manual_compaction = false;  // RocksDB's own compactions go on
      options.canceled = &compact_canceled_;
      const std::string begin = Key32(problem);
      const std::string end = problem == UINT32_MAX ? std::string() : Key32(problem + 1);
      const rocksdb::Slice b(begin), e(end);
      s = db_->CompactRange(options, events_, &b, end.empty() ? nullptr : &e);
    }
  }
  // A failure is RocksDB's background error too (Health()); the next cut asks again.
  absl::MutexLock lock(&compact_mu_);
  ++(s.ok() ? compactions_.done : compactions_.failed);
}

Store::MemoryUsage Store::Memory() {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  MemoryUsage m;
  if (db_ == nullptr) return m;
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    uint64_t v = 0;
    if (db_->GetIntProperty(h, rocksdb::DB::Properties::kSizeAllMemTables, &v)) m.memtables += v;
    if (db_->GetIntProperty(h, rocksdb::DB::Properties::kEstimateTableReadersMem, &v)) {
      m.table_readers += v;
    }
  }
  if (block_cache_ != nullptr) m.block_cache = block_cache_->GetUsage();
  return m;
}

std::vector<Store::FamilySize> Store::FamilySizes() {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  std::vector<FamilySize> sizes;
  if (db_ == nullptr) return sizes;
  // handles_[0] is RocksDB's default family, which holds nothing of ours.
  for (size_t i = 1; i < handles_.size(); ++i) {
    uint64_t bytes = 0;
    uint64_t v = 0;
    if (db_->GetIntProperty(handles_[i], rocksdb::DB::Properties::kTotalSstFilesSize, &v)) {
      bytes += v;
    }
    if (db_->GetIntProperty(handles_[i], rocksdb::DB::Properties::kSizeAllMemTables, &v)) {
      bytes += v;
    }
    uint64_t live = 0, files = 0;
    if (db_->GetIntProperty(handles_[i], rocksdb::DB::Properties::kLiveSstFilesSize, &v)) {
      live = v;
    }
    rocksdb::ColumnFamilyMetaData meta;
    db_->GetColumnFamilyMetaData(handles_[i], &meta);
    files = meta.file_count;
    sizes.push_back({kFamilyNames[i - 1], bytes, live, files});
  }
  return sizes;
}

absl::Status Store::PutTrainingJob(uint32_t problem, int64_t job_id,
                                   const v1::TrainingJobRecord& record) {
  std::string key = Key32(problem);
  AppendU64(&key, static_cast<uint64_t>(job_id));
  return Put(&Store::training_jobs_, key, record, "training job");
}

absl::Status Store::ForEachTrainingJob(
    const std::function<absl::Status(uint32_t, int64_t, const v1::TrainingJobRecord&)>& fn) {
  return Scan<v1::TrainingJobRecord>(
      &Store::training_jobs_, "", "", 0, 12,
      [&](absl::string_view key, const v1::TrainingJobRecord& r) {
        return fn(ReadU32(key), static_cast<int64_t>(ReadU64(key.substr(4))), r);
      });
}

}  // namespace decision::storage
