// GELU, tanh approximation, forward and backward (src/kernels/gelu.rs is
// the reference).
#include "common.cuh"

#define K0 0.7978845608f  // sqrt(2 / pi)
#define K1 0.044715f

template <typename T> __device__ void gelu_fwd(const T* x, T* y, size_t n) {
  FOR_EACH(i, n) {
    const float v = to_f(x[i]);
    const float t = tanhf(K0 * (v + K1 * v * v * v));
    y[i] = from_f<T>(0.5f * v * (1.f + t));
  }
}

// out = grad * gelu'(x)
template <typename T> __device__ void gelu_bwd(const T* x, const T* g, T* out, size_t n) {
  FOR_EACH(i, n) {
    const float v = to_f(x[i]);
    const float v2 = v * v;
    const float t = tanhf(K0 * v * (1.f + K1 * v2));
    const float d = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * K0 * (1.f + 3.f * K1 * v2);
    out[i] = from_f<T>(to_f(g[i]) * d);
  }
}

#define GELU(T, S)                                                                    \
  extern "C" __global__ void gelu_fwd_##S(const T* x, T* y, size_t n) { gelu_fwd(x, y, n); } \
  extern "C" __global__ void gelu_bwd_##S(const T* x, const T* g, T* out, size_t n) {        \
    gelu_bwd(x, g, out, n);                                                           \
  }
FOR_FLOAT_TYPES(GELU)
