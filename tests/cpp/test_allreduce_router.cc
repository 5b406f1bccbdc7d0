// Every allreduce path (MPI's own stand-in, ring, shared memory,
// hierarchical) at 1-8 thread-ranks, with counts that do not divide evenly,
// several pieces, staging (half types, pre-scaling) and scaling on the way
// out, against the sum or maximum computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "hora/algo/allreduce_router.h"
#include "hora/common/half.h"
#include "thread_ranks.h"

namespace hora {
namespace {

using testing::Failures;
using testing::RunRanks;

struct Case {
  AllreduceAlgorithm algorithm;
  int size;
  int ranks_per_host;
};

std::string Name(const Case& c) {
  return std::string(AllreduceAlgorithmName(c.algorithm)) + "_" + std::to_string(c.size) +
         "ranks_" + std::to_string(c.ranks_per_host) + "perhost";
}

// float16 storage with the conversions the checks need.
struct F16 {
  uint16_t bits = 0;
  F16() = default;
  explicit F16(double value) : bits(FloatToHalf(static_cast<float>(value))) {}
  explicit operator double() const { return HalfToFloat(bits); }
};

// Small integers, so every order of summation gives the same floats.
double Input(int rank, int64_t i) { return static_cast<double>((rank + 1) * ((i % 7) + 1)); }

double Expected(int size, int64_t i, ReduceOp op) {
  double result = op == ReduceOp::kMax ? Input(0, i) : 0.0;
  for (int r = 0; r < size; ++r) {
    result = op == ReduceOp::kMax ? std::max(result, Input(r, i)) : result + Input(r, i);
  }
  return result;
}

template <typename T>
std::vector<T> Filled(int rank, int64_t count) {
  std::vector<T> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<T>(Input(rank, i));
  return v;
}

class RouterTest : public ::testing::TestWithParam<Case> {
 protected:
  // Runs one allreduce of `counts` (one piece each) of T on every rank and
  // checks every element on every rank.
  template <typename T>
  void Check(DataType dtype, const std::vector<int64_t>& counts, ReduceOp op, double prescale,
             double factor, bool in_place) {
    const Case c = GetParam();
    AllreduceSettings settings;
    settings.algorithm = c.algorithm;
    settings.small_allreduce_bytes = 256;  // auto takes every path on small inputs
    settings.shm_slot_bytes = 4096;        // several pipeline rounds per call
    const std::vector<Status> results = RunRanks(c.size, c.ranks_per_host, [&](Communicator& comm) {
      std::unique_ptr<AllreduceRouter> router;
      HORA_RETURN_IF_ERROR(AllreduceRouter::Create(&comm, settings, &router));
      std::vector<std::vector<T>> inputs, outputs;
      std::vector<Piece> pieces;
      for (int64_t count : counts) {
        inputs.push_back(Filled<T>(comm.rank(), count));
        outputs.emplace_back(count);
      }
      for (size_t k = 0; k < counts.size(); ++k) {
        void* out = in_place ? inputs[k].data() : outputs[k].data();
        pieces.push_back(Piece{inputs[k].data(), out, counts[k]});
      }
      HORA_RETURN_IF_ERROR(router->Run(pieces.data(), pieces.size(), dtype, op, prescale, factor));
      const bool floating = IsFloatingPoint(dtype);
      for (size_t k = 0; k < counts.size(); ++k) {
        const T* got = static_cast<const T*>(pieces[k].out);
        for (int64_t i = 0; i < counts[k]; ++i) {
          // Each piece is reduced element by element, so its own index counts.
          double want = Expected(comm.size(), i, op);
          if (floating) {
            want *= prescale * factor;
          } else if (factor != 1.0) {
            want = std::trunc(want * factor);  // in double, toward zero, as Horovod
          }
          if (static_cast<double>(got[i]) != want) {
            return Status::Internal("piece " + std::to_string(k) + " element " + std::to_string(i) +
                                    ": got " + std::to_string(static_cast<double>(got[i])) +
                                    ", want " + std::to_string(want));
          }
        }
      }
      return Status::OK();
    });
    EXPECT_EQ(Failures(results), "");
  }
};

TEST_P(RouterTest, OneLargeFloatPiece) {
  Check<float>(DataType::kFloat32, {70001}, ReduceOp::kSum, 1.0, 1.0, true);
}

TEST_P(RouterTest, SeveralPiecesOutOfPlaceScaled) {
  Check<float>(DataType::kFloat32, {1, 7, 1000, 3333}, ReduceOp::kSum, 1.0, 0.5, false);
}

TEST_P(RouterTest, PrescaledLoneTensor) {
  Check<double>(DataType::kFloat64, {4099}, ReduceOp::kSum, 2.0, 0.25, false);
}

TEST_P(RouterTest, PrescaledPiecesAreStaged) {
  Check<double>(DataType::kFloat64, {5, 2048, 3}, ReduceOp::kSum, 0.5, 2.0, true);
}

TEST_P(RouterTest, Integers) {
  Check<int32_t>(DataType::kInt32, {13, 5000}, ReduceOp::kSum, 1.0, 1.0, false);
}

TEST_P(RouterTest, IntegersPostScaledTruncate) {
  Check<int32_t>(DataType::kInt32, {13, 5000}, ReduceOp::kSum, 1.0, 0.3, false);
}

TEST_P(RouterTest, UInt16Pieces) {
  Check<uint16_t>(DataType::kUInt16, {3, 700}, ReduceOp::kSum, 1.0, 1.0, false);
}

TEST_P(RouterTest, MaxOfInt64) {
  Check<int64_t>(DataType::kInt64, {777}, ReduceOp::kMax, 1.0, 1.0, true);
}

TEST_P(RouterTest, HalfTypesReduceInFloat32) {
  Check<F16>(DataType::kFloat16, {3, 1001}, ReduceOp::kSum, 1.0, 0.5, false);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, RouterTest,
    ::testing::Values(Case{AllreduceAlgorithm::kMpi, 1, 1}, Case{AllreduceAlgorithm::kMpi, 3, 3},
                      Case{AllreduceAlgorithm::kRing, 2, 2}, Case{AllreduceAlgorithm::kRing, 3, 3},
                      Case{AllreduceAlgorithm::kRing, 5, 5}, Case{AllreduceAlgorithm::kRing, 8, 8},
                      Case{AllreduceAlgorithm::kShm, 1, 1}, Case{AllreduceAlgorithm::kShm, 2, 2},
                      Case{AllreduceAlgorithm::kShm, 3, 3}, Case{AllreduceAlgorithm::kShm, 7, 7},
                      Case{AllreduceAlgorithm::kShm, 8, 8},
                      Case{AllreduceAlgorithm::kHierarchical, 4, 2},
                      Case{AllreduceAlgorithm::kHierarchical, 6, 3},
                      Case{AllreduceAlgorithm::kHierarchical, 6, 2},
                      Case{AllreduceAlgorithm::kHierarchical, 8, 4},
                      Case{AllreduceAlgorithm::kAuto, 1, 1}, Case{AllreduceAlgorithm::kAuto, 3, 3},
                      Case{AllreduceAlgorithm::kAuto, 4, 2}, Case{AllreduceAlgorithm::kAuto, 6, 1}),
    [](const ::testing::TestParamInfo<Case>& info) { return Name(info.param); });

TEST(RouterChoice, AutoPicksByPlacementAndSize) {
  AllreduceSettings settings;
  settings.small_allreduce_bytes = 1024;
  const std::vector<Status> results = RunRanks(4, 2, [&](Communicator& comm) {
    std::unique_ptr<AllreduceRouter> router;
    HORA_RETURN_IF_ERROR(AllreduceRouter::Create(&comm, settings, &router));
    if (router->Choose(1024) != AllreducePath::kMpi) return Status::Internal("small is not mpi");
    if (router->Choose(1025) != AllreducePath::kHierarchical) {
      return Status::Internal("large on two hosts is not hierarchical");
    }
    router->SetHierarchical(false);
    if (router->Choose(1025) != AllreducePath::kRing) {
      return Status::Internal("hierarchical turned off does not give the ring");
    }
    return Status::OK();
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(RouterChoice, ShmAcrossHostsIsRefusedWithTheReason) {
  AllreduceSettings settings;
  settings.algorithm = AllreduceAlgorithm::kShm;
  const std::vector<Status> results = RunRanks(4, 2, [&](Communicator& comm) {
    std::unique_ptr<AllreduceRouter> router;
    return AllreduceRouter::Create(&comm, settings, &router);
  });
  for (const Status& status : results) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("needs every rank on one host (this job spans 2 hosts"),
              std::string::npos)
        << status.message();
  }
}

}  // namespace
}  // namespace hora
