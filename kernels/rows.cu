// Row-wise ops over the last dimension, a warp or a block per row (ROW in
// common.cuh): softmax and layer norm, forward and backward
// (src/kernels/rows.rs is the reference).
#include "common.cuh"

template <typename T> __device__ void softmax_fwd(const T* x, T* y, int cols, int rows) {
  ROW(row, rows)
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, to_f(xr[i]));
  m = row_max(m);
  float s = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) s += expf(to_f(xr[i]) - m);
  const float r = 1.f / row_sum(s);
  for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = from_f<T>(expf(to_f(xr[i]) - m) * r);
}

// out = y * (g - sum(g * y)), from the softmax output y.
template <typename T>
__device__ void softmax_bwd(const T* y, const T* g, T* out, int cols, int rows) {
  ROW(row, rows)
  const size_t off = row * cols;
  float dot = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) dot += to_f(y[off + i]) * to_f(g[off + i]);
  dot = row_sum(dot);
  for (int i = threadIdx.x; i < cols; i += blockDim.x)
    out[off + i] = from_f<T>(to_f(y[off + i]) * (to_f(g[off + i]) - dot));
}

// A row's mean and 1 / std, as rows.rs's `moments` (two passes).
template <typename T> __device__ float2 row_moments(const T* xr, int cols, float eps) {
  float s = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) s += to_f(xr[i]);
  const float mean = row_sum(s) / cols;
  float q = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const float d = to_f(xr[i]) - mean;
    q += d * d;
  }
  const float var = row_sum(q) / cols;
  return make_float2(mean, 1.f / sqrtf(var + eps));
}

template <typename T>
__device__ void layer_norm_fwd(const T* x, const T* w, const T* b, T* y, int cols, int rows,
                               float eps) {
  ROW(row, rows)
  const size_t off = row * cols;
  const float2 mr = row_moments(x + off, cols, eps);
  for (int i = threadIdx.x; i < cols; i += blockDim.x)
    y[off + i] = from_f<T>((to_f(x[off + i]) - mr.x) * mr.y * to_f(w[i]) + to_f(b[i]));
}

// dx = rstd * (g*w - mean(g*w) - x̂ * mean(g*w*x̂))
template <typename T>
__device__ void layer_norm_bwd_x(const T* x, const T* w, const T* g, T* dx, int cols, int rows,
                                 float eps) {
  ROW(row, rows)
  const size_t off = row * cols;
  const float2 mr = row_moments(x + off, cols, eps);
  float a = 0.f, c = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const float gw = to_f(g[off + i]) * to_f(w[i]);
    a += gw;
    c += gw * (to_f(x[off + i]) - mr.x) * mr.y;
  }
  a = row_sum(a) / cols;
  c = row_sum(c) / cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const float xh = (to_f(x[off + i]) - mr.x) * mr.y;
    dx[off + i] = from_f<T>(mr.y * (to_f(g[off + i]) * to_f(w[i]) - a - xh * c));
  }
}

// Each row's (mean, rstd), for the weight and bias gradients.
template <typename T>
__device__ void layer_norm_stats(const T* x, float2* stats, int cols, int rows, float eps) {
  ROW(row, rows)
  const float2 mr = row_moments(x + row * cols, cols, eps);
  if (threadIdx.x == 0) stats[row] = mr;
}

// Partial sums of dw = sum g*x̂ and db = sum g over `per` rows: block
// (chunk, column tile), a thread per column, so reads are coalesced.
// partial is [chunks, 2, cols].
template <typename T>
__device__ void layer_norm_bwd_wb_partial(const T* x, const T* g, const float2* stats,
                                          float* partial, int rows, int cols, int per) {
  const int col = blockIdx.y * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int r0 = blockIdx.x * per;
  const int r1 = min(rows, r0 + per);
  float dw = 0.f, db = 0.f;
  for (int r = r0; r < r1; r++) {
    const size_t k = (size_t)r * cols + col;
    const float gv = to_f(g[k]);
    dw += gv * (to_f(x[k]) - stats[r].x) * stats[r].y;
    db += gv;
  }
  partial[((size_t)blockIdx.x * 2) * cols + col] = dw;
  partial[((size_t)blockIdx.x * 2 + 1) * cols + col] = db;
}

// out [2, cols] = the partial sums added over chunks.
template <typename T>
__device__ void layer_norm_bwd_wb_final(const float* partial, T* out, int chunks, int cols) {
  FOR_EACH(k, (size_t)2 * cols) {
    float s = 0.f;
    for (int c = 0; c < chunks; c++) s += partial[(size_t)c * 2 * cols + k];
    out[k] = from_f<T>(s);
  }
}

#define ROWS(T, S)                                                                          \
  extern "C" __global__ void softmax_fwd_##S(const T* x, T* y, int cols, int rows) {        \
    softmax_fwd(x, y, cols, rows);                                                          \
  }                                                                                         \
  extern "C" __global__ void softmax_bwd_##S(const T* y, const T* g, T* out, int cols,     \
                                             int rows) {                                    \
    softmax_bwd(y, g, out, cols, rows);                                                     \
  }                                                                                         \
  extern "C" __global__ void layer_norm_fwd_##S(const T* x, const T* w, const T* b, T* y,   \
                                                int cols, int rows, float eps) {            \
    layer_norm_fwd(x, w, b, y, cols, rows, eps);                                            \
  }                                                                                         \
  extern "C" __global__ void layer_norm_bwd_x_##S(const T* x, const T* w, const T* g, T* dx, \
                                                  int cols, int rows, float eps) {          \
    layer_norm_bwd_x(x, w, g, dx, cols, rows, eps);                                         \
  }                                                                                         \
  extern "C" __global__ void layer_norm_stats_##S(const T* x, float2* stats, int cols,      \
                                                  int rows, float eps) {                    \
    layer_norm_stats(x, stats, cols, rows, eps);                                            \
  }                                                                                         \
  extern "C" __global__ void layer_norm_bwd_wb_partial_##S(                                 \
      const T* x, const T* g, const float2* stats, float* partial, int rows, int cols,      \
      int per) {                                                                            \
    layer_norm_bwd_wb_partial(x, g, stats, partial, rows, cols, per);                       \
  }                                                                                         \
  extern "C" __global__ void layer_norm_bwd_wb_final_##S(const float* partial, T* out,      \
                                                         int chunks, int cols) {            \
    layer_norm_bwd_wb_final(partial, out, chunks, cols);                                    \
  }
FOR_FLOAT_TYPES(ROWS)
