#pragma once
// TCP connections in a star around rank 0, for the engine's small
// out-of-band messages (wake-ups, heartbeats): rank 0 listens, the others
// connect to it. Set up collectively over a communicator, which carries
// rank 0's address and a cookie that keeps stray local connections out.
#include <string>
#include <vector>

#include "hora/comm/communicator.h"

namespace hora {

// Collective over `comm`. On rank 0, `fds` gets one connected socket per
// rank (-1 at index 0); on the others, one socket to rank 0. The sockets
// are non-blocking, with Nagle off. `purpose` names them in errors.
Status ConnectStar(Communicator* comm, const std::string& purpose, std::vector<int>* fds);

// Best-effort send of `text` without blocking: true when all of it went.
bool SendNow(int fd, const std::string& text);

}  // namespace hora
