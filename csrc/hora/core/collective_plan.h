#pragma once
// Everything about the bytes of one negotiated collective, worked out once
// from its Response for both executors (host and GPU): the type that
// crosses the wire, the scale factors, and for the collectives whose sizes
// differ between ranks the per-rank counts, offsets and the output shape.
// The executors only move bytes according to it.
#include <cstdint>
#include <vector>

#include "hora/common/dtype.h"
#include "hora/core/message.h"

namespace hora {

struct CollectivePlan {
  // The type the transport moves: on the host, float16/bfloat16 are reduced
  // in float32; NCCL has no int16, so on a GPU it travels as int32.
  DataType wire = DataType::kFloat32;
  // Floating types: inputs are multiplied by `prescale`, results by
  // `post_factor` (the post-scale, divided by the contributors for
  // Average). Integer types: both are 1 and an Average divides the result
  // by `divisor` (truncating); otherwise `divisor` is 1.
  double prescale = 1.0;
  double post_factor = 1.0;
  int64_t divisor = 1;
  // Elements of one row (every dimension after the first).
  int64_t row_elements = 1;
  // Per rank, in elements: what this rank sends to each rank and receives
  // from each (allgather: receive only; reducescatter: each rank's share of
  // the result), with the offsets of those blocks, laid end to end.
  std::vector<int64_t> send_counts, send_offsets;
  std::vector<int64_t> recv_counts, recv_offsets;
  int64_t recv_total = 0;
  // Whether every rank's block has the same size (the transports have
  // cheaper calls for that case).
  bool equal_blocks = true;
  // Alltoall: rows this rank receives from each rank.
  std::vector<int64_t> received_splits;
  // The shape of the result the caller gets back.
  std::vector<int64_t> output_shape;

  bool scales() const { return post_factor != 1.0 || divisor != 1; }
};

// Counts or offsets in elements, as bytes of `element_bytes` each.
std::vector<int64_t> InBytes(const std::vector<int64_t>& elements, int64_t element_bytes);

// The wire type of `dtype` for a collective on the host or on a GPU.
DataType WireType(DataType dtype, bool on_gpu);

// `input_shape` is this rank's tensor shape (the agreed shape for a rank
// that has joined); `rank` and `size` are this rank's place in the job.
CollectivePlan PlanCollective(const Response& response, const std::vector<int64_t>& input_shape,
                              int rank, int size);

}  // namespace hora
