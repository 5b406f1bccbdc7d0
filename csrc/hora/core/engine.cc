#include "hora/core/engine.h"

#include <chrono>
#include <sstream>

#include "hora/algo/kernels/kernel_set.h"
#include "hora/common/logging.h"

namespace hora {
namespace {

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
      controller_(comm_.get(), config),
      executor_(comm_.get(), &queue_, config) {}

Status Engine::Start(std::unique_ptr<Communicator> comm, const Config& config,
                     std::unique_ptr<Engine>* out) {
  std::unique_ptr<Engine> engine(new Engine(std::move(comm), config));
  HORA_RETURN_IF_ERROR(WakeupChannel::Create(engine->comm_.get(), &engine->wakeup_)
                           .WithContext("starting the engine"));
  HORA_RETURN_IF_ERROR(SelectKernels(config.cpu_kernels));
  std::unique_ptr<AllreduceRouter> router;
  HORA_RETURN_IF_ERROR(AllreduceRouter::Create(engine->comm_.get(), config, &router));
  engine->executor_.SetRouter(std::move(router));
  if (engine->comm_->rank() == 0) {
    HORA_LOG(kDebug) << "engine started on " << engine->comm_->size() << " ranks over "
                     << engine->comm_->Describe() << "; " << config.Describe() << "; "
                     << engine->executor_.router()->Describe();
  }
  Engine* raw = engine.get();
  engine->thread_ = std::thread([raw] { raw->Loop(); });
  *out = std::move(engine);
  return Status::OK();
}

Engine::~Engine() { Shutdown(); }

Status Engine::Enqueue(std::vector<TensorEntry> entries) { return queue_.Add(std::move(entries)); }

Status Engine::Join(std::shared_ptr<Work>* work) {
  std::lock_guard<std::mutex> lock(join_mutex_);
  if (join_work_) return Status::InvalidArgument("join() is already in progress on this rank");
  {
    std::lock_guard<std::mutex> stop_lock(shutdown_mutex_);
    if (stopped_) return Status::Shutdown("hora has been shut down");
  }
  join_work_ = std::make_shared<Work>();
  *work = join_work_;
  join_requested_ = true;
  wakeup_->NotifyLocal();
  return Status::OK();
}

void Engine::Shutdown() {
  shutdown_requested_ = true;
  if (wakeup_) wakeup_->NotifyLocal();
  if (thread_.joinable()) thread_.join();
  Stop(Status::Shutdown("hora has been shut down on this rank"));
}

void Engine::Stop(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(shutdown_mutex_);
    if (stopped_) return;
    stopped_ = true;
  }
  queue_.Close(reason);
  queue_.FailAll(reason);
  std::lock_guard<std::mutex> lock(join_mutex_);
  if (join_work_) {
    join_work_->Complete(reason);
    join_work_.reset();
  }
}

bool Engine::HasLocalWork() const {
  return queue_.HasNewRequests() || controller_.HasUnsentRequests() ||
         join_requested_.load() != join_announced_ ||
         shutdown_requested_.load() != shutdown_announced_;
}

void Engine::Loop() {
  const bool root = comm_->rank() == 0;
  const auto cycle_time = std::chrono::duration<double, std::milli>(config_.cycle_time_ms);
  auto last_start = std::chrono::steady_clock::now() - std::chrono::hours(1);
  int pending_starts = 0;  // other ranks: cycles rank 0 has started
  int pending_wants = 0;   // rank 0: cycles other ranks asked for
  bool want_sent = false;
  const bool alone = comm_->size() == 1;

  for (;;) {
    WakeupChannel::Events events;
    Status status;
    if (root) {
      if (!HasLocalWork() && pending_wants == 0) {
        status = wakeup_->Wait(-1, &events);
      } else {
        const auto since = std::chrono::steady_clock::now() - last_start;
        if (since < cycle_time) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(cycle_time - since);
          status = wakeup_->Wait(static_cast<int>(left.count()) + 1, &events);
        } else {
          pending_wants = 0;
          last_start = std::chrono::steady_clock::now();
          if (!alone) status = wakeup_->StartCycle();
          if (status.ok() && !RunOneCycle()) return;
          if (status.ok() && !alone) status = wakeup_->Wait(0, &events);
        }
      }
      pending_wants += events.wants;
    } else {
      if (pending_starts == 0) {
        if (HasLocalWork() && !want_sent) {
          status = wakeup_->RequestCycle();
          want_sent = true;
        }
        if (status.ok()) status = wakeup_->Wait(-1, &events);
        pending_starts += events.starts;
      } else {
        --pending_starts;
        want_sent = false;
        if (!RunOneCycle()) return;
      }
    }
    if (status.ok() && events.lost_rank >= 0) {
      status = Status::Internal("lost the connection to rank " + std::to_string(events.lost_rank) +
                                " (its process has probably exited or crashed)");
    }
    if (!status.ok()) {
      HORA_LOG(kError) << status.message();
      Stop(status);
      return;
    }
  }
}

bool Engine::RunOneCycle() {
  std::vector<Request> requests;
  queue_.TakeNewRequests(&requests);
  const bool joined = join_requested_.load();
  const bool shutdown = shutdown_requested_.load();
  join_announced_ = joined;
  shutdown_announced_ = shutdown;

  CycleResult result;
  Status status = controller_.RunCycle(std::move(requests), shutdown, joined, &result);
  if (status.ok()) {
    status = executor_.Run(result.responses);
  }
  if (!status.ok()) {
    HORA_LOG(kError) << status.message();
    Stop(status);
    return false;
  }
  if (result.all_joined) {
    std::lock_guard<std::mutex> lock(join_mutex_);
    if (join_work_) {
      join_work_->join_last_rank = result.last_joined_rank;
      join_work_->Complete(Status::OK());
      join_work_.reset();
    }
    join_requested_ = false;
    join_announced_ = false;
  }
  if (!result.shutdown_ranks.empty()) {
    const bool self = shutdown;
    Stop(Status::Shutdown(
        self ? "hora has been shut down on this rank"
             : "hora has been shut down because " + RankList(result.shutdown_ranks) +
                   " called hora.shutdown() (or exited)"));
    return false;
  }
  return true;
}

}  // namespace hora
