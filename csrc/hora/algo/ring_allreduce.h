#pragma once
// Bandwidth-optimal allreduce over the communicator's point-to-point
// operations: a reduce-scatter around the ring (n-1 steps, each rank
// sending one n-th of the buffer to its right neighbour and reducing the
// n-th arriving from its left) followed by an allgather around the ring.
// Every rank sends and receives 2(n-1)/n of the buffer, the minimum.
//
// The blocks travel as pieces, and the 2(n-1) steps run as one pipeline:
// the block a rank sends in step t+1 is the one it received (and, in the
// reduce-scatter, reduced) in step t, so each piece is passed on as soon
// as it is ready instead of after the whole step. The link therefore never
// drains between steps: with a step-by-step ring each step boundary left
// it idle for a round trip and a queue's worth of data, which on a shaped
// 1 Gb/s link cost 10-20% of a 16 MiB allreduce. Pieces of 1 MiB kept that
// link 1-2% busier than pieces of 256 or 512 KiB (fewer messages, each
// with its own rendezvous).
#include <cstdint>
#include <vector>

#include "hora/comm/communicator.h"

namespace hora {

class RingSchedule;

class RingAllreduce {
 public:
  explicit RingAllreduce(int64_t piece_bytes = 1 << 20) : piece_bytes_(piece_bytes) {}

  // `send == nullptr` means in place on `recv`. Half types (float16,
  // bfloat16) travel as they are: each arriving piece is widened to
  // float32, reduced and narrowed again, so every hop rounds once (as
  // Horovod's MPI float16 sum and NCCL do) and the link carries 2 bytes per
  // element instead of 4.
  Status Run(Communicator* comm, const void* send, void* recv, int64_t count, DataType dtype,
             ReduceOp op);
  // The reduce-scatter half alone, in place: `buffer` holds the ranks'
  // blocks of `counts[r]` elements end to end; afterwards this rank's block
  // holds the reduction over ranks (the others partial sums).
  Status ReduceScatter(Communicator* comm, void* buffer, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp op);
  // The allgather half alone, in place: `buffer` holds the ranks' blocks of
  // `block_bytes[r]` bytes end to end, this rank's filled in; afterwards
  // every block is.
  Status Allgather(Communicator* comm, void* buffer, const std::vector<int64_t>& block_bytes);

 private:
  Status RunSteps(Communicator* comm, const RingSchedule& ring, int first, int end, char* buffer,
                  DataType dtype, ReduceOp op);
  // acc (op)= other for float16/bfloat16, computed in float32.
  void ReduceHalf(void* acc, const void* other, int64_t count, DataType dtype, ReduceOp op);

  int64_t piece_bytes_;
  std::vector<char> scratch_;
  std::vector<float> half_acc_, half_other_;
};

}  // namespace hora
