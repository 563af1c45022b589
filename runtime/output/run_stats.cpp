// RunStats: the statistics file and the gathers that feed it.
#include "runtime/output/run_stats.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "io/stats_path.hpp"
#include "model/balance.hpp"
#include "model/config.hpp"
#include "model/router.hpp"

namespace moe {
namespace {

// --stats naming one of the run's input files would replace that file with the statistics.
void refuse_input_file(const std::string& path, const RunConfig& cfg) {
  std::vector<std::pair<const char*, std::string>> inputs = {
      {"--config", cfg.config_path},
      {"--hash-table", cfg.routing.hash_table_path},
      {"--resume", cfg.resume_point.checkpoint}};
  for (const char* kind : {"tokens:", "text:"}) {
    if (cfg.data.starts_with(kind)) {
      inputs.emplace_back("--data", cfg.data.substr(std::strlen(kind)));
    }
    if (cfg.val_data.starts_with(kind)) {
      inputs.emplace_back("--val-data", cfg.val_data.substr(std::strlen(kind)));
    }
  }
  for (const auto& [option, input] : inputs) {
    std::error_code ec;  // either file missing: not the same file (and no error here)
    if (!input.empty() && std::filesystem::equivalent(path, input, ec)) {
      throw StatsPathError("statistics file '" + path + "': is the " + option + " file '" + input +
                           "'; choose another --stats");
    }
  }
}

// The empty file stats_default_path reserved, once the run that reserved it gave up the name.
void drop_reservation(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) == 0 && !ec) std::filesystem::remove(path, ec);
}

// Rank 0's choice of the file's path: --stats (checked: not the resumed run's file, not one of
// the run's inputs, replaceable only with --overwrite), else a new name reserved under runs/.
struct StatsPathChoice {
  std::string path;
  bool reserved = false;   // a name stats_default_path reserved
  bool overwrite = false;  // the writer may replace a file at the path
};
StatsPathChoice stats_path_choose(const RunConfig& cfg) {
  StatsPathChoice c;
  c.overwrite = cfg.overwrite;
  if (cfg.stats_path.empty()) {
    c.path = stats_default_path("runs", cfg.model_name);  // reserves a fresh name
    c.reserved = true;
    c.overwrite = true;
    return c;
  }
  c.path = cfg.stats_path;
  const std::string& previous = cfg.resume_point.stats_path;
  std::error_code ec;
  if (!previous.empty() && std::filesystem::equivalent(c.path, previous, ec)) {
    throw StatsPathError("statistics file '" + c.path + "' is the file of the run being " +
                         "resumed, which the new file continues (its rows are kept and " +
                         "chained): choose another --stats, or leave it out for a new name");
  }
  refuse_input_file(c.path, cfg);
  StatsWriter::check_path(c.path, c.overwrite);
  return c;
}

// The file's header: the configuration as run (with the file's path), the run's shape and
// hosts, each layer's routing and the hash tables, what it trains on, and its lineage.
StatsHeader stats_header(const RunConfig& cfg, const std::string& path, int world_size, int ep_size,
                         const HostLayout& hosts, const RoutingState& routing,
                         const ModelPlacement& placement, const std::string& data_description,
                         const std::string& val_data_description, double entropy_floor,
                         const std::string& run_id) {
  const ModelConfig& m = cfg.model;
  StatsHeader h;
  h.model = cfg.model_name;
  RunConfig resolved = cfg;
  resolved.stats_path = path;
  h.config_text = run_config_to_text(resolved);
  for (const RunConfigValue& v : run_config_values(resolved)) {
    h.config_values.push_back({v.name, v.text, v.kind});
  }
  h.program_version = std::string("moe_rt ") + MOE_RT_VERSION;
  h.data_description = data_description;
  h.created = stats_now_iso8601();
  h.world_size = world_size;
  h.ep_size = ep_size;
  h.rank_host.assign(hosts.host_of_rank.begin(), hosts.host_of_rank.end());
  // [L, P, E]: which EP rank holds which experts (--expert-placement, else contiguous blocks).
  h.placement.assign(static_cast<size_t>(m.layers) * ep_size * m.experts, 0);
  for (int l = 0; l < m.layers; ++l) {
    for (int q = 0; q < ep_size; ++q) {
      for (int i = 0; i < placement[l].num_local(q); ++i) {
        h.placement[(static_cast<size_t>(l) * ep_size + q) * m.experts +
                    placement[l].expert(q, i)] = 1;
      }
    }
  }
  h.num_layers = m.layers;
  h.num_experts = m.experts;
  h.top_k = m.top_k;
  h.vocab = m.vocab;
  h.hash_layers = m.hash_layers;
  h.seq_len = m.seq_len;
  h.batch_per_rank = m.batch_per_rank;
  h.seed = cfg.seed;
  if (entropy_floor >= 0) h.entropy_floor = entropy_floor;
  for (RoutingMode mode : routing.modes) h.layer_routing.emplace_back(routing_mode_name(mode));
  h.hash_tables = routing.hash_tables;
  for (const ShadowRule& rule : routing.config.shadows)
    h.shadow_rules.push_back(shadow_rule_name(rule));
  h.phase_names.assign(kPhaseNames.begin(), kPhaseNames.end());
  h.trace_tokens = cfg.trace_every > 0 ? world_size * m.batch_per_rank * m.seq_len : 0;
  h.eval = has_val_data(cfg);
  h.val_data_description = val_data_description;
  h.resumed_from = cfg.resume_point.stats_path;
  h.resumed_from_step = cfg.resume_point.step;
  h.run_id = run_id;
  h.resumed_from_run = cfg.resume_point.run_id;
  return h;
}

}  // namespace

