// Durable state of the decision service in an embedded RocksDB. The key layout, family
// names and chunk sizes are in storage/format.h, the records in storage/records.proto.
//
// Durability (StoreOptions::sync): every write goes to RocksDB's write-ahead log first.
//   sync = false (default): the WAL is not fsync'ed. An acknowledged write survives a crash
//     of the process (including kill -9), not a crash of the machine or a power loss, which
//     can lose the last few seconds of writes.
//   sync = true: every write is fsync'ed before it is acknowledged: survives power loss, at
//     the cost of one disk flush per write (typically 0.1-10 ms, and fewer writes per
//     second).
//
// Errors: RocksDB statuses are converted once, here: IO errors and corruption become
// INTERNAL, a missing record NOT_FOUND, a record that does not parse or whose key has the
// wrong size DATA_LOSS. A write that fails because the store stopped writing (see below)
// is UNAVAILABLE.
//
// Write health: a write RocksDB cannot make durable (a full disk, an I/O error on the WAL,
// a flush or the MANIFEST) puts RocksDB in a background-error state in which it refuses
// every write. Health() says so (writable = false, the error, since when). Recover() gets
// the store writing again once the disk allows: DB::Resume() (it flushes the memtables and
// starts a new WAL), or, where RocksDB cannot resume (an I/O error it rates fatal, or a
// failed WAL with nothing to flush: see Recover), closing and reopening the database,
// which replays the WAL as a restart would. The caller retries Recover at a bounded rate
// (decisiond: from its maintenance round). RocksDB's own automatic recovery of errors that
// stop writes is turned off (it polls the free space every few seconds on a thread of its
// own): the caller's retries are the only ones, which keeps recovery observable and
// testable. Reads keep working while writes are stopped (not during a reopen).
//
// Thread safety: all methods may be called concurrently.
#ifndef DECISION_STORAGE_STORE_H_
#define DECISION_STORAGE_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "storage/format.h"
#include "storage/records.pb.h"

namespace rocksdb {
class Cache;
class ColumnFamilyHandle;
class Snapshot;
class CompactionFilter;
class DB;
class Env;
class WriteBatch;
}  // namespace rocksdb

namespace decision::storage {

// Clears the payload of a model record (a tree model's bytes, a table's rows, linear
// weights) and keeps its kind.
void DropModelPayload(v1::ExpertModelRecord* model);
// Whether a model record carries a payload (what DropModelPayload clears).
bool HasModelPayload(const v1::ExpertModelRecord& model);

// The threads a database open loads its table files with (RocksDB's
// max_file_opening_threads) when the directory holds `table_files` of them. RocksDB starts
// that many threads less one for each column family at every open, however few files the
// family has: its default, 16, starts 165 threads per open of a store's eleven families,
// which takes longer than opening a few hundred files on one thread. One thread per 32
// files, at most RocksDB's 16, for the many files a cold network disk reads in parallel
// (bench/README.md, "Opening the store").
int FileOpeningThreads(int table_files);

struct StoreOptions {
  bool sync = false;  // fsync every write; see the header comment
  bool create_if_missing = true;
  // Testing seam (like LevelDB's fault-injection Env, reduced to what the tests need): when
  // set, it is called before every write with a short name of what is written ("group",
  // "expert", "checkpoint", "backfill chunk", "log chunk"); a non-OK status fails that
  // write, with nothing written, as an I/O error would. Empty in production.
  std::function<absl::Status(absl::string_view what)> fault_injection;
  // Testing seam: the Env (and through it the FileSystem) RocksDB uses; tests pass one
  // that fails chosen writes, syncs or reads (tests/fault_injection_fs.h). Null (the
  // default, and always in production): the operating system's.
  std::shared_ptr<rocksdb::Env> env;
  // Runs RocksDB's compaction threads (its LOW pool) at nice 19, so that they yield the CPU
  // to the threads answering requests. Flushes keep their priority: a flush that falls
  // behind stops writes. The pool is the Env's, shared by every store of the process.
  bool low_priority_compactions = false;
  // Milliseconds since the epoch, for StoreHealth::since_ms. Null: the system clock.
  std::function<int64_t()> now_ms;
};

// Whether the store can write, and what stopped it. A snapshot: see Store::Health().
struct StoreHealth {
  bool writable = true;
  // The background error RocksDB reported last and has not cleared: while writable is
  // false, what stopped the writes; while writable is true, a milder one (a compaction that
  // ran out of space) that RocksDB retries by itself. OK if none.
  absl::Status error;
  int64_t since_ms = 0;      // when `error` was first reported (0 if none)
  int64_t write_errors = 0;  // writes that failed in RocksDB since the store opened
  int64_t recoveries = 0;    // times writes resumed after being stopped
};

class StoreHealthTracker;  // store.cc: RocksDB's background errors, seen by a listener
class RetentionCuts;       // retention.h: the events' cut per problem, for compactions

class Store {
 public:
  // Writes that Commit applies atomically, as one RocksDB write: concurrent decisions and
  // joins of a problem share one write-ahead-log append (group commit).
  class WriteGroup {
   public:
    WriteGroup();
    ~WriteGroup();
    WriteGroup(const WriteGroup&) = delete;
    WriteGroup& operator=(const WriteGroup&) = delete;
    int size() const { return size_; }  // records added (a decision, a join, ...: one each)

