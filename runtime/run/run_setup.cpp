// run_setup (run_setup.hpp): the set-up of a run in the order its agreements need, each part a
// function: what can fail on bad input (setup_open), the data file's checksum against the
// checkpoint's, the Trainer and the checkpoint it loads, the statistics file's publication, and
// rank 0's configuration table.
#include "runtime/run/run_setup.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint_file.hpp"
#include "io/hash_table_file.hpp"
#include "io/synthetic_data.hpp"
#include "io/token_source.hpp"
#include "model/blas.hpp"
#include "model/expert_grads.hpp"
#include "model/gemm/gemm.hpp"
#include "model/router.hpp"
#include "model/simd.hpp"
#include "runtime/options/config_agree.hpp"
#include "runtime/options/config_file.hpp"
#include "runtime/output/report.hpp"
#include "runtime/run/expert_instances.hpp"
#include "runtime/run/placement_file.hpp"

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

// What a placement with replicated experts adds to model_memory_estimate: the expert gradients'
// further planes (each replica sums the tree nodes of its chunk of the sequences) and the
// buffers and scratch of their exchange (runtime/run/expert_instances.hpp).
void add_replica_memory(ModelMemory& m, const ModelConfig& mc, const ModelPlacement& placement,
                        int W, int P) {
  if (!model_placement_has_replicas(placement)) {
    return;
  }
  const int B = std::max(mc.batch_per_rank, 1);
  const double DF = static_cast<double>(mc.d_model) * mc.ffn_dim;
  const double arena =
      static_cast<double>(mc.layers) * model_placement_max_local(placement) * 3 * DF;
  size_t group_planes = 1;  // what the estimate counted already
  if (W > P) {
    for (const std::vector<TreeNode>& nodes : expert_grad_group_nodes(W, P, B)) {
      group_planes = std::max(group_planes, nodes.size());
    }
  }
  const size_t planes = ExpertInstanceReduce::planes_needed(placement, W, B);
  m.param_bytes +=
      4.0 * arena * static_cast<double>(planes > group_planes ? planes - group_planes : 0);
  m.param_bytes += ExpertInstanceReduce::buffer_bytes(placement, W, B, DF) +
                   4.0 * DF * (1 + tree_sum_depth(W * B));
}

