#include "hora/core/engine.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "hora/algo/kernels/kernel_set.h"
#include "hora/common/backoff.h"
#include "hora/common/logging.h"

namespace hora {

namespace {

std::atomic<bool> g_job_broken{false};

// Whether waits may spin while a caller of this process is blocked (see
// Engine::Launch); the job's engine sets it, every engine reads it.
std::atomic<bool> g_spin_waits_allowed{true};

std::string RankList(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << (ranks.size() > 1 ? "ranks " : "rank ");
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  return s.str();
}

}  // namespace

Engine::Engine(std::unique_ptr<Communicator> comm, const Config& config)
    : comm_(std::move(comm)),
      config_(config),
      queue_([this] {
        if (wakeup_) wakeup_->NotifyLocal();
      }),
      controller_(comm_.get(), config, &timeline_),
      executor_(comm_.get(), &queue_, config, &timeline_) {}

Status Engine::StartTimeline(const std::string& path, bool mark_cycles) {
  if (comm_->rank() != 0) return Status::OK();
  return timeline_.Start(path, mark_cycles, static_cast<size_t>(config_.timeline_queue_events));
}

void Engine::StopTimeline() { timeline_.Stop(); }

void Engine::Apply(const EngineParameters& parameters) {
  executor_.SetFusionThreshold(parameters.fusion_threshold_bytes);
  executor_.SetHierarchical(parameters.hierarchical);
  cycle_time_ms_ = parameters.cycle_time_ms;
  spin_window_ = parameters.cycle_time_ms == 0 && spin_allowed_
                     ? std::chrono::microseconds(config_.spin_us)
                     : std::chrono::microseconds(0);
  std::lock_guard<std::mutex> lock(parameters_mutex_);
  parameters_ = parameters;
  parameter_history_.push_back({stats_.cycles, parameters});
}

EngineParameters Engine::parameters() const {
  std::lock_guard<std::mutex> lock(parameters_mutex_);
  return parameters_;
}

std::vector<Engine::ParameterChange> Engine::parameter_history() const {
  std::lock_guard<std::mutex> lock(parameters_mutex_);
  return parameter_history_;
}

Status Engine::Start(std::unique_ptr<Communicator> comm, const Config& config,
                     std::unique_ptr<Engine>* out) {
  return Launch(std::move(comm), config, nullptr, out);
}

Status Engine::StartProcessSet(std::unique_ptr<Communicator> comm, const Config& config,
                               const ProcessSetEngineOptions& options,
                               std::unique_ptr<Engine>* out) {
  // The job's engine tunes and writes the timeline; a set takes the job's
  // settings as they are when it is made.
  Config set_config = config;
  set_config.autotune = false;
  set_config.timeline_path.clear();
  set_config.fusion_threshold_bytes = options.parameters.fusion_threshold_bytes;
  set_config.cycle_time_ms = options.parameters.cycle_time_ms;
  // A forced path the set's ranks cannot take (shared memory across hosts,
  // the hierarchy on hosts with different numbers of the set's ranks)
  // falls back to the automatic choice for this set; every member sees
  // the same topology, so all fall back alike.
  const Topology& t = comm->topology();
  const bool hierarchy = t.homogeneous && comm->local() != nullptr && comm->cross() != nullptr;
  if ((config.allreduce_algorithm == AllreduceAlgorithm::kShm && t.local_size != t.size) ||
      (config.allreduce_algorithm == AllreduceAlgorithm::kHierarchical && !hierarchy)) {
    HORA_LOG(kInfo) << DescribeProcessSet(options.id, options.ranks)
                    << ": HORA_ALLREDUCE_ALGORITHM="
                    << AllreduceAlgorithmName(config.allreduce_algorithm)
                    << " does not fit its ranks' hosts; the set chooses automatically";
    set_config.allreduce_algorithm = AllreduceAlgorithm::kAuto;
  }
  return Launch(std::move(comm), set_config, &options, out);
}

Status Engine::Launch(std::unique_ptr<Communicator> comm, const Config& config,
                      const ProcessSetEngineOptions* set, std::unique_ptr<Engine>* out) {
  std::unique_ptr<Engine> engine(new Engine(std::move(comm), config));
  if (set) {
    const std::string name = DescribeProcessSet(set->id, set->ranks);
    engine->timeline_.ForwardTo(set->timeline, " [process set " + std::to_string(set->id) + "]");
    engine->controller_.SetRankNames(set->ranks, " in " + name);
    engine->set_gone_ = name + " was removed, or hora was shut down, while this collective waited";
  }
  HORA_RETURN_IF_ERROR(WakeupChannel::Create(engine->comm_.get(), &engine->wakeup_)
                           .WithContext("starting the engine"));
  if (!set && (config.stall_check || config.stall_shutdown_seconds > 0)) {
    // One heartbeat per process: a stopped process is stopped for every
    // process set too.
    using Ms = std::chrono::milliseconds;
    auto ms = [](double seconds) { return Ms(static_cast<int64_t>(seconds * 1000.0)); };
    Heartbeat::Options beat;
    beat.warn = config.stall_check ? ms(config.stall_warning_seconds) : Ms::max();
    beat.stop = ms(config.stall_shutdown_seconds);
    const Ms first = beat.stop.count() > 0 ? std::min(beat.warn, beat.stop) : beat.warn;
    beat.interval = std::max(Ms(100), std::min(Ms(1000), first / 10));
    Engine* raw = engine.get();
    HORA_RETURN_IF_ERROR(Heartbeat::Start(
                             engine->comm_.get(), beat,
                             [raw](const Status& reason) { raw->Abort(reason); },
                             &engine->heartbeat_)
                             .WithContext("starting the engine"));
  }
  HORA_RETURN_IF_ERROR(SelectKernels(config.cpu_kernels));
  AllreduceSettings settings;
  settings.algorithm = config.allreduce_algorithm;
  settings.small_allreduce_bytes = config.small_allreduce_bytes;
  settings.shm_slot_bytes = config.shm_slot_bytes;
  std::unique_ptr<AllreduceRouter> router;
  HORA_RETURN_IF_ERROR(AllreduceRouter::Create(engine->comm_.get(), settings, &router));
  engine->executor_.SetRouter(std::move(router));
  if (!set) {
    engine->sets_.reset(new ProcessSetTable(engine->comm_.get(), config, &engine->timeline_));
  }
  if (engine->comm_->rank() == 0) {
    HORA_LOG(kDebug) << (set ? DescribeProcessSet(set->id, set->ranks) + ": engine" : "engine")
                     << " started on " << engine->comm_->size() << " ranks over "
                     << engine->comm_->Describe() << "; " << config.Describe() << "; "
                     << engine->executor_.router()->Describe();
  }
  // Back-to-back cycles only pay off when every rank has a core to itself
  // and no minimum cycle spacing was asked for.
  const Topology& t = engine->comm_->topology();
  const bool oversubscribed = t.local_size > static_cast<int>(std::thread::hardware_concurrency());
  engine->spin_allowed_ = !oversubscribed && t.size > 1;
  if (set == nullptr) {
    // Spinning while a caller waits takes a core nobody else needs only
    // when every rank of the host has one of its own, and HORA_SPIN_US=0
    // says they do not. Decided once for the process from the whole job,
    // since every engine (one per process set) sets the flag it reads.
    g_spin_waits_allowed.store(!oversubscribed && config.spin_us > 0, std::memory_order_relaxed);
  }
  EngineParameters initial;
  initial.fusion_threshold_bytes = config.fusion_threshold_bytes;
  initial.cycle_time_ms = config.cycle_time_ms;
  if (set) initial.hierarchical = set->parameters.hierarchical;
  engine->Apply(initial);
  engine->parameter_history_.clear();  // the history holds changes only
  if (config.autotune && engine->comm_->rank() == 0) {
    engine->autotuner_.reset(
        new Autotuner(config, initial, engine->executor_.router()->HierarchicalAvailable()));
  }
  if (!config.timeline_path.empty()) {
    // Only rank 0 opens the file: failing init there alone would leave the
    // other ranks waiting for it, so a bad path is reported, not fatal.
    Status timeline = engine->StartTimeline(config.timeline_path, config.timeline_mark_cycles);
    if (!timeline.ok()) {
      HORA_LOG(kError) << "HORA_TIMELINE: " << timeline.message();
    }
  }
  // Every rank made it through a new init together: MPI works again.
  if (!set) g_job_broken = false;
  Engine* raw = engine.get();
  engine->thread_ = std::thread([raw] { raw->Loop(); });
  *out = std::move(engine);
  return Status::OK();
}

Engine::~Engine() { Shutdown(); }

Status Engine::SubmitSetChange(CollectiveKind kind, std::vector<int64_t> payload,
                               std::shared_ptr<Work>* work) {
  TensorEntry entry;
  entry.request.kind = kind;
  // Every rank calls add/remove in the same order: the n-th change has the
  // same name everywhere, and the coordinator compares what each rank asked.
  entry.request.name =
      std::string(CollectiveKindName(kind)) + "#" + std::to_string(set_changes_.fetch_add(1) + 1);
  entry.request.dtype = DataType::kInt64;
  entry.request.shape = std::move(payload);
  entry.input.dtype = DataType::kInt64;
  entry.work = std::make_shared<Work>();
  *work = entry.work;
  return queue_.AddOne(std::move(entry));
}

Status Engine::AddProcessSet(const std::vector<int>& ranks, std::shared_ptr<Work>* work) {
  return SubmitSetChange(CollectiveKind::kAddProcessSet,
                         std::vector<int64_t>(ranks.begin(), ranks.end()), work);
}

Status Engine::RemoveProcessSet(int32_t id, std::shared_ptr<Work>* work) {
  return SubmitSetChange(CollectiveKind::kRemoveProcessSet, {id}, work);
}

Status Engine::Join(std::shared_ptr<Work>* work) {
  std::lock_guard<std::mutex> lock(join_mutex_);
  if (join_work_) return Status::InvalidArgument("join() is already in progress on this rank");
  {
    std::lock_guard<std::mutex> stop_lock(shutdown_mutex_);
    if (stopped_) return Status::Shutdown("hora has been shut down");
  }
  join_work_ = std::make_shared<Work>();
  join_work_->SetActivity(queue_.shared_activity());
  *work = join_work_;
  join_requested_ = true;
  wakeup_->NotifyLocal();
  return Status::OK();
}

void Engine::Shutdown() {
  shutdown_requested_ = true;
  if (wakeup_) wakeup_->NotifyLocal();
  if (thread_.joinable()) {
    // An aborted engine's thread may be stuck in a transport call with a
    // stopped rank, which nothing can interrupt: give it a moment to see
    // the abort, then leave it (the process is about to end, without
    // MPI_Finalize, see JobBroken).
    constexpr auto kAbortGrace = std::chrono::seconds(2);
    std::unique_lock<std::mutex> lock(loop_mutex_);
    loop_cv_.wait(lock, [this] { return loop_done_ || aborted_.load(); });
    if (!loop_done_) loop_cv_.wait_for(lock, kAbortGrace, [this] { return loop_done_; });
    const bool done = loop_done_;
    lock.unlock();
    if (done) {
      thread_.join();
      using Ms = std::chrono::duration<double, std::milli>;
      HORA_LOG(kDebug) << "engine: " << stats_.cycles << " cycles (" << stats_.working_cycles
                       << " with work), " << Ms(stats_.negotiation).count() << " ms negotiating, "
                       << Ms(stats_.execution).count() << " ms running collectives";
    } else {
      HORA_LOG(kDebug) << "engine: leaving its thread inside a transport call after the abort";
      thread_.detach();
      thread_left_running_ = true;
    }
  }
  heartbeat_.reset();
  Stop(Status::Shutdown(set_gone_.empty() ? "hora has been shut down on this rank" : set_gone_));
  timeline_.Stop();
  // This rank's process sets stop with the job (each tells its members).
  if (sets_) sets_->Clear();
}

void Engine::Abort(const Status& reason) {
  HORA_LOG(kError) << reason.message();
  aborted_ = true;
  Break(reason);
  if (sets_) sets_->Abort(reason);
  if (wakeup_) wakeup_->NotifyLocal();
  std::lock_guard<std::mutex> lock(loop_mutex_);
  loop_cv_.notify_all();
}

void Engine::Release(std::shared_ptr<Engine> engine) {
  engine->Shutdown();
  if (!engine->ThreadLeftRunning()) return;
  // Its thread still uses it: keep it for the rest of the process, without
  // the heartbeat calling its collective a transport fault.
  engine->executor_.Abandon();
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<Engine>>();
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(engine));
}

