// The training run: set-up that all ranks agree on before the first collective, the step loop over
// a Trainer (runtime/trainer.hpp), and the end-of-run phase summary and MFU figures.
#include "runtime/train.hpp"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>

#include "comm/host_layout.hpp"
#include "io/checkpoint_file.hpp"
#include "io/hash_table_file.hpp"
#include "io/stats_path.hpp"
#include "io/synthetic_data.hpp"
#include "io/token_data.hpp"
#include "io/token_source.hpp"
#include "model/balance.hpp"
#include "model/blas.hpp"
#include "model/gemm/gemm.hpp"
#include "model/model.hpp"
#include "model/router.hpp"
#include "model/simd.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/config_file.hpp"
#include "runtime/report.hpp"
#include "runtime/run_stats.hpp"
#include "runtime/trainer.hpp"

namespace moe {
namespace {

// --threads, else the cores this process may run on (mpirun may bind it to fewer than the node
// has) shared among the ranks of its node, at least 1.
int resolve_threads(const RunConfig& cfg, int node_ranks) {
  if (cfg.threads > 0) return cfg.threads;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) cores = std::max(1, CPU_COUNT(&mask));
  return std::max(1, cores / node_ranks);
}

std::string gib_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

// Refuses, before anything is allocated, a model that cannot run here: a tensor of 2^31 elements
// or more (BLAS and the kernels index with int), or ranks that together need more than their
// node's physical memory (model_memory_estimate, plus `data_bytes`: what the data source keeps in
// each rank's own memory once open; a mapped data file is page cache and not counted, see
// TokenSource::mapped_bytes). Without it such sizes hang in set-up loops, die of the out-of-memory
// killer, or abort every rank with bad_alloc.
// The physical memory is the node's: a cgroup limit (a container, a Slurm allocation) lower than
// it is not seen, and a run over that limit is still killed by the system.
void memory_check(const ModelMemory& m, int node_ranks, double data_bytes = 0) {
  const char* options =
      "--vocab, --d-model, --layers, --experts, --ffn-dim, --seq-len or --batch-per-rank";
  if (m.max_tensor >= 2147483648.0) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", m.max_tensor);
    throw ConfigError(std::string("the model's ") + m.max_tensor_name + " would have " + count +
                      " elements, more than the 2^31 - 1 the kernels can index");
  }
  const double node_bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double rank_bytes = m.total() + data_bytes;
  if (node_bytes > 0 && rank_bytes * node_ranks > node_bytes) {
    const std::string data = data_bytes > 0 ? ", data source " + gib_text(data_bytes) : "";
    throw ConfigError("the model needs about " + gib_text(rank_bytes) + " per rank (parameters, " +
                      "gradients and AdamW state " + gib_text(m.param_bytes) + ", activations " +
                      gib_text(m.act_bytes) + data + "); the " + std::to_string(node_ranks) +
                      " rank(s) on this node would need " + gib_text(rank_bytes * node_ranks) +
                      ", more than its " + gib_text(node_bytes) + ": reduce " + options +
                      ", raise --ep (fewer experts per rank), or spread the ranks over more "
                      "nodes");
  }
}

// This run's identity in its checkpoints and statistics file (rank 0): a random id, new for every
// start and every resume, and when it started. Neither touches the run's arithmetic.
struct RunIdentity {
  std::string id;       // 16 hex digits
  int64_t started = 0;  // ns since the Unix epoch
  std::string lineage;  // the runs it continues (CheckpointHeader::lineage)
};

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

// The checkpoint folder (rank 0): --checkpoint-dir; when resuming, the resumed checkpoint's
// folder, so that checkpoints of one run stay together; else beside the statistics file,
// "<stats file without .h5>-checkpoints". Created and locked here (one live run per folder);
// "" when checkpointing is off. `note` gets a sentence when the folder holds checkpoints of
// other branches, which this run keeps.
std::string checkpoint_dir_prepare(const RunConfig& cfg, const std::string& stats_path,
                                   const RunIdentity& run, CheckpointFolderLock& lock,
                                   std::string& note) {
  if (cfg.checkpoint_every == 0) return "";
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
  lock = CheckpointFolderLock(dir.string(), "run " + run.id + ", process " +
                                                std::to_string(::getpid()) + " on " + host +
                                                ", started " + stats_now_iso8601());
  int64_t others = 0;
  for (const CheckpointEntry& e : checkpoint_catalog(dir.string())) {
    others += checkpoint_on_branch(e, run.id, run.lineage) ? 0 : 1;
  }
  if (others > 0) {
    note = "checkpoint folder '" + dir.string() + "' also holds " + std::to_string(others) +
           " checkpoint(s) of other runs or branches: they are kept, and --resume of the folder "
           "continues this run";
  }
  return dir.string();
}

