#include "server/event_id_filter.h"

#include <algorithm>

#include "absl/hash/hash.h"

namespace decision::server {
namespace {

constexpr int64_t kWordsPerBlock = 8;  // 512 bits: one cache line

// Two 64-bit hashes of the id: h1 picks the block, h2 the kProbes bits in it (9 bits each).
struct Hashes {
  uint64_t h1, h2;
};

Hashes HashId(absl::string_view id) {
  const uint64_t h = absl::Hash<absl::string_view>{}(id);
  // A 64-bit finaliser (splitmix64) derives the second hash.
  uint64_t z = h + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return {h, z};
}

}  // namespace

EventIdFilter::EventIdFilter(int64_t first_capacity)
    : first_capacity_(std::max<int64_t>(first_capacity, 64)) {
  AddFilter(first_capacity_);
}

void EventIdFilter::AddFilter(int64_t capacity) {
  // ~10 bits per id, in whole 512-bit blocks, a power of two of them.
  int64_t blocks = 1;
  while (blocks * kWordsPerBlock * 64 < capacity * 10) blocks *= 2;
  Filter f;
  f.words.assign(static_cast<size_t>(blocks * kWordsPerBlock), 0);
  f.capacity = capacity;
  filters_.push_back(std::move(f));
}

void EventIdFilter::Insert(absl::string_view event_id, int64_t now_ms) {
  if (filters_.back().count >= filters_.back().capacity) {
    AddFilter(dropped_ ? std::max(first_capacity_, size_) : kGrowth * filters_.back().capacity);
  }
  Filter& f = filters_.back();
  f.newest_ms = std::max(f.newest_ms, now_ms);
  const Hashes h = HashId(event_id);
  const uint64_t blocks = f.words.size() / kWordsPerBlock;
  uint64_t* block = &f.words[(h.h1 & (blocks - 1)) * kWordsPerBlock];
  for (int i = 0; i < kProbes; ++i) {
    const uint64_t bit = (h.h2 >> (9 * i)) & 511;
    block[bit >> 6] |= uint64_t{1} << (bit & 63);
  }
  ++f.count;
  ++size_;
}

bool EventIdFilter::MayContain(absl::string_view event_id) const {
  const Hashes h = HashId(event_id);
  for (const Filter& f : filters_) {
    if (f.count == 0) continue;
    const uint64_t blocks = f.words.size() / kWordsPerBlock;
    const uint64_t* block = &f.words[(h.h1 & (blocks - 1)) * kWordsPerBlock];
    bool all = true;
    for (int i = 0; i < kProbes && all; ++i) {
      const uint64_t bit = (h.h2 >> (9 * i)) & 511;
      all = (block[bit >> 6] >> (bit & 63)) & 1;
    }
    if (all) return true;
  }
  return false;
}

int64_t EventIdFilter::DropBefore(int64_t before_ms) {
  int64_t forgot = 0;
  size_t kept = 0;
  for (size_t i = 0; i < filters_.size(); ++i) {
    if (i + 1 < filters_.size() && filters_[i].newest_ms < before_ms) {
      forgot += filters_[i].count;
      continue;
    }
    if (kept != i) filters_[kept] = std::move(filters_[i]);
    ++kept;
  }
  filters_.resize(kept);
  size_ -= forgot;
  if (forgot > 0) dropped_ = true;
  return forgot;
}

int64_t EventIdFilter::memory_bytes() const {
  int64_t bytes = 0;
  for (const Filter& f : filters_) bytes += static_cast<int64_t>(f.words.size() * 8);
  return bytes;
}

}  // namespace decision::server
