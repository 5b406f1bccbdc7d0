#include "hora/comm/wakeup/star.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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

Status ConnectStar(Communicator* comm, const std::string& purpose, std::vector<int>* fds) {
  fds->clear();
  if (comm->size() == 1) return Status::OK();
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
      Status s = Errno(purpose + " listener");
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
    fds->assign(comm->size(), -1);
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
        status = Status::Internal("timed out waiting for every rank to open its " + purpose +
                                  " connection");
        break;
      }
      const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      Hello hello{};
      if (!TransferAll(fd, reinterpret_cast<char*>(&hello), sizeof(hello), false, 5000) ||
          hello.cookie != cookie || hello.rank <= 0 || hello.rank >= comm->size() ||
          (*fds)[hello.rank] != -1) {
        close(fd);  // not one of ours
        continue;
      }
      SetNoDelay(fd);
      SetNonBlocking(fd, true);
      (*fds)[hello.rank] = fd;
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
      return Status::Internal("could not open the " + purpose + " connection to rank 0 (" +
                              announcement + ")");
    }
    Hello hello{comm->rank(), cookie};
    if (!TransferAll(fd, reinterpret_cast<char*>(&hello), sizeof(hello), true, 5000)) {
      close(fd);
      return Status::Internal("could not greet rank 0 over the " + purpose + " connection");
    }
    SetNoDelay(fd);
    SetNonBlocking(fd, true);
    fds->assign(1, fd);
  }
  return Status::OK();
}

bool SendNow(int fd, const std::string& text) {
  const ssize_t sent = send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return sent == static_cast<ssize_t>(text.size());
}

}  // namespace hora
