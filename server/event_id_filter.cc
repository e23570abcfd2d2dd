#include "server/event_id_filter.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

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

// The block of h1 among `blocks`: the high word of h1 * blocks, which spreads h1 evenly
// over any number of blocks (Lemire's multiply-shift range reduction).
__extension__ typedef unsigned __int128 Uint128;  // GCC and Clang; not ISO C++

uint64_t BlockOf(uint64_t h1, uint64_t blocks) {
  return static_cast<uint64_t>((static_cast<Uint128>(h1) * blocks) >> 64);
}

}  // namespace

EventIdFilter::EventIdFilter(int64_t first_capacity)
    : first_capacity_(std::max<int64_t>(first_capacity, 64)) {
  AddFilter(first_capacity_);
}

void EventIdFilter::Unmap::operator()(uint64_t* words) const { munmap(words, bytes); }

void EventIdFilter::AddFilter(int64_t capacity) {
  // kBitsPerId per id, in whole 512-bit blocks.
  const uint64_t blocks = std::max<uint64_t>(1, (capacity * kBitsPerId + 511) / 512);
  const size_t bytes = blocks * kWordsPerBlock * sizeof(uint64_t);
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();  // as operator new would
  Filter f;
  f.words = std::unique_ptr<uint64_t[], Unmap>(static_cast<uint64_t*>(mapped), Unmap{bytes});
  f.blocks = blocks;
  f.capacity = capacity;
  filters_.push_back(std::move(f));
}

int64_t EventIdFilter::NextCapacity() const {
  return dropped_ ? std::max(first_capacity_, size_ / 3) : kGrowth * filters_.back().capacity;
}

void EventIdFilter::Insert(absl::string_view event_id, int64_t now_ms) {
  if (filters_.back().count >= filters_.back().capacity) {
    AddFilter(NextCapacity());
  }
  Filter& f = filters_.back();
  f.newest_ms = std::max(f.newest_ms, now_ms);
  const Hashes h = HashId(event_id);
  uint64_t* block = &f.words[BlockOf(h.h1, f.blocks) * kWordsPerBlock];
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
    const uint64_t* block = &f.words[BlockOf(h.h1, f.blocks) * kWordsPerBlock];
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
  if (forgot > 0 && !dropped_) {
    dropped_ = true;
    // The newest filter was sized while the filters grew fourfold, maybe for far more ids
    // than a generation takes from now on: then it takes no more (it goes with its ids).
    Filter& newest = filters_.back();
    if (newest.capacity > NextCapacity()) newest.capacity = newest.count;
  }
  return forgot;
}

int64_t EventIdFilter::memory_bytes() const {
  int64_t bytes = 0;
  for (const Filter& f : filters_) bytes += static_cast<int64_t>(f.blocks * kWordsPerBlock * 8);
  return bytes;
}

}  // namespace decision::server
