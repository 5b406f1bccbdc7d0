// Controller::RunCycle with ranks as threads: a tensor negotiated once
// through the coordinator comes from the response cache afterwards (one bit
// allreduce, no gather), every rank gets the same responses in the same
// order, a changed request invalidates its entry (renegotiated, or a
// mismatch naming the tensor and the ranks), join and shutdown bits reach
// every rank, announced parameters switch the cache, and controllers of two
// process sets run side by side over their split communicators.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hora/core/config.h"
#include "hora/core/controller.h"
#include "hora/core/timeline.h"
#include "thread_ranks.h"

namespace hora {
namespace {

// Forwards to a real communicator and counts the control-plane calls: a
// cycle answered by the cache makes one AllreduceBitAnd and no gather.
class CountingCommunicator : public Communicator {
 public:
  explicit CountingCommunicator(Communicator* inner) : inner_(inner) {}

  int bit_ands = 0;
  int gathers = 0;
  int broadcasts = 0;

  const Topology& topology() const override { return inner_->topology(); }
  Status AllreduceBitAnd(uint64_t* words, int count) override {
    ++bit_ands;
    return inner_->AllreduceBitAnd(words, count);
  }
  Status GatherBytes(const std::string& mine, int root, std::vector<std::string>* all) override {
    ++gathers;
    return inner_->GatherBytes(mine, root, all);
  }
  Status BroadcastBytes(std::string* data, int root) override {
    ++broadcasts;
    return inner_->BroadcastBytes(data, root);
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    return inner_->Allreduce(send, recv, count, dtype, op);
  }
  Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes) override {
    return inner_->Allgatherv(send, send_bytes, recv, recv_bytes);
  }
  Status Broadcast(void* buffer, int64_t bytes, int root) override {
    return inner_->Broadcast(buffer, bytes, root);
  }
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>& recv_bytes) override {
    return inner_->Alltoallv(send, send_bytes, recv, recv_bytes);
  }
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override {
    return inner_->ReduceScatter(send, recv, recv_counts, dtype, op);
  }
  Status Barrier() override { return inner_->Barrier(); }
  Status PostSend(const void* buffer, int64_t bytes, int dest, int tag, int* id) override {
    return inner_->PostSend(buffer, bytes, dest, tag, id);
  }
  Status PostRecv(void* buffer, int64_t bytes, int source, int tag, int* id) override {
    return inner_->PostRecv(buffer, bytes, source, tag, id);
  }
  Status Wait(int id) override { return inner_->Wait(id); }
  Status WaitAll() override { return inner_->WaitAll(); }
  void SetBlockingCollectives(bool blocking) override { inner_->SetBlockingCollectives(blocking); }
  Communicator* local() override { return inner_->local(); }
  Communicator* cross() override { return inner_->cross(); }
  Status Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) override {
    return inner_->Split(ranks, out);
  }
  bool ConcurrentCalls() const override { return inner_->ConcurrentCalls(); }
  std::string Describe() const override { return "counting " + inner_->Describe(); }

 private:
  Communicator* inner_;
};

Request Req(const std::string& name, std::vector<int64_t> shape,
            DataType dtype = DataType::kFloat32, CollectiveKind kind = CollectiveKind::kAllreduce) {
  Request r;
  r.name = name;
  r.shape = std::move(shape);
  r.dtype = dtype;
  r.kind = kind;
  return r;
}

// No stall inspector: its flushes and checks depend on the clock.
Config TestConfig() {
  Config config;
  config.stall_check = false;
  return config;
}

// What one rank hands to one cycle.
struct Input {
  std::vector<Request> requests;
  bool joined = false;
  bool shutdown = false;
  bool waiting = false;
  bool root_idle = false;
};

// What one rank got from one cycle, and the control-plane calls made so far.
struct Output {
  CycleResult result;
  int bit_ands = 0;
  int gathers = 0;
  bool unsent = false;  // HasUnsentRequests() after the cycle
};

using Script = std::function<Input(int rank, int cycle)>;
// Called on each rank's thread before each cycle (e.g. Announce on rank 0).
using Before = std::function<void(Controller&, int rank, int cycle)>;

