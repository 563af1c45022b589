// Attention (model/attention.hpp): finite-difference gradients in double for full causal, sliding
// window, grouped-query and multi-sequence shapes; the forward against a plain-loop reference
// written from the formulas; causality and the window by perturbing one token; bitwise
// independence of a sequence's result from the number of sequences B; RoPE's relative-position
// property and pair convention; refusals of impossible shapes.
// Legend: B sequences, S sequence length, D model width, H heads, KVH kv heads, hd head dim,
// W sliding window (0 = full causal); HD = H·hd, KD = KVH·hd.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "fd_check.hpp"
#include "model/attention.hpp"

namespace moe {
namespace {

using fd_check::dot;
using fd_check::numeric_grad;
using fd_check::Vec;

// Against the plain-loop reference, relative to max(1, |ref|): both sum the same O(10..100)
// products in different orders, so they differ by a few hundred double ulps at most.
constexpr double kRefTol = 1e-12;
// Float forward against the double reference, relative to max(1, |ref|): ~1e3 float ulps covers
// the projections' sums of D products, the softmax's exp and the output projection.
constexpr double kFloatTol = 1e-4;

Vec random_normal(size_t n, uint64_t seed, double scale = 1.0) {
  return fd_check::normal_vector("tests.model.attention", n, seed, scale);
}

template <class T> std::vector<T> cast(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}

// A layer's weights, its RoPE table and saved activations, in precision T, from double values.
template <class T> struct Layer {
  AttnDims dims;
  RopeTable rope;
  std::vector<T> wq, wk, wv, wo;  // [D, HD], [D, KD], [D, KD], [HD, D]
  AttnSaved<T> saved;

  Layer(const AttnDims& d, int max_B, const Vec& q, const Vec& k, const Vec& v, const Vec& o)
      : dims(d),
        rope(rope_table_make(d.S, d.hd, d.rope_theta)),
        wq(cast<T>(q)),
        wk(cast<T>(k)),
        wv(cast<T>(v)),
        wo(cast<T>(o)) {
    attn_saved_reserve(saved, max_B, dims);
  }
  AttnWeights<T> weights() { return {wq.data(), wk.data(), wv.data(), wo.data()}; }
  std::vector<T> forward(const std::vector<T>& in, int B) {
    std::vector<T> out(size_t(B) * dims.S * dims.D);
    attention_forward(out.data(), saved, in.data(), weights(), dims, rope, B);
    return out;
  }
};

// Random weights with std 1/sqrt(fan-in)·gain: q·k/sqrt(hd) of order gain², a softmax that is
// neither uniform nor one-hot.
struct Weights {
  Vec wq, wk, wv, wo;
  Weights(const AttnDims& d, uint64_t seed, double gain = 1.0) {
    const int HD = d.H * d.hd, KD = d.KVH * d.hd;
    wq = random_normal(size_t(d.D) * HD, seed + 1, gain / std::sqrt(double(d.D)));
    wk = random_normal(size_t(d.D) * KD, seed + 2, gain / std::sqrt(double(d.D)));
    wv = random_normal(size_t(d.D) * KD, seed + 3, 1.0 / std::sqrt(double(d.D)));
    wo = random_normal(size_t(HD) * d.D, seed + 4, 1.0 / std::sqrt(double(HD)));
  }
};

// The reference: explicit loops straight from the formulas of attention.hpp, nothing shared with
// the implementation but the layouts. RoPE angles p·theta^(-2i/hd) on pairs (2i, 2i+1); key j is
// visible from query s iff j <= s and (W == 0 or j > s − W).
Vec naive_attention(const Vec& in, const Weights& w, const AttnDims& d, int B) {
  const int S = d.S, D = d.D, H = d.H, hd = d.hd, HD = H * hd, KD = d.KVH * hd;
  const int group = H / d.KVH;
  Vec out(size_t(B) * S * D, 0.0);
  for (int b = 0; b < B; ++b) {
    const double* x = in.data() + size_t(b) * S * D;
    Vec q(size_t(S) * HD, 0.0), k(size_t(S) * KD, 0.0), v(size_t(S) * KD, 0.0);
    for (int t = 0; t < S; ++t) {
      for (int e = 0; e < D; ++e) {
        for (int c = 0; c < HD; ++c) q[t * HD + c] += x[t * D + e] * w.wq[e * HD + c];
        for (int c = 0; c < KD; ++c) k[t * KD + c] += x[t * D + e] * w.wk[e * KD + c];
        for (int c = 0; c < KD; ++c) v[t * KD + c] += x[t * D + e] * w.wv[e * KD + c];
      }
    }
    auto rotate = [&](Vec& m, int heads) {
      for (int t = 0; t < S; ++t) {
        for (int h = 0; h < heads; ++h) {
          for (int i = 0; i < hd / 2; ++i) {
            const double angle = t * std::pow(double(d.rope_theta), -2.0 * i / hd);
            double& a = m[t * heads * hd + h * hd + 2 * i];
            double& c = m[t * heads * hd + h * hd + 2 * i + 1];
            const double a0 = a, c0 = c;
            a = a0 * std::cos(angle) - c0 * std::sin(angle);
            c = a0 * std::sin(angle) + c0 * std::cos(angle);
          }
        }
      }
    };
    rotate(q, H);
    rotate(k, d.KVH);
    Vec concat(size_t(S) * HD, 0.0);
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      for (int s = 0; s < S; ++s) {
        Vec score(S, -std::numeric_limits<double>::infinity());
        double max_score = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < S; ++j) {
          if (!(j <= s && (d.window == 0 || j > s - d.window))) continue;
          double qk = 0.0;
          for (int i = 0; i < hd; ++i) qk += q[s * HD + h * hd + i] * k[j * KD + g * hd + i];
          score[j] = qk / std::sqrt(double(hd));
          max_score = std::max(max_score, score[j]);
        }
        double sum = 0.0;
        for (int j = 0; j < S; ++j) sum += std::exp(score[j] - max_score);
        for (int j = 0; j < S; ++j) {
          const double p = std::exp(score[j] - max_score) / sum;
          for (int i = 0; i < hd; ++i) concat[s * HD + h * hd + i] += p * v[j * KD + g * hd + i];
        }
      }
    }
    for (int t = 0; t < S; ++t) {
      for (int c = 0; c < HD; ++c) {
        for (int e = 0; e < D; ++e) {
          out[(size_t(b) * S + t) * D + e] += concat[t * HD + c] * w.wo[c * D + e];
        }
      }
    }
  }
  return out;
}

