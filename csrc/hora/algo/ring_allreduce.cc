#include "hora/algo/ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include "hora/algo/kernels/kernel_set.h"

namespace hora {
namespace {

constexpr int kReduceScatterTag = 0x4852;  // distinct from anything else on the comm
constexpr int kAllgatherTag = 0x4853;

}  // namespace

Status RingAllreduce::Run(Communicator* comm, const void* send, void* recv, int64_t count,
                          DataType dtype, ReduceOp op) {
  const int n = comm->size();
  const int me = comm->rank();
  const int64_t element = DataTypeSize(dtype);
  char* buffer = static_cast<char*>(recv);
  if (send != nullptr && send != recv) std::memcpy(buffer, send, count * element);
  if (n == 1 || count == 0) return Status::OK();

  const int right = (me + 1) % n, left = (me + n - 1) % n;
  auto block_begin = [&](int b) { return b * (count / n) + std::min<int64_t>(b, count % n); };
  auto block_count = [&](int b) { return count / n + (b < count % n ? 1 : 0); };
  const int64_t piece = std::max<int64_t>(1, piece_bytes_ / element);
  const int64_t largest = block_count(0);
  if (static_cast<int64_t>(scratch_.size()) < largest * element) {
    scratch_.resize(static_cast<size_t>(largest * element));
  }
  const KernelSet& k = Kernels();

  // Reduce-scatter: after step s, block (me - s - 1) holds s + 2 ranks' data;
  // after n - 1 steps rank me owns the finished block (me + 1) % n.
  for (int step = 0; step < n - 1; ++step) {
    const int send_block = (me - step + n) % n;
    const int recv_block = (me - step - 1 + 2 * n) % n;
    const int64_t send_count = block_count(send_block), recv_count = block_count(recv_block);
    std::vector<int> arrivals;
    for (int64_t at = 0; at < recv_count; at += piece) {
      int id = 0;
      HORA_RETURN_IF_ERROR(comm->PostRecv(scratch_.data() + at * element,
                                          std::min(piece, recv_count - at) * element, left,
                                          kReduceScatterTag, &id));
      arrivals.push_back(id);
    }
    for (int64_t at = 0; at < send_count; at += piece) {
      int id = 0;
      HORA_RETURN_IF_ERROR(comm->PostSend(buffer + (block_begin(send_block) + at) * element,
                                          std::min(piece, send_count - at) * element, right,
                                          kReduceScatterTag, &id));
    }
    char* target = buffer + block_begin(recv_block) * element;
    for (size_t p = 0; p < arrivals.size(); ++p) {
      HORA_RETURN_IF_ERROR(comm->Wait(arrivals[p]));
      const int64_t at = static_cast<int64_t>(p) * piece;
      k.reduce_into(target + at * element, scratch_.data() + at * element,
                    std::min(piece, recv_count - at), dtype, op);
    }
    HORA_RETURN_IF_ERROR(comm->WaitAll());
  }

  // Allgather: pass the finished blocks around the ring.
  for (int step = 0; step < n - 1; ++step) {
    const int send_block = (me + 1 - step + n) % n;
    const int recv_block = (me - step + n) % n;
    int id = 0;
    for (int64_t at = 0; at < block_count(recv_block); at += piece) {
      HORA_RETURN_IF_ERROR(comm->PostRecv(buffer + (block_begin(recv_block) + at) * element,
                                          std::min(piece, block_count(recv_block) - at) * element,
                                          left, kAllgatherTag, &id));
    }
    for (int64_t at = 0; at < block_count(send_block); at += piece) {
      HORA_RETURN_IF_ERROR(comm->PostSend(buffer + (block_begin(send_block) + at) * element,
                                          std::min(piece, block_count(send_block) - at) * element,
                                          right, kAllgatherTag, &id));
    }
    HORA_RETURN_IF_ERROR(comm->WaitAll());
  }
  return Status::OK();
}

}  // namespace hora
