// The decoder's layout, forward and backward as flat lists of layer calls.
#include "model/model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/capacity.hpp"
#include "model/embedding.hpp"
#include "model/expert_grads.hpp"
#include "model/linear.hpp"
#include "model/parallel.hpp"
#include "model/per_sequence.hpp"
#include "model/rmsnorm.hpp"
#include "model/rng.hpp"
#include "model/router.hpp"

namespace moe {

ModelPlacement model_placement_contiguous(const ModelConfig& c, int ep_size) {
  return ModelPlacement(c.layers, ExpertPlacement(c.experts, ep_size));
}

int model_placement_max_local(const ModelPlacement& placement) {
  int most = 0;
  for (const ExpertPlacement& layer : placement) most = std::max(most, layer.max_local());
  return most;
}

bool model_placement_has_replicas(const ModelPlacement& placement) {
  return std::any_of(placement.begin(), placement.end(),
                     [](const ExpertPlacement& layer) { return layer.has_replicas(); });
}

ModelLayout model_layout(const ModelConfig& c, const ModelPlacement& placement, int ep_rank) {
  if (placement.size() != static_cast<size_t>(c.layers)) {
    throw std::invalid_argument("model_layout: a placement of " + std::to_string(placement.size()) +
                                " layers for a model of " + std::to_string(c.layers));
  }
  for (const ExpertPlacement& layer : placement) {
    if (layer.num_experts != c.experts || ep_rank < 0 || ep_rank >= layer.ep_size) {
      throw std::invalid_argument(
          "model_layout: a placement of " + std::to_string(layer.num_experts) + " experts on " +
          std::to_string(layer.ep_size) + " ranks for a model of " + std::to_string(c.experts) +
          " experts, EP rank " + std::to_string(ep_rank));
    }
  }
  constexpr float kStd = 0.02f;
  const float out_std = kStd / std::sqrt(2.0f * static_cast<float>(c.layers));
  const size_t D = c.d_model, V = c.vocab, Hd = static_cast<size_t>(c.heads) * c.head_dim,
               KVd = static_cast<size_t>(c.kv_heads) * c.head_dim;
  const MoeDims md = moe_dims_from(c);
  ModelLayout m;
  m.embed = m.dense.add("embed", V * D, ParamInit::kNormal, kStd);
  m.layers.resize(c.layers);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerOffsets& o = m.layers[l];
    o.attn_norm = m.dense.add(p + "attn_norm", D, ParamInit::kOnes, 0.0f, /*weight_decay=*/false);
    o.wq = m.dense.add(p + "attn.wq", D * Hd, ParamInit::kNormal, kStd);
    o.wk = m.dense.add(p + "attn.wk", D * KVd, ParamInit::kNormal, kStd);
    o.wv = m.dense.add(p + "attn.wv", D * KVd, ParamInit::kNormal, kStd);
    o.wo = m.dense.add(p + "attn.wo", Hd * D, ParamInit::kNormal, out_std);
    o.moe_norm = m.dense.add(p + "moe_norm", D, ParamInit::kOnes, 0.0f, /*weight_decay=*/false);
    o.moe = moe_layout(m.dense, m.experts, md, l, c.layers, placement[l], ep_rank);
  }
  m.final_norm = m.dense.add("final_norm", D, ParamInit::kOnes, 0.0f, /*weight_decay=*/false);
  m.lm_head = m.dense.add("lm_head", D * V, ParamInit::kNormal, kStd);
  return m;
}

int RoutingState::num_topk_layers() const {
  return static_cast<int>(std::count(modes.begin(), modes.end(), RoutingMode::kTopK));
}

