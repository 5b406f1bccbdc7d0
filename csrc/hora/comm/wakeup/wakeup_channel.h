#pragma once
// Lets idle engine threads sleep in the kernel instead of spinning.
//
// Every negotiation cycle is collective, so all ranks must enter it together;
// but MPI has no way to block without busy-polling a core. Rank 0 therefore
// decides when a cycle runs: a rank with new work sends it one byte ("want"),
// rank 0 answers every rank with one byte ("start") per cycle, and everyone
// else sleeps in poll() on a TCP socket and an eventfd. An idle job costs no
// CPU, and a lone tensor starts after two small messages instead of a tick.
// A closed socket also tells a rank at once that its peer process is gone.
#include <poll.h>

#include <memory>
#include <vector>

#include "hora/comm/communicator.h"

namespace hora {

class WakeupChannel {
 public:
  // Collective over `comm`: rank 0 listens, the others connect to it.
  static Status Create(Communicator* comm, std::unique_ptr<WakeupChannel>* out);
  ~WakeupChannel();

  // Any thread: wake this rank's engine because local work arrived.
  void NotifyLocal();

  struct Events {
    int wants = 0;       // rank 0: cycle requests received
    int starts = 0;      // other ranks: cycles rank 0 has started
    int lost_rank = -1;  // a peer whose connection closed
    // Other ranks: rank 0 told us it lost `lost_rank` (rather than rank 0's
    // own connection having closed).
    bool lost_reported = false;
    bool timed_out = false;  // nothing at all arrived within the timeout
  };
  // Sleeps until local work, a message, or `timeout_ms` (-1: no limit).
  Status Wait(int timeout_ms, Events* events);
  Status RequestCycle();  // ranks other than 0
  Status StartCycle();    // rank 0
  // Rank 0: tell every other rank which rank was lost, before it stops, so
  // that their errors name the rank that is gone rather than rank 0.
  void AnnounceLost(int lost_rank);

 private:
  WakeupChannel(int rank, int size) : rank_(rank), size_(size) {}
  Status SendByte(int fd, char byte, int peer);

  int rank_;
  int size_;
  int event_fd_ = -1;
  std::vector<int> peer_fds_;     // rank 0: one per rank (-1 for itself); others: rank 0's
  std::vector<pollfd> poll_fds_;  // engine thread only
  // Other ranks: digits of a lost-rank notice ("L<rank>\n") being read.
  bool reading_lost_ = false;
  int lost_digits_ = 0;
};

}  // namespace hora