std::string Describe(const Response& r) {
  std::ostringstream s;
  s << r.name << " " << CollectiveKindName(r.kind) << " " << DataTypeName(r.dtype) << " "
    << ShapeString(r.shape) << " contributors=" << r.contributors;
  if (r.is_error()) s << " error: " << r.error;
  return s.str();
}

std::string Describe(const CycleResult& result) {
  std::ostringstream s;
  for (const Response& r : result.responses) s << "[" << Describe(r) << "] ";
  s << "shutdown="
    << ShapeString(std::vector<int64_t>(result.shutdown_ranks.begin(), result.shutdown_ranks.end()))
    << " joined=" << result.joined_count << " all_joined=" << result.all_joined
    << " last_joined=" << result.last_joined_rank << " waiting=" << result.waiting
    << " go_idle=" << result.go_idle << " abort='" << result.abort.message() << "'"
    << " parameters=" << result.has_parameters;
  return s.str();
}

std::vector<std::string> Names(const CycleResult& result) {
  std::vector<std::string> names;
  for (const Response& r : result.responses) names.push_back(r.name);
  return names;
}

// Runs `cycles` cycles of one Controller per rank over a fresh in-process
// world; out[rank][cycle]. Rank failures are reported through gtest.
std::vector<std::vector<Output>> RunCycles(int size, int cycles, const Script& script,
                                           const Config& config = TestConfig(),
                                           const Before& before = nullptr) {
  // A rank that never arrives fails the test in seconds instead of a minute.
  auto comms = testing::CreateWorld(size, 0, std::chrono::milliseconds(5000));
  std::vector<std::vector<Output>> out(size);
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      CountingCommunicator comm(comms[r].get());
      Timeline timeline;
      Controller controller(&comm, config, &timeline);
      for (int c = 0; c < cycles; ++c) {
        if (before) before(controller, r, c);
        Input in = script(r, c);
        Output o;
        results[r] = controller.RunCycle(std::move(in.requests), in.shutdown, in.joined, in.waiting,
                                         in.root_idle, &o.result);
        if (!results[r].ok()) return;
        o.bit_ands = comm.bit_ands;
        o.gathers = comm.gathers;
        o.unsent = controller.HasUnsentRequests();
        out[r].push_back(std::move(o));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].message();
    EXPECT_EQ(out[r].size(), static_cast<size_t>(cycles)) << "rank " << r;
  }
  return out;
}

// Every rank's cycle results (responses in order, flags) equal rank 0's.
void ExpectSameOnEveryRank(const std::vector<std::vector<Output>>& out) {
  for (size_t r = 1; r < out.size(); ++r) {
    ASSERT_EQ(out[r].size(), out[0].size());
    for (size_t c = 0; c < out[0].size(); ++c) {
      EXPECT_EQ(Describe(out[r][c].result), Describe(out[0][c].result))
          << "rank " << r << ", cycle " << c;
    }
  }
}

TEST(Controller, NegotiatesOnceThenAnswersFromTheCacheOnEveryRank) {
  const int size = 3;
  // Every cycle every rank submits a and b, in an order of its own.
  const auto out = RunCycles(size, 4, [](int rank, int) {
    Input in;
    if (rank == 1) {
      in.requests = {Req("b", {2, 3}), Req("a", {4})};
    } else {
      in.requests = {Req("a", {4}), Req("b", {2, 3})};
    }
    return in;
  });
  ExpectSameOnEveryRank(out);
  for (int r = 0; r < size; ++r) {
    for (int c = 0; c < 4; ++c) {
      const CycleResult& result = out[r][c].result;
      // Rank 0's order decides at the coordinator; the cache keeps it.
      EXPECT_EQ(Names(result), (std::vector<std::string>{"a", "b"})) << r << "/" << c;
      ASSERT_EQ(result.responses.size(), 2u);
      EXPECT_FALSE(result.responses[0].is_error());
      EXPECT_EQ(result.responses[0].shape, (std::vector<int64_t>{4}));
      EXPECT_EQ(result.responses[1].shape, (std::vector<int64_t>{2, 3}));
      EXPECT_EQ(result.responses[0].contributors, size);
      EXPECT_TRUE(result.abort.ok());
      EXPECT_FALSE(out[r][c].unsent);
      // One bit allreduce per cycle; the gather only in the first.
      EXPECT_EQ(out[r][c].bit_ands, c + 1) << r << "/" << c;
      EXPECT_EQ(out[r][c].gathers, 1) << r << "/" << c;
    }
  }
}