// The header every checkpoint of this run shares (its step and time are set per write). The
// configuration is written with the schedule's horizon resolved, so that a resumed run that
// extends --steps keeps the schedule it started with.
CheckpointHeader checkpoint_header(const RunConfig& cfg, int W, int P,
                                   const std::string& stats_path, const std::string& data,
                                   const RunIdentity& run) {
  CheckpointHeader h;
  RunConfig resolved = cfg;
  resolved.lr_decay_steps = lr_horizon(cfg);
  std::error_code ec;
  if (!stats_path.empty()) h.stats_path = std::filesystem::absolute(stats_path, ec).string();
  resolved.stats_path = stats_path.empty() ? kNoStats : h.stats_path;
  h.config_text = run_config_to_text(resolved);
  h.global_batch = static_cast<int64_t>(W) * cfg.model.batch_per_rank;
  h.world_size = W;
  h.ep_size = P;
  h.seed = cfg.seed;
  h.model = cfg.model_name;
  h.program_version = std::string("moe_rt ") + MOE_RT_VERSION;
  h.data_description = data;
  h.run_id = run.id;
  h.run_started = run.started;
  h.lineage = run.lineage;
  return h;
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

// Collective: writes the checkpoint of `step` (rank 0 names it and prunes the folder after) and
// charges its time to the next step. A failed write ends the run: false, with the summary saying
// why on every rank. So does a statistics row rank 0 could not write: a checkpoint after it would
// resume into a chain of files with rows missing.
bool checkpoint_after(int step, Trainer& trainer, CheckpointHeader& header, const RunConfig& cfg,
                      const Comm& world, const RunStats* stats, TrainSummary& summary) {
  if (stats_failed_agree(stats, world, summary)) return false;
  const double t0 = MPI_Wtime();
  std::string path;
  if (world.rank() == 0) {
    path = checkpoint_path_for(summary.checkpoint_dir, step, header.run_id);
    header.step = step;
    header.created = stats_now_iso8601();
  }
  try {
    checkpoint_save(path, header, trainer.state(), world);
  } catch (const CheckpointError& e) {
    summary.end = RunEnd::kCheckpointFailed;
    summary.end_detail = e.what();
    return false;
  }
  if (world.rank() == 0) {
    summary.last_checkpoint = path;
    for (const std::string& w : checkpoint_prune(summary.checkpoint_dir, cfg.keep_checkpoints,
                                                 header.run_id, header.lineage)) {
      std::fprintf(stderr, "moe_rt: warning: %s\n", w.c_str());
    }
  }
  trainer.charge_checkpoint(MPI_Wtime() - t0);
  return true;
}

// The --val-data source. A file must hold every sequence of an evaluation without wrapping
// around: --eval-batches global batches of S-token windows, and the last target.
std::unique_ptr<TokenSource> val_source_open(const RunConfig& cfg, int W, TokenCheckPart part) {
  const ModelConfig& mc = cfg.model;
  std::unique_ptr<TokenSource> source;
  try {
    source = token_source_open(cfg.val_data, mc.vocab, mc.seq_len, cfg.seed, part);
  } catch (const DataError& e) {
    throw DataError(std::string("--val-data: ") + e.what());
  }
  const int64_t sequences = static_cast<int64_t>(cfg.eval_batches) * W * mc.batch_per_rank;
  const int64_t needed = sequences * mc.seq_len + 1;
  if (source->num_tokens() > 0 && source->num_tokens() < needed) {
    throw DataError("--val-data: " + source->describe() + " is too short for --eval-batches " +
                    std::to_string(cfg.eval_batches) + ": " + std::to_string(sequences) +
                    " sequences of " + std::to_string(mc.seq_len) + " tokens need " +
                    std::to_string(needed) +
                    " tokens; lower --eval-batches or give more validation text");
  }
  return source;
}

RoutingState make_routing(const RunConfig& cfg) {
  const ModelConfig& mc = cfg.model;
  const std::string& path = cfg.routing.hash_table_path;
  RoutingState r = routing_state_make(mc, cfg.routing, cfg.seed);
  // A resumed run takes its tables from the checkpoint.
  if (!path.empty() && mc.hash_layers > 0 && !cfg.resume_point.active()) {
    r.hash_tables = hash_table_file_read(path, mc.hash_layers, mc.vocab, mc.top_k);
    const size_t table = static_cast<size_t>(mc.vocab) * mc.top_k;
    for (int l = 0; l < mc.hash_layers; ++l) {
      try {
        hash_table_validate(&r.hash_tables[l * table], mc.vocab, mc.experts, mc.top_k);
      } catch (const std::exception& e) {
        throw DataError("hash table file '" + path + "', layer " + std::to_string(l) + ": " +
                        e.what());
      }
    }
  }
  return r;
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

// MOE_RT_GEMM (portable, fma128, avx2, avx512) and MOE_RT_SIMD (sse2, avx2, avx512) run the
// GEMM and the float elementwise kernels at a narrower instruction-set level than the CPU's best:
// every level gives the same bits (docs/architecture.md, "Determinism"), and this is how a test
// shows it on one machine. A level the CPU lacks, or an unknown name, is a configuration error.
void kernel_levels_from_env() {
  if (const char* v = std::getenv("MOE_RT_GEMM"); v != nullptr && *v != '\0') {
    const std::optional<GemmLevel> level = gemm_level_parse(v);
    if (!level) {
      throw ConfigError("MOE_RT_GEMM: unknown GEMM level '" + text_excerpt(v) +
                        "' (valid: portable, fma128, avx2, avx512)");
    }
    try {
      gemm_level_force(*level);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("MOE_RT_GEMM: ") + e.what());
    }
  }
  if (const char* v = std::getenv("MOE_RT_SIMD"); v != nullptr && *v != '\0') {
    const std::optional<SimdLevel> level = simd_level_parse(v);
    if (!level) {
      throw ConfigError("MOE_RT_SIMD: unknown elementwise level '" + text_excerpt(v) +
                        "' (valid: sse2, avx2, avx512)");
    }
    try {
      simd_level_force(*level);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("MOE_RT_SIMD: ") + e.what());
    }
  }
}

}  // namespace

