// The row ops of the fused causal attention (src/kernels/attention.rs; the
// products are cuBLAS calls from src/kernels/attention_cuda.rs). Both work
// in place on a [heads * t, t] buffer of scores, one block per row.
#include "common.cuh"

// Row r is query r % t, which sees keys 0..=r % t: the softmax over those,
// and 0 above the diagonal. Every read of the row happens before the
// block_sum barrier, every write after it, so in place is safe.
template <typename T> __device__ void causal_softmax(T* s, int t) {
  const size_t row = blockIdx.x;
  const int live = (int)(row % (size_t)t) + 1;
  T* r = s + row * (size_t)t;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < live; i += blockDim.x) m = fmaxf(m, to_f(r[i]));
  m = block_max(m);
  float sum = 0.f;
  for (int i = threadIdx.x; i < live; i += blockDim.x) sum += expf(to_f(r[i]) - m);
  const float inv = 1.f / block_sum(sum);
  for (int i = threadIdx.x; i < t; i += blockDim.x)
    r[i] = from_f<T>(i < live ? expf(to_f(r[i]) - m) * inv : 0.f);
}

// g = p * (g - sum(g * p)) in place, from the weights p: the gradient of
// the scores from the gradient of the weights. Zero where p is (the mask).
template <typename T> __device__ void softmax_grad_inplace(const T* p, T* g, int cols) {
  const size_t off = (size_t)blockIdx.x * cols;
  float dot = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) dot += to_f(p[off + i]) * to_f(g[off + i]);
  dot = block_sum(dot);
  for (int i = threadIdx.x; i < cols; i += blockDim.x)
    g[off + i] = from_f<T>(to_f(p[off + i]) * (to_f(g[off + i]) - dot));
}

#define ATTENTION(T, S)                                                                     \
  extern "C" __global__ void causal_softmax_##S(T* s, int t) { causal_softmax(s, t); }      \
  extern "C" __global__ void softmax_grad_inplace_##S(const T* p, T* g, int cols) {         \
    softmax_grad_inplace(p, g, cols);                                                       \
  }
FOR_FLOAT_TYPES(ATTENTION)
