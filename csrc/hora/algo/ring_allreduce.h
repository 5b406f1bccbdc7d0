#pragma once
// Bandwidth-optimal allreduce over the communicator's point-to-point
// operations: a reduce-scatter around the ring (n-1 steps, each rank
// sending one n-th of the buffer to its right neighbour and reducing the
// n-th arriving from its left) followed by an allgather around the ring.
// Every rank sends and receives 2(n-1)/n of the buffer, the minimum.
//
// Each step's block travels as several pieces that are all posted at once,
// and a piece is reduced as soon as it arrives, so the reduction of one
// piece overlaps the transfer of the next.
#include <cstdint>
#include <vector>

#include "hora/comm/communicator.h"

namespace hora {

class RingAllreduce {
 public:
  explicit RingAllreduce(int64_t piece_bytes = 512 * 1024) : piece_bytes_(piece_bytes) {}

  // `send == nullptr` means in place on `recv`. Half types are not accepted.
  Status Run(Communicator* comm, const void* send, void* recv, int64_t count, DataType dtype,
             ReduceOp op);

 private:
  int64_t piece_bytes_;
  std::vector<char> scratch_;
};

}  // namespace hora
