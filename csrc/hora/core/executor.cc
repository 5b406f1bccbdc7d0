#include "hora/core/executor.h"

#include <cctype>
#include <cstring>

#include "hora/algo/host_kernels.h"

namespace hora {
namespace {

bool SameAllreduce(const Response& a, const Response& b) {
  return b.kind == CollectiveKind::kAllreduce && !b.is_error() && a.on_gpu == b.on_gpu &&
         a.dtype == b.dtype &&
         a.op == b.op && a.prescale == b.prescale && a.postscale == b.postscale &&
         a.contributors == b.contributors;
}

// What the transport reduces: half types are widened to float32.
DataType WireType(DataType dtype) { return IsHalf(dtype) ? DataType::kFloat32 : dtype; }

// Elements per row: the product of every dimension after the first.
int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

double PostFactor(const Response& r) {
  double factor = r.postscale;
  if (r.op == ReduceOp::kAverage && IsFloatingPoint(r.dtype)) factor /= r.contributors;
  return factor;
}

// Copies `count` wire-type elements at `src` to the caller's output,
// applying the post-scale (and the integer Average division).
void Unpack(const char* src, void* dst, int64_t count, const Response& r) {
  const double factor = PostFactor(r);
  if (IsHalf(r.dtype)) {
    NarrowFromFloat(reinterpret_cast<const float*>(src), dst, count, r.dtype, factor);
  } else if (IsFloatingPoint(r.dtype)) {
    ScaleCopy(src, dst, count, r.dtype, factor);
  } else {
    if (src != dst) std::memcpy(dst, src, count * DataTypeSize(r.dtype));
    if (r.op == ReduceOp::kAverage) DivideInPlace(dst, count, r.dtype, r.contributors);
  }
}

// Copies (or fills, for a rank that has joined) one tensor into wire type.
void Pack(const TensorEntry* entry, char* dst, int64_t count, const Response& r) {
  const DataType wire = WireType(r.dtype);
  if (entry == nullptr) {
    FillNeutral(dst, count, wire, r.op);
  } else if (IsHalf(r.dtype)) {
    WidenToFloat(entry->input.data, reinterpret_cast<float*>(dst), count, r.dtype, r.prescale);
  } else {
    ScaleCopy(entry->input.data, dst, count, r.dtype, r.prescale);
  }
}

}  // namespace

size_t Executor::FuseFrom(const std::vector<Response>& responses, size_t first) const {
  const Response& head = responses[first];
  int64_t bytes = head.NumElements() * DataTypeSize(WireType(head.dtype));
  size_t end = first + 1;
  while (end < responses.size() && SameAllreduce(head, responses[end])) {
    const int64_t more = responses[end].NumElements() * DataTypeSize(WireType(head.dtype));
    if (bytes + more > fusion_threshold_bytes_) break;
    bytes += more;
    ++end;
  }
  return end;
}

void Executor::Record(const Response* batch, size_t batch_size, const std::string& kind,
                      const std::string& collective, Timeline::Clock::time_point decided,
                      const Phases& p, int64_t bytes) {
  const std::string args = "{\"bytes\": " + std::to_string(bytes) +
                           ", \"tensors\": " + std::to_string(batch_size) + ", \"first\": \"" +
                           batch[0].name + "\"}";
  for (size_t k = 0; k < batch_size; ++k) {
    const std::string& name = batch[k].name;
    timeline_->Span(name, "QUEUE", decided, p.start);
    timeline_->Span(name, kind, p.start, p.copied_out, args);
    if (p.copied_in > p.start) timeline_->Span(name, "MEMCPY_IN_FUSION_BUFFER", p.start, p.copied_in);
    timeline_->Span(name, collective, p.copied_in, p.reduced);
    if (p.copied_out > p.reduced) {
      timeline_->Span(name, "MEMCPY_OUT_FUSION_BUFFER", p.reduced, p.copied_out);
    }
  }
}

Status Executor::Run(const std::vector<Response>& responses, Timeline::Clock::time_point decided) {
  size_t i = 0;
  while (i < responses.size()) {
    const Response& r = responses[i];
    if (r.is_error()) {
      TensorEntry entry;
      if (queue_->TakeEntry(r.name, &entry)) entry.work->Complete(Status(r.error_code, r.error));
      ++i;
      continue;
    }
    if (r.kind == CollectiveKind::kAllreduce) {
      const size_t end = FuseFrom(responses, i);
      HORA_RETURN_IF_ERROR(RunAllreduce(&responses[i], end - i, decided));
      i = end;
      continue;
    }
    TensorEntry entry;
    if (!queue_->TakeEntry(r.name, &entry)) {
      // Only allreduce runs on ranks that did not submit it (after join).
      return Status::Internal("no local tensor for " + std::string(CollectiveKindName(r.kind)) +
                              " '" + r.name + "'");
    }
    Status status;
    Phases phases;
    phases.start = Timeline::Clock::now();
    if (r.on_gpu) {
      status = RunGpu(r, entry);
    } else {
      switch (r.kind) {
        case CollectiveKind::kAllgather: status = RunAllgather(r, entry); break;
        case CollectiveKind::kBroadcast: status = RunBroadcast(r, entry); break;
        case CollectiveKind::kAlltoall: status = RunAlltoall(r, entry); break;
        case CollectiveKind::kReducescatter: status = RunReducescatter(r, entry); break;
        case CollectiveKind::kBarrier: break;  // negotiation itself was the barrier
        default: status = Status::Internal("unexpected collective kind");
      }
    }
    if (timeline_->active()) {
      phases.copied_in = phases.start;
      phases.reduced = phases.copied_out = Timeline::Clock::now();
      static const char* const kMpiCall[] = {"MPI_ALLREDUCE", "MPI_ALLGATHERV", "MPI_BCAST",
                                             "MPI_ALLTOALLV", "MPI_REDUCE_SCATTER", "BARRIER"};
      std::string kind = CollectiveKindName(r.kind);
      for (char& c : kind) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      Record(&r, 1, kind, kMpiCall[static_cast<int>(r.kind)], decided, phases,
             entry.input.NumBytes());
    }
    if (!status.ok()) {
      status = status.WithContext(std::string(CollectiveKindName(r.kind)) + " '" + r.name + "'");
    }
    entry.work->Complete(status);
    HORA_RETURN_IF_ERROR(status);
    ++i;
  }
  return Status::OK();
}

Status Executor::RunAllreduce(const Response* batch, size_t batch_size,
                              Timeline::Clock::time_point decided) {
  Phases phases;
  phases.start = Timeline::Clock::now();
  std::vector<TensorEntry> entries(batch_size);
  std::vector<bool> present;
  queue_->TakeEntries(batch, batch_size, entries.data(), &present);
  const Response& head = batch[0];
  const DataType wire = WireType(head.dtype);
  const int64_t element = DataTypeSize(wire);
  int64_t total = 0;
  for (size_t k = 0; k < batch_size; ++k) total += batch[k].NumElements();
  Status status;
  GpuBackend* gpu = nullptr;
  if (head.on_gpu) {
    const TensorEntry* any = nullptr;
    for (size_t k = 0; k < batch_size && any == nullptr; ++k) any = present[k] ? &entries[k] : nullptr;
    status = Gpu(any, &gpu);
    phases.copied_in = Timeline::Clock::now();
    if (status.ok()) status = gpu->Allreduce(batch, batch_size, entries.data(), present);
    phases.reduced = Timeline::Clock::now();
  } else if (!IsHalf(head.dtype) && head.prescale == 1.0 && router_->TakesPieces(total * element)) {
    // Every rank must pick the same branch (the shared-memory paths apply the
  // scale factor to the sub-slice each rank owns), so the choice depends
  // only on the responses, never on which tensors this rank has.
    // Shared-memory paths read the callers' tensors and write their outputs
    // directly, scaling on the way out: no fusion buffer, no extra pass.
    // A rank that has joined contributes neutral values from scratch space.
    int64_t absent = 0;
    for (size_t k = 0; k < batch_size; ++k) absent += present[k] ? 0 : batch[k].NumElements();
    char* scratch = absent > 0 ? fusion_buffer_.Get(absent * element) : nullptr;
    pieces_.clear();
    for (size_t k = 0; k < batch_size; ++k) {
      const int64_t count = batch[k].NumElements();
      if (present[k]) {
        pieces_.push_back(Piece{entries[k].input.data, entries[k].output, count});
      } else {
        FillNeutral(scratch, count, head.dtype, head.op);
        pieces_.push_back(Piece{scratch, scratch, count});
        scratch += count * element;
      }
    }
    const double factor = IsFloatingPoint(head.dtype) ? PostFactor(head) : 1.0;
    phases.copied_in = Timeline::Clock::now();
    status = router_->Run(pieces_.data(), pieces_.size(), head.dtype, head.op, factor);
    phases.reduced = Timeline::Clock::now();
    if (status.ok() && !IsFloatingPoint(head.dtype) && head.op == ReduceOp::kAverage) {
      for (size_t k = 0; k < batch_size; ++k) {
        if (present[k]) DivideInPlace(pieces_[k].out, pieces_[k].count, head.dtype, head.contributors);
      }
    }
  } else if (batch_size == 1 && present[0] && !IsHalf(head.dtype)) {
    // A lone tensor is reduced straight from the caller's memory.
    TensorEntry& e = entries[0];
    const int64_t count = head.NumElements();
    const void* send = e.input.data;
    if (head.prescale != 1.0) {
      ScaleCopy(e.input.data, e.output, count, head.dtype, head.prescale);
      send = nullptr;
    } else if (e.input.data == e.output) {
      send = nullptr;
    }
    phases.copied_in = Timeline::Clock::now();
    status = router_->Run(send, e.output, count, head.dtype, head.op);
    phases.reduced = Timeline::Clock::now();
    if (status.ok()) Unpack(static_cast<char*>(e.output), e.output, count, head);
  } else {
    char* buffer = fusion_buffer_.Get(total * element);
    int64_t offset = 0;
    for (size_t k = 0; k < batch_size; ++k) {
      const int64_t count = batch[k].NumElements();
      Pack(present[k] ? &entries[k] : nullptr, buffer + offset * element, count, batch[k]);
      offset += count;
    }
    phases.copied_in = Timeline::Clock::now();
    status = router_->Run(nullptr, buffer, total, wire, head.op);
    phases.reduced = Timeline::Clock::now();
    offset = 0;
    for (size_t k = 0; k < batch_size && status.ok(); ++k) {
      const int64_t count = batch[k].NumElements();
      if (present[k]) Unpack(buffer + offset * element, entries[k].output, count, batch[k]);
      offset += count;
    }
  }
  phases.copied_out = Timeline::Clock::now();
  allreduced_bytes_ += total * element;
  if (timeline_->active()) {
    std::string path = head.on_gpu ? "nccl" : AllreducePathName(router_->Choose(total * element));
    for (char& c : path) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    Record(batch, batch_size, "ALLREDUCE", path + "_ALLREDUCE", decided, phases, total * element);
  }
  if (!status.ok()) {
    status = status.WithContext(
        "allreduce '" + head.name + "'" +
        (batch_size > 1 ? " (fused with " + std::to_string(batch_size - 1) + " more)" : ""));
  }
  for (size_t k = 0; k < batch_size; ++k) {
    if (present[k]) entries[k].work->MarkDone(status);
  }
  for (size_t k = 0; k < batch_size; ++k) {
    if (present[k]) entries[k].work->Notify();
  }
  return status;
}

Status Executor::Gpu(const TensorEntry* entry, GpuBackend** out) {
  if (!gpu_) {
    // -1 (a rank that has joined): the backend picks the device itself, in
    // the step whose failures every rank learns about.
    const int device = entry != nullptr ? entry->input.device : -1;
    HORA_RETURN_IF_ERROR(gpu::CreateBackend(comm_, config_, device, &gpu_));
  }
  *out = gpu_.get();
  return Status::OK();
}

Status Executor::RunGpu(const Response& r, TensorEntry& e) {
  GpuBackend* gpu = nullptr;
  HORA_RETURN_IF_ERROR(Gpu(&e, &gpu));
  switch (r.kind) {
    case CollectiveKind::kAllgather: return gpu->Allgather(r, e);
    case CollectiveKind::kBroadcast: return gpu->Broadcast(r, e);
    case CollectiveKind::kAlltoall: return gpu->Alltoall(r, e);
    case CollectiveKind::kReducescatter: return gpu->Reducescatter(r, e);
    default: return Status::Internal("unexpected GPU collective kind");
  }
}

Status Executor::RunAllgather(const Response& r, TensorEntry& e) {
  const int size = comm_->size();
  const int64_t row_elements = RowElements(e.input.shape);
  const int64_t row_bytes = row_elements * DataTypeSize(r.dtype);
  std::vector<int64_t> recv_bytes(size);
  int64_t total_rows = 0;
  for (int k = 0; k < size; ++k) {
    recv_bytes[k] = r.first_dims[k] * row_bytes;
    total_rows += r.first_dims[k];
  }
  e.work->output = std::make_shared<OwnedBuffer>(total_rows * row_bytes);
  e.work->output_shape = e.input.shape;
  e.work->output_shape[0] = total_rows;
  return comm_->Allgatherv(e.input.data, e.input.NumBytes(), e.work->output->data(), recv_bytes);
}

Status Executor::RunBroadcast(const Response& r, TensorEntry& e) {
  if (comm_->rank() == r.root && e.output != e.input.data) {
    std::memcpy(e.output, e.input.data, e.input.NumBytes());
  }
  return comm_->Broadcast(e.output, e.input.NumBytes(), r.root);
}

Status Executor::RunAlltoall(const Response& r, TensorEntry& e) {
  const int size = comm_->size();
  const int me = comm_->rank();
  const int64_t row_bytes = RowElements(e.input.shape) * DataTypeSize(r.dtype);
  std::vector<int64_t> send_bytes(size), recv_bytes(size);
  e.work->received_splits.assign(size, 0);
  int64_t total_rows = 0;
  for (int k = 0; k < size; ++k) {
    send_bytes[k] = r.splits[me * size + k] * row_bytes;
    e.work->received_splits[k] = r.splits[k * size + me];
    recv_bytes[k] = e.work->received_splits[k] * row_bytes;
    total_rows += e.work->received_splits[k];
  }
  e.work->output = std::make_shared<OwnedBuffer>(total_rows * row_bytes);
  e.work->output_shape = e.input.shape;
  e.work->output_shape[0] = total_rows;
  return comm_->Alltoallv(e.input.data, send_bytes, e.work->output->data(), recv_bytes);
}

Status Executor::RunReducescatter(const Response& r, TensorEntry& e) {
  const int size = comm_->size();
  const int64_t rows = e.input.shape[0];
  const int64_t row_elements = RowElements(e.input.shape);
  // The first rows % size ranks get one extra row, as in Horovod.
  std::vector<int64_t> counts(size);
  for (int k = 0; k < size; ++k) counts[k] = rows / size + (k < rows % size ? 1 : 0);
  const int64_t my_rows = counts[comm_->rank()];
  for (int64_t& c : counts) c *= row_elements;
  const int64_t mine = counts[comm_->rank()];
  const DataType wire = WireType(r.dtype);
  const int64_t element = DataTypeSize(wire);
  e.work->output = std::make_shared<OwnedBuffer>(mine * DataTypeSize(r.dtype));
  e.work->output_shape = e.input.shape;
  e.work->output_shape[0] = my_rows;
  const int64_t total = e.input.NumElements();
  const bool staged = IsHalf(r.dtype) || r.prescale != 1.0;
  const void* send = e.input.data;
  char* recv = e.work->output->data();
  if (staged) {
    // Staging: the input (widened and pre-scaled) first, then the result.
    char* buffer = fusion_buffer_.Get((total + mine) * element);
    Pack(&e, buffer, total, r);
    send = buffer;
    recv = buffer + total * element;
  }
  HORA_RETURN_IF_ERROR(comm_->ReduceScatter(send, recv, counts, wire, r.op));
  Unpack(recv, e.work->output->data(), mine, r);
  return Status::OK();
}

}  // namespace hora