   private:
    friend class Store;
    std::unique_ptr<rocksdb::WriteBatch> batch_;
    int size_ = 0;
  };

  // Opens (or creates) the store in directory `path`. INTERNAL if it cannot be opened,
  // with a message "cannot open the store at PATH: REASON" whose reason an operator can act
  // on: the path is not a directory or not writable, another process holds its lock, or
  // RocksDB's words (a corrupt CURRENT or MANIFEST is "Corruption: ...").
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path,
                                                     const StoreOptions& options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Flushes and closes. Further calls fail. Called by the destructor if not called before.
  // A store that cannot write (Health()) is closed without the final WAL sync, which
  // RocksDB cannot do on a WAL that failed (in RocksDB builds with assertions, such as
  // Debian's, it aborts the process): the error is returned. Acknowledged writes are in
  // the WAL already, and the next Open replays it.
  absl::Status Close();

  // Write health (see the header comment). Cheap: one short lock.
  // Health().writable without its lock (one atomic load): the check on every Choose and
  // Reward.
  bool Writable() const;
  StoreHealth Health() const;
  // Gets the store writing again after a background error (see the header comment). OK if
  // it writes again (or never stopped); UNAVAILABLE with the reason if not (the disk is
  // still full or failing). Calls wait while it runs; a reopen that fails leaves the store
  // closed until a later Recover reopens it (calls meanwhile get UNAVAILABLE).
  absl::Status Recover();

  // Group writes (see WriteGroup): nothing is written until Commit.
  //
  // A new problem: its record, its first expert and its first checkpoint, so that a crash
  // leaves either the whole problem or nothing.
  absl::Status AddProblem(WriteGroup* group, uint32_t problem, const v1::ProblemRecord& record,
                          const v1::ExpertRecord& first_expert,
                          const v1::CheckpointRecord& checkpoint,
                          const v1::EstimatorStateRecord& state);
  // A new pending decision, indexed by its deadline.
  absl::Status AddDecision(WriteGroup* group, uint32_t problem, absl::string_view event_id,
                           const v1::EventRecord& record);
  // A joined sample: the updated event, the sample at `sequence`, and the removal of the
  // pending index entry. decision_stored = false: the decision was never written (it is
  // joined in the same write), so there is no index entry to delete.
  absl::Status AddJoin(WriteGroup* group, uint32_t problem, absl::string_view event_id,
                       const v1::EventRecord& event, int64_t sequence,
                       const v1::SampleRecord& sample, bool decision_stored);
  // A pending event that expired without being learned (dropped): the event, and the
  // removal of its index entry if the decision was stored.
  absl::Status AddExpiry(WriteGroup* group, uint32_t problem, absl::string_view event_id,
                         const v1::EventRecord& record, bool decision_stored);
  // An event that is no longer pending, rewritten (a late reward's mark). The pending index
  // is not touched.
  absl::Status AddEventUpdate(WriteGroup* group, uint32_t problem, absl::string_view event_id,
                              const v1::EventRecord& record);
  // Writes every record of the group or none.
  absl::Status Commit(WriteGroup* group);

