#include "hora/core/message.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace hora {
namespace {

// A flat little-endian encoding: both ends run the same build, so there is
// no need for a schema language, only for bounds checks when reading.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  template <typename T>
  void Put(T value) {
    out_->append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_->append(s);
  }
  void PutInts(const std::vector<int64_t>& v) {
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    out_->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  }

 private:
  std::string* out_;
};

class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  template <typename T>
  bool Get(T* value) {
    if (pos_ + sizeof(T) > data_.size()) return false;
    std::memcpy(value, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n;
    if (!Get(&n) || pos_ + n > data_.size()) return false;
    s->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool GetInts(std::vector<int64_t>* v) {
    uint32_t n;
    if (!Get(&n) || pos_ + n * sizeof(int64_t) > data_.size()) return false;
    v->resize(n);
    std::memcpy(v->data(), data_.data() + pos_, n * sizeof(int64_t));
    pos_ += n * sizeof(int64_t);
    return true;
  }
  bool done() const { return pos_ == data_.size(); }

 private:
  const std::string& data_;
  size_t pos_ = 0;
};

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

int64_t Request::NumElements() const { return Product(shape); }
int64_t Response::NumElements() const { return Product(shape); }

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

std::vector<std::vector<int64_t>> MemberShapes(const std::vector<int64_t>& members) {
  std::vector<std::vector<int64_t>> shapes;
  size_t at = 0;
  while (at < members.size()) {
    const size_t ndim = static_cast<size_t>(std::max<int64_t>(members[at], 0));
    const size_t end = std::min(members.size(), at + 1 + ndim);
    shapes.emplace_back(members.begin() + static_cast<std::ptrdiff_t>(at + 1),
                        members.begin() + static_cast<std::ptrdiff_t>(end));
    at = end;
  }
  return shapes;
}

void SerializeRequests(const std::vector<Request>& requests, std::string* out) {
  Writer w(out);
  w.Put<uint32_t>(static_cast<uint32_t>(requests.size()));
  for (const Request& r : requests) {
    w.Put<int32_t>(r.rank);
    w.PutString(r.name);
    w.Put<uint8_t>(static_cast<uint8_t>(r.kind));
    w.Put<uint8_t>(static_cast<uint8_t>(r.op));
    w.Put<uint8_t>(static_cast<uint8_t>(r.dtype));
    w.Put<int32_t>(r.root);
    w.Put<uint8_t>(r.on_gpu ? 1 : 0);
    w.Put<double>(r.prescale);
    w.Put<double>(r.postscale);
    w.PutInts(r.shape);
    w.PutInts(r.splits);
    w.PutString(r.group);
    w.Put<int32_t>(r.group_size);
    w.PutString(r.site);
    w.PutString(r.refused);
    w.PutInts(r.members);
    w.Put<uint8_t>(static_cast<uint8_t>(r.note));
  }
}

Status ParseRequests(const std::string& data, std::vector<Request>* out) {
  Reader rd(data);
  uint32_t count;
  if (!rd.Get(&count)) return Status::Internal("truncated request list");
  out->resize(count);
  for (Request& r : *out) {
    uint8_t kind, op, dtype, on_gpu, note;
    if (!rd.Get(&r.rank) || !rd.GetString(&r.name) || !rd.Get(&kind) || !rd.Get(&op) ||
        !rd.Get(&dtype) || !rd.Get(&r.root) || !rd.Get(&on_gpu) || !rd.Get(&r.prescale) ||
        !rd.Get(&r.postscale) || !rd.GetInts(&r.shape) || !rd.GetInts(&r.splits) ||
        !rd.GetString(&r.group) || !rd.Get(&r.group_size) || !rd.GetString(&r.site) ||
        !rd.GetString(&r.refused) || !rd.GetInts(&r.members) || !rd.Get(&note)) {
      return Status::Internal("truncated request");
    }
    r.kind = static_cast<CollectiveKind>(kind);
    r.op = static_cast<ReduceOp>(op);
    r.dtype = static_cast<DataType>(dtype);
    r.on_gpu = on_gpu != 0;
    if (note > static_cast<uint8_t>(RequestNote::kCalledAgain)) {
      return Status::Internal("unknown request note " + std::to_string(note));
    }
    r.note = static_cast<RequestNote>(note);
  }
  return rd.done() ? Status::OK() : Status::Internal("trailing bytes after request list");
}

void SerializeResponses(const std::vector<Response>& responses, std::string* out) {
  Writer w(out);
  w.Put<uint32_t>(static_cast<uint32_t>(responses.size()));
  for (const Response& r : responses) {
    w.Put<uint8_t>(static_cast<uint8_t>(r.kind));
    w.PutString(r.name);
    w.Put<int32_t>(static_cast<int32_t>(r.error_code));
    w.PutString(r.error);
    w.Put<uint8_t>(static_cast<uint8_t>(r.dtype));
    w.Put<uint8_t>(static_cast<uint8_t>(r.op));
    w.Put<int32_t>(r.root);
    w.Put<uint8_t>(r.on_gpu ? 1 : 0);
    w.Put<double>(r.prescale);
    w.Put<double>(r.postscale);
    w.PutInts(r.shape);
    w.PutInts(r.first_dims);
    w.PutInts(r.splits);
    w.Put<uint8_t>(r.cacheable ? 1 : 0);
    w.Put<int32_t>(r.contributors);
  }
}

Status ParseResponses(const std::string& data, std::vector<Response>* out) {
  Reader rd(data);
  uint32_t count;
  if (!rd.Get(&count)) return Status::Internal("truncated response list");
  out->resize(count);
  for (Response& r : *out) {
    uint8_t kind, dtype, op, cacheable, on_gpu;
    int32_t code;
    if (!rd.Get(&kind) || !rd.GetString(&r.name) || !rd.Get(&code) || !rd.GetString(&r.error) ||
        !rd.Get(&dtype) || !rd.Get(&op) || !rd.Get(&r.root) || !rd.Get(&on_gpu) ||
        !rd.Get(&r.prescale) || !rd.Get(&r.postscale) || !rd.GetInts(&r.shape) ||
        !rd.GetInts(&r.first_dims) || !rd.GetInts(&r.splits) || !rd.Get(&cacheable) ||
        !rd.Get(&r.contributors)) {
      return Status::Internal("truncated response");
    }
    r.cacheable = cacheable != 0;
    r.on_gpu = on_gpu != 0;
    r.kind = static_cast<CollectiveKind>(kind);
    r.error_code = static_cast<StatusCode>(code);
    r.dtype = static_cast<DataType>(dtype);
    r.op = static_cast<ReduceOp>(op);
  }
  return rd.done() ? Status::OK() : Status::Internal("trailing bytes after response list");
}

}  // namespace hora
