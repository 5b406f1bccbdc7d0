#include "hora/core/executor.h"

#include <cctype>
#include <cstring>
#include <new>
#include <string>

#include "hora/algo/host_kernels.h"

namespace hora {
namespace {

bool SameAllreduce(const Response& a, const Response& b) {
  return b.kind == CollectiveKind::kAllreduce && !b.is_error() && a.on_gpu == b.on_gpu &&
         a.dtype == b.dtype && a.op == b.op && a.prescale == b.prescale &&
         a.postscale == b.postscale && a.contributors == b.contributors;
}

}  // namespace

size_t FusedBatchEnd(const std::vector<Response>& responses, size_t first,
                     int64_t threshold_bytes) {
  const Response& head = responses[first];
  const int64_t element = DataTypeSize(WireType(head.dtype, head.on_gpu));
  int64_t bytes = head.NumElements() * element;
  size_t end = first + 1;
  while (end < responses.size() && SameAllreduce(head, responses[end])) {
    const int64_t more = responses[end].NumElements() * element;
    if (bytes + more > threshold_bytes) break;
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
    if (p.copied_in > p.start)
      timeline_->Span(name, "MEMCPY_IN_FUSION_BUFFER", p.start, p.copied_in);
    timeline_->Span(name, collective, p.copied_in, p.reduced);
    if (p.copied_out > p.reduced) {
      timeline_->Span(name, "MEMCPY_OUT_FUSION_BUFFER", p.reduced, p.copied_out);
    }
  }
}

namespace {

// Host memory that runs out inside a collective leaves this rank unable to
// finish it while its peers wait in the transport: the collective fails as
// a transport failure does (the engine stops, every waiting call raises
// these words), instead of std::bad_alloc ending the process unexplained.
template <typename Body>
Status CatchOutOfMemory(int rank, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc& error) {
    return Status::Internal("rank " + std::to_string(rank) + " ran out of memory: " + error.what());
  }
}

}  // namespace

