// One training run's state and step (runtime/run/train.cpp's loop calls it): parameters, gradients
// and AdamW state in two arenas, activations, the token exchange, the routing state, and the
// per-step scratch, all sized once. step() is one training step, collective over the world:
// data -> forward -> backward -> all-reduces -> clipping and AdamW -> bias update -> statistics.
// Legend: W ranks, P EP group size, B sequences per rank, S sequence length, N = B·S local tokens,
// T = W·N tokens per step, L layers, E experts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/ep_exchange.hpp"
#include "comm/host_layout.hpp"
#include "io/token_data.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "model/phase_timer.hpp"
#include "runtime/options/options.hpp"
#include "runtime/output/records.hpp"
#include "runtime/output/run_stats.hpp"
#include "runtime/run/checkpoint.hpp"
#include "runtime/run/expert_instances.hpp"

namespace moe {

// Built once after set-up has been agreed by all ranks. Holds references to cfg and world, and
// EpExchange holds one to its own EP communicator: a Trainer never moves.
class Trainer {
 public:
  // `hosts`: where the ranks lie (comm/host_layout.hpp); the EP groups of `ep_size` ranks
  // (run_ep_size) are cut from its order, and each holds the experts as `placement` says (one
  // ExpertPlacement of ep_size ranks per layer). `val_data` (may be null): the validation source
  // of evaluate().
  Trainer(const RunConfig& cfg, const Comm& world, const HostLayout& hosts, int ep_size,
          ModelPlacement placement, std::unique_ptr<TokenSource> data,
          std::unique_ptr<TokenSource> val_data, RoutingState routing, RunStats* stats);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // The parameters' initial values (the constructor leaves them zero): collective over the world,
  // so called once every rank has constructed its Trainer; a resumed run reads the values from its
  // checkpoint instead.
  void init_params();

  // One training step. With a non-finite loss or gradient norm the parameters, AdamW state and
  // bias are left as they were (nonfinite() then says so); the step's record is still complete.
  StepRecord step(int step);

  // The validation loss of the model as `step` left it: forward only, no parameter, AdamW or
  // bias change, over --eval-batches global batches of validation sequences (global sample
  // indices val_first_sample() + k·W·B + r·B + b), bitwise the same on any rank count where a
  // step is. Collective over the world; appends the record to the statistics file.
  EvalRecord evaluate(int step);

  // Agreed by every rank at the end of the last step: the stop signal any rank had received
  // by then (0: none), and whether its loss or gradient norm was not finite.
  int stop_signal() const { return stop_signal_; }
  // Whether rank 0 failed to write a statistics row before this step's end (RunStats::failure),
  // learnt by every rank at the same step boundary.
  bool stats_failed() const { return stats_failed_; }
  bool nonfinite() const { return nonfinite_; }
  // Collective, after a non-finite step: where the forward first went non-finite on any rank
  // ("the output of layer 3's MoE block", ... "the logits"), and the first dense tensor whose
  // gradient is not finite. Scans the step's activations and gradients: for failures only.
  std::string locate_nonfinite();

  // Views of the parameters, AdamW state and routing state, for checkpoints. Each rank updates
  // the AdamW moments of its share of the dense arena only: gather_optimizer_state (collective)
  // brings every rank's share to all before a checkpoint reads them.
  TrainState state();
  void gather_optimizer_state();
  // Time spent on a checkpoint after a step: charged to the next step's "checkpoint" phase.
  void charge_checkpoint(double seconds) { checkpoint_seconds_ = seconds; }

  int ep_size() const { return P_; }
  // Called by every rank (collective over its EP group): a 64-bit FNV-1a digest of every
  // parameter's bits, tensor by tensor in a fixed order (the dense arena as laid out, then per
  // layer each global expert's w1, w3, w2), so that it depends on neither the rank count nor the EP
  // size. The same on every rank.
  uint64_t param_digest() const;
  size_t num_dense_params() const { return dense_.size(); }
  const PhaseTimes& times() const { return times_; }  // of the last step

 private:
  // Fills tokens_/targets_ with this rank's B samples starting at global sample `first`.
  void load_samples(const TokenSource& source, int64_t first);
  void load_batch(int step);
  void reduce(StepRecord& rec);
  void reduce_expert_replicas();
  void reduce_loads(StepRecord& rec);     // collective: the step's loads into rec
  void shadow_local_loads(int64_t* out);  // [R, L, E] of the shadow balancers, this rank's
  double expert_grad_norm_sq();           // collective over the EP group
  void optimize(StepRecord& rec, int step);

