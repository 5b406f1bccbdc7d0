#include "hora/comm/tcp/tcp_fabric.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "hora/comm/tcp/sockets.h"

namespace hora {
namespace {

constexpr int kPeerConnectTimeoutMs = 10000;
// How long nobody must have waited before the progress thread drives: a
// caller between two waits (reducing what arrived, posting the next
// message) keeps the sockets, and its next wait needs no hand-over.
constexpr std::chrono::microseconds kHandBack{1000};
// And the longest the sockets go unpolled while waits keep ending at once
// (sends that went out whole, a one-process communicator's collectives):
// the progress thread drives then, whatever the waits.
constexpr std::chrono::milliseconds kLongestUndriven{10};

// The first bytes on every connection: who connects, and to which world.
struct Hello {
  uint64_t cookie;
  int32_t rank;
  int32_t reserved;
};

int64_t Elapsed(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               since)
      .count();
}

// Connects to `peer` and greets it; -1 when no address answers.
int ConnectTo(const TcpPeer& peer, const std::string& my_host, const Hello& hello, int timeout_ms) {
  for (const std::string& address : peer.addresses) {
    const bool loopback = address.rfind("127.", 0) == 0;
    if (loopback && peer.hostname != my_host && peer.addresses.size() > 1) continue;
    const int fd = sockets::ConnectWithTimeout(address, peer.port, kPeerConnectTimeoutMs);
    if (fd < 0) continue;
    Hello copy = hello;
    char accepted = 0;
    if (sockets::TransferAll(fd, reinterpret_cast<char*>(&copy), sizeof(copy), true, 5000) &&
        sockets::TransferAll(fd, &accepted, 1, false, timeout_ms) && accepted == 1) {
      return fd;
    }
    close(fd);
  }
  return -1;
}

}  // namespace

TcpFabric::TcpFabric(int rank, std::vector<std::string> hostnames)
    : rank_(rank), hostnames_(std::move(hostnames)), peers_(hostnames_.size()) {}

Status TcpFabric::Connect(const TcpWorldSpec& spec, std::shared_ptr<TcpFabric>* out) {
  out->reset();
  const int size = static_cast<int>(spec.peers.size());
  std::vector<std::string> hostnames;
  for (const TcpPeer& peer : spec.peers) hostnames.push_back(peer.hostname);
  std::shared_ptr<TcpFabric> fabric(new TcpFabric(spec.rank, hostnames));
  const std::string& my_host = hostnames[spec.rank];
  const auto began = std::chrono::steady_clock::now();
  const int timeout_ms = static_cast<int>(spec.timeout.count());
  Status status;
  // Lower ranks first: they accept us even while they are still connecting
  // to ranks below them (the kernel completes our connection meanwhile), so
  // nobody waits in a cycle.
  for (int peer = 0; peer < spec.rank && status.ok(); ++peer) {
    const int fd =
        ConnectTo(spec.peers[peer], my_host, Hello{spec.cookie, spec.rank, 0}, timeout_ms);
    if (fd < 0) {
      status = Status::Internal("could not connect to " + fabric->Name(peer) + " at port " +
                                std::to_string(spec.peers[peer].port));
    }
    fabric->peers_[peer].fd = fd;
  }
  int waiting = size - 1 - spec.rank;
  while (status.ok() && waiting > 0) {
    const int64_t left = timeout_ms - Elapsed(began);
    pollfd p{spec.listen_fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) {
      std::string missing;
      for (int peer = spec.rank + 1; peer < size; ++peer) {
        if (fabric->peers_[peer].fd < 0)
          missing += (missing.empty() ? "" : ", ") + fabric->Name(peer);
      }
      status = Status::Internal("timed out after " + std::to_string(timeout_ms / 1000) +
                                " s waiting for " + missing + " to connect");
      break;
    }
    const int fd = accept4(spec.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Hello hello{};
    if (!sockets::TransferAll(fd, reinterpret_cast<char*>(&hello), sizeof(hello), false, 5000) ||
        hello.cookie != spec.cookie || hello.rank <= spec.rank || hello.rank >= size ||
        fabric->peers_[hello.rank].fd != -1) {
      close(fd);  // not one of this world's processes
      continue;
    }
    char accepted = 1;
    if (!sockets::TransferAll(fd, &accepted, 1, true, 5000)) {
      close(fd);
      continue;
    }
    fabric->peers_[hello.rank].fd = fd;
    --waiting;
  }
  if (spec.listen_fd >= 0) close(spec.listen_fd);
  if (!status.ok()) return status;  // the destructor closes what was opened
  for (Peer& peer : fabric->peers_) {
    if (peer.fd < 0) continue;
    sockets::SetNoDelay(peer.fd);
    sockets::SetNonBlocking(peer.fd, true);
  }
  fabric->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fabric->wake_fd_ < 0) return sockets::Errno("eventfd");
  fabric->thread_ = std::thread([raw = fabric.get()] { raw->Loop(); });
  *out = std::move(fabric);
  return Status::OK();
}

