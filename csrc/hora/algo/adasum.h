#pragma once
// Adasum, the adaptive summation of Maleki et al. ("Scaling Distributed
// Training with Adaptive Summation", MLSys 2021). Two ranks' vectors combine
// as
//     a (+) b = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b,
// which is their sum when they are orthogonal and their mean when they are
// parallel; the ranks combine over a binary tree, (r0 (+) r1) (+) (r2 (+) r3)
// and so on, so the number of ranks must be a power of two. Every tensor of
// a fused batch is combined on its own (its own dot product and norms).
//
// Recursive doubling: at level d each rank swaps its partial result with
// rank ^ d, and both compute the same combination with the lower group's
// vector as `a`, so every rank ends with bit-identical values. Dot products
// and squared norms are accumulated in double; float16/bfloat16 are combined
// in float32. For float64 tensors whose largest magnitude is beyond 1e100
// or below 1e-100 they are computed on the values divided by that magnitude
// (the coefficients depend on ratios only), so the squares neither overflow
// nor vanish. A vector whose squared norm is below sqrt(DBL_MIN) counts as
// zero (coefficient 1), as in Horovod.
#include <cstdint>
#include <vector>

#include "hora/algo/pieces.h"
#include "hora/comm/communicator.h"
#include "hora/common/dtype.h"
#include "hora/common/status.h"

namespace hora {

inline bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

// The coefficients (ca, cb) of a (+) b for `count` elements.
void AdasumCoefficients(const float* a, const float* b, int64_t count, double* ca, double* cb);
void AdasumCoefficients(const double* a, const double* b, int64_t count, double* ca, double* cb);

class AdasumAllreduce {
 public:
  // Collective over `comm`, whose size must be a power of two. Each piece
  // is one tensor: out = the Adasum over ranks of (in * prescale), times
  // `factor`. dtype is float16, bfloat16, float32 or float64.
  Status Run(Communicator* comm, const Piece* pieces, size_t n, DataType dtype, double prescale,
             double factor);

 private:
  template <typename W>
  Status RunTyped(Communicator* comm, const Piece* pieces, size_t n, DataType dtype,
                  double prescale, double factor, std::vector<W>* mine, std::vector<W>* theirs);

  std::vector<float> mine32_, theirs32_;
  std::vector<double> mine64_, theirs64_;
};

}  // namespace hora
