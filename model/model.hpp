// The whole decoder (docs/architecture.md, "The model"): embedding, per layer
// `x += Attn(RMSNorm(x))` then `x += MoE_l(RMSNorm(x))`, final RMSNorm, untied LM head, next-token
// cross-entropy. model_forward is a flat list of layer calls; model_backward is the same list
// reversed.
//
// Legend: B sequences on this rank, S sequence length, N = B·S local tokens, D model width,
// V vocab, L layers, L_h hash layers, E experts, K experts per token.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/ep_exchange.hpp"
#include "model/attention.hpp"
#include "model/config.hpp"
#include "model/moe_layer.hpp"
#include "model/params.hpp"
#include "model/phase_timer.hpp"
#include "model/routing_config.hpp"
#include "model/tree_sum.hpp"

namespace moe {

struct LayerOffsets {
  size_t attn_norm = 0;  // [D]
  size_t wq = 0;         // [D, H·hd]
  size_t wk = 0;         // [D, KVH·hd]
  size_t wv = 0;         // [D, KVH·hd]
  size_t wo = 0;         // [H·hd, D]
  size_t moe_norm = 0;   // [D]
  MoeOffsets moe;
};

// Both arenas' layouts for this rank (dense replicated everywhere; experts of this EP rank).
struct ModelLayout {
  ParamLayout dense, experts;
  size_t embed = 0;                  // [V, D]
  size_t final_norm = 0;             // [D]
  size_t lm_head = 0;                // [D, V]
  std::vector<LayerOffsets> layers;  // [L]
};
// Which EP rank holds which experts, per layer ([L]): the contiguous layout in every layer unless
// --expert-placement says otherwise.
using ModelPlacement = std::vector<ExpertPlacement>;
ModelPlacement model_placement_contiguous(const ModelConfig& cfg, int ep_size);
// The most experts any rank holds in any layer: what the per-layer buffers are sized for.
int model_placement_max_local(const ModelPlacement& placement);
// Whether some layer holds an expert on several ranks.
bool model_placement_has_replicas(const ModelPlacement& placement);

ModelLayout model_layout(const ModelConfig& cfg, const ModelPlacement& placement, int ep_rank);

// Routing that is not a parameter: the run's routing configuration, the loss-free bias (outside
// the optimizer), the hash tables, and the seed of forced random routing.
struct RoutingState {
  RoutingConfig config;              // the run's (the option table parsed it)
  std::vector<RoutingMode> modes;    // [L]
  std::vector<float> bias;           // [L, E]; zero and unused outside top-k layers
  std::vector<float> shadow_bias;    // [R, L, E] of config.shadows' R shadow balancers
  std::vector<int32_t> hash_tables;  // [L_h, V, K]
  uint64_t random_seed = 0;          // forced random routing
  int num_topk_layers() const;
};
// Hash layers [0, L_h) get seeded tables, the rest route top-k; a forced routing
// (config.force_balance) replaces every layer's.
RoutingState routing_state_make(const ModelConfig& cfg, const RoutingConfig& config, uint64_t seed);

// Routed-expert parameters of the whole model, every expert once: L·E·3·D·F.
inline double model_expert_params(const ModelConfig& cfg) {
  return static_cast<double>(cfg.layers) * cfg.experts * 3 * cfg.d_model * cfg.ffn_dim;
}

// Element counts of ModelActs' own buffers (those outside the layers' AttnSaved and MoeSaved) for
// B sequences: the one source of both model_acts_reserve and model_memory_estimate.
struct ModelActSizes {
  double resid = 0, normed = 0, rstd = 0;  // [2L+1, N, D], [2L, N, D], [2L+1, N]
  double ND = 0;    // block_out, final_normed, d_resid, d_normed, d_final [N, D]
  double NV = 0;    // logits, d_logits [N, V]
  double rows = 0;  // row_loss [N] (doubles: counted twice)
  double tree = 0;  // the LM head's and embedding's weight-gradient tree width [V, D]
  int tree_depth = 1;
  double norm_leaves = 0;  // the norms' per-sequence gradients [B, D]
  double activations() const { return resid + normed + rstd + 5 * ND + 2 * NV + 2 * rows; }
  double trees() const { return tree_depth * tree + norm_leaves; }
};
ModelActSizes model_act_sizes(const ModelConfig& cfg, int B);

// Bytes one rank holds for a model, counted from the configuration alone (nothing is allocated, so
// it is safe on absurd sizes): parameters, gradients and AdamW's two moments of both arenas, and
// the activations model_acts_reserve sizes for `batch_per_rank` sequences (the MoE rows at their
// worst case, every local expert receiving K rows per token of every EP rank). Doubles: the
// counts may exceed any integer type for configurations that are then refused.
struct ModelMemory {
  double param_bytes = 0;  // parameters + gradients + AdamW m, v (fp32), replicas' planes included
  double act_bytes = 0;    // saved activations and their gradients (fp32), tree_bytes included
  double tree_bytes = 0;   // the per-sequence weight-gradient partial sums (model/tree_sum.hpp)
  double max_tensor = 0;   // elements of the largest single tensor
  const char* max_tensor_name = "";  // which one, with the options that size it
  double total() const { return param_bytes + act_bytes; }
};
// With `world_size` ranks (0: one EP group) forming several EP groups, the expert gradients'
// extra planes, the gathered planes of every group and the tree's scratch (runtime/run/trainer.cpp,
// model/expert_grads.hpp) count with the parameters.
// `max_local`: the most experts a rank holds in a layer (model_placement_max_local); 0: those of
// the contiguous layout. `threads`: the rank's OpenMP threads (a weight-gradient task's leaf-tree
// scratch each).
ModelMemory model_memory_estimate(const ModelConfig& cfg, int ep_size, int world_size = 0,
                                  int max_local = 0, int threads = 1);

// Everything one step keeps from forward for backward, and the layers' one set of temporaries,
// sized once for B sequences.
template <class T> struct ModelActs {
  PhaseTimes* times = nullptr;  // phase timers of forward and backward, or none
  int B = 0;
  std::vector<T> resid;          // [2L+1, N, D] residual stream before each sub-block, and final
  std::vector<T> normed;         // [2L, N, D] RMSNorm outputs fed to attention / MoE
  std::vector<T> rstd;           // [2L+1, N]
  std::vector<T> block_out;      // [N, D] scratch: one sub-block's output
  std::vector<T> final_normed;   // [N, D]
  std::vector<T> logits;         // [N, V]
  std::vector<T> d_logits;       // [N, V] written by forward (fused cross-entropy)
  std::vector<double> row_loss;  // [N] the cross-entropy's per-token losses (scratch)
  std::vector<T> d_resid, d_normed, d_final;  // [N, D] backward scratch
  std::vector<double> layer_balance_loss;     // [L] this rank's share, from the last forward
  std::vector<double> layer_z_loss;           // [L] this rank's share of the router z-loss
  TreeSum<T> grad_tree;            // per-sequence weight gradients of the LM head, embedding
  std::vector<T> norm_leaves;      // [B, D] per-sequence weight gradients of an RMSNorm
  RopeTable rope;                  // cos/sin for S positions
  std::vector<AttnSaved<T>> attn;  // [L]
  std::vector<MoeSaved<T>> moe;    // [L]
  // The layers' temporaries, one set that each layer's forward and backward borrow (their own
  // AttnSaved::scratch and MoeSaved::scratch stay empty): it stays in the caches from one layer
  // to the next.
  AttnScratch<T> attn_scratch;
  MoeScratch<T> moe_scratch;
};

template <class T>
void model_acts_reserve(ModelActs<T>& acts, const ModelConfig& cfg, int B, int ep_size,
                        int max_local);

// What the forward needs besides parameters.
struct ModelBatch {
  const int32_t* tokens = nullptr;   // [N] input ids
  const int32_t* targets = nullptr;  // [N] next-token ids
  int64_t first_global_token = 0;    // global index of local token 0 (forced routing)
  int64_t step = 0;                  // forced random routing draws anew each step
  double loss_scale = 1.0;           // 1 / global token count: gradients of the global mean
  int64_t num_global_sequences = 1;  // the balance loss is averaged over these (the z-loss over
                                     // their tokens)
};

// Runs the model on N = B·S local tokens. Returns the local sum of token losses (the caller
// all-reduces and divides); leaves d_logits of the global mean loss in acts for backward, and
// each layer's share of the balance loss (already a share of the global mean) in
// acts.layer_balance_loss, and of the router z-loss in acts.layer_z_loss; backward differentiates
// CE mean + Σ balance + Σ z-loss.
// Collective over the EP group (MoE layers).
// Parameters are read only; they are passed as T* because MoeWeights and AttnWeights serve for
// both parameters and gradients.
template <class T>
double model_forward(ModelActs<T>& acts, T* dense, T* experts, const ModelLayout& layout,
                     const RoutingState& routing, const ModelBatch& batch, const ModelConfig& cfg,
                     const ModelPlacement& placement, EpExchange& ex);

// Adds the gradient of the global mean loss into d_dense / d_experts (same layouts).
template <class T>
void model_backward(T* d_dense, T* d_experts, ModelActs<T>& acts, T* dense, T* experts,
                    const ModelLayout& layout, const ModelBatch& batch, const ModelConfig& cfg,
                    EpExchange& ex);

// Forward FLOPs per token of the matrix work (multiply-adds count 2): attention projections and
// core (with the sliding window's mean visible keys), router, K routed experts, shared expert, LM
// head. A training step costs about 3× this per token (backward is twice forward).
double model_forward_flops_per_token(const ModelConfig& cfg);

}  // namespace moe
