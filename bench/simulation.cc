#include "bench/simulation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/xgboost_expert.h"
#include "core/xgboost_trainer.h"

namespace decision::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The window over which "the late expert is followed in 90% of decisions" is measured.
constexpr size_t kFollowWindow = 100;
double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class Simulation {
 public:
  Simulation(const Dataset& data, const std::vector<int>& order, const SimulationOptions& o)
      : data_(data),
        order_(order),
        o_(o),
        k_(data.num_classes),
        gen_(o.seed),
        eligible_gen_(o.seed ^ 0x656c696769626c65ULL),
        reservoir_(1, o.divergence.reservoir_capacity) {
    training_.num_features = data.num_features;
  }

  absl::StatusOr<SimulationResult> Run(const ProgressFn& progress) {
    const auto start = Clock::now();
    DECISION_RETURN_IF_ERROR(ValidateBatchOptions(o_.batch));
    if (!(o_.eligible_share >= 0.0 && o_.eligible_share <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("eligible share ", o_.eligible_share, " is not in [0, 1]"));
    }
    DECISION_RETURN_IF_ERROR(ValidateDivergenceOptions(o_.divergence));
    DECISION_ASSIGN_OR_RETURN(std::unique_ptr<Expert> uniform,
                              MakeUniformExpert(k_, data_.num_features));
    DECISION_RETURN_IF_ERROR(CacheExpert(*uniform, 0.0));
    const bool pool = o_.pool_experts > 0;
    SimulationResult result;
    int64_t first = 0;  // the order's first played row
    if (pool) {
      if (o_.pool_prefix < 1 || o_.pool_prefix >= static_cast<int64_t>(order_.size()) ||
          o_.pool_good < 0 || o_.pool_good > o_.pool_experts || o_.late_expert_round < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a pool needs 1 <= pool_prefix < ", order_.size(), " rows, 0 <= pool_good <= ",
            "pool_experts and late_expert_round >= 0"));
      }
      first = o_.pool_prefix;
      DECISION_RETURN_IF_ERROR(BuildPool(&result));
    } else if (o_.late_expert_round > 0) {
      return absl::InvalidArgumentError("late_expert_round needs a fixed pool (pool_experts)");
    }
    DECISION_RETURN_IF_ERROR(MakePolicy());
    if (pool) {
      const auto div_start = Clock::now();
      DECISION_RETURN_IF_ERROR(AddToPolicy(/*old_n=*/1, /*full=*/true));
      result.seconds_divergences += Since(div_start);
    }
    BatchSchedule schedule(k_, o_.batch);
    const int64_t playable = static_cast<int64_t>(order_.size()) - first;
    const int64_t rounds = o_.max_rounds > 0 ? std::min<int64_t>(o_.max_rounds, playable)
                                             : playable;
    std::vector<double> propensities;
    double total_reward = 0.0;
    result.progressive_loss.reserve(rounds);
    std::vector<int32_t> eligible;
    std::vector<double> probs(k_);
    int late = -1;                   // the late expert's id, once added
    std::vector<char> followed;      // after it: whether each decision followed it
    int64_t followed_in_window = 0;  // among the last kFollowWindow of them
    double late_sum = 0.0;
    for (int64_t t = 1; t <= rounds; ++t) {
      const int row = order_[first + t - 1];
      DrawEligible(data_.labels[row], &eligible);
      reservoir_.Offer(std::vector<double>{double(row)}, eligible, gen_);
      // A pool has no warm-up and no batches: every round is an ordinary one.
      const BatchSchedule::Round phase =
          pool ? BatchSchedule::Round::kInBatch : schedule.Next();
      if (phase == BatchSchedule::Round::kBatchStart) {
        DECISION_RETURN_IF_ERROR(AddTrainedExperts(t, &result));
      }
      if (pool && t == o_.late_expert_round) {
        late = num_experts();
        DECISION_RETURN_IF_ERROR(AddLateExpert(t, &result));
      }
      auto distribution = [&](int e, absl::Span<double> out) {
        Distribution(e, row, eligible, out);
        return absl::OkStatus();
      };
      Decision d;
      if (phase == BatchSchedule::Round::kWarmup) {
        d.expert = 0;  // the uniform expert
        if (eligible.empty()) {
          d.arm = absl::Uniform<int>(gen_, 0, k_);
          d.propensity = 1.0 / k_;
        } else {
          d.arm = eligible[absl::Uniform<size_t>(gen_, 0, eligible.size())];
          d.propensity = 1.0 / eligible.size();
        }
      } else {
        DECISION_ASSIGN_OR_RETURN(d, policy_->Decide(num_experts(), k_, distribution, gen_));
      }
      const double reward = d.arm == data_.labels[row] ? 1.0 : 0.0;
      if (late >= 0) {
        Distribution(late, row, eligible, absl::MakeSpan(probs));
        late_sum += probs[data_.labels[row]];
        result.late_expert_regret += probs[data_.labels[row]] - reward;
        followed.push_back(d.expert == late);
        followed_in_window += followed.back();
        if (followed.size() > kFollowWindow) {
          followed_in_window -= followed[followed.size() - 1 - kFollowWindow];
        }
        if (result.late_expert_rounds_to_90 < 0 && followed.size() >= kFollowWindow &&
            followed_in_window >= 0.9 * kFollowWindow) {
          result.late_expert_rounds_to_90 = static_cast<int64_t>(followed.size());
        }
      }
      propensities.resize(num_experts());
      for (int e = 0; e < num_experts(); ++e) {
        if (eligible.empty()) {
          propensities[e] = cache_[e][static_cast<size_t>(row) * k_ + d.arm];
        } else {
          Distribution(e, row, eligible, absl::MakeSpan(probs));
          propensities[e] = probs[d.arm];
        }
      }
      if (d.expert < 0) d.expert = 0;  // mixtures are logged against the uniform column
      if (phase == BatchSchedule::Round::kWarmup) {
        DECISION_RETURN_IF_ERROR(LearnWarmup(d, reward, propensities));
      } else {
        DECISION_RETURN_IF_ERROR(policy_->Learn(d, reward, propensities));
      }
      logged_rows_.push_back(row);
      logged_arms_.push_back(d.arm);
      if (!eligible.empty()) logged_eligible_.resize(logged_rows_.size());
      if (!logged_eligible_.empty()) logged_eligible_.back() = eligible;
      training_.Add(data_.row(row), d.arm, reward, d.propensity);
      total_reward += reward;
      result.progressive_loss.push_back(1.0 - total_reward / t);
      available_.resize(num_experts(), static_cast<size_t>(t - 1));
      if (progress) progress(t, result.progressive_loss.back());
    }
    if (!followed.empty()) result.late_expert_true_mean = late_sum / followed.size();
    result.num_experts = num_experts();
    for (int e = 0; e < num_experts(); ++e) {
      double mean = 0.0;
      for (int64_t t = 0; t < rounds; ++t) {
        const size_t row = order_[first + t];
        mean += cache_[e][row * k_ + data_.labels[row]];
      }
      result.true_means.push_back(mean / rounds);
    }
    BestAvailable(&result);
    if (ducb_ != nullptr) {
      for (int e = 0; e < num_experts(); ++e) {
        result.estimates.push_back(ducb_->ducb().Estimate(e));
        result.times_selected.push_back(ducb_->ducb().log().count(e));
      }
    }
    result.seconds = Since(start);
    return result;
  }

 private:
  int num_experts() const { return static_cast<int>(cache_.size()); }

  absl::Status MakePolicy() {
    const std::string& p = o_.policy;
    if (p == "d-ucb") {
      DECISION_ASSIGN_OR_RETURN(DUcb ducb, DUcb::Create(o_.estimator, 1));
      auto owned = std::make_unique<DUcbPolicy>(std::move(ducb));
      ducb_ = owned.get();
      policy_ = std::move(owned);
    } else if (p == "ucb1") {
      policy_ = MakeUcb1Policy(1);
    } else if (p == "epsilon-greedy") {
      DECISION_ASSIGN_OR_RETURN(policy_, MakeEpsilonGreedyPolicy(1, o_.epsilon));
    } else if (p == "exp4") {
      Exp4Options exp4;
      exp4.horizon = o_.max_rounds > 0 ? std::min<int64_t>(o_.max_rounds, order_.size())
                                       : static_cast<int64_t>(order_.size());
      DECISION_ASSIGN_OR_RETURN(policy_, MakeExp4Policy(1, exp4));
    } else if (p == "uniform") {
      policy_ = MakeUniformPolicy();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown policy `", p, "`"));
    }
    return absl::OkStatus();
  }

  // Warm-up rounds are attributed to the uniform expert. D-UCB learns them as samples of
  // expert 0; the other policies only count them (they are not the policy's choices).
  absl::Status LearnWarmup(const Decision& d, double reward,
                           absl::Span<const double> propensities) {
    if (ducb_ != nullptr) return policy_->Learn(d, reward, propensities);
    return absl::OkStatus();
  }

  absl::Status CacheExpert(const Expert& expert, double smoothing) {
    std::vector<double> probs(data_.size() * k_);
    DECISION_RETURN_IF_ERROR(
        expert.PredictBatch(data_.features, data_.size(), absl::MakeSpan(probs)));
    cache_.emplace_back(probs.begin(), probs.end());
    smoothing_.push_back(smoothing);
    return absl::OkStatus();
  }

  // This round's eligible arms (empty: every arm): the label and round(share * K) - 1
  // others, ascending.
  void DrawEligible(int label, std::vector<int32_t>* eligible) {
    eligible->clear();
    if (o_.eligible_share <= 0.0) return;
    const int m = std::max(1, static_cast<int>(std::lround(o_.eligible_share * k_)));
    if (m >= k_) return;
    std::vector<int32_t> others;
    for (int a = 0; a < k_; ++a) {
      if (a != label) others.push_back(a);
    }
    std::shuffle(others.begin(), others.end(), eligible_gen_);
    eligible->assign(others.begin(), others.begin() + (m - 1));
    eligible->push_back(label);
    std::sort(eligible->begin(), eligible->end());
  }

  // Expert e's distribution on `row` restricted to `eligible`, as the service computes it:
  // the cached (smoothed) distribution is un-smoothed, then RestrictToEligible.
  void Distribution(int e, int row, const std::vector<int32_t>& eligible,
                    absl::Span<double> out) const {
    const float* p = &cache_[e][static_cast<size_t>(row) * k_];
    if (eligible.empty()) {
      for (int v = 0; v < k_; ++v) out[v] = p[v];
      return;
    }
    const double eta = smoothing_[e];
    for (int v = 0; v < k_; ++v) out[v] = std::max(0.0, (p[v] - eta / k_) / (1.0 - eta));
    RestrictToEligible(eligible, eta, out);
  }

  // Expert e's probability of the label at logged round t, and whether the label is its
  // most likely arm.
  std::pair<double, bool> LabelProbability(int e, size_t t, std::vector<double>& probs) const {
    static const std::vector<int32_t> kAll;
    const int row = logged_rows_[t];
    Distribution(e, row, logged_eligible_.empty() ? kAll : logged_eligible_[t],
                 absl::MakeSpan(probs));
    const int label = data_.labels[row];
    return {probs[label], std::max_element(probs.begin(), probs.end()) - probs.begin() == label};
  }

  // SimulationResult::best_available_loss and best_available_argmax_loss, from the logged
  // rounds and the round from which each expert was available (available_).
  void BestAvailable(SimulationResult* result) const {
    const size_t rounds = logged_rows_.size();
    const int n = num_experts();
    std::vector<double> probs(k_);
    std::vector<double> mean(n, 0.0);
    std::vector<double> accuracy(n, 0.0);
    for (int e = 0; e < n; ++e) {
      for (size_t t = available_[e]; t < rounds; ++t) {
        const auto [p, hit] = LabelProbability(e, t, probs);
        mean[e] += p / static_cast<double>(rounds - available_[e]);
        accuracy[e] += hit / static_cast<double>(rounds - available_[e]);
      }
    }
    double reward = 0.0;
    double argmax_reward = 0.0;
    int best = 0;
    int best_argmax = 0;
    for (size_t t = 0, e = 0; t < rounds; ++t) {
      // Experts are registered in id order: those available at t are a prefix.
      for (; e < static_cast<size_t>(n) && available_[e] <= t; ++e) {
        if (mean[e] > mean[best]) best = static_cast<int>(e);
        if (accuracy[e] > accuracy[best_argmax]) best_argmax = static_cast<int>(e);
      }
      reward += LabelProbability(best, t, probs).first;
      argmax_reward += LabelProbability(best_argmax, t, probs).second;
    }
    result->best_available_loss = 1.0 - reward / static_cast<double>(rounds);
    result->best_available_argmax_loss = 1.0 - argmax_reward / static_cast<double>(rounds);
  }

  absl::Status AddTrainedExperts(int64_t t, SimulationResult* result) {
    // The uniform policy ignores experts: training them would only cost time.
    if (training_.TrainedOn(o_.objective) == 0 || o_.policy == "uniform") {
      return absl::OkStatus();
    }
    const auto train_start = Clock::now();
    const int old_n = num_experts();
    const int count = o_.tree_experts_per_batch + o_.linear_experts_per_batch;
    // As decisiond's trainer: the batch's experts train side by side on up to train_threads
    // threads, one XGBoost thread each, their recipes (and resamples) drawn in order first,
    // so a run's result does not depend on train_threads.
    std::vector<XgboostTrainOptions> recipes;
    std::vector<TrainingSet> resamples;
    for (int i = 0; i < count; ++i) {
      recipes.push_back(SampleExpertOptions(i >= o_.tree_experts_per_batch, 1, gen_));
      FitTreeRecipeToMemory(training_.num_features, kMaxTrainingHistogramBytes,
                            &recipes.back());
      FitRoundsToModelLimits(k_, XgboostModelLimits(), &recipes.back());
      recipes.back().objective = o_.objective;
      if (o_.bootstrap) resamples.push_back(Bootstrap(training_, o_.objective, gen_));
    }
    std::vector<absl::StatusOr<std::string>> models(static_cast<size_t>(count));
    auto train = [&](int i) {
      models[i] = TrainXgboostModel(o_.bootstrap ? resamples[i] : training_, k_, recipes[i]);
    };
    const int parallel = std::clamp(o_.train_threads, 1, std::max(count, 1));
    for (int first = 0; first < count; first += parallel) {
      std::vector<std::thread> threads;
      for (int i = first + 1; i < std::min(count, first + parallel); ++i) {
        threads.emplace_back(train, i);
      }
      train(first);
      for (std::thread& thread : threads) thread.join();
    }
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<std::string>& model = models[i];
      if (absl::IsFailedPrecondition(model.status())) {
        ++result->experts_rejected;  // diverged: skip this expert, keep the run going
        continue;
      }
      if (!model.ok()) return model.status();
      DECISION_ASSIGN_OR_RETURN(
          std::unique_ptr<Expert> expert,
          MakeXgboostExpert(k_, data_.num_features, *model, o_.smoothing));
      DECISION_RETURN_IF_ERROR(CacheExpert(*expert, o_.smoothing));
    }
    result->seconds_training += Since(train_start);
    const bool full = t >= o_.full_refresh_growth * last_full_refresh_;
    if (full) last_full_refresh_ = t;
    const auto div_start = Clock::now();
    DECISION_RETURN_IF_ERROR(AddToPolicy(old_n, full));
    result->seconds_divergences += Since(div_start);
    return absl::OkStatus();
  }

  // The fixed pool (SimulationOptions::pool_experts), trained on the held-back prefix with
  // full information; the prefix's contexts fill the divergence reservoir.
  absl::Status BuildPool(SimulationResult* result) {
    const auto train_start = Clock::now();
    TrainingSet prefix;
    prefix.num_features = data_.num_features;
    for (int64_t i = 0; i < o_.pool_prefix; ++i) {
      const int row = order_[i];
      prefix.Add(data_.row(row), data_.labels[row], 1.0, 1.0);
      reservoir_.Offer(std::vector<double>{double(row)}, {}, gen_);
    }
    std::vector<bool> good(o_.pool_experts, false);
    std::fill(good.begin(), good.begin() + o_.pool_good, true);
    std::shuffle(good.begin(), good.end(), gen_);
    for (bool g : good) {
      XgboostTrainOptions train;
      train.threads = 1;  // XGBoost's threads would change the models (histogram sums)
      train.seed = gen_();
      train.max_depth = g ? 4 : absl::Uniform<int>(absl::IntervalClosed, gen_, 1, 3);
      train.rounds = g ? 15 : absl::Uniform<int>(absl::IntervalClosed, gen_, 2, 6);
      const double share = g ? 0.5 : absl::Uniform<double>(gen_, 0.02, 0.10);
      DECISION_RETURN_IF_ERROR(
          TrainAndCache(Subsample(prefix, share), train, result, /*save=*/true));
    }
    result->seconds_training += Since(train_start);
    return absl::OkStatus();
  }

  // The late expert: stronger than the pool's good ones.
  absl::Status AddLateExpert(int64_t t, SimulationResult* result) {
    const auto train_start = Clock::now();
    TrainingSet prefix;
    prefix.num_features = data_.num_features;
    for (int64_t i = 0; i < o_.pool_prefix; ++i) {
      prefix.Add(data_.row(order_[i]), data_.labels[order_[i]], 1.0, 1.0);
    }
    XgboostTrainOptions train;
    train.threads = 1;  // as the pool's
    train.seed = gen_();
    train.max_depth = 8;
    train.rounds = 60;
    const int old_n = num_experts();
    DECISION_RETURN_IF_ERROR(TrainAndCache(prefix, train, result));
    if (num_experts() == old_n) return absl::InternalError("the late expert diverged");
    result->seconds_training += Since(train_start);
    return AddToPolicy(old_n, /*full=*/false);
  }

  // A random `share` of `set`'s rows (at least one per arm's worth, K), without
  // replacement.
  TrainingSet Subsample(const TrainingSet& set, double share) {
    std::vector<size_t> rows(set.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = i;
    std::shuffle(rows.begin(), rows.end(), gen_);
    const size_t m = std::min(
        rows.size(), std::max<size_t>(k_, static_cast<size_t>(share * rows.size())));
    TrainingSet out;
    out.num_features = set.num_features;
    for (size_t i = 0; i < m; ++i) out.AddFrom(set, rows[i]);
    return out;
  }

  absl::Status TrainAndCache(const TrainingSet& set, const XgboostTrainOptions& train,
                             SimulationResult* result, bool save = false) {
    absl::StatusOr<std::string> model = TrainXgboostModel(set, k_, train);
    if (absl::IsFailedPrecondition(model.status())) {
      ++result->experts_rejected;
      return absl::OkStatus();
    }
    if (!model.ok()) return model.status();
    if (save && !o_.save_pool.empty()) {
      char name[32];
      std::snprintf(name, sizeof(name), "/pool-%03d.ubj", num_experts());
      std::ofstream out(o_.save_pool + name, std::ios::binary);
      out.write(model->data(), static_cast<std::streamsize>(model->size()));
      if (!out) return absl::InternalError(absl::StrCat("cannot write ", o_.save_pool, name));
    }
    DECISION_ASSIGN_OR_RETURN(std::unique_ptr<Expert> expert,
                              MakeXgboostExpert(k_, data_.num_features, *model, o_.smoothing));
    return CacheExpert(*expert, o_.smoothing);
  }

  // Gives the policy experts [old_n, num_experts()), backfilled over the rounds played so
  // far; D-UCB also gets their divergences (all pairs again if `full`).
  absl::Status AddToPolicy(int old_n, bool full) {
    const int added = num_experts() - old_n;
    std::vector<std::vector<double>> backfill(added);
    std::vector<double> probs(k_);
    for (int i = 0; i < added; ++i) {
      const std::vector<float>& c = cache_[old_n + i];
      backfill[i].reserve(logged_rows_.size());
      for (size_t s = 0; s < logged_rows_.size(); ++s) {
        if (logged_eligible_.empty()) {
          backfill[i].push_back(c[static_cast<size_t>(logged_rows_[s]) * k_ + logged_arms_[s]]);
        } else {
          Distribution(old_n + i, logged_rows_[s], logged_eligible_[s], absl::MakeSpan(probs));
          backfill[i].push_back(probs[logged_arms_[s]]);
        }
      }
    }
    if (ducb_ == nullptr) return policy_->AddExperts(backfill);
    DivergenceMatrix d;
    DECISION_RETURN_IF_ERROR(Divergences(full ? 0 : old_n, &d));
    return ducb_->ducb().AddExperts(backfill, d);
  }

  // Divergences of all experts over the reservoir's rows, keeping the current estimates for
  // pairs among the first `keep` experts.
  absl::Status Divergences(int keep, DivergenceMatrix* out) {
    const size_t r = reservoir_.size();
    std::vector<std::vector<double>> predictions(num_experts());
    std::vector<double> probs(k_);
    for (int e = 0; e < num_experts(); ++e) {
      predictions[e].reserve(r * k_);
      for (size_t i = 0; i < r; ++i) {
        Distribution(e, static_cast<int>(reservoir_.contexts()[i]), reservoir_.eligible()[i],
                     absl::MakeSpan(probs));
        predictions[e].insert(predictions[e].end(), probs.begin(), probs.end());
      }
    }
    return ComputeDivergences(predictions, k_, o_.divergence.num_groups,
                              &ducb_->ducb().estimator().divergences(), keep, out);
  }

  const Dataset& data_;
  const std::vector<int>& order_;
  const SimulationOptions o_;
  const int k_;
  std::mt19937_64 gen_;
  std::mt19937_64 eligible_gen_;  // the eligible sets only: the same for every policy
  ContextReservoir reservoir_;  // holds row indices
  std::vector<std::vector<float>> cache_;  // [expert][row * K + arm], smoothed
  std::vector<double> smoothing_;          // per expert
  std::unique_ptr<Policy> policy_;
  DUcbPolicy* ducb_ = nullptr;
  TrainingSet training_;
  std::vector<int> logged_rows_;
  std::vector<size_t> available_;  // per expert: the first logged round it could decide
  std::vector<int> logged_arms_;
  std::vector<std::vector<int32_t>> logged_eligible_;  // per logged round; empty: never set
  int64_t last_full_refresh_ = 1;
};

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const Dataset& data, const std::vector<int>& order,
                                          const SimulationOptions& options,
                                          const ProgressFn& progress) {
  if (order.size() != data.size()) {
    return absl::InvalidArgumentError("the order does not cover the data set");
  }
  if (data.num_classes < 2) {
    return absl::InvalidArgumentError("a bandit problem needs at least 2 classes");
  }
  Simulation simulation(data, order, options);
  return simulation.Run(progress);
}

}  // namespace decision::bench