TEST(Controller, ACachedTensorWaitsForItsLastRank) {
  // Cycle 0 negotiates t; in cycle 1 only ranks 0 and 2 have it again, in
  // cycle 2 rank 1 catches up: it runs then, from the cache.
  const auto out = RunCycles(3, 3, [](int rank, int cycle) {
    Input in;
    if (cycle == 0 || (cycle == 1 && rank != 1) || (cycle == 2 && rank == 1)) {
      in.requests = {Req("t", {8})};
    }
    return in;
  });
  ExpectSameOnEveryRank(out);
  EXPECT_EQ(Names(out[0][0].result), (std::vector<std::string>{"t"}));
  EXPECT_TRUE(out[0][1].result.responses.empty());
  EXPECT_EQ(Names(out[0][2].result), (std::vector<std::string>{"t"}));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[r][2].gathers, 1) << "rank " << r << ": cycles 1 and 2 use the cache only";
    EXPECT_EQ(out[r][2].bit_ands, 3);
  }
}

TEST(Controller, AChangedShapeOnEveryRankIsRenegotiatedAndCachedAgain) {
  // Cycle 0: w is [4] (negotiated), 1: [4] (cached), 2: [8] everywhere
  // (entry invalidated, renegotiated), 3: [8] (cached again).
  const auto out = RunCycles(3, 4, [](int, int cycle) {
    Input in;
    in.requests = {Req("w", cycle < 2 ? std::vector<int64_t>{4} : std::vector<int64_t>{8})};
    return in;
  });
  ExpectSameOnEveryRank(out);
  const std::vector<int> gathers = {1, 1, 2, 2};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) {
      const CycleResult& result = out[r][c].result;
      ASSERT_EQ(result.responses.size(), 1u) << r << "/" << c;
      EXPECT_FALSE(result.responses[0].is_error()) << result.responses[0].error;
      EXPECT_EQ(result.responses[0].shape,
                c < 2 ? std::vector<int64_t>{4} : std::vector<int64_t>{8})
          << r << "/" << c;
      EXPECT_EQ(out[r][c].gathers, gathers[c]) << r << "/" << c;
    }
  }
}

TEST(Controller, OneRankChangingItsRequestGetsAMismatchNamingTensorAndRanks) {
  // 0: w [8] float32 everywhere (cached). 1: rank 2 sends float64: its
  // stale entry sends every rank's w to the coordinator, which reports the
  // disagreement. 2: w [8] float32 again: the entry is gone, so it is
  // negotiated (and cached) anew. 3: rank 1 sends [2, 4]: a shape mismatch.
  // 4: w [8] float32 again: renegotiated.
  const auto out = RunCycles(3, 5, [](int rank, int cycle) {
    Input in;
    Request w = Req("w", {8});
    if (cycle == 1 && rank == 2) w.dtype = DataType::kFloat64;
    if (cycle == 3 && rank == 1) w.shape = {2, 4};
    in.requests = {w};
    return in;
  });
  ExpectSameOnEveryRank(out);
  const CycleResult& dtype = out[0][1].result;
  ASSERT_EQ(dtype.responses.size(), 1u);
  EXPECT_EQ(dtype.responses[0].name, "w");
  EXPECT_EQ(dtype.responses[0].error_code, StatusCode::kMismatch);
  EXPECT_EQ(dtype.responses[0].error,
            "Mismatched data type for allreduce 'w': ranks 0, 1 sent float32; rank 2 sent float64");
  const CycleResult& shape = out[0][3].result;
  ASSERT_EQ(shape.responses.size(), 1u);
  EXPECT_EQ(shape.responses[0].error_code, StatusCode::kMismatch);
  EXPECT_EQ(shape.responses[0].error,
            "Mismatched shape for allreduce 'w': ranks 0, 2 sent [8]; rank 1 sent [2, 4]");
  for (int c : {0, 2, 4}) {
    ASSERT_EQ(out[0][c].result.responses.size(), 1u) << c;
    EXPECT_FALSE(out[0][c].result.responses[0].is_error()) << c;
  }
  // A mismatch is not an abort: the job goes on, only that tensor fails.
  EXPECT_TRUE(dtype.abort.ok());
  // Each cycle goes through the coordinator: the first negotiation, each
  // change (a stale entry) and each recovery (the entry was dropped).
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 5; ++c) EXPECT_EQ(out[r][c].gathers, c + 1) << r << "/" << c;
  }
}

