// The heartbeat with ranks as threads (set-up over the in-process
// transport, beats over real loopback sockets). A thread cannot be
// stopped the way SIGSTOP stops a process, so the silent rank is one whose
// interval is far longer than the others' stop time: it beats once at
// start, then never again. Rank 0 then stops the job naming it, and tells
// the other ranks, which stop naming it too; a rank that keeps beating is
// never reported.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hora/comm/wakeup/heartbeat.h"
#include "thread_ranks.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

struct Outcome {
  std::mutex mutex;
  std::vector<std::string> messages;  // per rank: what on_stop was given
  std::vector<double> after_ms;       // per rank: when, from the start
};

// Runs a heartbeat per rank for `run` and returns what each rank's on_stop
// got (empty: never called). `silent` beats only once (-1: none).
void RunBeats(int size, int silent, Ms run, Outcome* outcome) {
  auto comms = testing::CreateWorld(size);
  outcome->messages.assign(size, "");
  outcome->after_ms.assign(size, -1.0);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  std::vector<Status> results(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Heartbeat::Options options;
      options.interval = r == silent ? Ms(60000) : Ms(20);
      options.warn = Ms(100);
      options.stop = Ms(300);
      std::unique_ptr<Heartbeat> beat;
      results[r] = Heartbeat::Start(
          comms[r].get(), options,
          [&, r](const Status& reason) {
            std::lock_guard<std::mutex> lock(outcome->mutex);
            outcome->messages[r] = reason.message();
            outcome->after_ms[r] =
                std::chrono::duration<double, std::milli>(Clock::now() - start).count();
          },
          &beat);
      std::this_thread::sleep_for(run);
      // Every heartbeat runs for the whole time before any closes.
      const Status barrier = comms[r]->Barrier();
      if (results[r].ok()) results[r] = barrier;
      beat.reset();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size; ++r) ASSERT_TRUE(results[r].ok()) << results[r].message();
}

TEST(Heartbeat, RanksThatBeatAreNeverReported) {
  Outcome outcome;
  RunBeats(3, -1, Ms(600), &outcome);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(outcome.messages[r], "") << "rank " << r;
}

TEST(Heartbeat, ASilentRankStopsTheJobOnEveryOtherRank) {
  Outcome outcome;
  RunBeats(3, 1, Ms(1200), &outcome);
  EXPECT_NE(outcome.messages[0].find("rank 1 has not been heard from for 0.3"), std::string::npos)
      << outcome.messages[0];
  EXPECT_NE(outcome.messages[2].find("rank 1 stopped answering"), std::string::npos)
      << outcome.messages[2];
  for (int r : {0, 2}) {
    EXPECT_GE(outcome.after_ms[r], 300.0) << "rank " << r;
    EXPECT_LT(outcome.after_ms[r], 1000.0) << "rank " << r;
  }
}

TEST(Heartbeat, ASilentRankZeroIsNamedByTheOthers) {
  Outcome outcome;
  RunBeats(2, 0, Ms(1000), &outcome);
  EXPECT_NE(outcome.messages[1].find("rank 0 has not been heard from"), std::string::npos)
      << outcome.messages[1];
}

TEST(Heartbeat, OneRankHasNone) {
  auto comms = testing::CreateWorld(1);
  std::unique_ptr<Heartbeat> beat;
  ASSERT_TRUE(
      Heartbeat::Start(comms[0].get(), Heartbeat::Options{}, [](const Status&) {}, &beat).ok());
  EXPECT_EQ(beat, nullptr);
}

}  // namespace
}  // namespace hora
