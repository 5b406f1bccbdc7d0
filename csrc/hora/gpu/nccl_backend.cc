#include "hora/gpu/nccl_backend.h"

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "hora/algo/host_kernels.h"
#include "hora/common/logging.h"
#include "hora/gpu/cuda_status.h"

namespace hora {
namespace gpu {
namespace {

// NCCL has no int16: it travels as int32 through the scratch buffer.
DataType GpuWire(DataType dtype) { return dtype == DataType::kInt16 ? DataType::kInt32 : dtype; }

ncclDataType_t NcclType(DataType wire) {
  switch (wire) {
    case DataType::kUInt8: case DataType::kBool: return ncclUint8;
    case DataType::kInt8: return ncclInt8;
    case DataType::kInt64: return ncclInt64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    default: return ncclInt32;
  }
}

// Bool Sum is a logical or, bool Product a logical and.
ncclRedOp_t NcclOp(ReduceOp op, DataType wire) {
  const bool logical = wire == DataType::kBool;
  switch (op) {
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return logical ? ncclMin : ncclProd;
    default: return logical ? ncclMax : ncclSum;  // Sum, and Average before its scaling
  }
}

double PostFactor(const Response& r) {
  double factor = r.postscale;
  if (r.op == ReduceOp::kAverage && IsFloatingPoint(r.dtype)) factor /= r.contributors;
  return factor;
}

int64_t Divisor(const Response& r) {
  return !IsFloatingPoint(r.dtype) && r.op == ReduceOp::kAverage ? r.contributors : 1;
}

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

int64_t RowBytes(const TensorView& view) {
  int64_t n = DataTypeSize(view.dtype);
  for (size_t d = 1; d < view.shape.size(); ++d) n *= view.shape[d];
  return n;
}

uint64_t HashName(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// What each rank tells the others about its GPU before NCCL starts.
struct DeviceCard {
  uint8_t uuid[16];
  uint64_t host;
  int32_t rank;
  int32_t device;
  int32_t ok;
  int32_t pad;
};

// Runs NCCL calls between ncclGroupStart and ncclGroupEnd, keeping the
// first failure but always closing the group.
class Group {
 public:
  explicit Group(ncclComm_t comm) : comm_(comm) { status_ = NcclStatus(ncclGroupStart(), "ncclGroupStart"); }
  void Add(ncclResult_t result, const char* what) {
    if (status_.ok()) status_ = NcclStatus(result, what, comm_);
  }
  Status End() {
    Status end = NcclStatus(ncclGroupEnd(), "ncclGroupEnd", comm_);
    return status_.ok() ? end : status_;
  }

 private:
  ncclComm_t comm_;
  Status status_;
};

}  // namespace

Status CreateBackend(Communicator* comm, const Config& config, int device,
                     std::unique_ptr<GpuBackend>* out) {
  return NcclBackend::Create(comm, config, device, out);
}

Status NcclBackend::Create(Communicator* comm, const Config& config, int device,
                           std::unique_ptr<GpuBackend>* out) {
  std::unique_ptr<NcclBackend> backend(new NcclBackend(comm, device));
  HORA_RETURN_IF_ERROR(backend->Init(config));
  *out = std::move(backend);
  return Status::OK();
}

Status NcclBackend::Init(const Config& config) {
  HORA_RETURN_IF_ERROR(CheckDistinctDevices());
  HORA_RETURN_IF_ERROR(InitComm(comm_, &nccl_));
  const Topology& t = comm_->topology();
  hierarchical_ = config.gpu_hierarchical_allreduce && t.cross_size > 1 && t.homogeneous &&
                  comm_->local() != nullptr && comm_->cross() != nullptr;
  if (config.gpu_hierarchical_allreduce && !hierarchical_) {
    HORA_LOG(kInfo) << "HORA_HIERARCHICAL_ALLREDUCE: not used (it needs several hosts with the "
                       "same number of ranks each)";
  }
  if (hierarchical_) HORA_RETURN_IF_ERROR(InitComm(comm_->local(), &local_));
  HORA_LOG(kDebug) << "GPU collectives: " << Describe();
  return Status::OK();
}

Status NcclBackend::CheckDistinctDevices() {
  // Every rank first does its local part, then all exchange the outcome, so
  // a failure anywhere becomes the same error everywhere instead of a hang.
  DeviceCard mine{};
  mine.rank = comm_->rank();
  mine.host = HashName(comm_->topology().hostname);
  Status local;
  if (device_ < 0) local = DefaultDevice(comm_->topology().local_rank, &device_);
  mine.device = device_;
  if (local.ok()) local = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  cudaDeviceProp properties{};
  if (local.ok()) local = CudaStatus(cudaGetDeviceProperties(&properties, device_), "cudaGetDeviceProperties");
  if (local.ok()) std::memcpy(mine.uuid, &properties.uuid, sizeof(mine.uuid));
  if (local.ok()) local = CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  if (local.ok()) local = CudaStatus(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  if (!local.ok()) cudaGetLastError();
  mine.ok = local.ok() ? 1 : 0;
  const int size = comm_->size();
  std::vector<DeviceCard> cards(size);
  HORA_RETURN_IF_ERROR(comm_->Allgatherv(&mine, sizeof(mine), cards.data(),
                                         std::vector<int64_t>(size, sizeof(DeviceCard))));
  if (!local.ok()) return local.WithContext("setting up this rank's GPU");
  std::ostringstream failed;
  for (const DeviceCard& c : cards) {
    if (!c.ok) failed << (failed.tellp() > 0 ? ", " : "") << c.rank;
  }
  if (failed.tellp() > 0) {
    return Status::Internal("GPU setup failed on rank(s) " + failed.str() + "; see their errors");
  }
  for (int a = 0; a < size; ++a) {
    for (int b = a + 1; b < size; ++b) {
      if (cards[a].host == cards[b].host && std::memcmp(cards[a].uuid, cards[b].uuid, 16) == 0) {
        return Status::InvalidArgument(
            "ranks " + std::to_string(a) + " and " + std::to_string(b) + " on one host both use the "
            "same GPU (device " + std::to_string(cards[a].device) + " and device " +
            std::to_string(cards[b].device) + " of their processes); give each rank its own GPU, "
            "e.g. torch.cuda.set_device(hvd.local_rank()), or set CUDA_VISIBLE_DEVICES per rank");
      }
    }
  }
  return Status::OK();
}

Status NcclBackend::InitComm(Communicator* over, ncclComm_t* out) {
  struct {
    int32_t ok;
    ncclUniqueId id;
  } message{};
  Status root_status;
  if (over->rank() == 0) {
    root_status = NcclStatus(ncclGetUniqueId(&message.id), "ncclGetUniqueId");
    message.ok = root_status.ok() ? 1 : 0;
  }
  HORA_RETURN_IF_ERROR(over->Broadcast(&message, sizeof(message), 0));
  if (!message.ok) {
    return over->rank() == 0 ? root_status
                             : Status::Internal("NCCL setup failed on rank 0; see its error");
  }
  return NcclStatus(ncclCommInitRank(out, over->size(), message.id, over->rank()), "ncclCommInitRank");
}

NcclBackend::~NcclBackend() {
  if (device_ < 0) return;
  DeviceGuard guard(device_);
  // Let queued collectives finish (the callers may not have read them yet);
  // past ten seconds the peers are gone, and abort ends NCCL's kernels.
  if (stream_ != nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (cudaStreamQuery(stream_) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (local_ != nullptr) ncclCommAbort(local_);
  if (nccl_ != nullptr) ncclCommAbort(nccl_);
  if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string NcclBackend::Describe() const {
  int version = 0;
  ncclGetVersion(&version);
  std::ostringstream s;
  s << "NCCL " << version / 10000 << "." << version / 100 % 100 << "." << version % 100
    << " on GPU " << device_ << (hierarchical_ ? ", hierarchical allreduce" : "");
  return s.str();
}

Status NcclBackend::WaitForCallers(TensorEntry* entries, size_t count,
                                   const std::vector<bool>* present) {
  for (size_t k = 0; k < count; ++k) {
    if ((present != nullptr && !(*present)[k]) || !entries[k].ready) continue;
    HORA_CUDA(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(entries[k].ready.get()), 0));
    entries[k].ready.reset();  // back to the pool: the wait has captured it
  }
  return Status::OK();
}

Status NcclBackend::ReleaseCallers(TensorEntry* entries, size_t count,
                                   const std::vector<bool>* present) {
  HORA_CUDA(cudaEventRecord(done_, stream_));
  uintptr_t last = ~uintptr_t{0};
  for (size_t k = 0; k < count; ++k) {
    if ((present != nullptr && !(*present)[k]) || entries[k].stream == last) continue;
    last = entries[k].stream;
    HORA_CUDA(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(last), done_, 0));
  }
  return Status::OK();
}

Status NcclBackend::Scratch(int64_t bytes, char** out) {
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

Status NcclBackend::AllocateOutput(int64_t bytes, std::shared_ptr<DeviceBuffer>* out) {
  auto buffer = std::make_shared<DeviceBuffer>();
  HORA_CUDA(cudaMallocAsync(&buffer->data, bytes > 0 ? bytes : 1, stream_));
  buffer->bytes = bytes;
  buffer->device = device_;
  // Until it is handed over, only our stream has used it: a collective that
  // fails half-way frees it in order after whatever was queued on it.
  cudaStream_t stream = stream_;
  buffer->release = [stream](void* p) { cudaFreeAsync(p, stream); };
  *out = std::move(buffer);
  return Status::OK();
}

void NcclBackend::HandOver(DeviceBuffer* buffer, uintptr_t caller_stream) {
  // The caller's stream has been made to wait for our work on the buffer,
  // and it is where the caller will use it: free it in order there.
  const int device = device_;
  buffer->release = [device, caller_stream](void* p) {
    DeviceGuard guard(device);
    cudaFreeAsync(p, reinterpret_cast<cudaStream_t>(caller_stream));
  };
}

Status NcclBackend::Copy(const void* src, void* dst, int64_t count, DataType in, DataType out,
                         double scale, int64_t divisor) {
  const CopyTask task{src, dst, count};
  return CudaStatus(ScaledCopy(&task, 1, in, out, scale, divisor, stream_), "scaled-copy kernel");
}

Status NcclBackend::Reduce(const char* send, char* recv, int64_t count, DataType wire, ReduceOp op) {
  const ncclDataType_t type = NcclType(wire);
  const ncclRedOp_t nccl_op = NcclOp(op, wire);
  if (!hierarchical_) {
    HORA_NCCL(ncclAllReduce(send, recv, count, type, nccl_op, nccl_, stream_), nccl_);
    return Status::OK();
  }
  // Inside the host a reduce-scatter leaves each local rank one shard of
  // the host's sum; the shards cross hosts through MPI on host memory; an
  // allgather inside the host puts the shards back together.
  Communicator* local = comm_->local();
  const int64_t element = DataTypeSize(wire);
  const int parts = local->size();
  const int64_t shard = (count + parts - 1) / parts;
  char* work = recv;
  if (shard * parts != count) {
    HORA_RETURN_IF_ERROR(Scratch(shard * parts * element, &work));  // padding is never read back
    if (work == recv) return Status::Internal("hierarchical allreduce: scratch overlaps the output");
  }
  if (work != send) HORA_CUDA(cudaMemcpyAsync(work, send, count * element, cudaMemcpyDeviceToDevice, stream_));
  char* my_shard = work + local->rank() * shard * element;
  HORA_NCCL(ncclReduceScatter(work, my_shard, shard, type, nccl_op, local_, stream_), local_);
  const bool widen = IsHalf(wire);
  host_.resize(shard * element);
  HORA_CUDA(cudaMemcpyAsync(host_.data(), my_shard, shard * element, cudaMemcpyDeviceToHost, stream_));
  HORA_CUDA(cudaStreamSynchronize(stream_));  // our stream only: MPI needs the bytes now
  if (widen) {
    wide_.resize(shard);
    float* wide = wide_.data();
    WidenToFloat(host_.data(), wide, shard, wire, 1.0);
    HORA_RETURN_IF_ERROR(comm_->cross()->Allreduce(nullptr, wide, shard, DataType::kFloat32, op));
    NarrowFromFloat(wide, host_.data(), shard, wire, 1.0);
  } else {
    HORA_RETURN_IF_ERROR(comm_->cross()->Allreduce(nullptr, host_.data(), shard, wire, op));
  }
  HORA_CUDA(cudaMemcpyAsync(my_shard, host_.data(), shard * element, cudaMemcpyHostToDevice, stream_));
  HORA_NCCL(ncclAllGather(my_shard, work, shard, type, local_, stream_), local_);
  if (work != recv) HORA_CUDA(cudaMemcpyAsync(recv, work, count * element, cudaMemcpyDeviceToDevice, stream_));
  return Status::OK();
}

Status NcclBackend::Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                              const std::vector<bool>& present) {
  const Response& head = batch[0];
  const DataType dtype = head.dtype;
  const DataType wire = GpuWire(dtype);
  const int64_t element = DataTypeSize(wire);
  const double factor = IsFloatingPoint(dtype) ? PostFactor(head) : 1.0;
  const int64_t divisor = Divisor(head);
  HORA_RETURN_IF_ERROR(WaitForCallers(entries, batch_size, &present));
  if (batch_size == 1 && present[0] && wire == dtype && head.prescale == 1.0 && !hierarchical_) {
    // A lone tensor is reduced from the caller's memory into its output.
    TensorEntry& e = entries[0];
    const int64_t count = head.NumElements();
    HORA_RETURN_IF_ERROR(Reduce(static_cast<const char*>(e.input.data), static_cast<char*>(e.output),
                                count, wire, head.op));
    if (factor != 1.0 || divisor != 1) {
      HORA_RETURN_IF_ERROR(Copy(e.output, e.output, count, dtype, dtype, factor, divisor));
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
  if (hierarchical_) {
    // Padded so the host's ranks get equal shards of the buffer.
    const int64_t unit = element * comm_->local()->size();
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
      HORA_CUDA(Fill(slot, count, static_cast<int>(element), NeutralPattern(wire, head.op), stream_));
    }
  }
  HORA_CUDA(ScaledCopy(tasks_.data(), static_cast<int>(tasks_.size()), dtype, wire, head.prescale, 1, stream_));
  HORA_RETURN_IF_ERROR(Reduce(buffer, buffer, bytes / element, wire, head.op));
  HORA_CUDA(ScaledCopy(back_.data(), static_cast<int>(back_.size()), wire, dtype, factor, divisor, stream_));
  return ReleaseCallers(entries, batch_size, &present);
}

Status NcclBackend::Allgather(const Response& r, TensorEntry& e) {
  HORA_RETURN_IF_ERROR(WaitForCallers(&e, 1, nullptr));
  const int size = comm_->size();
  const int64_t row_bytes = RowBytes(e.input);
  int64_t total_rows = 0;
  bool equal = true;
  for (int k = 0; k < size; ++k) {
    total_rows += r.first_dims[k];
    equal = equal && r.first_dims[k] == r.first_dims[0];
  }
  std::shared_ptr<DeviceBuffer> out;
  HORA_RETURN_IF_ERROR(AllocateOutput(total_rows * row_bytes, &out));
  char* recv = static_cast<char*>(out->data);
  if (equal) {
    if (total_rows > 0) {
      HORA_NCCL(ncclAllGather(e.input.data, recv, r.first_dims[0] * row_bytes, ncclInt8, nccl_, stream_), nccl_);
    }
  } else {
    // Ranks send different amounts: one broadcast per rank, in one group.
    Group group(nccl_);
    int64_t offset = 0;
    for (int k = 0; k < size; ++k) {
      const int64_t bytes = r.first_dims[k] * row_bytes;
      if (bytes > 0) {
        group.Add(ncclBroadcast(e.input.data, recv + offset, bytes, ncclInt8, k, nccl_, stream_),
                  "ncclBroadcast (allgather)");
      }
      offset += bytes;
    }
    HORA_RETURN_IF_ERROR(group.End());
  }
  HORA_RETURN_IF_ERROR(ReleaseCallers(&e, 1, nullptr));
  HandOver(out.get(), e.stream);
  e.work->device_output = std::move(out);
  e.work->output_shape = e.input.shape;
  e.work->output_shape[0] = total_rows;
  return Status::OK();
}

Status NcclBackend::Broadcast(const Response& r, TensorEntry& e) {
  HORA_RETURN_IF_ERROR(WaitForCallers(&e, 1, nullptr));
  const int64_t bytes = e.input.NumBytes();
  if (bytes > 0) {
    HORA_NCCL(ncclBroadcast(e.input.data, e.output, bytes, ncclInt8, r.root, nccl_, stream_), nccl_);
  }
  return ReleaseCallers(&e, 1, nullptr);
}

Status NcclBackend::Alltoall(const Response& r, TensorEntry& e) {
  HORA_RETURN_IF_ERROR(WaitForCallers(&e, 1, nullptr));
  const int size = comm_->size();
  const int me = comm_->rank();
  const int64_t row_bytes = RowBytes(e.input);
  std::vector<int64_t> send_offset(size), recv_offset(size);
  e.work->received_splits.assign(size, 0);
  int64_t sent = 0, received = 0;
  for (int k = 0; k < size; ++k) {
    send_offset[k] = sent;
    recv_offset[k] = received;
    sent += r.splits[me * size + k] * row_bytes;
    e.work->received_splits[k] = r.splits[k * size + me];
    received += e.work->received_splits[k] * row_bytes;
  }
  std::shared_ptr<DeviceBuffer> out;
  HORA_RETURN_IF_ERROR(AllocateOutput(received, &out));
  const char* send = static_cast<const char*>(e.input.data);
  char* recv = static_cast<char*>(out->data);
  const int64_t self = r.splits[me * size + me] * row_bytes;
  if (self > 0) {
    HORA_CUDA(cudaMemcpyAsync(recv + recv_offset[me], send + send_offset[me], self,
                              cudaMemcpyDeviceToDevice, stream_));
  }
  Group group(nccl_);
  for (int k = 0; k < size; ++k) {
    if (k == me) continue;
    const int64_t to = r.splits[me * size + k] * row_bytes;
    const int64_t from = r.splits[k * size + me] * row_bytes;
    if (to > 0) group.Add(ncclSend(send + send_offset[k], to, ncclInt8, k, nccl_, stream_), "ncclSend");
    if (from > 0) group.Add(ncclRecv(recv + recv_offset[k], from, ncclInt8, k, nccl_, stream_), "ncclRecv");
  }
  HORA_RETURN_IF_ERROR(group.End());
  HORA_RETURN_IF_ERROR(ReleaseCallers(&e, 1, nullptr));
  HandOver(out.get(), e.stream);
  e.work->device_output = std::move(out);
  e.work->output_shape = e.input.shape;
  int64_t rows = 0;
  for (int64_t s : e.work->received_splits) rows += s;
  e.work->output_shape[0] = rows;
  return Status::OK();
}

Status NcclBackend::Reducescatter(const Response& r, TensorEntry& e) {
  HORA_RETURN_IF_ERROR(WaitForCallers(&e, 1, nullptr));
  const int size = comm_->size();
  const int me = comm_->rank();
  const DataType dtype = r.dtype;
  const DataType wire = GpuWire(dtype);
  const int64_t element = DataTypeSize(wire);
  const int64_t rows = e.input.shape[0];
  int64_t row_elements = 1;
  for (size_t d = 1; d < e.input.shape.size(); ++d) row_elements *= e.input.shape[d];
  // The first rows % size ranks get one extra row, as on the CPU path.
  std::vector<int64_t> counts(size), offsets(size);
  bool equal = true;
  int64_t total = 0;
  for (int k = 0; k < size; ++k) {
    counts[k] = (rows / size + (k < rows % size ? 1 : 0)) * row_elements;
    offsets[k] = total;
    total += counts[k];
    equal = equal && counts[k] == counts[0];
  }
  const int64_t mine = counts[me];
  std::shared_ptr<DeviceBuffer> out;
  HORA_RETURN_IF_ERROR(AllocateOutput(mine * DataTypeSize(dtype), &out));
  const bool stage_in = wire != dtype || r.prescale != 1.0;
  const bool stage_out = wire != dtype;
  char* scratch = nullptr;
  HORA_RETURN_IF_ERROR(Scratch((stage_in ? Align16(total * element) : 0) + mine * element, &scratch));
  const char* send = static_cast<const char*>(e.input.data);
  if (stage_in) {
    HORA_RETURN_IF_ERROR(Copy(send, scratch, total, dtype, wire, r.prescale, 1));
    send = scratch;
  }
  char* recv = stage_out ? scratch + (stage_in ? Align16(total * element) : 0) : static_cast<char*>(out->data);
  const ncclDataType_t type = NcclType(wire);
  const ncclRedOp_t op = NcclOp(r.op, wire);
  if (equal) {
    if (mine > 0) HORA_NCCL(ncclReduceScatter(send, recv, mine, type, op, nccl_, stream_), nccl_);
  } else {
    Group group(nccl_);
    for (int k = 0; k < size; ++k) {
      if (counts[k] == 0) continue;
      group.Add(ncclReduce(send + offsets[k] * element, recv, counts[k], type, op, k, nccl_, stream_),
                "ncclReduce (reducescatter)");
    }
    HORA_RETURN_IF_ERROR(group.End());
  }
  const double factor = IsFloatingPoint(dtype) ? PostFactor(r) : 1.0;
  const int64_t divisor = Divisor(r);
  if (mine > 0 && (stage_out || factor != 1.0 || divisor != 1)) {
    HORA_RETURN_IF_ERROR(Copy(recv, out->data, mine, wire, dtype, factor, divisor));
  }
  HORA_RETURN_IF_ERROR(ReleaseCallers(&e, 1, nullptr));
  HandOver(out.get(), e.stream);
  e.work->device_output = std::move(out);
  e.work->output_shape = e.input.shape;
  e.work->output_shape[0] = rows / size + (me < rows % size ? 1 : 0);
  return Status::OK();
}

}  // namespace gpu
}  // namespace hora