TEST(Controller, APackedRequestsMembersTravelAndAReshapedMemberIsCaught) {
  // A packed allreduce of members [4] and [2, 3] (10 elements): 0
  // negotiated, 1 cached; 2: rank 1 swaps the second member's dimensions
  // (the total stays 10): its stale entry sends the members to the
  // coordinator, which names the member; 3: as before, negotiated again.
  const auto out = RunCycles(3, 4, [](int rank, int cycle) {
    Input in;
    Request g = Req("g.0", {10});
    g.members = {1, 4, 2, 2, 3};
    if (cycle == 2 && rank == 1) g.members = {1, 4, 2, 3, 2};
    in.requests = {g};
    return in;
  });
  ExpectSameOnEveryRank(out);
  const CycleResult& reshaped = out[0][2].result;
  ASSERT_EQ(reshaped.responses.size(), 1u);
  EXPECT_EQ(reshaped.responses[0].error,
            "Mismatched shape of member 1 (of 2 tensors packed together) for allreduce 'g.0': "
            "ranks 0, 2 sent [2, 3]; rank 1 sent [3, 2]");
  for (int c : {0, 1, 3}) {
    ASSERT_EQ(out[0][c].result.responses.size(), 1u) << c;
    EXPECT_FALSE(out[0][c].result.responses[0].is_error()) << c;
  }
  const std::vector<int> gathers = {1, 1, 2, 3};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(out[r][c].gathers, gathers[c]) << r << "/" << c;
  }
}

TEST(Controller, JoinedRanksAreCountedAndTheLastToJoinIsNamed) {
  // 0: everyone submits g (cached). 1: rank 1 joins; 0 and 2 submit g (it
  // runs, through the coordinator) and the allgather h (refused while rank 1
  // is joined). 2: rank 0 joins too; rank 2 alone submits g, which runs.
  // 3: rank 2 joins: all joined, rank 2 last. 4: nobody joined; g comes
  // from the cache again.
  const auto out = RunCycles(3, 5, [](int rank, int cycle) {
    Input in;
    in.joined = (cycle >= 1 && cycle <= 3 && rank == 1) ||
                (cycle >= 2 && cycle <= 3 && rank == 0) || (cycle == 3 && rank == 2);
    const bool submits =
        cycle == 0 || cycle == 4 || (cycle == 1 && rank != 1) || (cycle == 2 && rank == 2);
    if (submits) in.requests.push_back(Req("g", {4}));
    if (cycle == 1 && rank != 1) {
      in.requests.push_back(Req("h", {2}, DataType::kFloat32, CollectiveKind::kAllgather));
    }
    return in;
  });
  ExpectSameOnEveryRank(out);
  const std::vector<int> joined = {0, 1, 2, 3, 0};
  for (int c = 0; c < 5; ++c) {
    const CycleResult& result = out[0][c].result;
    EXPECT_EQ(result.joined_count, joined[c]) << "cycle " << c;
    EXPECT_EQ(result.all_joined, c == 3) << "cycle " << c;
    EXPECT_EQ(result.last_joined_rank, c == 3 ? 2 : -1) << "cycle " << c;
  }
  // g was parked on the cache before the join moved it to the coordinator
  // path, behind h; the order is the same on every rank (checked above).
  const CycleResult& one = out[0][1].result;
  ASSERT_EQ(one.responses.size(), 2u);
  const bool g_first = one.responses[0].name == "g";
  const Response& g = one.responses[g_first ? 0 : 1];
  const Response& h = one.responses[g_first ? 1 : 0];
  EXPECT_EQ(g.name, "g");
  EXPECT_FALSE(g.is_error()) << g.error;
  EXPECT_EQ(g.contributors, 3);  // the world size, as in Horovod
  EXPECT_EQ(h.name, "h");
  EXPECT_EQ(h.error_code, StatusCode::kMismatch);
  EXPECT_EQ(h.error,
            "allgather 'h' cannot run while rank 1 has called join(); only allreduce accepts "
            "joined ranks");
  EXPECT_EQ(Names(out[0][2].result), (std::vector<std::string>{"g"}));
  EXPECT_TRUE(out[0][3].result.responses.empty());
  EXPECT_EQ(Names(out[0][4].result), (std::vector<std::string>{"g"}));
  for (int r = 0; r < 3; ++r) {
    // While anyone is joined every cycle goes through the coordinator; once
    // the join is over the cache answers again.
    EXPECT_EQ(out[r][0].gathers, 1);
    EXPECT_EQ(out[r][3].gathers, 4);
    EXPECT_EQ(out[r][4].gathers, 4) << "rank " << r;
  }
}