  // Every problem record, in index order. A record that does not parse is passed to
  // `damaged` with DATA_LOSS (the other problems go on), or, without `damaged`, ends the
  // scan with DATA_LOSS. A key of the wrong size (no index to name) always ends it.
  absl::Status ForEachProblem(
      const std::function<absl::Status(uint32_t, const v1::ProblemRecord&)>& fn,
      const std::function<absl::Status(uint32_t, const absl::Status&)>& damaged = nullptr);

  // An expert's record. A model payload in `record` (a registration) is written once, under
  // the expert's model key, and the record keeps only its kind (model_apart). A record
  // without a payload (a rewrite of the expert's state) leaves the stored model as it is,
  // unless the record is unloaded (unloaded_at_sample): then nothing loads the model again
  // and it is deleted. A stored record that still carries its payload inline (written
  // before models were kept apart) has it moved apart in the same write.
  absl::Status PutExpert(uint32_t problem, uint32_t expert, const v1::ExpertRecord& record);
  // The record with its model's payload. NOT_FOUND if the problem has no such expert;
  // DATA_LOSS if the record, or the model it says is apart, is missing or does not parse.
  absl::StatusOr<v1::ExpertRecord> GetExpert(uint32_t problem, uint32_t expert);
  // Every expert of `problem` in id order, each record with its model's payload (one model
  // in memory at a time, besides what `fn` keeps).
  absl::Status ForEachExpert(
      uint32_t problem,
      const std::function<absl::Status(uint32_t, const v1::ExpertRecord&)>& fn);

  // Pending events in deadline order.
  absl::Status ForEachPending(
      uint32_t problem,
      const std::function<absl::Status(int64_t deadline_ms, absl::string_view event_id)>& fn);
  // NOT_FOUND if the event is unknown.
  absl::StatusOr<v1::EventRecord> GetEvent(uint32_t problem, absl::string_view event_id);
  // Up to `limit` stored event ids of `problem` in key order, after `*after` (from the
  // first if it is empty: an event id never is), keys only (no record is parsed). Sets
  // `*after` to the last id visited, to resume from. Returns whether ids may remain.
  absl::StatusOr<bool> ScanEventIds(uint32_t problem, std::string* after, int64_t limit,
                                    const std::function<void(absl::string_view)>& fn);

  // The sample at `sequence`; NOT_FOUND if the store has none there.
  absl::StatusOr<v1::SampleRecord> GetSample(uint32_t problem, int64_t sequence);
  // Samples with sequence >= start, in order, until fn returns a non-OK status (which is
  // returned) or `limit` samples (0: no limit) were visited.
  absl::Status ForEachSample(
      uint32_t problem, int64_t start, int64_t limit,
      const std::function<absl::Status(int64_t, const v1::SampleRecord&)>& fn);

  absl::Status PutBackfillChunk(uint32_t problem, uint32_t expert, uint64_t chunk,
                                const v1::BackfillChunk& record);
  // Backfill chunks of `expert` from chunk `start_chunk` on, in order.
  absl::Status ForEachBackfillChunk(
      uint32_t problem, uint32_t expert,
      const std::function<absl::Status(uint64_t, const v1::BackfillChunk&)>& fn,
      uint64_t start_chunk = 0);

  absl::Status PutLogChunk(uint32_t problem, uint64_t chunk, const v1::LogChunk& record);
  // Log chunks from chunk `start_chunk` on, in order.
  absl::Status ForEachLogChunk(
      uint32_t problem, const std::function<absl::Status(uint64_t, const v1::LogChunk&)>& fn,
      uint64_t start_chunk = 0);