RunStats::RunStats(const RunConfig& cfg, int rank, int world_size, int ep_size,
                   const HostLayout& hosts, const RoutingState& routing,
                   const ModelPlacement& placement, const std::string& data_description,
                   const std::string& val_data_description, double entropy_floor,
                   const std::string& run_id)
    : rank_(rank),
      world_size_(world_size),
      layers_(cfg.model.layers),
      top_k_(cfg.model.top_k),
      trace_every_(cfg.trace_every),
      experts_(cfg.model.experts),
      routing_(routing.config),
      modes_(routing.modes) {
  if (rank != 0) return;
  const StatsPathChoice choice = stats_path_choose(cfg);
  path_ = choice.path;
  reserved_ = choice.reserved;
  try {
    writer_ = std::make_unique<StatsWriter>(
        path_, choice.overwrite,
        stats_header(cfg, path_, world_size, ep_size, hosts, routing, placement, data_description,
                     val_data_description, entropy_floor, run_id));
  } catch (...) {
    if (reserved_) drop_reservation(path_);
    throw;
  }
}

RunStats::~RunStats() {
  writer_.reset();  // unpublished, it removes its staging file
  if (reserved_ && !published_) drop_reservation(path_);
}

void RunStats::publish() {
  if (!writer_) return;
  writer_->publish();
  published_ = true;
  // A run with a name of its own under runs/ is the newest there: runs/latest.h5 follows it.
  if (reserved_) {
    const std::string problem = stats_link_latest(path_);
    if (!problem.empty()) std::fprintf(stderr, "warning: %s\n", problem.c_str());
  }
}

bool RunStats::close() {
  if (!writer_) return true;
  try {
    writer_->close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: closing statistics file '%s' failed: %s\n", path_.c_str(),
                 e.what());
  }
  return !writer_->removed();
}

template <class F> void RunStats::append_row(const std::string& row, F&& append) {
  if (!failure_.empty()) return;
  try {
    append();
  } catch (const std::exception& e) {
    failure_ = "statistics file '" + path_ + "': writing " + row + " failed: " + e.what();
  }
}

void RunStats::record_step(const StepRecord& rec, std::span<const double> phase_all) {
  if (rank_ != 0 || !failure_.empty()) return;
  StepRow row;
  row.step = rec.step;
  row.loss = rec.loss;
  row.balance_loss = rec.balance_loss;
  row.grad_norm = rec.grad_norm;
  row.lr = rec.lr;
  row.tokens_per_s = rec.tokens_per_s;
  row.step_time_s = rec.step_time_s;
  row.expert_load = rec.expert_load;
  row.rank_load = rec.rank_load;
  row.dispatch_rows = rec.dispatch_rows;
  row.cross_host_rows = rec.cross_host_rows;
  row.cross_host_tokens = rec.cross_host_tokens;
  row.bias = rec.bias;
  row.load_variance = rec.load_variance;
  row.max_violation = rec.max_violation;
  row.load_cv = rec.load_cv;
  row.rank_overload = rec.rank_overload;
  row.layer_balance_loss = rec.layer_balance_loss;
  row.z_loss = rec.z_loss;
  row.layer_z_loss = rec.layer_z_loss;
  row.shadow_load = rec.shadow_load;
  row.shadow_bias = rec.shadow_bias;
  row.shadow_max_violation = rec.shadow_max_violation;
  row.dropped = rec.dropped;
  row.source_expert_load = rec.source_load;
  row.phase_times = phase_all;
  append_row("the row of step " + std::to_string(rec.step), [&] { writer_->append(row); });
}

