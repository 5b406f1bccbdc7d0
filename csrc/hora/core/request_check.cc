#include "hora/core/request_check.h"

#include "hora/algo/adasum.h"

namespace hora {
namespace {

Status Invalid(const Request& r, const std::string& message) {
  return Status::InvalidArgument(DescribeRequest(r) + ": " + message);
}

std::string Where(int device) {
  return device < 0 ? std::string("host memory") : "GPU " + std::to_string(device);
}

}  // namespace

std::string DescribeRequest(const Request& r) {
  return std::string(CollectiveKindName(r.kind)) + " '" + r.name + "'";
}

Status CheckRequest(const Request& r, const TensorView& in, const TensorView* out, int size) {
  // Messages are built only on error: this runs on every submission.
  if (r.name.empty()) {
    return Status::InvalidArgument(std::string(CollectiveKindName(r.kind)) +
                                   ": name must not be empty");
  }
  if (out != nullptr) {
    if (out->device != in.device) {
      return Invalid(
          r, "the output is in " + Where(out->device) + " but the input is in " + Where(in.device));
    }
    if (r.kind == CollectiveKind::kAllgather) {
      // the gathered rows of every rank: its size is checked once the
      // other ranks' rows are known
      if (out->dtype != in.dtype) {
        return Invalid(r, std::string("output has ") + DataTypeName(out->dtype) +
                              " but input has " + DataTypeName(in.dtype));
      }
      if (in.device >= 0) {
        return Invalid(r, "an allgather into a given output runs on host memory only");
      }
    } else if (out->dtype != in.dtype || out->shape != in.shape) {
      return Invalid(r, std::string("output has ") + DataTypeName(out->dtype) + " " +
                            ShapeString(out->shape) + " but input has " + DataTypeName(in.dtype) +
                            " " + ShapeString(in.shape));
    }
  }
  const bool reduces =
      r.kind == CollectiveKind::kAllreduce || r.kind == CollectiveKind::kReducescatter;
  if (reduces) {
    if (static_cast<int>(r.op) >= kNumReduceOps) {
      return Invalid(r, "unknown reduce op " + std::to_string(static_cast<int>(r.op)));
    }
    if (r.op == ReduceOp::kAdasum) {
      if (r.kind != CollectiveKind::kAllreduce) {
        return Invalid(r, "op=Adasum is an allreduce; use Sum or Average here");
      }
      if (!IsFloatingPoint(in.dtype)) {
        return Invalid(r, std::string("op=Adasum reduces float16, bfloat16, float32 and float64 "
                                      "tensors, got ") +
                              DataTypeName(in.dtype));
      }
      if (!IsPowerOfTwo(size)) {
        return Invalid(r, "op=Adasum needs a number of ranks that is a power of two, got " +
                              std::to_string(size) + " ranks");
      }
      if (in.device >= 0) {
        return Invalid(r, "op=Adasum runs on host memory; copy the tensor from " +
                              Where(in.device) + " to the CPU first");
      }
    }
    if (in.dtype == DataType::kBool && r.op == ReduceOp::kAverage) {
      return Invalid(r,
                     "op=Average is not defined for bool tensors; use Sum (logical or), "
                     "Min or Product (logical and)");
    }
    if (in.dtype == DataType::kBool && (r.prescale != 1.0 || r.postscale != 1.0)) {
      return Invalid(r, "prescale_factor/postscale_factor cannot scale a bool tensor");
    }
  }
  if (r.kind == CollectiveKind::kBroadcast && (r.root < 0 || r.root >= size)) {
    return Invalid(r, "root_rank " + std::to_string(r.root) + " is out of range for " +
                          std::to_string(size) + " ranks");
  }
  const bool needs_rows = r.kind == CollectiveKind::kAllgather ||
                          r.kind == CollectiveKind::kAlltoall ||
                          r.kind == CollectiveKind::kReducescatter;
  if (needs_rows && in.shape.empty()) {
    return Invalid(r, "needs a tensor with at least one dimension, got a scalar");
  }
  if (r.kind == CollectiveKind::kAlltoall) {
    if (static_cast<int>(r.splits.size()) != size) {
      return Invalid(r, "splits has " + std::to_string(r.splits.size()) +
                            " entries but there are " + std::to_string(size) + " ranks");
    }
    int64_t total = 0;
    for (int64_t s : r.splits) {
      if (s < 0) return Invalid(r, "splits must not be negative, got " + ShapeString(r.splits));
      total += s;
    }
    // As in Horovod, rows past the splits' sum are not sent.
    if (total > in.shape[0]) {
      // Horovod's words first: code matches on them
      return Invalid(r,
                     "Sum of splits entries is greater than the first dimension of tensor "
                     "(splits " +
                         ShapeString(r.splits) + " sum to " + std::to_string(total) +
                         ", the first dimension is " + std::to_string(in.shape[0]) + ")");
    }
  }
  return Status::OK();
}

Status EqualSplits(const Request& r, const TensorView& in, int size, std::vector<int64_t>* splits) {
  if (in.shape.empty() || in.shape[0] % size != 0) {
    // Horovod's words first: code matches on them
    return Invalid(r,
                   "splits not provided, but first dimension of tensor is not an even multiple "
                   "of the number of workers (first dimension " +
                       (in.shape.empty() ? std::string("(scalar)") : std::to_string(in.shape[0])) +
                       ", " + std::to_string(size) +
                       " ranks); pass splits to say how many rows go to each rank");
  }
  splits->assign(size, in.shape[0] / size);
  return Status::OK();
}

}  // namespace hora
