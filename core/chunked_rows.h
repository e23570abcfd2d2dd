// Append-only storage of fixed-width rows in fixed-size chunks. Unlike std::vector, growing
// never copies what is stored (a vector doubling a multi-hundred-MB log stalls one append for
// tens of milliseconds), and a row never moves once appended.
//
// Thread safety: not thread-safe.
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

  size_t width() const { return width_; }
  size_t rows() const { return rows_; }

  // Appends a zero-initialised row and returns it.
  T* AppendRow() {
    if ((rows_ & (kRowsPerChunk - 1)) == 0) {
      // Not zeroed here: zeroing a whole chunk (about 1 MB for a 32-expert log) at once
      // stalled one append for ~0.6 ms; each row is zeroed as it is appended instead.
      chunks_.push_back(std::unique_ptr<T[]>(new T[kRowsPerChunk * width_ + (width_ == 0)]));
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

  // Drops every row and sets a new width.
  void Reset(size_t width) {
    chunks_.clear();
    rows_ = 0;
    width_ = width;
  }

 private:
  size_t width_;
  size_t rows_ = 0;
  std::vector<std::unique_ptr<T[]>> chunks_;
};

}  // namespace decision

#endif  // DECISION_CORE_CHUNKED_ROWS_H_