RoutingState routing_state_make(const ModelConfig& c, const RoutingConfig& config, uint64_t seed) {
  RoutingState r;
  r.config = config;
  const RoutingMode forced = config.force_balance.mode();
  r.modes.resize(c.layers);
  for (int l = 0; l < c.layers; ++l) {
    const RoutingMode natural = l < c.hash_layers ? RoutingMode::kHash : RoutingMode::kTopK;
    r.modes[l] = forced == RoutingMode::kTopK ? natural : forced;
  }
  r.random_seed = seed;
  r.bias.assign(static_cast<size_t>(c.layers) * c.experts, 0.0f);
  r.shadow_bias.assign(config.shadows.size() * c.layers * c.experts, 0.0f);
  const size_t table = static_cast<size_t>(c.vocab) * c.top_k;
  r.hash_tables.resize(table * c.hash_layers);
  for (int l = 0; l < c.hash_layers; ++l) {
    hash_table_init(&r.hash_tables[l * table], c.vocab, c.experts, c.top_k, seed, l);
  }
  return r;
}

ModelMemory model_memory_estimate(const ModelConfig& c, int ep_size, int world_size,
                                  int max_local_in, int threads) {
  const double V = c.vocab, D = c.d_model, L = c.layers, E = c.experts, K = c.top_k, F = c.ffn_dim,
               Fs = static_cast<double>(c.shared_experts) * c.ffn_dim, H = c.heads,
               HD = H * c.head_dim, KD = static_cast<double>(c.kv_heads) * c.head_dim,
               N = static_cast<double>(c.batch_per_rank) * c.seq_len;
  const int P = std::max(1, ep_size), B = std::max(c.batch_per_rank, 0);
  const int max_local =
      max_local_in > 0 ? max_local_in : (c.experts + P - 1) / P;  // the contiguous layout's
  const double dense = 2 * V * D + L * (2 * D + 2 * D * HD + 2 * D * KD + D * E + 3 * D * Fs) + D;
  const double experts = L * static_cast<double>(max_local) * 3 * D * F;
  // What model_acts_reserve reserves, from the same size functions: per layer attention's and
  // the MoE block's saved buffers, and once their scratch and weight-gradient trees (the MoE rows
  // at their worst case, so that part is an upper bound); the residual stream, norms and logits;
  // the LM head's and embedding's tree.
  const AttnSavedSizes attn = attn_saved_sizes(B, attn_dims_from(c), threads);
  const MoeSavedSizes moe = moe_saved_sizes(N, moe_dims_from(c), P, max_local, B, threads);
  const ModelActSizes own = model_act_sizes(c, B);
  const double trees = attn.trees() + moe.trees() + own.trees();
  const double acts = L * (attn.activations() + moe.activations()) + attn.scratch() +
                      moe.scratch() + own.activations() + trees;
  const double keys = attn_keys_per_tile(attn_dims_from(c));
  const double rows = moe.R;
  ModelMemory m;
  m.param_bytes = 4.0 * sizeof(float) * (dense + experts);
  const int W = std::max(world_size, P), G = W / P;
  if (G > 1 && B > 0) {
    // Expert gradients of several EP groups (Trainer::reduce_expert_replicas).
    size_t planes = 1;
    for (const std::vector<TreeNode>& nodes : expert_grad_group_nodes(W, P, B)) {
      planes = std::max(planes, nodes.size());
    }
    // One plane: allreduce_sum_tree's scratch; more: the gathered planes and the top's scratch.
    const double copies = planes == 1 ? 1.0
                                      : static_cast<double>(planes - 1) +
                                            static_cast<double>(G * planes) + tree_sum_depth(W * B);
    m.param_bytes += sizeof(float) * experts * copies;
  }
  m.act_bytes = sizeof(float) * acts;
  m.tree_bytes = sizeof(float) * trees;
  // The tensors indexed with int (rows times a width), which must stay below 2^31 elements.
  const std::pair<double, const char*> tensors[] = {
      {V * D, "embedding [V, D] (--vocab, --d-model)"},
      {D * HD, "attention projection [D, H·hd] (--d-model, --heads, --head-dim)"},
      {D * E, "router [D, E] (--d-model, --experts)"},
      {D * F, "expert weight [D, F] (--d-model, --ffn-dim)"},
      {D * Fs, "shared expert weight [D, shared·F] (--d-model, --shared-experts, --ffn-dim)"},
      {N * D, "hidden states [B·S, D] (--batch-per-rank, --seq-len, --d-model)"},
      {N * V, "logits [B·S, V] (--batch-per-rank, --seq-len, --vocab)"},
      {N * E, "router scores [B·S, E] (--batch-per-rank, --seq-len, --experts)"},
      {N * H * keys, "attention probabilities (--batch-per-rank, --seq-len, --heads)"},
      {N * K * D, "dispatched rows [B·S·K, D] (--batch-per-rank, --seq-len, --top-k)"},
      {rows * std::max(D, F), "expert rows [rows, max(D, F)] (--seq-len, --top-k, --ffn-dim)"}};
  for (const auto& [elements, name] : tensors) {
    if (elements > m.max_tensor) m.max_tensor = elements, m.max_tensor_name = name;
  }
  return m;
}

