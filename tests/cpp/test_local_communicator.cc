// The in-process transport itself, so that a failure in the tests built on
// it points at the code under test rather than at the harness.
#include <gtest/gtest.h>

#include <numeric>

#include "thread_ranks.h"

namespace hora {
namespace {

using testing::Failures;
using testing::RunRanks;

TEST(LocalCommunicator, TopologyOfPretendHosts) {
  auto comms = LocalCommunicator::CreateWorld(6, 3);
  ASSERT_EQ(comms.size(), 6u);
  const Topology& t = comms[4]->topology();
  EXPECT_EQ(t.rank, 4);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 3);
  EXPECT_EQ(t.cross_rank, 1);
  EXPECT_EQ(t.cross_size, 2);
  EXPECT_TRUE(t.homogeneous);
  EXPECT_EQ(comms[4]->local()->rank(), 1);
  EXPECT_EQ(comms[4]->cross()->rank(), 1);
  EXPECT_EQ(comms[4]->cross()->size(), 2);
}

TEST(LocalCommunicator, CollectivesAtSeveralSizes) {
  for (int size : {1, 2, 3, 5}) {
    const std::vector<Status> results = RunRanks(size, 0, [&](Communicator& comm) {
      const int me = comm.rank();
      std::vector<int64_t> values(5, me + 1);
      HORA_RETURN_IF_ERROR(
          comm.Allreduce(nullptr, values.data(), 5, DataType::kInt64, ReduceOp::kSum));
      if (values[4] != size * (size + 1) / 2) return Status::Internal("allreduce sum");
      // Allgatherv: rank k sends k + 1 bytes of value k.
      std::string mine(me + 1, static_cast<char>(me));
      std::vector<int64_t> counts(size);
      std::iota(counts.begin(), counts.end(), 1);
      std::string all(std::accumulate(counts.begin(), counts.end(), int64_t{0}), '\0');
      HORA_RETURN_IF_ERROR(comm.Allgatherv(mine.data(), me + 1, &all[0], counts));
      int64_t at = 0;
      for (int k = 0; k < size; ++k) {
        for (int64_t i = 0; i < counts[k]; ++i) {
          if (all[at++] != static_cast<char>(k)) return Status::Internal("allgatherv");
        }
      }
      uint64_t bits = me == 0 ? 0b1010 : 0b1110;
      HORA_RETURN_IF_ERROR(comm.AllreduceBitAnd(&bits, 1));
      if (bits != 0b1010u) return Status::Internal("bit and");
      int32_t root_value = me == size - 1 ? 42 : 0;
      HORA_RETURN_IF_ERROR(comm.Broadcast(&root_value, sizeof(root_value), size - 1));
      if (root_value != 42) return Status::Internal("broadcast");
      return comm.Barrier();
    });
    EXPECT_EQ(Failures(results), "") << size << " ranks";
  }
}

TEST(LocalCommunicator, PointToPointKeepsOrderPerSourceAndTag) {
  const std::vector<Status> results = RunRanks(2, 0, [&](Communicator& comm) {
    int ids[2];
    int32_t got[2] = {0, 0};
    if (comm.rank() == 0) {
      const int32_t first = 1, second = 2;
      HORA_RETURN_IF_ERROR(comm.PostSend(&first, 4, 1, 7, &ids[0]));
      HORA_RETURN_IF_ERROR(comm.PostSend(&second, 4, 1, 7, &ids[1]));
      return comm.WaitAll();
    }
    HORA_RETURN_IF_ERROR(comm.PostRecv(&got[0], 4, 0, 7, &ids[0]));
    HORA_RETURN_IF_ERROR(comm.PostRecv(&got[1], 4, 0, 7, &ids[1]));
    HORA_RETURN_IF_ERROR(comm.Wait(ids[1]));  // completes the earlier one first
    return got[0] == 1 && got[1] == 2 ? Status::OK() : Status::Internal("order");
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(LocalCommunicator, AMissingPeerIsAnErrorNotAHang) {
  auto comms = LocalCommunicator::CreateWorld(2);
  // Only rank 1 takes part: its receive must give up.
  int32_t value = 0;
  int id = 0;
  ASSERT_TRUE(comms[1]->PostRecv(&value, 4, 0, 3, &id).ok());
  comms[1]->SetTimeout(std::chrono::milliseconds(50));
  const Status status = comms[1]->Wait(id);
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_NE(status.message().find("waited in vain for a message from rank 0"), std::string::npos);
}

}  // namespace
}  // namespace hora
