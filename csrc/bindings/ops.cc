// Submitting collectives from Python. Argument errors are found here, on
// the caller's thread, and raised at once; everything that needs the other
// ranks is decided by the engine and reported through Work.wait().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <vector>

#include "dlpack.h"
#include "errors.h"
#include "hora/core/request_check.h"
#include "hora/cuda/device_runtime.h"
#include "runtime.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace hora {
namespace {

// A submitted collective as Python sees it. It owns the views of the
// caller's arrays, so their memory cannot go away while the engine uses it.
struct PyWork {
  std::shared_ptr<Work> work;
  // In place rather than behind pointers: two allocations fewer per submission.
  std::optional<TensorArg> input;
  std::optional<TensorArg> output;
  DataType dtype = DataType::kFloat32;
  bool enqueued = false;

  ~PyWork() {
    if (enqueued && !work->Poll()) {
      py::gil_scoped_release release;
      work->Wait();
    }
  }
};

// Owned result memory exported to Python through the buffer protocol.
struct ResultBuffer {
  std::shared_ptr<OwnedBuffer> buffer;
};

dlpack::DataType ToDlpack(DataType dtype) {
  const uint8_t bits = static_cast<uint8_t>(DataTypeSize(dtype) * 8);
  switch (dtype) {
    case DataType::kUInt8: return {dlpack::kUInt, 8, 1};
    case DataType::kBool: return {dlpack::kBool, 8, 1};
    case DataType::kBFloat16: return {dlpack::kBfloat, 16, 1};
    case DataType::kFloat16: case DataType::kFloat32: case DataType::kFloat64:
      return {dlpack::kFloat, bits, 1};
    default: return {dlpack::kInt, bits, 1};
  }
}

// A GPU result handed to a framework as a legacy "dltensor" capsule; the
// consumer's deleter call (or the capsule's, if nobody consumed it) frees it.
struct DeviceExport {
  dlpack::ManagedTensor managed;
  std::shared_ptr<DeviceBuffer> buffer;
  std::vector<int64_t> shape;
};

void DeleteExport(dlpack::ManagedTensor* managed) {
  delete static_cast<DeviceExport*>(managed->manager_ctx);
}

py::object ExportDevice(std::shared_ptr<DeviceBuffer> buffer, DataType dtype,
                        const std::vector<int64_t>& shape) {
  auto* e = new DeviceExport();
  e->buffer = std::move(buffer);
  e->shape = shape;
  dlpack::Tensor& t = e->managed.dl_tensor;
  t.data = e->buffer->data;
  t.device = {dlpack::kCUDA, e->buffer->device};
  t.ndim = static_cast<int32_t>(e->shape.size());
  t.dtype = ToDlpack(dtype);
  t.shape = e->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = &DeleteExport;
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", [](PyObject* self) {
    if (PyCapsule_IsValid(self, "dltensor")) {  // never consumed
      auto* m = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(self, "dltensor"));
      m->deleter(m);
    }
  });
  if (capsule == nullptr) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

