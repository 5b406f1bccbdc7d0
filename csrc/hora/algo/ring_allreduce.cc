#include "hora/algo/ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include "hora/algo/host_kernels.h"
#include "hora/algo/kernels/kernel_set.h"

namespace hora {
namespace {

constexpr int kReduceScatterTag = 0x4852;  // distinct from anything else on the comm
constexpr int kAllgatherTag = 0x4853;

}  // namespace

// Which block a rank sends and receives in each step of the pipeline, and
// how a block divides into pieces. Steps 0..n-2 are the reduce-scatter,
// n-1..2n-3 the allgather; send_block(t + 1) == recv_block(t) throughout.
// `me` is the rank's place on the ring: after the reduce-scatter steps it
// holds block me + 1 whole, and in the allgather it first sends that block.
class RingSchedule {
 public:
  // Blocks of `count` elements split as a reducescatter splits rows.
  RingSchedule(int n, int me, int64_t count, int64_t piece) : n_(n), me_(me), piece_(piece) {
    begins_.resize(n);
    counts_.resize(n);
    for (int b = 0; b < n; ++b) {
      begins_[b] = b * (count / n) + std::min<int64_t>(b, count % n);
      counts_[b] = count / n + (b < count % n ? 1 : 0);
    }
  }
  // Blocks of the given sizes, laid end to end.
  RingSchedule(int n, int me, const std::vector<int64_t>& counts, int64_t piece)
      : n_(n), me_(me), piece_(piece), counts_(counts) {
    begins_.resize(n);
    int64_t offset = 0;
    for (int b = 0; b < n; ++b) {
      begins_[b] = offset;
      offset += counts_[b];
    }
  }

  int steps() const { return 2 * (n_ - 1); }
  bool reducing(int t) const { return t < n_ - 1; }
  int tag(int t) const { return reducing(t) ? kReduceScatterTag : kAllgatherTag; }
  int send_block(int t) const { return reducing(t) ? Mod(me_ - t) : Mod(me_ + 1 - (t - (n_ - 1))); }
  int recv_block(int t) const { return reducing(t) ? Mod(me_ - t - 1) : Mod(me_ - (t - (n_ - 1))); }
  int64_t block_begin(int b) const { return begins_[b]; }
  int64_t block_count(int b) const { return counts_[b]; }
  int64_t largest_block() const { return *std::max_element(counts_.begin(), counts_.end()); }
  int pieces(int b) const { return static_cast<int>((block_count(b) + piece_ - 1) / piece_); }
  // Elements of piece p of block b, starting at p * piece within the block.
  int64_t piece_count(int b, int p) const {
    return std::min(piece_, block_count(b) - static_cast<int64_t>(p) * piece_);
  }

