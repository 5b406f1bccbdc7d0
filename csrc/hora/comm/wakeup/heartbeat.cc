#include "hora/comm/wakeup/heartbeat.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>

#include "hora/comm/wakeup/star.h"
#include "hora/common/collective_watch.h"
#include "hora/common/logging.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

std::string Seconds(Clock::duration d) {
  std::ostringstream text;
  text.precision(1);
  text << std::fixed << std::chrono::duration<double>(d).count() << " s";
  return text.str();
}

}  // namespace

Status Heartbeat::Start(Communicator* comm, const Options& options, OnStop on_stop,
                        std::unique_ptr<Heartbeat>* out) {
  out->reset();
  if (comm->size() == 1) return Status::OK();
  std::unique_ptr<Heartbeat> beat(
      new Heartbeat(comm->rank(), comm->size(), options, std::move(on_stop)));
  beat->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (beat->wake_fd_ < 0) return Status::Internal(std::string("eventfd: ") + std::strerror(errno));
  HORA_RETURN_IF_ERROR(ConnectStar(comm, "heartbeat", &beat->fds_));
  beat->heard_.assign(comm->size(), Clock::now());
  beat->warned_.assign(comm->size(), false);
  Heartbeat* raw = beat.get();
  beat->thread_ = std::thread([raw] { raw->Loop(); });
  *out = std::move(beat);
  return Status::OK();
}

Heartbeat::Heartbeat(int rank, int size, const Options& options, OnStop on_stop)
    : rank_(rank), size_(size), options_(options), on_stop_(std::move(on_stop)) {}

Heartbeat::~Heartbeat() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    ssize_t ignored = write(wake_fd_, &one, sizeof(one));
    (void)ignored;
    thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
}

std::string Heartbeat::Name(int rank) const {
  const int name = options_.rank_names.empty() ? rank : options_.rank_names[rank];
  return "rank " + std::to_string(name);
}

void Heartbeat::Beat() {
  for (int fd : fds_) {
    if (fd >= 0) SendNow(fd, "H");  // a full buffer means the peer is not reading anyway
  }
}

bool Heartbeat::Read(int peer, Clock::time_point now) {
  const int fd = rank_ == 0 ? fds_[peer] : fds_[0];
  char buffer[256];
  for (;;) {
    const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (got <= 0) return false;
    if (warned_[peer]) {
      warned_[peer] = false;
      HORA_LOG(kWarning) << Name(peer) << " is answering again after "
                         << Seconds(now - heard_[peer]) << " of silence";
    }
    heard_[peer] = now;
    for (ssize_t b = 0; b < got; ++b) {
      const char c = buffer[b];
      if (reading_notice_) {
        if (c >= '0' && c <= '9') {
          notice_rank_ = notice_rank_ * 10 + (c - '0');
        } else {
          reading_notice_ = false;
          if (!stopped_) StopJob(notice_rank_, 0.0, true);
        }
      } else if (c == 'Q' && rank_ != 0) {
        reading_notice_ = true;
        notice_rank_ = 0;
      }
    }
  }
}

void Heartbeat::StopJob(int silent_rank, double seconds, bool told_by_root) {
  stopped_ = true;
  const double stop_s = std::chrono::duration<double>(options_.stop).count();
  std::ostringstream text;
  text.precision(1);
  text << std::fixed;
  if (told_by_root) {
    text << Name(silent_rank) << " stopped answering: rank 0 heard nothing from its process for "
         << stop_s << " s";
  } else {
    text << Name(silent_rank) << " has not been heard from for " << seconds << " s";
  }
  text << " (the process is stopped, by SIGSTOP or a debugger, or frozen); the job stops after "
          "the stall shutdown time ("
       << stop_s << " s, HORA_STALL_SHUTDOWN_TIME_SECONDS)";
  if (rank_ == 0) {
    // The others learn which rank was lost from rank 0, the only one that
    // hears from everybody.
    const std::string notice = "Q" + std::to_string(silent_rank) + "\n";
    for (int r = 1; r < size_; ++r) {
      if (r != silent_rank && fds_[r] >= 0) SendNow(fds_[r], notice);
    }
  }
  on_stop_(Status::Timeout(text.str()));
}

void Heartbeat::Loop() {
  prctl(PR_SET_NAME, "hora-heartbeat", 0, 0, 0);
  std::vector<int> peers;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) peers.push_back(r);
  } else {
    peers.push_back(0);
  }
  auto fd_of = [&](int peer) -> int& { return rank_ == 0 ? fds_[peer] : fds_[0]; };
  std::vector<pollfd> fds;
  std::vector<int> polled;
  auto next_beat = Clock::now();
  for (;;) {
    auto now = Clock::now();
    if (now >= next_beat) {
      Beat();
      next_beat = now + options_.interval;
    }
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    polled.clear();
    for (int peer : peers) {
      if (fd_of(peer) < 0) continue;
      fds.push_back(pollfd{fd_of(peer), POLLIN, 0});
      polled.push_back(peer);
    }
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_beat - now).count() + 1;
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(wait));
    if (ready < 0 && errno != EINTR) {
      HORA_LOG(kWarning) << "heartbeat: poll failed (" << std::strerror(errno)
                         << "); stopped or frozen ranks will not be reported";
      return;
    }
    if (fds[0].revents != 0) return;  // the destructor
    now = Clock::now();
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int peer = polled[i - 1];
      if (!Read(peer, now)) {
        // Its process is gone (or shut hora down): the wake-up channel
        // reports lost processes.
        close(fd_of(peer));
        fd_of(peer) = -1;
      }
    }
    if (stopped_) continue;
    // Ms::max() (warnings off) would overflow in nanoseconds.
    const bool warn = options_.warn != std::chrono::milliseconds::max();
    if (warn) {
      for (const std::string& overdue : CollectiveWatch::Overdue(now, options_.warn)) {
        HORA_LOG(kWarning) << overdue;
      }
    }
    for (int peer : peers) {
      if (fd_of(peer) < 0) continue;
      const auto silence = now - heard_[peer];
      if (warn && !warned_[peer] && silence >= options_.warn) {
        warned_[peer] = true;
        std::ostringstream text;
        text << Name(peer) << " has not been heard from for " << Seconds(silence)
             << ": its process is stopped (SIGSTOP, a debugger) or frozen, and collectives that "
                "need it wait";
        if (options_.stop.count() > 0) {
          text << "; the job stops if it stays silent for " << Seconds(options_.stop);
        }
        HORA_LOG(kWarning) << text.str();
      }
      if (options_.stop.count() > 0 && silence >= options_.stop) {
        StopJob(peer, std::chrono::duration<double>(silence).count(), false);
        break;
      }
    }
  }
}

}  // namespace hora
