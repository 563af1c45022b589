// The training run: its set-up (run_setup.hpp), the step loop over a Trainer
// (runtime/run/trainer.hpp) with evaluations, checkpoints and the ways a run ends, and the
// end-of-run phase summary and MFU figures.
#include "runtime/run/train.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/blas.hpp"
#include "model/model.hpp"
#include "runtime/output/report.hpp"
#include "runtime/run/run_setup.hpp"

namespace moe {
namespace {

// Rank 0: one line for a checkpoint written: its path, size and the time it took.
void report_checkpoint(const std::string& path, double seconds) {
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  std::printf("  checkpoint: %s (%s, %s)\n", path.c_str(),
              ec ? "size unknown" : bytes_text(static_cast<double>(bytes)).c_str(),
              seconds_text(seconds).c_str());
  std::fflush(stdout);
}

// Collective: whether rank 0 failed to write a statistics row (RunStats::failure). When it did,
// the run ends here: true, with the summary saying why (on rank 0).
bool stats_failed_agree(const RunStats* stats, const Comm& world, TrainSummary& summary) {
  if (stats == nullptr) return false;  // the same on every rank: --stats none or not
  std::vector<int> failed = {stats->failure().empty() ? 0 : 1};
  world.broadcast(std::span<int>(failed), 0);
  if (failed[0] == 0) return false;
  summary.end = RunEnd::kStatsFailed;
  summary.end_detail = stats->failure();
  return true;
}

// Gathers every rank's phase sums to rank 0 as per-step means and slowest-rank figures.
void summarize_phases(TrainSummary& summary, const Comm& world, const std::vector<double>& sums) {
  const size_t n = summary.steps.size() > 1 ? summary.steps.size() - 1 : summary.steps.size();
  if (n == 0) return;
  std::vector<double> all(world.rank() == 0 ? sums.size() * world.size() : 0);
  world.gather(std::span<const double>(sums), std::span<double>(all), 0);
  if (world.rank() != 0) return;
  PhaseSummary& ps = summary.phases;
  ps.mean_ms.assign(kNumPhases, 0.0);
  ps.max_ms.assign(kNumPhases, 0.0);
  for (int r = 0; r < world.size(); ++r) {
    for (int p = 0; p < kNumPhases; ++p) {
      const double ms = all[static_cast<size_t>(r) * kNumPhases + p] * 1e3 / n;
      ps.mean_ms[p] += ms / world.size();
      ps.max_ms[p] = std::max(ps.max_ms[p], ms);
    }
  }
  for (size_t i = summary.steps.size() - n; i < summary.steps.size(); ++i) {
    ps.step_ms += summary.steps[i].step_time_s * 1e3 / n;
  }
}

double median_tokens_per_s(const TrainSummary& s) {
  std::vector<double> tps;
  for (size_t i = s.steps.size() > 1 ? 1 : 0; i < s.steps.size(); ++i) {
    tps.push_back(s.steps[i].tokens_per_s);
  }
  if (tps.empty()) return 0.0;
  std::sort(tps.begin(), tps.end());
  return tps[tps.size() / 2];
}

// The MFU denominator: one core's sgemm rate on the model's LM-head shape, times the cores the
// job uses on its node(s). Rank 0 measures while the others wait in a barrier (Open MPI yields
// the core when oversubscribed).
void measure_sgemm_peak(TrainSummary& s, const RunConfig& cfg, const Comm& world, int node_ranks,
                        int threads) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int nodes = std::max(1, world.size() / node_ranks);
  s.peak_cores = std::min(cores, node_ranks * threads) * nodes;
  if (world.rank() == 0) {
    const ModelConfig& m = cfg.model;
    s.peak_gflops = blas_sgemm_gflops(m.seq_len, m.d_model, m.vocab, 0.3) * s.peak_cores;
  }
  world.barrier();
}

// Collective: the ranks' peak resident memory so far (ru_maxrss, KiB on Linux), largest and mean.
void measure_peak_memory(TrainSummary& s, const Comm& world) {
  rusage usage{};
  const double kib = getrusage(RUSAGE_SELF, &usage) == 0 ? static_cast<double>(usage.ru_maxrss) : 0;
  std::array<double, 1> max_kib{kib}, sum_kib{kib};
  world.allreduce_max(std::span<double>(max_kib));
  world.allreduce_sum(std::span<double>(sum_kib));
  s.peak_rss_max_mib = max_kib[0] / 1024;
  s.peak_rss_mean_mib = sum_kib[0] / 1024 / world.size();
}

// Whether the validation loss is measured after `step`: every --eval-every steps and after the
// last, unless the step went non-finite or a signal asks the run to stop at once.
bool eval_due(const RunConfig& cfg, const Trainer& trainer, int step) {
  return has_val_data(cfg) && !trainer.nonfinite() && trainer.stop_signal() == 0 &&
         (step + 1 == cfg.steps || (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0));
}

// Collective: the steps from the first (0 unless resuming) to --steps, or to the first that ends
// the run early (summary.end says how). Rank 0 prints a line per step unless `quiet`. Returns the
// phase sums over the steps after the first (the first alone when it is the only one).
std::vector<double> train_steps(const RunConfig& cfg, const Comm& world, RunSetup& run,
                                bool quiet) {
  Trainer& trainer = *run.trainer;
  TrainSummary& summary = run.summary;
  const int first_step = static_cast<int>(cfg.resume_point.step + 1);
  summary.steps.reserve(cfg.steps - first_step);
  std::vector<double> phase_sum(kNumPhases, 0.0);
  // The remaining time: the mean wall time of the steps after the first (which warms up), their
  // evaluations and checkpoints included, times the steps left.
  double since_first = 0.0, first_done = 0.0;
  for (int step = first_step; step < cfg.steps; ++step) {
    StepRecord rec = trainer.step(step);
    const EvalRecord* eval = nullptr;  // the validation loss of the model this step left
    if (eval_due(cfg, trainer, step)) {
      summary.evals.push_back(trainer.evaluate(step));
      eval = &summary.evals.back();
    }
    const double now = MPI_Wtime();
    if (step == first_step) first_done = now;
    since_first = now - first_done;
    const int done_after_first = step - first_step, left = cfg.steps - 1 - step;
    const double per_step = done_after_first > 0 ? since_first / done_after_first : rec.step_time_s;
    const bool logged = cfg.log_every <= 1 || step == first_step || left == 0 || eval != nullptr ||
                        (step + 1) % cfg.log_every == 0 || trainer.stop_signal() != 0 ||
                        trainer.nonfinite();
    if (world.rank() == 0 && !quiet && logged) {
      report_step(rec, per_step * left, has_val_data(cfg), eval);
    }
    if (step > first_step || cfg.steps - first_step == 1) {
      for (int p = 0; p < kNumPhases; ++p) phase_sum[p] += trainer.times().seconds[p];
    }
    summary.steps.push_back(std::move(rec));
    summary.last_step = step;
    if (trainer.nonfinite()) {
      summary.end = RunEnd::kNonFinite;
      summary.end_detail = trainer.locate_nonfinite();
      break;
    }
    if (trainer.stats_failed()) {
      summary.end = RunEnd::kStatsFailed;
      if (run.stats) summary.end_detail = run.stats->failure();
      break;
    }
    // No checkpoint after a statistics row rank 0 could not write: it would resume into a chain
    // of files with rows missing.
    const bool stop = trainer.stop_signal() != 0;
    if (checkpoint_due(cfg, step, stop)) {
      const double t0 = MPI_Wtime();
      if (stats_failed_agree(run.stats.get(), world, summary) ||
          !checkpoint_after(step, trainer, run.checkpoints, cfg, world, summary)) {
        break;
      }
      if (world.rank() == 0 && !quiet) report_checkpoint(summary.last_checkpoint, MPI_Wtime() - t0);
    }
    if (stop) {
      summary.end = RunEnd::kSignal;
      summary.stop_signal = trainer.stop_signal();
      break;
    }
  }
  return phase_sum;
}

}  // namespace

TrainSummary train_run(const RunConfig& cfg, const Comm& world, bool quiet, bool measure_peak) {
  RunSetup run = run_setup(cfg, world, quiet);
  const std::vector<double> phase_sum = train_steps(cfg, world, run, quiet);
  TrainSummary& summary = run.summary;
  // The last rows (of the final step and evaluation) have no next step to carry their failure.
  if (summary.end == RunEnd::kCompleted) stats_failed_agree(run.stats.get(), world, summary);
  if (!summary.steps.empty()) summary.param_digest = run.trainer->param_digest();
  summarize_phases(summary, world, phase_sum);
  summary.model_gflops =
      3.0 * model_forward_flops_per_token(cfg.model) * median_tokens_per_s(summary) * 1e-9;
  // A stopped run ends at once: mpirun may kill it a second after its signal.
  if (measure_peak && summary.end == RunEnd::kCompleted) {
    measure_peak_memory(summary, world);  // before the sgemm measurement's buffers
    measure_sgemm_peak(summary, cfg, world, run.node_ranks, run.threads);
  }
  if (run.stats) summary.stats_removed = !run.stats->close();
  return std::move(summary);
}

}  // namespace moe
