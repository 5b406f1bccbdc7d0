// The hand-off between callers and the engine: a name is in flight at most
// once per rank, and a call refused for that leaves a note for rank 0, as
// does the next call of the name.
#include <gtest/gtest.h>

#include "hora/core/tensor_queue.h"

namespace hora {
namespace {

TensorEntry Entry(const std::string& name) {
  TensorEntry entry;
  entry.request.name = name;
  entry.request.shape = {4};
  entry.work = std::make_shared<Work>();
  return entry;
}

std::vector<std::pair<std::string, RequestNote>> Taken(TensorQueue* queue) {
  std::vector<Request> requests;
  queue->TakeNewRequests(&requests);
  std::vector<std::pair<std::string, RequestNote>> out;
  for (const Request& r : requests) out.emplace_back(r.name, r.note);
  return out;
}

TEST(TensorQueue, ACallRefusedForANameInFlightIsNotedAndSoIsTheNextCall) {
  int wakes = 0;
  TensorQueue queue([&] { ++wakes; });
  ASSERT_TRUE(queue.AddOne(Entry("w")).ok());
  const Status again = queue.AddOne(Entry("w"));
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.message().find("'w' is already in flight"), std::string::npos);
  using P = std::pair<std::string, RequestNote>;
  EXPECT_EQ(Taken(&queue),
            (std::vector<P>{{"w", RequestNote::kNone}, {"w", RequestNote::kRefusedAgain}}));
  // a grouped call refused for one member in flight: nothing of it is queued but the note
  std::vector<TensorEntry> group;
  group.push_back(Entry("g.0"));
  group.push_back(Entry("w"));
  EXPECT_EQ(queue.Add(std::move(group)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Taken(&queue), (std::vector<P>{{"w", RequestNote::kRefusedAgain}}));
  EXPECT_EQ(wakes, 2) << "a note alone wakes the engine too";

  TensorEntry done;
  ASSERT_TRUE(queue.TakeEntry("w", &done));
  ASSERT_TRUE(queue.AddOne(Entry("w")).ok());
  EXPECT_EQ(Taken(&queue),
            (std::vector<P>{{"w", RequestNote::kCalledAgain}, {"w", RequestNote::kNone}}));
  ASSERT_TRUE(queue.TakeEntry("w", &done));
  ASSERT_TRUE(queue.AddOne(Entry("w")).ok());  // noted once only
  EXPECT_EQ(Taken(&queue), (std::vector<P>{{"w", RequestNote::kNone}}));
}

}  // namespace
}  // namespace hora
