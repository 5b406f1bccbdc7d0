#include "hora/comm/wakeup/wakeup_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <sstream>

namespace hora {
namespace {

constexpr int kConnectTimeoutMs = 10000;
constexpr int kAcceptTimeoutMs = 120000;

struct Hello {
  int32_t rank;
  uint64_t cookie;
};

Status Errno(const std::string& what) {
  return Status::Internal(what + ": " + std::strerror(errno));
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void SetNonBlocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

// Reads or writes exactly n bytes on a blocking socket, giving up after
// timeout_ms so a peer that vanished during set-up cannot hang init.
bool TransferAll(int fd, char* data, size_t n, bool write, int timeout_ms) {
  size_t done = 0;
  while (done < n) {
    pollfd p{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    const ssize_t got =
        write ? send(fd, data + done, n - done, MSG_NOSIGNAL) : recv(fd, data + done, n - done, 0);
    if (got <= 0) {
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return false;
    }
    done += static_cast<size_t>(got);
  }
  return true;
}

int ConnectWithTimeout(const std::string& ip, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return -1;
  }
  SetNonBlocking(fd, true);
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t length = sizeof(error);
    if (poll(&p, 1, kConnectTimeoutMs) == 1 &&
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0) {
      rc = 0;
    }
  }
  if (rc != 0) {
    close(fd);
    return -1;
  }
  SetNonBlocking(fd, false);
  return fd;
}

std::vector<std::string> LocalAddresses() {
  std::vector<std::string> result{"127.0.0.1"};
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return result;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<sockaddr_in*>(it->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) continue;
    if (std::string(text) != "127.0.0.1") result.push_back(text);
  }
  freeifaddrs(list);
  return result;
}

}  // namespace

Status WakeupChannel::Create(Communicator* comm, std::unique_ptr<WakeupChannel>* out) {
  std::unique_ptr<WakeupChannel> channel(new WakeupChannel(comm->rank(), comm->size()));
  channel->event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (channel->event_fd_ < 0) return Errno("eventfd");
  if (comm->size() == 1) {
    *out = std::move(channel);
    return Status::OK();
  }

  int listen_fd = -1;
  std::string announcement;
  uint64_t cookie = 0;
  if (comm->rank() == 0) {
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0) return Errno("socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = 0;
    socklen_t length = sizeof(addr);
    if (bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd, comm->size()) != 0 ||
        getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
      Status s = Errno("wake-up listener");
      close(listen_fd);
      return s;
    }
    // The cookie keeps stray local connections out of the job.
    std::random_device random;
    cookie = (static_cast<uint64_t>(random()) << 32) ^ random();
    std::ostringstream text;
    text << ntohs(addr.sin_port) << ' ' << cookie << ' ' << comm->topology().hostname;
    for (const std::string& ip : LocalAddresses()) text << ' ' << ip;
    announcement = text.str();
  }
  HORA_RETURN_IF_ERROR(comm->BroadcastBytes(&announcement, 0));

  if (comm->rank() == 0) {
    channel->peer_fds_.assign(comm->size(), -1);
    int connected = 0;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kAcceptTimeoutMs);
    Status status;
    while (connected < comm->size() - 1) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      pollfd p{listen_fd, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) {
        status =
            Status::Internal("timed out waiting for every rank to open its wake-up connection");
        break;
      }
      const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      Hello hello{};
      if (!TransferAll(fd, reinterpret_cast<char*>(&hello), sizeof(hello), false, 5000) ||
          hello.cookie != cookie || hello.rank <= 0 || hello.rank >= comm->size() ||
          channel->peer_fds_[hello.rank] != -1) {
        close(fd);  // not one of ours
        continue;
      }
      SetNoDelay(fd);
      SetNonBlocking(fd, true);
      channel->peer_fds_[hello.rank] = fd;
      ++connected;
    }
    close(listen_fd);
    HORA_RETURN_IF_ERROR(status);
  } else {
    std::istringstream text(announcement);
    int port = 0;
    std::string root_host, ip;
    text >> port >> cookie >> root_host;
    std::vector<std::string> candidates;
    while (text >> ip) {
      const bool loopback = ip == "127.0.0.1";
      if (loopback && root_host != comm->topology().hostname) continue;
      candidates.push_back(ip);
    }
    int fd = -1;
    for (const std::string& candidate : candidates) {
      fd = ConnectWithTimeout(candidate, port);
      if (fd >= 0) break;
    }
    if (fd < 0) {
      return Status::Internal("could not open the wake-up connection to rank 0 (" + announcement +
                              ")");
    }
    Hello hello{comm->rank(), cookie};
    if (!TransferAll(fd, reinterpret_cast<char*>(&hello), sizeof(hello), true, 5000)) {
      close(fd);
      return Status::Internal("could not greet rank 0 over the wake-up connection");
    }
    SetNoDelay(fd);
    SetNonBlocking(fd, true);
    channel->peer_fds_.assign(1, fd);
  }
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
  if (ready < 0) return Errno("poll");
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
    // Best effort: the job is going down either way.
    ssize_t ignored = send(peer_fds_[r], notice.data(), notice.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)ignored;
  }
}

Status WakeupChannel::RequestCycle() { return SendByte(peer_fds_[0], 'W', 0); }

Status WakeupChannel::StartCycle() {
  for (int r = 1; r < size_; ++r) HORA_RETURN_IF_ERROR(SendByte(peer_fds_[r], 'S', r));
  return Status::OK();
}

}  // namespace hora