TEST(Controller, AllRanksJoiningInOneCycleNameTheHighest) {
  const auto out = RunCycles(4, 2, [](int rank, int cycle) {
    Input in;
    in.joined = cycle == 1 || rank == 3;  // rank 3 first, then 0, 1, 2 together
    return in;
  });
  ExpectSameOnEveryRank(out);
  EXPECT_EQ(out[0][0].result.joined_count, 1);
  EXPECT_FALSE(out[0][0].result.all_joined);
  EXPECT_EQ(out[0][1].result.joined_count, 4);
  EXPECT_TRUE(out[0][1].result.all_joined);
  EXPECT_EQ(out[0][1].result.last_joined_rank, 2);
}

TEST(Controller, ShutdownRanksReachEveryRank) {
  // 0: rank 2 asks to shut down, while x is negotiated. 1: ranks 0 and 3.
  const auto out = RunCycles(4, 2, [](int rank, int cycle) {
    Input in;
    in.shutdown = (cycle == 0 && rank == 2) || (cycle == 1 && (rank == 0 || rank == 3));
    if (cycle == 0) in.requests = {Req("x", {1})};
    return in;
  });
  ExpectSameOnEveryRank(out);
  EXPECT_EQ(out[0][0].result.shutdown_ranks, (std::vector<int>{2}));
  EXPECT_EQ(Names(out[0][0].result), (std::vector<std::string>{"x"}));
  EXPECT_EQ(out[0][1].result.shutdown_ranks, (std::vector<int>{0, 3}));
  EXPECT_TRUE(out[0][1].result.responses.empty());
}

TEST(Controller, WaitingFromAnyRankAndIdleFromRankZeroOnly) {
  // 0: rank 2 waits; rank 1 (not 0) says idle. 1: rank 0 says idle.
  const auto out = RunCycles(3, 2, [](int rank, int cycle) {
    Input in;
    in.waiting = cycle == 0 && rank == 2;
    in.root_idle = (cycle == 0 && rank == 1) || (cycle == 1 && rank == 0);
    return in;
  });
  ExpectSameOnEveryRank(out);
  EXPECT_TRUE(out[0][0].result.waiting);
  EXPECT_FALSE(out[0][0].result.go_idle);
  EXPECT_FALSE(out[0][1].result.waiting);
  EXPECT_TRUE(out[0][1].result.go_idle);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r][1].gathers, 0) << "no work, no negotiation";
}

