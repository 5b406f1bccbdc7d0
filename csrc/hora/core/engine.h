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
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hora/comm/communicator.h"
#include "hora/comm/wakeup/heartbeat.h"
#include "hora/comm/wakeup/wakeup_channel.h"
#include "hora/core/autotuner.h"
#include "hora/core/config.h"
#include "hora/core/controller.h"
#include "hora/core/executor.h"
#include "hora/core/process_set.h"
#include "hora/core/process_set_table.h"
#include "hora/core/tensor_queue.h"
#include "hora/core/timeline.h"

namespace hora {

// What makes a process set's engine differ from the job's.
struct ProcessSetEngineOptions {
  int32_t id = 0;
  std::vector<int> ranks;        // the job's ranks; the set's rank k is ranks[k]
  Timeline* timeline = nullptr;  // the job's: the set's rows go there
  EngineParameters parameters;   // the job's settings when the set is made
};

class Engine {
 public:
  // Takes over `comm` and starts the background thread; collective over
  // the communicator's ranks.
  static Status Start(std::unique_ptr<Communicator> comm, const Config& config,
                      std::unique_ptr<Engine>* out);
  // The engine of a process set, over the set's communicator; collective
  // over the set's ranks. Its errors and reports name the job's ranks.
  static Status StartProcessSet(std::unique_ptr<Communicator> comm, const Config& config,
                                const ProcessSetEngineOptions& options,
                                std::unique_ptr<Engine>* out);
  ~Engine();

  // Into this engine's queue; a collective on a process set goes to the
  // engine that process_sets().Route() names, with the set's ranks
  // (broadcast roots, alltoall splits).
  Status Enqueue(std::vector<TensorEntry> entries) { return queue_.Add(std::move(entries)); }
  Status EnqueueOne(TensorEntry entry) { return queue_.AddOne(std::move(entry)); }

  // The job's process sets (the job's engine only; a set's engine has none).
  const ProcessSetTable& process_sets() const { return *sets_; }
  // Adds a set of these (global) ranks, or removes set `id`: collective over
  // the job, called by every rank in the same order. The Work completes
  // once every rank has made the change (process_set_id holds a new set's
  // id), or with the error every rank raises (ranks that differ between
  // ranks, a duplicate set, an unknown id).
  Status AddProcessSet(const std::vector<int>& ranks, std::shared_ptr<Work>* work);
  Status RemoveProcessSet(int32_t id, std::shared_ptr<Work>* work);
  // Starts this rank's join; the Work completes once every rank has joined,
  // with join_last_rank set.
  Status Join(std::shared_ptr<Work>* work);
  // Stops the thread (telling the other ranks) and fails whatever is still
  // pending, and the engines of this rank's process sets. Idempotent.
  void Shutdown();
  // Any thread: the job is broken in a way the engine thread may not see
  // (it can be stuck in a transport call with a stopped rank). Fails what
  // is pending here and in this rank's process sets with `reason`, and
  // tells the thread to stop. Shutdown then waits only briefly for it.
  void Abort(const Status& reason);
  // Whether Shutdown had to leave the thread behind, stuck in a transport
  // call; the engine must then stay alive (Release does that).
  bool ThreadLeftRunning() const { return thread_left_running_; }
  // Shuts `engine` down and drops it, or keeps it for the rest of the
  // process when its thread could not be stopped.
  static void Release(std::shared_ptr<Engine> engine);
  // After Shutdown: the communicator (null when the thread was left
  // behind, still using it). The wake-up channel closes with it, so that
  // a peer idle on that channel (not inside a transport call, which a
  // revoke would end) learns that this rank has left the world.
  std::unique_ptr<Communicator> TakeCommunicator() {
    if (thread_left_running_) return nullptr;
    wakeup_.reset();
    return std::move(comm_);
  }
  // Whether an engine of this process stopped because the job broke (a
  // lost rank, a stall past the shutdown time, a transport error) rather
  // than by shutdown(). MPI_Finalize would then wait for ranks that will
  // never come, so the process must exit without it. A later successful
  // init (all ranks together) clears it.
  static bool JobBroken();

