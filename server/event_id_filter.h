// A set of event ids that answers "certainly not stored" without reading the store.
//
// Every Choose with a caller-supplied event id must find out whether that id was used
// before (idempotency). Nearly all are new, and a RocksDB lookup of a missing key still
// consults the memtables and every level's Bloom filter: ~1 us, growing with the store
// (0.6 -> 0.9 us from 10k to 1M samples). This filter keeps every event id of a problem in
// memory as blocked Bloom filters (12 bits per id, 7 bits in one 64-byte cache line, so a
// probe costs at most one cache miss; about 0.5% false positives per full filter); only
// ids it may contain are looked up in the store.
//
// It grows without rebuilding: when the newest filter holds its capacity, a new one four
// times its size is added, and a lookup probes each (4 filters at 1M ids, 8 at 10^9).
// Memory: 1.5 MB per million ids, plus the newest filter's spare room (up to four times
// that). Not persisted: after a start the owner refills it from the store while it
// serves.
//
// Retention: each filter remembers the newest insertion time among its ids, and
// DropBefore forgets the filters whose ids are all older than a cut (the store deletes
// those events). From the first drop on, a new filter is sized to a third of the ids still
// held rather than four times the last: the filters are then generations of about half the
// retention window W, they hold at most 1.5 W ids, and take 2.2 bytes per id of the window
// on average, 2.9 at most, with 3 or 4 filters to probe (a third of the held ids; half gave
// 2.8 and 4.1 bytes, all of them 4.1 and 5.2: a simulation of W = 150,000). The filter
// that was the newest at the first drop, sized while they grew, takes no more ids. Each
// filter is sized to its capacity, not to a power of two, and mapped with mmap, so that a
// dropped one goes back to the operating system at once (a freed heap block of that size
// may not).
//
// Thread safety: not thread-safe (the Problem holds its lock).
#ifndef DECISION_SERVER_EVENT_ID_FILTER_H_
#define DECISION_SERVER_EVENT_ID_FILTER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"

namespace decision::server {

class EventIdFilter {
 public:
  // `first_capacity`: ids the first filter holds before a larger one is added.
  explicit EventIdFilter(int64_t first_capacity = 1 << 16);

  // `now_ms`: when (the owner's clock), for DropBefore.
  void Insert(absl::string_view event_id, int64_t now_ms = 0);
  // False only if `event_id` was never inserted (or was dropped).
  bool MayContain(absl::string_view event_id) const;
  // Forgets the filters (not the newest) whose ids were all inserted before `before_ms`.
  // Returns how many ids it forgot.
  int64_t DropBefore(int64_t before_ms);

  int64_t size() const { return size_; }
  int64_t memory_bytes() const;

 private:
  // Frees a filter's mapping.
  struct Unmap {
    size_t bytes;
    void operator()(uint64_t* words) const;
  };
  struct Filter {
    std::unique_ptr<uint64_t[], Unmap> words;  // blocks x 8 words, zeroed by mmap
    uint64_t blocks = 0;                       // 512-bit blocks (one cache line each)
    int64_t capacity = 0;
    int64_t count = 0;
    int64_t newest_ms = 0;  // the latest insertion time among its ids
  };
  static constexpr int kProbes = 7;
  // A full filter answers about 0.5% of new ids "maybe" (a store lookup); 10 bits gave
  // 1%, which the 3 or 4 filters a window spans add up.
  static constexpr int64_t kBitsPerId = 12;
  static constexpr int64_t kGrowth = 4;

  void AddFilter(int64_t capacity);
  // The capacity of the next filter: four times the last while the filters grow, then a
  // third of the ids held (a generation of about half the window).
  int64_t NextCapacity() const;

  std::vector<Filter> filters_;
  int64_t size_ = 0;
  int64_t first_capacity_ = 0;
  bool dropped_ = false;  // DropBefore forgot some: new filters follow the window
};

}  // namespace decision::server

#endif  // DECISION_SERVER_EVENT_ID_FILTER_H_
