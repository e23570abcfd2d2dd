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

// Retention: the filters whose ids are all older than a cut are forgotten, no id inserted
// at or after the cut is, and the filters then stay a few generations of the window.
namespace decision::server {
namespace {

TEST(EventIdFilter, DropsWhatRetentionDeletedAndNothingNewer) {
  EventIdFilter filter(1000);
  int64_t now = 0;
  for (int round = 0; round < 40; ++round) {
    // 5000 ids a "second"; retention keeps the last 3 seconds.
    for (int i = 0; i < 5000; ++i) filter.Insert(absl::StrCat(round, "-", i), ++now);
    filter.DropBefore(now - 15000);
    for (int back = 0; back < 3 && back <= round; ++back) {
      for (int i = 0; i < 5000; i += 97) {
        ASSERT_TRUE(filter.MayContain(absl::StrCat(round - back, "-", i)))
            << "round " << round << " lost an id inside the window";
      }
    }
  }
  // 40 rounds of 5000 ids inserted, 15000 in the window: at most a few windows are held.
  EXPECT_LE(filter.size(), 4 * 15000);
  EXPECT_GE(filter.size(), 15000);
  EXPECT_LE(filter.memory_bytes(), 4 * 15000 * 10 / 8 * 2 + 8192);
  // Ids of the first rounds are gone (the filter answers for almost all of them).
  int present = 0;
  for (int i = 0; i < 5000; ++i) present += filter.MayContain(absl::StrCat(0, "-", i));
  EXPECT_LT(present, 250);
}

}  // namespace
}  // namespace decision::server