 private:
  int Mod(int x) const { return ((x % n_) + n_) % n_; }
  int n_, me_;
  int64_t piece_;
  std::vector<int64_t> begins_, counts_;
};

Status RingAllreduce::Run(Communicator* comm, const void* send, void* recv, int64_t count,
                          DataType dtype, ReduceOp op) {
  const int64_t element = DataTypeSize(dtype);
  if (send != nullptr && send != recv) std::memcpy(recv, send, count * element);
  const int n = comm->size();
  if (n == 1 || count == 0) return Status::OK();
  const RingSchedule ring(n, comm->rank(), count, std::max<int64_t>(1, piece_bytes_ / element));
  return RunSteps(comm, ring, 0, ring.steps(), static_cast<char*>(recv), dtype, op);
}

Status RingAllreduce::ReduceScatter(Communicator* comm, void* buffer,
                                    const std::vector<int64_t>& counts, DataType dtype,
                                    ReduceOp op) {
  const int n = comm->size();
  if (n == 1) return Status::OK();
  // Placed one back on the ring, a rank ends the reduce-scatter with its
  // own block whole.
  const int64_t element = DataTypeSize(dtype);
  const RingSchedule ring(n, (comm->rank() + n - 1) % n, counts,
                          std::max<int64_t>(1, piece_bytes_ / element));
  return RunSteps(comm, ring, 0, n - 1, static_cast<char*>(buffer), dtype, op);
}

Status RingAllreduce::Allgather(Communicator* comm, void* buffer,
                                const std::vector<int64_t>& block_bytes) {
  const int n = comm->size();
  if (n == 1) return Status::OK();
  // One back on the ring (as in ReduceScatter), a rank's first allgather
  // step sends its own block.
  const RingSchedule ring(n, (comm->rank() + n - 1) % n, block_bytes, piece_bytes_);
  return RunSteps(comm, ring, n - 1, ring.steps(), static_cast<char*>(buffer), DataType::kUInt8,
                  ReduceOp::kSum);
}

Status RingAllreduce::RunSteps(Communicator* comm, const RingSchedule& ring, int first, int end,
                               char* buffer, DataType dtype, ReduceOp op) {
  const int n = comm->size();
  const int64_t element = DataTypeSize(dtype);
  const int right = (comm->rank() + 1) % n, left = (comm->rank() + n - 1) % n;
  const int64_t piece = std::max<int64_t>(1, piece_bytes_ / element);
  if (first < n - 1) {
    const int64_t largest = ring.largest_block();
    if (static_cast<int64_t>(scratch_.size()) < largest * element) {
      scratch_.resize(static_cast<size_t>(largest * element));
    }
  }
  const KernelSet& k = Kernels();
  auto at = [&](int block, int p) {
    return buffer + (ring.block_begin(block) + static_cast<int64_t>(p) * piece) * element;
  };
  // A reduce-scatter piece lands in the scratch piece of the same index,
  // free again once the previous step's piece there has been reduced; an
  // allgather piece lands in the buffer, in the block this rank sent in the
  // reduce-scatter step of the same index (when it ran one), whose send
  // must be over first.
  std::vector<std::vector<int>> reduce_sends(n - 1);
  auto post_recv = [&](int t, int p, std::vector<int>* ids) -> Status {
    const int block = ring.recv_block(t);
    const int64_t bytes = ring.piece_count(block, p) * element;
    char* target;
    if (ring.reducing(t)) {
      target = scratch_.data() + static_cast<int64_t>(p) * piece * element;
    } else {
      const int earlier = t - (n - 1);  // reduce-scatter step that sent this block
      if (first <= earlier) HORA_RETURN_IF_ERROR(comm->Wait(reduce_sends[earlier][p]));
      target = at(block, p);
    }
    int id = 0;
    HORA_RETURN_IF_ERROR(comm->PostRecv(target, bytes, left, ring.tag(t), &id));
    ids->push_back(id);
    return Status::OK();
  };
  auto post_send = [&](int t, int p) -> Status {
    const int block = ring.send_block(t);
    int id = 0;
    HORA_RETURN_IF_ERROR(comm->PostSend(at(block, p), ring.piece_count(block, p) * element, right,
                                        ring.tag(t), &id));
    if (ring.reducing(t)) reduce_sends[t].push_back(id);
    return Status::OK();
  };

  // Every rank posts its receives and sends in the order (step, piece), so
  // the messages of one tag from the left neighbour match in order.
  std::vector<int> arrivals, next_arrivals;
  for (int p = 0; p < ring.pieces(ring.recv_block(first)); ++p) {
    HORA_RETURN_IF_ERROR(post_recv(first, p, &arrivals));
  }
  for (int p = 0; p < ring.pieces(ring.send_block(first)); ++p) {
    HORA_RETURN_IF_ERROR(post_send(first, p));
  }
  for (int t = first; t < end; ++t) {
    const int block = ring.recv_block(t);
    const bool last = t + 1 == end;
    const int next_pieces = last ? 0 : ring.pieces(ring.recv_block(t + 1));
    next_arrivals.clear();
    for (int p = 0; p < ring.pieces(block); ++p) {
      HORA_RETURN_IF_ERROR(comm->Wait(arrivals[p]));
      if (ring.reducing(t)) {
        const char* arrived = scratch_.data() + static_cast<int64_t>(p) * piece * element;
        if (IsHalf(dtype)) {
          ReduceHalf(at(block, p), arrived, ring.piece_count(block, p), dtype, op);
        } else {
          k.reduce_into(at(block, p), arrived, ring.piece_count(block, p), dtype, op);
        }
      }
      if (last) continue;
      HORA_RETURN_IF_ERROR(post_send(t + 1, p));
      if (p < next_pieces) HORA_RETURN_IF_ERROR(post_recv(t + 1, p, &next_arrivals));
    }
    // The next block may have more pieces than this one (by one when the
    // blocks are a reducescatter's split, by any number in an allgather).
    for (int p = static_cast<int>(next_arrivals.size()); p < next_pieces; ++p) {
      HORA_RETURN_IF_ERROR(post_recv(t + 1, p, &next_arrivals));
    }
    arrivals.swap(next_arrivals);
  }
  return comm->WaitAll();
}

void RingAllreduce::ReduceHalf(void* acc, const void* other, int64_t count, DataType dtype,
                               ReduceOp op) {
  const KernelSet& k = Kernels();
  if (static_cast<int64_t>(half_acc_.size()) < count) {
    half_acc_.resize(static_cast<size_t>(count));
    half_other_.resize(static_cast<size_t>(count));
  }
  k.widen(acc, half_acc_.data(), count, dtype, 1.0);
  k.widen(other, half_other_.data(), count, dtype, 1.0);
  k.reduce_into(half_acc_.data(), half_other_.data(), count, DataType::kFloat32, op);
  k.narrow(half_acc_.data(), acc, count, dtype, 1.0);
}

}  // namespace hora