struct Shape {
  const char* name;
  int B;
  AttnDims dims;  // D, H, KVH, hd, S, W, theta
};

const Shape kShapes[] = {
    {"full_causal", 1, {6, 2, 2, 4, 5, 0, 100.0f}},
    {"window_lt_S", 1, {6, 2, 2, 4, 7, 3, 100.0f}},
    {"gqa", 1, {6, 4, 2, 4, 5, 0, 10000.0f}},
    {"two_seqs_gqa_window", 2, {6, 4, 1, 4, 6, 2, 100.0f}},
    {"rows_over_16_keys",
     1,
     {4, 2, 1, 4, 20, 18, 100.0f}},  // windows crossing 16-key and 32-query blocks
    // Two query tiles (the second partial), d_k and d_v summed across them: with a window and
    // two kv heads (a GEMM per head), and full causal with one (a tile's heads in one GEMM).
    {"tiles_gqa_window", 1, {8, 4, 2, 4, 37, 21, 100.0f}},
    {"tiles_one_kv_head", 2, {8, 4, 1, 4, 40, 0, 100.0f}},
};

// ---- gradients ---------------------------------------------------------------------------------

// The backward adds into gradients that start at `prior`: fd_check subtracts it, which checks the
// accumulation. A mismatch names the shape and the gradient, "gqa d_wq[3]".
void expect_grad_near(const Vec& total, const Vec& prior, const Vec& numeric, const char* shape,
                      const char* what) {
  fd_check::expect_grad_near(total, prior, numeric, std::string(shape) + " " + what);
}

TEST(AttentionGrad, MatchesFiniteDifferences) {
  for (const Shape& sh : kShapes) {
    const AttnDims& d = sh.dims;
    const Weights w0(d, 10, 1.5);
    Layer<double> layer(d, sh.B, w0.wq, w0.wk, w0.wv, w0.wo);
    Vec in = random_normal(size_t(sh.B) * d.S * d.D, 20);
    const Vec r = random_normal(in.size(), 21);  // loss = Σ out·r, so d_out = r
    auto loss = [&] { return dot(layer.forward(in, sh.B), r); };

    const Vec prior_in = random_normal(in.size(), 30);
    const Vec prior_q = random_normal(layer.wq.size(), 31);
    const Vec prior_k = random_normal(layer.wk.size(), 32);
    const Vec prior_v = random_normal(layer.wv.size(), 33);
    const Vec prior_o = random_normal(layer.wo.size(), 34);
    Vec d_in = prior_in, d_wq = prior_q, d_wk = prior_k, d_wv = prior_v, d_wo = prior_o;
    const AttnWeights<double> grads{d_wq.data(), d_wk.data(), d_wv.data(), d_wo.data()};
    loss();
    attention_backward(d_in.data(), grads, r.data(), layer.saved, in.data(), layer.weights(), d,
                       layer.rope, sh.B);

    expect_grad_near(d_in, prior_in, numeric_grad(in, loss), sh.name, "d_in");
    expect_grad_near(d_wq, prior_q, numeric_grad(layer.wq, loss), sh.name, "d_wq");
    expect_grad_near(d_wk, prior_k, numeric_grad(layer.wk, loss), sh.name, "d_wk");
    expect_grad_near(d_wv, prior_v, numeric_grad(layer.wv, loss), sh.name, "d_wv");
    expect_grad_near(d_wo, prior_o, numeric_grad(layer.wo, loss), sh.name, "d_wo");
  }
}

