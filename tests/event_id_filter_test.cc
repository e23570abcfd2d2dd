#include "server/event_id_filter.h"

#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace decision::server {
namespace {

TEST(EventIdFilter, NeverForgetsAnIdAcrossGrowth) {
  EventIdFilter filter(/*first_capacity=*/1000);
  for (int i = 0; i < 100'000; ++i) filter.Insert(absl::StrCat("caller-", i));
  EXPECT_EQ(filter.size(), 100'000);
  for (int i = 0; i < 100'000; ++i) {
    ASSERT_TRUE(filter.MayContain(absl::StrCat("caller-", i))) << i;
  }
  // 1000, 4000, 16000, 64000 and 256000: 100k ids need five filters.
  EXPECT_GE(filter.memory_bytes(), 100'000 * 10 / 8);
  EXPECT_LE(filter.memory_bytes(), 341'000 * 20 / 8);
}

TEST(EventIdFilter, AnswersMostNewIdsWithoutTheStore) {
  EventIdFilter filter(/*first_capacity=*/1000);
  for (int i = 0; i < 100'000; ++i) filter.Insert(absl::StrCat("seen-", i));
  int false_positives = 0;
  for (int i = 0; i < 100'000; ++i) false_positives += filter.MayContain(absl::StrCat("new-", i));
  // Each filter has ~1-2% false positives when full; five filters, most far from full.
  EXPECT_LT(false_positives, 5'000);
  std::printf("false positives: %d of 100000 new ids\n", false_positives);
}

TEST(EventIdFilter, EmptyContainsNothing) {
  EventIdFilter filter;
  EXPECT_FALSE(filter.MayContain(""));
  EXPECT_FALSE(filter.MayContain("x"));
  filter.Insert("");
  EXPECT_TRUE(filter.MayContain(""));
}

}  // namespace
}  // namespace decision::server
