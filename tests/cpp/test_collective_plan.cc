// The byte arithmetic both executors share: wire types, scale factors,
// per-rank counts and offsets, output shapes.
#include <gtest/gtest.h>

#include "hora/core/collective_plan.h"

namespace hora {
namespace {

Response Make(CollectiveKind kind, DataType dtype, std::vector<int64_t> shape) {
  Response r;
  r.kind = kind;
  r.dtype = dtype;
  r.shape = std::move(shape);
  r.contributors = 4;
  return r;
}

TEST(CollectivePlan, WireTypeWidensHalvesOnHostAndInt16OnGpu) {
  EXPECT_EQ(WireType(DataType::kFloat16, false), DataType::kFloat32);
  EXPECT_EQ(WireType(DataType::kBFloat16, false), DataType::kFloat32);
  EXPECT_EQ(WireType(DataType::kInt16, false), DataType::kInt16);
  EXPECT_EQ(WireType(DataType::kFloat16, true), DataType::kFloat16);
  EXPECT_EQ(WireType(DataType::kInt16, true), DataType::kInt32);
}

TEST(CollectivePlan, AverageDividesFloatsByContributorsAndIntegersSeparately) {
  Response r = Make(CollectiveKind::kAllreduce, DataType::kFloat32, {10});
  r.op = ReduceOp::kAverage;
  r.prescale = 0.5;
  r.postscale = 3.0;
  r.contributors = 3;  // a rank has joined
  CollectivePlan plan = PlanCollective(r, r.shape, 0, 4);
  EXPECT_DOUBLE_EQ(plan.prescale, 0.5);
  EXPECT_DOUBLE_EQ(plan.post_factor, 1.0);
  EXPECT_EQ(plan.divisor, 1);

  r.dtype = DataType::kInt64;
  r.prescale = r.postscale = 1.0;
  plan = PlanCollective(r, r.shape, 0, 4);
  EXPECT_DOUBLE_EQ(plan.post_factor, 1.0);
  EXPECT_EQ(plan.divisor, 3);
  EXPECT_TRUE(plan.scales());

  r.op = ReduceOp::kSum;
  plan = PlanCollective(r, r.shape, 0, 4);
  EXPECT_EQ(plan.divisor, 1);
  EXPECT_FALSE(plan.scales());
}

TEST(CollectivePlan, ScaledIntegersFoldTheAverageIntoThePostFactor) {
  Response r = Make(CollectiveKind::kAllreduce, DataType::kInt32, {10});
  r.op = ReduceOp::kAverage;
  r.prescale = 2.0;
  r.postscale = 3.0;
  r.contributors = 4;
  const CollectivePlan plan = PlanCollective(r, r.shape, 0, 4);
  EXPECT_DOUBLE_EQ(plan.prescale, 2.0);
  EXPECT_DOUBLE_EQ(plan.post_factor, 0.75);
  EXPECT_EQ(plan.divisor, 1);
}

TEST(CollectivePlan, AllgatherWithRaggedFirstDimensions) {
  Response r = Make(CollectiveKind::kAllgather, DataType::kFloat32, {2, 3, 5});
  r.first_dims = {2, 0, 7};
  const CollectivePlan plan = PlanCollective(r, {0, 3, 5}, 1, 3);
  EXPECT_EQ(plan.row_elements, 15);
  EXPECT_EQ(plan.recv_counts, (std::vector<int64_t>{30, 0, 105}));
  EXPECT_EQ(plan.recv_offsets, (std::vector<int64_t>{0, 30, 30}));
  EXPECT_EQ(plan.recv_total, 135);
  EXPECT_FALSE(plan.equal_blocks);
  EXPECT_EQ(plan.output_shape, (std::vector<int64_t>{9, 3, 5}));
}

TEST(CollectivePlan, AlltoallReadsItsRowAndColumnOfTheSplitMatrix) {
  Response r = Make(CollectiveKind::kAlltoall, DataType::kInt32, {6, 2});
  // Row = sender: rank 0 sends 1,2,3 rows; rank 1 sends 4,0,2; rank 2 sends 0,5,1.
  r.splits = {1, 2, 3, 4, 0, 2, 0, 5, 1};
  const CollectivePlan plan = PlanCollective(r, {6, 2}, 1, 3);
  EXPECT_EQ(plan.send_counts, (std::vector<int64_t>{8, 0, 4}));
  EXPECT_EQ(plan.send_offsets, (std::vector<int64_t>{0, 8, 8}));
  EXPECT_EQ(plan.received_splits, (std::vector<int64_t>{2, 0, 5}));
  EXPECT_EQ(plan.recv_counts, (std::vector<int64_t>{4, 0, 10}));
  EXPECT_EQ(plan.recv_offsets, (std::vector<int64_t>{0, 4, 4}));
  EXPECT_EQ(plan.recv_total, 14);
  EXPECT_EQ(plan.output_shape, (std::vector<int64_t>{7, 2}));
}

TEST(CollectivePlan, ReducescatterGivesTheFirstRanksTheExtraRows) {
  Response r = Make(CollectiveKind::kReducescatter, DataType::kFloat16, {7, 4});
  r.op = ReduceOp::kAverage;
  for (int rank = 0; rank < 3; ++rank) {
    const CollectivePlan plan = PlanCollective(r, {7, 4}, rank, 3);
    EXPECT_EQ(plan.wire, DataType::kFloat32);
    EXPECT_EQ(plan.recv_counts, (std::vector<int64_t>{12, 8, 8}));
    EXPECT_EQ(plan.recv_offsets, (std::vector<int64_t>{0, 12, 20}));
    EXPECT_FALSE(plan.equal_blocks);
    EXPECT_EQ(plan.output_shape[0], rank == 0 ? 3 : 2);
    EXPECT_DOUBLE_EQ(plan.post_factor, 0.25);
  }
  const CollectivePlan even = PlanCollective(r, {6, 4}, 0, 3);
  EXPECT_TRUE(even.equal_blocks);
}

}  // namespace
}  // namespace hora
