// Rank 0's decisions: a collective is ready once every rank has it, and a
// disagreement becomes an error naming the tensor, the ranks and every value.
#include <gtest/gtest.h>

#include "hora/core/coordinator.h"
#include "hora/core/stall_inspector.h"

namespace hora {
namespace {

Request From(int rank, const std::string& name, std::vector<int64_t> shape,
             CollectiveKind kind = CollectiveKind::kAllreduce) {
  Request r;
  r.rank = rank;
  r.name = name;
  r.kind = kind;
  r.shape = std::move(shape);
  return r;
}

TEST(Coordinator, ReadyOnlyOnceEveryRankHasSubmitted) {
  Coordinator coordinator(3);
  const std::vector<bool> joined(3, false);
  coordinator.Add(From(0, "w", {4}));
  coordinator.Add(From(2, "w", {4}));
  EXPECT_TRUE(coordinator.TakeReady(joined).empty());
  coordinator.Add(From(1, "w", {4}));
  const std::vector<Response> ready = coordinator.TakeReady(joined);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_FALSE(ready[0].is_error());
  EXPECT_EQ(ready[0].contributors, 3);
  EXPECT_FALSE(coordinator.HasPending());
}

TEST(Coordinator, ResponsesComeOutInArrivalOrder) {
  Coordinator coordinator(2);
  const std::vector<bool> joined(2, false);
  for (const char* name : {"c", "a", "b"}) coordinator.Add(From(1, name, {1}));
  for (const char* name : {"b", "a", "c"}) coordinator.Add(From(0, name, {1}));
  const std::vector<Response> ready = coordinator.TakeReady(joined);
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_EQ(ready[0].name, "c");
  EXPECT_EQ(ready[1].name, "a");
  EXPECT_EQ(ready[2].name, "b");
}

TEST(Coordinator, ShapeMismatchNamesTensorRanksAndBothShapes) {
  Coordinator coordinator(3);
  coordinator.Add(From(0, "grad", {2, 3}));
  coordinator.Add(From(1, "grad", {2, 3}));
  coordinator.Add(From(2, "grad", {4}));
  const std::vector<Response> ready = coordinator.TakeReady(std::vector<bool>(3, false));
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].error_code, StatusCode::kMismatch);
  EXPECT_EQ(ready[0].error,
            "Mismatched shape for allreduce 'grad': ranks 0, 1 sent [2, 3]; rank 2 sent [4]");
}

// Member layouts (ndim, dims...) of a packed allreduce.
Request Packed(int rank, std::vector<int64_t> members, int64_t total) {
  Request r = From(rank, "g.0", {total});
  r.members = std::move(members);
  return r;
}

TEST(Coordinator, PackedMismatchNamesTheMemberAndEveryShape) {
  Coordinator coordinator(3);
  // members [4], [2, 3], [] (a scalar) on ranks 0 and 2; rank 1 swaps the
  // second's dimensions, which leaves the total the same
  coordinator.Add(Packed(0, {1, 4, 2, 2, 3, 0}, 11));
  coordinator.Add(Packed(1, {1, 4, 2, 3, 2, 0}, 11));
  coordinator.Add(Packed(2, {1, 4, 2, 2, 3, 0}, 11));
  const std::vector<Response> ready = coordinator.TakeReady(std::vector<bool>(3, false));
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].error_code, StatusCode::kMismatch);
  EXPECT_EQ(ready[0].error,
            "Mismatched shape of member 1 (of 3 tensors packed together) for allreduce 'g.0': "
            "ranks 0, 2 sent [2, 3]; rank 1 sent [3, 2]");
}

TEST(Coordinator, PackedMemberCountsMustAgree) {
  Coordinator coordinator(2);
  coordinator.Add(Packed(0, {1, 4}, 4));
  coordinator.Add(Packed(1, {1, 2, 1, 2}, 4));
  const std::vector<Response> ready = coordinator.TakeReady(std::vector<bool>(2, false));
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].error,
            "Mismatched number of tensors packed in allreduce 'g.0': rank 0 sent 1; rank 1 sent 2");
}

TEST(Coordinator, AgreeingPackedMembersRunAsOneAllreduce) {
  Coordinator coordinator(2);
  coordinator.Add(Packed(0, {1, 4, 0}, 5));
  coordinator.Add(Packed(1, {1, 4, 0}, 5));
  const std::vector<Response> ready = coordinator.TakeReady(std::vector<bool>(2, false));
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_FALSE(ready[0].is_error());
  EXPECT_EQ(ready[0].shape, std::vector<int64_t>({5}));
}

TEST(Coordinator, TheFirstDisagreementIsReported) {
  Coordinator coordinator(2);
  Request a = From(0, "x", {3});
  Request b = From(1, "x", {5});
  b.dtype = DataType::kFloat64;  // dtype is checked before shape
  coordinator.Add(a);
  coordinator.Add(b);
  const std::vector<Response> ready = coordinator.TakeReady(std::vector<bool>(2, false));
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].error,
            "Mismatched data type for allreduce 'x': rank 0 sent float32; rank 1 sent float64");
}

