// hora's TCP transport on its own: collectives against a reference, the
// ordering of point-to-point messages, process sets on threads of their
// own, and what the survivors see when a peer is lost or the world is
// revoked. (Every other thread-rank test also runs over it: ctest's
// hora_cpp_tests_over_tcp.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>

#include "hora/comm/tcp/tcp_communicator.h"
#include "thread_ranks.h"

namespace hora {
namespace {

using testing::Failures;

// Runs `body` once per rank of a loopback TCP world; each rank owns its
// communicator (and may drop it, which closes its connections).
std::vector<Status> RunTcp(
    int size, int ranks_per_host,
    const std::function<Status(std::unique_ptr<TcpCommunicator>& comm)>& body) {
  std::vector<std::unique_ptr<TcpCommunicator>> comms;
  const Status made = TcpCommunicator::CreateLoopbackWorld(size, ranks_per_host, &comms);
  if (!made.ok()) return std::vector<Status>(size, made);
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { results[r] = body(comms[r]); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

bool Contains(const Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

TEST(TcpCommunicator, TopologyOfPretendHosts) {
  std::vector<std::unique_ptr<TcpCommunicator>> comms;
  ASSERT_TRUE(TcpCommunicator::CreateLoopbackWorld(6, 3, &comms).ok());
  const Topology& t = comms[4]->topology();
  EXPECT_EQ(t.rank, 4);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 3);
  EXPECT_EQ(t.cross_rank, 1);
  EXPECT_EQ(t.cross_size, 2);
  EXPECT_TRUE(t.homogeneous);
  EXPECT_EQ(t.hostname, "host1");
  EXPECT_EQ(comms[4]->local()->rank(), 1);
  EXPECT_EQ(comms[4]->local()->size(), 3);
  EXPECT_EQ(comms[4]->cross()->rank(), 1);
  EXPECT_EQ(comms[4]->cross()->size(), 2);
  EXPECT_NE(comms[4]->Describe().find("TCP"), std::string::npos);
}

TEST(TcpCommunicator, CollectivesMatchAReference) {
  for (int size : {1, 2, 3, 5}) {
    const std::vector<Status> results = RunTcp(size, 0, [&](std::unique_ptr<TcpCommunicator>& c) {
      Communicator& comm = *c;
      const int me = comm.rank();
      // Small (a tree) and large (the ring, with uneven chunks) allreduces.
      for (int64_t count : {int64_t{7}, int64_t{100003}}) {
        std::vector<double> sum(count), low(count);
        for (int64_t i = 0; i < count; ++i) {
          sum[i] = static_cast<double>(i % 97) * (me + 1);
          low[i] = static_cast<double>((i + me) % 11);
        }
        HORA_RETURN_IF_ERROR(
            comm.Allreduce(nullptr, sum.data(), count, DataType::kFloat64, ReduceOp::kSum));
        std::vector<double> low_out(count);
        HORA_RETURN_IF_ERROR(
            comm.Allreduce(low.data(), low_out.data(), count, DataType::kFloat64, ReduceOp::kMin));
        const double ranks_sum = size * (size + 1) / 2.0;
        for (int64_t i = 0; i < count; ++i) {
          if (sum[i] != static_cast<double>(i % 97) * ranks_sum) {
            return Status::Internal("allreduce sum at " + std::to_string(i));
          }
          double want = 1e9;
          for (int k = 0; k < size; ++k) want = std::min(want, static_cast<double>((i + k) % 11));
          if (low_out[i] != want) return Status::Internal("allreduce min at " + std::to_string(i));
        }
      }
      // Reduce-scatter with uneven counts, one of them empty.
      std::vector<int64_t> counts(size);
      for (int k = 0; k < size; ++k) counts[k] = k == 1 ? 0 : 1000 + 37 * k;
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      std::vector<int32_t> all(total);
      for (int64_t i = 0; i < total; ++i) all[i] = static_cast<int32_t>(i + me);
      std::vector<int32_t> mine(counts[me]);
      HORA_RETURN_IF_ERROR(
          comm.ReduceScatter(all.data(), mine.data(), counts, DataType::kInt32, ReduceOp::kSum));
      int64_t offset = 0;
      for (int k = 0; k < me; ++k) offset += counts[k];
      for (int64_t i = 0; i < counts[me]; ++i) {
        if (mine[i] != static_cast<int32_t>(size * (offset + i) + size * (size - 1) / 2)) {
          return Status::Internal("reduce-scatter at " + std::to_string(i));
        }
      }
      // Allgatherv: rank k gives k * 1000 + 1 bytes of value k.
      std::vector<int64_t> lengths(size);
      for (int k = 0; k < size; ++k) lengths[k] = k * 1000 + 1;
      std::string given(static_cast<size_t>(lengths[me]), static_cast<char>(me));
      std::string gathered(std::accumulate(lengths.begin(), lengths.end(), int64_t{0}), '\0');
      HORA_RETURN_IF_ERROR(comm.Allgatherv(given.data(), lengths[me], &gathered[0], lengths));
      int64_t at = 0;
      for (int k = 0; k < size; ++k) {
        for (int64_t i = 0; i < lengths[k]; ++i) {
          if (gathered[at++] != static_cast<char>(k)) return Status::Internal("allgatherv");
        }
      }
      // Alltoallv: rank me sends (me + 1) * (k + 1) bytes of value me to rank k.
      std::vector<int64_t> send_bytes(size), recv_bytes(size);
      std::string out;
      for (int k = 0; k < size; ++k) {
        send_bytes[k] = (me + 1) * (k + 1);
        recv_bytes[k] = (k + 1) * (me + 1);
        out += std::string(static_cast<size_t>(send_bytes[k]), static_cast<char>(me));
      }
      std::string in(std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0}), '\0');
      HORA_RETURN_IF_ERROR(comm.Alltoallv(out.data(), send_bytes, &in[0], recv_bytes));
      at = 0;
      for (int k = 0; k < size; ++k) {
        for (int64_t i = 0; i < recv_bytes[k]; ++i) {
          if (in[at++] != static_cast<char>(k)) return Status::Internal("alltoallv");
        }
      }
      std::vector<std::string> texts;
      HORA_RETURN_IF_ERROR(comm.GatherBytes(std::string(me, 'x'), size - 1, &texts));
      if (me == size - 1) {
        for (int k = 0; k < size; ++k) {
          if (texts[k] != std::string(k, 'x')) return Status::Internal("gather bytes");
        }
      }
      std::string text = me == size / 2 ? "from the middle" : "";
      HORA_RETURN_IF_ERROR(comm.BroadcastBytes(&text, size / 2));
      if (text != "from the middle") return Status::Internal("broadcast bytes");
      uint64_t bits[2] = {me == 0 ? 0b1010u : 0b1110u, ~uint64_t{0}};
      HORA_RETURN_IF_ERROR(comm.AllreduceBitAnd(bits, 2));
      if (bits[0] != 0b1010u || bits[1] != ~uint64_t{0}) return Status::Internal("bit and");
      return comm.Barrier();
    });
    EXPECT_EQ(Failures(results), "") << size << " ranks";
  }
}

TEST(TcpCommunicator, MessagesKeepTheirOrderPerSourceAndTag) {
  const std::vector<Status> results = RunTcp(2, 0, [](std::unique_ptr<TcpCommunicator>& c) {
    Communicator& comm = *c;
    constexpr int kMessages = 20;
    constexpr int64_t kBytes = 1 << 20;  // past the sockets' buffers
    if (comm.rank() == 0) {
      // Interleaved on two tags, all posted before rank 1 asks for any.
      std::vector<std::vector<char>> data;
      for (int i = 0; i < kMessages; ++i) data.emplace_back(kBytes, static_cast<char>(i));
      for (int i = 0; i < kMessages; ++i) {
        int id;
        HORA_RETURN_IF_ERROR(comm.PostSend(data[i].data(), kBytes, 1, i % 2, &id));
      }
      HORA_RETURN_IF_ERROR(comm.WaitAll());
      return comm.Barrier();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<std::vector<char>> got(kMessages, std::vector<char>(kBytes));
    // Tag 1 first: its messages are found behind those of tag 0.
    std::vector<int> ids;
    for (int tag : {1, 0}) {
      for (int i = tag; i < kMessages; i += 2) {
        int id;
        HORA_RETURN_IF_ERROR(comm.PostRecv(got[i].data(), kBytes, 0, tag, &id));
        ids.push_back(id);
      }
    }
    for (int id : ids) HORA_RETURN_IF_ERROR(comm.Wait(id));
    for (int i = 0; i < kMessages; ++i) {
      if (got[i].front() != static_cast<char>(i) || got[i].back() != static_cast<char>(i)) {
        return Status::Internal("message " + std::to_string(i) + " out of order");
      }
    }
    return comm.Barrier();
  });
  EXPECT_EQ(Failures(results), "");
}

// A process whose thread keeps waiting on requests that are done at once
// (here: messages to itself) never polls the sockets itself; its progress
// thread must still drain them, or a peer's large send would wait for it.
TEST(TcpCommunicator, ABusyProcessStillDrainsItsSockets) {
  std::atomic<bool> sent{false};
  std::atomic<int64_t> send_ms{-1};
  const std::vector<Status> results = RunTcp(2, 0, [&](std::unique_ptr<TcpCommunicator>& c) {
    Communicator& comm = *c;
    constexpr int64_t kBytes = 64 << 20;  // far past the sockets' buffers
    constexpr int kTag = 7;
    if (comm.rank() == 0) {
      std::vector<char> data(kBytes, 'x');
      const auto began = std::chrono::steady_clock::now();
      int id;
      HORA_RETURN_IF_ERROR(comm.PostSend(data.data(), kBytes, 1, kTag, &id));
      HORA_RETURN_IF_ERROR(comm.Wait(id));
      send_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - began)
                    .count();
      sent = true;
      return comm.Barrier();
    }
    const auto began = std::chrono::steady_clock::now();
    char one = 1, back = 0;
    while (!sent && std::chrono::steady_clock::now() - began < std::chrono::seconds(5)) {
      int to_self, from_self;
      HORA_RETURN_IF_ERROR(comm.PostSend(&one, 1, 1, kTag + 1, &to_self));
      HORA_RETURN_IF_ERROR(comm.PostRecv(&back, 1, 1, kTag + 1, &from_self));
      HORA_RETURN_IF_ERROR(comm.Wait(to_self));
      HORA_RETURN_IF_ERROR(comm.Wait(from_self));
    }
    std::vector<char> got(kBytes);
    int id;
    HORA_RETURN_IF_ERROR(comm.PostRecv(got.data(), kBytes, 0, kTag, &id));
    HORA_RETURN_IF_ERROR(comm.Wait(id));
    if (got.front() != 'x' || got.back() != 'x') return Status::Internal("wrong bytes");
    return comm.Barrier();
  });
  EXPECT_EQ(Failures(results), "");
  // while rank 1 kept busy, not once it stopped after 5 s
  EXPECT_GE(send_ms.load(), 0);
  EXPECT_LT(send_ms.load(), 3000);
}

TEST(TcpCommunicator, ProcessSetsRunOnThreadsOfTheirOwn) {
  // Ranks {0, 1} and {1, 2} as process sets: rank 1 drives both at once.
  const std::vector<Status> results = RunTcp(3, 0, [](std::unique_ptr<TcpCommunicator>& c) {
    std::unique_ptr<Communicator> first, second;
    HORA_RETURN_IF_ERROR(c->Split({0, 1}, &first));
    HORA_RETURN_IF_ERROR(c->Split({1, 2}, &second));
    auto drive = [](Communicator* set, int value, Status* status) {
      for (int round = 0; round < 50 && status->ok(); ++round) {
        std::vector<int64_t> data(50000, value + round);
        *status = set->Allreduce(nullptr, data.data(), 50000, DataType::kInt64, ReduceOp::kSum);
        if (status->ok() && data[49999] != 2 * (value + round)) {
          *status = Status::Internal("process set sum");
        }
      }
    };
    Status a, b;
    std::thread other;
    if (first) other = std::thread(drive, first.get(), 1, &a);
    if (second) drive(second.get(), 7, &b);
    if (other.joinable()) other.join();
    HORA_RETURN_IF_ERROR(a);
    HORA_RETURN_IF_ERROR(b);
    return c->Barrier();
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(TcpCommunicator, ALostPeerIsNamedToTheSurvivors) {
  const std::vector<Status> results = RunTcp(3, 0, [](std::unique_ptr<TcpCommunicator>& c) {
    if (c->rank() == 2) {
      c.reset();  // its connections close, as when its process dies
      return Status::OK();
    }
    std::vector<float> data(1 << 20, 1.0f);
    Status status = c->Allreduce(nullptr, data.data(), 1 << 20, DataType::kFloat32, ReduceOp::kSum);
    if (status.ok()) return Status::Internal("an allreduce without rank 2 succeeded");
    // As the engine does after a failure: the survivors revoke the world,
    // whose streams are out of step now, and every later call fails.
    c->Revoke();
    Status later = c->Allreduce(nullptr, data.data(), 1 << 20, DataType::kFloat32, ReduceOp::kSum);
    if (later.ok() || !Contains(later, "revoked")) {
      return Status::Internal("a later allreduce: " + later.message());
    }
    return status;
  });
  EXPECT_TRUE(results[2].ok());
  for (int r : {0, 1}) {
    EXPECT_TRUE(Contains(results[r], "rank 2 (host host0)")) << results[r].message();
  }
}

TEST(TcpCommunicator, RevokeFailsPendingCallsOnEveryRank) {
  std::atomic<int> waiting{0};
  const std::vector<Status> results = RunTcp(3, 0, [&](std::unique_ptr<TcpCommunicator>& c) {
    if (c->rank() == 0) {
      while (waiting.load() < 2) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      c->Revoke();
      char byte;
      return c->Broadcast(&byte, 1, 0);
    }
    ++waiting;
    // Waits for a broadcast rank 0 never starts.
    char byte;
    return c->Broadcast(&byte, 1, 0);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(Contains(results[r], "revoked")) << r << ": " << results[r].message();
    EXPECT_TRUE(Contains(results[r], "rank 0")) << r << ": " << results[r].message();
  }
}

TEST(TcpCommunicator, AMessageLargerThanItsReceiveIsAnError) {
  const std::vector<Status> results = RunTcp(2, 0, [](std::unique_ptr<TcpCommunicator>& c) {
    std::vector<char> data(1000, 'a');
    int id;
    if (c->rank() == 0) {
      HORA_RETURN_IF_ERROR(c->PostSend(data.data(), 1000, 1, 3, &id));
      HORA_RETURN_IF_ERROR(c->Wait(id));
      return c->Barrier();
    }
    HORA_RETURN_IF_ERROR(c->PostRecv(data.data(), 10, 0, 3, &id));
    Status status = c->Wait(id);
    HORA_RETURN_IF_ERROR(c->Barrier());  // the stream is still in step
    return status;
  });
  EXPECT_TRUE(results[0].ok()) << results[0].message();
  EXPECT_TRUE(Contains(results[1], "1000 bytes from rank 0")) << results[1].message();
}

}  // namespace
}  // namespace hora
