#include "hora/comm/tcp/sockets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hora {
namespace sockets {

Status Errno(const std::string& what) {
  return Status::Internal(what + ": " + std::strerror(errno));
}

Status Listen(int backlog, int* fd, int* port) {
  *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (*fd < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t length = sizeof(addr);
  if (bind(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(*fd, backlog) != 0 ||
      getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    Status s = Errno("listening socket");
    close(*fd);
    *fd = -1;
    return s;
  }
  *port = ntohs(addr.sin_port);
  return Status::OK();
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void SetNonBlocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

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

int ConnectWithTimeout(const std::string& ip, int port, int timeout_ms) {
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
    if (poll(&p, 1, timeout_ms) == 1 &&
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

}  // namespace sockets
}  // namespace hora