TcpFabric::~TcpFabric() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (auto& entry : posted_) {
      for (auto& request : entry.second) Complete(request, Status::Shutdown("transport closed"));
    }
    posted_.clear();
  }
  if (thread_.joinable()) {
    Wake();
    idle_.notify_all();
    thread_.join();
  }
  for (Peer& peer : peers_) {
    if (peer.fd >= 0) close(peer.fd);
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

std::string TcpFabric::Name(int peer) const {
  return "rank " + std::to_string(peer) + " (host " + hostnames_[peer] + ")";
}

void TcpFabric::Wake() {
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

void TcpFabric::Complete(const std::shared_ptr<Request>& request, Status status, bool wake_driver) {
  if (request->done_) return;
  request->status = std::move(status);
  request->done_ = true;
  completed_.notify_all();
  // A driver waiting in poll() for this request learns of it only so.
  if (wake_driver && driving_ && driver_ != std::this_thread::get_id()) Wake();
}

template <typename Done>
void TcpFabric::WaitUntil(std::unique_lock<std::mutex>& lock, Done done) {
  // Counted while it waits, however it leaves (Drive may throw: a message
  // too large for the memory left).
  struct Waiting {
    TcpFabric* fabric;
    ~Waiting() {
      --fabric->waiters_;
      fabric->last_wait_ = std::chrono::steady_clock::now();
    }
  } waiting{this};
  ++waiters_;
  bool nudged = false;
  while (!done()) {
    if (!driving_) {
      Drive(lock);
      continue;
    }
    if (!nudged && driver_ == thread_.get_id()) {
      Wake();  // the progress thread hands over after this round
      nudged = true;
    }
    completed_.wait(lock);
  }
}

Status TcpFabric::Wait(const std::shared_ptr<Request>& request) {
  std::unique_lock<std::mutex> lock(mutex_);
  WaitUntil(lock, [&] { return request->done_; });
  return request->status;
}

Status TcpFabric::WaitAll(const std::vector<std::shared_ptr<Request>>& requests) {
  Status failed;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    WaitUntil(lock, [&] {
      bool all = true;
      for (const auto& request : requests) {
        if (request->done_ && !request->status.ok()) {
          failed = request->status;
          return true;
        }
        all = all && request->done_;
      }
      return all;
    });
  }
  if (failed.ok()) return failed;
  for (const auto& request : requests) Cancel(request);
  return failed;
}

std::shared_ptr<TcpFabric::Request> TcpFabric::PostSend(uint64_t context, int tag, const void* data,
                                                        int64_t bytes, int dest) {
  auto request = std::make_shared<Request>();
  request->send = true;
  request->context = context;
  request->tag = tag;
  request->peer = dest;
  request->data = static_cast<char*>(const_cast<void*>(data));
  request->bytes = bytes;
  request->header = Header{context, tag, kData, bytes};
  std::lock_guard<std::mutex> lock(mutex_);
  if (revoked_) {
    Complete(request, Status::Internal("the world was revoked: " + revoked_why_));
    return request;
  }
  if (dest == rank_) {
    // To itself: delivered at once, as if it had arrived.
    const Key key{context, rank_, tag};
    auto posted = posted_.find(key);
    if (posted != posted_.end() && !posted->second.empty()) {
      std::shared_ptr<Request> receive = posted->second.front();
      posted->second.pop_front();
      if (bytes > receive->bytes) {
        Complete(receive, Status::Internal("a message of " + std::to_string(bytes) +
                                           " bytes to itself is larger than its " +
                                           std::to_string(receive->bytes) + "-byte receive"));
      } else {
        if (bytes > 0) std::memcpy(receive->data, data, static_cast<size_t>(bytes));
        Complete(receive, Status::OK());
      }
    } else {
      auto kept = std::make_shared<Unexpected>();
      kept->data.assign(static_cast<const char*>(data), static_cast<size_t>(bytes));
      kept->complete = true;
      unexpected_[key].push_back(std::move(kept));
    }
    Complete(request, Status::OK());
    return request;
  }
  Peer& peer = peers_[dest];
  if (peer.lost) {
    Complete(request, Status::Internal("lost " + Name(dest) + ": " + peer.why));
    return request;
  }
  peer.sends.push_back(request);
  if (peer.sends.size() == 1) {
    WriteTo(dest, true);              // usually all of it goes at once, with no thread hand-off
    if (!peer.sends.empty()) Wake();  // the progress thread waits for room
  }
  return request;
}

std::shared_ptr<TcpFabric::Request> TcpFabric::PostRecv(uint64_t context, int tag, void* data,
                                                        int64_t bytes, int source) {
  auto request = std::make_shared<Request>();
  request->context = context;
  request->tag = tag;
  request->peer = source;
  request->data = static_cast<char*>(data);
  request->bytes = bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  if (revoked_) {
    Complete(request, Status::Internal("the world was revoked: " + revoked_why_));
    return request;
  }
  const Key key{context, source, tag};
  auto kept = unexpected_.find(key);
  if (kept != unexpected_.end()) {
    for (auto it = kept->second.begin(); it != kept->second.end(); ++it) {
      std::shared_ptr<Unexpected> message = *it;
      if (message->claimed) continue;
      const int64_t length = static_cast<int64_t>(message->data.size());
      if (length > bytes) {
        kept->second.erase(it);
        if (!message->complete) message->claimed = request;  // its bytes are dropped
        Complete(request, Status::Internal("a message of " + std::to_string(length) +
                                           " bytes from " + Name(source) + " (tag " +
                                           std::to_string(tag) + ") is larger than its " +
                                           std::to_string(bytes) + "-byte receive"));
        return request;
      }
      if (message->complete) {
        if (length > 0) std::memcpy(data, message->data.data(), static_cast<size_t>(length));
        kept->second.erase(it);
        Complete(request, Status::OK());
      } else {
        message->claimed = request;
      }
      return request;
    }
  }
  if (source != rank_ && peers_[source].lost) {
    Complete(request, Status::Internal("lost " + Name(source) + ": " + peers_[source].why));
    return request;
  }
  posted_[key].push_back(request);
  return request;
}

void TcpFabric::Cancel(const std::shared_ptr<Request>& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (request->done_) return;
  const Status cancelled = Status::Internal("cancelled");
  if (request->peer == rank_) {
    // Only a receive from itself can be pending here.
    auto posted = posted_.find(Key{request->context, rank_, request->tag});
    if (posted != posted_.end()) {
      for (auto it = posted->second.begin(); it != posted->second.end(); ++it) {
        if (*it == request) {
          posted->second.erase(it);
          break;
        }
      }
    }
    Complete(request, cancelled);
    return;
  }
  Peer& peer = peers_[request->peer];
  if (request->send) {
    for (auto it = peer.sends.begin(); it != peer.sends.end(); ++it) {
      if (*it != request) continue;
      if (it == peer.sends.begin() && peer.sent > 0) {
        // Half on the wire: the rest goes from a copy.
        request->owned.assign(request->data, static_cast<size_t>(request->bytes));
        request->data = &request->owned[0];
      } else {
        peer.sends.erase(it);
      }
      break;
    }
    Complete(request, cancelled);
    return;
  }
  if (peer.into == request) peer.into.reset();  // the rest of it is dropped
  auto posted = posted_.find(Key{request->context, request->peer, request->tag});
  if (posted != posted_.end()) {
    for (auto it = posted->second.begin(); it != posted->second.end(); ++it) {
      if (*it == request) {
        posted->second.erase(it);
        break;
      }
    }
  }
  auto kept = unexpected_.find(Key{request->context, request->peer, request->tag});
  if (kept != unexpected_.end()) {
    for (auto it = kept->second.begin(); it != kept->second.end(); ++it) {
      if ((*it)->claimed == request) {
        kept->second.erase(it);
        break;
      }
    }
  }
  if (peer.unexpected && peer.unexpected->claimed == request) peer.unexpected.reset();
  Complete(request, cancelled);
}

std::string TcpFabric::FirstLoss() {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_loss_;
}

void TcpFabric::Revoke(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  RevokeLocked(why);
}

void TcpFabric::RevokeLocked(std::string why) {
  if (revoked_) return;
  revoked_ = true;
  revoked_why_ = why;
  const Status status = Status::Internal("the world was revoked: " + why);
  for (auto& entry : posted_) {
    for (auto& request : entry.second) Complete(request, status);
  }
  posted_.clear();
  for (auto& entry : unexpected_) {
    for (auto& message : entry.second) {
      if (message->claimed) Complete(message->claimed, status);
    }
  }
  unexpected_.clear();
  for (int p = 0; p < size(); ++p) {
    Peer& peer = peers_[p];
    if (peer.into) Complete(peer.into, status);
    peer.into.reset();
    if (peer.unexpected) peer.unexpected.reset();
    if (p == rank_ || peer.lost) continue;
    // A send half on the wire is finished from a copy (the caller may free
    // its buffer once told), so that the notice starts on a message boundary.
    std::deque<std::shared_ptr<Request>> keep;
    for (auto& request : peer.sends) {
      if (keep.empty() && peer.sent > 0) {
        request->owned.assign(request->data, static_cast<size_t>(request->bytes));
        request->data = &request->owned[0];
        keep.push_back(request);
      }
      Complete(request, status);
    }
    peer.sends.swap(keep);
    auto notice = std::make_shared<Request>();
    notice->send = true;
    notice->peer = p;
    notice->owned = why;
    notice->data = &notice->owned[0];
    notice->bytes = static_cast<int64_t>(why.size());
    notice->header = Header{0, 0, kRevokeNotice, notice->bytes};
    notice->done_ = true;  // nobody waits for it
    peer.sends.push_back(notice);
  }
  Wake();
}

void TcpFabric::LosePeer(int p, const std::string& why) {
  Peer& peer = peers_[p];
  if (peer.lost) return;
  peer.lost = true;
  peer.why = why;
  const Status status = Status::Internal("lost " + Name(p) + ": " + why);
  if (first_loss_.empty()) first_loss_ = status.message();
  for (auto& request : peer.sends) Complete(request, status);
  peer.sends.clear();
  if (peer.into) Complete(peer.into, status);
  peer.into.reset();
  if (peer.unexpected && peer.unexpected->claimed) Complete(peer.unexpected->claimed, status);
  peer.unexpected.reset();
  for (auto it = posted_.begin(); it != posted_.end();) {
    if (std::get<1>(it->first) == p) {
      for (auto& request : it->second) Complete(request, status);
      it = posted_.erase(it);
    } else {
      ++it;
    }
  }
  if (peer.fd >= 0) shutdown(peer.fd, SHUT_RDWR);  // closed with the fabric
  Wake();
}

void TcpFabric::WriteTo(int p, bool by_poster) {
  Peer& peer = peers_[p];
  while (!peer.lost && !peer.sends.empty()) {
    Request& request = *peer.sends.front();
    const int64_t header_bytes = sizeof(Header);
    const int64_t total = header_bytes + request.bytes;
    iovec parts[2];
    int count = 0;
    if (peer.sent < header_bytes) {
      parts[count++] = iovec{reinterpret_cast<char*>(&request.header) + peer.sent,
                             static_cast<size_t>(header_bytes - peer.sent)};
      if (request.bytes > 0) {
        parts[count++] = iovec{request.data, static_cast<size_t>(request.bytes)};
      }
    } else {
      parts[count++] =
          iovec{request.data + (peer.sent - header_bytes), static_cast<size_t>(total - peer.sent)};
    }
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t sent = sendmsg(peer.fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      LosePeer(p, std::string("sending failed: ") + std::strerror(errno));
      return;
    }
    peer.sent += sent;
    if (peer.sent < total) continue;
    std::shared_ptr<Request> finished = peer.sends.front();
    peer.sends.pop_front();
    peer.sent = 0;
    Complete(finished, Status::OK(), !by_poster);
  }
}

bool TcpFabric::StartMessage(int p) {
  Peer& peer = peers_[p];
  peer.payload_got = 0;
  const Header& in = peer.in;
  if (in.bytes < 0 || (in.kind != kData && in.kind != kRevokeNotice)) {
    LosePeer(p, "it sent bytes that are not hora's TCP protocol");
    return false;
  }
  // A message nobody has asked for yet is kept until someone does.
  auto keep = [&]() {
    try {
      peer.unexpected = std::make_shared<Unexpected>();
      peer.unexpected->data.resize(static_cast<size_t>(in.bytes));
      return true;
    } catch (const std::bad_alloc&) {
      peer.unexpected.reset();
      LosePeer(p, "out of memory for its " + std::to_string(in.bytes) +
                      "-byte message, which arrived before its receive was posted");
      return false;
    }
  };
  if (in.kind == kRevokeNotice) return keep();
  if (revoked_) return true;  // its bytes are dropped
  const Key key{in.context, p, in.tag};
  auto posted = posted_.find(key);
  if (posted != posted_.end() && !posted->second.empty()) {
    std::shared_ptr<Request> receive = posted->second.front();
    posted->second.pop_front();
    if (in.bytes > receive->bytes) {
      Complete(receive, Status::Internal("a message of " + std::to_string(in.bytes) +
                                         " bytes from " + Name(p) + " (tag " +
                                         std::to_string(in.tag) + ") is larger than its " +
                                         std::to_string(receive->bytes) + "-byte receive"));
    } else {
      peer.into = std::move(receive);
    }
    return true;
  }
  if (!keep()) return false;
  unexpected_[key].push_back(peer.unexpected);
  return true;
}

void TcpFabric::ReadFrom(int p) {
  Peer& peer = peers_[p];
  static thread_local std::vector<char> scratch(1 << 16);
  const int64_t header_bytes = sizeof(Header);
  while (!peer.lost) {
    char* target;
    int64_t want;
    const bool in_header = peer.header_got < header_bytes;
    if (in_header) {
      target = reinterpret_cast<char*>(&peer.in) + peer.header_got;
      want = header_bytes - peer.header_got;
    } else if (peer.into) {
      target = peer.into->data + peer.payload_got;
      want = peer.in.bytes - peer.payload_got;
    } else if (peer.unexpected) {
      target = &peer.unexpected->data[0] + peer.payload_got;
      want = peer.in.bytes - peer.payload_got;
    } else {
      target = scratch.data();
      want =
          std::min<int64_t>(peer.in.bytes - peer.payload_got, static_cast<int64_t>(scratch.size()));
    }
    if (want > 0) {
      const ssize_t got = recv(peer.fd, target, static_cast<size_t>(want), MSG_DONTWAIT);
      if (got == 0) {
        LosePeer(p, "its connection closed (the process ended, or its host is gone)");
        return;
      }
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        LosePeer(p, std::string("receiving failed: ") + std::strerror(errno));
        return;
      }
      if (in_header) {
        peer.header_got += got;
        if (peer.header_got < header_bytes) continue;
        if (!StartMessage(p)) return;
      } else {
        peer.payload_got += got;
      }
    } else if (in_header) {
      continue;
    }
    if (peer.header_got < header_bytes || peer.payload_got < peer.in.bytes) continue;
    // A whole message is in.
    const bool notice = peer.in.kind == kRevokeNotice;
    if (notice) {
      if (peer.unexpected) RevokeLocked(peer.unexpected->data);
      peer.unexpected.reset();
    } else if (peer.into) {
      Complete(peer.into, Status::OK());
      peer.into.reset();
    } else if (peer.unexpected) {
      std::shared_ptr<Unexpected> message = std::move(peer.unexpected);
      message->complete = true;
      if (message->claimed) {
        std::shared_ptr<Request> receive = message->claimed;
        if (!receive->done_ && !message->data.empty()) {
          std::memcpy(receive->data, message->data.data(), message->data.size());
        }
        Complete(receive, Status::OK());
        auto kept = unexpected_.find(Key{peer.in.context, p, peer.in.tag});
        if (kept != unexpected_.end()) {
          for (auto it = kept->second.begin(); it != kept->second.end(); ++it) {
            if (*it == message) {
              kept->second.erase(it);
              break;
            }
          }
        }
      }
    }
    peer.header_got = 0;
    peer.payload_got = 0;
  }
}

