// A set of event ids that answers "certainly not stored" without reading the store.
//
// Every Choose with a caller-supplied event id must find out whether that id was used
// before (idempotency). Nearly all are new, and a RocksDB lookup of a missing key still
// consults the memtables and every level's Bloom filter: ~1 us, growing with the store
// (0.6 -> 0.9 us from 10k to 1M samples). This filter keeps every event id of a problem in
// memory as blocked Bloom filters (~10 bits per id, 7 bits in one 64-byte cache line, so a
// probe costs at most one cache miss; about 1-2% false positives); only ids it may contain
// are looked up in the store.
//
// It grows without rebuilding: when the newest filter holds its capacity, a new one four
// times its size is added, and a lookup probes each (4 filters at 1M ids, 8 at 10^9).
// Memory: about 1.25 MB per million ids, plus the newest filter's spare room (up to four
// times that). Ids are never removed (event records are kept forever). Not persisted: the
// owner refills it from the store on start.
//
// Thread safety: not thread-safe (the Problem holds its lock).
#ifndef DECISION_SERVER_EVENT_ID_FILTER_H_
#define DECISION_SERVER_EVENT_ID_FILTER_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace decision::server {

class EventIdFilter {
 public:
  // `first_capacity`: ids the first filter holds before a larger one is added.
  explicit EventIdFilter(int64_t first_capacity = 1 << 16);

  void Insert(absl::string_view event_id);
  // False only if `event_id` was never inserted.
  bool MayContain(absl::string_view event_id) const;

  int64_t size() const { return size_; }
  int64_t memory_bytes() const;

 private:
  struct Filter {
    std::vector<uint64_t> words;  // a power of two of 64-bit words
    int64_t capacity = 0;
    int64_t count = 0;
  };
  static constexpr int kProbes = 7;
  static constexpr int64_t kGrowth = 4;

  void AddFilter(int64_t capacity);

  std::vector<Filter> filters_;
  int64_t size_ = 0;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_EVENT_ID_FILTER_H_
