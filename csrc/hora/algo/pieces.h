#pragma once
// A logical buffer made of callers' tensors laid end to end. The shared-
// memory allreduce reads and writes the tensors through this map instead of
// packing them into a fusion buffer, so fused tensors are touched once on
// the way in and once on the way out.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace hora {

struct Piece {
  const void* in;  // may equal out (in place)
  void* out;
  int64_t count;  // elements
};

class PieceMap {
 public:
  PieceMap(const Piece* pieces, size_t n, int64_t element_bytes)
      : pieces_(pieces), n_(n), element_(element_bytes), starts_(n + 1, 0) {
    for (size_t i = 0; i < n; ++i) starts_[i + 1] = starts_[i] + pieces[i].count;
  }

  int64_t total() const { return starts_[n_]; }

  // Calls fn(in, out, count, offset_in_range) for each run of the logical
  // elements [begin, begin + count), where in/out point at the tensor bytes.
  template <typename Fn>
  void ForEach(int64_t begin, int64_t count, Fn&& fn) const {
    if (count <= 0) return;
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) -
                                   starts_.begin() - 1);
    int64_t done = 0;
    while (done < count && i < n_) {
      const int64_t at = begin + done - starts_[i];
      const int64_t n = std::min(pieces_[i].count - at, count - done);
      if (n > 0) {
        fn(static_cast<const char*>(pieces_[i].in) + at * element_,
           static_cast<char*>(pieces_[i].out) + at * element_, n, done);
        done += n;
      }
      ++i;
    }
  }

 private:
  const Piece* pieces_;
  size_t n_;
  int64_t element_;
  std::vector<int64_t> starts_;
};

}  // namespace hora
