#include "hora/core/collective_plan.h"

namespace hora {
namespace {

void LayOut(const std::vector<int64_t>& counts, std::vector<int64_t>* offsets, int64_t* total,
            bool* equal) {
  offsets->resize(counts.size());
  int64_t at = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    (*offsets)[k] = at;
    at += counts[k];
    if (counts[k] != counts[0]) *equal = false;
  }
  if (total != nullptr) *total = at;
}

}  // namespace

std::vector<int64_t> InBytes(const std::vector<int64_t>& elements, int64_t element_bytes) {
  std::vector<int64_t> bytes(elements.size());
  for (size_t k = 0; k < elements.size(); ++k) bytes[k] = elements[k] * element_bytes;
  return bytes;
}

DataType WireType(DataType dtype, bool on_gpu) {
  if (on_gpu) {
    // NCCL has no 16-bit integers: they travel as int32.
    const bool narrow_int = dtype == DataType::kInt16 || dtype == DataType::kUInt16;
    return narrow_int ? DataType::kInt32 : dtype;
  }
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ? DataType::kFloat32 : dtype;
}

CollectivePlan PlanCollective(const Response& r, const std::vector<int64_t>& input_shape, int rank,
                              int size) {
  CollectivePlan plan;
  plan.wire = WireType(r.dtype, r.on_gpu);
  const bool reduces =
      r.kind == CollectiveKind::kAllreduce || r.kind == CollectiveKind::kReducescatter;
  // Integers scaled by the user are scaled as Horovod scales them (in
  // double precision, truncated, the Average folded into the post factor);
  // an unscaled integer Average is an exact integer division.
  const bool scaled = r.prescale != 1.0 || r.postscale != 1.0;
  if (reduces && (IsFloatingPoint(r.dtype) || scaled)) {
    plan.prescale = r.prescale;
    plan.post_factor = r.postscale;
    if (r.op == ReduceOp::kAverage) plan.post_factor /= r.contributors;
  } else if (reduces && r.op == ReduceOp::kAverage) {
    plan.divisor = r.contributors;
  }
  for (size_t d = 1; d < input_shape.size(); ++d) plan.row_elements *= input_shape[d];
  plan.output_shape = input_shape;
  switch (r.kind) {
    case CollectiveKind::kAllgather: {
      plan.recv_counts.resize(size);
      int64_t rows = 0;
      for (int k = 0; k < size; ++k) {
        plan.recv_counts[k] = r.first_dims[k] * plan.row_elements;
        rows += r.first_dims[k];
      }
      LayOut(plan.recv_counts, &plan.recv_offsets, &plan.recv_total, &plan.equal_blocks);
      plan.output_shape[0] = rows;
      break;
    }
    case CollectiveKind::kAlltoall: {
      plan.send_counts.resize(size);
      plan.recv_counts.resize(size);
      plan.received_splits.resize(size);
      int64_t rows = 0;
      for (int k = 0; k < size; ++k) {
        plan.send_counts[k] = r.splits[rank * size + k] * plan.row_elements;
        plan.received_splits[k] = r.splits[k * size + rank];
        plan.recv_counts[k] = plan.received_splits[k] * plan.row_elements;
        rows += plan.received_splits[k];
      }
      bool unused = true;
      LayOut(plan.send_counts, &plan.send_offsets, nullptr, &unused);
      LayOut(plan.recv_counts, &plan.recv_offsets, &plan.recv_total, &unused);
      plan.equal_blocks = false;
      plan.output_shape[0] = rows;
      break;
    }
    case CollectiveKind::kReducescatter: {
      // The first rows % size ranks get one extra row, as in Horovod.
      const int64_t rows = input_shape[0];
      plan.recv_counts.resize(size);
      for (int k = 0; k < size; ++k) {
        plan.recv_counts[k] = (rows / size + (k < rows % size ? 1 : 0)) * plan.row_elements;
      }
      LayOut(plan.recv_counts, &plan.recv_offsets, &plan.recv_total, &plan.equal_blocks);
      plan.output_shape[0] = rows / size + (rank < rows % size ? 1 : 0);
      break;
    }
    default: break;
  }
  return plan;
}

}  // namespace hora