Status Executor::Run(const std::vector<Response>& responses, Timeline::Clock::time_point decided,
                     std::vector<SetChange>* set_changes) {
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
      const size_t end = FusedBatchEnd(responses, i, fusion_threshold_bytes_);
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
    if (r.kind == CollectiveKind::kAddProcessSet || r.kind == CollectiveKind::kRemoveProcessSet) {
      set_changes->push_back({r, std::move(entry.work)});
      ++i;
      continue;
    }
    Phases phases;
    phases.start = Timeline::Clock::now();
    watch_.Begin(CollectiveKindName(r.kind), &r.name, 0, entry.input.NumBytes());
    Status status = CatchOutOfMemory(comm_->rank(), [&] { return RunOne(r, entry); });
    watch_.End();
    if (timeline_->active()) {
      phases.copied_in = phases.start;
      phases.reduced = phases.copied_out = Timeline::Clock::now();
      static const char* const kMpiCall[] = {"MPI_ALLREDUCE", "MPI_ALLGATHERV",     "MPI_BCAST",
                                             "MPI_ALLTOALLV", "MPI_REDUCE_SCATTER", "BARRIER"};
      std::string kind = CollectiveKindName(r.kind);
      for (char& c : kind) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      Record(&r, 1, kind, kMpiCall[static_cast<int>(r.kind)], decided, phases,
             entry.input.NumBytes());
    }
    if (!status.ok()) {
      status = status.WithContext(std::string(CollectiveKindName(r.kind)) + " '" + r.name + "'");
    } else if (!local_error_.ok()) {
      // this rank's call alone failed; the collective itself went through
      entry.work->Complete(
          local_error_.WithContext(std::string(CollectiveKindName(r.kind)) + " '" + r.name + "'"));
      local_error_ = Status::OK();
      ++i;
      continue;
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
  const CollectivePlan plan = PlanCollective(head, head.shape, comm_->rank(), comm_->size());
  int64_t total = 0;
  for (size_t k = 0; k < batch_size; ++k) total += batch[k].NumElements();
  const int64_t bytes = total * DataTypeSize(plan.wire);
  Status status;
  watch_.Begin("allreduce", &head.name, batch_size - 1, bytes);
  if (head.on_gpu) {
    const TensorEntry* any = nullptr;
    for (size_t k = 0; k < batch_size && any == nullptr; ++k)
      any = present[k] ? &entries[k] : nullptr;
    GpuExecutor* gpu = nullptr;
    status = Gpu(any, &gpu);
    phases.copied_in = Timeline::Clock::now();
    if (status.ok()) {
      status = CatchOutOfMemory(comm_->rank(), [&] {
        return gpu->Allreduce(batch, batch_size, entries.data(), present, plan);
      });
    }
    phases.reduced = Timeline::Clock::now();
  } else {
    phases.copied_in = Timeline::Clock::now();
    status = CatchOutOfMemory(
        comm_->rank(), [&] { return Allreduce(batch, batch_size, entries.data(), present, plan); });
    phases.reduced = Timeline::Clock::now();
  }
  phases.copied_out = Timeline::Clock::now();
  watch_.End();
  allreduced_bytes_ += bytes;
  if (timeline_->active()) {
    std::string path = head.on_gpu                    ? "nccl"
                       : head.op == ReduceOp::kAdasum ? "adasum"
                                                      : AllreducePathName(router_->Choose(bytes));
    for (char& c : path) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    Record(batch, batch_size, "ALLREDUCE", path + "_ALLREDUCE", decided, phases, bytes);
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

Status Executor::Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                           const std::vector<bool>& present, const CollectivePlan& plan) {
  const Response& head = batch[0];
  // A rank that has joined contributes neutral values from scratch space.
  int64_t absent = 0;
  for (size_t k = 0; k < batch_size; ++k) absent += present[k] ? 0 : batch[k].NumElements();
  char* scratch = absent > 0 ? fusion_buffer_.Get(absent * DataTypeSize(head.dtype)) : nullptr;
  pieces_.clear();
  const int64_t element = DataTypeSize(head.dtype);
  // Memory that continues the previous piece on both sides (members of a
  // flat bucket, views of one buffer) joins it: one piece is reduced in
  // place, where several are staged through a fusion buffer. Not for
  // Adasum, which combines each tensor on its own.
  const bool merge = head.op != ReduceOp::kAdasum;
  auto add = [&](const Piece& piece) {
    if (merge && !pieces_.empty()) {
      Piece& last = pieces_.back();
      if (static_cast<const char*>(last.in) + last.count * element == piece.in &&
          static_cast<char*>(last.out) + last.count * element == piece.out) {
        last.count += piece.count;
        return;
      }
    }
    pieces_.push_back(piece);
  };
  for (size_t k = 0; k < batch_size; ++k) {
    const int64_t count = batch[k].NumElements();
    if (present[k] && !entries[k].members.empty()) {
      for (const Piece& member : entries[k].members) add(member);
    } else if (present[k]) {
      add(Piece{entries[k].input.data, entries[k].output, count});
    } else {
      FillNeutral(scratch, count, head.dtype, head.op);
      add(Piece{scratch, scratch, count});
      scratch += count * element;
    }
  }
  Status status;
  if (head.op == ReduceOp::kAdasum) {
    status = adasum_.Run(comm_, pieces_.data(), pieces_.size(), head.dtype, plan.prescale,
                         plan.post_factor);
  } else {
    status = router_->Run(pieces_.data(), pieces_.size(), head.dtype, head.op, plan.prescale,
                          plan.post_factor);
  }
  if (status.ok() && plan.divisor != 1) {
    // (the neutral scratch of absent entries is divided too: nobody reads it)
    for (const Piece& piece : pieces_) {
      DivideInPlace(piece.out, piece.count, head.dtype, plan.divisor);
    }
  }
  return status;
}

Status Executor::Gpu(const TensorEntry* entry, GpuExecutor** out) {
  if (!gpu_) {
    // -1 (a rank that has joined): the executor picks the device itself, in
    // the step whose failures every rank learns about.
    const int device = entry != nullptr ? entry->input.device : -1;
    GpuOptions options;
    options.hierarchical = config_.gpu_hierarchical_allreduce;
    options.shared_gpu = config_.shared_gpu;
    HORA_RETURN_IF_ERROR(CreateGpuExecutor(comm_, options, device, this, &gpu_));
  }
  *out = gpu_.get();
  return Status::OK();
}

Status Executor::RunOne(const Response& r, TensorEntry& e) {
  if (r.kind == CollectiveKind::kBarrier) return Status::OK();  // negotiation was the barrier
  const CollectivePlan plan = PlanCollective(r, e.input.shape, comm_->rank(), comm_->size());
  if (r.on_gpu) {
    GpuExecutor* gpu = nullptr;
    HORA_RETURN_IF_ERROR(Gpu(&e, &gpu));
    return gpu->Run(r, e, plan);
  }
  return Run(r, e, plan);
}

Status Executor::Run(const Response& r, TensorEntry& e, const CollectivePlan& plan) {
  switch (r.kind) {
    case CollectiveKind::kAllgather: return RunAllgather(e, plan);
    case CollectiveKind::kBroadcast: return RunBroadcast(r, e);
    case CollectiveKind::kAlltoall: return RunAlltoall(e, plan);
    case CollectiveKind::kReducescatter: return RunReducescatter(r, e, plan);
    default: return Status::Internal("unexpected collective kind");
  }
}

namespace {

// The result buffer of a collective whose output the core allocates.
char* Allocate(TensorEntry& e, int64_t bytes, const CollectivePlan& plan) {
  e.work->output = std::make_shared<OwnedBuffer>(bytes);
  e.work->output_shape = plan.output_shape;
  return e.work->output->data();
}

}  // namespace

Status Executor::RunAllgather(TensorEntry& e, const CollectivePlan& plan) {
  const int64_t element = DataTypeSize(e.input.dtype);
  const int64_t needed = plan.recv_total * element;
  // Into the caller's output when it has the gathered size; a wrong size is
  // known only now, on this rank alone, so the rank still takes part
  // (through a buffer of its own) and only its own call fails.
  char* out;
  const bool into_output = e.output != nullptr && e.output_bytes == needed;
  if (into_output) {
    out = static_cast<char*>(e.output);
    e.work->output_shape = plan.output_shape;
  } else {
    if (e.output != nullptr) {
      local_error_ = Status::InvalidArgument("the output holds " + std::to_string(e.output_bytes) +
                                             " bytes but the rows every " + "rank gathers hold " +
                                             std::to_string(needed) + " bytes (shape " +
                                             ShapeString(plan.output_shape) + ")");
    }
    out = Allocate(e, needed, plan);
  }
  const std::vector<int64_t> bytes = InBytes(plan.recv_counts, element);
  // The same choice on every rank, so from the negotiated size alone
  // (whether a rank gathers into its own buffer is its own business).
  if (router_->RingForAllgather(needed)) {
    int64_t offset = 0;
    for (int r = 0; r < comm_->rank(); ++r) offset += bytes[r];
    if (out + offset != e.input.data) std::memcpy(out + offset, e.input.data, e.input.NumBytes());
    return router_->ring().Allgather(comm_, out, bytes);
  }
  const void* send = e.input.data;
  const char* in = static_cast<const char*>(send);
  if (in >= out && in < out + needed) {
    // MPI reads and writes distinct buffers: the caller's own rows may lie
    // in its output already
    char* copy = fusion_buffer_.Get(e.input.NumBytes());
    std::memcpy(copy, send, e.input.NumBytes());
    send = copy;
  }
  return comm_->Allgatherv(send, e.input.NumBytes(), out, bytes);
}

Status Executor::RunBroadcast(const Response& r, TensorEntry& e) {
  if (comm_->rank() == r.root && e.output != e.input.data) {
    std::memcpy(e.output, e.input.data, e.input.NumBytes());
  }
  return comm_->Broadcast(e.output, e.input.NumBytes(), r.root);
}

Status Executor::RunAlltoall(TensorEntry& e, const CollectivePlan& plan) {
  const int64_t element = DataTypeSize(e.input.dtype);
  char* out = Allocate(e, plan.recv_total * element, plan);
  e.work->received_splits = plan.received_splits;
  return comm_->Alltoallv(e.input.data, InBytes(plan.send_counts, element), out,
                          InBytes(plan.recv_counts, element));
}

Status Executor::RunReducescatter(const Response& r, TensorEntry& e, const CollectivePlan& plan) {
  const int64_t mine = plan.recv_counts[comm_->rank()];
  int64_t offset = 0;  // of this rank's block, in elements
  for (int k = 0; k < comm_->rank(); ++k) offset += plan.recv_counts[k];
  // In place, this rank's block of the input receives the result (the rest
  // of the input is left with partial sums): no result buffer, and the ring
  // reduces the caller's buffer itself.
  const bool in_place = e.output == e.input.data;
  char* out;
  if (in_place) {
    out = static_cast<char*>(e.output) + offset * DataTypeSize(r.dtype);
    e.work->output_shape = plan.output_shape;
  } else {
    out = Allocate(e, mine * DataTypeSize(r.dtype), plan);
  }
  const DataType wire = plan.wire;
  const int64_t element = DataTypeSize(wire);
  const int64_t total = plan.recv_total;
  const bool ring = router_->RingFor(total * element);
  const bool widened = wire != r.dtype || plan.prescale != 1.0;
  // The ring reduces in place, on a copy of the input unless it may write
  // the input itself.
  const bool staged = widened || (ring && !in_place);
  const void* send = e.input.data;
  char* recv = out;
  char* buffer = nullptr;
  if (staged) {
    // Staging: the input (widened and pre-scaled) first, then the result.
    buffer = fusion_buffer_.Get((total + mine) * element);
    if (IsHalf(r.dtype)) {
      WidenToFloat(e.input.data, reinterpret_cast<float*>(buffer), total, r.dtype, plan.prescale);
    } else {
      ScaleCopy(e.input.data, buffer, total, r.dtype, plan.prescale);
    }
    send = buffer;
    recv = buffer + total * element;
  } else if (in_place && !ring) {
    // MPI's reduce-scatter writes elsewhere than it reads
    recv = fusion_buffer_.Get(mine * element);
  }
  if (ring) {
    char* reduced = staged ? buffer : static_cast<char*>(e.output);
    HORA_RETURN_IF_ERROR(
        router_->ring().ReduceScatter(comm_, reduced, plan.recv_counts, wire, r.op));
    recv = reduced + offset * element;
  } else {
    HORA_RETURN_IF_ERROR(comm_->ReduceScatter(send, recv, plan.recv_counts, wire, r.op));
  }
  if (IsHalf(r.dtype)) {
    NarrowFromFloat(reinterpret_cast<const float*>(recv), out, mine, r.dtype, plan.post_factor);
  } else if (plan.post_factor != 1.0 || recv != out) {
    ScaleCopy(recv, out, mine, r.dtype, plan.post_factor);
  }
  if (plan.divisor != 1) DivideInPlace(out, mine, r.dtype, plan.divisor);
  return Status::OK();
}

}  // namespace hora
