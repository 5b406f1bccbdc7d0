#pragma once
// The connections of one world of hora's TCP transport: a socket to every
// other process, and a thread that moves every byte.
//
// Messages carry a context (which communicator of the world they belong
// to: the world itself, its local and cross parts, process sets), a tag
// and a length. A receive matches the oldest message of its (context,
// source, tag); messages of one such triple arrive in the order they were
// sent, as MPI guarantees, because one peer's messages share one stream.
//
// Any thread may post and wait, so communicators of one world may be used
// from several threads at once (each process set's engine has its own).
// One thread at a time moves the bytes (the driver): a thread waiting for a
// request drives while it waits, so the message it waits for is read by the
// thread that needs it, with no hand-over between threads; the progress
// thread drives once nobody has waited for a while, so that a process busy
// elsewhere still drains its sockets and sees a peer fail. A peer whose
// connection fails is lost: every pending and later message to or from it
// fails, naming it. Revoke fails everything on every process of the
// world, as ULFM's MPI_Comm_revoke does for an MPI communicator.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "hora/common/status.h"

namespace hora {

// Where a process of the world listens, and which host it is on.
struct TcpPeer {
  std::string hostname;
  std::vector<std::string> addresses;  // IPv4, tried in order
  int port = 0;
};

// Everything a process needs to connect to its world.
struct TcpWorldSpec {
  int rank = 0;
  std::vector<TcpPeer> peers;  // index = rank
  // Identifies the world: a connection that does not carry it (a stray
  // process, a process of an earlier world) is refused.
  uint64_t cookie = 0;
  // This process's listening socket (taken over and closed once every
  // higher rank has connected).
  int listen_fd = -1;
  std::chrono::milliseconds timeout{120000};
};

class TcpFabric {
 public:
  // Connects to every other process of the world: to the lower ranks, and
  // accepts the higher ones. Collective over the world's processes.
  static Status Connect(const TcpWorldSpec& spec, std::shared_ptr<TcpFabric>* out);
  ~TcpFabric();

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(hostnames_.size()); }
  const std::vector<std::string>& hostnames() const { return hostnames_; }

  class Request;
  // Post a message to, or a receive from, a process of the world (its rank
  // in the world). The buffer must stay valid until the request completes.
  std::shared_ptr<Request> PostSend(uint64_t context, int tag, const void* data, int64_t bytes,
                                    int dest);
  std::shared_ptr<Request> PostRecv(uint64_t context, int tag, void* data, int64_t bytes,
                                    int source);
  // Blocks until the request completes; its result.
  Status Wait(const std::shared_ptr<Request>& request);
  // Waits until every request has completed or one has failed; a failure
  // cancels the others (a peer that is alive may never answer them: it
  // failed too) and is returned.
  Status WaitAll(const std::vector<std::shared_ptr<Request>>& requests);
  // Abandons a request nobody will wait for (its caller failed before):
  // the fabric no longer touches its buffer once this returns. A message
  // it was matched with is dropped.
  void Cancel(const std::shared_ptr<Request>& request);

  // Fails every pending and later request here and, by a notice over every
  // connection, on every other process of the world. Any thread may call it.
  void Revoke(const std::string& why);
  // "lost rank 2 (host h): why" for the first peer this process lost, or
  // empty: a revoke says what caused it.
  std::string FirstLoss();

 private:
  struct Header {
    uint64_t context;
    int32_t tag;
    int32_t kind;  // kData, or a notice
    int64_t bytes;
  };
  static constexpr int32_t kData = 0;
  static constexpr int32_t kRevokeNotice = 1;

  struct Unexpected {
    std::string data;
    bool complete = false;
    std::shared_ptr<Request> claimed;  // a receive posted while it arrived
  };
  using Key = std::tuple<uint64_t, int, int>;  // context, peer, tag

  struct Peer {
    int fd = -1;
    bool lost = false;
    std::string why;
    std::deque<std::shared_ptr<Request>> sends;
    int64_t sent = 0;  // of the front send, header included
    Header in{};
    int64_t header_got = 0;
    int64_t payload_got = 0;
    std::shared_ptr<Request> into;           // the receive being filled
    std::shared_ptr<Unexpected> unexpected;  // or the message being kept
                                             // (neither: bytes nobody takes)
  };

  TcpFabric(int rank, std::vector<std::string> hostnames);
  void Loop();
  void Wake();
  // Claims the sockets, waits in poll() until one of them or the wake-up
  // descriptor is ready, and handles what is. With the lock held (released
  // while it polls) and nobody else driving.
  void Drive(std::unique_lock<std::mutex>& lock);
  // Drives, or sleeps while another thread drives, until `done()`. With the
  // lock held.
  template <typename Done>
  void WaitUntil(std::unique_lock<std::mutex>& lock, Done done);
  // With mutex_ held.
  void ReadFrom(int peer);
  bool StartMessage(int peer);  // a header is in; false on a protocol error
  // `by_poster`: from PostSend, whose caller alone waits for that send.
  void WriteTo(int peer, bool by_poster = false);
  void LosePeer(int peer, const std::string& why);
  void RevokeLocked(std::string why);  // a copy: `why` may live in what it frees
  // Wakes a driver in poll() unless `wake_driver` is false (nobody it
  // serves waits for the request).
  void Complete(const std::shared_ptr<Request>& request, Status status, bool wake_driver = true);
  std::string Name(int peer) const;

  const int rank_;
  const std::vector<std::string> hostnames_;
  std::mutex mutex_;
  std::condition_variable completed_;
  std::vector<Peer> peers_;
  std::map<Key, std::deque<std::shared_ptr<Request>>> posted_;
  std::map<Key, std::deque<std::shared_ptr<Unexpected>>> unexpected_;
  std::atomic<bool> revoked_{false};
  std::string revoked_why_;
  std::string first_loss_;
  bool stopping_ = false;
  bool driving_ = false;
  std::thread::id driver_;
  int waiters_ = 0;                                    // threads in Wait or WaitAll
  std::chrono::steady_clock::time_point last_wait_;    // when a wait last ended
  std::chrono::steady_clock::time_point last_driven_;  // and a driver's round
  std::condition_variable idle_;                       // the progress thread's sleep
  int wake_fd_ = -1;
  std::thread thread_;
};

class TcpFabric::Request {
 private:
  friend class TcpFabric;
  bool send = false;
  uint64_t context = 0;
  int tag = 0;
  int peer = 0;
  char* data = nullptr;
  int64_t bytes = 0;
  Header header{};
  std::string owned;  // a notice's payload
  bool done_ = false;
  Status status;
};

}  // namespace hora
