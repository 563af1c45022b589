// The Mixture-of-Experts layer over expert parallelism, forward and backward
// (docs/architecture.md).
//
//   logits = u·W_g, s = f(logits), sel = route(s + b | token ids | global index),
//   w_j = s[sel_j] / (Σ s[sel] + 1e-20) · route_scale,
//   MoE(u) = Σ_j w_j · expert_{sel_j}(u) + shared(u),  expert(u) = swiglu_clamped(u·W1, u·W3)·W2.
//
// One rank holds N tokens and the experts [first, first + E_loc) of its EP group. Forward: route,
// build the dispatch plan, exchange counts, dispatch rows to the experts' owners, run each local
// expert on its contiguous rows, combine the outputs back, weight and sum. Backward walks the same
// list in reverse with the same plan: gradients of the outputs go out by dispatch, gradients of
// the inputs come back by combine. Selection is not differentiated; W_g gets gradient through w.
//
// Legend: N local tokens, D model width, F expert width, Fs shared width (shared_experts · F),
// E experts, E_loc local experts, K experts per token, R rows received by this rank, V vocab.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/dispatch_plan.hpp"
#include "comm/ep_exchange.hpp"
#include "model/balance.hpp"
#include "model/config.hpp"
#include "model/expert_grads.hpp"
#include "model/params.hpp"
#include "model/phase_timer.hpp"
#include "model/router.hpp"
#include "model/tree_sum.hpp"