  const Topology& topology() const { return comm_->topology(); }
  const Config& config() const { return config_; }
  std::string TransportDescription() const { return comm_->Describe(); }
  // For what may run beside the engine thread on the same transport
  // (Communicator::StartSpawn and Merge).
  Communicator* communicator() const { return comm_.get(); }
  // The timeline is written by rank 0; on other ranks these do nothing.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();
  // The settings in effect, and every change with the cycle it took effect
  // on (autotuning); the same on every rank.
  struct ParameterChange {
    uint64_t cycle;
    EngineParameters parameters;
  };
  EngineParameters parameters() const;
  // Rank 0: whether autotuning is still searching.
  bool autotuning() const { return autotuner_ && autotuner_->active(); }
  std::vector<ParameterChange> parameter_history() const;

 private:
  Engine(std::unique_ptr<Communicator> comm, const Config& config);
  // Start and StartProcessSet (`set` null for the job's engine).
  static Status Launch(std::unique_ptr<Communicator> comm, const Config& config,
                       const ProcessSetEngineOptions* set, std::unique_ptr<Engine>* out);
  void Loop();
  bool HasLocalWork() const;
  // The error for a lost peer (and, on rank 0, the notice to the others).
  Status LostRank(const WakeupChannel::Events& events);
  // Runs one cycle, then more back to back while rank 0 says to stay hot.
  // Returns false when the engine must stop.
  bool RunCycles();
  bool RunOneCycle(bool* go_idle);
  void Stop(const Status& reason);
  // Stop for a job that broke on this rank (a lost peer, a transport error,
  // a stopped rank): revokes the communicator first, so that the other
  // ranks' calls with this one fail at once instead of waiting (ULFM).
  void Break(const Status& reason);
  void Apply(const EngineParameters& parameters);
  Status SubmitSetChange(CollectiveKind kind, std::vector<int64_t> payload,
                         std::shared_ptr<Work>* work);

  std::unique_ptr<Communicator> comm_;
  Config config_;
  Timeline timeline_;  // before the controller and executor, which use it
  std::unique_ptr<WakeupChannel> wakeup_;
  TensorQueue queue_;
  Controller controller_;
  Executor executor_;
  std::thread thread_;
  std::unique_ptr<Heartbeat> heartbeat_;  // the job's engine, with stall checks on
  std::atomic<bool> aborted_{false};
  std::mutex loop_mutex_;
  std::condition_variable loop_cv_;
  bool loop_done_ = false;  // under loop_mutex_
  bool thread_left_running_ = false;
  // Spinning (back-to-back cycles while callers wait for results, and for
  // spin_window_ after) is rank 0's decision. Nobody waiting means the
  // callers are computing, and a spinning engine would only steal their core.
  std::chrono::microseconds spin_window_{0};
  bool spin_allowed_ = false;             // no oversubscription, more than one rank
  double cycle_time_ms_ = 0.0;            // engine thread's copy of parameters_
  std::unique_ptr<Autotuner> autotuner_;  // rank 0, HORA_AUTOTUNE=1
  mutable std::mutex parameters_mutex_;
  EngineParameters parameters_;
  std::vector<ParameterChange> parameter_history_;
  std::chrono::steady_clock::time_point last_wait_;
  bool hot_ = false;  // the last cycle asked for another one at once
  struct Stats {
    uint64_t cycles = 0;
    uint64_t working_cycles = 0;
    std::chrono::steady_clock::duration negotiation{0};
    std::chrono::steady_clock::duration execution{0};
  } stats_;                 // engine thread only; logged at debug level on shutdown
  int pending_starts_ = 0;  // other ranks: cycles rank 0 has started
  int pending_wants_ = 0;   // rank 0: cycles other ranks asked for

  // The job's engine: the process sets, changed by this thread between
  // cycles; add/remove calls on this rank (their names).
  std::unique_ptr<ProcessSetTable> sets_;
  std::atomic<uint64_t> set_changes_{0};
  std::vector<Executor::SetChange> pending_set_changes_;  // engine thread

  std::mutex join_mutex_;
  std::shared_ptr<Work> join_work_;
  std::atomic<bool> join_requested_{false};
  bool join_announced_ = false;  // engine thread only
  std::atomic<bool> shutdown_requested_{false};
  bool shutdown_announced_ = false;  // engine thread only
  // A process set's engine: what its pending collectives fail with when the
  // set goes away (removed, or hora shut down); empty for the job's engine.
  std::string set_gone_;
  std::mutex shutdown_mutex_;
  bool stopped_ = false;
};

}  // namespace hora