TEST(Coordinator, OpRootAndScaleMismatches) {
  {
    Coordinator coordinator(2);
    Request a = From(0, "x", {3}), b = From(1, "x", {3});
    b.op = ReduceOp::kMax;
    coordinator.Add(a);
    coordinator.Add(b);
    EXPECT_EQ(coordinator.TakeReady({false, false})[0].error,
              "Mismatched reduce op for allreduce 'x': rank 0 sent Sum; rank 1 sent Max");
  }
  {
    Coordinator coordinator(2);
    Request a = From(0, "p", {3}, CollectiveKind::kBroadcast);
    Request b = From(1, "p", {3}, CollectiveKind::kBroadcast);
    b.root = 1;
    coordinator.Add(a);
    coordinator.Add(b);
    EXPECT_EQ(coordinator.TakeReady({false, false})[0].error,
              "Mismatched root rank for broadcast 'p': rank 0 sent 0; rank 1 sent 1");
  }
  {
    Coordinator coordinator(2);
    Request a = From(0, "x", {3}), b = From(1, "x", {3});
    a.prescale = 0.5;
    coordinator.Add(a);
    coordinator.Add(b);
    EXPECT_EQ(coordinator.TakeReady({false, false})[0].error,
              "Mismatched prescale factor for allreduce 'x': rank 0 sent 0.5; rank 1 sent 1");
  }
}

TEST(Coordinator, AllgatherComparesOnlyTheDimensionsAfterTheFirst) {
  Coordinator coordinator(2);
  coordinator.Add(From(0, "g", {2, 5}, CollectiveKind::kAllgather));
  coordinator.Add(From(1, "g", {7, 5}, CollectiveKind::kAllgather));
  std::vector<Response> ready = coordinator.TakeReady({false, false});
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_FALSE(ready[0].is_error()) << ready[0].error;
  EXPECT_EQ(ready[0].first_dims, (std::vector<int64_t>{2, 7}));

  coordinator.Add(From(0, "h", {2, 5}, CollectiveKind::kAllgather));
  coordinator.Add(From(1, "h", {2, 6}, CollectiveKind::kAllgather));
  ready = coordinator.TakeReady({false, false});
  EXPECT_EQ(ready[0].error,
            "Mismatched shape (all dimensions after the first) for allgather 'h': rank 0 sent "
            "2-d [5]; rank 1 sent 2-d [6]");
}

TEST(Coordinator, JoinedRanksContributeToAllreduceOnly) {
  Coordinator coordinator(3);
  const std::vector<bool> joined = {false, true, false};
  coordinator.Add(From(0, "w", {4}));
  coordinator.Add(From(2, "w", {4}));
  std::vector<Response> ready = coordinator.TakeReady(joined);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_FALSE(ready[0].is_error());
  EXPECT_EQ(ready[0].contributors, 3);  // an Average divides by size(), as in Horovod

  coordinator.Add(From(0, "g", {4}, CollectiveKind::kAllgather));
  coordinator.Add(From(2, "g", {4}, CollectiveKind::kAllgather));
  ready = coordinator.TakeReady(joined);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].error,
            "allgather 'g' cannot run while rank 1 has called join(); only allreduce accepts "
            "joined ranks");
}

TEST(Coordinator, AverageOverContributorsIsAnOptIn) {
  Coordinator coordinator(3, /*average_over_contributors=*/true);
  coordinator.Add(From(0, "w", {4}));
  coordinator.Add(From(2, "w", {4}));
  const std::vector<Response> ready = coordinator.TakeReady({false, true, false});
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].contributors, 2);
}

TEST(Coordinator, StalledNamesTheMissingRanks) {
  Coordinator coordinator(4);
  coordinator.Add(From(0, "slow", {1}));
  coordinator.Add(From(2, "slow", {1}));
  const auto stalls = coordinator.Stalled(Coordinator::Clock::now() + std::chrono::seconds(61),
                                          std::chrono::seconds(60), std::vector<bool>(4, false));
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].name, "slow");
  EXPECT_EQ(stalls[0].have, (std::vector<int>{0, 2}));
  EXPECT_EQ(stalls[0].missing, (std::vector<int>{1, 3}));
}

Request NoteFrom(int rank, const std::string& name, RequestNote note) {
  Request r;
  r.rank = rank;
  r.name = name;
  r.note = note;
  return r;
}

