// Rank 0's story of a run, on stdout.
#include "runtime/output/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "model/blas.hpp"
#include "model/phase_timer.hpp"
#include "model/simd.hpp"
#include "runtime/options/config_file.hpp"

namespace moe {

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, bytes < 10.0 && u > 0 ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return text;
}

std::string seconds_text(double seconds) {
  char text[32];
  if (seconds < 1.0) {
    std::snprintf(text, sizeof text, seconds < 0.01 ? "%.2f ms" : "%.0f ms", seconds * 1e3);
  } else if (seconds < 600.0) {
    std::snprintf(text, sizeof text, "%.1f s", seconds);
  } else {
    std::snprintf(text, sizeof text, "%.0f min %02.0f s", std::floor(seconds / 60.0),
                  std::fmod(seconds, 60.0));
  }
  return text;
}

void report_config(const RunConfig& cfg, const RunShape& s) {
  std::printf("moe_rt: %s on %d ranks (EP group %d, %d replicas), %d thread(s) per rank\n",
              cfg.model_name.c_str(), s.world_size, s.ep_size, s.world_size / s.ep_size, s.threads);
  std::printf("  ranks: %s\n", s.layout.c_str());
  std::printf("  %s; elementwise %s\n", blas_info().c_str(), simd_level_name(simd_level()));
  std::printf("  parameters: %zu replicated + %zu in experts\n", s.dense_params, s.expert_params);
  std::printf(
      "  memory per rank: about %s (parameters, gradients, AdamW %s; activations %s; "
      "data %s)\n",
      bytes_text(s.memory.total() + static_cast<double>(s.data_private_bytes)).c_str(),
      bytes_text(s.memory.param_bytes).c_str(), bytes_text(s.memory.act_bytes).c_str(),
      bytes_text(static_cast<double>(s.data_private_bytes)).c_str());
  if (s.data_mapped_bytes > 0) {
    // Page cache: one copy per node, filled as the ranks read, and reclaimable (see docs/data.md).
    std::printf("  data file: %.0f MiB mapped read-only, shared page cache (not per rank)\n",
                static_cast<double>(s.data_mapped_bytes) / 1048576.0);
  }
  std::printf("  data: %s\n", s.data.c_str());
  if (!s.val_data.empty()) {
    const std::string when =
        cfg.eval_every > 0 ? "every " + std::to_string(cfg.eval_every) + " steps and after the last"
                           : "after the last step";
    std::printf("  validation: %s; %d global batch(es), %s\n", s.val_data.c_str(), cfg.eval_batches,
                when.c_str());
  }
  std::printf("  statistics: %s\n", s.stats_path.empty() ? "(none)" : s.stats_path.c_str());
  if (cfg.resume_point.active()) {
    const ResumePoint& p = cfg.resume_point;
    std::printf("  resumed from: %s, after step %lld%s; steps %lld to %d\n",
                text_excerpt(p.checkpoint, kPathExcerptBytes).c_str(),
                static_cast<long long>(p.step),
                p.run_id.empty() ? "" : (" of run " + p.run_id).c_str(),
                static_cast<long long>(p.step + 1), cfg.steps - 1);
  }
  std::printf("  ------------------------------------------------------------\n");
  for (const RunConfigValue& v : run_config_values(cfg)) {
    std::printf("  %-22s %s\n", v.name.c_str(), text_excerpt(v.text, kPathExcerptBytes).c_str());
  }
  std::printf("  ------------------------------------------------------------\n");
  std::printf("%6s %9s %10s %9s %9s %8s %9s %8s %8s%s\n", "step", "loss", "bal_loss", "grad_norm",
              "lr", "ms", "tok/s", "max_viol", "eta",
              s.val_data.empty() ? "" : "  val_loss val_viol");
  std::fflush(stdout);
}

std::string eta_text(double seconds) {
  char text[32];
  const long long s = std::llround(std::max(seconds, 0.0));
  if (s < 60) {
    std::snprintf(text, sizeof text, "%llds", s);
  } else if (s < 3600) {
    std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  }
  return text;
}

