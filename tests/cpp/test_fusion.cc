// Where a fused batch ends: at the threshold, and at the first response
// that cannot share the buffer.
#include <gtest/gtest.h>

#include "hora/core/executor.h"

namespace hora {
namespace {

Response Allreduce(const std::string& name, int64_t elements, DataType dtype = DataType::kFloat32) {
  Response r;
  r.kind = CollectiveKind::kAllreduce;
  r.name = name;
  r.dtype = dtype;
  r.shape = {elements};
  r.contributors = 2;
  return r;
}

TEST(Fusion, StopsBeforeTheThresholdWouldBeExceeded) {
  const std::vector<Response> batch = {Allreduce("a", 10), Allreduce("b", 10), Allreduce("c", 10)};
  EXPECT_EQ(FusedBatchEnd(batch, 0, 80), 2u);   // 40 + 40 bytes fit, the third does not
  EXPECT_EQ(FusedBatchEnd(batch, 0, 120), 3u);  // exactly at the threshold
  EXPECT_EQ(FusedBatchEnd(batch, 1, 40), 2u);   // the head always runs
  EXPECT_EQ(FusedBatchEnd(batch, 0, 0), 1u);
}

TEST(Fusion, HalfTypesCountTheirWidenedBytes) {
  const std::vector<Response> batch = {Allreduce("a", 10, DataType::kFloat16),
                                       Allreduce("b", 10, DataType::kFloat16)};
  EXPECT_EQ(FusedBatchEnd(batch, 0, 79), 1u);  // 2 x 40 wire bytes on the host
  EXPECT_EQ(FusedBatchEnd(batch, 0, 80), 2u);
}

TEST(Fusion, OnlyCompatibleAllreducesJoin) {
  std::vector<Response> batch = {Allreduce("a", 1), Allreduce("b", 1)};
  batch[1].dtype = DataType::kFloat64;
  EXPECT_EQ(FusedBatchEnd(batch, 0, 1 << 20), 1u);
  batch[1] = Allreduce("b", 1);
  batch[1].op = ReduceOp::kMax;
  EXPECT_EQ(FusedBatchEnd(batch, 0, 1 << 20), 1u);
  batch[1] = Allreduce("b", 1);
  batch[1].postscale = 2.0;
  EXPECT_EQ(FusedBatchEnd(batch, 0, 1 << 20), 1u);
  batch[1] = Allreduce("b", 1);
  batch[1].contributors = 1;  // a rank joined between them
  EXPECT_EQ(FusedBatchEnd(batch, 0, 1 << 20), 1u);
  batch[1] = Allreduce("b", 1);
  batch[1].kind = CollectiveKind::kBroadcast;
  EXPECT_EQ(FusedBatchEnd(batch, 0, 1 << 20), 1u);
  batch[1] = Allreduce("b", 1);
  batch[1].error_code = StatusCode::kMismatch;
  EXPECT_EQ(FusedBatchEnd(batch, 0, 1 << 20), 1u);
  batch[1] = Allreduce("b", 1);
  batch[1].on_gpu = true;
  EXPECT_EQ(FusedBatchEnd(batch, 0, 1 << 20), 1u);
  batch[1] = Allreduce("b", 1);
  EXPECT_EQ(FusedBatchEnd(batch, 0, 1 << 20), 2u);
}

}  // namespace
}  // namespace hora