TEST(Coordinator, AWaitForARankThatRefusedTheNameFailsAfterTheCheckTime) {
  Coordinator coordinator(3);
  const std::vector<bool> joined(3, false);
  coordinator.Note(NoteFrom(2, "w", RequestNote::kRefusedAgain));
  coordinator.Add(From(0, "w", {4}));
  coordinator.Add(From(1, "w", {4}));
  coordinator.Add(From(0, "other", {1}));  // waits on rank 1 and 2, who refused nothing
  const auto now = Coordinator::Clock::now();
  EXPECT_TRUE(
      coordinator.TakeRefusedAgain(now, std::chrono::seconds(60), joined, "SETTING").empty())
      << "not before the check time";
  const std::vector<Response> failed = coordinator.TakeRefusedAgain(
      now + std::chrono::seconds(61), std::chrono::seconds(60), joined, "SETTING");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].name, "w");
  EXPECT_EQ(failed[0].error_code, StatusCode::kInvalidArgument);
  EXPECT_NE(failed[0].error.find("allreduce 'w' cannot complete: rank 2 refused a call of this "
                                 "name while its earlier call was still in flight there"),
            std::string::npos)
      << failed[0].error;
  EXPECT_NE(failed[0].error.find("ranks 0, 1 waited 61."), std::string::npos) << failed[0].error;
  EXPECT_NE(failed[0].error.find("(SETTING)"), std::string::npos) << failed[0].error;
  // "other" still waits; "w" is gone, and its next call starts afresh
  const auto stalls =
      coordinator.Stalled(now + std::chrono::seconds(61), std::chrono::seconds(60), joined);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].name, "other");
  coordinator.Add(From(0, "w", {4}));
  EXPECT_TRUE(coordinator
                  .TakeRefusedAgain(now + std::chrono::hours(1), std::chrono::seconds(60), joined,
                                    "SETTING")
                  .empty());
}

TEST(Coordinator, ARankThatCalledTheNameAgainIsWaitedForAsUsual) {
  Coordinator coordinator(2);
  const std::vector<bool> joined(2, false);
  coordinator.Note(NoteFrom(1, "w", RequestNote::kRefusedAgain));
  coordinator.Note(NoteFrom(1, "w", RequestNote::kCalledAgain));
  coordinator.Add(From(0, "w", {4}));
  EXPECT_TRUE(coordinator
                  .TakeRefusedAgain(Coordinator::Clock::now() + std::chrono::hours(1),
                                    std::chrono::seconds(60), joined, "SETTING")
                  .empty());
  // the refusing rank is not the missing one: its own call waits for the others
  Coordinator other(2);
  other.Note(NoteFrom(1, "v", RequestNote::kRefusedAgain));
  other.Add(From(1, "v", {4}));
  EXPECT_TRUE(other
                  .TakeRefusedAgain(Coordinator::Clock::now() + std::chrono::hours(1),
                                    std::chrono::seconds(60), joined, "SETTING")
                  .empty());
}

TEST(Coordinator, AFailedGroupMemberTakesItsWholeGroup) {
  Coordinator coordinator(2);
  const std::vector<bool> joined(2, false);
  coordinator.Note(NoteFrom(1, "g.1", RequestNote::kRefusedAgain));
  for (const char* name : {"g.0", "g.1"}) {
    Request r = From(0, name, {2});
    r.group = "g";
    r.group_size = 2;
    coordinator.Add(r);
  }
  const std::vector<Response> failed =
      coordinator.TakeRefusedAgain(Coordinator::Clock::now() + std::chrono::seconds(2),
                                   std::chrono::seconds(1), joined, "SETTING");
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_EQ(failed[0].name, "g.1");
  EXPECT_EQ(failed[1].name, "g.0");
  EXPECT_EQ(failed[0].error, failed[1].error);
  EXPECT_FALSE(coordinator.HasPending());
}

TEST(Coordinator, TheShorterStallTimeDecidesWhenARefusalFailsTheWait) {
  Config config;
  config.stall_check = true;
  config.stall_warning_seconds = 60;
  config.stall_shutdown_seconds = 2;
  StallInspector stalls(config);
  Coordinator coordinator(2);
  const std::vector<bool> joined(2, false);
  coordinator.Note(NoteFrom(1, "w", RequestNote::kRefusedAgain));
  coordinator.Add(From(0, "w", {4}));
  const auto later = Coordinator::Clock::now() + std::chrono::seconds(3);
  const std::vector<Response> failed = stalls.FailRefusedAgain(later, &coordinator, joined);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].error.find("(HORA_STALL_SHUTDOWN_TIME_SECONDS)"), std::string::npos)
      << failed[0].error;
  // taken off the table first, the wait no longer stops the job
  EXPECT_TRUE(stalls.Check(later, coordinator, joined).ok());

  config.stall_shutdown_seconds = 0;  // warnings only: after the check time
  StallInspector warning_only(config);
  coordinator.Note(NoteFrom(1, "w", RequestNote::kRefusedAgain));
  coordinator.Add(From(0, "w", {4}));
  EXPECT_TRUE(warning_only.FailRefusedAgain(later, &coordinator, joined).empty());
  const auto much_later = Coordinator::Clock::now() + std::chrono::seconds(61);
  EXPECT_EQ(warning_only.FailRefusedAgain(much_later, &coordinator, joined).size(), 1u);
}

}  // namespace
}  // namespace hora
