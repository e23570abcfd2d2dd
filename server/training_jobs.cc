#include "server/training_jobs.h"

#include <set>

#include "server/validation.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace decision::server {

using storage::v1::TrainingJobRecord;

bool Unfinished(const TrainingJobRecord& record) {
  return record.state() == storage::v1::TRAINING_JOB_STATE_QUEUED ||
         record.state() == storage::v1::TRAINING_JOB_STATE_RUNNING;
}

std::string TrainedExpertName(int64_t job_id, bool linear, int64_t samples) {
  return absl::StrCat("job", job_id, "-", linear ? "linear" : "trees", "-t", samples);
}

bool ExpertNameIsOfJob(absl::string_view name, int64_t job_id) {
  return absl::ConsumePrefix(&name, absl::StrCat("job", job_id, "-")) &&
         (absl::StartsWith(name, "trees-t") || absl::StartsWith(name, "linear-t"));
}

bool IsTrainedExpertName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "job")) return false;
  const size_t digits = name.find_first_not_of("0123456789");
  if (digits == 0 || digits == absl::string_view::npos) return false;
  name.remove_prefix(digits);
  return absl::StartsWith(name, "-trees-t") || absl::StartsWith(name, "-linear-t");
}

namespace {

// Why a stored job cannot be resumed as it stands ("" if it can): every count and id it
// holds is checked before it is used.
std::string Inconsistency(const TrainingJobRecord& r, int num_experts) {
  const int64_t total = int64_t{r.tree_experts()} + r.linear_experts();
  if (r.tree_experts() < 0 || r.linear_experts() < 0 || total < 1 ||
      total > kMaxExpertsPerTrainingJob) {
    return absl::StrCat("it asks for ", r.tree_experts(), " tree and ", r.linear_experts(),
                        " linear experts");
  }
  if (r.skipped_experts() < 0 || r.expert_ids_size() + int64_t{r.skipped_experts()} > total) {
    return absl::StrCat("it has ", r.expert_ids_size(), " experts and ", r.skipped_experts(),
                        " skipped of ", total);
  }
  if (r.first_expert_id() < 0 || r.first_expert_id() > num_experts) {
    return absl::StrCat("its first expert id is ", r.first_expert_id());
  }
  for (int id : r.expert_ids()) {
    if (id < r.first_expert_id() || id >= num_experts) {
      return absl::StrCat("its expert ", id, " is not one the problem's ", num_experts,
                          " experts it could have registered");
    }
  }
  return "";
}

}  // namespace

bool PrepareResume(const std::vector<v1::Expert>* experts, bool has_positive_reward,
                   TrainingJobRecord* r) {
  const bool was_running = r->state() == storage::v1::TRAINING_JOB_STATE_RUNNING;
  auto fail = [&](absl::string_view why) {
    r->set_state(storage::v1::TRAINING_JOB_STATE_FAILED);
    r->set_error(absl::StrCat(why, " (found ", was_running ? "RUNNING" : "QUEUED",
                              " at a restart, with ", r->expert_ids_size(), " of ",
                              r->tree_experts() + int64_t{r->linear_experts()},
                              " experts registered)"));
    return false;
  };
  if (experts == nullptr) return fail("its problem was not loaded at restart");
  const int num_experts = static_cast<int>(experts->size());
  if (std::string why = Inconsistency(*r, num_experts); !why.empty()) {
    return fail(absl::StrCat("the stored job record is inconsistent: ", why));
  }
  // Experts registered after the record's last write.
  std::set<int> ids(r->expert_ids().begin(), r->expert_ids().end());
  for (const v1::Expert& e : *experts) {
    if (e.expert_id() >= r->first_expert_id() && !ids.count(e.expert_id()) &&
        ExpertNameIsOfJob(e.name(), r->job_id()) &&
        static_cast<int64_t>(ids.size()) + r->skipped_experts() <
            int64_t{r->tree_experts()} + r->linear_experts()) {
      ids.insert(e.expert_id());
    }
  }
  r->mutable_expert_ids()->Assign(ids.begin(), ids.end());
  if (r->expert_ids_size() + r->skipped_experts() >= r->tree_experts() + r->linear_experts()) {
    r->set_state(storage::v1::TRAINING_JOB_STATE_SUCCEEDED);
    r->clear_error();
    return false;
  }
  if (!has_positive_reward) return fail("its problem has no sample with a positive reward");
  if (was_running) {
    if (r->interruptions() + 1 >= kMaxTrainingJobInterruptions) {
      r->set_interruptions(r->interruptions() + 1);
      return fail(absl::StrCat("interrupted by ", r->interruptions(), " restarts"));
    }
    r->set_interruptions(r->interruptions() + 1);
  }
  r->set_state(storage::v1::TRAINING_JOB_STATE_QUEUED);
  r->clear_error();
  return true;
}

