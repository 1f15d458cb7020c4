// The row ops of the fused causal attention (src/kernels/attention.rs; the
// products are cuBLAS calls from src/kernels/attention_cuda.rs). Both work
// in place on a [heads * t, t] buffer of scores, a warp or a block per row
// (ROW in common.cuh).
#include "common.cuh"

// Row r is query r % t, which sees keys 0..=r % t: the softmax over those,
// and 0 above the diagonal. Every read of the row happens before the
// row_sum reduction, every write after it, so in place is safe.
template <typename T> __device__ void causal_softmax(T* s, int t, int rows) {
  ROW(row, rows)
  const int live = (int)(row % (size_t)t) + 1;
  T* r = s + row * (size_t)t;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < live; i += blockDim.x) m = fmaxf(m, to_f(r[i]));
  m = row_max(m);
  float sum = 0.f;
  for (int i = threadIdx.x; i < live; i += blockDim.x) sum += expf(to_f(r[i]) - m);
  const float inv = 1.f / row_sum(sum);
  for (int i = threadIdx.x; i < t; i += blockDim.x)
    r[i] = from_f<T>(i < live ? expf(to_f(r[i]) - m) * inv : 0.f);
}

// g = p * (g - sum(g * p)) in place, from the causal weights p: the
// gradient of the scores from the gradient of the weights. Above the
// diagonal p is 0, so g is too, and only the live part is read.
template <typename T> __device__ void causal_softmax_grad(const T* p, T* g, int t, int rows) {
  ROW(row, rows)
  const int live = (int)(row % (size_t)t) + 1;
  const size_t off = row * (size_t)t;
  float dot = 0.f;
  for (int i = threadIdx.x; i < live; i += blockDim.x) dot += to_f(p[off + i]) * to_f(g[off + i]);
  dot = row_sum(dot);
  for (int i = threadIdx.x; i < t; i += blockDim.x)
    g[off + i] = from_f<T>(i < live ? to_f(p[off + i]) * (to_f(g[off + i]) - dot) : 0.f);
}

#define ATTENTION(T, S)                                                                     \
  extern "C" __global__ void causal_softmax_##S(T* s, int t, int rows) {                    \
    causal_softmax(s, t, rows);                                                             \
  }                                                                                         \
  extern "C" __global__ void causal_softmax_grad_##S(const T* p, T* g, int t, int rows) {   \
    causal_softmax_grad(p, g, t, rows);                                                     \
  }
FOR_FLOAT_TYPES(ATTENTION)