ModelActSizes model_act_sizes(const ModelConfig& c, int B) {
  const double N = static_cast<double>(B) * c.seq_len, D = c.d_model, L = c.layers;
  ModelActSizes z;
  z.resid = (2 * L + 1) * N * D;
  z.normed = 2 * L * N * D;
  z.rstd = (2 * L + 1) * N;
  z.ND = N * D;
  z.NV = N * c.vocab;
  z.rows = N;
  z.tree = static_cast<double>(c.vocab) * D;
  z.tree_depth = tree_sum_depth(B);
  z.norm_leaves = static_cast<double>(B) * D;
  return z;
}

template <class T>
void model_acts_reserve(ModelActs<T>& a, const ModelConfig& c, int B, int ep_size, int max_local) {
  const ModelActSizes z = model_act_sizes(c, B);
  auto n = [](double elements) { return static_cast<size_t>(elements); };
  const size_t N = static_cast<size_t>(B) * c.seq_len, L = c.layers;
  a.B = B;
  a.resid.assign(n(z.resid), T(0));
  a.normed.assign(n(z.normed), T(0));
  a.rstd.assign(n(z.rstd), T(0));
  for (auto* v : {&a.block_out, &a.final_normed, &a.d_resid, &a.d_normed, &a.d_final}) {
    v->assign(n(z.ND), T(0));
  }
  a.logits.assign(n(z.NV), T(0));
  a.layer_balance_loss.assign(L, 0.0);
  a.layer_z_loss.assign(L, 0.0);
  a.d_logits.assign(n(z.NV), T(0));
  a.row_loss.assign(n(z.rows), 0.0);
  a.grad_tree.reserve(n(z.tree), B);
  a.norm_leaves.assign(n(z.norm_leaves), T(0));
  a.rope = rope_table_make(c.seq_len, c.head_dim, c.rope_theta);
  const AttnDims ad = attn_dims_from(c);
  const MoeDims md = moe_dims_from(c);
  a.attn.resize(L);
  a.moe.resize(L);
  for (size_t l = 0; l < L; ++l) {
    attn_saved_reserve(a.attn[l], B, ad, /*own_scratch=*/false);
    moe_saved_reserve(a.moe[l], static_cast<int>(N), md, ep_size, max_local, B,
                      /*own_scratch=*/false);
  }
  attn_scratch_reserve(a.attn_scratch, B, ad);
  moe_scratch_reserve(a.moe_scratch, static_cast<int>(N), md, ep_size, max_local, B);
}

