// Adasum at 1-8 thread-ranks against a reference computed here in long
// double over the same tree: orthogonal vectors add up, parallel ones
// average, random ones match the reference, every rank ends with the same
// bits, float64 values near the limits of the type stay finite and right,
// half types go through float32, and a world whose size is not a power of
// two is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "hora/algo/adasum.h"
#include "hora/common/half.h"
#include "thread_ranks.h"

namespace hora {
namespace {

using testing::Failures;
using testing::RunRanks;
using Vec = std::vector<long double>;

// a (+) b, as defined in adasum.h, in long double.
Vec Combine(const Vec& a, const Vec& b) {
  long double dot = 0, a2 = 0, b2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    a2 += a[i] * a[i];
    b2 += b[i] * b[i];
  }
  const long double ca = a2 > 0 ? 1 - dot / (2 * a2) : 1;
  const long double cb = b2 > 0 ? 1 - dot / (2 * b2) : 1;
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

// The tree over ranks [first, first + count).
Vec Tree(const std::vector<Vec>& inputs, int first, int count) {
  if (count == 1) return inputs[first];
  return Combine(Tree(inputs, first, count / 2), Tree(inputs, first + count / 2, count / 2));
}

// Runs Adasum on `inputs` (one tensor per entry of `tensors`, each rank's
// values given by inputs[tensor][rank]) and returns every rank's results.
template <typename T>
std::vector<std::vector<std::vector<T>>> RunAdasum(int size,
                                                   const std::vector<std::vector<Vec>>& inputs,
                                                   DataType dtype, double prescale = 1.0,
                                                   double factor = 1.0) {
  std::vector<std::vector<std::vector<T>>> results(size);
  const auto statuses = RunRanks(size, size, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<T>> mine;
    for (const auto& tensor : inputs) {
      std::vector<T> values(tensor[r].size());
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<T>(tensor[r][i]);
      mine.push_back(values);
    }
    results[r] = mine;
    std::vector<Piece> pieces;
    for (auto& values : results[r]) {
      pieces.push_back(Piece{values.data(), values.data(), static_cast<int64_t>(values.size())});
    }
    AdasumAllreduce adasum;
    return adasum.Run(&comm, pieces.data(), pieces.size(), dtype, prescale, factor);
  });
  EXPECT_EQ(Failures(statuses), "");
  return results;
}

std::vector<Vec> RandomInputs(int size, int count, double magnitude, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<Vec> inputs(size, Vec(count));
  for (auto& v : inputs)
    for (auto& x : v) x = normal(gen) * magnitude;
  return inputs;
}

class AdasumTest : public ::testing::TestWithParam<int> {};

TEST_P(AdasumTest, OrthogonalVectorsAddUp) {
  const int size = GetParam();
  std::vector<Vec> inputs(size, Vec(size + 3, 0.0L));
  for (int r = 0; r < size; ++r) inputs[r][r] = r + 1;  // rank r owns coordinate r
  const auto results = RunAdasum<float>(size, {inputs}, DataType::kFloat32);
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < size + 3; ++i) EXPECT_EQ(results[r][0][i], i < size ? i + 1 : 0);
  }
}

TEST_P(AdasumTest, ParallelVectorsAverage) {
  const int size = GetParam();
  std::vector<Vec> inputs(size, Vec{1.5L, -2.0L, 4.0L, 0.25L});
  const auto results = RunAdasum<double>(size, {inputs}, DataType::kFloat64);
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(results[r][0][i], double(inputs[0][i]));
  }
}

