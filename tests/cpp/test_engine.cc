// The whole engine (queue, negotiation, executor, wake-up channel, the
// process-set table) with ranks as threads: start, a collective, join,
// shutdown, and process sets added, routed to, used and removed.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "hora/core/engine.h"
#include "thread_ranks.h"

namespace hora {
namespace {

Status Expect(bool condition, const std::string& what) {
  return condition ? Status::OK() : Status::Internal(what);
}

// Starts an engine per rank over a fresh in-process world and runs `body`
// on each rank's thread; returns "rank r: message" for every failed rank.
std::string RunEngines(int size, const std::function<Status(Engine&, int rank)>& body) {
  auto comms = testing::CreateWorld(size);
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Config config;
      std::unique_ptr<Engine> engine;
      results[r] = Engine::Start(std::move(comms[r]), config, &engine);
      if (results[r].ok()) results[r] = body(*engine, r);
      if (engine) engine->Shutdown();
    });
  }
  for (std::thread& t : threads) t.join();
  std::string failures;
  for (int r = 0; r < size; ++r) {
    if (!results[r].ok()) failures += "rank " + std::to_string(r) + ": " + results[r].message();
  }
  return failures;
}

// Queues an in-place float32 allreduce (Sum) of `data` on `engine`.
Status Submit(Engine& engine, const std::string& name, std::vector<float>* data,
              std::shared_ptr<Work>* work) {
  TensorEntry entry;
  entry.request.name = name;
  entry.request.shape = {static_cast<int64_t>(data->size())};
  entry.input.data = data->data();
  entry.input.shape = entry.request.shape;
  entry.output = data->data();
  entry.work = std::make_shared<Work>();
  *work = entry.work;
  return engine.EnqueueOne(std::move(entry));
}

Status Allreduce(Engine& engine, const std::string& name, std::vector<float>* data) {
  std::shared_ptr<Work> work;
  HORA_RETURN_IF_ERROR(Submit(engine, name, data, &work));
  return work->Wait();
}

Status Change(Status submitted, const std::shared_ptr<Work>& work) {
  HORA_RETURN_IF_ERROR(submitted);
  return work->Wait();
}

