// The run's statistics file (docs/hdf5-schema.md): rank 0 owns the HDF5 writer; every rank takes
// part in the gathers of the routing traces. The per-rank phase times reach rank 0 in the
// Trainer's end-of-step all-reduce.
// Legend: W ranks, L layers, E experts, K experts per token, N local tokens, T = W·N tokens per
// step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/host_layout.hpp"
#include "io/stats_writer.hpp"
#include "model/model.hpp"
#include "model/phase_timer.hpp"
#include "runtime/options/options.hpp"
#include "runtime/output/records.hpp"

namespace moe {

class RunStats {
 public:
  // Not collective. On rank 0: resolves the path (--stats, else a new runs/<model>-<time>.h5),
  // checks it (refusing one of the run's input files) and creates the file under a staging name
  // (StatsWriter); throws StatsPathError or Hdf5Error on a bad path. Other ranks only remember
  // the shape. `run_id`: this run's (RunIdentity), recorded with the run it resumed.
  RunStats(const RunConfig& cfg, int rank, int world_size, int ep_size, const HostLayout& hosts,
           const RoutingState& routing, const ModelPlacement& placement,
           const std::string& data_description, const std::string& val_data_description,
           double entropy_floor, const std::string& run_id);
  // Without publish(): the staging file is removed and the path left as it was (a name reserved
  // under runs/ is removed too).
  ~RunStats();
  RunStats(const RunStats&) = delete;
  RunStats& operator=(const RunStats&) = delete;

  const std::string& path() const { return path_; }  // rank 0; empty elsewhere

  // Rank 0: puts the file at its path (StatsWriter::publish), to be called once every rank agreed
  // that set-up succeeded. Throws StatsPathError. Other ranks: nothing.
  void publish();
  // Rank 0: closes and compacts the file; false when the file was removed (or replaced) during
  // the run. A failure to close is a warning on stderr. Other ranks: true.
  bool close();

  // Rank 0: appends the step's row, with every rank's phase times `phase_all` [W, phases] (the
  // Trainer gathers them in its end-of-step collective). Other ranks: nothing.
  void record_step(const StepRecord& rec, std::span<const double> phase_all);

  // Rank 0: appends a validation row (the record is global already). Other ranks: nothing.
  void record_eval(const EvalRecord& rec);

  // Collective over world when `step` is a trace step (--trace-every): gathers each token's id,
  // position, rank and per-layer experts and weights; rank 0 appends them.
  void record_trace(const Comm& world, int64_t step, const ModelActs<float>& acts,
                    const std::vector<int32_t>& tokens, int seq_len);
  bool is_trace_step(int64_t step) const { return trace_every_ > 0 && step % trace_every_ == 0; }

  // Rank 0: why a row could not be written (a full disk, a failed flush), naming the file and the
  // row; "" while every row was. After the first failure no more rows are written: the run stops
  // at the next agreement (Trainer::step's flag, a checkpoint, the end of the run), so that the
  // file never has a gap a resumed chain would hide. Other ranks: "".
  const std::string& failure() const { return failure_; }

 private:
  // Rank 0: runs `append` (a writer call) unless a row failed before; a failure is kept, not
  // thrown, since the other ranks are already in the next step.
  template <class F> void append_row(const std::string& row, F&& append);
  // record_trace's parts: this rank's tokens and routing packed into trace_local_ and
  // weights_local_; on rank 0, the gathered blocks of N tokens each laid out token-major (t_*).
  void pack_trace(const ModelActs<float>& acts, const std::vector<int32_t>& tokens, int seq_len);
  void unpack_trace(int N);

  int rank_ = 0, world_size_ = 1, layers_ = 0, top_k_ = 0, trace_every_ = 0;
  int experts_ = 0;
  RoutingConfig routing_;           // the run's, for the traces' unbiased top-k
  std::vector<RoutingMode> modes_;  // [L]
  std::string path_;
  bool reserved_ = false;                         // path_ is a name stats_default_path reserved
  bool published_ = false;                        // publish() succeeded
  std::string failure_;                           // rank 0: see failure()
  std::unique_ptr<StatsWriter> writer_;           // rank 0 only
  std::vector<int32_t> trace_local_, trace_all_;  // [2·N + 2·L·N·K] per rank, gathered [W, ...]
  std::vector<float> weights_local_, weights_all_;
  std::vector<int32_t> t_ids_, t_pos_, t_rank_, t_experts_;  // rank 0: [T], [T], [T], [L, T, K]
  std::vector<int32_t> t_unbiased_;                          // rank 0: [L, T, K]
  std::vector<float> t_weights_;                             // rank 0: [L, T, K]
};

}  // namespace moe