TEST_P(AdasumTest, RandomVectorsMatchTheTreeOnEveryRankBitForBit) {
  const int size = GetParam();
  // several tensors of odd sizes, combined each with its own coefficients
  const std::vector<std::vector<Vec>> inputs = {RandomInputs(size, 37, 1.0, 1),
                                                RandomInputs(size, 1, 3.0, 2),
                                                RandomInputs(size, 1000, 0.01, 3)};
  const auto results = RunAdasum<double>(size, inputs, DataType::kFloat64, 0.5, 4.0);
  for (size_t t = 0; t < inputs.size(); ++t) {
    std::vector<Vec> scaled = inputs[t];
    for (auto& v : scaled)
      for (auto& x : v) x *= 0.5L;
    const Vec want = Tree(scaled, 0, size);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(results[0][t][i], double(want[i] * 4), 1e-12 * (1 + std::fabs(double(want[i]))))
          << "tensor " << t << " element " << i;
    }
    for (int r = 1; r < size; ++r) {
      EXPECT_EQ(std::memcmp(results[r][t].data(), results[0][t].data(),
                            results[0][t].size() * sizeof(double)),
                0)
          << "rank " << r << " tensor " << t;
    }
  }
}

TEST_P(AdasumTest, Float32MatchesTheTree) {
  const int size = GetParam();
  const std::vector<Vec> inputs = RandomInputs(size, 257, 2.0, 4);
  std::vector<Vec> rounded = inputs;  // what the float32 inputs hold
  for (auto& v : rounded)
    for (auto& x : v) x = static_cast<float>(x);
  const Vec want = Tree(rounded, 0, size);
  const auto results = RunAdasum<float>(size, {inputs}, DataType::kFloat32);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(results[size - 1][0][i], double(want[i]), 1e-5 * (1 + std::fabs(double(want[i]))));
  }
}

TEST_P(AdasumTest, Float64NearTheLimitsStaysRight) {
  const int size = GetParam();
  for (double magnitude : {1e300, 1e-300}) {
    const std::vector<Vec> inputs = RandomInputs(size, 16, magnitude, 5);
    const Vec want = Tree(inputs, 0, size);  // long double has the range
    const auto results = RunAdasum<double>(size, {inputs}, DataType::kFloat64);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(results[0][0][i])) << magnitude;
      EXPECT_NEAR(results[0][0][i] / magnitude, double(want[i] / magnitude), 1e-9) << magnitude;
    }
  }
}

TEST_P(AdasumTest, HalfTypesCombineInFloat32) {
  const int size = GetParam();
  std::vector<Vec> inputs(size, Vec{1.0L, 2.0L, -3.0L});  // parallel: the mean, exactly
  const int n = 3;
  std::vector<std::vector<uint16_t>> values(size, std::vector<uint16_t>(n));
  const auto statuses = RunRanks(size, size, [&](Communicator& comm) {
    auto& mine = values[comm.rank()];
    for (int i = 0; i < n; ++i) mine[i] = FloatToHalf(static_cast<float>(inputs[0][i]));
    Piece piece{mine.data(), mine.data(), n};
    AdasumAllreduce adasum;
    return adasum.Run(&comm, &piece, 1, DataType::kFloat16, 1.0, 2.0);
  });
  ASSERT_EQ(Failures(statuses), "");
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < n; ++i) EXPECT_EQ(HalfToFloat(values[r][i]), 2.0f * float(inputs[0][i]));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdasumTest, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

TEST(Adasum, RefusesSizesThatAreNotPowersOfTwo) {
  const auto statuses = RunRanks(3, 3, [](Communicator& comm) {
    float value = 1.0f;
    Piece piece{&value, &value, 1};
    AdasumAllreduce adasum;
    return adasum.Run(&comm, &piece, 1, DataType::kFloat32, 1.0, 1.0);
  });
  for (const Status& s : statuses) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("power of two, got 3"), std::string::npos) << s.message();
  }
}

TEST(Adasum, RefusesIntegers) {
  const auto statuses = RunRanks(2, 2, [](Communicator& comm) {
    int32_t value = 1;
    Piece piece{&value, &value, 1};
    AdasumAllreduce adasum;
    return adasum.Run(&comm, &piece, 1, DataType::kInt32, 1.0, 1.0);
  });
  for (const Status& s : statuses) EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace hora
