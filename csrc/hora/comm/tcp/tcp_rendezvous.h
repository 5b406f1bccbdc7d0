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
//   process -> launcher   FORM <kind> <hostname> <port> <address,address,...>
//   launcher -> process   WORLD <generation> <rank> <size> <world cookie>
//                         then one line per rank: <hostname> <port> <addresses>
//   launcher -> process   ABORT <reason>
//
// FORM asks to be in the next world, listening at <port>; the launcher
// answers once every member of the current world it counts as alive has
// asked (a process that does not ask in time is counted as lost, and the
// launcher ends it). <kind> says why: init (the first world), shrink
// (after a loss: processes started for the old world are not taken in),
// merge (the world takes in the processes it started that are ready), or
// join (such a process, ready).
//
// Growth: a world's rank 0 asks the launcher to start processes,
//
//   process -> launcher   SPAWN <count> <host:count,...|-> <argc>
//                         then argc lines, each an argument in hex
//   process -> launcher   SPAWNSTATE          (answered: SPAWNSTATE <state> [why])
//   process -> launcher   CANCEL <generation> (those started for that world
//                                              and not taken in are not
//                                              needed after all)
//
// and each of those asks where it will be (answered once all of them have):
//
//   process -> launcher   PLACE <hostname>
//   launcher -> process   PLACE <rank> <size>, then one hostname per rank
//
// A process that leaves the job while the others go on (its host was
// removed) says so, and is not waited for in forming the next world:
//
//   process -> launcher   LEAVE
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hora/comm/tcp/tcp_fabric.h"

namespace hora {

class TcpRendezvous {
 public:
  // `address` is "host:port" (an IPv4 address or a name).
  static Status Connect(const std::string& address, uint64_t cookie, int64_t process_id,
                        std::unique_ptr<TcpRendezvous>* out);
  ~TcpRendezvous();

  // Asks for the next world and connects to it; collective over the
  // processes the launcher puts in it. `kind`: init, shrink, merge or join
  // (see above); `hostname` is the host this process counts as.
  Status FormWorld(const std::string& kind, const std::string& hostname,
                   std::shared_ptr<TcpFabric>* out);

  // Growth (rank 0 of a world): starts `count` processes running `argv`,
  // placed as `hosts` says ("host:count,...", empty: where the launcher
  // finds room); their state ("starting", "ready", or "failed: why");
  // gives them up.
  Status Spawn(int count, const std::vector<std::string>& argv, const std::string& hosts);
  Status SpawnState(std::string* state);
  // Gives up the processes started for the world of `generation` that no
  // world took in. (Naming the world keeps a late CANCEL from ending the
  // processes of a spawn asked for by the next world.)
  Status CancelSpawn(int64_t generation);
  // The generation of the last world this process was put in.
  int64_t generation() const { return generation_.load(); }
  // This process leaves the job: the next world is formed without it.
  Status Leave();
  // A process started by Spawn: the hosts of the world it will be in, in
  // rank order, and its rank there.
  Status Place(const std::string& hostname, std::vector<std::string>* hosts, int* rank);

 private:
  TcpRendezvous(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  Status ReadLine(std::string* line);
  Status Send(const std::string& text);

  std::mutex mutex_;  // one request and its answer at a time
  int fd_;
  std::string address_;
  std::string buffered_;
  std::atomic<int64_t> generation_{0};
};

}  // namespace hora