void report_step(const StepRecord& r, double eta_seconds, bool val_column, const EvalRecord* eval) {
  std::printf("%6lld %9.4f %10.3e %9.4f %9.2e %8.1f %9.0f %8.3f %8s",
              static_cast<long long>(r.step), r.loss, r.balance_loss, r.grad_norm, r.lr,
              r.step_time_s * 1e3, r.tokens_per_s, r.worst_violation,
              eta_text(eta_seconds).c_str());
  if (eval != nullptr) {
    std::printf("  %8.4f %8.3f", eval->loss, eval->worst_violation);
  } else if (val_column) {
    std::printf("  %8s %8s", "", "");
  }
  std::printf("\n");
  std::fflush(stdout);
}

namespace {

// Phase, mean ms, slowest rank's ms, share of the step, straggler factor (slowest / mean).
void report_phases(const PhaseSummary& p) {
  if (p.mean_ms.empty() || p.step_ms <= 0) return;
  std::printf("\n  %-14s %9s %11s %7s %10s\n", "phase", "mean ms", "slowest ms", "share",
              "straggler");
  double accounted = 0;
  const int checkpoint = static_cast<int>(Phase::kCheckpoint);
  for (int i = 0; i < kNumPhases; ++i) {
    if (i == checkpoint) continue;  // between steps, outside the step's time: below
    accounted += p.mean_ms[i];
    std::printf("  %-14s %9.2f %11.2f %6.1f%% %10.2f\n", kPhaseNames[i], p.mean_ms[i], p.max_ms[i],
                100.0 * p.mean_ms[i] / p.step_ms,
                p.mean_ms[i] > 0 ? p.max_ms[i] / p.mean_ms[i] : 1.0);
  }
  // Each rank's phases lie within its step's time (the step's clock includes the statistics
  // append charged to it), and step_ms is the slowest rank's: a negative rest can only be the
  // rounding of the sums, never time, and is shown as 0.
  const double rest = std::max(0.0, p.step_ms - accounted);
  std::printf("  %-14s %9.2f %11s %6.1f%%   (waiting: collectives, slower ranks, CPU sharing)\n",
              "unaccounted", rest, "", 100.0 * rest / p.step_ms);
  std::printf("  %-14s %9.2f\n", "step", p.step_ms);
  if (p.mean_ms[checkpoint] > 0) {
    std::printf("  %-14s %9.2f %11.2f   per step, written between steps\n", "checkpoint",
                p.mean_ms[checkpoint], p.max_ms[checkpoint]);
  }
}

// The share of dispatched rows that crossed hosts over the whole run, in all and per layer.
void report_cross_host(const TrainSummary& s) {
  const size_t L = s.steps.back().cross_host_rows.size();
  std::vector<double> rows(L, 0.0), dispatched(L, 0.0), tokens(L, 0.0), selected(L, 0.0);
  for (const StepRecord& r : s.steps) {
    const size_t E = L > 0 ? r.expert_load.size() / L : 0;
    for (size_t l = 0; l < L && l < r.cross_host_rows.size(); ++l) {
      rows[l] += static_cast<double>(r.cross_host_rows[l]);
      tokens[l] += static_cast<double>(r.cross_host_tokens[l]);
      dispatched[l] += static_cast<double>(r.dispatch_rows[l]);
      for (size_t e = 0; e < E; ++e) selected[l] += static_cast<double>(r.expert_load[l * E + e]);
    }
  }
  // Rows per dispatched row; token copies per token (the selection's T·K assignments / K: a
  // token capacity's drops leave the tokens, not the rows, as they were).
  const double K = s.top_k;
  for (const auto& [what, crossed, total, per] :
       {std::tuple{"rows crossing hosts in dispatch", &rows, &dispatched, 1.0},
        std::tuple{"token copies crossing hosts (one per other host)", &tokens, &selected,
                   1.0 / K}}) {
    double all_crossed = 0, all_total = 0;
    std::string layers;
    for (size_t l = 0; l < L; ++l) {
      const double of = (*total)[l] * per;
      all_crossed += (*crossed)[l];
      all_total += of;
      char part[48];
      std::snprintf(part, sizeof part, "%s%zu: %.1f%%", layers.empty() ? "" : ", ", l,
                    of > 0 ? 100.0 * (*crossed)[l] / of : 0.0);
      layers += part;
    }
    std::printf("  %s: %.1f%% over the run (per layer: %s)\n", what,
                all_total > 0 ? 100.0 * all_crossed / all_total : 0.0, layers.c_str());
  }
}

// "3: 0.406, 4: 0.562": each top-k layer's value of `violation` [L].
std::string per_topk_layer(const TrainSummary& s, std::span<const double> violation) {
  std::string text;
  for (size_t l = 0; l < s.layer_modes.size() && l < violation.size(); ++l) {
    if (s.layer_modes[l] != RoutingMode::kTopK) continue;
    char part[48];
    std::snprintf(part, sizeof part, "%s%zu: %.3f", text.empty() ? "" : ", ", l, violation[l]);
    text += part;
  }
  return text;
}

// Σ dropped / Σ load (0 without load).
double drop_fraction(const std::vector<int64_t>& dropped, const std::vector<int64_t>& load) {
  int64_t d = 0, n = 0;
  for (int64_t x : dropped) d += x;
  for (int64_t x : load) n += x;
  return n > 0 ? static_cast<double>(d) / static_cast<double>(n) : 0.0;
}

// Each top-k layer's balance at the end: (max load − mean)/mean, 0 = balanced, E/K − 1 = every
// token's experts the same; and each shadow balancer's, as its own routing would have had it.
void report_final_balance(const TrainSummary& s) {
  const StepRecord& last = s.steps.back();
  const std::string balance = per_topk_layer(s, last.max_violation);
  if (balance.empty()) return;
  std::printf("  final load violation per top-k layer: %s\n", balance.c_str());
  const size_t L = last.max_violation.size();
  for (size_t r = 0; r < s.shadow_names.size(); ++r) {
    if (last.shadow_max_violation.size() < (r + 1) * L) break;
    const std::span<const double> shadow(&last.shadow_max_violation[r * L], L);
    std::printf("    shadow %s: %s\n", s.shadow_names[r].c_str(),
                per_topk_layer(s, shadow).c_str());
  }
}

// The last validation loss (and the first, when there were several), with the balance of the
// validation tokens' routing per top-k layer.
void report_validation(const TrainSummary& s) {
  if (s.evals.empty()) return;
  const EvalRecord& e = s.evals.back();
  std::printf("  validation loss %.4f after step %lld", e.loss, static_cast<long long>(e.step));
  if (s.evals.size() > 1) {
    std::printf(" (%.4f after step %lld)", s.evals.front().loss,
                static_cast<long long>(s.evals.front().step));
  }
  std::printf(", %lld tokens; load violation on them per top-k layer:",
              static_cast<long long>(e.tokens));
  for (size_t l = 0; l < s.layer_modes.size() && l < e.max_violation.size(); ++l) {
    if (s.layer_modes[l] == RoutingMode::kTopK) std::printf(" %zu: %.3f", l, e.max_violation[l]);
  }
  if (s.capacity_factor > 0) {
    std::printf("; %.2f%% of their assignments dropped",
                100.0 * drop_fraction(e.dropped, e.expert_load));
  }
  std::printf("\n");
}

// The token capacity's drops, over the run and at the last step.
void report_drops(const TrainSummary& s) {
  if (s.capacity_factor <= 0) return;
  std::vector<int64_t> dropped, load;
  for (const StepRecord& r : s.steps) {
    dropped.insert(dropped.end(), r.dropped.begin(), r.dropped.end());
    load.insert(load.end(), r.expert_load.begin(), r.expert_load.end());
  }
  const StepRecord& last = s.steps.back();
  std::printf(
      "  token capacity %g (%s): %.2f%% of the assignments dropped over the run, %.2f%% at the "
      "last step\n",
      s.capacity_factor, s.drop_policy.c_str(), 100.0 * drop_fraction(dropped, load),
      100.0 * drop_fraction(last.dropped, last.expert_load));
}

}  // namespace