  const RunConfig& cfg_;
  const ModelConfig& mc_;
  const Comm& world_;
  std::unique_ptr<TokenSource> data_;
  std::unique_ptr<TokenSource> val_data_;  // null without --val-data
  RoutingState routing_;
  RunStats* stats_;  // null for --stats none
  int P_;
  ParallelGroups groups_;
  ModelPlacement placement_;  // [L]
  int max_local_ = 1;         // the most experts a rank holds in a layer
  ModelLayout layout_;
  EpExchange ex_;  // holds a reference to groups_.ep: a Trainer never moves
  AdamWConfig adam_;
  std::vector<float> dense_, experts_, d_dense_;  // the two arenas, the dense gradients
  std::vector<float>
      d_experts_;  // the expert gradients: [planes, experts_.size()], plane 0 reduced
  AdamWState adam_dense_, adam_experts_;
  ModelActs<float> acts_;
  ModelBatch batch_;
  PhaseTimes times_;
  int64_t T_ = 0;                                   // tokens per step, all ranks
  std::vector<int32_t> sample_, tokens_, targets_;  // [S + 1], [N], [N]
  // [CE sum, balance loss of each layer, z-loss of each layer, the dense gradient's sums of
  // squares by chunk (sum_squares_chunks; each from the rank whose share holds it, 0 elsewhere)]
  std::vector<double> sums_;
  double* dense_norm_parts() { return sums_.data() + 1 + 2 * static_cast<size_t>(mc_.layers); }
  // [L rows received, L·E rows sent to each expert], [W, L + L·E]
  std::vector<int64_t> recv_local_, recv_all_;
  // [L·E expert loads, L cross-host rows, L cross-host tokens, L·E dropped, R·L·E shadow loads]
  std::vector<int64_t> load_sums_;
  std::vector<int32_t> shadow_idx_;  // [N, K] a shadow balancer's selection
  // The dense arena's shares, one per world rank, in whole chunks of its sums of squares: each rank
  // receives the summed gradient of its share (Comm::reduce_scatter_tree), updates those
  // parameters and moments, and sends them to every rank (Comm::allgatherv_blocks).
  SumSquaresChunks dense_chunks_;
  std::vector<int> share_counts_, share_displs_;  // [W] in elements
  size_t share_first_chunk_ = 0, share_end_chunk_ = 0;
  std::vector<float> dense_scratch_;               // [W · this rank's share] the shares' leaves
  std::vector<double> sums_scratch_;               // as sums_
  std::vector<double> expert_sq_, expert_sq_all_;  // [L, max_local_], [P, L, max_local_]
  // Expert gradients by sequence (model/expert_grads.hpp): each EP group's tree nodes (by group),
  // the planes of d_experts_ they need, and with replicas the gathered planes and the scratch of
  // the tree's top.
  std::vector<std::vector<TreeNode>> expert_nodes_;
  size_t expert_planes_ = 1;
  std::vector<float> expert_scratch_;   // one plane a group: allreduce_sum_tree's scratch
  std::vector<float> expert_gathered_;  // several: [replicas, planes, experts_.size()]
  std::vector<std::vector<float>> expert_tree_scratch_;    // [tree depth][experts_.size()]
  std::unique_ptr<ExpertInstanceReduce> instance_reduce_;  // with replicated experts only
  double expert_norm_sq_ = 0.0;                            // Σ over every expert, in a fixed order
  // [step seconds, stop signal, a statistics row failed on rank 0], max over ranks; with a
  // statistics file then [W, phases]: each rank's phase times in its own row, zeros elsewhere,
  // so the max is every rank's times (they are never negative), for rank 0's row of the step.
  static constexpr size_t kSlowestHead = 3;
  std::vector<double> slowest_ = std::vector<double>(kSlowestHead, 0.0);
  double stats_seconds_ = 0.0;  // the previous step's HDF5 append, charged to this step's "stats"
  double checkpoint_seconds_ = 0.0;  // a checkpoint after the previous step
  int stop_signal_ = 0;
  bool stats_failed_ = false;
  bool nonfinite_ = false;
};

}  // namespace moe
