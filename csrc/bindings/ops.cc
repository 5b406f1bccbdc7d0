// Submitting collectives from Python. Argument errors are found here, on
// the caller's thread, and raised at once; everything that needs the other
// ranks is decided by the engine and reported through Work.wait().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <vector>

#include "dlpack.h"
#include "errors.h"
#include "hora/core/process_set_table.h"
#include "hora/core/request_check.h"
#include "hora/cuda/device_runtime.h"
#include "runtime.h"
#include "tensor_arg.h"
#include "waiting.h"

namespace py = pybind11;

namespace hora {
namespace {

// How a submission runs; Python keeps one per setting and reuses it, so the
// per-tensor path converts no arguments it does not need.
struct CollectiveOptions {
  int op = static_cast<int>(ReduceOp::kSum);
  int root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::optional<std::vector<int64_t>> splits;  // alltoall; None: equal shares
  // Per tensor: a dtype code that reinterprets the elements (NumPy has no
  // bfloat16), or empty.
  std::vector<int> dtypes;
  bool grouped = false;
  bool in_place = false;
  // Where the caller submitted it, recorded at debug log level.
  std::string site;
  // The caller's CUDA stream; -1: the caller cannot say (host memory only).
  int64_t stream = -1;
  // The process set (0: every rank); `root` is a global rank.
  int32_t process_set = 0;
};

// A submitted collective as Python sees it. It owns the views of the
// caller's arrays, so their memory cannot go away while the engine uses it.
struct PyWork {
  std::shared_ptr<Work> work;
  // In place rather than behind pointers: two allocations fewer per submission.
  std::optional<TensorArg> input;
  std::optional<TensorArg> output;
  DataType dtype = DataType::kFloat32;
  bool enqueued = false;
  // The caller has had the outcome: a wait returned or raised, or its
  // handle settled and released it (a grouped handle raises one member's
  // error for all of them).
  bool seen = false;