  // NOT_FOUND if absent.
  absl::StatusOr<v1::LogChunk> GetLogChunk(uint32_t problem, uint64_t chunk);
  absl::StatusOr<v1::BackfillChunk> GetBackfillChunk(uint32_t problem, uint32_t expert,
                                                     uint64_t chunk);

  // The checkpoint, and, if not null, the estimators' state, in one write.
  absl::Status PutCheckpoint(uint32_t problem, const v1::CheckpointRecord& record,
                             const v1::EstimatorStateRecord* state = nullptr);
  // NOT_FOUND if the problem has none (a store written before it existed).
  absl::StatusOr<v1::EstimatorStateRecord> GetEstimatorState(uint32_t problem);
  // Deletes it: the next restart learns the problem's whole log again (tools, tests).
  absl::Status DeleteEstimatorState(uint32_t problem);
  // NOT_FOUND if the problem has no checkpoint yet.
  absl::StatusOr<v1::CheckpointRecord> GetCheckpoint(uint32_t problem);

  // Rewrites a problem's record (its settings changed at runtime: retention).
  absl::Status PutProblem(uint32_t problem, const v1::ProblemRecord& record);

  // Retention: in one write, deletes the problem's samples before cut.first_sample, its log
  // chunks wholly before it and those of the `backfilled` experts (the ones that may have
  // backfill chunks the cut deletes), by range deletions (no scan, whatever their number;
  // each stays until compactions drop it), and stores `cut` (RetentionRecord); then drops
  // the table files wholly before the cut. From then on compactions of the events family
  // drop the problem's joined events whose sample was deleted, and its events never joined
  // (expired, dropped) decided before cut.events_before_ms; pending ones stay (a
  // compaction filter, retention.h: nothing on the request path reads or deletes them).
  // RocksDB reclaims the rest of the space as it compacts (Compact() to force it).
  // INVALID_ARGUMENT if first_sample is not a multiple of kLogChunkSamples, or if the cut
  // moves back from the stored one (nothing is written).
  absl::Status ApplyRetention(uint32_t problem, const std::vector<uint32_t>& backfilled,
                              const v1::RetentionRecord& cut);
  // The last cut applied; NOT_FOUND if none.
  absl::StatusOr<v1::RetentionRecord> GetRetention(uint32_t problem);
  // Asks for a compaction of all of `problem`'s events, the bottom level included, on the
  // store's compaction thread (one at a time; a problem already queued is not queued
  // again). The events' retention filter drops records only in the files a compaction
  // rewrites, and RocksDB's own compactions may never rewrite old events: with event ids in
  // time order (a counter, a time-based id) old files do not overlap new ones, so they move
  // down the levels whole and stay at the bottom. The owner asks once enough was cut
  // (server/problem_retention.cc). Close and Recover cancel the one running.
  void CompactEventsSoon(uint32_t problem);
  // The record families other than the log's (problems, experts, checkpoints, pending,
  // audit, training jobs) are flushed a few KB at a time, at the WAL's cap and at every
  // shutdown, and their keys often come in order (audit sequences, job ids): RocksDB then
  // moves each small file down whole instead of merging it, and they pile up, an open file
  // descriptor and a probe per lookup each, for as long as the store lives. This asks the
  // compaction thread to merge such a family into one file: at two files while it holds
  // under 1 MiB; larger, once its files besides the largest add up to half of it or at
  // four files, so that a family of megabytes is not rewritten at every flush; from
  // 64 MiB (one table file's worth) on, never. Cheap to call often: it reads the
  // families' metadata only. The log's families (events, samples, backfill, log
  // chunks) are left alone: retention drops their files whole.
  void CompactSmallFamiliesSoon();
  // Blocks until no compaction asked for by CompactEventsSoon or CompactSmallFamiliesSoon
  // is queued or running, and then none of RocksDB's own is either (tests).
  void WaitForEventCompactions();
  // Event compactions finished, and failed or cancelled, since the store opened.
  struct EventCompactions {
    int64_t done = 0;
    int64_t failed = 0;
  };
  EventCompactions event_compactions();