void RunStats::record_eval(const EvalRecord& rec) {
  if (rank_ != 0 || !failure_.empty()) return;
  EvalRow row;
  row.step = rec.step;
  row.loss = rec.loss;
  row.time_s = rec.time_s;
  row.tokens = rec.tokens;
  row.expert_load = rec.expert_load;
  row.load_variance = rec.load_variance;
  row.max_violation = rec.max_violation;
  row.dropped = rec.dropped;
  append_row("the validation row of step " + std::to_string(rec.step),
             [&] { writer_->append_eval(row); });
}

void RunStats::record_trace(const Comm& world, int64_t step, const ModelActs<float>& acts,
                            const std::vector<int32_t>& tokens, int seq_len) {
  pack_trace(acts, tokens, seq_len);
  if (rank_ == 0) {
    trace_all_.resize(trace_local_.size() * world_size_);
    weights_all_.resize(weights_local_.size() * world_size_);
  }
  world.gather(std::span<const int32_t>(trace_local_), std::span<int32_t>(trace_all_), 0);
  world.gather(std::span<const float>(weights_local_), std::span<float>(weights_all_), 0);
  if (rank_ != 0 || !failure_.empty()) return;
  unpack_trace(static_cast<int>(tokens.size()));
  TraceRow row;
  row.step = step;
  row.token_id = t_ids_;
  row.position = t_pos_;
  row.rank = t_rank_;
  row.experts = t_experts_;
  row.weights = t_weights_;
  row.experts_unbiased = t_unbiased_;
  append_row("the routing trace of step " + std::to_string(step),
             [&] { writer_->append_trace(row); });
}

void RunStats::pack_trace(const ModelActs<float>& acts, const std::vector<int32_t>& tokens,
                          int seq_len) {
  // Per rank, packed: token ids [N], positions [N], experts [L, N, K], the unbiased top-k
  // [L, N, K]; weights [L, N, K].
  const int N = static_cast<int>(tokens.size()), L = layers_, K = top_k_;
  const size_t NK = static_cast<size_t>(N) * K;
  trace_local_.resize(2 * static_cast<size_t>(N) + 2 * L * NK);
  weights_local_.resize(L * NK);
  std::copy(tokens.begin(), tokens.end(), trace_local_.begin());
  for (int t = 0; t < N; ++t) trace_local_[N + t] = t % seq_len;
  int32_t* unbiased = trace_local_.data() + 2 * N + L * NK;
  for (int l = 0; l < L; ++l) {
    const MoeSaved<float>& m = acts.moe[l];
    std::copy_n(m.expert_idx.begin(), NK, trace_local_.begin() + 2 * N + l * NK);
    std::copy_n(m.weights.begin(), NK, weights_local_.begin() + l * NK);
    // The choice without the bias, from the same scores: where bias and choice part ways.
    int32_t* dst = unbiased + l * NK;
    if (modes_[l] != RoutingMode::kTopK) {
      std::copy_n(m.expert_idx.begin(), NK, dst);
    } else {
      route_topk_grouped(dst, m.scores.data(), nullptr, N, experts_, K, routing_.routing_groups,
                         routing_.group_topk);
    }
  }
}

void RunStats::unpack_trace(int N) {
  // Rank-major blocks to the file's token-major layout: global token r·N + t.
  const int L = layers_, K = top_k_, W = world_size_;
  const size_t NK = static_cast<size_t>(N) * K;
  const size_t T = static_cast<size_t>(W) * N;
  t_ids_.resize(T);
  t_pos_.resize(T);
  t_rank_.resize(T);
  t_experts_.resize(L * T * K);
  t_unbiased_.resize(L * T * K);
  t_weights_.resize(L * T * K);
  for (int r = 0; r < W; ++r) {
    const int32_t* block = &trace_all_[r * trace_local_.size()];
    const float* wblock = &weights_all_[r * weights_local_.size()];
    for (int t = 0; t < N; ++t) {
      const size_t g = static_cast<size_t>(r) * N + t;
      t_ids_[g] = block[t];
      t_pos_[g] = block[N + t];
      t_rank_[g] = r;
    }
    for (int l = 0; l < L; ++l) {
      const size_t at = (l * T + static_cast<size_t>(r) * N) * K;
      std::copy_n(block + 2 * N + l * NK, NK, &t_experts_[at]);
      std::copy_n(block + 2 * N + (L + l) * NK, NK, &t_unbiased_[at]);
      std::copy_n(wblock + l * NK, NK, &t_weights_[at]);
    }
  }
}

}  // namespace moe
