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

std::string HostName(const TcpWorldOptions& options) {
  if (!options.hostname.empty()) return options.hostname;
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

Status ProcessRendezvous(const TcpWorldOptions& options, TcpRendezvous** out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_rendezvous) {
    HORA_RETURN_IF_ERROR(TcpRendezvous::Connect(options.rendezvous, options.cookie,
                                                options.process_id, &g_rendezvous));
  }
  *out = g_rendezvous.get();
  return Status::OK();
}

Status Form(const TcpWorldOptions& options, const char* kind, std::unique_ptr<Communicator>* out) {
  out->reset();
  TcpRendezvous* rendezvous;
  HORA_RETURN_IF_ERROR(ProcessRendezvous(options, &rendezvous));
  std::shared_ptr<TcpFabric> fabric;
  HORA_RETURN_IF_ERROR(rendezvous->FormWorld(kind, HostName(options), &fabric));
  *out = TcpCommunicator::World(std::move(fabric), rendezvous);
  return Status::OK();
}

}  // namespace

Status CreateTcpWorld(const TcpWorldOptions& options, std::unique_ptr<Communicator>* out) {
  return Form(options, "init", out);
}

Status StartTcpJoining(const TcpWorldOptions& options, Topology* place) {
  TcpRendezvous* rendezvous;
  HORA_RETURN_IF_ERROR(ProcessRendezvous(options, &rendezvous));
  std::vector<std::string> hosts;
  int rank = 0;
  HORA_RETURN_IF_ERROR(rendezvous->Place(HostName(options), &hosts, &rank));
  *place = TcpTopology(hosts, rank);
  return Status::OK();
}

Status FinishTcpJoining(const TcpWorldOptions& options, std::unique_ptr<Communicator>* out) {
  return Form(options, "join", out);
}

}  // namespace hora
