#pragma once
// Small helpers over POSIX TCP sockets, shared by the transports' own
// connections: the wake-up star (wakeup/) and hora's TCP transport (tcp/).
#include <cstddef>
#include <string>
#include <vector>

#include "hora/common/status.h"

namespace hora {
namespace sockets {

// A listening IPv4 socket on every interface and an ephemeral port.
Status Listen(int backlog, int* fd, int* port);
// A blocking connected socket to ip:port, or -1 after `timeout_ms`.
int ConnectWithTimeout(const std::string& ip, int port, int timeout_ms);
// Reads or writes exactly n bytes on a blocking socket, giving up after
// timeout_ms of silence so a peer that vanished during set-up cannot hang.
bool TransferAll(int fd, char* data, size_t n, bool write, int timeout_ms);
void SetNoDelay(int fd);
void SetNonBlocking(int fd, bool on);
// This machine's IPv4 addresses, 127.0.0.1 first.
std::vector<std::string> LocalAddresses();
// "what: strerror(errno)" as an internal error.
Status Errno(const std::string& what);

}  // namespace sockets
}  // namespace hora
