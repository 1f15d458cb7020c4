// Sums of squares in f64 for the global gradient norm (src/kernels/norm.rs):
// one pass over a tensor of any float dtype, with no f64 copy of it. Two
// launches, each summing in a fixed order, so the norm repeats bit for bit:
// per-block partial sums over a grid-stride loop, then one block sums them.
#include "common.cuh"

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The block's sum, in every thread. blockDim.x is a multiple of 32.
__device__ double block_sum_f64(double v) {
  __shared__ double s[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum_f64(v);
  if (lane == 0) s[warp] = v;
  __syncthreads();
  return warp_sum_f64(lane < warps ? s[lane] : 0.0);
}

template <typename T> __device__ void sum_squares_part(const T* x, size_t n, double* part) {
  double acc = 0.0;
  FOR_EACH(i, n) {
    const double v = (double)to_f(x[i]);
    acc += v * v;
  }
  acc = block_sum_f64(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

#define SUM_SQUARES(T, S)                                                                   \
  extern "C" __global__ void sum_squares_part_##S(const T* x, size_t n, double* part) {    \
    sum_squares_part(x, n, part);                                                         \
  }
FOR_FLOAT_TYPES(SUM_SQUARES)

extern "C" __global__ void sum_squares_finish(const double* part, int blocks, double* out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) acc += part[i];
  acc = block_sum_f64(acc);
  if (threadIdx.x == 0) *out = acc;
}

// Gradient clipping's factor from the sum of squares, as the host computes
// it (`clip_factor_of` in src/kernels/norm.rs): min(1, max_norm /
// (sqrt(sum) + 1e-6)) in f64, then f32; a NaN norm gives 1. It stays on
// the device, so the update is queued without waiting to read the norm.
extern "C" __global__ void clip_factor(const double* sum, double max_norm, float* out) {
  const double s = max_norm / (sqrt(*sum) + 1e-6);
  *out = s < 1.0 ? (float)s : 1.f;
}