void TcpFabric::Drive(std::unique_lock<std::mutex>& lock) {
  driving_ = true;
  driver_ = std::this_thread::get_id();
  // The sockets are handed back however this returns, with the lock held.
  struct Driving {
    TcpFabric* fabric;
    std::unique_lock<std::mutex>& lock;
    ~Driving() {
      if (!lock.owns_lock()) lock.lock();
      fabric->driving_ = false;
      fabric->driver_ = std::thread::id();
      fabric->last_driven_ = std::chrono::steady_clock::now();
      fabric->completed_.notify_all();  // a thread that waited for the sockets may take them
    }
  } driving{this, lock};
  static thread_local std::vector<pollfd> polled;
  static thread_local std::vector<int> which;
  polled.assign(1, pollfd{wake_fd_, POLLIN, 0});
  which.clear();
  for (int p = 0; p < size(); ++p) {
    const Peer& peer = peers_[p];
    if (p == rank_ || peer.lost || peer.fd < 0) continue;
    short events = POLLIN;
    if (!peer.sends.empty()) events |= POLLOUT;
    polled.push_back(pollfd{peer.fd, events, 0});
    which.push_back(p);
  }
  lock.unlock();
  const int ready = poll(polled.data(), polled.size(), -1);
  lock.lock();
  if (ready > 0) {
    if (polled[0].revents & POLLIN) {
      uint64_t count;
      ssize_t ignored = read(wake_fd_, &count, sizeof(count));
      (void)ignored;
    }
    for (size_t k = 0; k < which.size(); ++k) {
      const int p = which[k];
      const short events = polled[k + 1].revents;
      if (events == 0 || peers_[p].lost) continue;
      if (events & (POLLIN | POLLHUP | POLLERR)) ReadFrom(p);
      if (!peers_[p].lost && (events & POLLOUT)) WriteTo(p);
      if (!peers_[p].lost && (events & POLLERR)) LosePeer(p, "its connection failed");
    }
  }
}

void TcpFabric::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    const bool kept = now - last_wait_ < kHandBack && now - last_driven_ < kLongestUndriven;
    if (driving_ || waiters_ > 0 || kept) {
      idle_.wait_for(lock, kHandBack);
      continue;
    }
    Drive(lock);
  }
}

}  // namespace hora
