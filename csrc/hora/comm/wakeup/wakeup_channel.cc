#include "hora/comm/wakeup/wakeup_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "hora/comm/wakeup/star.h"

namespace hora {

Status WakeupChannel::Create(Communicator* comm, std::unique_ptr<WakeupChannel>* out) {
  std::unique_ptr<WakeupChannel> channel(new WakeupChannel(comm->rank(), comm->size()));
  channel->event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (channel->event_fd_ < 0) {
    return Status::Internal(std::string("eventfd: ") + std::strerror(errno));
  }
  HORA_RETURN_IF_ERROR(ConnectStar(comm, "wake-up", &channel->peer_fds_));
  *out = std::move(channel);
  return Status::OK();
}

WakeupChannel::~WakeupChannel() {
  if (event_fd_ >= 0) close(event_fd_);
  for (int fd : peer_fds_) {
    if (fd >= 0) close(fd);
  }
}

void WakeupChannel::NotifyLocal() {
  const uint64_t one = 1;
  ssize_t ignored = write(event_fd_, &one, sizeof(one));
  (void)ignored;
}

Status WakeupChannel::Wait(int timeout_ms, Events* events) {
  // Built once: Wait runs every cycle.
  std::vector<pollfd>& fds = poll_fds_;
  if (fds.empty()) {
    fds.push_back({event_fd_, POLLIN, 0});
    for (int fd : peer_fds_) fds.push_back({fd, static_cast<short>(fd >= 0 ? POLLIN : 0), 0});
  }
  for (pollfd& p : fds) p.revents = 0;
  int ready;
  do {
    ready = poll(fds.data(), fds.size(), timeout_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) return Status::Internal(std::string("poll: ") + std::strerror(errno));
  events->timed_out = ready == 0;
  if (fds[0].revents & POLLIN) {
    uint64_t count;
    ssize_t ignored = read(event_fd_, &count, sizeof(count));
    (void)ignored;
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].fd < 0 || fds[i].revents == 0) continue;
    const int peer = rank_ == 0 ? static_cast<int>(i - 1) : 0;
    char buffer[256];
    for (;;) {
      const ssize_t got = recv(fds[i].fd, buffer, sizeof(buffer), 0);
      if (got > 0) {
        for (ssize_t b = 0; b < got; ++b) {
          const char c = buffer[b];
          if (reading_lost_) {
            if (c >= '0' && c <= '9') {
              lost_digits_ = lost_digits_ * 10 + (c - '0');
            } else {
              reading_lost_ = false;
              events->lost_rank = lost_digits_;
              events->lost_reported = true;
            }
          } else if (c == 'W') {
            ++events->wants;
          } else if (c == 'S') {
            ++events->starts;
          } else if (c == 'L') {
            reading_lost_ = true;
            lost_digits_ = 0;
          }
        }
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      if ((got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) && !events->lost_reported) {
        events->lost_rank = peer;
      }
      break;
    }
  }
  return Status::OK();
}

Status WakeupChannel::SendByte(int fd, char byte, int peer) {
  for (;;) {
    const ssize_t sent = send(fd, &byte, 1, MSG_NOSIGNAL);
    if (sent == 1) return Status::OK();
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 1000);
      continue;
    }
    return Status::Internal("lost the connection to rank " + std::to_string(peer) +
                            " (its process has probably exited)");
  }
}

void WakeupChannel::AnnounceLost(int lost_rank) {
  if (rank_ != 0) return;
  const std::string notice = "L" + std::to_string(lost_rank) + "\n";
  for (int r = 1; r < size_; ++r) {
    if (r == lost_rank || peer_fds_[r] < 0) continue;
    SendNow(peer_fds_[r], notice);  // best effort: the job is going down either way
  }
}

Status WakeupChannel::RequestCycle() { return SendByte(peer_fds_[0], 'W', 0); }

Status WakeupChannel::StartCycle() {
  for (int r = 1; r < size_; ++r) HORA_RETURN_IF_ERROR(SendByte(peer_fds_[r], 'S', r));
  return Status::OK();
}

}  // namespace hora