absl::StatusOr<std::vector<std::pair<uint32_t, TrainingJobRecord>>> TrainingJobBook::Load() {
  std::vector<std::pair<uint32_t, TrainingJobRecord>> unfinished;
  absl::MutexLock lock(&mu_);
  DECISION_RETURN_IF_ERROR(store_->ForEachTrainingJob(
      [&](uint32_t problem, int64_t job_id, const TrainingJobRecord& record) -> absl::Status {
        TrainingJobRecord& kept = jobs_[problem][job_id];
        kept = record;
        // The key is the job's identity; a record that says otherwise is answered as the
        // key says (and a resume checks the rest).
        kept.set_job_id(job_id);
        if (Unfinished(kept)) unfinished.emplace_back(problem, kept);
        return absl::OkStatus();
      }));
  return unfinished;
}

absl::StatusOr<TrainingJobRecord> TrainingJobBook::Create(
    uint32_t problem, const std::string& problem_id, int tree_experts, int linear_experts,
    storage::v1::TrainingJobOrigin origin, int64_t samples) {
  TrainingJobRecord record;
  record.set_problem_id(problem_id);
  record.set_origin(origin);
  record.set_tree_experts(tree_experts);
  record.set_linear_experts(linear_experts);
  record.set_samples(samples);
  record.set_state(storage::v1::TRAINING_JOB_STATE_QUEUED);
  record.set_created_at_ms(clock_->NowMs());
  record.set_updated_at_ms(record.created_at_ms());
  {
    absl::MutexLock lock(&mu_);
    std::map<int64_t, TrainingJobRecord>& jobs = jobs_[problem];
    record.set_job_id(jobs.empty() ? 1 : jobs.rbegin()->first + 1);
    jobs[record.job_id()] = record;
  }
  if (absl::Status s = store_->PutTrainingJob(problem, record.job_id(), record); !s.ok()) {
    absl::MutexLock lock(&mu_);
    jobs_[problem].erase(record.job_id());
    return s;
  }
  return record;
}

absl::Status TrainingJobBook::Update(uint32_t problem, TrainingJobRecord record) {
  record.set_updated_at_ms(clock_->NowMs());
  // Written first: a reader that sees the change in memory sees it after the write (a
  // test that polls a job to its end then knows the job's writes are done).
  absl::Status written = store_->PutTrainingJob(problem, record.job_id(), record);
  absl::MutexLock lock(&mu_);
  jobs_[problem][record.job_id()] = std::move(record);
  return written;
}

absl::StatusOr<TrainingJobRecord> TrainingJobBook::Get(uint32_t problem, int64_t job_id) const {
  absl::MutexLock lock(&mu_);
  auto jobs = jobs_.find(problem);
  if (jobs != jobs_.end()) {
    auto it = jobs->second.find(job_id);
    if (it != jobs->second.end()) return it->second;
  }
  return absl::NotFoundError(absl::StrCat("training job ", job_id, " does not exist"));
}

int64_t TrainingJobBook::OldestUnfinishedBoundary(uint32_t problem) const {
  absl::MutexLock lock(&mu_);
  auto jobs = jobs_.find(problem);
  if (jobs == jobs_.end()) return 0;
  int64_t oldest = 0;
  for (const auto& [id, record] : jobs->second) {
    if (record.samples() > 0 && Unfinished(record) && (oldest == 0 || record.samples() < oldest)) {
      oldest = record.samples();
    }
  }
  return oldest;
}

}  // namespace decision::server
