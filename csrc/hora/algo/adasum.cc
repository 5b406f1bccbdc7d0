#include "hora/algo/adasum.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "hora/algo/host_kernels.h"

namespace hora {
namespace {

constexpr int kAdasumTag = 0x4854;  // distinct from the ring's tags

template <typename W>
void Coefficients(const W* a, const W* b, int64_t count, bool may_need_scaling, double* ca,
                  double* cb) {
  double scale = 1.0;
  if (may_need_scaling) {
    double largest = 0.0;
    for (int64_t i = 0; i < count; ++i) {
      largest = std::max(largest, std::max(std::fabs(static_cast<double>(a[i])),
                                           std::fabs(static_cast<double>(b[i]))));
    }
    if (largest > 1e100 || (largest < 1e-100 && largest > 0.0)) scale = largest;
  }
  double dot = 0.0, a2 = 0.0, b2 = 0.0;
  if (scale == 1.0) {
    for (int64_t i = 0; i < count; ++i) {
      const double x = a[i], y = b[i];
      dot += x * y;
      a2 += x * x;
      b2 += y * y;
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      const double x = a[i] / scale, y = b[i] / scale;
      dot += x * y;
      a2 += x * x;
      b2 += y * y;
    }
  }
  static const double kZero = std::sqrt(DBL_MIN);
  *ca = a2 >= kZero ? 1.0 - dot / a2 * 0.5 : 1.0;
  *cb = b2 >= kZero ? 1.0 - dot / b2 * 0.5 : 1.0;
}

}  // namespace

void AdasumCoefficients(const float* a, const float* b, int64_t count, double* ca, double* cb) {
  // float32 squares fit a double from the smallest to the largest float
  Coefficients(a, b, count, false, ca, cb);
}

void AdasumCoefficients(const double* a, const double* b, int64_t count, double* ca, double* cb) {
  Coefficients(a, b, count, true, ca, cb);
}

Status AdasumAllreduce::Run(Communicator* comm, const Piece* pieces, size_t n, DataType dtype,
                            double prescale, double factor) {
  if (!IsPowerOfTwo(comm->size())) {
    return Status::InvalidArgument("Adasum needs a number of ranks that is a power of two, got " +
                                   std::to_string(comm->size()));
  }
  switch (dtype) {
    case DataType::kFloat64:
      return RunTyped(comm, pieces, n, dtype, prescale, factor, &mine64_, &theirs64_);
    case DataType::kFloat32:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return RunTyped(comm, pieces, n, dtype, prescale, factor, &mine32_, &theirs32_);
    default:
      return Status::InvalidArgument(std::string("Adasum reduces floating-point tensors, got ") +
                                     DataTypeName(dtype));
  }
}

template <typename W>
Status AdasumAllreduce::RunTyped(Communicator* comm, const Piece* pieces, size_t n, DataType dtype,
                                 double prescale, double factor, std::vector<W>* mine,
                                 std::vector<W>* theirs) {
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += pieces[i].count;
  mine->resize(static_cast<size_t>(total));
  theirs->resize(static_cast<size_t>(total));
  // This rank's vectors, pre-scaled, in the working type.
  W* at = mine->data();
  for (size_t i = 0; i < n; ++i) {
    const Piece& p = pieces[i];
    if (IsHalf(dtype)) {
      WidenToFloat(p.in, reinterpret_cast<float*>(at), p.count, dtype, prescale);
    } else {
      ScaleCopy(p.in, at, p.count, dtype, prescale);
    }
    at += p.count;
  }
  const int rank = comm->rank();
  const int64_t bytes = total * static_cast<int64_t>(sizeof(W));
  for (int level = 1; level < comm->size(); level <<= 1) {
    const int partner = rank ^ level;
    int id = 0;
    HORA_RETURN_IF_ERROR(comm->PostRecv(theirs->data(), bytes, partner, kAdasumTag, &id));
    HORA_RETURN_IF_ERROR(comm->PostSend(mine->data(), bytes, partner, kAdasumTag, &id));
    HORA_RETURN_IF_ERROR(comm->WaitAll());
    // The lower group's partial result is `a` on both ranks of the pair.
    const bool lower = (rank & level) == 0;
    const W* a = lower ? mine->data() : theirs->data();
    const W* b = lower ? theirs->data() : mine->data();
    W* out = mine->data();
    int64_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t count = pieces[i].count;
      double ca = 1.0, cb = 1.0;
      AdasumCoefficients(a + offset, b + offset, count, &ca, &cb);
      for (int64_t k = offset; k < offset + count; ++k) {
        out[k] = static_cast<W>(ca * static_cast<double>(a[k]) + cb * static_cast<double>(b[k]));
      }
      offset += count;
    }
  }
  at = mine->data();
  for (size_t i = 0; i < n; ++i) {
    const Piece& p = pieces[i];
    if (IsHalf(dtype)) {
      NarrowFromFloat(reinterpret_cast<const float*>(at), p.out, p.count, dtype, factor);
    } else {
      ScaleCopy(at, p.out, p.count, dtype, factor);
    }
    at += p.count;
  }
  return Status::OK();
}

}  // namespace hora
