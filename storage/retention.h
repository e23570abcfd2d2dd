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

// Per problem, the cut its events follow: a joined event goes with its sample (sequence
// before first_sample), an event never joined (expired, dropped) when it was decided before
// events_before_ms; a pending event stays. Thread-safe: RocksDB's compaction threads read it
// while the store sets it.
class RetentionCuts {
 public:
  struct Cut {
    int64_t first_sample = 0;
    int64_t events_before_ms = 0;
  };
  void Set(uint32_t problem, Cut cut) {
    absl::MutexLock lock(&mu_);
    cuts_[problem] = cut;
  }
  // {0, 0} if the problem has none (its events are kept).
  Cut Get(uint32_t problem) const {
    absl::ReaderMutexLock lock(&mu_);
    auto it = cuts_.find(problem);
    return it == cuts_.end() ? Cut() : it->second;
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, Cut> cuts_ ABSL_GUARDED_BY(mu_);
};

// The events family's compaction filter: drops an event of a problem with a cut as
// RetentionCuts says. A record that does not parse is kept (it is reported where it is
// read, not lost silently here).
std::shared_ptr<rocksdb::CompactionFilter> NewEventRetentionFilter(
    std::shared_ptr<const RetentionCuts> cuts);

}  // namespace decision::storage

#endif  // DECISION_STORAGE_RETENTION_H_