namespace {

// out = a + b over the residual stream, on the threads (elementwise: the same bits whatever the
// split).
template <class T> void add_into(T* out, const T* a, const T* b, size_t n) {
  parallel_blocks(static_cast<int64_t>(n), kParallelValues, [=](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
  });
}

// Lends a model's one set of scratch to a layer for one call: the layer's own (empty) scratch and
// the set swap places (vectors' pointers, nothing copied), and back when the loan ends, also when
// the call throws.
template <class S> class ScratchLoan {
 public:
  ScratchLoan(S& layer, S& lent) : layer_(layer), lent_(lent) { std::swap(layer_, lent_); }
  ~ScratchLoan() { std::swap(layer_, lent_); }
  ScratchLoan(const ScratchLoan&) = delete;
  ScratchLoan& operator=(const ScratchLoan&) = delete;

 private:
  S& layer_;
  S& lent_;
};

template <class T> AttnWeights<T> attn_weights_at(T* dense, const LayerOffsets& o) {
  return AttnWeights<T>{dense + o.wq, dense + o.wk, dense + o.wv, dense + o.wo};
}

template <class T>
MoeRouting layer_routing(const RoutingState& r, const ModelBatch& b, const ModelConfig& c, int l) {
  MoeRouting m;
  m.mode = r.modes[l];
  m.bias = &r.bias[static_cast<size_t>(l) * c.experts];
  if (l < c.hash_layers) {
    m.hash_table = &r.hash_tables[static_cast<size_t>(l) * c.vocab * c.top_k];
  }
  m.vocab = c.vocab;
  m.token_ids = b.tokens;
  m.first_global_token = b.first_global_token;
  m.random_stream = rng_mix64(rng_stream(r.random_seed, "forced_random") ^
                              rng_mix64(static_cast<uint64_t>(b.step) * 4096 + l));
  const RoutingConfig& rc = r.config;
  m.skew = rc.force_balance.skew;
  m.routing_groups = rc.routing_groups;
  m.group_topk = rc.group_topk;
  if (rc.seq_aux_loss_weight > 0) {
    double weight = rc.seq_aux_loss_weight / static_cast<double>(b.num_global_sequences);
    if (rc.balance_loss_form == BalanceLossForm::kMaxText) {
      weight /= std::max(1, r.num_topk_layers());
    }
    m.balance_weight = weight;
  }
  m.balance_loss_form = rc.balance_loss_form;
  if (rc.z_loss_weight > 0) {  // a mean over the step's T tokens
    m.z_loss_weight = rc.z_loss_weight / (static_cast<double>(b.num_global_sequences) * c.seq_len);
  }
  m.seq_len = c.seq_len;
  m.capacity_per_rank = rc.capacity_unit == CapacityUnit::kRank;
  m.capacity = expert_capacity(rc.capacity_factor,
                               m.capacity_per_rank ? c.batch_per_rank * c.seq_len : c.seq_len,
                               c.top_k, c.experts);
  m.drop_policy = rc.drop_policy;
  return m;
}

// What model_forward and model_backward both start from: the step's sizes (N = B·S rows) and
// the saved planes they index (plane i of `resid` and `normed` is [N, D], of `rstd` [N]).
template <class T> struct StepShape {
  StepShape(ModelActs<T>& a, const ModelConfig& c)
      : B(a.B),
        S(c.seq_len),
        N(a.B * c.seq_len),
        D(c.d_model),
        V(c.vocab),
        ND(static_cast<size_t>(N) * D),
        ad(attn_dims_from(c)),
        md(moe_dims_from(c)),
        resid(a.resid.data()),
        normed(a.normed.data()),
        rstd(a.rstd.data()) {}
  int B, S, N, D, V;
  size_t ND;
  AttnDims ad;
  MoeDims md;
  T* resid;   // [2L+1, N, D]
  T* normed;  // [2L, N, D]
  T* rstd;    // [2L+1, N]
};

}  // namespace