TEST(Controller, AnnouncedParametersReachEveryRankAndSwitchTheCache) {
  // 0: p negotiated. 1: p cached; rank 0 announces the cache off. 2, 3: p
  // through the coordinator. 3: rank 0 announces it on. 4: p negotiated
  // (the cache starts empty). 5: p cached.
  EngineParameters off;
  off.fusion_threshold_bytes = 4096;
  off.cycle_time_ms = 2.5;
  off.response_cache = false;
  off.hierarchical = false;
  EngineParameters on = off;
  on.response_cache = true;
  const auto out = RunCycles(
      2, 6,
      [](int, int) {
        Input in;
        in.requests = {Req("p", {3})};
        return in;
      },
      TestConfig(),
      [&](Controller& controller, int rank, int cycle) {
        if (rank == 0 && cycle == 1) controller.Announce(off);
        if (rank == 0 && cycle == 3) controller.Announce(on);
      });
  ExpectSameOnEveryRank(out);
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 6; ++c) {
      EXPECT_EQ(Names(out[r][c].result), (std::vector<std::string>{"p"})) << r << "/" << c;
      EXPECT_EQ(out[r][c].result.has_parameters, c == 1 || c == 3) << r << "/" << c;
    }
    const EngineParameters& got = out[r][1].result.parameters;
    EXPECT_EQ(got.fusion_threshold_bytes, 4096);
    EXPECT_EQ(got.cycle_time_ms, 2.5);
    EXPECT_FALSE(got.response_cache);
    EXPECT_FALSE(got.hierarchical);
    EXPECT_TRUE(out[r][3].result.parameters.response_cache);
    // Gathers: cycle 0 (new), 1 (announcement), 2 and 3 (cache off), 4
    // (cache emptied), none in 5.
    const std::vector<int> gathers = {1, 2, 3, 4, 5, 5};
    for (int c = 0; c < 6; ++c) EXPECT_EQ(out[r][c].gathers, gathers[c]) << r << "/" << c;
  }
}

TEST(Controller, EvictionSendsAParkedRequestToTheCoordinator) {
  // A cache of one entry. 0: a negotiated (cached). 1: rank 0 has a again
  // (parked on the cache), rank 1 not yet; both submit b, whose entry
  // evicts a: rank 0's request moves to the coordinator path and must be
  // sent (HasUnsentRequests). 2: rank 1 submits a; it runs.
  Config config = TestConfig();
  config.cache_capacity = 1;
  const auto out = RunCycles(
      2, 3,
      [](int rank, int cycle) {
        Input in;
        if (cycle == 0 || (cycle == 1 && rank == 0) || (cycle == 2 && rank == 1)) {
          in.requests.push_back(Req("a", {1}));
        }
        if (cycle == 1) in.requests.push_back(Req("b", {1}));
        return in;
      },
      config);
  ExpectSameOnEveryRank(out);
  EXPECT_EQ(Names(out[0][0].result), (std::vector<std::string>{"a"}));
  EXPECT_EQ(Names(out[0][1].result), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(out[0][1].unsent);
  EXPECT_FALSE(out[1][1].unsent);
  EXPECT_EQ(Names(out[0][2].result), (std::vector<std::string>{"a"}));
  EXPECT_FALSE(out[0][2].unsent);
}

TEST(Controller, AResultHandedInAgainHoldsOnlyItsNewCycle) {
  // One CycleResult per rank, used for three cycles: 0 runs a and rank 1
  // asks to shut down; 1 has nothing and nobody asks; 2 runs b.
  auto comms = testing::CreateWorld(2, 0, std::chrono::milliseconds(5000));
  std::vector<std::vector<std::string>> seen(2);
  std::vector<Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Timeline timeline;
      Controller controller(comms[r].get(), TestConfig(), &timeline);
      CycleResult result;
      for (int c = 0; c < 3 && status[r].ok(); ++c) {
        std::vector<Request> requests;
        if (c == 0) requests.push_back(Req("a", {1}));
        if (c == 2) requests.push_back(Req("b", {1}));
        status[r] = controller.RunCycle(std::move(requests), c == 0 && r == 1, false, false, false,
                                        &result);
        seen[r].push_back(Describe(result));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r].message();
    ASSERT_EQ(seen[r].size(), 3u);
    EXPECT_NE(seen[r][0].find("[a "), std::string::npos) << seen[r][0];
    EXPECT_NE(seen[r][0].find("shutdown=[1]"), std::string::npos) << seen[r][0];
    // no responses: the description starts with the shutdown list
    EXPECT_EQ(seen[r][1].rfind("shutdown=[] ", 0), 0u) << seen[r][1];
    EXPECT_EQ(seen[r][2].find("[a "), std::string::npos) << seen[r][2];
    EXPECT_NE(seen[r][2].find("[b "), std::string::npos) << seen[r][2];
  }
}