// ---- forward against the reference -------------------------------------------------------------

TEST(AttentionForward, MatchesNaiveReference) {
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back({"larger_window", 2, {16, 4, 2, 8, 20, 5, 10000.0f}});
  shapes.push_back({"window_ge_S", 1, {16, 4, 4, 8, 9, 12, 10000.0f}});
  shapes.push_back({"long_full", 1, {8, 2, 1, 4, 40, 0, 10000.0f}});
  shapes.push_back({"long_window", 2, {8, 4, 2, 6, 37, 21, 10000.0f}});
  for (const Shape& sh : shapes) {
    const AttnDims& d = sh.dims;
    const Weights w(d, 40, 2.0);
    Layer<double> layer(d, sh.B, w.wq, w.wk, w.wv, w.wo);
    const Vec in = random_normal(size_t(sh.B) * d.S * d.D, 41);
    const Vec out = layer.forward(in, sh.B), ref = naive_attention(in, w, d, sh.B);
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(out[i], ref[i], kRefTol * std::max(1.0, std::abs(ref[i]))) << sh.name << " " << i;
    }
  }
}

TEST(AttentionForward, FloatAgreesWithReference) {
  const AttnDims d{32, 4, 1, 8, 24, 7, 10000.0f};
  const int B = 2;
  const Weights w(d, 50, 2.0);
  Layer<float> layer(d, B, w.wq, w.wk, w.wv, w.wo);
  const Vec in = random_normal(size_t(B) * d.S * d.D, 51);
  const std::vector<float> out = layer.forward(cast<float>(in), B);
  const Vec ref = naive_attention(in, w, d, B);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(out[i], ref[i], kFloatTol * std::max(1.0, std::abs(ref[i]))) << i;
  }
}

// ---- causality and the window ------------------------------------------------------------------

// Perturbs token s of sequence 1 of 2: sequence 0 and positions < s must not move by a single bit,
// nor positions >= s + W under a window; positions in [s, s + W) must move.
TEST(AttentionCausality, TokenReachesOnlyLaterPositionsInItsWindow) {
  for (const int W : {0, 4}) {
    const AttnDims d{8, 2, 1, 4, 12, W, 10000.0f};
    const int B = 2, s = 5, S = d.S, D = d.D;
    const Weights w(d, 60);
    Layer<double> layer(d, B, w.wq, w.wk, w.wv, w.wo);
    Vec in = random_normal(size_t(B) * S * D, 61);
    const Vec base = layer.forward(in, B);
    for (int e = 0; e < D; ++e) in[(size_t(S) + s) * D + e] += 0.5 + 0.1 * e;
    const Vec moved = layer.forward(in, B);
    const int reach_end = W == 0 ? S : std::min(S, s + W);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < S; ++t) {
        const bool reached = b == 1 && t >= s && t < reach_end;
        int changed = 0;
        for (int e = 0; e < D; ++e) {
          const size_t i = (size_t(b) * S + t) * D + e;
          changed += base[i] != moved[i];
        }
        if (reached) {
          EXPECT_GT(changed, 0) << "W=" << W << " b=" << b << " t=" << t;
        } else {
          EXPECT_EQ(changed, 0) << "W=" << W << " b=" << b << " t=" << t;
        }
      }
    }
  }
}

// ---- independence from B -----------------------------------------------------------------------

