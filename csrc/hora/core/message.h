#pragma once
// What ranks tell each other during negotiation. A Request says "this rank
// has submitted this collective"; a Response, decided by the coordinator (or
// replayed from the response cache), says "every rank has it: run it now", or
// carries the error every rank raises instead.
#include <cstdint>
#include <string>
#include <vector>

#include "hora/common/collective.h"
#include "hora/common/dtype.h"
#include "hora/common/status.h"

namespace hora {

// A Request that is no submission but a note for rank 0's stall inspector:
// this rank refused a call of `name` because its earlier call of that name
// was still in flight here, or (later) it called that name again.
enum class RequestNote : uint8_t { kNone = 0, kRefusedAgain = 1, kCalledAgain = 2 };

struct Request {
  int32_t rank = 0;
  std::string name;
  CollectiveKind kind = CollectiveKind::kAllreduce;
  ReduceOp op = ReduceOp::kSum;
  DataType dtype = DataType::kFloat32;
  int32_t root = 0;
  // Where the tensor lives: host memory, or a GPU (any device index; the
  // ranks must agree on the kind, not on the index).
  bool on_gpu = false;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;  // alltoall: rows sent to each rank
  // Members of a grouped collective are released together.
  std::string group;
  int32_t group_size = 0;
  // Where the caller submitted it ("train.py:42 in step"), recorded only at
  // debug log level; named in mismatch errors.
  std::string site;
  // Non-empty: this rank refused its call (why, in its own words) before
  // any tensor was attached. It still takes part in the negotiation, so
  // that the ranks that submitted the name fail with this reason instead
  // of waiting for this rank.
  std::string refused;
  // A packed allreduce: several tensors of one dtype reduced as one request
  // (`shape` is their total element count). Each member's shape, as its
  // number of dimensions followed by the dimensions; the ranks must agree
  // on every member, so that a mismatch names the member. Empty otherwise.
  std::vector<int64_t> members;
  // Not kNone: a note (see RequestNote), carrying only `name` and `rank`.
  RequestNote note = RequestNote::kNone;

  int64_t NumElements() const;
};

// The shapes packed in `members` (see Request::members).
std::vector<std::vector<int64_t>> MemberShapes(const std::vector<int64_t>& members);

struct Response {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  std::string name;
  StatusCode error_code = StatusCode::kOk;
  std::string error;  // set on every rank when the collective cannot run
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  bool on_gpu = false;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;       // the agreed shape (rank 0's for allgather)
  std::vector<int64_t> first_dims;  // allgather: every rank's first dimension
  std::vector<int64_t> splits;      // alltoall: size x size rows, row = sender
  // Decided once by the coordinator so that every rank, including one that
  // did not submit the tensor, makes the same response-cache entry.
  bool cacheable = false;
  // The divisor of Average: the world size (ranks that have joined add
  // neutral values, zeros for a sum), or with HORA_JOIN_AVERAGE=contributors
  // the ranks whose real data enters the reduction.
  int32_t contributors = 0;

  bool is_error() const { return error_code != StatusCode::kOk; }
  int64_t NumElements() const;
};

void SerializeRequests(const std::vector<Request>& requests, std::string* out);
Status ParseRequests(const std::string& data, std::vector<Request>* out);
void SerializeResponses(const std::vector<Response>& responses, std::string* out);
Status ParseResponses(const std::string& data, std::vector<Response>* out);

std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace hora