TEST(Controller, TwoProcessSetsRunTheirOwnControllersAtTheSameTime) {
  // World of 4: set 1 = ranks {0, 1}, set 2 = ranks {2, 3}, each with its
  // own controller over its split, cycling on a thread of its own while
  // the world's controller cycles too. Both sets use the name x with
  // different shapes; in the last cycle set 2's second member changes it.
  const int size = 4, cycles = 4;
  auto comms = testing::CreateWorld(size, 0, std::chrono::milliseconds(5000));
  struct Log {
    std::vector<std::string> set_results, world_results;
    int set_gathers = 0, world_gathers = 0;
    Status status;
  };
  std::vector<Log> logs(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Log& log = logs[r];
      const std::vector<int> ranks = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
      std::unique_ptr<Communicator> first, second;
      log.status = comms[r]->Split({0, 1}, &first);
      if (log.status.ok()) log.status = comms[r]->Split({2, 3}, &second);
      if (!log.status.ok()) return;
      Communicator* split = r < 2 ? first.get() : second.get();
      if (split == nullptr || (r < 2) == (second != nullptr)) {
        log.status = Status::Internal("split membership");
        return;
      }
      Status set_status;
      std::thread set_thread([&] {
        CountingCommunicator comm(split);
        Timeline timeline;
        Controller controller(&comm, TestConfig(), &timeline);
        controller.SetRankNames(ranks, r < 2 ? " in process set 1" : " in process set 2");
        for (int c = 0; c < cycles && set_status.ok(); ++c) {
          Request x = Req("x", {r < 2 ? 2 : 3});
          if (c == cycles - 1 && r == 3) x.shape = {7};
          CycleResult result;
          set_status = controller.RunCycle({x}, false, false, false, false, &result);
          log.set_results.push_back(Describe(result));
        }
        log.set_gathers = comm.gathers;
      });
      CountingCommunicator comm(comms[r].get());
      Timeline timeline;
      Controller controller(&comm, TestConfig(), &timeline);
      for (int c = 0; c < cycles && log.status.ok(); ++c) {
        CycleResult result;
        log.status = controller.RunCycle({Req("x", {5}), Req("y", {1})}, false, false, false, false,
                                         &result);
        log.world_results.push_back(Describe(result));
      }
      log.world_gathers = comm.gathers;
      set_thread.join();
      if (log.status.ok()) log.status = set_status;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(logs[r].status.ok()) << "rank " << r << ": " << logs[r].status.message();
    ASSERT_EQ(logs[r].set_results.size(), static_cast<size_t>(cycles));
    ASSERT_EQ(logs[r].world_results.size(), static_cast<size_t>(cycles));
  }
  const std::string tail =
      "shutdown=[] joined=0 all_joined=0 last_joined=-1 waiting=0 go_idle=0 abort='' "
      "parameters=0";
  for (int r = 0; r < size; ++r) {
    for (int c = 0; c < cycles; ++c) {
      EXPECT_EQ(logs[r].world_results[c],
                "[x allreduce float32 [5] contributors=4] [y allreduce float32 [1] "
                "contributors=4] " +
                    tail)
          << r << "/" << c;
      std::string set;
      if (r < 2) {
        set = "[x allreduce float32 [2] contributors=2] ";
      } else if (c < cycles - 1) {
        set = "[x allreduce float32 [3] contributors=2] ";
      } else {
        set =
            "[x allreduce float32 [3] contributors=0 error: Mismatched shape for allreduce 'x' in "
            "process set 2: rank 2 sent [3]; rank 3 sent [7]] ";
      }
      EXPECT_EQ(logs[r].set_results[c], set + tail) << r << "/" << c;
    }
    EXPECT_EQ(logs[r].world_gathers, 1) << "rank " << r;
    EXPECT_EQ(logs[r].set_gathers, r < 2 ? 1 : 2) << "rank " << r;
  }
}

}  // namespace
}  // namespace hora
