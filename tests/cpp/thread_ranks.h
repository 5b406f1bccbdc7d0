#pragma once
// Worlds of ranks played by threads of the test process, and a runner of a
// function once per rank on its own thread.
//
// The transport is the in-process one, or hora's TCP transport over
// loopback connections when HORA_TEST_TRANSPORT=tcp (ctest runs the suite
// both ways, so every engine test also checks the TCP transport).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hora/comm/local/local_communicator.h"
#include "hora/comm/tcp/tcp_communicator.h"

namespace hora {
namespace testing {

inline bool OverTcp() {
  const char* transport = std::getenv("HORA_TEST_TRANSPORT");
  return transport != nullptr && std::strcmp(transport, "tcp") == 0;
}

// `timeout`: how long the in-process transport waits for a rank that never
// sends (a TCP peer that never sends is a hang, which ctest's limit ends).
inline std::vector<std::unique_ptr<Communicator>> CreateWorld(
    int size, int ranks_per_host = 0,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(60000)) {
  std::vector<std::unique_ptr<Communicator>> comms;
  if (OverTcp()) {
    std::vector<std::unique_ptr<TcpCommunicator>> tcp;
    const Status status = TcpCommunicator::CreateLoopbackWorld(size, ranks_per_host, &tcp);
    if (!status.ok()) {
      std::fprintf(stderr, "TCP world of %d ranks: %s\n", size, status.message().c_str());
      std::abort();
    }
    for (auto& comm : tcp) comms.push_back(std::move(comm));
    return comms;
  }
  auto local = LocalCommunicator::CreateWorld(size, ranks_per_host);
  if (!local.empty()) local[0]->SetTimeout(timeout);
  for (auto& comm : local) comms.push_back(std::move(comm));
  return comms;
}

inline std::vector<Status> RunRanks(int size, int ranks_per_host,
                                    const std::function<Status(Communicator& comm)>& body) {
  std::vector<std::unique_ptr<Communicator>> comms = CreateWorld(size, ranks_per_host);
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { results[r] = body(*comms[r]); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// "rank 1: <message>" for every rank that failed; empty when all succeeded.
inline std::string Failures(const std::vector<Status>& results) {
  std::string text;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) text += "rank " + std::to_string(r) + ": " + results[r].message() + "\n";
  }
  return text;
}

}  // namespace testing
}  // namespace hora