void ThrowIfFailed(const Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

// Views the caller's arrays for `w` and fills in the request's dtype and
// shape. `output` is None for an in-place collective or an owned result.
void AttachTensors(PyWork* w, Request* r, py::handle input, py::handle output, bool in_place,
                   int dtype) {
  w->input.emplace(input, in_place, dtype, ArgName{"tensor '", r->name, "'"});
  if (!output.is_none()) {
    w->output.emplace(output, true, dtype, ArgName{"output of '", r->name, "'"});
  }
  r->dtype = w->input->view().dtype;
  r->shape = w->input->view().shape;
  r->on_gpu = w->input->view().device >= 0;
  w->dtype = r->dtype;
}

// Checks the request and makes the engine's entry for it, linked to `w`.
// `stream` is the caller's CUDA stream for GPU tensors; -1 means the caller
// (hora's framework-neutral functions) cannot say which stream produced the
// data, so GPU memory is refused rather than read out of order.
TensorEntry MakeEntry(PyWork* w, Request r, bool in_place, int size, int64_t stream) {
  const TensorView& in = w->input->view();
  ThrowIfFailed(CheckRequest(r, in, w->output ? &w->output->view() : nullptr, size));
  TensorEntry entry;
  if (in.device >= 0) {
    if (stream < 0) {
      ThrowValueError(DescribeRequest(r) + ": the tensor is in GPU memory, but this function takes host "
                      "memory (it cannot know which CUDA stream produces the data); use a "
                      "framework adapter such as hora.torch for GPU tensors");
    }
    // The engine's work on this tensor starts after what the caller has
    // queued on its stream so far (the kernels producing it).
    Status status = gpu::RecordReady(in.device, stream, &entry.ready);
    if (!status.ok()) ThrowValueError("tensor '" + r.name + "' " + status.message());
    entry.stream = static_cast<uintptr_t>(stream);
  }
  entry.request = std::move(r);
  entry.input = in;
  entry.output = w->output ? w->output->view().data : in_place ? in.data : nullptr;
  entry.work = std::make_shared<Work>();
  w->work = entry.work;
  return entry;
}

py::list Submit(int kind, const std::vector<std::string>& names,
                                            py::list inputs, py::object outputs, int op, int root,
                                            double prescale, double postscale, py::object splits,
                                            const std::vector<int>& dtypes, bool grouped,
                                            const std::string& site, int64_t stream) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  const int size = engine->topology().size;
  if (static_cast<size_t>(py::len(inputs)) != names.size() ||
      (!dtypes.empty() && dtypes.size() != names.size())) {
    ThrowValueError("internal: names, tensors and dtypes differ in length");
  }
  std::vector<std::unique_ptr<PyWork>> works;
  std::vector<TensorEntry> entries;
  const std::string group = grouped && !names.empty() ? "group:" + names[0] : std::string();
  for (size_t i = 0; i < names.size(); ++i) {
    Request r;
    r.name = names[i];
    r.kind = static_cast<CollectiveKind>(kind);
    r.op = static_cast<ReduceOp>(op);
    r.root = root;
    r.prescale = prescale;
    r.postscale = postscale;
    r.group = group;
    r.group_size = grouped ? static_cast<int32_t>(names.size()) : 0;
    r.site = site;
    auto w = std::make_unique<PyWork>();
    const bool in_place = !outputs.is_none() && outputs.cast<py::list>()[i].is(inputs[i]);
    AttachTensors(w.get(), &r, inputs[i],
                  outputs.is_none() || in_place ? py::none() : py::object(outputs.cast<py::list>()[i]),
                  in_place, dtypes.empty() ? -1 : dtypes[i]);
    const TensorView& in = w->input->view();
    if (r.kind == CollectiveKind::kAlltoall) {
      if (splits.is_none()) {
        ThrowIfFailed(EqualSplits(r, in, size, &r.splits));
      } else {
        r.splits = splits.cast<std::vector<int64_t>>();
      }
    }
    TensorEntry entry = MakeEntry(w.get(), std::move(r), in_place, size, stream);
    entries.push_back(std::move(entry));
    works.push_back(std::move(w));
  }
  Status status = engine->Enqueue(std::move(entries));
  if (!status.ok()) ThrowStatus(status);
  py::list result;
  for (auto& w : works) {
    w->enqueued = true;
    result.append(py::cast(std::move(w)));
  }
  return result;
}

// The request of a one-tensor submission, before its tensor is attached.
Request OneRequest(int kind, const std::string& name, int op, int root, double prescale,
                   double postscale, const std::string& site) {
  Request r;
  r.name = name;
  r.kind = static_cast<CollectiveKind>(kind);
  r.op = static_cast<ReduceOp>(op);
  r.root = root;
  r.prescale = prescale;
  r.postscale = postscale;
  r.site = site;
  return r;
}

// Queues `w`'s collective and hands `w` to Python as its Work.
py::object EnqueueOne(const std::shared_ptr<Engine>& engine, std::unique_ptr<PyWork> w, Request r,
                      bool in_place, int64_t stream) {
  Status status =
      engine->EnqueueOne(MakeEntry(w.get(), std::move(r), in_place, engine->topology().size, stream));
  if (!status.ok()) ThrowStatus(status);
  w->enqueued = true;
  return py::cast(std::move(w));
}

// One tensor, in place or into an owned result: the common case of the
// framework adapters, without the list conversions of Submit.
py::object SubmitOne(int kind, const std::string& name, py::handle tensor, bool in_place, int op,
                     double prescale, double postscale, int dtype, const std::string& site,
                     int64_t stream) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  Request r = OneRequest(kind, name, op, 0, prescale, postscale, site);
  if (r.kind == CollectiveKind::kAlltoall || r.kind == CollectiveKind::kBroadcast) {
    ThrowValueError("internal: submit_one takes allreduce, allgather and reducescatter only");
  }
  auto w = std::make_unique<PyWork>();
  AttachTensors(w.get(), &r, tensor, py::none(), in_place, dtype);
  return EnqueueOne(engine, std::move(w), std::move(r), in_place, stream);
}

