#include "storage/retention.h"

#include <rocksdb/compaction_filter.h>

#include <string>
#include <utility>

#include "storage/records.pb.h"

namespace decision::storage {
namespace {

class EventRetentionFilter final : public rocksdb::CompactionFilter {
 public:
  explicit EventRetentionFilter(std::shared_ptr<const RetentionCuts> cuts)
      : cuts_(std::move(cuts)) {}

  bool Filter(int /*level*/, const rocksdb::Slice& key, const rocksdb::Slice& value,
              std::string* /*new_value*/, bool* /*value_changed*/) const override {
    if (key.size() < 4) return false;
    uint32_t problem = 0;
    for (int i = 0; i < 4; ++i) problem = (problem << 8) | static_cast<uint8_t>(key[i]);
    const RetentionCuts::Cut cut = cuts_->Get(problem);
    if (cut.first_sample <= 0 && cut.events_before_ms <= 0) return false;
    v1::EventRecord event;
    if (!event.ParseFromArray(value.data(), static_cast<int>(value.size()))) return false;
    if (event.state() == v1::EVENT_STATE_PENDING) return false;
    // A joined event goes with its sample; one never joined by its decision time.
    if (event.sequence() >= 0) return event.sequence() < cut.first_sample;
    return event.decided_at_ms() < cut.events_before_ms;
  }
  const char* Name() const override { return "decision.EventRetention"; }

 private:
  const std::shared_ptr<const RetentionCuts> cuts_;
};

}  // namespace

std::shared_ptr<rocksdb::CompactionFilter> NewEventRetentionFilter(
    std::shared_ptr<const RetentionCuts> cuts) {
  return std::make_shared<EventRetentionFilter>(std::move(cuts));
}

}  // namespace decision::storage