  // Deletion on request (DecisionService.DeleteEvents): in one write, deletes each event's
  // record and, where `sequence` >= 0, rewrites that sample as `sample` (redacted).
  struct Redaction {
    std::string event_id;
    int64_t sequence = -1;
    v1::SampleRecord sample;
  };
  absl::Status DeleteEvents(uint32_t problem, const std::vector<Redaction>& redactions);

  // The audit log: appends `record` at the next sequence (from 0).
  absl::Status AppendAudit(const v1::AuditRecord& record);
  // Audit records with sequence >= start, in order, at most `limit` (0: no limit).
  absl::Status ForEachAudit(int64_t start, int64_t limit,
                            const std::function<absl::Status(int64_t, const v1::AuditRecord&)>& fn);

  // Bytes per column family (its SST files and memtables), approximately, in kFamilyNames
  // order.
  struct FamilySize {
    const char* family;
    uint64_t bytes;           // SST files and memtables
    uint64_t live_sst_bytes;  // the SST files of the current version (compacted ones not)
    uint64_t sst_files;       // their count (RocksDB keeps each one open: an fd each)
  };
  std::vector<FamilySize> FamilySizes();
  // RocksDB's memory: the memtables (every family, immutable ones included; one budget of
  // 64 MiB), the table readers' index and filter blocks held outside the block cache (they
  // grow with the data kept), and the block cache's use (at most 32 MiB).
  struct MemoryUsage {
    uint64_t memtables = 0;
    uint64_t table_readers = 0;
    uint64_t block_cache = 0;
  };
  MemoryUsage Memory();

  // Moving a problem (DecisionService.BeginMove and ImportProblem; storage/format.h,
  // kProblemFamilies). A record: its family, its key without the problem's index, its
  // value.
  struct ProblemEntry {
    enum Op { kPut, kDelete, kDeleteRange };
    int family = 0;
    std::string key;  // kDeleteRange: from this key
    std::string value;
    Op op = kPut;
    // kDeleteRange: to this key, excluded; empty: to the end of the problem's keys.
    std::string range_end;
    // A part of a value larger than an export page (kPut only): `value` is the bytes from
    // `value_offset` of a value of `value_size` bytes. 0 and 0 for a whole value.
    int64_t value_offset = 0;
    int64_t value_size = 0;
  };
  // Where an export page starts: in `family`, after the key `after` if `started` (a key
  // may be empty: the problem and checkpoint records'), else from its first record; with
  // `offset` > 0, at that byte of the value of `after`, of which a part was given.
  struct ExportCursor {
    int family = 0;
    bool started = false;
    std::string after;
    int64_t offset = 0;
  };
  // `problem`'s records after the cursor in (family, key) order, as many whole records as
  // fit in `max_bytes` of keys and values, or, when the next one is larger than a page on
  // its own, a part of it of `max_bytes` (ProblemEntry::value_offset); moves the cursor
  // past what was given. Returns whether records may remain. The caller keeps the problem
  // from changing between pages (a fenced problem does not).
  // With `at_snapshot`, the records as they were at WatchProblem.
  absl::StatusOr<bool> ExportProblemPage(uint32_t problem, ExportCursor* cursor,
                                         int64_t max_bytes,
                                         const std::function<void(const ProblemEntry&)>& fn,
                                         bool at_snapshot = false);
  // A move with a catch-up: from this call on the store notes every key of `problem` that
  // is written (puts, deletions, range deletions) and keeps a snapshot, atomically: each
  // write is in the snapshot or noted. The copy reads at the snapshot while the problem
  // serves; ExportProblemChanges then gives what was written since. The notes grow with
  // the writes until UnwatchProblem. FAILED_PRECONDITION if the problem is watched
  // already. A reopen (Recover) or Close ends every watch (the snapshot is gone):
  // ExportProblemChanges then fails with ABORTED.
  absl::Status WatchProblem(uint32_t problem);
  void UnwatchProblem(uint32_t problem);
  // The keys written since WatchProblem after the cursor, in (family, key) order, each with
  // its value now or as a deletion; the range deletions come first, on the page that
  // starts at the first family. Pages as ExportProblemPage. FAILED_PRECONDITION if the
  // problem is not watched.
  absl::StatusOr<bool> ExportProblemChanges(uint32_t problem, ExportCursor* cursor,
                                            int64_t max_bytes,
                                            const std::function<void(const ProblemEntry&)>& fn);
  // Writes the entries under `problem` (puts, deletions, range deletions in that order
  // within the write), in one write. INVALID_ARGUMENT, with nothing written, for a family
  // outside [1, kProblemFamilies) (the problem record is written with PutProblem). A
  // retention cut among them is put in force for the events' compaction filter.
  absl::Status ImportProblemEntries(uint32_t problem, const std::vector<ProblemEntry>& entries);
  // Deletes every record of `problem` in the families of kProblemFamilies (range deletions:
  // no scan), in one write; with a `stub`, its problem record becomes the stub instead.
  absl::Status DeleteProblem(uint32_t problem, const v1::ProblemRecord* stub = nullptr);

