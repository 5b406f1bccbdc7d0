#pragma once
// Process sets: subsets of the job's ranks that run collectives among
// themselves (hybrid and model parallelism). Every rank knows every set's
// id and ranks. A rank that belongs to a set runs the set's own Engine over
// a communicator made for the set: its own queue, controller (response
// cache, coordinator, stall inspector on the set's first rank), executor
// (fusion, the allreduce router with its shared-memory and ring paths),
// wake-up channel and thread, so that a set's collectives never wait for
// another set's. The job's engine (set 0) owns the table of sets and
// their engines (process_set_table.h); this file holds the words both use.
#include <cstdint>
#include <string>
#include <vector>

namespace hora {

// "process set 2 (ranks 0, 1)": how errors and logs name a set.
std::string DescribeProcessSet(int32_t id, const std::vector<int>& ranks);

// Why a list of ranks cannot form a set of a job of `size` ranks (empty,
// repeated or out-of-range ranks), or an empty string.
std::string InvalidProcessSetRanks(const std::vector<int>& ranks, int size);

}  // namespace hora
