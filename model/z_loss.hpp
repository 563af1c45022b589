// The router z-loss (ST-MoE, Zoph et al. 2022; Megatron-Core's moe_z_loss_coeff): a penalty on
// large router logits, which keeps the router's softmax out of the range where float rounding
// makes it unstable. For token t with router logits l_t over the E experts,
//   z_t = log Σ_e exp(l_t[e]),   L_z = weight · Σ_t z_t²,   ∂L_z/∂l_t[e] = weight · 2·z_t ·
//   softmax(l_t)[e],
// where the run's weight is --z-loss-weight / T, so that L_z is the mean over the step's T tokens
// (model.cpp, layer_routing). It acts on the logits of every layer, whatever selects its experts:
// the router's weights and input get its gradient through the logits.
// In double through numeric/det_math.hpp, the sum sequence by sequence along the tree over
// sequences (model/tree_sum.hpp): the same bits on every machine and at any rank count.
// Legend: B sequences, S tokens per sequence, N = B·S rows, E experts.
#pragma once

namespace moe {

// The loss of B sequences of S rows: weight · (Σ over sequences, along the tree, of Σ_t z_t²).
template <class T>
double router_z_loss_forward(const T* logits,  // [N, E]
                             int B, int S, int E, double weight);

// d_logits += weight · 2·z_t · softmax(l_t), row by row.
template <class T>
void router_z_loss_backward(T* d_logits,      // [N, E] +=
                            const T* logits,  // [N, E]
                            int N, int E, double weight);

}  // namespace moe
