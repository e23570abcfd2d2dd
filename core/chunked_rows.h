// Append-only storage of fixed-width rows in fixed-size chunks. Unlike std::vector, growing
// never copies what is stored (a vector doubling a multi-hundred-MB log stalls one append for
// tens of milliseconds), and a row never moves once appended.
//
// Chunks are reference-counted so that SharedPrefix() can hand another thread the rows stored
// so far without copying them: rows never change once appended (only AppendRow writes, and
// only the row it appends), so the prefix stays valid and unchanged while this object keeps
// appending, and even after it is reset or destroyed.
//
// Thread safety: not thread-safe, except that a SharedPrefix() may be read by one thread
// while another appends to the original.
#ifndef DECISION_CORE_CHUNKED_ROWS_H_
#define DECISION_CORE_CHUNKED_ROWS_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace decision {

template <typename T>
class ChunkedRows {
 public:
  static constexpr size_t kRowsPerChunkLog2 = 12;  // 4096 rows per chunk
  static constexpr size_t kRowsPerChunk = size_t{1} << kRowsPerChunkLog2;

  explicit ChunkedRows(size_t width = 1) : width_(width) {}
  // Move-only: two objects appending into shared chunks would write the same rows.
  ChunkedRows(ChunkedRows&&) = default;
  ChunkedRows& operator=(ChunkedRows&&) = default;
  ChunkedRows(const ChunkedRows&) = delete;
  ChunkedRows& operator=(const ChunkedRows&) = delete;

  size_t width() const { return width_; }
  size_t rows() const { return rows_; }

  // Appends a zero-initialised row and returns it.
  T* AppendRow() {
    if ((rows_ & (kRowsPerChunk - 1)) == 0) {
      // Not zeroed here: zeroing a whole chunk (about 1 MB for a 32-expert log) at once
      // stalled one append for ~0.6 ms; each row is zeroed as it is appended instead.
      chunks_.push_back(std::shared_ptr<T[]>(new T[kRowsPerChunk * width_ + (width_ == 0)]));
    }
    T* r = row(rows_);
    std::fill_n(r, width_, T{});
    ++rows_;
    return r;
  }

  // REQUIRES: i < rows() (or i == rows() for a row just reserved by AppendRow).
  T* row(size_t i) {
    return chunks_[i >> kRowsPerChunkLog2].get() + (i & (kRowsPerChunk - 1)) * width_;
  }
  const T* row(size_t i) const {
    return chunks_[i >> kRowsPerChunkLog2].get() + (i & (kRowsPerChunk - 1)) * width_;
  }

  // The first `rows` rows (REQUIRES: rows <= this->rows()), sharing their storage: O(rows /
  // 4096). The result must only be read; it keeps the chunks alive on its own.
  ChunkedRows SharedPrefix(size_t rows) const {
    ChunkedRows prefix(width_);
    prefix.rows_ = rows;
    const size_t chunks = (rows + kRowsPerChunk - 1) >> kRowsPerChunkLog2;
    prefix.chunks_.assign(chunks_.begin(), chunks_.begin() + chunks);
    return prefix;
  }
  // Chunk i's storage (rows [i * kRowsPerChunk, (i + 1) * kRowsPerChunk)), shared.
  // REQUIRES: i < number of chunks. Same read-only rule as SharedPrefix.
  std::shared_ptr<const T[]> SharedChunk(size_t i) const { return chunks_[i]; }
  // Drops every row and sets a new width.
  void Reset(size_t width) {
    chunks_.clear();
    rows_ = 0;
    width_ = width;
  }

 private:
  size_t width_;
  size_t rows_ = 0;
  std::vector<std::shared_ptr<T[]>> chunks_;
};

}  // namespace decision

#endif  // DECISION_CORE_CHUNKED_ROWS_H_
