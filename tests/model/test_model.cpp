// Whole-model gradient check: finite differences in double precision over every parameter of a
// micro configuration (embedding, norms, attention, router, shared and routed experts, LM head),
// with hash, top-k (biased) and forced round-robin layers. Also the layers' one set of scratch and
// the model's memory estimate.
#include <omp.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "model/model.hpp"
#include "random_batch.hpp"

namespace moe {
namespace {

ModelConfig micro_config() {
  ModelConfig c;
  c.vocab = 16;
  c.d_model = 8;
  c.layers = 3;
  c.hash_layers = 1;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 4;
  c.experts = 4;
  c.top_k = 2;
  c.shared_experts = 1;
  c.ffn_dim = 6;
  c.seq_len = 6;
  c.batch_per_rank = 2;
  c.sliding_window = 4;
  c.swiglu_limit = 0.5f;
  return c;
}

struct ModelCase {
  const char* name;
  RoutingMode forced;  // kTopK: natural (hash + top-k layers)
  double alpha;        // balance loss weight
  BalanceLossForm form;
  int groups, group_topk;
};

class ModelGradient : public ::testing::TestWithParam<ModelCase> {};

// Central differences with h = 1e-6; |analytic − numeric| <= 1e-6 · max(1, |analytic|).
TEST_P(ModelGradient, EveryParameterMatchesFiniteDifferences) {
  const ModelCase mc = GetParam();
  const ModelConfig c = micro_config();
  const Comm self = Comm::self();
  EpExchange ex(self);
  const ModelPlacement placement = model_placement_contiguous(c, 1);
  const ModelLayout layout = model_layout(c, placement, 0);
  std::vector<double> dense(layout.dense.num_elements), experts(layout.experts.num_elements);
  param_init(std::span<double>(dense), layout.dense, 3);
  param_init(std::span<double>(experts), layout.experts, 3);
  // Weights far from the 0.02 init so that every path contributes at the 1e-6 level.
  for (auto& x : dense) x *= 20.0;
  for (auto& x : experts) x *= 20.0;
  for (const ParamEntry& e : layout.dense.entries) {  // norms stay near 1
    if (e.init == ParamInit::kOnes) {
      for (size_t i = 0; i < e.count; ++i) dense[e.offset + i] = 1.0 + 0.1 * std::sin(i + 1.0);
    }
  }
  RoutingConfig rc;
  rc.force_balance.forced = mc.forced != RoutingMode::kTopK;
  rc.force_balance.round_robin = mc.forced == RoutingMode::kRoundRobin;
  rc.seq_aux_loss_weight = mc.alpha;  // large, so its gradient is visible at the 1e-6 level
  rc.balance_loss_form = mc.form;
  rc.routing_groups = mc.groups;
  rc.group_topk = mc.group_topk;
  RoutingState routing = routing_state_make(c, rc, 3);
  for (size_t i = 0; i < routing.bias.size(); ++i) routing.bias[i] = 0.01f * (i % 3);

  const testing_util::RandomBatch data(c, 5);
  const ModelBatch& batch = data.batch;
  ModelActs<double> acts;
  model_acts_reserve(acts, c, c.batch_per_rank, 1, model_placement_max_local(placement));

  // The trained objective: mean cross-entropy plus every layer's balance loss.
  auto loss = [&]() {
    double total = model_forward(acts, dense.data(), experts.data(), layout, routing, batch, c,
                                 placement, ex) *
                   batch.loss_scale;
    for (double b : acts.layer_balance_loss) total += b;
    return total;
  };
  loss();
  std::vector<std::vector<int32_t>> selection;
  for (const auto& m : acts.moe) selection.push_back(m.expert_idx);
  std::vector<double> d_dense(dense.size(), 0.0), d_experts(experts.size(), 0.0);
  model_backward(d_dense.data(), d_experts.data(), acts, dense.data(), experts.data(), layout,
                 batch, c, ex);

  const double h = 1e-6;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const ParamLayout& l) {
    for (const ParamEntry& e : l.entries) {
      double norm = 0;
      for (size_t i = 0; i < e.count; ++i) {
        double& p = x[e.offset + i];
        const double keep = p;
        p = keep + h;
        const double lp = loss();
        p = keep - h;
        const double lm = loss();
        p = keep;
        for (size_t layer = 0; layer < acts.moe.size(); ++layer) {
          ASSERT_EQ(acts.moe[layer].expert_idx, selection[layer]) << e.name << " flipped routing";
        }
        const double numeric = (lp - lm) / (2 * h), analytic = grad[e.offset + i];
        ASSERT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(analytic)))
            << e.name << "[" << i << "]";
        norm += std::abs(analytic);
      }
      EXPECT_GT(norm, 0.0) << e.name << " received no gradient";
    }
  };
  check(dense, d_dense, layout.dense);
  check(experts, d_experts, layout.experts);
}

