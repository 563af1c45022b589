// The experts of one MoE layer on a rank's threads: the routed experts' rows and weight
// gradients, and the shared expert, forward and backward (moe_layer.cpp runs them between the
// dispatch and the combine). Every result is the same on any thread count: rows do not depend on
// how they are split into tasks, and each weight gradient adds its sequences' leaves along the
// fixed tree (model/tree_sum.hpp, model/expert_grads.hpp).
// Legend: N tokens, R rows received, D model width, F expert width, Fs shared expert width,
// B sequences of S tokens.
#pragma once

#include <cstddef>
#include <utility>

#include "model/moe_layer.hpp"

namespace moe {

// The forward's N tokens as (B sequences, S rows each); one sequence of N rows when the routing
// gave no sequence length. Token-row GEMMs and weight gradients go sequence by sequence
// (model/per_sequence.hpp).
template <class T> std::pair<int, int> moe_sequences(const MoeSaved<T>& s, int N) {
  const int S = s.seq_len > 0 ? s.seq_len : N;
  return {S > 0 ? N / S : 0, S};
}

// Where an EP group of one rank finds its rows: no exchange moves them (expert row p is send
// position p, the assignment s.plan.send_assignment[p]), so each row task of the experts
// gathers its own rows from the tokens and reverses their weighted sum itself, while they are
// in its cache, where a larger group's exchange has a copy of every row made beforehand.
enum class ExpertRows {
  kExchanged,  // x, and in backward d_y and d_weights, are written before the experts run
  kInPlace,    // the row tasks write them: x from `in`; d_y and d_weights from d_out and y
};

// The combine's weighted sum (out[t] += w_a·y_a over token t's assignments a) reversed for the
// send positions [first, first + count): with a = s.plan.send_assignment[p] and t = a / K,
// d_rows[p] = w_a·d_out[t] and s.d_weights[a] = <d_out[t], y_rows[p]> (each dot one chain in
// order, kRowsAtOnce positions' chains side by side: for_row_groups), on the calling thread. Both
// ExpertRows paths call it, so both give the same bits.
template <class T>
void combine_rows_backward(MoeSaved<T>& s, const T* d_out, const T* y_rows, T* d_rows, int first,
                           int count, const MoeDims& d);

// The routed experts of this rank, each on its contiguous rows of x: g = x·W1, v = x·W3,
// h = swiglu(g, v), y = h·W2, in row tasks; with `shared_out`, the shared expert's sequences are
// tasks of the same region, writing shared_out ([N, D]; zeros without a shared expert). With
// ExpertRows::kInPlace each row task first copies its rows of x from `in`.
template <class T>
void moe_experts_forward(MoeSaved<T>& s, const MoeWeights<T>& w, const MoeDims& d, T* shared_out,
                         const T* in, ExpertRows where);

// The shared expert alone (while the dispatched rows are in flight) writes
// out = swiglu(in·S1, in·S3)·S2 (or zeros without one), a task per sequence; the routed experts'
// weighted outputs are added to it afterwards.
template <class T>
void moe_shared_forward(T* out, MoeSaved<T>& s, const T* in, const MoeWeights<T>& w,
                        const MoeDims& d, int N);

// The shared expert's backward alone (while the routed rows are in flight), with buffers of its
// own (sd_g, sd_v, sh): its rows a task per sequence, adding into d_in, then its three weight
// gradients.
template <class T>
void moe_shared_backward(T* d_in, const MoeWeights<T>& gr, const T* d_out, MoeSaved<T>& s,
                         const T* in, const MoeWeights<T>& w, const MoeDims& d, int N);

// moe_experts_forward reversed, in two rounds of tasks. First the rows, in chunks:
// d_h = d_y·W2ᵀ, h = swiglu(g, v) reversed (which leaves h in d_h's place), d_x = d_g·W1ᵀ +
// d_v·W3ᵀ. Then every weight gradient, each a task summing its expert's rows by sequence: d_W2
// from h and d_y, d_W1 and d_W3 from x and d_g, d_v. With `shared_d_in`, the shared expert's rows
// and weight gradients are tasks of the same rounds (its rows adding into shared_d_in). The first
// GEMM of d_h (the shared expert's too) and of d_x
// overwrites (linear_backward_input_overwrite): a zero there may be −0 where a sum into zeros
// gives +0, so their readers take each element as x + 0 (swiglu_backward; the layer's scatter
// of d_x into the tokens' gradients). With ExpertRows::kInPlace each row task first writes its
// rows of d_y and their d_weights (combine_rows_backward, from d_out and y).
template <class T>
void moe_experts_backward(MoeSaved<T>& s, const MoeWeights<T>& gr, const MoeWeights<T>& w,
                          const MoeDims& d, T* shared_d_in, const T* d_out, const T* in,
                          ExpertRows where);

}  // namespace moe
