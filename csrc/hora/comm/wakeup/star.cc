#include "hora/comm/wakeup/star.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <sstream>

#include "hora/comm/tcp/sockets.h"

namespace hora {
namespace {

constexpr int kConnectTimeoutMs = 10000;
constexpr int kAcceptTimeoutMs = 120000;

struct Hello {
  int32_t rank;
  uint64_t cookie;
};

}  // namespace

Status ConnectStar(Communicator* comm, const std::string& purpose, std::vector<int>* fds) {
  fds->clear();
  if (comm->size() == 1) return Status::OK();
  int listen_fd = -1;
  std::string announcement;
  uint64_t cookie = 0;
  if (comm->rank() == 0) {
    int port = 0;
    HORA_RETURN_IF_ERROR(
        sockets::Listen(comm->size(), &listen_fd, &port).WithContext(purpose + " listener"));
    // The cookie keeps stray local connections out of the job.
    std::random_device random;
    cookie = (static_cast<uint64_t>(random()) << 32) ^ random();
    std::ostringstream text;
    text << port << ' ' << cookie << ' ' << comm->topology().hostname;
    for (const std::string& ip : sockets::LocalAddresses()) text << ' ' << ip;
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
      if (!sockets::TransferAll(fd, reinterpret_cast<char*>(&hello), sizeof(hello), false, 5000) ||
          hello.cookie != cookie || hello.rank <= 0 || hello.rank >= comm->size() ||
          (*fds)[hello.rank] != -1) {
        close(fd);  // not one of ours
        continue;
      }
      sockets::SetNoDelay(fd);
      sockets::SetNonBlocking(fd, true);
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
      fd = sockets::ConnectWithTimeout(candidate, port, kConnectTimeoutMs);
      if (fd >= 0) break;
    }
    if (fd < 0) {
      return Status::Internal("could not open the " + purpose + " connection to rank 0 (" +
                              announcement + ")");
    }
    Hello hello{comm->rank(), cookie};
    if (!sockets::TransferAll(fd, reinterpret_cast<char*>(&hello), sizeof(hello), true, 5000)) {
      close(fd);
      return Status::Internal("could not greet rank 0 over the " + purpose + " connection");
    }
    sockets::SetNoDelay(fd);
    sockets::SetNonBlocking(fd, true);
    fds->assign(1, fd);
  }
  return Status::OK();
}

bool SendNow(int fd, const std::string& text) {
  const ssize_t sent = send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return sent == static_cast<ssize_t>(text.size());
}

}  // namespace hora
