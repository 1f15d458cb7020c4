// Cross-entropy over rows of logits, one block per row (the pieces of the
// chunked cross-entropy; src/kernels/chunked_ce.rs is the reference). With
// label smoothing eps, a row's loss is lse - (1 - eps) z_y - eps mean(z).
// Rows are `cols` apart and their first `live` values are the vocabulary;
// the rest are padding (ignored by the loss, given a zero gradient).
#include "common.cuh"

// lse and the row's sum; every thread gets both.
template <typename T> __device__ float2 lse_sum(const T* z, int cols) {
  float m = -INFINITY, t = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = to_f(z[i]);
    m = fmaxf(m, v);
    t += v;
  }
  m = block_max(m);
  t = block_sum(t);
  float s = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) s += expf(to_f(z[i]) - m);
  return make_float2(m + logf(block_sum(s)), t);
}

template <typename T>
__device__ void ce_loss(const T* z, const uint32_t* y, float* loss, int cols, int live,
                        float eps) {
  const T* zr = z + (size_t)blockIdx.x * cols;
  const float2 ls = lse_sum(zr, live);
  const uint32_t target = y[blockIdx.x];
  // A target outside the vocabulary gives NaN (checking on the host would
  // cost a device sync per step).
  if (threadIdx.x == 0)
    loss[blockIdx.x] = target < (uint32_t)live
                           ? ls.x - (1.f - eps) * to_f(zr[target]) - eps * (ls.y / live)
                           : NAN;
}

// z becomes dz = (softmax(z) - eps / V - (1 - eps) onehot(y)) * g[0] * scale,
// in place, where g is the loss's incoming gradient (on the device: no host
// sync). In place is safe: every read for the lse is behind the barriers of
// its reductions, and the last loop reads and writes each value in one
// thread.
template <typename T>
__device__ void ce_grad(T* z, const uint32_t* y, const float* g, int cols, int live,
                        float scale, float eps) {
  const size_t off = (size_t)blockIdx.x * cols;
  const float lse = lse_sum(z + off, live).x;
  const float k = g[0] * scale, spread = eps / live;
  const uint32_t target = y[blockIdx.x];
  const float bad = target < (uint32_t)live ? 0.f : NAN;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    float d = 0.f;
    if (i < live) {
      d = (expf(to_f(z[off + i]) - lse) - spread) * k + bad;
      if ((uint32_t)i == target) d -= (1.f - eps) * k;
    }
    z[off + i] = from_f<T>(d);
  }
}

// ce_loss and ce_grad in one kernel, for an incoming gradient of 1: the
// chunked cross-entropy's forward makes the gradient while the logits are
// at hand (its backward then multiplies by the real incoming gradient,
// scale_by below), so the logits are neither read again nor recomputed.
// Two passes over the row instead of five: each thread keeps its max and
// its sum of exponentials together, rescaling the sum when the max grows.
template <typename T>
__device__ void ce_loss_grad(T* z, const uint32_t* y, float* loss, int cols, int live,
                             float scale, float eps) {
  T* zr = z + (size_t)blockIdx.x * cols;
  const uint32_t target = y[blockIdx.x];
  const bool ok = target < (uint32_t)live;
  // Read before any thread writes (the reductions' barriers come between).
  const float zy = ok ? to_f(zr[target]) : 0.f;
  float m = -INFINITY, s = 0.f, t = 0.f;
  for (int i = threadIdx.x; i < live; i += blockDim.x) {
    const float v = to_f(zr[i]);
    if (v > m) {
      s = s * expf(m - v) + 1.f;
      m = v;
    } else if (m != -INFINITY) {
      s += expf(v - m);
    }
    t += v;
  }
  const float top = block_max(m);
  const float lse = top + logf(block_sum(m == -INFINITY ? 0.f : s * expf(m - top)));
  const float total = block_sum(t);
  if (threadIdx.x == 0)
    loss[blockIdx.x] = ok ? lse - (1.f - eps) * zy - eps * (total / live) : NAN;
  const float spread = eps / live, bad = ok ? 0.f : NAN;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    float d = 0.f;
    if (i < live) {
      d = (expf(to_f(zr[i]) - lse) - spread) * scale + bad;
      if ((uint32_t)i == target) d -= (1.f - eps) * scale;
    }
    zr[i] = from_f<T>(d);
  }
}

// y = x * s[0] in f32, where s is the loss's incoming gradient on the
// device: the chunked cross-entropy's backward, over the gradients its
// forward made for an incoming gradient of 1.
template <typename T> __device__ void scale_by(const T* x, const float* s, T* y, size_t n) {
  const float k = s[0];
  FOR_EACH(i, n) y[i] = from_f<T>(to_f(x[i]) * k);
}

#define CE(T, S)                                                                             \
  extern "C" __global__ void ce_loss_##S(const T* z, const uint32_t* y, float* loss, int cols, \
                                         int live, float eps) {                              \
    ce_loss(z, y, loss, cols, live, eps);                                                    \
  }                                                                                          \
  extern "C" __global__ void ce_grad_##S(T* z, const uint32_t* y, const float* g, int cols,    \
                                         int live, float scale, float eps) {                 \
    ce_grad(z, y, g, cols, live, scale, eps);                                                \
  }                                                                                          \
  extern "C" __global__ void ce_loss_grad_##S(T* z, const uint32_t* y, float* loss, int cols,  \
                                              int live, float scale, float eps) {             \
    ce_loss_grad(z, y, loss, cols, live, scale, eps);                                        \
  }                                                                                          \
  extern "C" __global__ void scale_by_##S(const T* x, const float* s, T* y, size_t n) {        \
    scale_by(x, s, y, n);                                                                    \
  }
FOR_FLOAT_TYPES(CE)
