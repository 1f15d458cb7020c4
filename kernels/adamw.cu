// Fused AdamW over f32 weights, in one pass per parameter tensor, with the
// moments in f32 or in bitsandbytes' blockwise dynamic 8-bit format. The
// arithmetic is written in the same order as src/kernels/adamw.rs and
// quant8.rs, and the build compiles with --fmad=false, so the results are
// those of the CPU reference bit for bit (sqrtf and division are IEEE).
#include "common.cuh"

struct Hyper {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay, step_size, sqrt_bc2;
};

__device__ __forceinline__ float apply(const Hyper& h, float theta, float m, float v) {
  return theta * h.decay - h.step_size * m / (sqrtf(v) / h.sqrt_bc2 + h.eps);
}

extern "C" __global__ void adamw_f32(float* theta, const float* g, float* m, float* v, size_t n,
                                     Hyper h) {
  FOR_EACH(i, n) {
    const float gi = g[i];
    const float mi = h.beta1 * m[i] + h.one_minus_beta1 * gi;
    const float vi = h.beta2 * v[i] + h.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    theta[i] = apply(h, theta[i], mi, vi);
  }
}

// Under mixed precision: the gradient in the working copy's dtype T, times
// `scale` (gradient clipping's factor, or 1), and the working copy written
// from the updated weight in the same pass. The same values as casting the
// gradient to f32, scaling it, adamw_f32 and casting the weights back
// (src/kernels/adamw_mixed.rs), without the two f32 and low copies.
// The factor is `scale`, or, when `scale_at` is not null, the f32 value
// there: gradient clipping's factor, computed on the device
// (`clip_factor` in norm.cu) and never read by the host.
// One value's update (the arithmetic of adamw_f32, on the scaled gradient).
template <typename T>
__device__ __forceinline__ void mixed_one(const Hyper& h, float scale, float& theta, T g, float& m,
                                          float& v, T& work) {
  // As candle scales: x * mul + add (so a -0 gradient becomes +0).
  const float gi = scale == 1.f ? to_f(g) : to_f(g) * scale + 0.f;
  const float mi = h.beta1 * m + h.one_minus_beta1 * gi;
  const float vi = h.beta2 * v + h.one_minus_beta2 * gi * gi;
  m = mi;
  v = vi;
  const float t = apply(h, theta, mi, vi);
  theta = t;
  work = from_f<T>(t);
}

// Four values a thread at a time (16 bytes of each f32 array, 8 of the
// gradient and the working copy) where every pointer allows, then the tail
// a value at a time; a value at a time otherwise. The launcher sizes the
// grid for four values a thread.
template <typename T>
__device__ void adamw_mixed(float* theta, const T* g, float scale, const float* scale_at, float* m,
                            float* v, T* work, size_t n, const Hyper& h) {
  static_assert(sizeof(T) == 2, "f16 or bf16");
  if (scale_at) scale = *scale_at;
  const bool packed = aligned16(theta, m, v) && (((uintptr_t)g | (uintptr_t)work) & 7) == 0;
  const size_t packs = packed ? n / 4 : 0;
  FOR_EACH(p, packs) {
    uint4 t4 = reinterpret_cast<const uint4*>(theta)[p];
    uint4 m4 = reinterpret_cast<const uint4*>(m)[p];
    uint4 v4 = reinterpret_cast<const uint4*>(v)[p];
    const uint2 g2 = reinterpret_cast<const uint2*>(g)[p];
    uint2 w2;
    float* tt = reinterpret_cast<float*>(&t4);
    float* mm = reinterpret_cast<float*>(&m4);
    float* vv = reinterpret_cast<float*>(&v4);
    const T* gg = reinterpret_cast<const T*>(&g2);
    T* ww = reinterpret_cast<T*>(&w2);
    for (int j = 0; j < 4; j++) mixed_one(h, scale, tt[j], gg[j], mm[j], vv[j], ww[j]);
    reinterpret_cast<uint4*>(theta)[p] = t4;
    reinterpret_cast<uint4*>(m)[p] = m4;
    reinterpret_cast<uint4*>(v)[p] = v4;
    reinterpret_cast<uint2*>(work)[p] = w2;
  }
  FOR_EACH(i, n - packs * 4) {
    const size_t k = packs * 4 + i;
    mixed_one(h, scale, theta[k], g[k], m[k], v[k], work[k]);
  }
}

#define ADAMW_MIXED(T, S)                                                                    \
  extern "C" __global__ void adamw_mixed_##S(float* theta, const T* g, float scale,          \
                                             const float* scale_at, float* m, float* v,      \
                                             T* work, size_t n, Hyper h) {                   \
    adamw_mixed(theta, g, scale, scale_at, m, v, work, n, h);                                \
  }
ADAMW_MIXED(__half, f16)
ADAMW_MIXED(__nv_bfloat16, bf16)

#define BLOCK 256

// The number of the 255 midpoints below s: the index of the nearest code
// entry, ties to the lower one (Rust's partition_point(|b| b < s)).
__device__ __forceinline__ uint8_t encode(float s, const float* bounds) {
  int lo = 0, hi = 255;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (bounds[mid] < s) lo = mid + 1;
    else hi = mid;
  }
  return (uint8_t)lo;
}

__device__ __forceinline__ float clamp1(float x) { return x < -1.f ? -1.f : (x > 1.f ? 1.f : x); }

// One block of BLOCK threads per block of BLOCK values. tables holds the
// signed code, the unsigned code, then their 255 midpoints each: 1022
// floats (quant8::DEVICE_TABLES). absmax has one entry per block.
extern "C" __global__ void adamw8_f32(float* theta, const float* g, uint8_t* qm, float* am,
                                      uint8_t* qv, float* av, const float* tables, size_t n,
                                      Hyper h) {
  __shared__ float t[4 * 256];
  for (int k = threadIdx.x; k < 1022; k += blockDim.x) t[k] = tables[k];
  __syncthreads();
  const float *code_m = t, *code_v = t + 256, *bounds_m = t + 512, *bounds_v = t + 767;
  const size_t i = (size_t)blockIdx.x * BLOCK + threadIdx.x;
  const bool live = i < n;
  const float old_am = am[blockIdx.x], old_av = av[blockIdx.x];
  float mi = 0.f, vi = 0.f;
  if (live) {
    const float gi = g[i];
    const float m0 = code_m[qm[i]] * old_am, v0 = code_v[qv[i]] * old_av;
    mi = h.beta1 * m0 + h.one_minus_beta1 * gi;
    vi = h.beta2 * v0 + h.one_minus_beta2 * gi * gi;
    theta[i] = apply(h, theta[i], mi, vi);
  }
  // The barriers in block_max also order every read of am/av above before
  // thread 0's writes below.
  const float new_am = block_max(fabsf(mi)), new_av = block_max(fabsf(vi));
  if (live) {
    qm[i] = encode(clamp1(mi * (1.f / fmaxf(new_am, 1e-38f))), bounds_m);
    qv[i] = encode(clamp1(vi * (1.f / fmaxf(new_av, 1e-38f))), bounds_v);
  }
  if (threadIdx.x == 0) {
    am[blockIdx.x] = new_am;
    av[blockIdx.x] = new_av;
  }
}
