#include "server/event_id_filter.h"

#include <algorithm>
#include <cstdio>
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
  EXPECT_GE(filter.memory_bytes(), 341'000 * 12 / 8);
  EXPECT_LE(filter.memory_bytes(), 341'000 * 12 / 8 + 5 * 64);
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
  constexpr int kPerRound = 500;
  constexpr int64_t kWindow = 15000;  // retention keeps the last 30 rounds' ids
  int64_t most_held = 0, most_bytes = 0;
  for (int round = 0; round < 400; ++round) {
    for (int i = 0; i < kPerRound; ++i) filter.Insert(absl::StrCat(round, "-", i), ++now);
    filter.DropBefore(now - kWindow);
    for (int back = 0; back < kWindow / kPerRound && back <= round; back += 7) {
      for (int i = 0; i < kPerRound; i += 97) {
        ASSERT_TRUE(filter.MayContain(absl::StrCat(round - back, "-", i)))
            << "round " << round << " lost an id inside the window";
      }
    }
    if (round >= 100) {  // past the growth from the first filter
      most_held = std::max(most_held, filter.size());
      most_bytes = std::max(most_bytes, filter.memory_bytes());
    }
  }
  // Generations of about half the window: about 1.6 windows of ids held at most, in 3
  // bytes per id of the window (12 bits an id of capacity, sized exactly). Sizing each new
  // filter to all the ids held, as before, holds twice the window here.
  std::printf("window %lld ids: at most %lld ids held, %lld bytes\n",
              static_cast<long long>(kWindow), static_cast<long long>(most_held),
              static_cast<long long>(most_bytes));
  EXPECT_LE(most_held, kWindow * 175 / 100);
  EXPECT_GE(filter.size(), kWindow);
  EXPECT_LE(most_bytes, kWindow * 35 / 10);
  // Ids of the first rounds are gone (the filter answers for almost all of them).
  int present = 0;
  for (int i = 0; i < kPerRound; ++i) present += filter.MayContain(absl::StrCat(0, "-", i));
  EXPECT_LT(present, 25);
}

}  // namespace
}  // namespace decision::server