INSTANTIATE_TEST_SUITE_P(
    Routing, ModelGradient,
    ::testing::Values(
        ModelCase{"natural", RoutingMode::kTopK, 0.0, BalanceLossForm::kDeepSeek, 1, 1},
        ModelCase{"balance_deepseek", RoutingMode::kTopK, 0.5, BalanceLossForm::kDeepSeek, 1, 1},
        ModelCase{"balance_maxtext", RoutingMode::kTopK, 0.5, BalanceLossForm::kMaxText, 1, 1},
        ModelCase{"grouped", RoutingMode::kTopK, 0.5, BalanceLossForm::kDeepSeek, 2, 1},
        ModelCase{"round_robin", RoutingMode::kRoundRobin, 0.5, BalanceLossForm::kDeepSeek, 1, 1},
        ModelCase{"random", RoutingMode::kRandom, 0.0, BalanceLossForm::kDeepSeek, 1, 1}),
    [](const auto& info) { return std::string(info.param.name); });

// The layers borrow one set of scratch for each call (ModelActs::attn_scratch, moe_scratch): their
// own stays empty, the set comes back after every call, a call that throws included, and a second
// step on the set the first one left, filled with NaN, gives the same bits.
TEST(ModelActs, LayersBorrowOneScratchAndGiveItBack) {
  const ModelConfig c = micro_config();
  const Comm self = Comm::self();
  EpExchange ex(self);
  const ModelPlacement placement = model_placement_contiguous(c, 1);
  const ModelLayout layout = model_layout(c, placement, 0);
  std::vector<float> dense(layout.dense.num_elements), experts(layout.experts.num_elements);
  param_init(std::span<float>(dense), layout.dense, 4);
  param_init(std::span<float>(experts), layout.experts, 4);
  const RoutingState routing = routing_state_make(c, RoutingConfig{}, 4);
  const testing_util::RandomBatch data(c, 6);
  ModelActs<float> acts;
  model_acts_reserve(acts, c, c.batch_per_rank, 1, model_placement_max_local(placement));
  auto lent_back = [&] {
    for (const AttnSaved<float>& a : acts.attn) {
      if (a.scratch.threads != 0 || a.scratch.d_q.capacity() != 0) return false;
    }
    for (const MoeSaved<float>& m : acts.moe) {
      if (!m.scratch.leaf_scratch.empty() || m.scratch.h.capacity() != 0) return false;
    }
    return acts.attn_scratch.threads > 0 && !acts.moe_scratch.leaf_scratch.empty();
  };
  ASSERT_TRUE(lent_back());
  auto step = [&] {
    std::vector<float> grads(dense.size() + experts.size(), 0.0f);
    const double loss = model_forward(acts, dense.data(), experts.data(), layout, routing,
                                      data.batch, c, placement, ex);
    model_backward(grads.data(), grads.data() + dense.size(), acts, dense.data(), experts.data(),
                   layout, data.batch, c, ex);
    grads.push_back(static_cast<float>(loss));
    return grads;
  };
  const std::vector<float> first = step();
  EXPECT_TRUE(lent_back());
  // Whatever the set holds between calls changes nothing.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  AttnScratch<float>& at = acts.attn_scratch;
  MoeScratch<float>& mt = acts.moe_scratch;
  for (std::vector<float>* v :
       {&at.d_concat,  &at.d_q,       &at.d_k,      &at.d_v,       &at.d_probs,      &at.kv_t,
        &at.d_k_heads, &at.d_v_heads, &at.leaves,   &mt.send_rows, &mt.d_rows,       &mt.d_y,
        &mt.d_x,       &mt.d_g,       &mt.d_v,      &mt.h,         &mt.sd_g,         &mt.sd_v,
        &mt.sh,        &mt.d_weights, &mt.d_scores, &mt.d_logits,  &mt.router_leaves}) {
    std::fill(v->begin(), v->end(), nan);
  }
  for (std::vector<float>& leaf : mt.leaf_scratch) std::fill(leaf.begin(), leaf.end(), nan);
  EXPECT_EQ(step(), first);
  EXPECT_TRUE(lent_back());
  // A RoPE table that does not fit the layers: the first attention call throws inside its loan.
  const RopeTable rope = acts.rope;
  acts.rope = rope_table_make(c.seq_len + 1, c.head_dim, c.rope_theta);
  EXPECT_THROW(model_forward(acts, dense.data(), experts.data(), layout, routing, data.batch, c,
                             placement, ex),
               std::invalid_argument);
  EXPECT_TRUE(lent_back());
  acts.rope = rope;
  EXPECT_EQ(step(), first);
}

