// Rotary position embedding, pairs interleaved (src/kernels/rope.rs is the
// reference): x [bh, t, d], cos and sin [t, d/2] in f32. sign = -1 rotates
// back, which is the backward.
#include "common.cuh"

template <typename T>
__device__ void rope_i(const T* x, const float* cos, const float* sin, T* y, size_t pairs, int t,
                       int half, float sign) {
  FOR_EACH(k, pairs) {
    const int i = k % half;
    const int p = (k / half) % t;
    const float a = to_f(x[2 * k]), b = to_f(x[2 * k + 1]);
    const float c = cos[p * half + i], s = sign * sin[p * half + i];
    y[2 * k] = from_f<T>(a * c - b * s);
    y[2 * k + 1] = from_f<T>(a * s + b * c);
  }
}

#define ROPE(T, S)                                                                         \
  extern "C" __global__ void rope_i_##S(const T* x, const float* cos, const float* sin, T* y, \
                                        size_t pairs, int t, int half, float sign) {       \
    rope_i(x, cos, sin, y, pairs, t, half, sign);                                          \
  }
FOR_FLOAT_TYPES(ROPE)
