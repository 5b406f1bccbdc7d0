// The pipelined ring on its own, with pieces of a few elements so that
// every step passes on many pieces, blocks of unequal size (and so unequal
// piece counts), blocks with no elements at all, and repeated calls on one
// instance (its scratch space reused).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "hora/algo/ring_allreduce.h"
#include "thread_ranks.h"

namespace hora {
namespace {

using testing::Failures;
using testing::RunRanks;

struct RingCase {
  int size;
  int64_t piece_bytes;
};

class RingTest : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingTest, SumsEveryElementOnEveryRank) {
  const RingCase c = GetParam();
  const std::vector<int64_t> counts = {1, 2, 5, 7, 64, 129, 1001, 4099};
  const std::vector<Status> results = RunRanks(c.size, c.size, [&](Communicator& comm) {
    RingAllreduce ring(c.piece_bytes);
    for (int repeat = 0; repeat < 2; ++repeat) {
      for (int64_t count : counts) {
        std::vector<double> in(count), out(count, -1.0);
        for (int64_t i = 0; i < count; ++i) in[i] = (comm.rank() + 1) * ((i % 11) + 1) + repeat;
        const bool in_place = (count + repeat) % 2 == 0;
        HORA_RETURN_IF_ERROR(ring.Run(&comm, in_place ? nullptr : in.data(),
                                      in_place ? in.data() : out.data(), count, DataType::kFloat64,
                                      ReduceOp::kSum));
        const std::vector<double>& got = in_place ? in : out;
        const int n = comm.size();
        for (int64_t i = 0; i < count; ++i) {
          const double want = static_cast<double>(n * (n + 1) / 2 * ((i % 11) + 1) + n * repeat);
          if (got[i] != want) {
            return Status::Internal("count " + std::to_string(count) + " element " +
                                    std::to_string(i) + ": got " + std::to_string(got[i]) +
                                    ", want " + std::to_string(want));
          }
        }
      }
    }
    return Status::OK();
  });
  EXPECT_EQ(Failures(results), "");
}

TEST_P(RingTest, MaxOfIntegers) {
  const RingCase c = GetParam();
  const std::vector<Status> results = RunRanks(c.size, c.size, [&](Communicator& comm) {
    RingAllreduce ring(c.piece_bytes);
    std::vector<int32_t> values(333);
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<int32_t>((i * 7 + comm.rank() * 13) % 50);
    }
    HORA_RETURN_IF_ERROR(ring.Run(&comm, nullptr, values.data(),
                                  static_cast<int64_t>(values.size()), DataType::kInt32,
                                  ReduceOp::kMax));
    for (size_t i = 0; i < values.size(); ++i) {
      int32_t want = 0;
      for (int r = 0; r < comm.size(); ++r) {
        want = std::max(want, static_cast<int32_t>((i * 7 + r * 13) % 50));
      }
      if (values[i] != want) {
        return Status::Internal("element " + std::to_string(i) + ": got " +
                                std::to_string(values[i]) + ", want " + std::to_string(want));
      }
    }
    return Status::OK();
  });
  EXPECT_EQ(Failures(results), "");
}

// The reduce-scatter half leaves each rank its block of the sum (here a
// reducescatter's split: count / n elements, the first count % n ranks
// one more).
TEST_P(RingTest, ReduceScatterLeavesEachRankItsBlock) {
  const RingCase c = GetParam();
  const std::vector<int64_t> counts = {1, 2, 5, 7, 64, 129, 1001, 4099};
  const std::vector<Status> results = RunRanks(c.size, c.size, [&](Communicator& comm) {
    RingAllreduce ring(c.piece_bytes);
    const int n = comm.size(), me = comm.rank();
    for (int repeat = 0; repeat < 2; ++repeat) {
      for (int64_t count : counts) {
        std::vector<float> buffer(count);
        for (int64_t i = 0; i < count; ++i) buffer[i] = (me + 1) * ((i % 13) + 1) + repeat;
        std::vector<int64_t> blocks(n);
        for (int r = 0; r < n; ++r) blocks[r] = count / n + (r < count % n ? 1 : 0);
        HORA_RETURN_IF_ERROR(
            ring.ReduceScatter(&comm, buffer.data(), blocks, DataType::kFloat32, ReduceOp::kSum));
        const int64_t begin = me * (count / n) + std::min<int64_t>(me, count % n);
        const int64_t end = begin + blocks[me];
        for (int64_t i = begin; i < end; ++i) {
          const float want = static_cast<float>(n * (n + 1) / 2 * ((i % 13) + 1) + n * repeat);
          if (buffer[i] != want) {
            return Status::Internal("count " + std::to_string(count) + " element " +
                                    std::to_string(i) + ": got " + std::to_string(buffer[i]) +
                                    ", want " + std::to_string(want));
          }
        }
      }
    }
    return Status::OK();
  });
  EXPECT_EQ(Failures(results), "");
}

// The allgather half fills in every rank's block, whatever their sizes
// (empty ones too, and blocks of many pieces next to blocks of none).
TEST_P(RingTest, AllgatherFillsEveryBlock) {
  const RingCase c = GetParam();
  const std::vector<Status> results = RunRanks(c.size, c.size, [&](Communicator& comm) {
    RingAllreduce ring(c.piece_bytes);
    const int n = comm.size(), me = comm.rank();
    for (int pattern = 0; pattern < 3; ++pattern) {
      std::vector<int64_t> bytes(n);
      for (int r = 0; r < n; ++r) {
        bytes[r] = pattern == 0 ? 37 : pattern == 1 ? (r % 2 ? 0 : 300 + 41 * r) : 5 * r;
      }
      int64_t total = 0, mine = 0;
      for (int r = 0; r < n; ++r) {
        if (r == me) mine = total;
        total += bytes[r];
      }
      std::vector<uint8_t> buffer(total, 0);
      for (int64_t i = 0; i < bytes[me]; ++i) buffer[mine + i] = static_cast<uint8_t>(me * 31 + i);
      HORA_RETURN_IF_ERROR(ring.Allgather(&comm, buffer.data(), bytes));
      int64_t offset = 0;
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < bytes[r]; ++i) {
          if (buffer[offset + i] != static_cast<uint8_t>(r * 31 + i)) {
            return Status::Internal("pattern " + std::to_string(pattern) + ": block of rank " +
                                    std::to_string(r) + " byte " + std::to_string(i) + " wrong");
          }
        }
        offset += bytes[r];
      }
    }
    return Status::OK();
  });
  EXPECT_EQ(Failures(results), "");
}

INSTANTIATE_TEST_SUITE_P(Sizes, RingTest,
                         ::testing::Values(RingCase{2, 8}, RingCase{2, 24}, RingCase{3, 8},
                                           RingCase{3, 40}, RingCase{4, 16}, RingCase{5, 8},
                                           RingCase{7, 24}, RingCase{2, 512 * 1024}),
                         [](const ::testing::TestParamInfo<RingCase>& info) {
                           return std::to_string(info.param.size) + "ranks_" +
                                  std::to_string(info.param.piece_bytes) + "bytepieces";
                         });

}  // namespace
}  // namespace hora