// The memory estimate counts the parameters exactly: 16 bytes (value, gradient, AdamW m and v)
// per element of both arenas of the EP rank holding the most experts, for uneven splits too.
TEST(ModelMemory, ParameterBytesMatchTheLayout) {
  ModelConfig c = micro_config();
  c.experts = 5;
  for (int shared : {0, 2}) {
    c.shared_experts = shared;
    for (int P : {1, 2, 3, 5}) {
      const ModelPlacement placement = model_placement_contiguous(c, P);
      const ModelLayout layout = model_layout(c, placement, 0);  // rank 0 owns the most experts
      const double elements = layout.dense.num_elements + layout.experts.num_elements;
      EXPECT_EQ(model_memory_estimate(c, P).param_bytes, 16.0 * elements)
          << "P=" << P << " shared=" << shared;
    }
  }
}

// The weight-gradient trees keep bit_width(B) buffers of each gradient they sum (the LM head's and
// embedding's [V, D] among them), the experts' leaf trees per thread the scratch of the widest
// (gemm_leaf_tree_scratch), and attention keeps every sequence's leaves when there are several:
// the estimate counts exactly what model_acts_reserve reserves.
TEST(ModelMemory, TreeBytesMatchTheReservedTrees) {
  ModelConfig c = micro_config();
  const int threads_before = omp_get_max_threads();
  for (int shared : {0, 1}) {
    for (int threads : {1, 3}) {
      c.shared_experts = shared;
      omp_set_num_threads(threads);
      for (int B : {1, 2, 3, 4, 8}) {
        c.batch_per_rank = B;
        const ModelPlacement placement = model_placement_contiguous(c, 1);
        ModelActs<float> acts;
        model_acts_reserve(acts, c, B, 1, model_placement_max_local(placement));
        size_t values = acts.grad_tree.reserved_values() + acts.norm_leaves.capacity();
        values += acts.attn_scratch.leaves.capacity() + acts.moe_scratch.router_leaves.capacity();
        for (const std::vector<float>& t : acts.moe_scratch.leaf_scratch) values += t.capacity();
        const ModelMemory memory = model_memory_estimate(c, 1, 0, 0, threads);
        EXPECT_EQ(memory.tree_bytes, static_cast<double>(sizeof(float) * values))
            << "B=" << B << " shared=" << shared << " threads=" << threads;
        EXPECT_GT(memory.act_bytes, memory.tree_bytes);
      }
    }
  }
  omp_set_num_threads(threads_before);
}

