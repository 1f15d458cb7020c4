// GELU, tanh approximation, forward and backward (src/kernels/gelu.rs is
// the reference). A thread takes 16 bytes at a time where the buffers allow
// (map_values in common.cuh; `map1`, `map2` in src/kernels/cuda.rs launch
// it).
#include "common.cuh"

#define K0 0.7978845608f  // sqrt(2 / pi)
#define K1 0.044715f

__device__ __forceinline__ float gelu_of(float v) {
  const float t = tanhf(K0 * (v + K1 * v * v * v));
  return 0.5f * v * (1.f + t);
}

// gelu'(v)
__device__ __forceinline__ float gelu_slope(float v) {
  const float v2 = v * v;
  const float t = tanhf(K0 * v * (1.f + K1 * v2));
  return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * K0 * (1.f + 3.f * K1 * v2);
}

// y = gelu(x)
template <typename T> __device__ void gelu_fwd(const T* x, T* y, size_t n) {
  map_values(x, y, n, [](float v) { return gelu_of(v); });
}

// out = grad * gelu'(x)
template <typename T> __device__ void gelu_bwd(const T* x, const T* g, T* out, size_t n) {
  map_values(x, g, out, n, [](float v, float gv) { return gv * gelu_slope(v); });
}

#define GELU(T, S)                                                                    \
  extern "C" __global__ void gelu_fwd_##S(const T* x, T* y, size_t n) { gelu_fwd(x, y, n); } \
  extern "C" __global__ void gelu_bwd_##S(const T* x, const T* g, T* out, size_t n) {        \
    gelu_bwd(x, g, out, n);                                                           \
  }
FOR_FLOAT_TYPES(GELU)
