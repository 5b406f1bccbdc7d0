#include "hora/comm/tcp/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "hora/comm/tcp/sockets.h"

namespace hora {
namespace {

constexpr int kRendezvousConnectTimeoutMs = 10000;

// The IPv4 address of `host` ("127.0.0.1" stays as it is).
bool Resolve(const std::string& host, std::string* ip) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return false;
  char text[64];
  const auto* in = reinterpret_cast<sockaddr_in*>(found->ai_addr);
  const bool ok = inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr;
  freeaddrinfo(found);
  if (ok) *ip = text;
  return ok;
}

}  // namespace

Status TcpRendezvous::Connect(const std::string& address, uint64_t cookie, int64_t process_id,
                              std::unique_ptr<TcpRendezvous>* out) {
  const size_t colon = address.rfind(':');
  std::string ip;
  int port = 0;
  if (colon == std::string::npos || !Resolve(address.substr(0, colon), &ip) ||
      (port = std::atoi(address.c_str() + colon + 1)) <= 0) {
    return Status::InvalidArgument("HORA_RENDEZVOUS=" + address +
                                   ": expected the launcher's host:port");
  }
  const int fd = sockets::ConnectWithTimeout(ip, port, kRendezvousConnectTimeoutMs);
  if (fd < 0) {
    return Status::Internal("could not reach the launcher's rendezvous at " + address + ": " +
                            std::strerror(errno));
  }
  sockets::SetNoDelay(fd);
  out->reset(new TcpRendezvous(fd, address));
  const std::string hello =
      "HELLO " + std::to_string(cookie) + " " + std::to_string(process_id) + "\n";
  if (!sockets::TransferAll(fd, const_cast<char*>(hello.data()), hello.size(), true, 5000)) {
    out->reset();
    return Status::Internal("the launcher's rendezvous at " + address + " closed the connection");
  }
  return Status::OK();
}

TcpRendezvous::~TcpRendezvous() {
  if (fd_ >= 0) close(fd_);
}

Status TcpRendezvous::ReadLine(std::string* line) {
  while (true) {
    const size_t end = buffered_.find('\n');
    if (end != std::string::npos) {
      *line = buffered_.substr(0, end);
      buffered_.erase(0, end + 1);
      return Status::OK();
    }
    char chunk[4096];
    const ssize_t got = recv(fd_, chunk, sizeof(chunk), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return Status::Internal("the launcher's rendezvous at " + address_ +
                              " is gone (the launcher ended, or its host did)");
    }
    buffered_.append(chunk, static_cast<size_t>(got));
  }
}

Status TcpRendezvous::Send(const std::string& text) {
  if (!sockets::TransferAll(fd_, const_cast<char*>(text.data()), text.size(), true, 5000)) {
    return Status::Internal("the launcher's rendezvous at " + address_ +
                            " is gone (the launcher ended, or its host did)");
  }
  return Status::OK();
}

Status TcpRendezvous::Spawn(int count, const std::vector<std::string>& argv,
                            const std::string& hosts) {
  static const char kHex[] = "0123456789abcdef";
  std::string text = "SPAWN " + std::to_string(count) + " " + (hosts.empty() ? "-" : hosts) + " " +
                     std::to_string(argv.size()) + "\n";
  for (const std::string& arg : argv) {
    for (unsigned char c : arg) {
      text += kHex[c >> 4];
      text += kHex[c & 15];
    }
    text += "\n";
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return Send(text);
}

Status TcpRendezvous::SpawnState(std::string* state) {
  std::lock_guard<std::mutex> lock(mutex_);
  HORA_RETURN_IF_ERROR(Send("SPAWNSTATE\n"));
  std::string line;
  HORA_RETURN_IF_ERROR(ReadLine(&line));
  if (line.rfind("SPAWNSTATE ", 0) != 0) {
    return Status::Internal("the launcher's rendezvous sent '" + line + "'");
  }
  *state = line.substr(11);
  return Status::OK();
}

Status TcpRendezvous::CancelSpawn(int64_t generation) {
  std::lock_guard<std::mutex> lock(mutex_);
  return Send("CANCEL " + std::to_string(generation) + "\n");
}

Status TcpRendezvous::Leave() {
  std::lock_guard<std::mutex> lock(mutex_);
  return Send("LEAVE\n");
}

Status TcpRendezvous::Place(const std::string& hostname, std::vector<std::string>* hosts,
                            int* rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  HORA_RETURN_IF_ERROR(Send("PLACE " + hostname + "\n"));
  std::string line;
  HORA_RETURN_IF_ERROR(ReadLine(&line));
  std::istringstream words(line);
  std::string kind;
  int size = 0;
  words >> kind >> *rank >> size;
  if (kind == "ABORT")
    return Status::Internal("the launcher ended this process's start:" + line.substr(5));
  if (kind != "PLACE" || !words || size <= 0 || *rank < 0 || *rank >= size) {
    return Status::Internal("the launcher's rendezvous sent '" + line + "'");
  }
  hosts->clear();
  for (int r = 0; r < size; ++r) {
    HORA_RETURN_IF_ERROR(ReadLine(&line));
    hosts->push_back(line);
  }
  return Status::OK();
}

Status TcpRendezvous::FormWorld(const std::string& kind, const std::string& hostname,
                                std::shared_ptr<TcpFabric>* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  out->reset();
  TcpWorldSpec spec;
  int port = 0;
  HORA_RETURN_IF_ERROR(sockets::Listen(SOMAXCONN, &spec.listen_fd, &port));
  std::string addresses;
  for (const std::string& ip : sockets::LocalAddresses()) {
    addresses += (addresses.empty() ? "" : ",") + ip;
  }
  const std::string form =
      "FORM " + kind + " " + hostname + " " + std::to_string(port) + " " + addresses + "\n";
  if (!sockets::TransferAll(fd_, const_cast<char*>(form.data()), form.size(), true, 5000)) {
    close(spec.listen_fd);
    return Status::Internal("the launcher's rendezvous at " + address_ + " is gone");
  }
  std::string line;
  Status status = ReadLine(&line);
  std::istringstream words(line);
  std::string answer;
  int size = 0;
  words >> answer;
  if (status.ok() && answer == "ABORT") {
    std::string reason;
    std::getline(words, reason);
    status = Status::Internal("the launcher ended the job:" + reason);
  } else if (status.ok() && answer == "WORLD") {
    int64_t generation = 0;
    words >> generation >> spec.rank >> size >> spec.cookie;
    if (!words || size <= 0 || spec.rank < 0 || spec.rank >= size) {
      status = Status::Internal("the launcher's rendezvous sent '" + line + "'");
    } else {
      generation_ = generation;
    }
  } else if (status.ok()) {
    status = Status::Internal("the launcher's rendezvous sent '" + line + "'");
  }
  for (int r = 0; status.ok() && r < size; ++r) {
    status = ReadLine(&line);
    if (!status.ok()) break;
    std::istringstream peer_words(line);
    TcpPeer peer;
    std::string list;
    peer_words >> peer.hostname >> peer.port >> list;
    std::istringstream items(list);
    std::string item;
    while (std::getline(items, item, ',')) {
      if (!item.empty()) peer.addresses.push_back(item);
    }
    if (!peer_words || peer.addresses.empty()) {
      status = Status::Internal("the launcher's rendezvous sent '" + line + "'");
    }
    spec.peers.push_back(std::move(peer));
  }
  if (!status.ok()) {
    close(spec.listen_fd);
    return status;
  }
  return TcpFabric::Connect(spec, out);
}

}  // namespace hora
