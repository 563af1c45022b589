// A run's checkpoints: its identity, folder and header (checkpoint_plan_make), the write after a
// step (checkpoint_after), and checkpoint_save and checkpoint_load, a Trainer's state to and from
// a checkpoint file. Datasets: param/<tensor>, adam_m/<tensor>, adam_v/<tensor> for every tensor
// of both arenas (expert tensors "layers.<l>.moe.experts.<global id>.w1|w3|w2"), routing/bias
// [L·E] (flat), routing/hash_tables [L_h, V, K] and, with --shadow, routing/shadow_bias [R·L·E].
// docs/checkpoints.md.
#include "runtime/run/checkpoint.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "io/stats_path.hpp"
#include "model/router.hpp"
#include "runtime/options/config_file.hpp"
#include "runtime/run/trainer.hpp"

namespace moe {
namespace {

constexpr std::array<const char*, 3> kArrays = {"param/", "adam_m/", "adam_v/"};

// Writes the tensors of `layout` from the three arrays at `base` (parameters, m, v), but not
// those in `written` (a replicated expert's, written from its first holder), which it extends.
void write_arena(CheckpointWriter& w, const ParamLayout& layout,
                 const std::array<const float*, 3>& base, std::set<std::string>& written) {
  std::vector<const ParamEntry*> fresh;
  for (const ParamEntry& e : layout.entries) {
    if (written.insert(e.name).second) fresh.push_back(&e);
  }
  for (int a = 0; a < 3; ++a) {
    for (const ParamEntry* e : fresh) {
      w.write_floats(kArrays[a] + e->name, std::span<const float>(base[a] + e->offset, e->count));
    }
  }
}

void read_arena(const CheckpointReader& r, const ParamLayout& layout,
                const std::array<std::span<float>, 3>& arrays) {
  for (int a = 0; a < 3; ++a) {
    for (const ParamEntry& e : layout.entries) {
      r.read_floats(kArrays[a] + e.name, arrays[a].subspan(e.offset, e.count));
    }
  }
}

// Rank 0's part: the header, the dense arena, every EP rank's experts from `gathered` (the three
// arrays one after the other, each [all experts of EP group 0] in EP rank order), the routing.
void write_file(const std::string& path, const CheckpointHeader& h, const TrainState& s,
                const std::vector<float>& gathered, const std::vector<int>& displs) {
  const ModelConfig& mc = *s.model;
  CheckpointWriter w(path, h);
  std::set<std::string> written;
  write_arena(w, s.layout->dense, {s.dense.data(), s.dense_m.data(), s.dense_v.data()}, written);
  const size_t total = gathered.size() / 3;
  for (int q = 0; q < s.placement.front().ep_size; ++q) {
    const ParamLayout experts = model_layout(mc, s.placement, q).experts;
    const float* base = gathered.data() + displs[q];
    write_arena(w, experts, {base, base + total, base + 2 * total}, written);
  }
  const RoutingState& rs = *s.routing;
  w.write_floats("routing/bias", rs.bias);
  if (!rs.shadow_bias.empty()) w.write_floats("routing/shadow_bias", rs.shadow_bias);
  w.write_ints("routing/hash_tables",
               {hsize_t(mc.hash_layers), hsize_t(mc.vocab), hsize_t(mc.top_k)}, rs.hash_tables);
  w.commit();
}

}  // namespace

RunIdentity run_identity_make(const RunConfig& cfg) {
  RunIdentity r;
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device();
  char id[17];
  std::snprintf(id, sizeof id, "%016" PRIx64, bits);
  r.id = id;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  r.started = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  const ResumePoint& p = cfg.resume_point;
  if (p.active()) {
    r.lineage =
        p.lineage + (p.lineage.empty() ? "" : ";") + p.run_id + "@" + std::to_string(p.step);
  }
  return r;
}

CheckpointPlan checkpoint_plan_make(const RunConfig& cfg, int world_size, int ep_size,
                                    const std::string& stats_path,
                                    const std::string& data_description, const RunIdentity& run) {
  CheckpointPlan plan;
  if (cfg.checkpoint_every == 0) return plan;
  namespace fs = std::filesystem;
  fs::path dir = cfg.checkpoint_dir;
  if (dir.empty() && cfg.resume_point.active()) {
    dir = fs::path(cfg.resume_point.checkpoint).parent_path();
    if (dir.empty()) dir = ".";
  }
  if (dir.empty()) {
    fs::path stem = stats_path;
    dir = stem.replace_extension().string() + "-checkpoints";
  }
  std::error_code ec;
  if (!stats_path.empty() && fs::absolute(dir, ec) == fs::absolute(stats_path, ec)) {
    throw CheckpointError("--checkpoint-dir '" + dir.string() +
                          "' is the statistics file's path; choose another folder or --stats");
  }
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  plan.lock = CheckpointFolderLock(dir.string(), "run " + run.id + ", process " +
                                                     std::to_string(::getpid()) + " on " + host +
                                                     ", started " + stats_now_iso8601());
  plan.dir = dir.string();
  int64_t others = 0;
  for (const CheckpointEntry& e : checkpoint_catalog(plan.dir)) {
    others += checkpoint_on_branch(e, run.id, run.lineage) ? 0 : 1;
  }
  if (others > 0) {
    plan.note = "checkpoint folder '" + plan.dir + "' also holds " + std::to_string(others) +
                " checkpoint(s) of other runs or branches: they are kept, and --resume of the " +
                "folder continues this run";
  }

  CheckpointHeader& h = plan.header;
  RunConfig resolved = cfg;
  resolved.lr_decay_steps = lr_horizon(cfg);
  if (!stats_path.empty()) h.stats_path = fs::absolute(stats_path, ec).string();
  resolved.stats_path = stats_path.empty() ? kNoStats : h.stats_path;
  h.config_text = run_config_to_text(resolved);
  h.global_batch = static_cast<int64_t>(world_size) * cfg.model.batch_per_rank;
  h.world_size = world_size;
  h.ep_size = ep_size;
  h.seed = cfg.seed;
  h.model = cfg.model_name;
  h.program_version = std::string("moe_rt ") + MOE_RT_VERSION;
  h.data_description = data_description;
  h.run_id = run.id;
  h.run_started = run.started;
  h.lineage = run.lineage;
  return plan;
}

bool checkpoint_due(const RunConfig& cfg, int step, bool stop) {
  return cfg.checkpoint_every > 0 &&
         (stop || step + 1 == cfg.steps || (step + 1) % cfg.checkpoint_every == 0);
}

bool checkpoint_after(int step, Trainer& trainer, CheckpointPlan& plan, const RunConfig& cfg,
                      const Comm& world, TrainSummary& summary) {
  const double t0 = MPI_Wtime();
  std::string path;
  if (world.rank() == 0) {
    path = checkpoint_path_for(plan.dir, step, plan.header.run_id);
    plan.header.step = step;
    plan.header.created = stats_now_iso8601();
  }
  trainer.gather_optimizer_state();
  try {
    checkpoint_save(path, plan.header, trainer.state(), world);
  } catch (const CheckpointError& e) {
    summary.end = RunEnd::kCheckpointFailed;
    summary.end_detail = e.what();
    return false;
  }
  if (world.rank() == 0) {
    summary.last_checkpoint = path;
    for (const std::string& w : checkpoint_prune(plan.dir, cfg.keep_checkpoints, plan.header.run_id,
                                                 plan.header.lineage)) {
      std::fprintf(stderr, "moe_rt: warning: %s\n", w.c_str());
    }
  }
  trainer.charge_checkpoint(MPI_Wtime() - t0);
  return true;
}

void checkpoint_save(const std::string& path, const CheckpointHeader& h, const TrainState& s,
                     const Comm& world) {
  // EP group 0 (world rank 0 is its EP rank 0): its members hold every expert, a replicated one
  // on several of them (write_file writes it once, from its first holder).
  const int P = s.placement.front().ep_size;
  std::vector<float> gathered;
  std::vector<int> counts, displs;
  if (s.ep_group == 0) {
    // Sizes per EP rank, from the layouts rank 0 can compute for any EP rank.
    if (world.rank() == 0) {
      counts.resize(P);
      displs.resize(P);
      int offset = 0;
      for (int q = 0; q < P; ++q) {
        counts[q] = static_cast<int>(model_layout(*s.model, s.placement, q).experts.num_elements);
        displs[q] = offset;
        offset += counts[q];
      }
      gathered.resize(3 * static_cast<size_t>(offset));
    }
    const size_t total = gathered.size() / 3;
    const std::span<float> all(gathered);
    for (int a = 0; a < 3; ++a) {
      const std::span<float> local = a == 0 ? s.experts : a == 1 ? s.experts_m : s.experts_v;
      s.ep->gatherv(std::span<const float>(local),
                    world.rank() == 0 ? all.subspan(a * total, total) : std::span<float>(),
                    std::span<const int>(counts), std::span<const int>(displs), 0);
    }
  }
  std::string error;
  if (world.rank() == 0) {
    try {
      write_file(path, h, s, gathered, displs);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  std::vector<int> failed = {error.empty() ? 0 : 1};
  world.broadcast(std::span<int>(failed), 0);
  if (failed[0] == 0) return;
  throw CheckpointError(world.rank() == 0 ? error
                                          : "rank 0 failed to write checkpoint '" + path + "'");
}

void checkpoint_load(const CheckpointReader& r, const TrainState& s) {
  read_arena(r, s.layout->dense, {s.dense, s.dense_m, s.dense_v});
  read_arena(r, s.layout->experts, {s.experts, s.experts_m, s.experts_v});
  r.read_floats("routing/bias", s.routing->bias);
  if (!s.routing->shadow_bias.empty()) r.read_floats("routing/shadow_bias", s.routing->shadow_bias);
  r.read_ints("routing/hash_tables", s.routing->hash_tables);
  // The checksums say the bytes are those written; what they say is checked as a file reader
  // checks its input, before the run replaces anything (its statistics file included).
  auto fail = [&](const std::string& problem) {
    throw CheckpointError("checkpoint '" + r.path() + "': " + problem);
  };
  const std::array<const char*, 3> kinds = {"parameter", "AdamW first moment",
                                            "AdamW second moment"};
  for (const auto& [layout, arrays] :
       {std::pair{s.layout->dense, std::array{s.dense, s.dense_m, s.dense_v}},
        std::pair{s.layout->experts, std::array{s.experts, s.experts_m, s.experts_v}}}) {
    for (int a = 0; a < 3; ++a) {
      for (const ParamEntry& e : layout.entries) {
        const std::span<const float> values = arrays[a].subspan(e.offset, e.count);
        const auto bad = std::find_if(values.begin(), values.end(), [a](float v) {
          return !std::isfinite(v) || (a == 2 && v < 0.0f);  // v is a mean of squares
        });
        if (bad != values.end()) {
          fail(std::string(kArrays[a]) + e.name + " holds " +
               (a == 2 && std::isfinite(*bad) ? "a negative" : "a non-finite") + " " + kinds[a] +
               " (" + std::to_string(*bad) + " at element " + std::to_string(bad - values.begin()) +
               ")");
        }
      }
    }
  }
  for (const auto& [name, bias] : {std::pair{"routing/bias", &s.routing->bias},
                                   std::pair{"routing/shadow_bias", &s.routing->shadow_bias}}) {
    if (const auto bad =
            std::find_if(bias->begin(), bias->end(), [](float v) { return !std::isfinite(v); });
        bad != bias->end()) {
      fail(std::string(name) + " holds a non-finite value at element " +
           std::to_string(bad - bias->begin()));
    }
  }
  const ModelConfig& mc = *s.model;
  const size_t table = static_cast<size_t>(mc.vocab) * mc.top_k;
  for (int l = 0; l < mc.hash_layers; ++l) {
    try {
      hash_table_validate(&s.routing->hash_tables[l * table], mc.vocab, mc.experts, mc.top_k);
    } catch (const std::exception& e) {
      fail("routing/hash_tables, layer " + std::to_string(l) + ": " + e.what());
    }
  }
}

}  // namespace moe