  // Training jobs (server/training_jobs.h): one record per job, rewritten as it changes.
  absl::Status PutTrainingJob(uint32_t problem, int64_t job_id,
                              const v1::TrainingJobRecord& record);
  // Every stored job of every problem, in (problem, job id) order.
  absl::Status ForEachTrainingJob(
      const std::function<absl::Status(uint32_t problem, int64_t job_id,
                                       const v1::TrainingJobRecord&)>& fn);
  // Writes every memtable to table files (a flush), or compacts every family, and waits.
  // RocksDB does both by itself when it needs to; these make them happen at a chosen point
  // (tests, and an operator's tool). A flush that fails stops writes (see Health()); a
  // compaction that fails does not (RocksDB retries it).
  absl::Status Flush();
  absl::Status Compact();

 private:
  Store() = default;
  // `family` names the handle member: it is read under db_mu_ (Recover may replace it).
  absl::Status Put(rocksdb::ColumnFamilyHandle* Store::*family, const std::string& key,
                   const google::protobuf::MessageLite& record, absl::string_view what);
  absl::Status Write(rocksdb::WriteBatch* batch, absl::string_view what);
  // Reads the payload of `record`'s model into it if the record has it apart
  // (model_apart); DATA_LOSS if it is missing or does not parse.
  absl::Status AttachModel(uint32_t problem, uint32_t expert, v1::ExpertRecord* record);
  // The record at `key`: NOT_FOUND if absent, DATA_LOSS if it does not parse.
  template <typename Record>
  absl::StatusOr<Record> Get(rocksdb::ColumnFamilyHandle* Store::*family, const std::string& key,
                             absl::string_view what);
  // Records whose key starts with `prefix`, from `start`; fn gets the rest of the key, which
  // must have `suffix_bytes` bytes (else DATA_LOSS). Keys whose rest has `skip_suffix_bytes`
  // bytes (if not 0) are passed over unread (the experts family's model keys).
  template <typename Record>
  absl::Status Scan(rocksdb::ColumnFamilyHandle* Store::*family, const std::string& prefix,
                    const std::string& start, int64_t limit, size_t suffix_bytes,
                    const std::function<absl::Status(absl::string_view, const Record&)>& fn,
                    size_t skip_suffix_bytes = 0);

  // REQUIRES: db_mu_ held exclusively. Open the RocksDB database (db_, the handles) at
  // path_, and close it.
  absl::Status OpenDbLocked();
  absl::Status CloseDbLocked();
  bool MemtablesEmptyLocked();
  // The status of a call while db_ is null: closed, or being reopened by Recover.
  absl::Status NotOpen() const;
  // The compaction thread (CompactEventsSoon), and one compaction of a problem's events.
  void CompactEventsLoop();
  void CompactEventsOf(uint32_t problem);
  void CompactSmallFamilies();
  // The families CompactSmallFamiliesSoon looks after.
  std::vector<rocksdb::ColumnFamilyHandle*> SmallFamiliesLocked() const;
  void StopEventCompactions();

