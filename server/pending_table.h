// The decisions of one problem that are not yet joined: each with one DecisionState, the
// deadline index the expiry walks, and the list of deferred decisions not yet written. Like
// LevelDB's MemTable it is plain state: no lock (the owner, Problem, guards it with its
// mutex) and no I/O.
//
// The life of a decision (every transition is one method below):
//
//   Choose with a caller event id:  Claim -> kDeciding
//   kDeciding -> Decide -> kWriting (durable Choose) or kUnwritten (deferred)
//   kDeciding -> Unclaim -> gone (the Choose failed)
//   kWriting --MarkStored--> kStored           kWriting --Erase--> gone (its write failed)
//   kUnwritten --TakeUnwritten--> kFlushing --MarkStored--> kStored
//   kFlushing --ReturnUnwritten--> kUnwritten  (the flush failed)
//   kUnwritten/kFlushing/kStored --StartJoin--> kJoining (a reward) or kExpiring (expiry)
//   kJoining/kExpiring --AbortJoin--> the state it came from (the join's write failed)
//   kJoining/kExpiring --Erase--> gone (joined, or dropped: the store has it now)
//
// A decision is answered (its arm returned to a caller) once it is kUnwritten or kStored;
// it is joinable in kUnwritten, kFlushing and kStored. Choose calls that find their event id
// in kDeciding or kWriting wait for it as waiters, completed by the owner.
#ifndef DECISION_SERVER_PENDING_TABLE_H_
#define DECISION_SERVER_PENDING_TABLE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "decision/v1/decision.pb.h"
#include "storage/records.pb.h"

namespace decision::server {

enum class DecisionState {
  kDeciding,   // claimed by a Choose with a caller event id that is still choosing
  kWriting,    // durable Choose: being written; answered once stored
  kUnwritten,  // deferred: answered and joinable, not written yet
  kFlushing,   // deferred: in a flush's write
  kStored,     // written, waiting for its reward
  kJoining,    // a reward is being joined
  kExpiring,   // the expiry is being joined (default reward) or dropped
};

// A Choose waiting for a decision of the same event id that is being decided or written.
struct ChooseWaiter {
  v1::ChooseResponse* response;
  std::function<void(absl::Status)> done;
};

struct PendingDecision {
  DecisionState state = DecisionState::kDeciding;
  storage::v1::EventRecord record;  // empty while kDeciding
  // kJoining/kExpiring: whether the decision was stored before the join began (AbortJoin).
  bool stored_before_join = false;
  // A reward came after the deadline: the expiry writes the event with late_reward set.
  bool late_reward = false;
  std::vector<ChooseWaiter> waiters;  // kDeciding, kWriting
  // Choose calls answered with this decision whose answer may have reached the client: one
  // per answer, minus one per answer known lost (Problem::Undeliver: the call was cancelled
  // or passed its deadline). At 0 the decision was never delivered: it is not learned.
  // A decision restored from the store counts as delivered.
  int deliveries = 1;
  std::list<std::string>::iterator unwritten_position;  // kUnwritten only
};

class PendingTable {
 public:
  PendingTable() = default;
  PendingTable(const PendingTable&) = delete;
  PendingTable& operator=(const PendingTable&) = delete;

  // nullptr if `event_id` is not pending.
  PendingDecision* Find(absl::string_view event_id);

  // REQUIRES: `event_id` is not in the table.
  void Claim(const std::string& event_id);
  // The claim's Choose failed: removes it and returns its waiters (to fail them).
  // REQUIRES: state kDeciding.
  std::vector<ChooseWaiter> Unclaim(const std::string& event_id);
  // Records the decision (claimed or not) as kWriting or kUnwritten, and returns the waiters
  // of its claim. A kUnwritten decision is indexed by deadline at once.
  // REQUIRES: `event_id` is absent or kDeciding; state is kWriting or kUnwritten.
  std::vector<ChooseWaiter> Decide(const std::string& event_id, storage::v1::EventRecord record,
                                   DecisionState state, int64_t now_ms);
  // Adds a decision restored from the store, as kStored.
  void Restore(const std::string& event_id, storage::v1::EventRecord record);
  // A kWriting decision is stored (indexed by deadline; returns its waiters), or a kFlushing
  // one. Does nothing in any other state (a join has taken it meanwhile).
  std::vector<ChooseWaiter> MarkStored(const std::string& event_id);

  // Moves every kUnwritten decision to kFlushing and returns them (event id, record).
  std::vector<std::pair<std::string, storage::v1::EventRecord>> TakeUnwritten();
  // A flush failed: a decision still kFlushing is kUnwritten again; one a join took
  // meanwhile counts as never stored (AbortJoin puts it back on the flush list).
  void ReturnUnwritten(const std::string& event_id, int64_t now_ms);
  // Whether the deferred decisions should be written now: `max_unwritten` of them, or the
  // oldest has waited `flush_ms`.
  bool FlushDue(int64_t now_ms, size_t max_unwritten, int64_t flush_ms) const;
  size_t unwritten() const { return unwritten_.size(); }
  // Decisions in a flush that is not written yet (kFlushing).
  int64_t flushing() const { return flushing_; }

  // Starts the join of a joinable decision (kUnwritten, kFlushing or kStored). Returns
  // whether the decision was stored already (a join of a kUnwritten decision writes it).
  bool StartJoin(PendingDecision& decision, bool expiry);
  // The join's write failed: the decision is back in the state it came from.
  void AbortJoin(const std::string& event_id, int64_t now_ms);
  // Removes the decision (joined, dropped, or its durable write failed).
  void Erase(const std::string& event_id);

  // Event ids whose deadline is before `now_ms` and that are joinable, in deadline order.
  std::vector<std::string> Due(int64_t now_ms) const;
  // Whether some answered decision's deadline is before `now_ms` (Due may still be empty:
  // that decision may be joining).
  bool AnyDeadlineBefore(int64_t now_ms) const {
    return !deadlines_.empty() && deadlines_.begin()->first < now_ms;
  }
  // Decisions answered and not joined yet (every state but kDeciding and kWriting).
  int64_t answered() const { return answered_; }
  // The eligible arms the decisions in the table carry, in all (every state but
  // kDeciding): their memory, 4 bytes each, is on top of PendingDecisionBytes.
  int64_t eligible_arms() const { return eligible_arms_; }
  // Decisions of expert `expert` in the table (every state but kDeciding).
  int64_t ChosenBy(int expert) const {
    return static_cast<size_t>(expert) < chosen_by_.size() ? chosen_by_[expert] : 0;
  }

 private:
  static bool Answered(DecisionState s) {
    return s != DecisionState::kDeciding && s != DecisionState::kWriting;
  }
  void SetState(PendingDecision& d, DecisionState s);
  void CountChosen(const storage::v1::EventRecord& record, int64_t delta);

  absl::node_hash_map<std::string, PendingDecision> decisions_;
  std::set<std::pair<int64_t, std::string>> deadlines_;  // answered decisions only
  std::list<std::string> unwritten_;                     // kUnwritten, oldest first
  int64_t unwritten_since_ms_ = 0;  // when unwritten_ last became non-empty
  int64_t answered_ = 0;
  int64_t flushing_ = 0;
  std::vector<int64_t> chosen_by_;  // decisions per expert id (ids are dense)
  int64_t eligible_arms_ = 0;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_PENDING_TABLE_H_
