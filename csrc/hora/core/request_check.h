#pragma once
// The rules a submission must satisfy before it reaches the engine, checked
// on the caller's thread so that a bad call fails at once, on the rank that
// made it, with the tensor named. (What needs the other ranks, such as a
// shape that differs between them, is the coordinator's to find.)
#include "hora/common/status.h"
#include "hora/core/message.h"
#include "hora/core/tensor.h"

namespace hora {

// "allreduce 'w1'": how errors name a request.
std::string DescribeRequest(const Request& request);

// `output` is the caller's output tensor (nullptr: in place, or a result
// the core allocates); `size` the number of ranks.
Status CheckRequest(const Request& request, const TensorView& input, const TensorView* output,
                    int size);

// Alltoall without splits: the first dimension shared out equally, or an
// error when it does not divide by the number of ranks.
Status EqualSplits(const Request& request, const TensorView& input, int size,
                   std::vector<int64_t>* splits);

}  // namespace hora