// SubmitOne for contiguous host memory described by the caller (see the
// raw TensorArg): an in-place allreduce or broadcast of a torch CPU tensor,
// the per-gradient path of hora.torch.
py::object SubmitOneHost(int kind, const std::string& name, py::handle owner, uintptr_t data,
                         std::vector<int64_t> shape, int dtype, int op, int root, double prescale,
                         double postscale, const std::string& site) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  Request r = OneRequest(kind, name, op, root, prescale, postscale, site);
  if (r.kind != CollectiveKind::kAllreduce && r.kind != CollectiveKind::kBroadcast) {
    ThrowValueError("internal: submit_one_host takes in-place allreduce and broadcast only");
  }
  if (dtype < 0 || dtype >= kNumDataTypes) {
    ThrowValueError("internal: submit_one_host got dtype code " + std::to_string(dtype));
  }
  auto w = std::make_unique<PyWork>();
  w->input.emplace(owner, data, std::move(shape), static_cast<DataType>(dtype));
  r.dtype = w->dtype = w->input->view().dtype;
  r.shape = w->input->view().shape;
  return EnqueueOne(engine, std::move(w), std::move(r), true, -1);
}

// Gives up the GIL only when the collective is still running: most waits
// of a backward pass find their result already there.
Status WaitFor(PyWork& w) {
  if (w.work->Poll()) return w.work->Wait();
  py::gil_scoped_release release;
  return w.work->Wait();
}

}  // namespace

void RegisterOps(py::module_& m) {
  py::class_<ResultBuffer>(m, "ResultBuffer", py::buffer_protocol())
      .def_buffer([](ResultBuffer& b) {
        return py::buffer_info(b.buffer->data(), 1, "B", 1, {b.buffer->size()}, {1});
      });

  py::class_<PyWork>(m, "Work")
      .def("wait", [](PyWork& w) { ThrowIfFailed(WaitFor(w)); })
      // wait() and release() in one call: the per-tensor path of a handle.
      .def("wait_release",
           [](PyWork& w) {
             Status status = WaitFor(w);
             w.input.reset();
             w.output.reset();
             ThrowIfFailed(status);
           })
      .def("poll", [](PyWork& w) { return w.work->Poll(); })
      .def("result_dlpack",
           [](PyWork& w) -> py::object {
             if (!w.work->device_output) return py::none();
             return ExportDevice(w.work->device_output, w.dtype, w.work->output_shape);
           })
      .def_property_readonly("on_gpu", [](PyWork& w) { return static_cast<bool>(w.work->device_output); })
      .def("result_buffer",
           [](PyWork& w) -> py::object {
             if (!w.work->output) return py::none();
             return py::cast(ResultBuffer{w.work->output});
           })
      .def_property_readonly("output_shape", [](PyWork& w) { return w.work->output_shape; })
      .def_property_readonly("received_splits", [](PyWork& w) { return w.work->received_splits; })
      .def("release",
           [](PyWork& w) {
             // Drops the views of the caller's arrays once the result is in.
             w.input.reset();
             w.output.reset();
           });

  m.def("submit", &Submit, py::arg("kind"), py::arg("names"), py::arg("inputs"),
        py::arg("outputs") = py::none(), py::arg("op") = 1, py::arg("root") = 0,
        py::arg("prescale") = 1.0, py::arg("postscale") = 1.0, py::arg("splits") = py::none(),
        py::arg("dtypes") = std::vector<int>(), py::arg("grouped") = false,
        py::arg("site") = std::string(), py::arg("stream") = -1);
  m.def("submit_one", &SubmitOne, py::arg("kind"), py::arg("name"), py::arg("tensor"),
        py::arg("in_place"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
        py::arg("dtype"), py::arg("site"), py::arg("stream") = -1);
  m.def("submit_one_host", &SubmitOneHost, py::arg("kind"), py::arg("name"), py::arg("owner"),
        py::arg("data"), py::arg("shape"), py::arg("dtype"), py::arg("op"), py::arg("root"),
        py::arg("prescale"), py::arg("postscale"), py::arg("site"));
  // Whether submissions should say where they come from (debug log level).
  m.def("records_call_sites",
        [] { return CurrentEngine()->config().log_level <= LogLevel::kDebug; });

  m.def("join", [] {
    std::shared_ptr<Engine> engine = CurrentEngine();
    std::shared_ptr<Work> work;
    Status status = engine->Join(&work);
    if (!status.ok()) ThrowStatus(status);
    {
      py::gil_scoped_release release;
      status = work->Wait();
    }
    if (!status.ok()) ThrowStatus(status);
    return work->join_last_rank;
  });
}

}  // namespace hora
