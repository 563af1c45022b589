// Results do not depend on the number of threads: the parallel tasks (experts, attention heads and
// tiles, cross-entropy rows, AdamW, the norm's chunks, the blocks of a split GEMM) give bitwise
// the same training step on one thread as on two or three. CTest runs with one thread
// (OMP_NUM_THREADS=1); these tests set the count themselves, so that the threaded paths run on
// every machine, even a one-core one.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "model/blas.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "model/parallel.hpp"
#include "random_batch.hpp"

namespace moe {
namespace {

// Restores one thread and OpenMP's dynamic adjustment off when a test ends.
class Threads : public ::testing::Test {
 protected:
  void TearDown() override {
    blas_set_threads(1);
    omp_set_dynamic(0);
  }
};

TEST_F(Threads, ParallelTasksRunEveryTaskOnceAndCarryExceptionsOut) {
  blas_set_threads(2);
  EXPECT_EQ(omp_get_max_threads(), 2);  // the model's threads are OpenMP's
  std::vector<std::atomic<int>> calls(100);
  parallel_tasks(100, [&](int64_t i) { calls[i].fetch_add(1); });
  for (const auto& c : calls) EXPECT_EQ(c.load(), 1);
  EXPECT_THROW(parallel_tasks(10,
                              [](int64_t i) {
                                if (i == 7) throw std::runtime_error("task 7 failed");
                              }),
               std::runtime_error);
  int ran = 0;
  parallel_tasks(0, [&](int64_t) { ++ran; });
  EXPECT_EQ(ran, 0);
}

struct StepResult {
  double loss = 0, norm = 0;
  std::vector<float> d_dense, d_experts, dense_after, experts_after;
  std::vector<std::vector<int32_t>> selection;
};

// deepseek4-tiny's widths (the shapes decide which loops run in parallel) with 3 layers: one hash,
// two top-k.
ModelConfig three_layers() {
  ModelConfig c;
  c.layers = 3;
  c.hash_layers = 1;
  return c;
}

// One training step of `c` on `threads` threads: forward, backward, the gradient norm and one
// AdamW update. The buffers are reserved with `reserve_threads` threads (0: `threads`).
StepResult train_step(int threads, const ModelConfig& c = three_layers(),
                      RoutingConfig balanced = RoutingConfig{}, int reserve_threads = 0) {
  blas_set_threads(reserve_threads > 0 ? reserve_threads : threads);
  const Comm self = Comm::self();
  EpExchange ex(self);
  const ModelPlacement placement = model_placement_contiguous(c, 1);
  const ModelLayout layout = model_layout(c, placement, 0);
  std::vector<float> dense(layout.dense.num_elements), experts(layout.experts.num_elements);
  param_init(std::span<float>(dense), layout.dense, 11);
  param_init(std::span<float>(experts), layout.experts, 11);
  balanced.seq_aux_loss_weight = 1e-2;
  const RoutingState routing = routing_state_make(c, balanced, 11);

  const testing_util::RandomBatch data(c, 11);
  const ModelBatch& batch = data.batch;
  ModelActs<float> acts;
  model_acts_reserve(acts, c, c.batch_per_rank, 1, model_placement_max_local(placement));
  blas_set_threads(threads);

  StepResult r;
  r.loss =
      model_forward(acts, dense.data(), experts.data(), layout, routing, batch, c, placement, ex);
  for (const auto& m : acts.moe) r.selection.push_back(m.expert_idx);
  r.d_dense.assign(dense.size(), 0.0f);
  r.d_experts.assign(experts.size(), 0.0f);
  model_backward(r.d_dense.data(), r.d_experts.data(), acts, dense.data(), experts.data(), layout,
                 batch, c, ex);
  r.norm = sum_squares(r.d_dense) + sum_squares(r.d_experts);
  AdamWState sd, se;
  adamw_state_init(sd, dense.size());
  adamw_state_init(se, experts.size());
  const AdamWConfig cfg;
  adamw_update(dense, r.d_dense, sd, layout.dense, cfg, 1e-3f, 0.5f, 1);
  adamw_update(experts, r.d_experts, se, layout.experts, cfg, 1e-3f, 0.5f, 1);
  r.dense_after = dense;
  r.experts_after = experts;
  return r;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_bitwise_equal(const StepResult& one, const StepResult& two) {
  EXPECT_EQ(one.selection, two.selection);
  EXPECT_EQ(std::memcmp(&one.loss, &two.loss, sizeof(double)), 0) << one.loss << " vs " << two.loss;
  EXPECT_EQ(std::memcmp(&one.norm, &two.norm, sizeof(double)), 0) << one.norm << " vs " << two.norm;
  EXPECT_TRUE(bitwise_equal(one.d_dense, two.d_dense));
  EXPECT_TRUE(bitwise_equal(one.d_experts, two.d_experts));
  EXPECT_TRUE(bitwise_equal(one.dense_after, two.dense_after));
  EXPECT_TRUE(bitwise_equal(one.experts_after, two.experts_after));
}

// The GEMM's split of a large call follows the thread count, its bits do not (model/gemm/); the
// CTest label kernels runs this under other OpenBLAS kernels too, which the model never calls.
TEST_F(Threads, TrainingStepIsBitwiseTheSameOnOneTwoAndThreeThreads) {
  const StepResult one = train_step(1);
  // The step did something: a loss near log V and gradients that are not all zero.
  EXPECT_GT(one.loss / 256, 7.0);
  EXPECT_GT(one.norm, 0.0);
  {
    SCOPED_TRACE("2 threads");
    expect_bitwise_equal(one, train_step(2));
  }
  {
    SCOPED_TRACE("3 threads");
    expect_bitwise_equal(one, train_step(3));
  }
}

// Several sequences per rank (attention runs them as tasks) and deepseek4-fine's routing (64
// experts, the group-limited top-k over the rows on the threads, 64 expert tasks).
TEST_F(Threads, FineGrainedStepOfTwoSequencesIsBitwiseTheSameOnOneTwoAndThreeThreads) {
  ModelConfig c = three_layers();
  c.batch_per_rank = 2;
  c.experts = 64;
  c.top_k = 8;
  c.ffn_dim = 56;
  RoutingConfig groups;
  groups.routing_groups = 8;
  groups.group_topk = 4;
  const StepResult one = train_step(1, c, groups);
  EXPECT_GT(one.norm, 0.0);
  for (int threads : {2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    expect_bitwise_equal(one, train_step(threads, c, groups));
  }
}

// Experts with more rows than a row task takes (several chunks each, some a part chunk) and the
// shared expert's sequences in the same tasks; the weight gradients as tasks of their own, each in
// its thread's tree.
TEST_F(Threads, ExpertRowsSplitIntoChunksGiveTheSameBitsOnOneTwoAndThreeThreads) {
  ModelConfig c = three_layers();
  c.batch_per_rank = 4;
  c.experts = 4;
  c.top_k = 2;
  ASSERT_GT(c.shared_experts, 0);
  const StepResult one = train_step(1, c);
  EXPECT_GT(one.norm, 0.0);
  for (int threads : {2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    expect_bitwise_equal(one, train_step(threads, c));
  }
}

// Buffers reserved for one thread and a step on three: the per-thread weight-gradient scratch (at
// the first backward) and attention scratch (at the first forward) are added, with the same bits.
TEST_F(Threads, PerThreadBuffersGrowWhenTheThreadsDo) {
  ModelConfig c = three_layers();
  c.batch_per_rank = 4;
  c.experts = 4;
  c.top_k = 2;
  const StepResult one = train_step(1, c);
  expect_bitwise_equal(one, train_step(3, c, RoutingConfig{}, 1));
}

// With dynamic adjustment libgomp may start fewer threads than asked for: results stay the same
// and nothing waits for a thread that never started.
TEST_F(Threads, TrainingStepIsTheSameWithDynamicThreadCounts) {
  const StepResult one = train_step(1);
  omp_set_dynamic(1);
  expect_bitwise_equal(one, train_step(2));
}

}  // namespace
}  // namespace moe