std::string shell_quoted(const std::string& text) {
  const bool plain = !text.empty() && text.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789_-./+:@%=,") == std::string::npos;
  if (plain) return text;
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

void report_summary(const TrainSummary& s, const std::string& stats_path) {
  if (s.steps.empty()) return;
  const StepRecord& first = s.steps.front();
  const StepRecord& last = s.steps.back();
  // Throughput: the median over the steps after the first, which pays for warm-up.
  std::vector<double> tps;
  for (size_t i = s.steps.size() > 1 ? 1 : 0; i < s.steps.size(); ++i) {
    tps.push_back(s.steps[i].tokens_per_s);
  }
  std::sort(tps.begin(), tps.end());
  double seconds = 0;
  for (const StepRecord& r : s.steps) seconds += r.step_time_s;
  std::printf("\nsummary: %zu steps in %s, median %.0f tokens/s\n", s.steps.size(),
              seconds_text(seconds).c_str(), tps[tps.size() / 2]);
  if (s.peak_gflops > 0) {
    std::printf(
        "  model %.1f GFLOP/s = %.1f%% MFU of the measured sgemm peak (%.1f GFLOP/s on %d "
        "core%s)\n",
        s.model_gflops, 100.0 * s.model_gflops / s.peak_gflops, s.peak_gflops, s.peak_cores,
        s.peak_cores == 1 ? "" : "s");
  }
  if (s.peak_rss_max_mib > 0) {
    std::printf("  memory: peak resident %.1f MiB per rank (the largest; mean %.1f)\n",
                s.peak_rss_max_mib, s.peak_rss_mean_mib);
  }
  std::printf("  loss %.4f -> %.4f", first.loss, last.loss);
  if (s.entropy_floor >= 0) {
    std::printf(" (data floor %.4f nats: %.4f above it)", s.entropy_floor,
                last.loss - s.entropy_floor);
  }
  // The run's own first step: a resumed run starts after its checkpoint's.
  std::printf("\n  worst load violation: %.3f at step %lld, %.3f at the last step\n",
              first.worst_violation, static_cast<long long>(first.step), last.worst_violation);
  // One number for the parameters' bits: two runs of one configuration print the same on any
  // rank count and machine (docs/architecture.md, "Determinism").
  std::printf("  parameters after step %lld: digest %016llx\n", static_cast<long long>(s.last_step),
              static_cast<unsigned long long>(s.param_digest));
  report_final_balance(s);
  report_drops(s);
  report_validation(s);
  if (s.num_hosts > 1) report_cross_host(s);
  if (s.stats_removed) {
    std::printf(
        "  statistics file %s was removed (or replaced) during the run: this run's "
        "statistics were not kept\n",
        stats_path.c_str());
  } else if (!stats_path.empty()) {
    std::printf("  statistics written to %s\n", stats_path.c_str());
    // What to do with it next (docs/analysis.md): the figures go to a folder beside the file.
    const std::string quoted = shell_quoted(stats_path);
    std::string plots = stats_path;
    if (const size_t dot = plots.rfind('.');
        dot != std::string::npos && plots.find('/', dot) == std::string::npos) {
      plots.erase(dot);
    }
    std::printf("  next: python3 scripts/moe_stats.py summary %s\n", quoted.c_str());
    std::printf("        python3 scripts/moe_stats.py plot %s --out %s\n", quoted.c_str(),
                shell_quoted(plots + "-plots").c_str());
  }
  report_phases(s.phases);
  std::fflush(stdout);
}

}  // namespace moe