// The --val-data source. A file must hold every sequence of an evaluation without wrapping
// around: --eval-batches global batches of S-token windows, and the last target. It is read in
// file order whatever --data-order says: an evaluation is a fixed set, its first windows, the
// same at every evaluation and in every run of that file (as llm.c evaluates).
std::unique_ptr<TokenSource> val_source_open(const RunConfig& cfg, int W, TokenCheckPart part) {
  const ModelConfig& mc = cfg.model;
  std::unique_ptr<TokenSource> source;
  try {
    source = token_source_open(cfg.val_data, mc.vocab, mc.seq_len, cfg.seed, part,
                               DataOrder::kSequential);
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

// What set-up opens before the Trainer takes it over.
struct SetupInputs {
  ModelMemory memory;                           // one rank's, model_memory_estimate
  std::unique_ptr<CheckpointReader> resume;     // the checkpoint resumed from, until it is loaded
  std::unique_ptr<TokenSource> data, val_data;  // val_data: null without --val-data
  RoutingState routing;
  ModelPlacement placement;  // [L] --expert-placement's, else the contiguous layout
  int64_t data_private_bytes = 0, data_mapped_bytes = 0;  // TokenSource's, both sources
};

// The checkpoint --resume resolved to (options_parse), open: from here on it stays readable
// whatever happens to its name. Before, a live run writing to the --resume folder may have pruned
// the newest checkpoint it chose: one line says so.
std::unique_ptr<CheckpointReader> resume_open(const RunConfig& cfg) {
  const std::string& path = cfg.resume_point.checkpoint;
  try {
    return std::make_unique<CheckpointReader>(path);
  } catch (const CheckpointError&) {
    std::error_code ec;
    if (path == cfg.resume || std::filesystem::exists(path, ec) || ec) throw;
    throw CheckpointError("--resume " + text_excerpt(cfg.resume, kPathExcerptBytes) +
                          ": its newest checkpoint '" + path +
                          "' was removed after this run chose it (a live run writing to " +
                          "that folder pruned it): resume again, or name a checkpoint file");
  }
}

// Opens --data and --val-data, each rank checking its part of a data file's tokens (the
// agreement after set-up makes a bad token anywhere fail every rank); checks the memory with what
// the sources keep, and that the data is what a resumed checkpoint trained on.
void data_open(const RunConfig& cfg, int rank, int W, int node_ranks, SetupInputs& in,
               TrainSummary& summary) {
  const ModelConfig& mc = cfg.model;
  in.data = token_source_open(cfg.data, mc.vocab, mc.seq_len, cfg.seed, TokenCheckPart{rank, W},
                              cfg.data_order);
  if (has_val_data(cfg)) {
    in.val_data = val_source_open(cfg, W, TokenCheckPart{rank, W});
    summary.val_data_description = in.val_data->describe();
  }
  for (const TokenSource* source : {in.data.get(), in.val_data.get()}) {
    if (source == nullptr) continue;
    in.data_private_bytes += source->private_bytes();
    in.data_mapped_bytes += source->mapped_bytes();
  }
  memory_check(in.memory, node_ranks, static_cast<double>(in.data_private_bytes));
  summary.data_description = in.data->describe();
  if (in.resume && summary.data_description != cfg.resume_point.data_description) {
    throw DataError("--data: the data is not what checkpoint '" + in.resume->path() +
                    "' trained on: now " + summary.data_description + "; then " +
                    cfg.resume_point.data_description);
  }
  if (const auto* synth = dynamic_cast<const SyntheticSource*>(in.data.get())) {
    summary.entropy_floor = synth->entropy_floor_nats();
  }
}

// Not collective: everything that can fail on bad input, in the order that gives the most
// useful message first. Throws the first problem.
void setup_open(const RunConfig& cfg, int rank, int W, int P, const RunIdentity& identity,
                RunSetup& run, SetupInputs& in) {
  const ModelConfig& mc = cfg.model;
  kernel_levels_from_env();
  parallel_config_validate(mc, W, P);
  if (cfg.ranks_per_host > 0) {
    try {
      run.hosts = host_layout_blocks(W, cfg.ranks_per_host);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(e.what());
    }
  }
  TrainSummary& summary = run.summary;
  summary.num_hosts = run.hosts.num_hosts();
  summary.top_k = mc.top_k;
  if (!cfg.expert_placement.empty()) {
    in.placement = placement_file_read(cfg.expert_placement, mc.experts, mc.layers, P);
    in.memory =
        model_memory_estimate(mc, P, W, model_placement_max_local(in.placement), run.threads);
    add_replica_memory(in.memory, mc, in.placement, W, P);
  }
  // Before the contiguous layout is built: its tables grow with L·E, and a model far too large
  // for the node is refused at once rather than after filling gigabytes of them.
  memory_check(in.memory, run.node_ranks);
  if (cfg.expert_placement.empty()) {
    in.placement = model_placement_contiguous(mc, P);  // P <= E: parallel_config_validate
  }
  if (cfg.resume_point.active()) in.resume = resume_open(cfg);
  data_open(cfg, rank, W, run.node_ranks, in, summary);
  in.routing = make_routing(cfg);
  summary.layer_modes = in.routing.modes;
  summary.capacity_factor = in.routing.config.capacity_factor;
  summary.drop_policy = drop_policy_name(in.routing.config.drop_policy);
  for (const ShadowRule& rule : in.routing.config.shadows) {
    summary.shadow_names.push_back(shadow_rule_name(rule));
  }
  if (cfg.stats_path != kNoStats) {
    run.stats = std::make_unique<RunStats>(cfg, rank, W, P, run.hosts, in.routing, in.placement,
                                           summary.data_description, summary.val_data_description,
                                           summary.entropy_floor, identity.id);
    summary.stats_path = run.stats->path();
  }
  if (rank == 0) {
    run.checkpoints =
        checkpoint_plan_make(cfg, W, P, summary.stats_path, summary.data_description, identity);
    summary.checkpoint_dir = run.checkpoints.dir;
  }
}

// Collective: every rank agrees on `local_error` (setup_agree). When any failed, no run happens:
// the unpublished statistics file is removed and any file at its path left as it was.
void agree(const Comm& world, const std::string& local_error, RunSetup& run) {
  try {
    setup_agree(world, local_error);
  } catch (const SetupError&) {
    run.stats.reset();
    throw;
  }
}

// Collective: the --data file's content checksum, each rank hashing its share of the file's
// blocks: the sum is the same on every rank, so is the outcome of the comparison with the
// checkpoint's. Returns the problem, "" when there is none.
std::string data_checksum_check(const RunConfig& cfg, const Comm& world, const SetupInputs& in,
                                RunSetup& run) {
  std::vector<uint64_t> checksum = {
      in.data->checksum_part(TokenCheckPart{world.rank(), world.size()})};
  world.allreduce_sum(std::span<uint64_t>(checksum));
  TrainSummary& summary = run.summary;
  summary.data_checksum = data_checksum_text(checksum[0]);
  if (world.rank() == 0) run.checkpoints.header.data_checksum = summary.data_checksum;
  const std::string& then = cfg.resume_point.data_checksum;
  if (!in.resume || then.empty() || summary.data_checksum == then) return "";
  return "--data: the contents of " + summary.data_description + " are not those checkpoint '" +
         in.resume->path() + "' trained on (checksum now " + summary.data_checksum + ", then " +
         then + "): the file was changed in place; restore it, or start a new run";
}

// Collective: every rank read --expert-placement for itself (a file on each host's own disk may
// differ): all must hold the same placement. Returns the problem, "" when there is none.
std::string placement_check(const RunConfig& cfg, const Comm& world,
                            const ModelPlacement& placement) {
  const uint64_t digest = placement_digest(placement);
  std::vector<uint64_t> range = {digest, ~digest};  // the max and, negated, the min over ranks
  world.allreduce_max(std::span<uint64_t>(range));
  if (range[0] == ~range[1]) return "";
  return "--expert-placement: the ranks read different placements from '" +
         text_excerpt(cfg.expert_placement, kPathExcerptBytes) +
         "' (each rank reads the file on its own host): give every host the same file";
}

// Rank 0: the configuration table and the notes of --resume and of the checkpoint folder.
void report_setup(const RunConfig& cfg, const RunSetup& run, const SetupInputs& in, int W, int P) {
  const TrainSummary& s = run.summary;
  report_config(
      cfg, RunShape{W, P, run.threads, run.trainer->num_dense_params(),
                    static_cast<size_t>(model_expert_params(cfg.model)), in.memory,
                    s.data_description, s.val_data_description, s.stats_path, in.data_private_bytes,
                    in.data_mapped_bytes, host_layout_describe(run.hosts, P)});
  for (const std::string& note : {cfg.resume_point.note, run.checkpoints.note}) {
    if (!note.empty()) std::printf("moe_rt: note: %s\n", note.c_str());
  }
}

}  // namespace

RunSetup run_setup(const RunConfig& cfg, const Comm& world, bool quiet) {
  const int W = world.size(), rank = world.rank();
  const int P = run_ep_size(cfg, W);
  RunSetup run;
  SetupInputs in;
  // The hosts as the launcher places the ranks, and the ranks sharing this node's memory and
  // cores: collectives every rank reaches whatever its input (the options were agreed on in main).
  run.hosts = host_layout_discover(world);
  run.node_ranks = run.hosts.ranks_on_host[run.hosts.host_of_rank[rank]];
  run.threads = resolve_threads(cfg, run.node_ranks);
  in.memory = model_memory_estimate(cfg.model, P, W, 0, run.threads);
  const RunIdentity identity = run_identity_make(cfg);
  std::string error;
  try {
    setup_open(cfg, rank, W, P, identity, run, in);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(world, error, run);
  agree(world, data_checksum_check(cfg, world, in, run), run);
  agree(world, placement_check(cfg, world, in.placement), run);
  blas_set_threads(run.threads);

  // Allocation can still fail where others use the node's memory: agreed on the same way. The
  // Trainer's collectives (communicator splits) come before its allocations, so every rank
  // reaches the agreement. So can a checkpoint's tensors, which every rank reads for itself.
  error.clear();
  try {
    run.trainer = std::make_unique<Trainer>(cfg, world, run.hosts, P, std::move(in.placement),
                                            std::move(in.data), std::move(in.val_data),
                                            std::move(in.routing), run.stats.get());
    if (in.resume) checkpoint_load(*in.resume, run.trainer->state());
  } catch (const std::bad_alloc&) {
    error = "out of memory allocating the model (estimated " + gib_text(in.memory.total()) +
            " per rank)";
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(world, error, run);
  if (!in.resume) run.trainer->init_params();  // a collective: after the agreement
  in.resume.reset();
  // Set-up succeeded on every rank: only now does the statistics file replace the one at its path
  // (agreed on too: another run may have taken the path meanwhile).
  error.clear();
  try {
    if (run.stats) run.stats->publish();
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(world, error, run);
  if (rank == 0 && !quiet) report_setup(cfg, run, in, W, P);
  return run;
}

}  // namespace moe
