// The `synthetic` data source (docs/data.md): token sequences generated from (seed, global sample
// index) alone, learnable, with Zipf-like token frequencies and an exactly computed entropy floor.
//
// The generator is a fixed first-order Markov chain over the V tokens, built from the seed:
//   z(b)    ∝ 1/(b+1)^s            Zipf unigram popularity; token id = popularity rank, as in
//                                  BPE vocabularies where low ids are frequent (s = zipf_exponent)
//   succ(a)                         4..8 distinct successors of token a, drawn from z, so popular
//                                  tokens have many predecessors and stay popular in the chain
//   q(b|a)                          Dirichlet(1) weights over succ(a), fixed per token
//   P(b|a)  = (1−ε)·q(b|a) + ε·z(b) ε = smoothing: every token reachable from every token, so the
//                                  chain is irreducible and aperiodic with one stationary π
// A sample's first token is drawn from π, then each next token from P(·|previous). The draws come
// from a counter-based RNG keyed on (seed, sample index, position), so any rank generates any
// sample without generating the ones before it, and sample(i, S) is a prefix of sample(i, S+1).
//
// Entropy floor. The loss of next-token prediction is at least the conditional entropy of the
// target given everything before it; for a Markov chain that is H(P(·|x_t)). Averaged over the S
// targets of a sample, the expected floor is (1/S)·Σ_{t<S} Σ_a p_t(a)·H(P(·|a)) with p_0 the start
// distribution and p_{t+1} = p_t·P. entropy_floor_nats() is exactly that, computed in double for
// the chain as built (including the start distribution as sampled). Since p_0 = π, every p_t = π
// and the floor equals the stationary entropy rate Σ_a π(a)·H(P(·|a)) (entropy_rate_nats()) up to
// the convergence of the power iteration for π (below 1e-12): the first token carries no extra
// entropy into the loss because it is an input, never a target. Only a model that has learned the
// chain reaches the floor; one that ignores context can do no better than the unigram entropy of π.
// A first-order chain needs only the previous token, so the floor is reachable without attention.
// At seed 1234 the floor is 1.8288 nats for V=2048 (unigram entropy 4.78, log V 7.62) and 1.6316
// nats for V=64 (unigram 3.20, log V 4.16); describe() reports it for the chain in use.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/token_data.hpp"

namespace moe {

// Validation sequences of the synthetic source (--val-data synthetic) are its samples from this
// index on: the same chain, in sequences that training, which reads samples from 0 on, would
// reach only after 2^40 sequences.
inline constexpr int64_t kSyntheticValFirstSample = int64_t{1} << 40;

struct SyntheticParams {
  double zipf_exponent = 1.0;  // s of z(b) ∝ 1/(b+1)^s; 1 is the classic Zipf law of text
  int min_successors = 4;      // per token, drawn uniformly in [min, max], capped at V
  int max_successors = 8;
  double smoothing = 0.05;  // ε in (0, 1]: weight of the Zipf unigram in every row
};

class SyntheticSource : public TokenSource {
 public:
  // Builds the chain for `vocab` tokens from `seed` and computes the floor for `seq_len` targets.
  // Throws std::invalid_argument for non-positive sizes or out-of-range params.
  SyntheticSource(int vocab, int seq_len, uint64_t seed, SyntheticParams params = {});

  void sample(int64_t global_sample_idx, int seq_len, int32_t* out) const override;
  int64_t num_tokens() const override { return 0; }  // generated: unbounded
  int64_t private_bytes() const override;            // the chain's tables
  std::string describe() const override;

  // Exact expected mean next-token entropy (nats) over the S targets of a sample, S = the seq_len
  // given at construction: the lowest expected loss any model can reach on this data.
  double entropy_floor_nats() const { return entropy_floor_; }
  // Σ_a π(a)·H(P(·|a)), the entropy rate of the stationary chain (nats per token).
  double entropy_rate_nats() const { return entropy_rate_; }
  // H(π): the floor of a model that ignores context (nats per token).
  double unigram_entropy_nats() const { return unigram_entropy_; }

  // P(to | from), the probability the generator uses for the token after `from`.
  double transition_prob(int32_t from, int32_t to) const;
  std::span<const double> stationary() const { return stationary_; }  // π [V]
  int vocab() const { return vocab_; }

 private:
  void build_chain();
  void compute_stationary();
  void compute_entropies();
  void chain_step(std::vector<double>& next /*[V]*/, const std::vector<double>& p /*[V]*/) const;

  int vocab_;    // V
  int seq_len_;  // S of the floor
  uint64_t seed_;
  SyntheticParams params_;
  std::vector<double> zipf_;            // [V] z(b)
  std::vector<double> zipf_cdf_;        // [V+1] cumulative z, cdf[0] = 0, cdf[V] = 1
  std::vector<int64_t> succ_offsets_;   // [V+1] row a is edges [offsets[a], offsets[a+1])
  std::vector<int32_t> succ_tokens_;    // [num_edges] successor token b of each edge
  std::vector<double> succ_probs_;      // [num_edges] q(b|a), sums to 1 per row
  std::vector<double> succ_cdf_;        // [num_edges] cumulative q within the row, last = 1
  std::vector<double> stationary_;      // [V] π
  std::vector<double> stationary_cdf_;  // [V+1] cumulative π: the start distribution
  std::vector<double> row_entropy_;     // [V] H(P(·|a)) in nats
  double entropy_floor_ = 0.0;
  double entropy_rate_ = 0.0;
  double unigram_entropy_ = 0.0;
};

}  // namespace moe