// The activations the estimate counts are exactly what model_acts_reserve reserves (the sizes
// come from the same functions): the capacity of every buffer of ModelActs, AttnSaved and MoeSaved,
// the weight-gradient trees included, for P = 1 (every expert local).
TEST(ModelMemory, ActivationBytesMatchTheReservedBuffers) {
  ModelConfig c = micro_config();
  for (int window : {0, 5}) {
    c.sliding_window = window;
    for (int shared : {0, 1}) {
      c.shared_experts = shared;
      for (int B : {1, 3, 4}) {
        c.batch_per_rank = B;
        ModelActs<float> acts;
        model_acts_reserve(acts, c, B, 1, c.experts);
        double values =
            static_cast<double>(acts.grad_tree.reserved_values() + acts.norm_leaves.capacity());
        auto add = [&](const auto&... v) { ((values += static_cast<double>(v.capacity())), ...); };
        add(acts.resid, acts.normed, acts.rstd, acts.block_out, acts.final_normed, acts.logits,
            acts.d_logits, acts.d_resid, acts.d_normed, acts.d_final);
        values += 2.0 * static_cast<double>(acts.row_loss.capacity());  // doubles
        // Each layer's own buffers, and its scratch (empty: the layers borrow one set)...
        auto add_attn_scratch = [&](const AttnScratch<float>& t) {
          add(t.d_concat, t.d_q, t.d_k, t.d_v, t.kv_t, t.d_probs, t.d_k_heads, t.d_v_heads,
              t.leaves);
        };
        auto add_moe_scratch = [&](const MoeScratch<float>& t) {
          add(t.send_rows, t.d_rows, t.d_y, t.d_x, t.d_g, t.d_v, t.h, t.sd_g, t.sd_v, t.sh,
              t.d_weights, t.d_scores, t.d_logits, t.router_leaves);
          for (const std::vector<float>& leaf : t.leaf_scratch) add(leaf);
        };
        for (const AttnSaved<float>& a : acts.attn) {
          add(a.q, a.k, a.v, a.probs, a.concat);
          add_attn_scratch(a.scratch);
        }
        for (const MoeSaved<float>& m : acts.moe) {
          add(m.logits, m.scores, m.d_scores_balance, m.expert_idx, m.topk_scratch,
              m.dispatched_idx, m.weights, m.plan.send_assignment, m.plan.send_position, m.y_rows,
              m.x, m.y, m.g, m.v, m.sg, m.sv);
          add_moe_scratch(m.scratch);
        }
        // ...and that set, once.
        add_attn_scratch(acts.attn_scratch);
        add_moe_scratch(acts.moe_scratch);
        EXPECT_EQ(model_memory_estimate(c, 1, 0, 0, omp_get_max_threads()).act_bytes, 4.0 * values)
            << "B=" << B << " shared=" << shared << " window=" << window;
      }
    }
  }
}

// Sizes far past any machine give a finite estimate at once, naming the tensor that breaks int
// indexing, rather than overflowing or allocating.
TEST(ModelMemory, AbsurdSizesAreCountedNotAllocated) {
  ModelConfig c = micro_config();
  c.layers = 100'000'000;
  c.experts = 1'000'000;
  c.seq_len = 2'000'000'000;
  const ModelMemory m = model_memory_estimate(c, 1);
  EXPECT_TRUE(std::isfinite(m.total()));
  EXPECT_GT(m.total(), 1e18);
  EXPECT_GE(m.max_tensor, 2147483648.0);
  EXPECT_NE(std::string(m.max_tensor_name), "");
  // Growing the batch grows the activations (not 4x: attention's backward scratch is sized per
  // sequence), not the parameters.
  ModelConfig big = micro_config();
  big.batch_per_rank *= 4;
  EXPECT_EQ(model_memory_estimate(big, 1).param_bytes,
            model_memory_estimate(micro_config(), 1).param_bytes);
  EXPECT_GT(model_memory_estimate(big, 1).act_bytes,
            2.0 * model_memory_estimate(micro_config(), 1).act_bytes);
}

}  // namespace
}  // namespace moe
