#include "hora/comm/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <random>
#include <sstream>

namespace hora {

Status ShmSegment::Create(Communicator* comm, int64_t data_bytes_per_rank,
                          std::unique_ptr<ShmSegment>* out) {
  std::unique_ptr<ShmSegment> segment(new ShmSegment());
  const int size = comm->size();
  segment->control_bytes_ = static_cast<int64_t>(sizeof(ShmControl)) * size;
  segment->data_bytes_per_rank_ = (data_bytes_per_rank + 4095) / 4096 * 4096;
  segment->total_bytes_ =
      segment->control_bytes_ + (segment->data_bytes_per_rank_ + kSkewBytes) * size;

  std::string name;
  Status created;
  if (comm->rank() == 0) {
    std::random_device random;
    std::ostringstream text;
    text << "/hora-" << getpid() << "-" << std::hex << random() << random();
    name = text.str();
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, segment->total_bytes_) != 0) {
      created = Status::Internal(std::string("creating the shared-memory segment: ") +
                                 std::strerror(errno));
      if (fd >= 0) {
        close(fd);
        shm_unlink(name.c_str());
      }
      name.clear();
    } else {
      close(fd);
    }
  }
  HORA_RETURN_IF_ERROR(comm->BroadcastBytes(&name, 0));
  if (name.empty())
    return created.ok() ? Status::Internal("rank 0 could not create shared memory") : created;

  Status mapped;
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd >= 0) {
    void* base = mmap(nullptr, segment->total_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base != MAP_FAILED) segment->base_ = static_cast<char*>(base);
  }
  if (segment->base_ == nullptr) {
    mapped =
        Status::Internal(std::string("mapping the shared-memory segment: ") + std::strerror(errno));
  }
  // Everyone has opened it (or failed): the name can go. All ranks learn
  // whether all of them succeeded, so they fall back to MPI together.
  uint64_t all_mapped = mapped.ok() ? 1 : 0;
  Status agreed = comm->AllreduceBitAnd(&all_mapped, 1);
  if (comm->rank() == 0) shm_unlink(name.c_str());
  HORA_RETURN_IF_ERROR(agreed);
  HORA_RETURN_IF_ERROR(mapped);
  if (all_mapped == 0)
    return Status::Internal("another rank could not map the shared-memory segment");
  ShmControl* mine = new (segment->control(comm->rank())) ShmControl();
  mine->pid = getpid();
  HORA_RETURN_IF_ERROR(comm->Barrier());
  *out = std::move(segment);
  return Status::OK();
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) munmap(base_, total_bytes_);
}

}  // namespace hora
