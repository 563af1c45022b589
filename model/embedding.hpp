// Token embedding lookup and the softmax cross-entropy of the LM head, forward and backward.
// Legend: N tokens, D model width, V vocab.
#pragma once

#include <cstdint>

namespace moe {

// out[t] = table[ids[t]]. Throws std::out_of_range naming the token id and V for an id outside
// [0, V) (data readers check this earlier; this is the last line of defence).
template <class T>
void embedding_forward(T* out,              // [N, D]
                       const int32_t* ids,  // [N]
                       const T* table,      // [V, D]
                       int N, int D, int V);

// d_table[ids[t]] += d_out[t].
template <class T>
void embedding_backward(T* d_table,          // [V, D]
                        const T* d_out,      // [N, D]
                        const int32_t* ids,  // [N]
                        int N, int D);

// Softmax cross-entropy of logits against next-token targets, fused with its backward.
// Returns Σ_t (logsumexp(logits[t]) − logits[t][targets[t]]) accumulated in double; writes
// d_logits = (softmax(logits) − onehot(targets)) · scale, where scale is 1 / (tokens in the
// global mean), so that the gradient is that of the global mean loss. Rows run as parallel tasks;
// their losses, kept in row_loss, are added in row order.
template <class T>
double cross_entropy_forward_backward(T* d_logits,             // [N, V]
                                      double* row_loss,        // [N] scratch
                                      const T* logits,         // [N, V]
                                      const int32_t* targets,  // [N]
                                      int N, int V, double scale);

}  // namespace moe