bool Engine::JobBroken() { return g_job_broken.load(); }

void Engine::Stop(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(shutdown_mutex_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (reason.code() != StatusCode::kShutdown) g_job_broken = true;
  queue_.Close(reason);
  queue_.FailAll(reason);
  std::lock_guard<std::mutex> lock(join_mutex_);
  if (join_work_) {
    join_work_->Complete(reason);
    join_work_.reset();
  }
}

void Engine::Break(const Status& reason) {
  comm_->Revoke();
  Stop(reason);
}

bool Engine::HasLocalWork() const {
  return queue_.HasNewRequests() || controller_.HasUnsentRequests() ||
         join_requested_.load() != join_announced_ ||
         shutdown_requested_.load() != shutdown_announced_;
}

// A safety net for liveness: an engine whose rank has collectives in flight
// never sleeps longer than this without a cycle. Every wake-up is accounted
// for (a rank with new work asks rank 0, which starts the cycle everywhere),
// so in a healthy job the net never fires while work is moving; once, in an
// oversubscribed two-host CI job, a collective waited for a cycle that
// nobody asked for until the next collective came. Waiting for a slow rank
// costs one small cycle per nap.
constexpr int kNudgeMs = 250;

void Engine::Loop() {
  // Naps while waiting for peers are a few microseconds; the default 50 us
  // timer slack would stretch each of them.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  // Named so that top -H, perf and py-spy tell it from the caller's threads.
  prctl(PR_SET_NAME, "hora-engine", 0, 0, 0);
  struct Done {
    Engine* engine;
    ~Done() {
      std::lock_guard<std::mutex> lock(engine->loop_mutex_);
      engine->loop_done_ = true;
      engine->loop_cv_.notify_all();
    }
  } done{this};
  const bool root = comm_->rank() == 0;
  auto last_start = std::chrono::steady_clock::now() - std::chrono::hours(1);
  bool want_sent = false;
  const bool alone = comm_->size() == 1;

  for (;;) {
    if (aborted_.load()) return;
    WakeupChannel::Events events;
    Status status;
    if (root) {
      // The stall inspector needs a cycle now and then while collectives
      // are pending, even when no rank has anything new to say.
      const int stall_ms = controller_.MsUntilStallCheck();
      if (!HasLocalWork() && pending_wants_ == 0 && stall_ms != 0) {
        // While this rank's own collectives are in flight, a quiet spell
        // ends in a cycle anyway (see kNudgeMs).
        const bool in_flight = queue_.HasInFlight();
        const bool nudge = in_flight && (stall_ms < 0 || stall_ms > kNudgeMs);
        status = wakeup_->Wait(nudge ? kNudgeMs : stall_ms, &events);
        if (status.ok() && nudge && events.timed_out) {
          HORA_LOG(kDebug) << "collectives in flight and no cycle for " << kNudgeMs
                           << " ms; starting one";
          ++pending_wants_;
        }
      } else {
        const auto cycle_time = std::chrono::duration<double, std::milli>(cycle_time_ms_);
        const auto since = std::chrono::steady_clock::now() - last_start;
        if (since < cycle_time) {
          const auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(cycle_time - since);
          status = wakeup_->Wait(static_cast<int>(left.count()) + 1, &events);
        } else {
          pending_wants_ = 0;
          last_start = std::chrono::steady_clock::now();
          if (!alone) status = wakeup_->StartCycle();
          if (status.ok() && !RunCycles()) return;
          if (status.ok() && !alone) status = wakeup_->Wait(0, &events);
        }
      }
      pending_wants_ += events.wants;
    } else {
      if (pending_starts_ == 0) {
        if (HasLocalWork() && !want_sent) {
          status = wakeup_->RequestCycle();
          want_sent = true;
        }
        const bool in_flight = queue_.HasInFlight();
        if (status.ok()) status = wakeup_->Wait(in_flight ? kNudgeMs : -1, &events);
        pending_starts_ += events.starts;
        if (status.ok() && in_flight && events.timed_out) {
          HORA_LOG(kDebug) << "collectives in flight and no cycle for " << kNudgeMs
                           << " ms; asking rank 0 for one";
          status = wakeup_->RequestCycle();
          want_sent = true;
        }
      } else {
        --pending_starts_;
        want_sent = false;
        if (!RunCycles()) return;
      }
    }
    if (status.ok() && events.lost_rank >= 0) status = LostRank(events);
    if (!status.ok()) {
      HORA_LOG(kError) << status.message();
      Break(status);
      return;
    }
  }
}

Status Engine::LostRank(const WakeupChannel::Events& events) {
  if (events.lost_reported) {
    return Status::Internal("rank " + std::to_string(events.lost_rank) +
                            " is gone: rank 0 lost its connection (its process has probably "
                            "exited or crashed)");
  }
  // Rank 0 is the only one connected to everybody: the others learn from it
  // which rank was lost, instead of only seeing rank 0 go away.
  wakeup_->AnnounceLost(events.lost_rank);
  return Status::Internal("lost the connection to rank " + std::to_string(events.lost_rank) +
                          " (its process has probably exited or crashed)");
}

bool Engine::RunCycles() {
  uint64_t hot = 0;
  for (;;) {
    bool go_idle = true;
    if (aborted_.load() || !RunOneCycle(&go_idle)) return false;
    if (go_idle) return true;
    // Let this process's own threads (the caller about to submit the next
    // tensor) run first if they share this core.
    if (!HasLocalWork()) sched_yield();
    // Staying hot: every rank runs the next cycle at once, without a
    // wake-up. Now and then look for a lost connection, which a blocking
    // collective could otherwise wait on for ever.
    if ((++hot & 15) == 0) {
      WakeupChannel::Events events;
      Status status = wakeup_->Wait(0, &events);
      if (status.ok() && events.lost_rank >= 0) status = LostRank(events);
      if (!status.ok()) {
        HORA_LOG(kError) << status.message();
        Break(status);
        return false;
      }
      pending_wants_ += events.wants;
      pending_starts_ += events.starts;
    }
  }
}

bool Engine::RunOneCycle(bool* go_idle) {
  std::vector<Request> requests;
  queue_.TakeNewRequests(&requests);
  const bool joined = join_requested_.load();
  const bool shutdown = shutdown_requested_.load();
  join_announced_ = joined;
  shutdown_announced_ = shutdown;
  const auto now = std::chrono::steady_clock::now();
  const bool root_idle = now - last_wait_ >= spin_window_;

  CycleResult result;
  EngineParameters next;
  if (autotuner_ && autotuner_->Next(now, &next)) controller_.Announce(next);
  // Only this engine's callers count: a caller blocked on another process
  // set's collective must not keep this engine cycling.
  const bool waiting = queue_.activity().waiters.load(std::memory_order_relaxed) > 0;
  const bool spin = waiting && g_spin_waits_allowed.load(std::memory_order_relaxed);
  SpinWhileWaiting() = spin;
  queue_.activity().spinning.store(spin, std::memory_order_relaxed);
  // A hot cycle follows one in which some caller was waiting: the peers
  // are right behind, so blocking calls are fastest. Every rank knows
  // whether this cycle is hot, and (after negotiating) whether anyone waits.
  comm_->SetBlockingCollectives(hot_);
  Status status =
      controller_.RunCycle(std::move(requests), shutdown, joined, waiting, root_idle, &result);
  const auto negotiated = std::chrono::steady_clock::now();
  if (status.ok()) {
    if (result.has_parameters) {
      Apply(result.parameters);
      if (autotuner_) autotuner_->Started(negotiated);
    }
    comm_->SetBlockingCollectives(result.waiting);
    status = executor_.Run(result.responses, negotiated, &pending_set_changes_);
    const int64_t bytes = executor_.TakeAllreducedBytes();
    if (autotuner_) autotuner_->Record(bytes, negotiated);
  }
  // Set changes run after the cycle's collectives, at the same point of
  // the job's order on every rank.
  for (Executor::SetChange& change : pending_set_changes_) {
    if (!status.ok()) {
      change.work->Complete(status);
    } else if (!sets_) {
      status = Status::Internal("a process set's engine got a process-set change");
      change.work->Complete(status);
    } else {
      status = sets_->Apply(change.response, parameters(), change.work.get());
    }
  }
  pending_set_changes_.clear();
  ++stats_.cycles;
  if (!result.responses.empty()) ++stats_.working_cycles;
  timeline_.Cycle(static_cast<int64_t>(stats_.cycles), result.responses.size());
  stats_.negotiation += negotiated - now;
  stats_.execution += std::chrono::steady_clock::now() - negotiated;
  if (!status.ok()) {
    HORA_LOG(kError) << status.message();
    Break(status);
    return false;
  }
  if (!result.abort.ok()) {
    Stop(result.abort);
    return false;
  }
  if (result.waiting) last_wait_ = std::chrono::steady_clock::now();
  *go_idle = result.go_idle;
  hot_ = !result.go_idle;
  if (result.all_joined) {
    // Clear the request before waking the caller, under the lock that
    // Join() takes: a caller that returns and joins again at once must find
    // its new request still set, or it would never be announced (every rank
    // would then wait for this one for ever).
    std::lock_guard<std::mutex> lock(join_mutex_);
    join_requested_ = false;
    join_announced_ = false;
    if (join_work_) {
      join_work_->join_last_rank = result.last_joined_rank;
      join_work_->Complete(Status::OK());
      join_work_.reset();
    }
  }
  if (!result.shutdown_ranks.empty()) {
    const bool self = shutdown;
    Stop(Status::Shutdown(!set_gone_.empty() ? set_gone_
                          : self             ? "hora has been shut down on this rank"
                                             : "hora has been shut down because " +
                                                   RankList(result.shutdown_ranks) +
                                                   " called hora.shutdown() (or exited)"));
    return false;
  }
  return true;
}

}  // namespace hora
