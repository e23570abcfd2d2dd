// Retention's part inside RocksDB: the cut of each problem's events, which a compaction
// filter on the events family applies as RocksDB compacts (Store::ApplyRetention).
// Internal to storage.
#ifndef DECISION_STORAGE_RETENTION_H_
#define DECISION_STORAGE_RETENTION_H_

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace rocksdb {
class CompactionFilter;
}

namespace decision::storage {

// Per problem, the time before which its events that are not pending are dropped.
// Thread-safe: RocksDB's compaction threads read it while the store sets it.
class RetentionCuts {
 public:
  void Set(uint32_t problem, int64_t events_before_ms) {
    absl::MutexLock lock(&mu_);
    cuts_[problem] = events_before_ms;
  }
  // 0 if the problem has none (its events are kept).
  int64_t EventsBefore(uint32_t problem) const {
    absl::ReaderMutexLock lock(&mu_);
    auto it = cuts_.find(problem);
    return it == cuts_.end() ? 0 : it->second;
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, int64_t> cuts_ ABSL_GUARDED_BY(mu_);
};

// The events family's compaction filter: drops an event of a problem with a cut if it was
// decided before the cut and is not pending. A record that does not parse is kept (it is
// reported where it is read, not lost silently here).
std::shared_ptr<rocksdb::CompactionFilter> NewEventRetentionFilter(
    std::shared_ptr<const RetentionCuts> cuts);

}  // namespace decision::storage

#endif  // DECISION_STORAGE_RETENTION_H_
