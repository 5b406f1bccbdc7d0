#include "hora/algo/ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include "hora/algo/kernels/kernel_set.h"

namespace hora {
namespace {

constexpr int kReduceScatterTag = 0x4852;  // distinct from anything else on the comm
constexpr int kAllgatherTag = 0x4853;

// Which block a rank sends and receives in each step of the pipeline, and
// how a block divides into pieces. Steps 0..n-2 are the reduce-scatter,
// n-1..2n-3 the allgather; send_block(t + 1) == recv_block(t) throughout.
class RingSchedule {
 public:
  RingSchedule(int n, int me, int64_t count, int64_t piece)
      : n_(n), me_(me), count_(count), piece_(piece) {}

  int steps() const { return 2 * (n_ - 1); }
  bool reducing(int t) const { return t < n_ - 1; }
  int tag(int t) const { return reducing(t) ? kReduceScatterTag : kAllgatherTag; }
  int send_block(int t) const { return reducing(t) ? Mod(me_ - t) : Mod(me_ + 1 - (t - (n_ - 1))); }
  int recv_block(int t) const { return reducing(t) ? Mod(me_ - t - 1) : Mod(me_ - (t - (n_ - 1))); }
  int64_t block_begin(int b) const { return b * (count_ / n_) + std::min<int64_t>(b, count_ % n_); }
  int64_t block_count(int b) const { return count_ / n_ + (b < count_ % n_ ? 1 : 0); }
  int pieces(int b) const { return static_cast<int>((block_count(b) + piece_ - 1) / piece_); }
  // Elements of piece p of block b, starting at p * piece within the block.
  int64_t piece_count(int b, int p) const {
    return std::min(piece_, block_count(b) - static_cast<int64_t>(p) * piece_);
  }

 private:
  int Mod(int x) const { return ((x % n_) + n_) % n_; }
  int n_, me_;
  int64_t count_, piece_;
};

}  // namespace

Status RingAllreduce::Run(Communicator* comm, const void* send, void* recv, int64_t count,
                          DataType dtype, ReduceOp op) {
  const int n = comm->size();
  const int64_t element = DataTypeSize(dtype);
  char* buffer = static_cast<char*>(recv);
  if (send != nullptr && send != recv) std::memcpy(buffer, send, count * element);
  if (n == 1 || count == 0) return Status::OK();

  const int right = (comm->rank() + 1) % n, left = (comm->rank() + n - 1) % n;
  const int64_t piece = std::max<int64_t>(1, piece_bytes_ / element);
  const RingSchedule ring(n, comm->rank(), count, piece);
  const int64_t largest = ring.block_count(0);
  if (static_cast<int64_t>(scratch_.size()) < largest * element) {
    scratch_.resize(static_cast<size_t>(largest * element));
  }
  const KernelSet& k = Kernels();
  auto at = [&](int block, int p) {
    return buffer + (ring.block_begin(block) + static_cast<int64_t>(p) * piece) * element;
  };
  // A reduce-scatter piece lands in the scratch piece of the same index,
  // free again once the previous step's piece there has been reduced; an
  // allgather piece lands in the buffer, in the block this rank sent in the
  // reduce-scatter step of the same index, whose send must be over first.
  std::vector<std::vector<int>> reduce_sends(n - 1);
  auto post_recv = [&](int t, int p, std::vector<int>* ids) -> Status {
    const int block = ring.recv_block(t);
    const int64_t bytes = ring.piece_count(block, p) * element;
    char* target;
    if (ring.reducing(t)) {
      target = scratch_.data() + static_cast<int64_t>(p) * piece * element;
    } else {
      const int earlier = t - (n - 1);  // reduce-scatter step that sent this block
      HORA_RETURN_IF_ERROR(comm->Wait(reduce_sends[earlier][p]));
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
  for (int p = 0; p < ring.pieces(ring.recv_block(0)); ++p) {
    HORA_RETURN_IF_ERROR(post_recv(0, p, &arrivals));
  }
  for (int p = 0; p < ring.pieces(ring.send_block(0)); ++p) HORA_RETURN_IF_ERROR(post_send(0, p));
  for (int t = 0; t < ring.steps(); ++t) {
    const int block = ring.recv_block(t);
    const bool last = t + 1 == ring.steps();
    const int next_pieces = last ? 0 : ring.pieces(ring.recv_block(t + 1));
    next_arrivals.clear();
    for (int p = 0; p < ring.pieces(block); ++p) {
      HORA_RETURN_IF_ERROR(comm->Wait(arrivals[p]));
      if (ring.reducing(t)) {
        k.reduce_into(at(block, p), scratch_.data() + static_cast<int64_t>(p) * piece * element,
                      ring.piece_count(block, p), dtype, op);
      }
      if (last) continue;
      HORA_RETURN_IF_ERROR(post_send(t + 1, p));
      if (p < next_pieces) HORA_RETURN_IF_ERROR(post_recv(t + 1, p, &next_arrivals));
    }
    // Blocks differ by one element at most, so the next step may have one
    // piece more than this one.
    for (int p = static_cast<int>(next_arrivals.size()); p < next_pieces; ++p) {
      HORA_RETURN_IF_ERROR(post_recv(t + 1, p, &next_arrivals));
    }
    arrivals.swap(next_arrivals);
  }
  return comm->WaitAll();
}

}  // namespace hora