// The deepseek4-tiny shape in float: sequence b computed among B = 3 gives the same bits as
// computed alone (memcmp: bitwise, -0 ≠ +0), forward and d_in (both are per sequence; the weight
// gradients are sums over sequences and are not expected to be).
TEST(AttentionBatch, SequenceResultIsBitwiseIndependentOfB) {
  const AttnDims d{128, 4, 1, 32, 256, 128, 10000.0f};
  const int B = 3;
  const size_t rows = size_t(d.S) * d.D;
  const Weights w(d, 70);
  Layer<float> many(d, B, w.wq, w.wk, w.wv, w.wo), one(d, 1, w.wq, w.wk, w.wv, w.wo);
  const std::vector<float> in = cast<float>(random_normal(B * rows, 71));
  const std::vector<float> d_out = cast<float>(random_normal(B * rows, 72));
  std::vector<float> d_wq(many.wq.size()), d_wk(many.wk.size());
  std::vector<float> d_wv(many.wv.size()), d_wo(many.wo.size());
  const AttnWeights<float> grads{d_wq.data(), d_wk.data(), d_wv.data(), d_wo.data()};

  const std::vector<float> out = many.forward(in, B);
  std::vector<float> d_in(B * rows, 0.0f);
  attention_backward(d_in.data(), grads, d_out.data(), many.saved, in.data(), many.weights(), d,
                     many.rope, B);
  for (int b = 0; b < B; ++b) {
    const std::vector<float> in_b(in.begin() + b * rows, in.begin() + (b + 1) * rows);
    const std::vector<float> out_b = one.forward(in_b, 1);
    std::vector<float> d_in_b(rows, 0.0f);
    attention_backward(d_in_b.data(), grads, d_out.data() + b * rows, one.saved, in_b.data(),
                       one.weights(), d, one.rope, 1);
    EXPECT_EQ(0, std::memcmp(out_b.data(), out.data() + b * rows, rows * sizeof(float))) << b;
    EXPECT_EQ(0, std::memcmp(d_in_b.data(), d_in.data() + b * rows, rows * sizeof(float))) << b;
  }
}

// A model's layers borrow one set of scratch (ModelActs::attn_scratch): a call gives the same bits
// with a lent set that another call left full of NaN as with its own fresh one, and a layer
// reserved without scratch that is lent none refuses the call.
TEST(AttentionScratch, ALentSetGivesTheBitsOfAnOwnOne) {
  const AttnDims d{16, 4, 1, 4, 24, 8, 10000.0f};
  const int B = 2;
  const size_t n = size_t(B) * d.S * d.D;
  const Weights w(d, 80);
  Layer<float> own(d, B, w.wq, w.wk, w.wv, w.wo), lent(d, B, w.wq, w.wk, w.wv, w.wo);
  const std::vector<float> in = cast<float>(random_normal(n, 81));
  const std::vector<float> d_out = cast<float>(random_normal(n, 82));
  auto step = [&](Layer<float>& layer, std::vector<float>& grads) {
    grads.assign(2 * layer.wq.size() + 2 * layer.wk.size(), 0.0f);
    float* g = grads.data();
    const AttnWeights<float> d_w{g, g + layer.wq.size(), g + layer.wq.size() + layer.wk.size(),
                                 g + layer.wq.size() + 2 * layer.wk.size()};
    std::vector<float> out = layer.forward(in, B), d_in(n, 0.0f);
    attention_backward(d_in.data(), d_w, d_out.data(), layer.saved, in.data(), layer.weights(), d,
                       layer.rope, B);
    out.insert(out.end(), d_in.begin(), d_in.end());
    return out;
  };
  std::vector<float> grads_own, grads_lent;
  const std::vector<float> want = step(own, grads_own);

  attn_saved_reserve(lent.saved, B, d, /*own_scratch=*/false);
  EXPECT_THROW(lent.forward(in, B), std::invalid_argument);
  AttnScratch<float> set;
  attn_scratch_reserve(set, B, d);
  for (std::vector<float>* v : {&set.d_concat, &set.d_q, &set.d_k, &set.d_v, &set.d_probs,
                                &set.kv_t, &set.d_k_heads, &set.d_v_heads, &set.leaves}) {
    std::fill(v->begin(), v->end(), std::numeric_limits<float>::quiet_NaN());
  }
  std::swap(lent.saved.scratch, set);
  const std::vector<float> got = step(lent, grads_lent);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  ASSERT_EQ(grads_lent.size(), grads_own.size());
  EXPECT_EQ(0, std::memcmp(grads_lent.data(), grads_own.data(), grads_own.size() * sizeof(float)));
}

// ---- RoPE --------------------------------------------------------------------------------------

