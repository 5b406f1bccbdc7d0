#include "hora/algo/allreduce_router.h"

#include <cstring>

#include <sstream>

#include "hora/algo/host_kernels.h"
#include "hora/algo/kernels/kernel_set.h"

namespace hora {
namespace {

bool TakesPieces(AllreducePath path) {
  return path == AllreducePath::kShm || path == AllreducePath::kHierarchical;
}

}  // namespace

const char* AllreducePathName(AllreducePath path) {
  switch (path) {
    case AllreducePath::kMpi: return "mpi";
    case AllreducePath::kRing: return "ring";
    case AllreducePath::kShm: return "shm";
    case AllreducePath::kHierarchical: return "hierarchical";
  }
  return "?";
}

Status AllreduceRouter::Create(Communicator* comm, const AllreduceSettings& settings,
                               std::unique_ptr<AllreduceRouter>* out) {
  std::unique_ptr<AllreduceRouter> router(new AllreduceRouter(comm, settings));
  const Topology& t = comm->topology();
  router->one_host_ = t.local_size == t.size;
  router->hierarchical_ok_ = t.homogeneous && comm->local() != nullptr && comm->cross() != nullptr;
  const AllreduceAlgorithm algorithm = settings.algorithm;
  if (algorithm == AllreduceAlgorithm::kShm && !router->one_host_) {
    return Status::InvalidArgument(
        "HORA_ALLREDUCE_ALGORITHM=shm needs every rank on one host (this job spans " +
        std::to_string(t.cross_size) + " hosts; use hierarchical or auto)");
  }
  if (algorithm == AllreduceAlgorithm::kHierarchical && !router->hierarchical_ok_) {
    return Status::InvalidArgument(
        "HORA_ALLREDUCE_ALGORITHM=hierarchical needs the same number of ranks on every host");
  }
  // auto goes hierarchical only where a host has several ranks to share
  // memory between; with one rank per host the ring is the whole story.
  router->hierarchical_ok_ = router->hierarchical_ok_ &&
                             (algorithm == AllreduceAlgorithm::kHierarchical || t.local_size > 1);
  const bool wants_shm =
      t.size > 1 && (algorithm == AllreduceAlgorithm::kHierarchical ||
                     (t.local_size > 1 && (algorithm == AllreduceAlgorithm::kShm ||
                                           algorithm == AllreduceAlgorithm::kAuto)));
  if (wants_shm) {
    Communicator* local = comm->local();
    Status status = ShmSegment::Create(
        local, ShmAllreduce::kSlots * (settings.shm_slot_bytes + ShmAllreduce::kSlotSkewBytes),
        &router->segment_);
    if (!status.ok()) return status.WithContext("creating the shared-memory segment");
    router->shm_.reset(new ShmAllreduce(router->segment_.get(), local->rank(), local->size()));
  }
  *out = std::move(router);
  return Status::OK();
}

AllreducePath AllreduceRouter::Choose(int64_t bytes) const {
  const int size = comm_->size();
  switch (settings_.algorithm) {
    case AllreduceAlgorithm::kMpi: return AllreducePath::kMpi;
    case AllreduceAlgorithm::kRing: return size == 1 ? AllreducePath::kMpi : AllreducePath::kRing;
    case AllreduceAlgorithm::kShm: return shm_ ? AllreducePath::kShm : AllreducePath::kMpi;
    case AllreduceAlgorithm::kHierarchical:
      if (size == 1) return AllreducePath::kMpi;
      return one_host_ ? (shm_ ? AllreducePath::kShm : AllreducePath::kMpi)
                       : AllreducePath::kHierarchical;
    case AllreduceAlgorithm::kAuto: break;
  }
  if (size == 1 || bytes <= settings_.small_allreduce_bytes) return AllreducePath::kMpi;
  if (one_host_) return shm_ ? AllreducePath::kShm : AllreducePath::kMpi;
  if (hierarchical_ok_ && shm_ && hierarchical_allowed_) return AllreducePath::kHierarchical;
  return AllreducePath::kRing;
}

bool AllreduceRouter::RingFor(int64_t bytes) const {
  return comm_->size() > 1 && settings_.algorithm != AllreduceAlgorithm::kMpi &&
         bytes > settings_.small_allreduce_bytes;
}

Status AllreduceRouter::Run(const Piece* pieces, size_t n, DataType dtype, ReduceOp op,
                            double prescale, double factor) {
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += pieces[i].count;
  // What the transport reduces: half types are widened to float32, except
  // on the ring between hosts, where the link is what costs and halves
  // travel as they are (the ring reduces each piece in float32).
  const bool half_ring =
      IsHalf(dtype) && Choose(total * DataTypeSize(dtype)) == AllreducePath::kRing;
  const bool half = IsHalf(dtype) && !half_ring;
  if (half_ring && (op == ReduceOp::kSum || op == ReduceOp::kAverage) && factor != 1.0) {
    // An average (or a scaled sum) divides before the sum, so that a sum
    // of half values near their limit does not overflow on the way.
    prescale *= factor;
    factor = 1.0;
  }
  const DataType wire = half ? DataType::kFloat32 : dtype;
  const int64_t element = DataTypeSize(wire);
  // Every rank takes the same branch: each depends only on arguments all
  // ranks share (the shared-memory paths scale the sub-slice each rank
  // owns, so a rank that staged while another did not would mix scalings).
  const bool direct = comm_->size() == 1 || TakesPieces(Choose(total * element));
  if (direct && !half && prescale == 1.0) return RunPieces(pieces, n, dtype, op, factor);
  if (n == 1 && !half) {
    // A lone tensor is reduced in the caller's memory, pre-scaled into its
    // output first when it must be.
    const Piece& p = pieces[0];
    const void* send = p.in == p.out ? nullptr : p.in;
    if (prescale != 1.0) {
      ScaleCopy(p.in, p.out, p.count, dtype, prescale);
      send = nullptr;
    }
    HORA_RETURN_IF_ERROR(RunContiguous(send, p.out, p.count, dtype, op));
    if (factor != 1.0) ScaleCopy(p.out, p.out, p.count, dtype, factor);
    return Status::OK();
  }
  char* buffer = staging_.Get(total * element);
  char* at = buffer;
  for (size_t i = 0; i < n; ++i) {
    const Piece& p = pieces[i];
    if (half) {
      WidenToFloat(p.in, reinterpret_cast<float*>(at), p.count, dtype, prescale);
    } else {
      ScaleCopy(p.in, at, p.count, dtype, prescale);
    }
    at += p.count * element;
  }
  HORA_RETURN_IF_ERROR(RunContiguous(nullptr, buffer, total, wire, op));
  at = buffer;
  for (size_t i = 0; i < n; ++i) {
    const Piece& p = pieces[i];
    if (half) {
      NarrowFromFloat(reinterpret_cast<const float*>(at), p.out, p.count, dtype, factor);
    } else {
      ScaleCopy(at, p.out, p.count, dtype, factor);
    }
    at += p.count * element;
  }
  return Status::OK();
}

Status AllreduceRouter::RunPieces(const Piece* pieces, size_t n, DataType dtype, ReduceOp op,
                                  double factor) {
  if (comm_->size() == 1) {
    // Alone, the result is the input: copy it where it must go, scaled.
    for (size_t i = 0; i < n; ++i) {
      const Piece& p = pieces[i];
      if (factor != 1.0) {
        Kernels().scale_copy(p.in, p.out, p.count, dtype, factor);
      } else if (p.in != p.out) {
        std::memcpy(p.out, p.in, p.count * DataTypeSize(dtype));
      }
    }
    return Status::OK();
  }
  const PieceMap map(pieces, n, DataTypeSize(dtype));
  const AllreducePath path = Choose(map.total() * DataTypeSize(dtype));
  if (path == AllreducePath::kShm) return shm_->Run(map, dtype, op, factor);
  Communicator* cross = comm_->cross();
  const ShmAllreduce::CrossStep step = [&](void* data, int64_t count) {
    if (cross->size() == 1) return Status::OK();
    if (count * DataTypeSize(dtype) <= settings_.small_allreduce_bytes) {
      return cross->Allreduce(nullptr, data, count, dtype, op);
    }
    return cross_ring_.Run(cross, nullptr, data, count, dtype, op);
  };
  return shm_->Run(map, dtype, op, factor, &step);
}

Status AllreduceRouter::RunContiguous(const void* send, void* recv, int64_t count, DataType dtype,
                                      ReduceOp op) {
  if (comm_->size() == 1) {
    if (send != nullptr && send != recv) std::memcpy(recv, send, count * DataTypeSize(dtype));
    return Status::OK();
  }
  switch (Choose(count * DataTypeSize(dtype))) {
    case AllreducePath::kRing: return ring_.Run(comm_, send, recv, count, dtype, op);
    case AllreducePath::kShm:
    case AllreducePath::kHierarchical: {
      const Piece piece{send == nullptr ? recv : send, recv, count};
      return RunPieces(&piece, 1, dtype, op, 1.0);
    }
    case AllreducePath::kMpi: break;
  }
  return comm_->Allreduce(send, recv, count, dtype, op);
}

std::string AllreduceRouter::Describe() const {
  std::ostringstream text;
  text << "allreduce=" << AllreduceAlgorithmName(settings_.algorithm)
       << " (small: " << AllreducePathName(Choose(0))
       << ", large: " << AllreducePathName(Choose(INT64_MAX)) << ")"
       << ", kernels=" << Kernels().name;
  return text.str();
}

}  // namespace hora
