#pragma once
// Runs a function once per rank, each on its own thread, over a fresh
// in-process world; returns each rank's Status.
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hora/comm/local/local_communicator.h"

namespace hora {
namespace testing {

inline std::vector<Status> RunRanks(int size, int ranks_per_host,
                                    const std::function<Status(Communicator& comm)>& body) {
  std::vector<std::unique_ptr<LocalCommunicator>> comms =
      LocalCommunicator::CreateWorld(size, ranks_per_host);
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