TEST(Engine, AllreducesThenShutsDown) {
  const std::string failures = RunEngines(3, [](Engine& engine, int rank) -> Status {
    for (int step = 0; step < 3; ++step) {  // the first negotiated, the rest cached
      std::vector<float> data{static_cast<float>(rank + 1), 1.0f};
      HORA_RETURN_IF_ERROR(Allreduce(engine, "grad", &data));
      HORA_RETURN_IF_ERROR(Expect(data[0] == 6.0f && data[1] == 3.0f, "the sum over 3 ranks"));
    }
    engine.Shutdown();
    std::vector<float> data{1.0f};
    std::shared_ptr<Work> work;
    Status after = Submit(engine, "late", &data, &work);
    return Expect(after.code() == StatusCode::kShutdown,
                  "a submission after shutdown is refused with a Shutdown status, got '" +
                      after.message() + "'");
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, JoinCompletesOnceEveryRankJoinedAndNamesTheLast) {
  const std::string failures = RunEngines(3, [](Engine& engine, int rank) -> Status {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::shared_ptr<Work> work;
    HORA_RETURN_IF_ERROR(engine.Join(&work));
    HORA_RETURN_IF_ERROR(work->Wait());
    HORA_RETURN_IF_ERROR(Expect(work->join_last_rank == 1, "rank 1 joined last"));
    // A second join works the same (the request was cleared).
    HORA_RETURN_IF_ERROR(engine.Join(&work));
    return work->Wait();
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, AddsRoutesUsesAndRemovesAProcessSet) {
  const std::string failures = RunEngines(3, [](Engine& engine, int rank) -> Status {
    const ProcessSetTable& sets = engine.process_sets();
    std::shared_ptr<Work> work;
    HORA_RETURN_IF_ERROR(Change(engine.AddProcessSet({2, 0}, &work), work));
    HORA_RETURN_IF_ERROR(Expect(work->process_set_id == 1, "the first set is id 1"));
    ProcessSetInfo info;
    HORA_RETURN_IF_ERROR(sets.Find(1, &info));
    HORA_RETURN_IF_ERROR(Expect(info.ranks == std::vector<int>({0, 2}), "sorted ranks"));
    HORA_RETURN_IF_ERROR(Expect(info.rank == (rank == 0 ? 0 : rank == 2 ? 1 : -1), "set rank"));
    HORA_RETURN_IF_ERROR(Expect(sets.All().size() == 2, "the global set and set 1"));

    ProcessSetRoute route;
    Status routed = sets.Route(1, std::nullopt, &route);
    if (rank == 1) {
      return Expect(!routed.ok() &&
                        routed.message() ==
                            "this process (rank 1) is not in process set 1 (ranks 0, 2); only its "
                            "members may call collectives on it",
                    "a non-member is refused, got '" + routed.message() + "'");
    }
    HORA_RETURN_IF_ERROR(routed);
    HORA_RETURN_IF_ERROR(Expect(route.engine != nullptr && route.size == 2, "the set's engine"));
    Status outside = sets.Route(1, 1, &route);
    HORA_RETURN_IF_ERROR(
        Expect(outside.message() ==
                   "root rank 1 is not in process set 1 (ranks 0, 2) (root_rank is a global rank, "
                   "as in Horovod)",
               "a root outside the set, got '" + outside.message() + "'"));
    HORA_RETURN_IF_ERROR(sets.Route(1, 2, &route));
    HORA_RETURN_IF_ERROR(Expect(route.root == 1, "global root 2 is the set's rank 1"));
    std::vector<float> data{static_cast<float>(rank)};
    HORA_RETURN_IF_ERROR(Allreduce(*route.engine, "in.set", &data));
    HORA_RETURN_IF_ERROR(Expect(data[0] == 2.0f, "the sum over ranks 0 and 2"));
    return Status::OK();
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, RefusesDuplicateAndUnknownSetsOnEveryRank) {
  const std::string failures = RunEngines(3, [](Engine& engine, int) -> Status {
    std::shared_ptr<Work> work;
    HORA_RETURN_IF_ERROR(Change(engine.AddProcessSet({0, 1}, &work), work));
    Status again = Change(engine.AddProcessSet({1, 0}, &work), work);
    HORA_RETURN_IF_ERROR(Expect(again.message() ==
                                    "add_process_set: process set 1 (ranks 0, 1) has the same "
                                    "ranks; a set may exist only once",
                                "a duplicate set, got '" + again.message() + "'"));
    Status whole = Change(engine.AddProcessSet({0, 1, 2}, &work), work);
    HORA_RETURN_IF_ERROR(Expect(whole.code() == StatusCode::kInvalidArgument,
                                "the whole job duplicates the global set"));
    Status outside = Change(engine.AddProcessSet({0, 5}, &work), work);
    HORA_RETURN_IF_ERROR(
        Expect(outside.message() == "add_process_set: rank 5 is outside the job's ranks 0..2",
               "a rank outside the job, got '" + outside.message() + "'"));
    HORA_RETURN_IF_ERROR(Change(engine.RemoveProcessSet(1, &work), work));
    ProcessSetInfo info;
    HORA_RETURN_IF_ERROR(Expect(!engine.process_sets().Find(1, &info).ok(), "set 1 is gone"));
    Status gone = Change(engine.RemoveProcessSet(1, &work), work);
    HORA_RETURN_IF_ERROR(Expect(gone.message() ==
                                    "remove_process_set: there is no process set 1 (it was "
                                    "removed, or never added on this process)",
                                "removing it twice, got '" + gone.message() + "'"));
    Status global = Change(engine.RemoveProcessSet(0, &work), work);
    HORA_RETURN_IF_ERROR(
        Expect(global.code() == StatusCode::kInvalidArgument, "the global set cannot be removed"));
    // The next set gets the next id: ids are never reused.
    HORA_RETURN_IF_ERROR(Change(engine.AddProcessSet({0, 1}, &work), work));
    return Expect(work->process_set_id == 2, "the next set is id 2");
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, RemovingASetFailsWhatWaitsOnIt) {
  const std::string failures = RunEngines(3, [](Engine& engine, int rank) -> Status {
    std::shared_ptr<Work> work;
    HORA_RETURN_IF_ERROR(Change(engine.AddProcessSet({0, 1}, &work), work));
    ProcessSetRoute route;
    std::vector<float> data{1.0f};
    std::shared_ptr<Work> pending;
    // Rank 0 submits a collective rank 1 never joins; then every rank
    // removes the set.
    if (rank == 0) {
      HORA_RETURN_IF_ERROR(engine.process_sets().Route(1, std::nullopt, &route));
      HORA_RETURN_IF_ERROR(Submit(*route.engine, "never", &data, &pending));
    }
    HORA_RETURN_IF_ERROR(Change(engine.RemoveProcessSet(1, &work), work));
    if (rank != 0) return Status::OK();
    Status status = pending->Wait();
    return Expect(
        status.code() == StatusCode::kShutdown &&
            status.message().find("process set 1 (ranks 0, 1) was removed") != std::string::npos,
        "the pending collective fails naming the set, got '" + status.message() + "'");
  });
  EXPECT_EQ(failures, "");
}

TEST(WaitActivity, CountsWaitersOfItsOwnEngineOnly) {
  auto mine = std::make_shared<WaitActivity>();
  auto other = std::make_shared<WaitActivity>();
  Work work;
  work.SetActivity(mine);
  std::thread waiter([&] { work.Wait(); });
  for (int i = 0; i < 2000 && mine->waiters.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(mine->waiters.load(), 1);
  EXPECT_EQ(other->waiters.load(), 0);
  work.Complete(Status::OK());
  waiter.join();
  EXPECT_EQ(mine->waiters.load(), 0);
  // Not spinning: yielding returns at once with the state.
  EXPECT_TRUE(work.YieldUntilDone(std::chrono::microseconds(100)));
}

}  // namespace
}  // namespace hora
