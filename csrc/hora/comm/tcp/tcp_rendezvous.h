#pragma once
// A process's connection to the launcher's rendezvous, which decides the
// membership of every world of a job over hora's TCP transport: the first
// one, and each one formed in place after a loss.
//
// The launcher is the one party every process already depends on (its
// loss ends the job), so deciding there adds no new point of failure, and
// it knows first-hand which of the processes it started have ended. The
// protocol is lines of text over one TCP connection that stays open for
// the process's life (its closing tells the launcher the process is gone):
//
//   process -> launcher   HELLO <cookie> <process id>
//   process -> launcher   FORM <hostname> <port> <address,address,...>
//   launcher -> process   WORLD <generation> <rank> <size> <world cookie>
//                         then one line per rank: <hostname> <port> <addresses>
//   launcher -> process   ABORT <reason>
//
// FORM asks to be in the next world, listening at <port>; the launcher
// answers once every process it counts as alive has asked (a process that
// does not ask in time is counted as lost, and the launcher ends it).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "hora/comm/tcp/tcp_fabric.h"

namespace hora {

class TcpRendezvous {
 public:
  // `address` is "host:port" (an IPv4 address or a name).
  static Status Connect(const std::string& address, uint64_t cookie, int64_t process_id,
                        std::unique_ptr<TcpRendezvous>* out);
  ~TcpRendezvous();

  // Asks for the next world and connects to it; collective over the
  // processes the launcher puts in it. `hostname` is the host this process
  // counts as.
  Status FormWorld(const std::string& hostname, std::shared_ptr<TcpFabric>* out);
  int64_t generation() const { return generation_; }

 private:
  TcpRendezvous(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  Status ReadLine(std::string* line);

  int fd_;
  std::string address_;
  std::string buffered_;
  int64_t generation_ = -1;
};

}  // namespace hora
