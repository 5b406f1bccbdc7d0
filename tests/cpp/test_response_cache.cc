// The response cache: least recently used eviction, slots reused from the
// lowest, and the match rule that sends a changed request back through the
// coordinator.
#include <gtest/gtest.h>

#include "hora/core/response_cache.h"

namespace hora {
namespace {

Response Named(const std::string& name) {
  Response r;
  r.name = name;
  r.shape = {4};
  return r;
}

Request Asked(const std::string& name) {
  Request r;
  r.name = name;
  r.shape = {4};
  return r;
}

TEST(ResponseCache, EvictsTheLeastRecentlyUsed) {
  ResponseCache cache(3);
  const Request a = Asked("a"), b = Asked("b"), c = Asked("c"), d = Asked("d");
  EXPECT_EQ(cache.Put(Named("a"), &a), -1);
  EXPECT_EQ(cache.Put(Named("b"), &b), -1);
  EXPECT_EQ(cache.Put(Named("c"), &c), -1);
  EXPECT_EQ(cache.Find("a"), 0);  // low slots first
  EXPECT_EQ(cache.Find("c"), 2);
  cache.Touch(cache.Find("a"));  // b is now the oldest
  const int64_t evicted = cache.Put(Named("d"), &d);
  EXPECT_EQ(evicted, 1);
  EXPECT_EQ(cache.Find("b"), -1);
  EXPECT_EQ(cache.Find("d"), 1);
  EXPECT_TRUE(cache.Occupied(1));
  EXPECT_EQ(cache.response(1).name, "d");
}

TEST(ResponseCache, EraseFreesTheSlotForTheNextEntry) {
  ResponseCache cache(2);
  const Request a = Asked("a"), b = Asked("b");
  cache.Put(Named("a"), &a);
  cache.Erase(cache.Find("a"));
  EXPECT_EQ(cache.Find("a"), -1);
  EXPECT_FALSE(cache.Occupied(0));
  EXPECT_EQ(cache.Put(Named("b"), &b), -1);
  EXPECT_EQ(cache.Find("b"), 0);
}

TEST(ResponseCache, ARequestMatchesOnlyWhatItAskedForBefore) {
  ResponseCache cache(4);
  Request mine = Asked("w");
  cache.Put(Named("w"), &mine);
  const int64_t slot = cache.Find("w");
  EXPECT_TRUE(cache.Matches(slot, mine));
  Request changed = mine;
  changed.shape = {5};
  EXPECT_FALSE(cache.Matches(slot, changed));
  changed = mine;
  changed.op = ReduceOp::kMax;
  EXPECT_FALSE(cache.Matches(slot, changed));
  changed = mine;
  changed.prescale = 0.5;
  EXPECT_FALSE(cache.Matches(slot, changed));
  // a packed request's members reshaped, the total count unchanged
  Request packed = mine;
  packed.members = {1, 2, 1, 2};
  cache.Put(Named("p"), &packed);
  EXPECT_TRUE(cache.Matches(cache.Find("p"), packed));
  changed = packed;
  changed.members = {2, 1, 2, 0};
  EXPECT_FALSE(cache.Matches(cache.Find("p"), changed));
  // An entry made for a rank that had joined (no request of its own)
  // never matches: that rank's first real request goes to the coordinator.
  cache.Put(Named("x"), nullptr);
  EXPECT_FALSE(cache.Matches(cache.Find("x"), Asked("x")));
}

TEST(ResponseCache, ZeroCapacityCachesNothing) {
  ResponseCache cache(0);
  const Request a = Asked("a");
  EXPECT_EQ(cache.Put(Named("a"), &a), -1);
  EXPECT_EQ(cache.Find("a"), -1);
}

TEST(ResponseCache, AlltoallAndBarrierAreNotCacheable) {
  Request r = Asked("t");
  r.kind = CollectiveKind::kAlltoall;
  EXPECT_FALSE(ResponseCache::Cacheable(r));
  r.kind = CollectiveKind::kBarrier;
  EXPECT_FALSE(ResponseCache::Cacheable(r));
  r.kind = CollectiveKind::kAllreduce;
  EXPECT_TRUE(ResponseCache::Cacheable(r));
}

}  // namespace
}  // namespace hora
