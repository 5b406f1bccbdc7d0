// Which path a job takes when ranks of one host share a GPU, from the cards
// the ranks exchange: no GPU needed.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "hora/core/shared_gpu.h"

namespace hora {
namespace {

// A rank on host `host` holding GPU `gpu` (its UUID) of `visible` GPUs.
GpuCard Card(int rank, uint64_t host, int gpu, int visible) {
  GpuCard card{};
  std::memset(card.uuid, 0, sizeof(card.uuid));
  card.uuid[0] = static_cast<uint8_t>(gpu + 1);
  card.host = host;
  card.rank = rank;
  card.device = gpu;
  card.visible = visible;
  card.ok = 1;
  return card;
}

TEST(SharedGpu, EveryRankWithItsOwnGpuIsNotShared) {
  const std::vector<GpuCard> cards = {Card(0, 7, 0, 2), Card(1, 7, 1, 2)};
  const SharedGpuChoice choice = ChooseSharedGpu(cards, SharedGpuPolicy::kAuto);
  EXPECT_TRUE(choice.shared.empty());
  EXPECT_TRUE(choice.error.empty());
}

TEST(SharedGpu, TheSameGpuNameOnTwoHostsIsNotShared) {
  // Identical cards on different hosts (UUIDs are unique in practice, but
  // the host decides): two one-GPU hosts, one rank each.
  const std::vector<GpuCard> cards = {Card(0, 1, 0, 1), Card(1, 2, 0, 1)};
  EXPECT_TRUE(ChooseSharedGpu(cards, SharedGpuPolicy::kError).shared.empty());
}

TEST(SharedGpu, FewerGpusThanRanksStageByDefault) {
  const std::vector<GpuCard> cards = {Card(0, 7, 0, 1), Card(1, 7, 0, 1), Card(2, 7, 0, 1),
                                      Card(3, 7, 0, 1)};
  const SharedGpuChoice choice = ChooseSharedGpu(cards, SharedGpuPolicy::kAuto);
  EXPECT_TRUE(choice.stage);
  EXPECT_EQ(choice.shared,
            "ranks 0 and 1 on one host both use the same GPU (device 0 and device 0 of their "
            "processes)");
}

TEST(SharedGpu, EnoughGpusButOneSharedIsAMistakeByDefault) {
  // Eight GPUs, and ranks 2 and 5 both left on GPU 3: fail, naming them.
  std::vector<GpuCard> cards;
  for (int r = 0; r < 8; ++r) cards.push_back(Card(r, 7, r == 5 ? 3 : r, 8));
  const SharedGpuChoice choice = ChooseSharedGpu(cards, SharedGpuPolicy::kAuto);
  EXPECT_FALSE(choice.stage);
  EXPECT_NE(choice.error.find("ranks 3 and 5 on one host both use the same GPU"), std::string::npos)
      << choice.error;
  EXPECT_NE(choice.error.find("the host has 8 GPUs for its 8 ranks"), std::string::npos)
      << choice.error;
  EXPECT_NE(choice.error.find("HORA_SHARED_GPU=stage"), std::string::npos) << choice.error;
  // ... which stage overrides.
  EXPECT_TRUE(ChooseSharedGpu(cards, SharedGpuPolicy::kStage).stage);
}

TEST(SharedGpu, ErrorPolicyFailsEvenWithOneGpu) {
  const std::vector<GpuCard> cards = {Card(0, 7, 0, 1), Card(1, 7, 0, 1)};
  const SharedGpuChoice choice = ChooseSharedGpu(cards, SharedGpuPolicy::kError);
  EXPECT_FALSE(choice.stage);
  EXPECT_NE(choice.error.find("NCCL needs a GPU per rank, and the host has 1 GPU for its 2 ranks"),
            std::string::npos)
      << choice.error;
}

TEST(SharedGpu, OnlyTheSharingHostCountsItsRanks) {
  // Host 1: two ranks on its single GPU; host 2: four ranks on four GPUs.
  std::vector<GpuCard> cards = {Card(0, 1, 0, 1), Card(1, 1, 0, 1)};
  for (int r = 2; r < 6; ++r) cards.push_back(Card(r, 2, r - 2, 4));
  EXPECT_TRUE(ChooseSharedGpu(cards, SharedGpuPolicy::kAuto).stage);
}

}  // namespace
}  // namespace hora
