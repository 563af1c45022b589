// The synthetic Markov-chain source: building the chain from the seed, its stationary distribution
// by power iteration, the exact entropy floor, and sampling by counter-based random numbers.
// Every probability the sampler uses is stored as the difference of the cumulative table it
// searches, so the entropies are computed from exactly the distributions that are sampled (up to
// the 2^-53 resolution of a uniform draw).
#include "io/synthetic_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "numeric/det_math.hpp"

namespace moe {
namespace {

// Counter-based RNG private to io/ (io depends on no model code): SplitMix64's finaliser, a
// bijective 64-bit mixer with full avalanche, applied to (seed, tag, index) keys and counters.
constexpr uint64_t synth_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Independent key per (what is drawn, which row or sample).
constexpr uint64_t synth_key(uint64_t seed, uint64_t tag, uint64_t idx) {
  const uint64_t stream = synth_mix64(seed ^ synth_mix64(tag));
  return synth_mix64(stream ^ synth_mix64(idx + 0x632be59bd9b4e019ull));
}

// Uniform in [0, 1) with 53 random bits: draw number `counter` of `key`.
inline double synth_uniform(uint64_t key, uint64_t counter) {
  return static_cast<double>(synth_mix64(key ^ synth_mix64(counter)) >> 11) * 0x1.0p-53;
}

enum SynthTag : uint64_t {
  kTagRowSize = 1,    // number of successors of row a
  kTagSuccessor = 2,  // successor draws of row a
  kTagWeight = 3,     // Dirichlet weights of row a
  kTagSample = 4,     // the tokens of sample i
};

// Index b with cdf[b] <= u < cdf[b+1], for a table cdf[0..n] with cdf[0] = 0 and cdf[n] = 1.
int32_t cdf_search(const double* cdf, int64_t n, double u) {
  const double* hit = std::upper_bound(cdf + 1, cdf + n + 1, u);
  return static_cast<int32_t>(std::min<int64_t>(hit - (cdf + 1), n - 1));
}

// Cumulative sums of `weights` normalised to end at exactly 1; the weights are then replaced by
// the differences of that table, so they are the probabilities the search samples.
void normalise_to_cdf(double* weights, double* cdf /*[n+1]*/, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += weights[i];
  cdf[0] = 0.0;
  double running = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    running += weights[i];
    cdf[i + 1] = running / total;
  }
  cdf[n] = 1.0;
  for (int64_t i = 0; i < n; ++i) weights[i] = cdf[i + 1] - cdf[i];
}

double entropy_term(double p) {
  return p > 0.0 ? -p * det::log(p) : 0.0;
}

}  // namespace

SyntheticSource::SyntheticSource(int vocab, int seq_len, uint64_t seed, SyntheticParams params)
    : vocab_(vocab), seq_len_(seq_len), seed_(seed), params_(params) {
  if (vocab <= 0) throw std::invalid_argument("synthetic data: vocab must be positive");
  if (seq_len <= 0) throw std::invalid_argument("synthetic data: seq_len must be positive");
  if (params.min_successors < 1 || params.max_successors < params.min_successors) {
    throw std::invalid_argument("synthetic data: need 1 <= min_successors <= max_successors");
  }
  if (!(params.smoothing > 0.0 && params.smoothing <= 1.0)) {
    throw std::invalid_argument("synthetic data: smoothing must be in (0, 1]");
  }
  if (!(params.zipf_exponent >= 0.0)) {
    throw std::invalid_argument("synthetic data: zipf_exponent must be >= 0");
  }
  build_chain();
  compute_stationary();
  compute_entropies();
}

