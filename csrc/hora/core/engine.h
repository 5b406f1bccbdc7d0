#pragma once
// The engine owns the one background thread per process.
//
// Why a thread at all: collectives must be issued in the same order on every
// rank, but frameworks produce gradients in whatever order their autograd
// or graph executor likes, on whatever thread. The engine thread decouples
// the two: callers only enqueue and get a Work back; the thread negotiates an
// order with the other ranks, fuses, and runs the transport calls. Having
// exactly one also keeps every MPI call on a single thread.
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "hora/comm/communicator.h"
#include "hora/comm/wakeup/wakeup_channel.h"
#include "hora/core/config.h"
#include "hora/core/controller.h"
#include "hora/core/executor.h"
#include "hora/core/tensor_queue.h"

namespace hora {

class Engine {
 public:
  // Takes over `comm` and starts the background thread; collective over
  // the communicator's ranks.
  static Status Start(std::unique_ptr<Communicator> comm, const Config& config,
                      std::unique_ptr<Engine>* out);
  ~Engine();

  Status Enqueue(std::vector<TensorEntry> entries);
  // Starts this rank's join; the Work completes once every rank has joined,
  // with join_last_rank set.
  Status Join(std::shared_ptr<Work>* work);
  // Stops the thread (telling the other ranks) and fails whatever is still
  // pending. Idempotent.
  void Shutdown();

  const Topology& topology() const { return comm_->topology(); }
  const Config& config() const { return config_; }
  std::string TransportDescription() const { return comm_->Describe(); }

 private:
  Engine(std::unique_ptr<Communicator> comm, const Config& config);
  void Loop();
  bool HasLocalWork() const;
  // Returns false when the engine must stop.
  bool RunOneCycle();
  void Stop(const Status& reason);

  std::unique_ptr<Communicator> comm_;
  Config config_;
  std::unique_ptr<WakeupChannel> wakeup_;
  TensorQueue queue_;
  Controller controller_;
  Executor executor_;
  std::thread thread_;

  std::mutex join_mutex_;
  std::shared_ptr<Work> join_work_;
  std::atomic<bool> join_requested_{false};
  bool join_announced_ = false;  // engine thread only
  std::atomic<bool> shutdown_requested_{false};
  bool shutdown_announced_ = false;  // engine thread only
  std::mutex shutdown_mutex_;
  bool stopped_ = false;
};

}  // namespace hora
