// Communicator::Split, the base of process sets: members get a
// communicator of the set's ranks in order, the others nullptr; two
// disjoint sets run collectives side by side, and the allreduce router and
// Adasum work inside a set. Process-set validation and naming helpers too.
#include <gtest/gtest.h>

#include <vector>

#include "hora/algo/adasum.h"
#include "hora/algo/allreduce_router.h"
#include "hora/core/process_set.h"
#include "thread_ranks.h"

namespace hora {
namespace {

using testing::Failures;
using testing::RunRanks;

Status Expect(bool condition, const std::string& what) {
  return condition ? Status::OK() : Status::Internal(what);
}

TEST(ProcessSetSplit, MembersGetTheSetsRanksInOrder) {
  for (int size : {1, 2, 3, 5, 8}) {
    const auto results = RunRanks(size, 0, [size](Communicator& world) -> Status {
      std::vector<int> evens, odds;
      for (int r = 0; r < size; ++r) (r % 2 ? odds : evens).push_back(r);
      std::unique_ptr<Communicator> a, b;
      HORA_RETURN_IF_ERROR(world.Split(evens, &a));
      HORA_RETURN_IF_ERROR(world.Split(odds, &b));
      const bool even = world.rank() % 2 == 0;
      HORA_RETURN_IF_ERROR(Expect((a != nullptr) == even && (b != nullptr) == !even,
                                  "membership of the split communicators"));
      Communicator* mine = even ? a.get() : b.get();
      const std::vector<int>& ranks = even ? evens : odds;
      HORA_RETURN_IF_ERROR(Expect(mine->size() == static_cast<int>(ranks.size()), "set size"));
      HORA_RETURN_IF_ERROR(Expect(ranks[mine->rank()] == world.rank(), "set rank order"));
      // A sum of global ranks over the set, on each set at the same time.
      double value = world.rank();
      HORA_RETURN_IF_ERROR(mine->Allreduce(nullptr, &value, 1, DataType::kFloat64, ReduceOp::kSum));
      double want = 0;
      for (int r : ranks) want += r;
      HORA_RETURN_IF_ERROR(Expect(value == want, "allreduce inside the set"));
      return Status::OK();
    });
    EXPECT_EQ(Failures(results), "") << size << " ranks";
  }
}

TEST(ProcessSetSplit, RouterAndAdasumRunInsideASet) {
  const int size = 6;
  const std::vector<int> set = {1, 2, 4, 5};  // a power of two, not the world
  const auto results = RunRanks(size, 0, [&](Communicator& world) -> Status {
    std::unique_ptr<Communicator> sub;
    HORA_RETURN_IF_ERROR(world.Split(set, &sub));
    if (!sub) return Status::OK();
    for (AllreduceAlgorithm algorithm : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kMpi}) {
      AllreduceSettings settings;
      settings.algorithm = algorithm;
      std::unique_ptr<AllreduceRouter> router;
      HORA_RETURN_IF_ERROR(AllreduceRouter::Create(sub.get(), settings, &router));
      std::vector<float> data(1001, static_cast<float>(world.rank()));
      const Piece piece{data.data(), data.data(), static_cast<int64_t>(data.size())};
      HORA_RETURN_IF_ERROR(router->Run(&piece, 1, DataType::kFloat32, ReduceOp::kSum, 1.0, 1.0));
      for (float v : data) HORA_RETURN_IF_ERROR(Expect(v == 12.0f, "router sum in the set"));
    }
    // Orthogonal unit vectors, one per member: Adasum adds them up.
    std::vector<double> v(4, 0.0);
    v[sub->rank()] = 1.0;
    AdasumAllreduce adasum;
    const Piece piece{v.data(), v.data(), static_cast<int64_t>(v.size())};
    HORA_RETURN_IF_ERROR(adasum.Run(sub.get(), &piece, 1, DataType::kFloat64, 1.0, 1.0));
    for (double x : v) HORA_RETURN_IF_ERROR(Expect(x == 1.0, "adasum of orthogonal vectors"));
    return Status::OK();
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(ProcessSetRanks, InvalidRanksAreNamed) {
  EXPECT_EQ(InvalidProcessSetRanks({0, 2}, 3), "");
  EXPECT_EQ(InvalidProcessSetRanks({}, 3), "a process set needs at least one rank");
  EXPECT_EQ(InvalidProcessSetRanks({0, 3}, 3), "rank 3 is outside the job's ranks 0..2");
  EXPECT_EQ(InvalidProcessSetRanks({-1}, 3), "rank -1 is outside the job's ranks 0..2");
  EXPECT_EQ(InvalidProcessSetRanks({1, 0, 1}, 3), "rank 1 is listed more than once");
  EXPECT_EQ(DescribeProcessSet(2, {0, 1}), "process set 2 (ranks 0, 1)");
  EXPECT_EQ(DescribeProcessSet(3, {4}), "process set 3 (rank 4)");
}

}  // namespace
}  // namespace hora