void SyntheticSource::build_chain() {
  const int64_t num_vocab = vocab_;
  zipf_.resize(num_vocab);
  zipf_cdf_.resize(num_vocab + 1);
  for (int64_t b = 0; b < num_vocab; ++b) {
    zipf_[b] = det::pow(static_cast<double>(b + 1), -params_.zipf_exponent);
  }
  normalise_to_cdf(zipf_.data(), zipf_cdf_.data(), num_vocab);

  // Distinct successors drawn from z. With a small V the rare tokens may take many draws to hit;
  // after a fixed number of draws a row keeps the successors it has (at least one).
  const int num_sizes = params_.max_successors - params_.min_successors + 1;
  succ_offsets_.assign(num_vocab + 1, 0);
  for (int64_t a = 0; a < num_vocab; ++a) {
    const uint64_t size_key = synth_key(seed_, kTagRowSize, a);
    const int size_offset = static_cast<int>(synth_uniform(size_key, 0) * num_sizes);
    const int64_t num_succ = std::min<int64_t>(params_.min_successors + size_offset, num_vocab);
    const uint64_t succ_key = synth_key(seed_, kTagSuccessor, a);
    const uint64_t weight_key = synth_key(seed_, kTagWeight, a);
    const size_t row_begin = succ_tokens_.size();
    const uint64_t max_draws = 64 * static_cast<uint64_t>(num_succ);
    for (uint64_t draw_idx = 0; draw_idx < max_draws; ++draw_idx) {
      const auto num_kept = static_cast<int64_t>(succ_tokens_.size() - row_begin);
      if (num_kept == num_succ) break;
      const int32_t b = cdf_search(zipf_cdf_.data(), num_vocab, synth_uniform(succ_key, draw_idx));
      const auto row = succ_tokens_.begin() + row_begin;
      if (std::find(row, succ_tokens_.end(), b) != succ_tokens_.end()) continue;
      // Exp(1) weights normalised per row: a Dirichlet(1, ..., 1) draw of q(·|a).
      const double u = synth_uniform(weight_key, num_kept);
      succ_tokens_.push_back(b);
      succ_probs_.push_back(-det::log1p(-u) + 1e-12);  // + 1e-12: no successor has q = 0
    }
    succ_offsets_[a + 1] = static_cast<int64_t>(succ_tokens_.size());
  }
  succ_cdf_.resize(succ_tokens_.size());
  std::vector<double> row_cdf;
  for (int64_t a = 0; a < num_vocab; ++a) {
    const int64_t begin = succ_offsets_[a];
    const int64_t num_succ = succ_offsets_[a + 1] - begin;
    row_cdf.assign(num_succ + 1, 0.0);
    normalise_to_cdf(succ_probs_.data() + begin, row_cdf.data(), num_succ);
    std::copy(row_cdf.begin() + 1, row_cdf.end(), succ_cdf_.begin() + begin);
  }
}

// next = p·P for a distribution p, as (1−ε)·p·Q + ε·z: the smoothing term contributes ε·z
// because Σp = 1. O(V + edges) instead of the O(V²) of a dense P.
void SyntheticSource::chain_step(std::vector<double>& next, const std::vector<double>& p) const {
  const double eps = params_.smoothing;
  for (int b = 0; b < vocab_; ++b) next[b] = eps * zipf_[b];
  for (int a = 0; a < vocab_; ++a) {
    for (int64_t edge_idx = succ_offsets_[a]; edge_idx < succ_offsets_[a + 1]; ++edge_idx) {
      next[succ_tokens_[edge_idx]] += (1.0 - eps) * p[a] * succ_probs_[edge_idx];
    }
  }
}

// π = π·P by power iteration from z. The step is a contraction by (1−ε) in L1, so after n steps
// the error is at most 2·(1−ε)^n: n is chosen for 1e-15 (686 steps at ε = 0.05), fewer if the
// iterate stops moving first.
void SyntheticSource::compute_stationary() {
  const double eps = params_.smoothing;
  const int64_t num_iters =
      eps >= 1.0 ? 1 : static_cast<int64_t>(std::ceil(det::log(0.5e-15) / det::log1p(-eps))) + 1;
  std::vector<double> pi = zipf_, next(vocab_);
  for (int64_t iter = 0; iter < num_iters; ++iter) {
    chain_step(next, pi);
    double change = 0.0;
    for (int b = 0; b < vocab_; ++b) change += std::fabs(next[b] - pi[b]);
    pi.swap(next);
    if (change < 1e-16) break;
  }
  stationary_ = pi;
  stationary_cdf_.resize(vocab_ + 1);
  normalise_to_cdf(stationary_.data(), stationary_cdf_.data(), vocab_);
}