// rope(a, p)·rope(b, p + δ) = a·R(δ·ω)·b depends only on δ: every position pair at distance δ
// gives the dot product of position pair (0, δ).
TEST(Rope, DotProductDependsOnlyOnPositionDifference) {
  const int S = 64, hd = 16;
  const RopeTable rope = rope_table_make(S, hd, 10000.0f);
  const Vec a = random_normal(hd, 80), b = random_normal(hd, 81);
  Vec xa(size_t(S) * hd), xb(size_t(S) * hd);  // a, b at every position
  for (int p = 0; p < S; ++p) {
    std::copy(a.begin(), a.end(), xa.begin() + p * hd);
    std::copy(b.begin(), b.end(), xb.begin() + p * hd);
  }
  rope_forward(xa.data(), rope, 1);
  rope_forward(xb.data(), rope, 1);
  auto qk = [&](int pa, int pb) {
    double s = 0.0;
    for (int i = 0; i < hd; ++i) s += xa[pa * hd + i] * xb[pb * hd + i];
    return s;
  };
  for (const int delta : {0, 1, 7, 40}) {
    const double at_zero = qk(0, delta);
    for (int p = 1; p + delta < S; ++p) {
      EXPECT_NEAR(qk(p, p + delta), at_zero, 1e-12 * std::max(1.0, std::abs(at_zero)))
          << "delta=" << delta << " p=" << p;
    }
  }
  EXPECT_GT(std::abs(qk(0, 7) - qk(0, 0)), 1e-3);  // the rotation is not the identity
}

// Pair i of a unit vector e_{2i} at position p lands on (cos(p·ω_i), sin(p·ω_i)) at (2i, 2i+1),
// ω_i = theta^(-2i/hd); rope_backward undoes rope_forward (rotations are orthogonal).
TEST(Rope, RotatesConsecutivePairsAndBackwardInverts) {
  const int S = 9, hd = 8, heads = 2;
  const double theta = 500.0;
  const RopeTable rope = rope_table_make(S, hd, float(theta));
  for (int i = 0; i < hd / 2; ++i) {
    Vec x(size_t(S) * heads * hd, 0.0);
    for (int p = 0; p < S; ++p) x[p * heads * hd + hd + 2 * i] = 1.0;  // head 1, e_{2i}
    rope_forward(x.data(), rope, heads);
    for (int p = 0; p < S; ++p) {
      const double angle = p * std::pow(theta, -2.0 * i / hd);
      const double* xp = x.data() + p * heads * hd + hd;
      for (int c = 0; c < hd; ++c) {
        const double expect = c == 2 * i ? std::cos(angle) : c == 2 * i + 1 ? std::sin(angle) : 0.0;
        EXPECT_NEAR(xp[c], expect, 1e-14) << "i=" << i << " p=" << p << " c=" << c;
      }
    }
  }
  const Vec x0 = random_normal(size_t(S) * heads * hd, 90);
  Vec x = x0;
  rope_forward(x.data(), rope, heads);
  rope_backward(x.data(), rope, heads);
  for (size_t j = 0; j < x.size(); ++j) EXPECT_NEAR(x[j], x0[j], 1e-14) << j;
}

// ---- refusals ----------------------------------------------------------------------------------

TEST(AttentionShapes, RefusesImpossibleShapes) {
  AttnSaved<double> saved;
  const AttnDims kv_not_dividing{8, 4, 3, 4, 5, 0, 1e4f}, odd_hd{8, 4, 2, 5, 5, 0, 1e4f},
      negative_window{8, 4, 2, 4, 5, -1, 1e4f};
  EXPECT_THROW(attn_saved_reserve(saved, 1, kv_not_dividing), std::invalid_argument);
  EXPECT_THROW(attn_saved_reserve(saved, 1, odd_hd), std::invalid_argument);
  EXPECT_THROW(attn_saved_reserve(saved, 1, negative_window), std::invalid_argument);
  EXPECT_THROW(rope_table_make(5, 3, 1e4f), std::invalid_argument);

  const AttnDims d{8, 2, 1, 4, 5, 0, 1e4f};
  const Weights w(d, 100);
  Layer<double> layer(d, 1, w.wq, w.wk, w.wv, w.wo);
  const Vec in = random_normal(2 * size_t(d.S) * d.D, 101);
  Vec out(in.size());
  EXPECT_THROW(
      attention_forward(out.data(), layer.saved, in.data(), layer.weights(), d, layer.rope, 2),
      std::invalid_argument);  // B above the reserved 1
  const RopeTable other = rope_table_make(d.S + 1, d.hd, d.rope_theta);
  EXPECT_THROW(attention_forward(out.data(), layer.saved, in.data(), layer.weights(), d, other, 1),
               std::invalid_argument);
}

}  // namespace
}  // namespace moe
