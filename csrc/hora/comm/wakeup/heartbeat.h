#pragma once
// Tells a rank whose process has stopped (SIGSTOP, a debugger, a frozen
// host) from one that is merely slow.
//
// The negotiation cannot: a stopped rank leaves its peers inside a
// collective, and the stall inspector runs between collectives. So each
// process also runs a small thread that sends rank 0 a byte every interval
// over its own socket, and rank 0's thread answers every rank the same
// way. A thread of a stopped process stops with it; one of a rank busy in
// Python (which the stall inspector reports) keeps beating. A rank not
// heard from for `warn` is named in a warning; after `stop` (0: never) the
// job stops: rank 0 tells the others which rank it lost, and every rank's
// pending collectives fail with the reason (`on_stop`, called once, from
// the heartbeat thread). A closed connection is left to the wake-up
// channel, which reports lost processes.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "hora/comm/communicator.h"

namespace hora {

class Heartbeat {
 public:
  struct Options {
    std::chrono::milliseconds interval{1000};
    std::chrono::milliseconds warn{60000};
    std::chrono::milliseconds stop{0};  // zero: never
    std::vector<int> rank_names;        // empty: the communicator's ranks
  };
  using OnStop = std::function<void(const Status&)>;

  // Collective over `comm`; starts the thread (none on a single rank).
  static Status Start(Communicator* comm, const Options& options, OnStop on_stop,
                      std::unique_ptr<Heartbeat>* out);
  ~Heartbeat();  // stops and joins the thread

 private:
  Heartbeat(int rank, int size, const Options& options, OnStop on_stop);
  void Loop();
  // Reads what arrived from `peer`; false once its connection is closed.
  bool Read(int peer, std::chrono::steady_clock::time_point now);
  void Beat();
  std::string Name(int rank) const;
  void StopJob(int silent_rank, double seconds, bool told_by_root);

  int rank_;
  int size_;
  Options options_;
  OnStop on_stop_;
  int wake_fd_ = -1;      // the destructor's signal to the thread
  std::vector<int> fds_;  // see ConnectStar
  std::vector<std::chrono::steady_clock::time_point> heard_;  // per rank
  std::vector<bool> warned_;
  bool stopped_ = false;
  // A "Q<rank>\n" notice from rank 0 being read.
  bool reading_notice_ = false;
  int notice_rank_ = 0;
  std::thread thread_;
};

}  // namespace hora