// H(P(·|a)) for every row, in O(V + edges): the smoothing term alone contributes
// C = Σ_b −εz(b)·log(εz(b)) to every row; a row's successors replace their part of C.
void SyntheticSource::compute_entropies() {
  const double eps = params_.smoothing;
  double smoothing_entropy = 0.0;
  for (int b = 0; b < vocab_; ++b) smoothing_entropy += entropy_term(eps * zipf_[b]);
  row_entropy_.assign(vocab_, smoothing_entropy);
  for (int a = 0; a < vocab_; ++a) {
    for (int64_t edge_idx = succ_offsets_[a]; edge_idx < succ_offsets_[a + 1]; ++edge_idx) {
      const double smooth = eps * zipf_[succ_tokens_[edge_idx]];
      row_entropy_[a] +=
          entropy_term((1.0 - eps) * succ_probs_[edge_idx] + smooth) - entropy_term(smooth);
    }
  }
  entropy_rate_ = 0.0;
  unigram_entropy_ = 0.0;
  for (int a = 0; a < vocab_; ++a) {
    entropy_rate_ += stationary_[a] * row_entropy_[a];
    unigram_entropy_ += entropy_term(stationary_[a]);
  }
  // The floor follows the distribution of x_t from the sampled start p_0 = π for t = 0..S-1.
  std::vector<double> p = stationary_, next(vocab_);
  double total = 0.0;
  for (int pos_idx = 0; pos_idx < seq_len_; ++pos_idx) {
    for (int a = 0; a < vocab_; ++a) total += p[a] * row_entropy_[a];
    chain_step(next, p);
    p.swap(next);
  }
  entropy_floor_ = total / seq_len_;
}

void SyntheticSource::sample(int64_t global_sample_idx, int seq_len, int32_t* out) const {
  if (global_sample_idx < 0 || seq_len <= 0) {
    throw std::invalid_argument("synthetic data: need sample index >= 0 and seq_len > 0");
  }
  const uint64_t key = synth_key(seed_, kTagSample, static_cast<uint64_t>(global_sample_idx));
  out[0] = cdf_search(stationary_cdf_.data(), vocab_, synth_uniform(key, 0));
  // Position t draws counters 2t (smoothing coin) and 2t+1 (the token), t = 1..S.
  for (int pos_idx = 1; pos_idx <= seq_len; ++pos_idx) {
    const double coin = synth_uniform(key, 2 * static_cast<uint64_t>(pos_idx));
    const double u = synth_uniform(key, 2 * static_cast<uint64_t>(pos_idx) + 1);
    if (coin < params_.smoothing) {
      out[pos_idx] = cdf_search(zipf_cdf_.data(), vocab_, u);
      continue;
    }
    const int64_t begin = succ_offsets_[out[pos_idx - 1]];
    const int64_t num_succ = succ_offsets_[out[pos_idx - 1] + 1] - begin;
    // succ_cdf_ holds cdf[1..n] of the row; the search wants cdf[0..n] with cdf[0] = 0.
    const double* row_cdf = succ_cdf_.data() + begin;
    const int64_t hit = std::upper_bound(row_cdf, row_cdf + num_succ, u) - row_cdf;
    out[pos_idx] = succ_tokens_[begin + std::min<int64_t>(hit, num_succ - 1)];
  }
}

double SyntheticSource::transition_prob(int32_t from, int32_t to) const {
  double p = params_.smoothing * zipf_.at(to);
  const int64_t end = succ_offsets_.at(from + 1);
  for (int64_t edge_idx = succ_offsets_.at(from); edge_idx < end; ++edge_idx) {
    if (succ_tokens_[edge_idx] == to) p += (1.0 - params_.smoothing) * succ_probs_[edge_idx];
  }
  return p;
}

int64_t SyntheticSource::private_bytes() const {
  const auto bytes = [](const auto& v) { return static_cast<int64_t>(v.capacity() * sizeof v[0]); };
  return bytes(zipf_) + bytes(zipf_cdf_) + bytes(succ_offsets_) + bytes(succ_tokens_) +
         bytes(succ_probs_) + bytes(succ_cdf_) + bytes(stationary_) + bytes(stationary_cdf_) +
         bytes(row_entropy_);
}

std::string SyntheticSource::describe() const {
  char text[512];
  std::snprintf(text, sizeof(text),
                "synthetic (seed %llu, V=%d: first-order Markov chain, Zipf(%.2f) popularity, "
                "%d-%d successors per token, smoothing %.2f; entropy floor %.4f nats/token over "
                "S=%d targets, unigram entropy %.4f, log V %.4f)",
                static_cast<unsigned long long>(seed_), vocab_, params_.zipf_exponent,
                params_.min_successors, params_.max_successors, params_.smoothing, entropy_floor_,
                seq_len_, unigram_entropy_, det::log(static_cast<double>(vocab_)));
  return text;
}

}  // namespace moe
