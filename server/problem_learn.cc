// Problem: the learner. A join is acknowledged once its sample is written (problem_commit.cc);
// the written samples then wait in unlearned_, in log order, for LearnQueued. It takes up to
// kMaxLearnBatch of them, scores them with every expert outside mu_ (one PredictBatch per
// expert: a tree model scores a batch several times cheaper per row than one row at a
// time, bench/README.md), then teaches them to D-UCB in order, under mu_ in short slices.
// Learning is the only thing that trails the acknowledgement: the log, the estimates and the
// batch schedule move when a sample is learned, and a restart learns from the store whatever
// was written.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/problem.h"

namespace decision::server {

void Problem::QueueLearnLocked(WriteOp& op, int64_t sequence) {
  Unlearned sample;
  sample.sequence = sequence;
  sample.event = op.event;
  sample.reward = op.reward;
  sample.written = std::chrono::steady_clock::now();
  unlearned_.push_back(std::move(sample));
}

std::vector<double> Problem::ScoreBatch(const std::vector<Unlearned>& batch,
                                        const std::vector<std::shared_ptr<const Expert>>& models,
                                        absl::string_view where,
                                        std::vector<ScoringFailure>* failures) const {
  const size_t n = batch.size();
  const size_t d = record_.num_features();
  const int arms = record_.num_arms();
  std::vector<double> rows(n * d);
  bool restricted = false;
  for (size_t s = 0; s < n; ++s) {
    std::copy_n(batch[s].event.features().data(), d, rows.begin() + s * d);
    restricted = restricted || batch[s].event.eligible_arms_size() > 0;
  }
  // Each sample scored under the arms that were eligible for it.
  std::vector<absl::Span<const int32_t>> eligible;
  if (restricted) {
    eligible.reserve(n);
    for (const Unlearned& u : batch) {
      eligible.push_back(absl::MakeConstSpan(u.event.eligible_arms().data(),
                                             u.event.eligible_arms_size()));
    }
  }
  // out[s * width + k]: the layout DUcb::Learn reads one sample of. The experts are scored
  // side by side (Env::scorers), each into its own column.
  const size_t width = models.size();
  std::vector<double> out(n * width);
  std::vector<std::string> failed(width);  // why expert k failed, if it did
  ParallelFor(env_.scorers, static_cast<int>(width), [&](int task) {
    const size_t k = static_cast<size_t>(task);
    std::vector<double> probs(n * arms);
    absl::Status s = models[k]->PredictBatchEligible(rows, n, eligible, absl::MakeSpan(probs));
    for (size_t i = 0; i < n && s.ok(); ++i) {
      const Unlearned& sample = batch[i];
      // The chooser's is the probability the decision was drawn with: the importance
      // ratios' denominator, never a re-score.
      const double p = static_cast<int>(k) == sample.event.expert_id()
                           ? sample.event.propensity()
                           : probs[i * arms + sample.event.arm()];
      // The same check the log makes when it learns the sample.
      if (!(p > 0.0 && p <= 1.0)) {
        s = absl::InvalidArgumentError(
            absl::StrCat("the played arm gets probability ", p, " (sample ", sample.sequence,
                         ")"));
      }
      out[i * width + k] = p;
    }
    if (s.ok()) return;
    // Quarantined where it failed: the stand-in's 1/K (1/|E| over E eligible arms) for the
    // whole batch.
    failed[k] = absl::StrCat(where, ": ", s.message());
    for (size_t i = 0; i < n; ++i) {
      const int m = batch[i].event.eligible_arms_size();
      out[i * width + k] = static_cast<int>(k) == batch[i].event.expert_id()
                               ? batch[i].event.propensity()
                               : 1.0 / (m > 0 ? m : arms);
    }
  });
  for (size_t k = 0; k < width; ++k) {
    if (!failed[k].empty()) failures->push_back({static_cast<int>(k), std::move(failed[k])});
  }
  return out;
}

absl::Status Problem::LearnOneLocked(const Unlearned& sample,
                                     absl::Span<const double> propensities) {
  const int64_t seq = ducb_.num_samples();
  if (sample.sequence != seq) {
    return absl::InternalError(absl::StrCat("sample ", sample.sequence,
                                            " came to the learner when the log has ", seq));
  }
  if (env_.hooks != nullptr && env_.hooks->before_learn) {
    DECISION_RETURN_IF_ERROR(env_.hooks->before_learn(seq));
  }
  DECISION_RETURN_IF_ERROR(ducb_.Learn(sample.event.expert_id(), sample.reward,
                                       propensities.subspan(0, ducb_.num_experts())));
  positive_learned_ += sample.reward > 0.0;
  for (int k = ducb_.num_experts(); k < experts_.size(); ++k) {
    experts_.at(k).tail.push_back(propensities[k]);
  }
  AppendToLogChunkLocked(sample.event.expert_id(), sample.reward, propensities);
  return absl::OkStatus();
}

std::vector<Done> Problem::TakeLearnedWaitersLocked() {
  std::vector<Done> ready;
  const int64_t learned = ducb_.num_samples();
  const bool all = !learning_stopped_.ok() || unlearned_.empty();
  auto keep = learn_waiters_.begin();
  for (auto& [target, done] : learn_waiters_) {
    if (all || target <= learned) {
      ready.push_back(std::move(done));
    } else {
      *keep++ = {target, std::move(done)};
    }
  }
  learn_waiters_.erase(keep, learn_waiters_.end());
  return ready;
}

void Problem::LearnQueued() {
  for (;;) {
    std::vector<Unlearned> batch;
    std::vector<std::shared_ptr<const Expert>> models;
    std::vector<Done> ready;
    {
      absl::MutexLock lock(&mu_);
      if (unlearned_.empty() || !learning_stopped_.ok()) {
        learn_scheduled_ = false;
        ready = TakeLearnedWaitersLocked();
      } else {
        // Copied, not taken: they count as written and unlearned until they are learned.
        const size_t n = std::min(unlearned_.size(), kMaxLearnBatch);
        batch.assign(unlearned_.begin(), unlearned_.begin() + n);
        models = experts_.JoinModels(stand_in_);
      }
    }
    if (batch.empty()) {
      for (Done& done : ready) done(absl::OkStatus());
      return;
    }
    if (env_.hooks != nullptr && env_.hooks->before_score) {
      env_.hooks->before_score(batch.front().sequence);
    }
    std::vector<ScoringFailure> failures;
    std::vector<double> scored = ScoreBatch(batch, models, "join", &failures);
    size_t width = models.size();
    QuarantineFailures(failures);
    // Taught to D-UCB in slices of at most kMaxLearnSliceUs under mu_: Choose and the
    // writer take mu_ between two slices, so a learner at a low priority that is preempted
    // while it holds mu_ delays them by one slice at most, not by the whole batch (up to
    // about 20 ms with 160 experts). The order of the samples, hence what is learned, is
    // the same.
    size_t next = 0;
    while (next < batch.size()) {
      absl::MutexLock lock(&mu_);
      if (experts_.size() < static_cast<int>(width)) {
        // A registration whose write failed dropped its expert while the batch was scored:
        // its column goes, so that an expert registered next under the same id is scored
        // below, not given the dropped one's values.
        const size_t narrower = static_cast<size_t>(experts_.size());
        for (size_t s = 0; s < batch.size(); ++s) {
          std::copy_n(&scored[s * width], narrower, &scored[s * narrower]);
        }
        scored.resize(batch.size() * narrower);
        width = narrower;
      }
      // Experts registered while the batch was scored: their columns too, without the lock.
      while (experts_.size() > static_cast<int>(width)) {
        std::vector<std::shared_ptr<const Expert>> added = experts_.JoinModels(stand_in_);
        added.erase(added.begin(), added.begin() + width);
        mu_.Unlock();
        failures.clear();
        const std::vector<double> more = ScoreBatch(batch, added, "join", &failures);
        for (ScoringFailure& f : failures) f.expert += static_cast<int>(width);
        QuarantineFailures(failures);
        const size_t wider = width + added.size();
        std::vector<double> merged(batch.size() * wider);
        for (size_t s = 0; s < batch.size(); ++s) {
          std::copy_n(&scored[s * width], width, &merged[s * wider]);
          std::copy_n(&more[s * added.size()], added.size(), &merged[s * wider + width]);
        }
        scored.swap(merged);
        width = wider;
        mu_.Lock();
      }
      const auto now = std::chrono::steady_clock::now();
      const auto slice_end = now + std::chrono::microseconds(kMaxLearnSliceUs);
      bool stopped = false;
      do {
        absl::Status learned =
            LearnOneLocked(batch[next], absl::MakeConstSpan(&scored[next * width], width));
        if (!learned.ok()) {
          // The sample is stored but the log did not take it. Stop learning until a
          // restart, which learns the stored samples from the store; the writer refuses
          // later joins. Should not happen: propensities are checked before learning.
          learning_stopped_ = absl::InternalError(absl::StrCat(
              "problem ", id(), ": sample ", batch[next].sequence,
              " was stored but could not be learned (", learned.message(),
              "); rewards are refused until decisiond restarts and reloads it"));
          std::fprintf(stderr, "decisiond: %s\n", learning_stopped_.ToString().c_str());
          stopped = true;
          break;
        }
        unlearned_.pop_front();
        metrics_.learning_delay->Observe(
            std::chrono::duration<double>(now - batch[next].written).count());
        ++next;
      } while (next < batch.size() && std::chrono::steady_clock::now() < slice_end);
      MarkPoolWork();  // retirement and the batch schedule move with the log
      metrics_.learning_lag->Set(static_cast<double>(unlearned_.size()));
      metrics_.samples->Set(static_cast<double>(ducb_.num_samples()));
      std::vector<Done> learned = TakeLearnedWaitersLocked();
      ready.insert(ready.end(), std::make_move_iterator(learned.begin()),
                   std::make_move_iterator(learned.end()));
      if (stopped) break;
    }
    for (Done& done : ready) done(absl::OkStatus());
  }
}

void Problem::WhenLearned(Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!unlearned_.empty() && learning_stopped_.ok()) {
      learn_waiters_.emplace_back(WrittenSamplesLocked(), std::move(done));
      return;
    }
  }
  done(absl::OkStatus());
}

absl::Status Problem::WaitLearned() {
  return AwaitDone([this](Done done) { WhenLearned(std::move(done)); });
}

}  // namespace decision::server
