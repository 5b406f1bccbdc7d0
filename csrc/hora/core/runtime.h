#pragma once
// The process's hora: init and shutdown, the one engine, exit, and what the
// build can do. The bindings only convert arguments and results; every
// decision about the runtime's state is made here.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hora/common/status.h"
#include "hora/core/engine.h"

namespace hora {
namespace runtime {

struct InitOptions {
  // An mpi4py communicator's handle, when has_comm is set.
  bool has_comm = false;
  intptr_t comm_handle = 0;
  std::vector<int> ranks;  // a subset of the world, or empty
  // init(process_sets="dynamic"): as HORA_DYNAMIC_PROCESS_SETS=1.
  bool dynamic_process_sets = false;
};

// Reads the configuration, forms the world and starts the engine;
// collective over the world's ranks. Does nothing when hora is running.
// A process started to replace a lost rank (StartGrowth) learns its place
// in the world instead and joins it later, with Join.
Status Init(const InitOptions& options);
// Whether this process waits to join (Init was called, Join not yet).
bool Joining();
// Joins the world this process was started for (collective with the
// world's Grow) and starts the engine.
Status Join(double* seconds);
// This process's place: the engine's, or the one it will have once joined.
Status CurrentTopology(Topology* out);
// Stops the engine (telling the other ranks); idempotent.
void Shutdown();
bool IsInitialized();
// After a lost rank: the survivors form a world of their own in place and
// start a new engine over it, keeping their processes (ULFM; see
// Communicator::Shrink). Collective over the survivors; the process sets
// are gone with the old world. `seconds` gets how long it took.
Status Reform(double* seconds);
// Hosts removed from the job: the ranks `leaving` leave the world, and the
// others form one of their own in place and start a new engine over it
// (Communicator::Exclude). Collective over every rank, the leaving ones
// included, which are left with no engine (`left` set; they exit). Like
// Reform, it abandons a growth under way and ends the process sets.
Status Exclude(const std::vector<int>& leaving, bool* left, double* seconds);
// Growth in place: StartGrowth starts `count` processes running `argv`,
// which join the world (Communicator::StartSpawn); collective, and
// returns at once while the engine goes on. Growth says how far it is
// (why it failed, Grow says). Grow, collective over the world and the new processes, then forms
// the world of both (the new ones last) and starts a new engine over it;
// when a new process was lost on the way it fails alike everywhere and
// the old engine goes on. A Reform abandons a growth under way.
Status StartGrowth(const std::vector<std::string>& argv, int count,
                   const Communicator::SpawnInfo& info);
// Gives up the growth under way (its processes are told they are not
// needed, or ended); collective, as StartGrowth.
void CancelGrowth();
enum class GrowthState { kNone, kStarting, kReady, kFailed };
GrowthState Growth();
Status Grow(double* seconds);
// The running engine, or an error naming the fix (init first, or again
// after a shutdown).
Status Current(std::shared_ptr<Engine>* out);
// At process exit: shuts down and finalizes MPI if hora initialized it,
// unless the job broke (MPI_Finalize would wait for ranks that are gone).
// After the world re-formed without lost ranks, MPI_Finalize gets 10 s; a
// process still inside it then ends with `exit_code` (the status the
// program was ending with) without it.
void FinalizeProcess(int exit_code);

// What this build was compiled with and what it finds at run time.
struct BuildInfo {
  std::map<std::string, std::string> text;  // versions, paths, sources
  std::map<std::string, bool> flags;        // mpi_built, cuda_built, nccl_built
  std::map<std::string, bool> cpu_kernels;  // compiled-in kernel set -> runs on this CPU
};
BuildInfo GetBuildInfo();

}  // namespace runtime
}  // namespace hora