namespace moe {

struct MoeDims {
  int D = 0, F = 0, Fs = 0, E = 0, K = 0;
  ScoreFunc score = ScoreFunc::kSqrtSoftplus;
  float route_scale = 1.0f;
  float swiglu_limit = 0.0f;   // routed experts only; the shared expert is never clamped
  bool overlap_shared = true;  // run the shared expert while the dispatch all-to-all is in flight
                               // (EP groups of more than one rank; else it is one more expert task)
};
MoeDims moe_dims_from(const ModelConfig& cfg);

// Pointers into the two arenas for one MoE layer (parameters or, with the same layout, gradients).
template <class T> struct MoeWeights {
  T* router;     // [D, E]         dense arena
  T* shared_w1;  // [D, Fs]        dense arena (nullptr when Fs = 0)
  T* shared_w3;  // [D, Fs]
  T* shared_w2;  // [Fs, D]
  T* w1;         // [E_loc, D, F]  expert arena: this rank's experts
  T* w3;         // [E_loc, D, F]
  T* w2;         // [E_loc, F, D]
};

// Offsets of one layer's tensors in the dense and expert layouts.
struct MoeOffsets {
  size_t router = 0, shared_w1 = 0, shared_w3 = 0, shared_w2 = 0;  // dense
  size_t w1 = 0, w3 = 0, w2 = 0;                                   // experts
};

// Appends layer `layer`'s MoE tensors to the layouts: replicated ones to `dense`, this rank's
// E_loc experts of `placement` to `experts` (in ascending global id), each expert a tensor of its
// own, named by its global id.
// Residual output projections (W2) are initialised with std 0.02/sqrt(2·num_layers) as in GPT-2.
MoeOffsets moe_layout(ParamLayout& dense, ParamLayout& experts, const MoeDims& dims, int layer,
                      int num_layers, const ExpertPlacement& placement, int ep_rank);

template <class T>
MoeWeights<T> moe_weights_at(T* dense, T* experts, const MoeOffsets& off, const MoeDims& dims);

// How this layer selects experts, and what the selection needs.
struct MoeRouting {
  RoutingMode mode = RoutingMode::kTopK;
  const float* bias = nullptr;          // [E]    top-k: added to scores for selection only
  const int32_t* hash_table = nullptr;  // [V, K] hash
  int vocab = 0;                        // V      hash
  const int32_t* token_ids = nullptr;   // [N]    hash
  int64_t first_global_token = 0;       //        forced: global index of local token 0
  uint64_t random_stream = 0;           //        forced random: the step's RNG stream
  RandomRouting skew;                   //        forced random: zipf / hot skew
  int routing_groups = 1;               //        top-k: G groups, group-limited when > 1
  int group_topk = 1;                   //        top-k: M groups a token may use
  // Sequence-wise balance loss (top-k layers; see balance.hpp): weight = α / global sequences
  // (and / top-k layers for the MaxText form); 0 turns it off.
  double balance_weight = 0.0;
  BalanceLossForm balance_loss_form = BalanceLossForm::kDeepSeek;
  // Router z-loss (every layer; see z_loss.hpp): weight = --z-loss-weight / global tokens; 0 off.
  double z_loss_weight = 0.0;
  int seq_len = 0;  // S: the loss, the shared expert's GEMMs and the
                    //   weight gradients go by sequences of S tokens
                    //   (N a multiple of S); 0: N tokens, one sequence
  // Token capacity (model/capacity.hpp), every layer whatever selects its experts: at most
  // `capacity` assignments per (sequence, expert), 0 = dropless.
  int64_t capacity = 0;
  DropPolicy drop_policy = DropPolicy::kByProbability;
  bool capacity_per_rank = false;  // counted over all N tokens (--capacity-unit rank), not by S
};

// The temporaries of one layer's forward or backward, which nothing keeps from one call to the
// next. A model's layers share one set (model_acts_reserve), each borrowing it for its calls: its
// pages stay in the caches from one layer to the next instead of every layer's own set coming
// from memory (the experts' backward of deepseek4-tiny at 1 rank × 1 thread 7% faster), and a
// rank holds one set instead of L.
template <class T> struct MoeScratch {
  std::vector<T> send_rows;  // [N·K, D] forward: input rows in send order
  std::vector<T> d_rows;     // [N·K, D] send-order rows: w·d_out out, d_x back
  std::vector<T> d_y, d_x;   // [R, D]
  std::vector<T> d_g, d_v;   // [R, F]
  // The expert activation h = swiglu(g, v) for the forward's W2 GEMM; in the backward first d_h,
  // then h again (swiglu_backward gives back the forward's bits) for W2's weight gradient: no
  // layer keeps its h from forward to backward.
  std::vector<T> h;                   // [R, F]
  std::vector<T> sd_g, sd_v, sh;      // [N, Fs] the shared expert's, likewise
  std::vector<T> d_weights;           // [N, K]
  std::vector<T> d_scores, d_logits;  // [N, E]
  // The router's and the shared expert's weight gradients go by sequence (model/tree_sum.hpp):
  std::vector<T> router_leaves;  // [max_sequences, D·E] each sequence's router gradient, when
                                 //   there are several, added along the tree afterwards
  // Per thread the scratch of a weight-gradient task's leaf tree (gemm_leaf_tree), for the tasks
  // that run at once.
  std::vector<std::vector<T>> leaf_scratch;  // [threads][leaf_scratch_values]
  size_t leaf_scratch_values = 0;
  int max_sequences = 0;  // reserved for (0: not reserved)
};

// Activations kept from forward for backward, and the temporaries of a call. Sized once by
// moe_saved_reserve; per-step sizes (R) resize within the reserved capacity, so a step allocates
// nothing unless its routing needs more rows than any earlier step did.
template <class T> struct MoeSaved {
  PhaseTimes* times = nullptr;      // where forward and backward add their phase times, or none
  int N = 0;                        // tokens of the last forward
  std::vector<T> logits, scores;    // [N, E]
  std::vector<int32_t> expert_idx;  // [N, K] selected experts (global ids)
  std::vector<T> weights;           // [N, K]
  DispatchPlan plan;                // plan.expert_counts: this rank's load per expert
  // y_rows, and the scratch's send_rows and d_rows, serve the exchange: an EP group of one rank
  // leaves them empty (its expert-major order is the send order: moe_experts.hpp, ExpertRows).
  std::vector<T> x;                   // [R, D] expert inputs, expert-major
  std::vector<T> g, v;                // [R, F] expert pre-activations (unclamped)
  std::vector<T> y;                   // [R, D] expert outputs, expert-major
  std::vector<T> y_rows;              // [N·K, D] expert outputs back in send order
  std::vector<T> sg, sv;              // [N, Fs] shared expert's
  double balance_loss = 0.0;          // this rank's share of the layer's balance loss
  std::vector<T> d_scores_balance;    // [N, E] its gradient, added in backward
  std::vector<int32_t> topk_scratch;  // [N, K]
  // With a token capacity: expert_idx with −1 for the assignments dropped (the plan's input), and
  // this rank's dropped assignments per expert; dispatched_idx empty and dropped zero without.
  std::vector<int32_t> dispatched_idx;  // [N, K]
  std::vector<int64_t> dropped;         // [E]
  std::vector<int> capacity_scratch;    // capacity_drop's: 3·E + 1 + N·K at most
  // The assignments the plan sends (expert_idx, with −1 for the dropped under a capacity), and
  // expert e's load of the selection, the dropped included.
  const std::vector<int32_t>& sent_idx() const {
    return dispatched_idx.empty() ? expert_idx : dispatched_idx;
  }
  int64_t selected_load(int e) const { return plan.expert_counts[e] + dropped[e]; }
  std::vector<double> balance_scratch;  // [(S + 2)·E]
  double z_loss = 0.0;                  // this rank's share of the layer's router z-loss
  double z_loss_weight = 0.0;           // the forward's MoeRouting::z_loss_weight, for backward

  // The temporaries of a call (own, or a model's shared set lent for the call: MoeScratch).
  MoeScratch<T> scratch;
  // The router's and the shared and routed experts' weight gradients go by sequence
  // (model/tree_sum.hpp): the forward's N tokens are N / seq_len sequences (one when seq_len is
  // 0), at most max_sequences.
  int seq_len = 0;
  int max_sequences = 0;
  // Where the EP group's sequences lie (the run sets it) and the rows behind each leaf of the
  // routed experts' weight gradients (model/expert_grads.hpp).
  ExpertGradLayout expert_layout;
  ExpertSeqRows expert_rows;
  std::vector<int> chunk_offsets;  // [local experts + 1]: each expert's first row task
  // With weight_grads_final (the caller's promise that the backward's routed expert gradients
  // are final: one plane, no replicas to add), backward writes each routed expert's W1, W3 and
  // W2 gradients instead of adding to them (the bits of adding to zeros; +0 for an expert
  // without rows), so the caller need not zero them, and (float only) leaves each one's Σ g²
  // (sum_squares), [local experts, 3] in the order W2, W1, W3, taken while each is in cache: 0
  // for an expert without rows.
  bool weight_grads_final = false;
  std::vector<double> weight_grad_sq;
};

// Element counts of MoeSaved's buffers for N tokens in max_sequences sequences, with up to
// R = P·N·min(K, max_local) rows received (the worst case: every local expert receiving K rows per
// token of every EP rank): the one source of both moe_saved_reserve and model_memory_estimate.
// Doubles, so that sizes that are then refused are counted without overflow.
struct MoeSavedSizes {
  double NE = 0;   // logits, scores, d_scores, d_logits, d_scores_balance [N, E]
  double NK = 0;   // expert_idx, topk_scratch, dispatched_idx, weights, d_weights, the plan's
                   //   send arrays [N, K]
  double R = 0;    // rows received
  double NKD = 0;  // send_rows, y_rows, d_rows [N·K, D]; none in an EP group of one rank
  double RD = 0, RF = 0;     // x, y, d_y, d_x [R, D]; g, v, d_g, d_v, h [R, F]
  double NFs = 0;            // the shared expert's sg, sv, sd_g, sd_v, sh [N, Fs]
  double router_leaves = 0;  // the router's weight-gradient leaves: max_sequences·D·E when
                             //   max_sequences > 1
  double leaf_scratch = 0;   // a weight-gradient task's leaf-tree scratch: the most
                             //   gemm_leaf_tree_scratch of the routed and shared weights' shapes
  int leaf_scratches = 0;    // one per thread
  // A layer's own buffers (MoeSaved less its scratch); the scratch (MoeScratch) less its trees;
  // the trees (router_leaves, leaf_scratch), which are scratch too.
  double activations() const { return 3 * NE + 6 * NK + NKD + 2 * RD + 2 * RF + 2 * NFs; }
  double scratch() const { return 2 * NE + NK + 2 * NKD + 2 * RD + 3 * RF + 3 * NFs; }
  double trees() const { return router_leaves + double(leaf_scratches) * leaf_scratch; }
};
MoeSavedSizes moe_saved_sizes(double N, const MoeDims& dims, int ep_size, int max_local,
                              int max_sequences, int threads);

// Reserves room for N local tokens, in at most `max_sequences` sequences, on an EP group of
// `ep_size` ranks owning at most `max_local` experts each: R <= ep_size · N · min(K, max_local);
// the weight-gradient tasks' leaf-tree scratch for the OpenMP threads a parallel region gets now
// (omp_get_max_threads; a backward with more threads adds scratch). Without own_scratch,
// saved.scratch is left empty: a model's layers borrow one set (moe_scratch_reserve) for each call.
// The default suits routing without a sequence length (seq_len 0: all N tokens one sequence).
template <class T>
void moe_saved_reserve(MoeSaved<T>& saved, int N, const MoeDims& dims, int ep_size, int max_local,
                       int max_sequences = 1, bool own_scratch = true);
template <class T>
void moe_scratch_reserve(MoeScratch<T>& scratch, int N, const MoeDims& dims, int ep_size,
                         int max_local, int max_sequences);

// out[N, D] = MoE(in). Collective over the EP group of `ex`. Throws std::invalid_argument, before
// any communication, when N is not a multiple of routing.seq_len or holds more sequences than
// were reserved, or when the layer's scratch is not reserved for as many sequences as the layer.
template <class T>
void moe_forward(T* out,              // [N, D]
                 MoeSaved<T>& saved,  //
                 const T* in,         // [N, D]
                 const MoeWeights<T>& w, const MoeRouting& routing, const MoeDims& dims,
                 const ExpertPlacement& placement, EpExchange& ex, int N);

// d_in[N, D] += ∂/∂in, grads += ∂/∂weights, for the last forward. Collective over the EP group.
template <class T>
void moe_backward(T* d_in,  // [N, D]
                  const MoeWeights<T>& grads,
                  const T* d_out,  // [N, D]
                  MoeSaved<T>& saved,
                  const T* in,  // [N, D] the forward's input
                  const MoeWeights<T>& w, const MoeDims& dims, EpExchange& ex);

}  // namespace moe