  // The watches (WatchProblem): note the keys of `batch` (or of one put) written to
  // watched problems. REQUIRES: watch_mu_ held shared, the write done.
  void NoteWatchedWrites(rocksdb::WriteBatch* batch);
  void NoteWatchedKey(uint32_t column_family_id, absl::string_view key);
  // The kFamilyNames index of a column family that holds problems' records, or -1.
  // REQUIRES: db_mu_ held.
  int ProblemFamilyOf(uint32_t column_family_id) const;
  // REQUIRES: db_mu_ held exclusively. Releases every watch's snapshot.
  void EndWatchesLocked();

  std::string path_;
  StoreOptions options_;
  // Watches. Every write holds watch_mu_ shared from before it writes until its keys are
  // noted; WatchProblem takes it exclusively to take its snapshot.
  struct Watch {
    const rocksdb::Snapshot* snapshot = nullptr;  // null once a reopen ended it
    std::set<std::pair<int, std::string>> keys;    // (family, key without the prefix)
    std::vector<std::tuple<int, std::string, std::string>> ranges;  // family, from, to
  };
  std::shared_mutex watch_mu_;
  absl::Mutex watches_mu_ ABSL_ACQUIRED_AFTER(watch_mu_);
  std::map<uint32_t, Watch> watches_ ABSL_GUARDED_BY(watches_mu_);
  std::atomic<int> watch_count_{0};  // watches_.size(), read without the lock
  std::shared_ptr<StoreHealthTracker> health_;  // shared with RocksDB's listener
  std::shared_ptr<RetentionCuts> cuts_;         // shared with the events' compaction filter
  std::shared_ptr<rocksdb::CompactionFilter> event_filter_;  // outlives the database
  // Held shared by every call that uses db_ or the family handles, exclusively by Recover
  // (which may close and reopen the database) and Close. A shared_mutex (glibc: readers
  // first) because the callbacks of a scan may call the store again.
  mutable std::shared_mutex db_mu_;
  bool closed_ = false;  // guarded by db_mu_
  rocksdb::DB* db_ = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  std::shared_ptr<rocksdb::Cache> block_cache_;  // shared by every family's tables
  rocksdb::ColumnFamilyHandle* problems_ = nullptr;
  rocksdb::ColumnFamilyHandle* experts_ = nullptr;
  rocksdb::ColumnFamilyHandle* events_ = nullptr;
  rocksdb::ColumnFamilyHandle* samples_ = nullptr;
  rocksdb::ColumnFamilyHandle* backfill_ = nullptr;
  rocksdb::ColumnFamilyHandle* checkpoints_ = nullptr;
  rocksdb::ColumnFamilyHandle* pending_ = nullptr;
  rocksdb::ColumnFamilyHandle* logchunks_ = nullptr;
  rocksdb::ColumnFamilyHandle* audit_ = nullptr;
  rocksdb::ColumnFamilyHandle* training_jobs_ = nullptr;
  // CompactEventsSoon's queue and thread (started by the first request). Close and Recover
  // set compact_canceled_, which stops the running compaction, before they wait for db_mu_.
  absl::Mutex compact_mu_;
  std::deque<uint32_t> compact_queue_ ABSL_GUARDED_BY(compact_mu_);
  bool compact_running_ ABSL_GUARDED_BY(compact_mu_) = false;
  bool compact_small_ ABSL_GUARDED_BY(compact_mu_) = false;  // CompactSmallFamiliesSoon asked
  bool compact_stop_ ABSL_GUARDED_BY(compact_mu_) = false;
  EventCompactions compactions_ ABSL_GUARDED_BY(compact_mu_);
  std::thread compactor_;
  std::atomic<bool> compact_canceled_{false};
  absl::Mutex audit_mu_;  // one append at a time: sequences are dense
  int64_t next_audit_ ABSL_GUARDED_BY(audit_mu_) = 0;
};

}  // namespace decision::storage

#endif  // DECISION_STORAGE_STORE_H_
