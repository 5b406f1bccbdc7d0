#include "hora/comm/tcp/tcp_world.h"

#include <unistd.h>

#include <mutex>

#include "hora/comm/tcp/tcp_communicator.h"
#include "hora/comm/tcp/tcp_rendezvous.h"

namespace hora {
namespace {

// One connection to the launcher for the process's life: worlds come and
// go over it, and its closing at exit tells the launcher this process ended.
std::mutex g_mutex;
std::unique_ptr<TcpRendezvous> g_rendezvous;

}  // namespace

Status CreateTcpWorld(const TcpWorldOptions& options, std::unique_ptr<Communicator>* out) {
  out->reset();
  std::string hostname = options.hostname;
  if (hostname.empty()) {
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    hostname = name;
  }
  TcpRendezvous* rendezvous;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_rendezvous) {
      HORA_RETURN_IF_ERROR(TcpRendezvous::Connect(options.rendezvous, options.cookie,
                                                  options.process_id, &g_rendezvous));
    }
    rendezvous = g_rendezvous.get();
  }
  std::shared_ptr<TcpFabric> fabric;
  HORA_RETURN_IF_ERROR(rendezvous->FormWorld(hostname, &fabric));
  *out = TcpCommunicator::World(std::move(fabric), rendezvous);
  return Status::OK();
}

}  // namespace hora
