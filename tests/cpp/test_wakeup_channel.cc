// The wake-up channel with ranks as threads (its set-up runs over the
// in-process transport; its messages over real loopback sockets): Create
// connects every rank, NotifyLocal wakes a Wait, RequestCycle reaches rank 0
// as `wants`, StartCycle the others as `starts`, a quiet Wait times out,
// and a rank whose channel closes is reported on rank 0 as lost_rank, which
// AnnounceLost passes on to the others (lost_reported).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hora/comm/wakeup/wakeup_channel.h"
#include "thread_ranks.h"

namespace hora {
namespace {

using Events = WakeupChannel::Events;
using Clock = std::chrono::steady_clock;

Status Expect(bool condition, const std::string& what) {
  return condition ? Status::OK() : Status::Internal(what);
}

std::string Show(const Events& e) {
  return "wants=" + std::to_string(e.wants) + " starts=" + std::to_string(e.starts) +
         " lost_rank=" + std::to_string(e.lost_rank) +
         " lost_reported=" + std::to_string(e.lost_reported) +
         " timed_out=" + std::to_string(e.timed_out);
}

// Creates a channel per rank over a fresh in-process world, runs `body` on
// each rank's thread, then (after a barrier, so that no rank sees a peer
// close early) destroys the channels. Returns "rank r: message" lines.
std::string RunChannels(
    int size, const std::function<Status(Communicator&, std::unique_ptr<WakeupChannel>&)>& body) {
  auto comms = testing::CreateWorld(size, 0, std::chrono::milliseconds(5000));
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Communicator& comm = *comms[r];
      std::unique_ptr<WakeupChannel> channel;
      results[r] = WakeupChannel::Create(&comm, &channel);
      if (results[r].ok()) results[r] = Expect(channel != nullptr, "Create made no channel");
      if (results[r].ok()) results[r] = body(comm, channel);
      const Status barrier = comm.Barrier();
      if (results[r].ok()) results[r] = barrier;
      channel.reset();
    });
  }
  for (std::thread& t : threads) t.join();
  std::string failures;
  for (int r = 0; r < size; ++r) {
    if (!results[r].ok())
      failures += "rank " + std::to_string(r) + ": " + results[r].message() + "\n";
  }
  return failures;
}

// Waits until `done` holds for the events gathered so far (each Wait may
// see only part of what was sent), for at most 5 seconds.
Status WaitUntil(WakeupChannel& channel, const std::function<bool(const Events&)>& done,
                 Events* total) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!done(*total)) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Status::Internal("gave up waiting; got " + Show(*total));
    Events events;
    HORA_RETURN_IF_ERROR(channel.Wait(static_cast<int>(left), &events));
    total->wants += events.wants;
    total->starts += events.starts;
    if (events.lost_rank >= 0) total->lost_rank = events.lost_rank;
    total->lost_reported = total->lost_reported || events.lost_reported;
  }
  return Status::OK();
}

// Nothing at all arrives within `ms`: a Wait that times out empty-handed.
Status ExpectQuiet(WakeupChannel& channel, int ms) {
  Events events;
  HORA_RETURN_IF_ERROR(channel.Wait(ms, &events));
  return Expect(events.timed_out && events.wants == 0 && events.starts == 0 &&
                    events.lost_rank == -1 && !events.lost_reported,
                "expected a quiet Wait, got " + Show(events));
}

TEST(WakeupChannel, CreateConnectsEveryRank) {
  for (int size : {1, 2, 5}) {
    EXPECT_EQ(RunChannels(size,
                          [](Communicator&, std::unique_ptr<WakeupChannel>& channel) {
                            return ExpectQuiet(*channel, 0);
                          }),
              "")
        << size << " ranks";
  }
}

TEST(WakeupChannel, NotifyLocalWakesAWait) {
  const std::string failures =
      RunChannels(2, [](Communicator& comm, std::unique_ptr<WakeupChannel>& channel) -> Status {
        if (comm.rank() != 1) return Status::OK();
        // Another thread notifies while this one sleeps in Wait.
        std::thread notifier([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          channel->NotifyLocal();
        });
        const auto start = Clock::now();
        Events events;
        Status status = channel->Wait(5000, &events);
        const auto waited = Clock::now() - start;
        notifier.join();
        HORA_RETURN_IF_ERROR(status);
        HORA_RETURN_IF_ERROR(Expect(
            !events.timed_out && events.wants == 0 && events.starts == 0 && events.lost_rank == -1,
            "a local notification, got " + Show(events)));
        HORA_RETURN_IF_ERROR(
            Expect(waited < std::chrono::seconds(4), "the notification ended the Wait"));
        // Notifications before a Wait are kept, and one Wait takes them all.
        channel->NotifyLocal();
        channel->NotifyLocal();
        events = Events();
        HORA_RETURN_IF_ERROR(channel->Wait(5000, &events));
        HORA_RETURN_IF_ERROR(
            Expect(!events.timed_out, "an earlier notification, got " + Show(events)));
        return ExpectQuiet(*channel, 0);
      });
  EXPECT_EQ(failures, "");
}

