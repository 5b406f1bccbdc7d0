// The watch on running collectives: one that runs past the warning time is
// named once, with what it is; one that ends in time never is; and the
// heartbeat thread logs the warning, so a collective stuck in the transport
// is named even though every process still beats.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hora/comm/wakeup/heartbeat.h"
#include "hora/common/collective_watch.h"
#include "thread_ranks.h"

namespace hora {
namespace {

using Clock = CollectiveWatch::Clock;
using Ms = std::chrono::milliseconds;

TEST(CollectiveWatch, ACollectiveRunningTooLongIsNamedOnce) {
  CollectiveWatch watch;
  const std::string name = "grad.fc1.weight";
  watch.Begin("allreduce", &name, 3, 5 << 20);
  const Clock::time_point later = Clock::now() + std::chrono::seconds(61);
  const std::vector<std::string> found = CollectiveWatch::Overdue(later, std::chrono::seconds(60));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NE(found[0].find("allreduce 'grad.fc1.weight' (fused with 3 more) of 5.0 MiB has been "
                          "running on this rank for 61"),
            std::string::npos)
      << found[0];
  EXPECT_TRUE(CollectiveWatch::Overdue(later, std::chrono::seconds(60)).empty());
  watch.End();
}

TEST(CollectiveWatch, OnlyWhatRunsPastTheTimeAndHasNotEndedIsNamed) {
  CollectiveWatch first, second;
  const std::string a = "a", b = "b";
  first.Begin("broadcast", &a, 0, 100);
  second.Begin("allgather", &b, 0, 100);
  second.End();
  EXPECT_TRUE(CollectiveWatch::Overdue(Clock::now(), std::chrono::seconds(60)).empty());
  const std::vector<std::string> found =
      CollectiveWatch::Overdue(Clock::now() + std::chrono::seconds(90), std::chrono::seconds(60));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rfind("broadcast 'a' of 100 bytes has been running", 0), 0u) << found[0];
  first.End();
  // A new collective on the same executor may be named again.
  first.Begin("broadcast", &a, 0, 100);
  EXPECT_EQ(
      CollectiveWatch::Overdue(Clock::now() + std::chrono::seconds(90), std::chrono::seconds(60))
          .size(),
      1u);
  first.End();
}

TEST(CollectiveWatch, AnAbandonedEnginesCollectiveIsNeverNamed) {
  CollectiveWatch kept, live;
  const std::string stuck = "stuck", other = "other";
  kept.Begin("allreduce", &stuck, 0, 100);
  kept.Abandon();  // its engine was given up after a rank was lost
  live.Begin("allreduce", &other, 0, 100);
  const std::vector<std::string> found =
      CollectiveWatch::Overdue(Clock::now() + std::chrono::seconds(90), std::chrono::seconds(60));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rfind("allreduce 'other'", 0), 0u) << found[0];
  live.End();
  kept.End();
}

TEST(CollectiveWatch, TheHeartbeatThreadNamesAStuckCollective) {
  auto comms = testing::CreateWorld(2);
  const std::string name = "stuck.tensor";
  ::testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  std::vector<Status> results(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Heartbeat::Options options;
      options.interval = Ms(20);
      options.warn = Ms(150);
      std::unique_ptr<Heartbeat> beat;
      results[r] = Heartbeat::Start(comms[r].get(), options, [](const Status&) {}, &beat);
      CollectiveWatch watch;
      if (r == 1) watch.Begin("allreduce", &name, 0, 64);
      std::this_thread::sleep_for(Ms(600));
      if (r == 1) watch.End();
      const Status barrier = comms[r]->Barrier();
      if (results[r].ok()) results[r] = barrier;
      beat.reset();
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string logged = ::testing::internal::GetCapturedStderr();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].message();
  // Both heartbeat threads see the process-wide registry here (ranks are
  // threads of one process); in a job each process names its own.
  EXPECT_NE(logged.find("allreduce 'stuck.tensor' of 64 bytes has been running on this rank"),
            std::string::npos)
      << logged;
  EXPECT_NE(logged.find("allreduce 'stuck.tensor' of 64 bytes ended after 0."), std::string::npos)
      << logged;
  EXPECT_EQ(logged.find("has not been heard from"), std::string::npos) << logged;
}

}  // namespace
}  // namespace hora
