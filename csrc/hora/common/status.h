#pragma once
// Status is how everything on the engine thread reports failure: nothing
// there throws, because an exception escaping the background thread would
// take the whole process down instead of failing the one collective.
#include <string>
#include <utility>

namespace hora {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad call: maps to ValueError
  kTypeError,        // unsupported dtype or object: maps to TypeError
  kMismatch,         // ranks disagree about a collective: HoraMismatchError
  kShutdown,         // engine stopped (this rank or a peer): HoraError
  kInternal,         // transport failure or lost rank: HoraInternalError
  kTimeout,          // stall shutdown: HoraTimeoutError
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status TypeError(std::string m) { return {StatusCode::kTypeError, std::move(m)}; }
  static Status Mismatch(std::string m) { return {StatusCode::kMismatch, std::move(m)}; }
  static Status Shutdown(std::string m) { return {StatusCode::kShutdown, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prepends context while keeping the code, so an error travels up with
  // a trail of where it passed ("allreduce 'w1': MPI_Allreduce: ...").
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace hora

#define HORA_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::hora::Status _hora_status = (expr);        \
    if (!_hora_status.ok()) return _hora_status; \
  } while (0)