void setup_agree(const Comm& world, const std::string& local_error) {
  // Lowest failing rank, or W when none failed: a MIN all-reduce of (failed ? rank : W), written
  // as the MAX of the negation with the typed helper.
  std::vector<int> flag = {local_error.empty() ? -world.size() : -world.rank()};
  world.allreduce_max(std::span<int>(flag));
  const int reporter = -flag[0];
  if (reporter == world.size()) return;
  if (local_error.empty()) {
    throw SetupError("rank " + std::to_string(reporter) + " failed during set-up", false);
  }
  throw SetupError(local_error, world.rank() == reporter);
}

TrainSummary train_run(const RunConfig& cfg, const Comm& world, bool quiet, bool measure_peak) {
  const ModelConfig& mc = cfg.model;
  const int W = world.size(), rank = world.rank();
  const int P = run_ep_size(cfg, W);

  // The hosts as the launcher places the ranks, and the ranks sharing this node's memory and
  // cores: collectives every rank reaches whatever its input (the options were agreed on in main).
  const HostLayout launcher_hosts = host_layout_discover(world);
  const int node_ranks = launcher_hosts.ranks_on_host[launcher_hosts.host_of_rank[rank]];
  const ModelMemory memory = model_memory_estimate(mc, P, W);

  // Everything that can fail on bad input, before any collective a failed rank would miss; then
  // all ranks agree.
  std::unique_ptr<TokenSource> data, val_data;
  RoutingState routing;
  std::unique_ptr<RunStats> stats;
  std::unique_ptr<CheckpointReader> resume;
  CheckpointHeader checkpoint_template;
  const RunIdentity identity = run_identity_make(cfg);
  CheckpointFolderLock folder_lock;  // rank 0, while checkpointing
  std::string folder_note;
  TrainSummary summary;
  std::string error;
  int64_t data_private_bytes = 0, data_mapped_bytes = 0;
  HostLayout hosts = launcher_hosts;
  try {
    kernel_levels_from_env();
    parallel_config_validate(mc, W, P);
    if (cfg.ranks_per_host > 0) {
      try {
        hosts = host_layout_blocks(W, cfg.ranks_per_host);
      } catch (const std::invalid_argument& e) {
        throw ConfigError(e.what());
      }
    }
    summary.num_hosts = hosts.num_hosts();
    summary.top_k = mc.top_k;
    memory_check(memory, node_ranks);
    if (cfg.resume_point.active()) {
      const std::string& path = cfg.resume_point.checkpoint;
      try {
        resume = std::make_unique<CheckpointReader>(path);
      } catch (const CheckpointError&) {
        // Open from here on, a checkpoint stays readable whatever happens to its name; before,
        // a live run writing to the --resume folder may have pruned the newest one it chose.
        std::error_code ec;
        if (path == cfg.resume || std::filesystem::exists(path, ec) || ec) throw;
        throw CheckpointError("--resume " + text_excerpt(cfg.resume, kPathExcerptBytes) +
                              ": its newest checkpoint '" + path +
                              "' was removed after this run chose it (a live run writing to " +
                              "that folder pruned it): resume again, or name a checkpoint file");
      }
    }
    // Each rank checks its part of a data file's tokens; the agreement below makes a bad token
    // anywhere fail every rank.
    data = token_source_open(cfg.data, mc.vocab, mc.seq_len, cfg.seed, TokenCheckPart{rank, W});
    if (has_val_data(cfg)) {
      val_data = val_source_open(cfg, W, TokenCheckPart{rank, W});
      summary.val_data_description = val_data->describe();
    }
    for (const TokenSource* source : {data.get(), val_data.get()}) {
      if (source == nullptr) continue;
      data_private_bytes += source->private_bytes();
      data_mapped_bytes += source->mapped_bytes();
    }
    memory_check(memory, node_ranks, static_cast<double>(data_private_bytes));
    summary.data_description = data->describe();
    if (resume && summary.data_description != cfg.resume_point.data_description) {
      throw DataError("--data: the data is not what checkpoint '" + resume->path() +
                      "' trained on: now " + summary.data_description + "; then " +
                      cfg.resume_point.data_description);
    }
    if (const auto* synth = dynamic_cast<const SyntheticSource*>(data.get())) {
      summary.entropy_floor = synth->entropy_floor_nats();
    }
    routing = make_routing(cfg);
    summary.layer_modes = routing.modes;
    if (cfg.stats_path != kNoStats) {
      stats = std::make_unique<RunStats>(cfg, rank, W, P, hosts, routing, summary.data_description,
                                         summary.val_data_description, summary.entropy_floor,
                                         identity.id);
      summary.stats_path = stats->path();
    }
    if (rank == 0) {
      summary.checkpoint_dir =
          checkpoint_dir_prepare(cfg, summary.stats_path, identity, folder_lock, folder_note);
      checkpoint_template =
          checkpoint_header(cfg, W, P, summary.stats_path, summary.data_description, identity);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  // All ranks agree on `error`; when any failed, no run happens: the unpublished statistics file
  // is removed and any file at its path left as it was.
  auto agree = [&](const std::string& local_error) {
    try {
      setup_agree(world, local_error);
    } catch (const SetupError&) {
      stats.reset();
      throw;
    }
  };
  agree(error);
  // The --data file's content checksum, each rank hashing its share of the file's blocks: the
  // sum is the same on every rank, so is the outcome of the comparison with the checkpoint's.
  std::vector<uint64_t> checksum = {data->checksum_part(TokenCheckPart{rank, W})};
  world.allreduce_sum(std::span<uint64_t>(checksum));
  summary.data_checksum = data_checksum_text(checksum[0]);
  if (rank == 0) checkpoint_template.data_checksum = summary.data_checksum;
  const std::string& then = cfg.resume_point.data_checksum;
  if (resume && !then.empty() && summary.data_checksum != then) {
    error = "--data: the contents of " + summary.data_description + " are not those checkpoint '" +
            resume->path() + "' trained on (checksum now " + summary.data_checksum + ", then " +
            then + "): the file was changed in place; restore it, or start a new run";
  }
  agree(error);
  const int threads = resolve_threads(cfg, node_ranks);
  blas_set_threads(threads);

  // Allocation can still fail where others use the node's memory: agreed on the same way. The
  // Trainer's collectives (communicator splits) come before its allocations, so every rank
  // reaches the agreement. So can a checkpoint's tensors, which every rank reads for itself.
  std::unique_ptr<Trainer> trainer;
  try {
    trainer = std::make_unique<Trainer>(cfg, world, hosts, P, std::move(data), std::move(val_data),
                                        std::move(routing), stats.get());
    if (resume) checkpoint_load(*resume, trainer->state());
  } catch (const std::bad_alloc&) {
    error =
        "out of memory allocating the model (estimated " + gib_text(memory.total()) + " per rank)";
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error);
  resume.reset();
  // Set-up succeeded on every rank: only now does the statistics file replace the one at its path
  // (agreed on too: another run may have taken the path meanwhile).
  try {
    if (stats) stats->publish();
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error);
  if (rank == 0 && !quiet) {
    report_config(
        cfg, RunShape{W, P, threads, trainer->num_dense_params(),
                      static_cast<size_t>(model_expert_params(mc)), memory,
                      summary.data_description, summary.val_data_description, summary.stats_path,
                      data_private_bytes, data_mapped_bytes, host_layout_describe(hosts, P)});
    for (const std::string& note : {cfg.resume_point.note, folder_note}) {
      if (!note.empty()) std::printf("moe_rt: note: %s\n", note.c_str());
    }
  }
  const int first_step = static_cast<int>(cfg.resume_point.step + 1);  // 0 unless resuming
  summary.steps.reserve(cfg.steps - first_step);
  std::vector<double> phase_sum(kNumPhases, 0.0);  // over the steps after the first
  for (int step = first_step; step < cfg.steps; ++step) {
    StepRecord rec = trainer->step(step);
    // The validation loss of the model this step left, unless it went non-finite or a signal
    // asks to stop at once.
    const EvalRecord* eval = nullptr;
    if (has_val_data(cfg) && !trainer->nonfinite() && trainer->stop_signal() == 0 &&
        (step + 1 == cfg.steps || (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0))) {
      summary.evals.push_back(trainer->evaluate(step));
      eval = &summary.evals.back();
    }
    if (rank == 0 && !quiet) report_step(rec, has_val_data(cfg), eval);
    if (step > first_step || cfg.steps - first_step == 1) {
      for (int p = 0; p < kNumPhases; ++p) phase_sum[p] += trainer->times().seconds[p];
    }
    summary.steps.push_back(std::move(rec));
    summary.last_step = step;
    if (trainer->nonfinite()) {
      summary.end = RunEnd::kNonFinite;
      summary.end_detail = trainer->locate_nonfinite();
      break;
    }
    if (trainer->stats_failed()) {
      summary.end = RunEnd::kStatsFailed;
      if (stats) summary.end_detail = stats->failure();
      break;
    }
    const bool stop = trainer->stop_signal() != 0;
    if (cfg.checkpoint_every > 0 &&
        (stop || step + 1 == cfg.steps || (step + 1) % cfg.checkpoint_every == 0) &&
        !checkpoint_after(step, *trainer, checkpoint_template, cfg, world, stats.get(), summary)) {
      break;
    }
    if (stop) {
      summary.end = RunEnd::kSignal;
      summary.stop_signal = trainer->stop_signal();
      break;
    }
  }
  // The last rows (of the final step and evaluation) have no next step to carry their failure.
  if (summary.end == RunEnd::kCompleted) stats_failed_agree(stats.get(), world, summary);
  if (!summary.steps.empty()) summary.param_digest = trainer->param_digest();
  summarize_phases(summary, world, phase_sum);
  summary.model_gflops =
      3.0 * model_forward_flops_per_token(mc) * median_tokens_per_s(summary) * 1e-9;
  // A stopped run ends at once: mpirun may kill it a second after its signal.
  if (measure_peak && summary.end == RunEnd::kCompleted) {
    measure_sgemm_peak(summary, cfg, world, node_ranks, threads);
  }
  if (stats) summary.stats_removed = !stats->close();
  return summary;
}

}  // namespace moe