  // A handle dropped while its collective runs must not block the caller
  // (the other ranks may submit it only later): its views are adopted. One
  // that already failed, unseen, is reported now, as an adopted one would be.
  ~PyWork() {
    if (!enqueued) return;
    if (!work->Poll()) {
      Adopt(std::move(work), std::move(input), std::move(output));
    } else if (!seen) {
      ReportDroppedFailure(*work);
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
    case DataType::kFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64: return {dlpack::kFloat, bits, 1};
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

// Views the caller's arrays for `w` and fills in the request's dtype and
// shape. `output` is None for an in-place collective or an owned result.
void AttachTensors(PyWork* w, Request* r, py::handle input, py::handle output, bool in_place,
                   int dtype, bool caller_orders) {
  w->input.emplace(input, in_place, dtype, ArgName{"tensor '", r->name, "'"}, caller_orders);
  if (!output.is_none()) {
    w->output.emplace(output, true, dtype, ArgName{"output of '", r->name, "'"}, caller_orders);
  }
  r->dtype = w->input->view().dtype;
  r->shape = w->input->view().shape;
  r->on_gpu = w->input->view().device >= 0;
  w->dtype = r->dtype;
}

void ThrowIfFailed(const Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

// Checks the request and makes the engine's entry for it, linked to `w`.
// `stream` is the caller's CUDA stream for GPU tensors; -1 means the caller
// (hora's framework-neutral functions) cannot say which stream produced the
// data, so GPU memory is refused rather than read out of order.
// `previous`: the entry made just before in the same submission, whose
// ready event this one shares when it is on the same GPU and stream (nothing
// can be queued on the stream between the two, so one event serves both).
TensorEntry MakeEntry(PyWork* w, Request r, bool in_place, int size, int64_t stream,
                      const std::optional<std::vector<int64_t>>& splits,
                      const TensorEntry* previous = nullptr) {
  const TensorView& in = w->input->view();
  if (r.kind == CollectiveKind::kAlltoall) {
    if (splits && !splits->empty()) {  // no splits, or none given: even ones, as in Horovod
      r.splits = *splits;
    } else {
      ThrowIfFailed(EqualSplits(r, in, size, &r.splits));
    }
  }
  ThrowIfFailed(CheckRequest(r, in, w->output ? &w->output->view() : nullptr, size));
  if (in_place && r.kind == CollectiveKind::kReducescatter && in.device >= 0) {
    ThrowValueError(DescribeRequest(r) + ": an in-place reducescatter runs on host memory only");
  }
  if (w->output && r.kind == CollectiveKind::kAllgather && in.device >= 0) {
    ThrowValueError(DescribeRequest(r) +
                    ": an allgather into a given output runs on host memory only");
  }
  TensorEntry entry;
  if (in.device >= 0) {
    if (stream < 0) {
      ThrowValueError(DescribeRequest(r) +
                      ": the tensor is in GPU memory, but this function "
                      "takes host memory (it cannot know which CUDA stream produces the data); "
                      "use a framework adapter such as hora.torch for GPU tensors");
    }
    // The engine's work on this tensor starts after what the caller has
    // queued on its stream so far (the kernels producing it).
    if (previous != nullptr && previous->ready && previous->input.device == in.device &&
        previous->stream == static_cast<uintptr_t>(stream)) {
      entry.ready = previous->ready;
    } else {
      Status status = gpu::RecordReady(in.device, stream, &entry.ready);
      if (!status.ok()) ThrowValueError("tensor '" + r.name + "' " + status.message());
    }
    entry.stream = static_cast<uintptr_t>(stream);
  }
  entry.request = std::move(r);
  entry.input = in;
  entry.output = w->output ? w->output->view().data : in_place ? in.data : nullptr;
  if (w->output) entry.output_bytes = w->output->view().NumBytes();
  entry.work = std::make_shared<Work>();
  w->work = entry.work;
  return entry;
}

// A submission's request, before its tensor is attached.
Request NewRequest(int kind, std::string name, const CollectiveOptions& o) {
  if (kind < 0 || kind > static_cast<int>(CollectiveKind::kBarrier)) {
    ThrowValueError("internal: unknown collective kind " + std::to_string(kind));
  }
  Request r;
  r.name = std::move(name);
  r.kind = static_cast<CollectiveKind>(kind);
  r.op = static_cast<ReduceOp>(o.op);
  r.root = o.root;
  r.prescale = o.prescale;
  r.postscale = o.postscale;
  r.site = o.site;
  return r;
}

// A call this rank refuses (its tensors or arguments fail the checks here)
// still takes part in the negotiation: each of its names is queued as
// refused, with the reason, so that the ranks that submitted it correctly
// raise too, naming this rank, instead of waiting for it. A name already
// in flight here keeps its own course. Returns the refusals' Works.
std::vector<std::shared_ptr<Work>> AnnounceRefusal(Engine& engine, int kind,
                                                   const std::vector<std::string>& names,
                                                   const std::string& group, int32_t group_size,
                                                   const std::string& why) {
  std::vector<std::shared_ptr<Work>> works;
  std::vector<TensorEntry> entries;
  entries.reserve(names.size());
  for (const std::string& name : names) {
    if (name.empty()) return {};  // nothing the other ranks could have submitted
    TensorEntry entry;
    entry.request.name = name;
    entry.request.kind = static_cast<CollectiveKind>(kind);
    entry.request.group = group;
    entry.request.group_size = group_size;
    entry.request.refused = why;
    entry.work = std::make_shared<Work>();
    works.push_back(entry.work);
    entries.push_back(std::move(entry));
  }
  if (!engine.Enqueue(std::move(entries)).ok()) works.clear();
  return works;
}

// How long a refusing rank waits for its refusal to meet the other ranks'
// calls before raising. Until it has, the name stays in flight here, and a
// caller that retries at once under the same name would be told so; ranks
// that all make the same mistake meet within milliseconds. A rank whose
// peers never make the call raises after this long, its refusal left in
// flight (the stall inspector reports it).
constexpr int kRefusalWaitMs = 2000;

// The call's name for a refusal: none when it is not a string.
std::vector<std::string> NameOf(py::handle name) {
  if (!PyUnicode_Check(name.ptr())) return {};
  return {name.cast<std::string>()};
}

// Runs `make` (viewing and checking the call's tensors); when it raises,
// announces the refusal under the call's names (`names()`, asked only
// then) before the error reaches the caller.
template <typename Names, typename Make>
auto Refusing(Engine& engine, int kind, Names&& names, const std::string& group, int32_t group_size,
              Make&& make) -> decltype(make()) {
  try {
    return make();
  } catch (py::error_already_set& error) {
    std::vector<std::shared_ptr<Work>> works =
        AnnounceRefusal(engine, kind, names(), group, group_size, py::str(error.value()));
    {
      py::gil_scoped_release release;
      const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kRefusalWaitMs);
      for (const auto& work : works) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            end - std::chrono::steady_clock::now());
        Status ignored;
        if (left.count() <= 0 || !work->WaitFor(left, &ignored)) break;
      }
    }
    throw;
  }
}

// Queues `w`'s collective and hands `w` to Python as its Work.
py::object EnqueueOne(Engine& engine, std::unique_ptr<PyWork> w, TensorEntry entry) {
  ThrowIfFailed(engine.EnqueueOne(std::move(entry)));
  w->enqueued = true;
  return py::cast(std::move(w));
}

// A list of tensors (a grouped collective when options.grouped): one Work each.
py::list SubmitList(Engine& engine, int kind, py::list inputs, py::handle names,
                    const CollectiveOptions& o, py::handle outputs, int size) {
  const std::vector<std::string> name_list = names.cast<std::vector<std::string>>();
  const size_t count = name_list.size();
  if (static_cast<size_t>(py::len(inputs)) != count ||
      (!o.dtypes.empty() && o.dtypes.size() != count) ||
      (!outputs.is_none() && static_cast<size_t>(py::len(outputs)) != count)) {
    ThrowValueError("internal: names, tensors, outputs and dtypes differ in length");
  }
  std::vector<std::unique_ptr<PyWork>> works;
  std::vector<TensorEntry> entries;
  const std::string group = o.grouped && count > 0 ? "group:" + name_list[0] : std::string();
  const int32_t group_size = o.grouped ? static_cast<int32_t>(count) : 0;
  const py::list output_list = outputs.is_none() ? py::list() : outputs.cast<py::list>();
  Refusing(
      engine, kind, [&] { return name_list; }, group, group_size,
      [&] {
        for (size_t i = 0; i < count; ++i) {
          Request r = NewRequest(kind, name_list[i], o);
          r.group = group;
          r.group_size = group_size;
          auto w = std::make_unique<PyWork>();
          const bool in_place = o.in_place || (!outputs.is_none() && output_list[i].is(inputs[i]));
          AttachTensors(w.get(), &r, inputs[i],
                        outputs.is_none() || in_place ? py::none() : py::object(output_list[i]),
                        in_place, o.dtypes.empty() ? -1 : o.dtypes[i], o.stream >= 0);
          entries.push_back(MakeEntry(w.get(), std::move(r), in_place, size, o.stream, o.splits,
                                      entries.empty() ? nullptr : &entries.back()));
          works.push_back(std::move(w));
        }
      });
  ThrowIfFailed(engine.Enqueue(std::move(entries)));
  py::list result;
  for (auto& w : works) {
    w->enqueued = true;
    result.append(py::cast(std::move(w)));
  }
  return result;
}

// Contiguous host memory the caller describes as (owner, data_ptr, shape,
// dtype code): an in-place allreduce or broadcast of a torch CPU tensor,
// the per-gradient path of hora.torch, without a DLPack export.
py::object SubmitHost(Engine& engine, int kind, py::handle described, py::handle name,
                      const CollectiveOptions& o, int size) {
  // Read with the tuple macros: this is the per-gradient path.
  PyObject* t = described.ptr();
  Request r = NewRequest(kind, name.cast<std::string>(), o);
  if (r.kind != CollectiveKind::kAllreduce && r.kind != CollectiveKind::kBroadcast) {
    ThrowValueError("internal: described host memory takes in-place allreduce and broadcast only");
  }
  if (PyTuple_GET_SIZE(t) != 4) {
    ThrowValueError("internal: described host memory is (owner, data_ptr, shape, dtype)");
  }
  const int dtype = py::handle(PyTuple_GET_ITEM(t, 3)).cast<int>();
  if (!IsValidDataType(dtype)) {
    ThrowValueError("internal: described host memory has dtype code " + std::to_string(dtype));
  }
  auto w = std::make_unique<PyWork>();
  w->input.emplace(py::handle(PyTuple_GET_ITEM(t, 0)),
                   py::handle(PyTuple_GET_ITEM(t, 1)).cast<uintptr_t>(),
                   py::handle(PyTuple_GET_ITEM(t, 2)).cast<std::vector<int64_t>>(),
                   static_cast<DataType>(dtype));
  r.dtype = w->dtype = w->input->view().dtype;
  r.shape = w->input->view().shape;
  TensorEntry entry = Refusing(
      engine, kind, [&] { return NameOf(name); }, std::string(), 0,
      [&] { return MakeEntry(w.get(), std::move(r), true, size, -1, o.splits); });
  return EnqueueOne(engine, std::move(w), std::move(entry));
}

// A data pointer handed over as a Python int.
void* PointerOf(PyObject* value, const std::string& name) {
  const unsigned long long address = PyLong_AsUnsignedLongLong(value);
  if (address == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    ThrowValueError("internal: a member of '" + name + "' has no valid data pointer");
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(address));
}

// A packed allreduce's member shapes (a list of tuples, such as torch.Size)
// as the request's layout (see Request::members); returns each member's
// element count.
std::vector<int64_t> MemberLayout(const std::string& name, py::handle shapes,
                                  std::vector<int64_t>* layout) {
  if (!PyList_Check(shapes.ptr())) ThrowValueError("internal: packed shapes are a list");
  const Py_ssize_t count = PyList_GET_SIZE(shapes.ptr());
  std::vector<int64_t> elements(static_cast<size_t>(count), 1);
  layout->reserve(static_cast<size_t>(count) * 3);
  auto bad = [&](Py_ssize_t i) {
    ThrowValueError("internal: member " + std::to_string(i) + " of '" + name + "' has a bad shape");
  };
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* shape = PyList_GET_ITEM(shapes.ptr(), i);
    if (PyTuple_Check(shape)) {  // torch.Size: read with the tuple macros
      const Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
      layout->push_back(ndim);
      for (Py_ssize_t d = 0; d < ndim; ++d) {
        const long long dim = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
        if (dim < 0) {
          PyErr_Clear();
          bad(i);
        }
        layout->push_back(dim);
        elements[i] *= dim;
      }
    } else {
      const std::vector<int64_t> dims = py::handle(shape).cast<std::vector<int64_t>>();
      layout->push_back(static_cast<int64_t>(dims.size()));
      for (int64_t dim : dims) {
        if (dim < 0) bad(i);
        layout->push_back(dim);
        elements[i] *= dim;
      }
    }
  }
  return elements;
}

// The members' memory as pieces: `inputs` and `outputs` (None: in place)
// are lists of data pointers, one per member of `elements` elements.
std::vector<Piece> MemberPieces(const std::string& name, py::handle inputs, py::handle outputs,
                                const std::vector<int64_t>& elements) {
  const size_t count = elements.size();
  if (!PyList_Check(inputs.ptr()) || static_cast<size_t>(PyList_GET_SIZE(inputs.ptr())) != count ||
      (!outputs.is_none() && (!PyList_Check(outputs.ptr()) ||
                              static_cast<size_t>(PyList_GET_SIZE(outputs.ptr())) != count))) {
    ThrowValueError("internal: '" + name + "' needs a data pointer per member shape");
  }
  std::vector<Piece> pieces;
  pieces.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const Py_ssize_t at = static_cast<Py_ssize_t>(i);
    void* in = PointerOf(PyList_GET_ITEM(inputs.ptr(), at), name);
    void* out = outputs.is_none() ? in : PointerOf(PyList_GET_ITEM(outputs.ptr(), at), name);
    pieces.push_back(Piece{in, out, elements[i]});
  }
  return pieces;
}

// A packed allreduce, the per-tensor path of a grouped allreduce: tensors
// of one dtype (`dtype`, a core code) reduced as one request that carries
// every member's shape (`shapes`), so the ranks still agree on each member,
// with no request, Work or DLPack export per member. Either
//   `inputs` is a list of host data pointers and `outputs` one too, or None
//   for in place: the core reads and writes the members where they are; or
//   `inputs` is one tensor holding the members end to end (a flattened
//   copy, host or GPU memory) and `outputs` None: reduced in place.
// The request is a group of one, so that a rank that submitted the same
// name member by member fails with the others instead of waiting. `owner`
// keeps the memory alive until the Work is released.
py::object SubmitPacked(py::handle owner, const std::string& name, int dtype, py::handle inputs,
                        py::handle outputs, py::handle shapes, const CollectiveOptions& options) {
  std::shared_ptr<Engine> job = CurrentEngine();
  ReleaseFinishedOrphans();
  ProcessSetRoute route;
  Status routed = job->process_sets().Route(options.process_set, std::nullopt, &route);
  if (!routed.ok()) ThrowStatus(routed.WithContext("allreduce '" + name + "'"));
  Engine& engine = route.engine ? *route.engine : *job;
  if (options.op == static_cast<int>(ReduceOp::kAdasum)) {
    ThrowValueError("internal: op=Adasum combines each tensor on its own; it is never packed");
  }
  if (!IsValidDataType(dtype)) {
    ThrowValueError("internal: packed '" + name + "' has dtype code " + std::to_string(dtype));
  }
  const int kind = static_cast<int>(CollectiveKind::kAllreduce);
  const std::string group = "group:" + name;
  Request r = NewRequest(kind, name, options);
  r.group = group;
  r.group_size = 1;
  auto w = std::make_unique<PyWork>();
  std::vector<Piece> pieces;
  TensorEntry entry = Refusing(
      engine, kind, [&] { return std::vector<std::string>{name}; }, group, 1,
      [&] {
        const std::vector<int64_t> elements = MemberLayout(name, shapes, &r.members);
        const int64_t total = std::accumulate(elements.begin(), elements.end(), int64_t{0});
        if (PyList_Check(inputs.ptr())) {
          if (options.stream >= 0) {
            ThrowValueError("internal: packed data pointers are host memory");
          }
          pieces = MemberPieces(name, inputs, outputs, elements);
          w->input.emplace(owner, pieces.empty() ? 0 : reinterpret_cast<uintptr_t>(pieces[0].out),
                           std::vector<int64_t>{total}, static_cast<DataType>(dtype));
        } else {
          if (!outputs.is_none()) {
            ThrowValueError("internal: a flattened packed allreduce runs in place");
          }
          w->input.emplace(inputs, true, dtype, ArgName{"tensor '", r.name, "'"},
                           options.stream >= 0);
          if (w->input->view().NumElements() != total || w->input->view().shape.size() != 1) {
            ThrowValueError("internal: flattened '" + name + "' is not a 1-d tensor of its " +
                            "members' " + std::to_string(total) + " elements");
          }
        }
        r.dtype = w->dtype = w->input->view().dtype;
        r.shape = w->input->view().shape;
        r.on_gpu = w->input->view().device >= 0;
        return MakeEntry(w.get(), std::move(r), true, route.size, options.stream, std::nullopt);
      });
  entry.members = std::move(pieces);
  return EnqueueOne(engine, std::move(w), std::move(entry));
}

// The one way in: `tensors` is a list (one Work per tensor, `names` a
// list), a (owner, data_ptr, shape, dtype) tuple describing host memory,
// or one tensor (`names` a str); `outputs` matches `tensors` or is None
// (in place when options.in_place, else a result the core allocates).
py::object Submit(int kind, py::handle tensors, py::handle names, const CollectiveOptions& options,
                  py::handle outputs) {
  std::shared_ptr<Engine> job = CurrentEngine();
  ReleaseFinishedOrphans();
  // One lookup: the set's engine, its size, and the root as the set's rank
  // (inside a set, ranks are the set's).
  const bool rooted = kind == static_cast<int>(CollectiveKind::kBroadcast);
  ProcessSetRoute route;
  Status routed = job->process_sets().Route(
      options.process_set, rooted ? std::optional<int>(options.root) : std::nullopt, &route);
  if (!routed.ok()) {
    std::string what = CollectiveKindName(static_cast<CollectiveKind>(kind));
    if (PyUnicode_Check(names.ptr())) {
      what += " '" + names.cast<std::string>() + "'";
    } else if (PyList_Check(names.ptr()) && PyList_GET_SIZE(names.ptr()) > 0) {
      what += " '" + py::handle(PyList_GET_ITEM(names.ptr(), 0)).cast<std::string>() + "'";
    }
    ThrowStatus(routed.WithContext(what));
  }
  Engine& engine = route.engine ? *route.engine : *job;
  const int size = route.size;
  const CollectiveOptions* chosen = &options;
  CollectiveOptions in_set;
  if (rooted && route.root != options.root) {
    in_set = options;
    in_set.root = route.root;
    chosen = &in_set;
  }
  const CollectiveOptions& o = *chosen;
  if (PyList_Check(tensors.ptr())) {
    return SubmitList(engine, kind, py::reinterpret_borrow<py::list>(tensors), names, o, outputs,
                      size);
  }
  if (PyTuple_Check(tensors.ptr())) {
    return SubmitHost(engine, kind, tensors, names, o, size);
  }
  Request r = NewRequest(kind, names.cast<std::string>(), o);
  const bool in_place = o.in_place || outputs.is(tensors);
  auto w = std::make_unique<PyWork>();
  TensorEntry entry = Refusing(
      engine, kind, [&] { return NameOf(names); }, std::string(), 0,
      [&] {
        AttachTensors(w.get(), &r, tensors, in_place ? py::none() : outputs, in_place,
                      o.dtypes.empty() ? -1 : o.dtypes[0], o.stream >= 0);
        return MakeEntry(w.get(), std::move(r), in_place, size, o.stream, o.splits);
      });
  return EnqueueOne(engine, std::move(w), std::move(entry));
}

// Gives up the GIL only when the collective is still running: most waits
// of a backward pass find their result already there.
Status WaitFor(PyWork& w) {
  Status status = WaitInterruptibly(*w.work);
  w.seen = true;
  return status;
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
      // Waits at most `seconds` (GIL released); true once done. The error,
      // if any, is raised by wait().
      .def("wait_for",
           [](PyWork& w, double seconds) {
             if (w.work->Poll()) return true;
             Status status;
             py::gil_scoped_release release;
             return w.work->WaitFor(
                 std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, seconds) * 1e3)),
                 &status);
           })
      .def("result_dlpack",
           [](PyWork& w) -> py::object {
             if (!w.work->device_output) return py::none();
             return ExportDevice(w.work->device_output, w.dtype, w.work->output_shape);
           })
      .def_property_readonly("on_gpu",
                             [](PyWork& w) { return static_cast<bool>(w.work->device_output); })
      .def("result_buffer",
           [](PyWork& w) -> py::object {
             if (!w.work->output) return py::none();
             return py::cast(ResultBuffer{w.work->output});
           })
      .def_property_readonly("output_shape", [](PyWork& w) { return w.work->output_shape; })
      .def_property_readonly("received_splits", [](PyWork& w) { return w.work->received_splits; })
      .def("release", [](PyWork& w) {
        // Drops the views of the caller's arrays once the result is in.
        w.input.reset();
        w.output.reset();
        w.seen = true;
      });

  py::class_<CollectiveOptions>(m, "CollectiveOptions")
      .def(py::init<>())
      .def_readwrite("op", &CollectiveOptions::op)
      .def_readwrite("root", &CollectiveOptions::root)
      .def_readwrite("prescale", &CollectiveOptions::prescale)
      .def_readwrite("postscale", &CollectiveOptions::postscale)
      .def_readwrite("splits", &CollectiveOptions::splits)
      .def_readwrite("dtypes", &CollectiveOptions::dtypes)
      .def_readwrite("grouped", &CollectiveOptions::grouped)
      .def_readwrite("in_place", &CollectiveOptions::in_place)
      .def_readwrite("site", &CollectiveOptions::site)
      .def_readwrite("stream", &CollectiveOptions::stream)
      .def_readwrite("process_set", &CollectiveOptions::process_set);
  m.def("submit_packed", &SubmitPacked, py::arg("owner"), py::arg("name"), py::arg("dtype"),
        py::arg("inputs"), py::arg("outputs"), py::arg("shapes"), py::arg("options"));
  m.def("submit", &Submit, py::arg("kind"), py::arg("tensors"), py::arg("names"),
        py::arg("options"), py::arg("outputs") = py::none());
  // Whether submissions should say where they come from (debug log level).
  m.def("records_call_sites", [] { return CurrentConfig().log_level <= LogLevel::kDebug; });

  m.def("join", [] {
    std::shared_ptr<Engine> engine = CurrentEngine();
    std::shared_ptr<Work> work;
    Status status = engine->Join(&work);
    if (!status.ok()) ThrowStatus(status);
    status = WaitInterruptibly(*work);
    if (!status.ok()) ThrowStatus(status);
    return work->join_last_rank;
  });
}

}  // namespace hora