TEST(WakeupChannel, RequestCycleReachesRankZeroAsWants) {
  const std::string failures =
      RunChannels(3, [](Communicator& comm, std::unique_ptr<WakeupChannel>& channel) -> Status {
        if (comm.rank() != 0) {
          HORA_RETURN_IF_ERROR(channel->RequestCycle());
          HORA_RETURN_IF_ERROR(channel->RequestCycle());
          HORA_RETURN_IF_ERROR(comm.Barrier());  // rank 0 has counted them
          return ExpectQuiet(*channel, 0);       // nothing came back
        }
        Events total;
        HORA_RETURN_IF_ERROR(
            WaitUntil(*channel, [](const Events& e) { return e.wants >= 4; }, &total));
        HORA_RETURN_IF_ERROR(comm.Barrier());
        HORA_RETURN_IF_ERROR(Expect(
            total.wants == 4 && total.starts == 0 && total.lost_rank == -1 && !total.lost_reported,
            "two wants from each of ranks 1 and 2, got " + Show(total)));
        return ExpectQuiet(*channel, 10);
      });
  EXPECT_EQ(failures, "");
}

TEST(WakeupChannel, StartCycleReachesTheOthersAsStarts) {
  const std::string failures =
      RunChannels(4, [](Communicator& comm, std::unique_ptr<WakeupChannel>& channel) -> Status {
        if (comm.rank() == 0) {
          for (int i = 0; i < 3; ++i) HORA_RETURN_IF_ERROR(channel->StartCycle());
          HORA_RETURN_IF_ERROR(comm.Barrier());
          return ExpectQuiet(*channel, 0);
        }
        Events total;
        HORA_RETURN_IF_ERROR(
            WaitUntil(*channel, [](const Events& e) { return e.starts >= 3; }, &total));
        HORA_RETURN_IF_ERROR(comm.Barrier());
        HORA_RETURN_IF_ERROR(Expect(
            total.starts == 3 && total.wants == 0 && total.lost_rank == -1 && !total.lost_reported,
            "three starts, got " + Show(total)));
        return ExpectQuiet(*channel, 10);
      });
  EXPECT_EQ(failures, "");
}

TEST(WakeupChannel, AQuietWaitTimesOut) {
  const std::string failures =
      RunChannels(2, [](Communicator&, std::unique_ptr<WakeupChannel>& channel) -> Status {
        const auto start = Clock::now();
        HORA_RETURN_IF_ERROR(ExpectQuiet(*channel, 30));
        const auto waited = Clock::now() - start;
        return Expect(
            waited >= std::chrono::milliseconds(25),
            "Wait(30) returned after " +
                std::to_string(
                    std::chrono::duration_cast<std::chrono::microseconds>(waited).count()) +
                " us");
      });
  EXPECT_EQ(failures, "");
}

TEST(WakeupChannel, ALostRankIsReportedOnRankZeroAndAnnouncedToTheOthers) {
  // Rank 2's channel closes. Rank 0 sees it as lost_rank 2 and announces it;
  // ranks 1 and 3 hear from rank 0 that rank 2 is gone.
  const std::string failures =
      RunChannels(4, [](Communicator& comm, std::unique_ptr<WakeupChannel>& channel) -> Status {
        const int rank = comm.rank();
        if (rank == 2) {
          channel.reset();
          return Status::OK();
        }
        Events total;
        HORA_RETURN_IF_ERROR(
            WaitUntil(*channel, [](const Events& e) { return e.lost_rank >= 0; }, &total));
        if (rank == 0) {
          HORA_RETURN_IF_ERROR(
              Expect(total.lost_rank == 2 && !total.lost_reported && total.wants == 0,
                     "rank 0 sees rank 2 go, got " + Show(total)));
          channel->AnnounceLost(2);
          return Status::OK();
        }
        return Expect(total.lost_rank == 2 && total.lost_reported && total.starts == 0,
                      "rank 0 reports rank 2, got " + Show(total));
      });
  EXPECT_EQ(failures, "");
}

TEST(WakeupChannel, LosingRankZeroIsReportedAsRankZero) {
  const std::string failures =
      RunChannels(3, [](Communicator& comm, std::unique_ptr<WakeupChannel>& channel) -> Status {
        if (comm.rank() == 0) {
          channel.reset();
          return Status::OK();
        }
        Events total;
        HORA_RETURN_IF_ERROR(
            WaitUntil(*channel, [](const Events& e) { return e.lost_rank >= 0; }, &total));
        return Expect(total.lost_rank == 0 && !total.lost_reported,
                      "rank 0's connection closed, got " + Show(total));
      });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace hora
