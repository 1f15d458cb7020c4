// The gradient of an embedding lookup (src/kernels/embedding.rs is the
// reference): each looked-up row's gradient added into its table row, in
// f32 with atomics, then rounded to the table's dtype. candle's index_add
// took 4.3 ms of a 77 ms GPT-2 step for GPT-2's 8192 x 768 lookups.
#include "common.cuh"

// acc [vocab, d] (zeroed) += g [n, d] by row ids[i]; ids past the
// vocabulary add nothing (the forward's lookup reports them).
template <typename T>
__device__ void embedding_grad_add(const T* g, const uint32_t* ids, float* acc, size_t n, int d,
                                   uint32_t vocab) {
  FOR_EACH(i, n * (size_t)d) {
    const uint32_t id = ids[i / d];
    if (id < vocab) atomicAdd(acc + (size_t)id * d + i % d, to_f(g[i]));
  }
}

template <typename T> __device__ void embedding_grad_round(const float* acc, T* out, size_t n) {
  FOR_EACH(i, n) out[i] = from_f<T>(acc[i]);
}

#define EMBEDDING(T, S)                                                                     \
  extern "C" __global__ void embedding_grad_add_##S(const T* g, const uint32_t* ids,       \
                                                    float* acc, size_t n, int d,            \
                                                    uint32_t vocab) {                       \
    embedding_grad_add(g, ids, acc, n, d, vocab);                                           \
  }                                                                                         \
  extern "C" __global__ void embedding_grad_round_##S(const float* acc, T* out, size_t n) { \
    embedding_grad_round(acc, out, n);                                                      \
  }
FOR_FLOAT_TYPES(EMBEDDING)