template <class T>
double model_forward(ModelActs<T>& a, T* dense, T* experts, const ModelLayout& m,
                     const RoutingState& routing, const ModelBatch& b, const ModelConfig& c,
                     const ModelPlacement& placement, EpExchange& ex) {
  const StepShape<T> z(a, c);
  const int B = z.B, S = z.S, N = z.N, D = z.D, V = z.V;
  const size_t ND = z.ND;
  T *resid = z.resid, *normed = z.normed, *rstd = z.rstd;

  {
    ScopedPhase timer(a.times, Phase::kOther);
    embedding_forward(resid, b.tokens, dense + m.embed, N, D, V);
  }
  for (int l = 0; l < c.layers; ++l) {
    const LayerOffsets& o = m.layers[l];
    const size_t i0 = 2 * l, i1 = 2 * l + 1;
    {
      // x1 = x0 + Attn(RMSNorm(x0))
      ScopedPhase timer(a.times, Phase::kAttention);
      rmsnorm_forward(normed + i0 * ND, rstd + i0 * N, resid + i0 * ND, dense + o.attn_norm, N, D,
                      c.norm_eps);
      {
        const ScratchLoan loan(a.attn[l].scratch, a.attn_scratch);
        attention_forward(a.block_out.data(), a.attn[l], normed + i0 * ND,
                          attn_weights_at(dense, o), z.ad, a.rope, B);
      }
      add_into(resid + i1 * ND, resid + i0 * ND, a.block_out.data(), ND);
      // x2 = x1 + MoE(RMSNorm(x1)): the norm is counted with attention, the MoE times itself
      rmsnorm_forward(normed + i1 * ND, rstd + i1 * N, resid + i1 * ND, dense + o.moe_norm, N, D,
                      c.norm_eps);
    }
    a.moe[l].times = a.times;
    {
      const ScratchLoan loan(a.moe[l].scratch, a.moe_scratch);
      moe_forward(a.block_out.data(), a.moe[l], normed + i1 * ND,
                  moe_weights_at(dense, experts, o.moe, z.md), layer_routing<T>(routing, b, c, l),
                  z.md, placement[l], ex, N);
    }
    add_into(resid + (i1 + 1) * ND, resid + i1 * ND, a.block_out.data(), ND);
    a.layer_balance_loss[l] = a.moe[l].balance_loss;
    a.layer_z_loss[l] = a.moe[l].z_loss;
  }
  ScopedPhase timer(a.times, Phase::kOther);
  const size_t last = 2 * static_cast<size_t>(c.layers);
  rmsnorm_forward(a.final_normed.data(), rstd + last * N, resid + last * ND, dense + m.final_norm,
                  N, D, c.norm_eps);
  // All B·S rows in one call: a row's logits do not depend on the call's rows (model/gemm/), and
  // the [D, V] weight is packed once rather than once per sequence.
  linear_forward(a.logits.data(), a.final_normed.data(), dense + m.lm_head, N, D, V);
  cross_entropy_forward_backward(a.d_logits.data(), a.row_loss.data(), a.logits.data(), b.targets,
                                 N, V, b.loss_scale);
  // The loss summed per sequence, the sequences along the fixed tree (model/tree_sum.hpp).
  TreeSumScalar loss;
  for (int s = 0; s < a.B; ++s) {
    double sequence = 0.0;
    for (int t = s * S; t < (s + 1) * S; ++t) sequence += a.row_loss[t];
    loss.push(sequence);
  }
  return loss.finish();
}

