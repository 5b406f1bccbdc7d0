#include "hora/algo/allreduce_router.h"

#include <cstring>

#include <sstream>

#include "hora/algo/kernels/kernel_set.h"

namespace hora {

const char* AllreducePathName(AllreducePath path) {
  switch (path) {
    case AllreducePath::kMpi: return "mpi";
    case AllreducePath::kRing: return "ring";
    case AllreducePath::kShm: return "shm";
    case AllreducePath::kHierarchical: return "hierarchical";
  }
  return "?";
}

Status AllreduceRouter::Create(Communicator* comm, const Config& config,
                               std::unique_ptr<AllreduceRouter>* out) {
  std::unique_ptr<AllreduceRouter> router(new AllreduceRouter(comm, config));
  const Topology& t = comm->topology();
  router->one_host_ = t.local_size == t.size;
  router->hierarchical_ok_ = t.homogeneous && comm->local() != nullptr && comm->cross() != nullptr;
  const std::string& algorithm = config.allreduce_algorithm;
  if (algorithm == "shm" && !router->one_host_) {
    return Status::InvalidArgument(
        "HORA_ALLREDUCE_ALGORITHM=shm needs every rank on one host (this job spans " +
        std::to_string(t.cross_size) + " hosts; use hierarchical or auto)");
  }
  if (algorithm == "hierarchical" && !router->hierarchical_ok_) {
    return Status::InvalidArgument(
        "HORA_ALLREDUCE_ALGORITHM=hierarchical needs the same number of ranks on every host");
  }
  // auto goes hierarchical only where a host has several ranks to share
  // memory between; with one rank per host the ring is the whole story.
  router->hierarchical_ok_ = router->hierarchical_ok_ && (algorithm == "hierarchical" ||
                                                         t.local_size > 1);
  const bool wants_shm = t.size > 1 &&
                         (algorithm == "hierarchical" ||
                          (t.local_size > 1 && (algorithm == "shm" || algorithm == "auto")));
  if (wants_shm) {
    Communicator* local = comm->local();
    Status status = ShmSegment::Create(
        local, ShmAllreduce::kSlots * (config.shm_slot_bytes + ShmAllreduce::kSlotSkewBytes),
        &router->segment_);
    if (!status.ok()) return status.WithContext("creating the shared-memory segment");
    router->shm_.reset(new ShmAllreduce(router->segment_.get(), local->rank(), local->size()));
  }
  *out = std::move(router);
  return Status::OK();
}

AllreducePath AllreduceRouter::Choose(int64_t bytes) const {
  const std::string& a = config_.allreduce_algorithm;
  const int size = comm_->size();
  if (a == "mpi" || size == 1) return AllreducePath::kMpi;
  if (a == "ring") return AllreducePath::kRing;
  if (a == "shm") return shm_ ? AllreducePath::kShm : AllreducePath::kMpi;
  if (a == "hierarchical") {
    return one_host_ ? (shm_ ? AllreducePath::kShm : AllreducePath::kMpi)
                     : AllreducePath::kHierarchical;
  }
  // auto
  if (bytes <= config_.small_allreduce_bytes) return AllreducePath::kMpi;
  if (one_host_) return shm_ ? AllreducePath::kShm : AllreducePath::kMpi;
  if (hierarchical_ok_ && shm_ && hierarchical_allowed_) return AllreducePath::kHierarchical;
  return AllreducePath::kRing;
}

Status AllreduceRouter::Run(const Piece* pieces, size_t n, DataType dtype, ReduceOp op,
                            double factor) {
  if (comm_->size() == 1) {
    // Alone, the result is the input: copy it where it must go, scaled.
    for (size_t i = 0; i < n; ++i) {
      const Piece& p = pieces[i];
      if (IsFloatingPoint(dtype) && factor != 1.0) {
        Kernels().scale_copy(p.in, p.out, p.count, dtype, factor);
      } else if (p.in != p.out) {
        std::memcpy(p.out, p.in, p.count * DataTypeSize(dtype));
      }
    }
    return Status::OK();
  }
  const PieceMap map(pieces, n, DataTypeSize(dtype));
  const int64_t bytes = map.total() * DataTypeSize(dtype);
  const AllreducePath path = Choose(bytes);
  if (path == AllreducePath::kShm) return shm_->Run(map, dtype, op, factor);
  if (path == AllreducePath::kHierarchical) {
    Communicator* cross = comm_->cross();
    const ShmAllreduce::CrossStep step = [&](void* data, int64_t count) {
      if (cross->size() == 1) return Status::OK();
      if (count * DataTypeSize(dtype) <= config_.small_allreduce_bytes) {
        return cross->Allreduce(nullptr, data, count, dtype, op);
      }
      return cross_ring_.Run(cross, nullptr, data, count, dtype, op);
    };
    return shm_->Run(map, dtype, op, factor, &step);
  }
  // Contiguous paths take one piece at a time.
  for (size_t i = 0; i < n; ++i) {
    const Piece& p = pieces[i];
    HORA_RETURN_IF_ERROR(Run(p.in == p.out ? nullptr : p.in, p.out, p.count, dtype, op));
    if (IsFloatingPoint(dtype) && factor != 1.0) {
      Kernels().scale_copy(p.out, p.out, p.count, dtype, factor);
    }
  }
  return Status::OK();
}

Status AllreduceRouter::Run(const void* send, void* recv, int64_t count, DataType dtype,
                            ReduceOp op) {
  if (comm_->size() == 1) {
    if (send != nullptr && send != recv) std::memcpy(recv, send, count * DataTypeSize(dtype));
    return Status::OK();
  }
  const AllreducePath path = Choose(count * DataTypeSize(dtype));
  switch (path) {
    case AllreducePath::kRing: return ring_.Run(comm_, send, recv, count, dtype, op);
    case AllreducePath::kShm:
    case AllreducePath::kHierarchical: {
      const Piece piece{send == nullptr ? recv : send, recv, count};
      return Run(&piece, 1, dtype, op, 1.0);
    }
    case AllreducePath::kMpi: break;
  }
  return comm_->Allreduce(send, recv, count, dtype, op);
}

std::string AllreduceRouter::Describe() const {
  std::ostringstream text;
  text << "allreduce=" << config_.allreduce_algorithm << " (small: "
       << AllreducePathName(Choose(0)) << ", large: " << AllreducePathName(Choose(INT64_MAX))
       << ")" << ", kernels=" << Kernels().name;
  return text.str();
}

}  // namespace hora
