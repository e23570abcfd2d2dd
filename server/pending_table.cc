#include "server/pending_table.h"

#include <cassert>

namespace decision::server {

void PendingTable::SetState(PendingDecision& d, DecisionState s) {
  answered_ += static_cast<int>(Answered(s)) - static_cast<int>(Answered(d.state));
  flushing_ += static_cast<int>(s == DecisionState::kFlushing) -
               static_cast<int>(d.state == DecisionState::kFlushing);
  d.state = s;
}

void PendingTable::CountChosen(const storage::v1::EventRecord& record, int64_t delta) {
  const size_t expert = static_cast<size_t>(record.expert_id());
  if (expert >= chosen_by_.size()) chosen_by_.resize(expert + 1, 0);
  chosen_by_[expert] += delta;
  eligible_arms_ += delta * record.eligible_arms_size();
}

PendingDecision* PendingTable::Find(absl::string_view event_id) {
  auto it = decisions_.find(event_id);
  return it == decisions_.end() ? nullptr : &it->second;
}

void PendingTable::Claim(const std::string& event_id) {
  auto [it, inserted] = decisions_.try_emplace(event_id);
  assert(inserted);
  (void)inserted;
  it->second.state = DecisionState::kDeciding;
}

std::vector<ChooseWaiter> PendingTable::Unclaim(const std::string& event_id) {
  auto it = decisions_.find(event_id);
  if (it == decisions_.end()) return {};
  assert(it->second.state == DecisionState::kDeciding);
  std::vector<ChooseWaiter> waiters = std::move(it->second.waiters);
  decisions_.erase(it);
  return waiters;
}

std::vector<ChooseWaiter> PendingTable::Decide(const std::string& event_id,
                                               storage::v1::EventRecord record,
                                               DecisionState state, int64_t now_ms) {
  assert(state == DecisionState::kWriting || state == DecisionState::kUnwritten);
  auto [it, inserted] = decisions_.try_emplace(event_id);
  PendingDecision& d = it->second;
  assert(inserted || d.state == DecisionState::kDeciding);
  if (inserted) d.state = DecisionState::kDeciding;
  d.record = std::move(record);
  CountChosen(d.record, 1);
  SetState(d, state);
  if (state == DecisionState::kWriting) return {};  // its waiters wait for the write
  deadlines_.insert({d.record.deadline_ms(), event_id});
  if (unwritten_.empty()) unwritten_since_ms_ = now_ms;
  d.unwritten_position = unwritten_.insert(unwritten_.end(), event_id);
  return std::move(d.waiters);
}

void PendingTable::Restore(const std::string& event_id, storage::v1::EventRecord record) {
  PendingDecision& d = decisions_[event_id];
  if (d.state != DecisionState::kDeciding) CountChosen(d.record, -1);  // restored twice
  d.record = std::move(record);
  CountChosen(d.record, 1);
  SetState(d, DecisionState::kStored);
  deadlines_.insert({d.record.deadline_ms(), event_id});
}

std::vector<ChooseWaiter> PendingTable::MarkStored(const std::string& event_id) {
  PendingDecision* d = Find(event_id);
  if (d == nullptr) return {};
  if (d->state == DecisionState::kFlushing) {
    SetState(*d, DecisionState::kStored);
    return {};
  }
  if (d->state != DecisionState::kWriting) return {};
  SetState(*d, DecisionState::kStored);
  deadlines_.insert({d->record.deadline_ms(), event_id});
  return std::move(d->waiters);
}

std::vector<std::pair<std::string, storage::v1::EventRecord>> PendingTable::TakeUnwritten() {
  std::vector<std::pair<std::string, storage::v1::EventRecord>> out;
  out.reserve(unwritten_.size());
  for (std::string& event_id : unwritten_) {
    PendingDecision& d = decisions_.find(event_id)->second;
    SetState(d, DecisionState::kFlushing);
    out.emplace_back(std::move(event_id), d.record);
  }
  unwritten_.clear();
  return out;
}

void PendingTable::ReturnUnwritten(const std::string& event_id, int64_t now_ms) {
  PendingDecision* d = Find(event_id);
  if (d == nullptr) return;
  if (d->state == DecisionState::kJoining || d->state == DecisionState::kExpiring) {
    // Taken by a join while flushing: if that join fails too, the decision goes back to
    // the flush list, not to kStored.
    d->stored_before_join = false;
    return;
  }
  if (d->state != DecisionState::kFlushing) return;
  SetState(*d, DecisionState::kUnwritten);
  if (unwritten_.empty()) unwritten_since_ms_ = now_ms;
  d->unwritten_position = unwritten_.insert(unwritten_.end(), event_id);
}

bool PendingTable::FlushDue(int64_t now_ms, size_t max_unwritten, int64_t flush_ms) const {
  return !unwritten_.empty() &&
         (unwritten_.size() >= max_unwritten || now_ms - unwritten_since_ms_ >= flush_ms);
}

bool PendingTable::StartJoin(PendingDecision& d, bool expiry) {
  assert(d.state == DecisionState::kUnwritten || d.state == DecisionState::kFlushing ||
         d.state == DecisionState::kStored);
  // A flushing decision is written by the flush, which is ahead of the join in the writer's
  // queue; an unwritten one is written by the join.
  d.stored_before_join = d.state != DecisionState::kUnwritten;
  if (d.state == DecisionState::kUnwritten) unwritten_.erase(d.unwritten_position);
  SetState(d, expiry ? DecisionState::kExpiring : DecisionState::kJoining);
  return d.stored_before_join;
}

void PendingTable::AbortJoin(const std::string& event_id, int64_t now_ms) {
  PendingDecision* d = Find(event_id);
  if (d == nullptr) return;
  if (d->stored_before_join) {
    SetState(*d, DecisionState::kStored);
    return;
  }
  SetState(*d, DecisionState::kUnwritten);
  if (unwritten_.empty()) unwritten_since_ms_ = now_ms;
  d->unwritten_position = unwritten_.insert(unwritten_.end(), event_id);
}

void PendingTable::Erase(const std::string& event_id) {
  auto it = decisions_.find(event_id);
  if (it == decisions_.end()) return;
  PendingDecision& d = it->second;
  if (d.state == DecisionState::kUnwritten) unwritten_.erase(d.unwritten_position);
  if (Answered(d.state)) deadlines_.erase({d.record.deadline_ms(), event_id});
  if (d.state != DecisionState::kDeciding) CountChosen(d.record, -1);
  SetState(d, DecisionState::kDeciding);  // not answered: keeps answered_ exact
  decisions_.erase(it);
}

std::vector<std::string> PendingTable::Due(int64_t now_ms) const {
  std::vector<std::string> due;
  for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first < now_ms; ++it) {
    const auto d = decisions_.find(it->second);
    if (d == decisions_.end()) continue;
    const DecisionState s = d->second.state;
    if (s == DecisionState::kUnwritten || s == DecisionState::kFlushing ||
        s == DecisionState::kStored) {
      due.push_back(it->second);
    }
  }
  return due;
}

}  // namespace decision::server