template <class T>
void model_backward(T* dd, T* de, ModelActs<T>& a, T* dense, T* experts, const ModelLayout& m,
                    const ModelBatch& b, const ModelConfig& c, EpExchange& ex) {
  const StepShape<T> z(a, c);
  const int B = z.B, S = z.S, N = z.N, D = z.D, V = z.V;
  const size_t ND = z.ND;
  T *resid = z.resid, *normed = z.normed, *rstd = z.rstd;
  T* d_resid = a.d_resid.data();
  T* d_normed = a.d_normed.data();

  {
    // logits = final_normed·lm_head; final_normed = RMSNorm(x_L)
    ScopedPhase timer(a.times, Phase::kOther);
    const size_t last = 2 * static_cast<size_t>(c.layers);
    parallel_zero(a.d_final.data(), a.d_final.size());
    linear_backward_input(a.d_final.data(), a.d_logits.data(), dense + m.lm_head, N, D, V);
    seq_linear_weight_backward(dd + m.lm_head, a.grad_tree, a.d_logits.data(),
                               a.final_normed.data(), B, S, D, V);
    parallel_zero(a.d_resid.data(), a.d_resid.size());
    seq_rmsnorm_backward(d_resid, dd + m.final_norm, a.norm_leaves, a.d_final.data(),
                         resid + last * ND, dense + m.final_norm, rstd + last * N, B, S, D);
  }
  for (int l = c.layers - 1; l >= 0; --l) {
    const LayerOffsets& o = m.layers[l];
    const size_t i0 = 2 * l, i1 = 2 * l + 1;
    // x2 = x1 + MoE(RMSNorm(x1)): d_x1 = d_x2 + RMSNorm'ᵀ(MoE'ᵀ d_x2)
    parallel_zero(a.d_normed.data(), a.d_normed.size());
    {
      const ScratchLoan loan(a.moe[l].scratch, a.moe_scratch);
      moe_backward(d_normed, moe_weights_at(dd, de, o.moe, z.md), d_resid, a.moe[l],
                   normed + i1 * ND, moe_weights_at(dense, experts, o.moe, z.md), z.md, ex);
    }
    ScopedPhase timer(a.times, Phase::kAttentionBackward);
    seq_rmsnorm_backward(d_resid, dd + o.moe_norm, a.norm_leaves, d_normed, resid + i1 * ND,
                         dense + o.moe_norm, rstd + i1 * N, B, S, D);
    // x1 = x0 + Attn(RMSNorm(x0)): d_x0 = d_x1 + RMSNorm'ᵀ(Attn'ᵀ d_x1)
    parallel_zero(a.d_normed.data(), a.d_normed.size());
    {
      const ScratchLoan loan(a.attn[l].scratch, a.attn_scratch);
      attention_backward(d_normed, attn_weights_at(dd, o), d_resid, a.attn[l], normed + i0 * ND,
                         attn_weights_at(dense, o), z.ad, a.rope, B);
    }
    seq_rmsnorm_backward(d_resid, dd + o.attn_norm, a.norm_leaves, d_normed, resid + i0 * ND,
                         dense + o.attn_norm, rstd + i0 * N, B, S, D);
  }
  // x0 = embed[tokens]
  ScopedPhase timer(a.times, Phase::kOther);
  seq_embedding_backward(dd + m.embed, a.grad_tree, d_resid, b.tokens, B, S, D, V);
}

double model_forward_flops_per_token(const ModelConfig& c) {
  const double D = c.d_model, Hd = static_cast<double>(c.heads) * c.head_dim,
               KVd = static_cast<double>(c.kv_heads) * c.head_dim, F = c.ffn_dim,
               Fs = static_cast<double>(c.shared_experts) * c.ffn_dim;
  double keys = 0;  // mean keys a query sees: min(s + 1, window) over positions s
  for (int s = 0; s < c.seq_len; ++s) {
    keys += c.sliding_window > 0 ? std::min(s + 1, c.sliding_window) : s + 1;
  }
  keys /= c.seq_len;
  const double attention = 2 * D * (2 * Hd + 2 * KVd) + 2 * 2 * Hd * keys;
  const double moe = 2 * D * c.experts + c.top_k * 6 * D * F + 6 * D * Fs;
  return c.layers * (attention + moe) + 2 * D * c.vocab;
}

#define MOE_MODEL_INSTANTIATE(T)                                                                   \
  template void model_acts_reserve<T>(ModelActs<T>&, const ModelConfig&, int, int, int);           \
  template double model_forward<T>(ModelActs<T>&, T*, T*, const ModelLayout&, const RoutingState&, \
                                   const ModelBatch&, const ModelConfig&, const ModelPlacement&,   \
                                   EpExchange&);                                                   \
  template void model_backward<T>(T*, T*, ModelActs<T>&, T*, T*, const ModelLayout&,               \
                                  const ModelBatch&, const ModelConfig&, EpExchange&);
MOE_MODEL_INSTANTIATE(float)
MOE_MODEL_INSTANTIATE(double)
#undef MOE_MODEL_INSTANTIATE

}  // namespace moe
