#include "hora/core/gpu_executor_nccl.h"

#include "hora/algo/host_kernels.h"
#include "hora/common/logging.h"
#include "hora/cuda/cuda_status.h"

namespace hora {
namespace gpu {
namespace {

// The element a rank that has joined contributes, as raw bits.
uint64_t NeutralPattern(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
    const bool half = dtype == DataType::kFloat16;
    switch (op) {
      case ReduceOp::kProduct: return half ? 0x3C00 : 0x3F80;  // 1
      case ReduceOp::kMin: return half ? 0x7C00 : 0x7F80;      // +inf
      case ReduceOp::kMax: return half ? 0xFC00 : 0xFF80;      // -inf
      default: return 0;
    }
  }
  uint64_t pattern = 0;
  FillNeutral(&pattern, 1, dtype, op);
  return pattern;
}

int64_t Align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

}  // namespace

Status NcclExecutor::Create(Communicator* comm, bool hierarchical,
                            std::unique_ptr<GpuStream> stream, std::unique_ptr<GpuExecutor>* out) {
  std::unique_ptr<NcclExecutor> executor(new NcclExecutor(comm, std::move(stream)));
  HORA_RETURN_IF_ERROR(executor->Init(hierarchical));
  *out = std::move(executor);
  return Status::OK();
}

Status NcclExecutor::Init(bool hierarchical) {
  HORA_RETURN_IF_ERROR(NcclCommunicator::Create(comm_, &nccl_));
  const Topology& t = comm_->topology();
  const bool usable =
      t.cross_size > 1 && t.homogeneous && comm_->local() != nullptr && comm_->cross() != nullptr;
  if (hierarchical && !usable) {
    HORA_LOG(kInfo) << "HORA_HIERARCHICAL_ALLREDUCE: not used (it needs several hosts with the "
                       "same number of ranks each)";
  }
  if (hierarchical && usable)
    HORA_RETURN_IF_ERROR(NcclCommunicator::Create(comm_->local(), &local_));
  HORA_LOG(kDebug) << "GPU collectives: " << Describe();
  return Status::OK();
}

NcclExecutor::~NcclExecutor() {
  // Let queued collectives finish (the callers may not have read them yet);
  // past ten seconds the peers are gone, and aborting NCCL ends its kernels.
  gpu_->Drain();
  DeviceGuard guard(device_);
  local_.reset();
  nccl_.reset();
  if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
}

std::string NcclExecutor::Describe() const {
  return NcclDescribe() + " on GPU " + std::to_string(device_) +
         (local_ ? ", hierarchical allreduce" : "");
}

Status NcclExecutor::Scratch(int64_t bytes, char** out) {
  if (bytes > scratch_bytes_) {
    if (scratch_ != nullptr) HORA_CUDA(cudaFreeAsync(scratch_, stream_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    const int64_t rounded = (bytes + (1 << 20) - 1) / (1 << 20) * (1 << 20);
    void* p = nullptr;
    HORA_CUDA(cudaMallocAsync(&p, rounded, stream_));
    scratch_ = static_cast<char*>(p);
    scratch_bytes_ = rounded;
  }
  *out = scratch_;
  return Status::OK();
}

Status NcclExecutor::Copy(const void* src, void* dst, int64_t count, DataType in, DataType out,
                          double scale, int64_t divisor) {
  const CopyTask task{src, dst, count};
  return CudaStatus(ScaledCopy(&task, 1, in, out, scale, divisor, stream_), "scaled-copy kernel");
}

Status NcclExecutor::Reduce(const char* send, char* recv, int64_t count, DataType wire,
                            ReduceOp op) {
  if (!local_) return nccl_->Allreduce(send, recv, count, wire, op, stream_);
  // Inside the host a reduce-scatter leaves each local rank one shard of
  // the host's sum; the shards cross hosts through MPI on host memory; an
  // allgather inside the host puts the shards back together.
  const int64_t element = DataTypeSize(wire);
  const int parts = local_->size();
  const int64_t shard = (count + parts - 1) / parts;
  char* work = recv;
  if (shard * parts != count) {
    HORA_RETURN_IF_ERROR(Scratch(shard * parts * element, &work));  // padding is never read back
    if (work == recv)
      return Status::Internal("hierarchical allreduce: scratch overlaps the output");
  }
  if (work != send)
    HORA_CUDA(cudaMemcpyAsync(work, send, count * element, cudaMemcpyDeviceToDevice, stream_));
  char* my_shard = work + local_->rank() * shard * element;
  const std::vector<int64_t> shards(parts, shard);
  std::vector<int64_t> offsets(parts);
  for (int k = 0; k < parts; ++k) offsets[k] = k * shard;
  HORA_RETURN_IF_ERROR(
      local_->ReduceScatter(work, my_shard, shards, offsets, true, wire, op, stream_));
  host_.resize(shard * element);
  HORA_CUDA(
      cudaMemcpyAsync(host_.data(), my_shard, shard * element, cudaMemcpyDeviceToHost, stream_));
  HORA_CUDA(cudaStreamSynchronize(stream_));  // our stream only: MPI needs the bytes now
  if (IsHalf(wire)) {
    wide_.resize(shard);
    float* wide = wide_.data();
    WidenToFloat(host_.data(), wide, shard, wire, 1.0);
    HORA_RETURN_IF_ERROR(comm_->cross()->Allreduce(nullptr, wide, shard, DataType::kFloat32, op));
    NarrowFromFloat(wide, host_.data(), shard, wire, 1.0);
  } else {
    HORA_RETURN_IF_ERROR(comm_->cross()->Allreduce(nullptr, host_.data(), shard, wire, op));
  }
  HORA_CUDA(
      cudaMemcpyAsync(my_shard, host_.data(), shard * element, cudaMemcpyHostToDevice, stream_));
  HORA_RETURN_IF_ERROR(local_->Allgatherv(my_shard, work, InBytes(shards, element),
                                          InBytes(offsets, element), true, stream_));
  if (work != recv)
    HORA_CUDA(cudaMemcpyAsync(recv, work, count * element, cudaMemcpyDeviceToDevice, stream_));
  return Status::OK();
}

Status NcclExecutor::Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                               const std::vector<bool>& present, const CollectivePlan& plan) {
  const Response& head = batch[0];
  const DataType dtype = head.dtype;
  const DataType wire = plan.wire;
  const int64_t element = DataTypeSize(wire);
  HORA_RETURN_IF_ERROR(WaitForCallers(entries, batch_size, &present));
  if (batch_size == 1 && present[0] && wire == dtype && plan.prescale == 1.0 && !local_) {
    // A lone tensor is reduced from the caller's memory into its output.
    TensorEntry& e = entries[0];
    const int64_t count = head.NumElements();
    HORA_RETURN_IF_ERROR(Reduce(static_cast<const char*>(e.input.data),
                                static_cast<char*>(e.output), count, wire, head.op));
    if (plan.scales()) {
      HORA_RETURN_IF_ERROR(
          Copy(e.output, e.output, count, dtype, dtype, plan.post_factor, plan.divisor));
    }
    return ReleaseCallers(entries, batch_size, &present);
  }
  // Packed into the scratch buffer with one batched kernel launch (each
  // tensor at a 16-byte boundary so the copies vectorize), reduced with one
  // NCCL call, unpacked (with the post-scale) with one more launch.
  std::vector<int64_t> offsets(batch_size);
  int64_t bytes = 0;
  for (size_t k = 0; k < batch_size; ++k) {
    offsets[k] = bytes;
    bytes += Align16(batch[k].NumElements() * element);
  }
  if (local_) {
    // Padded so the host's ranks get equal shards of the buffer.
    const int64_t unit = element * local_->size();
    bytes = (bytes + unit - 1) / unit * unit;
  }
  char* buffer = nullptr;
  HORA_RETURN_IF_ERROR(Scratch(bytes, &buffer));
  tasks_.clear();
  back_.clear();
  for (size_t k = 0; k < batch_size; ++k) {
    const int64_t count = batch[k].NumElements();
    char* slot = buffer + offsets[k];
    if (present[k]) {
      tasks_.push_back(CopyTask{entries[k].input.data, slot, count});
      back_.push_back(CopyTask{slot, entries[k].output, count});
    } else {
      HORA_CUDA(
          Fill(slot, count, static_cast<int>(element), NeutralPattern(wire, head.op), stream_));
    }
  }
  HORA_CUDA(ScaledCopy(tasks_.data(), static_cast<int>(tasks_.size()), dtype, wire, plan.prescale,
                       1, stream_));
  HORA_RETURN_IF_ERROR(Reduce(buffer, buffer, bytes / element, wire, head.op));
  HORA_CUDA(ScaledCopy(back_.data(), static_cast<int>(back_.size()), wire, dtype, plan.post_factor,
                       plan.divisor, stream_));
  return ReleaseCallers(entries, batch_size, &present);
}

Status NcclExecutor::Run(const Response& r, TensorEntry& e, const CollectivePlan& plan) {
  HORA_RETURN_IF_ERROR(WaitForCallers(&e, 1, nullptr));
  switch (r.kind) {
    case CollectiveKind::kAllgather: return Allgather(e, plan);
    case CollectiveKind::kBroadcast: return Broadcast(r, e);
    case CollectiveKind::kAlltoall: return Alltoall(e, plan);
    case CollectiveKind::kReducescatter: return Reducescatter(r, e, plan);
    default: return Status::Internal("unexpected GPU collective kind");
  }
}

Status NcclExecutor::Allgather(TensorEntry& e, const CollectivePlan& plan) {
  const int64_t element = DataTypeSize(e.input.dtype);
  std::shared_ptr<DeviceBuffer> out;
  HORA_RETURN_IF_ERROR(AllocateOutput(plan.recv_total * element, &out));
  HORA_RETURN_IF_ERROR(
      nccl_->Allgatherv(e.input.data, out->data, InBytes(plan.recv_counts, element),
                        InBytes(plan.recv_offsets, element), plan.equal_blocks, stream_));
  return Deliver(e, std::move(out), plan);
}

Status NcclExecutor::Broadcast(const Response& r, TensorEntry& e) {
  HORA_RETURN_IF_ERROR(
      nccl_->Broadcast(e.input.data, e.output, e.input.NumBytes(), r.root, stream_));
  return ReleaseCallers(&e, 1, nullptr);
}

Status NcclExecutor::Alltoall(TensorEntry& e, const CollectivePlan& plan) {
  const int64_t element = DataTypeSize(e.input.dtype);
  std::shared_ptr<DeviceBuffer> out;
  HORA_RETURN_IF_ERROR(AllocateOutput(plan.recv_total * element, &out));
  HORA_RETURN_IF_ERROR(nccl_->Alltoallv(
      e.input.data, InBytes(plan.send_counts, element), InBytes(plan.send_offsets, element),
      out->data, InBytes(plan.recv_counts, element), InBytes(plan.recv_offsets, element), stream_));
  return Deliver(e, std::move(out), plan);
}

Status NcclExecutor::Reducescatter(const Response& r, TensorEntry& e, const CollectivePlan& plan) {
  const DataType dtype = r.dtype;
  const DataType wire = plan.wire;
  const int64_t element = DataTypeSize(wire);
  const int64_t total = plan.recv_total;
  const int64_t mine = plan.recv_counts[comm_->rank()];
  std::shared_ptr<DeviceBuffer> out;
  HORA_RETURN_IF_ERROR(AllocateOutput(mine * DataTypeSize(dtype), &out));
  const bool stage_in = wire != dtype || plan.prescale != 1.0;
  const bool stage_out = wire != dtype;
  char* scratch = nullptr;
  const int64_t staged_input = stage_in ? Align16(total * element) : 0;
  HORA_RETURN_IF_ERROR(Scratch(staged_input + mine * element, &scratch));
  const void* send = e.input.data;
  if (stage_in) {
    HORA_RETURN_IF_ERROR(Copy(send, scratch, total, dtype, wire, plan.prescale, 1));
    send = scratch;
  }
  char* recv = stage_out ? scratch + staged_input : static_cast<char*>(out->data);
  HORA_RETURN_IF_ERROR(nccl_->ReduceScatter(send, recv, plan.recv_counts, plan.recv_offsets,
                                            plan.equal_blocks, wire, r.op, stream_));
  if (mine > 0 && (stage_out || plan.scales())) {
    HORA_RETURN_IF_ERROR(Copy(recv, out->data, mine, wire, dtype, plan.post_factor, plan.divisor));
  }
  return Deliver(e, std::move(out), plan);
}

}  // namespace gpu
}  // namespace hora
