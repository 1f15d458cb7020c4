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

// A row's mean and 1 / std, as rows.rs's `moments` (two passes), V values
// at a time; WARP: the row is a warp's (layer_norm_bwd's), so the kernel
// does not take block_sum's shared memory along.
template <typename T, int V = 1, bool WARP = false>
__device__ float2 row_moments(const T* xr, int cols, float eps) {
  auto sum = [](float v) {
    if constexpr (WARP)
      return warp_sum(v);
    else
      return row_sum(v);
  };
  float s = 0.f;
  for (int i = threadIdx.x * V; i < cols; i += blockDim.x * V) {
    float v[V];
    load_f<T, V>(xr + i, v);
    for (int j = 0; j < V; j++) s += v[j];
  }
  const float mean = sum(s) / cols;
  float q = 0.f;
  for (int i = threadIdx.x * V; i < cols; i += blockDim.x * V) {
    float v[V];
    load_f<T, V>(xr + i, v);
    for (int j = 0; j < V; j++) q += (v[j] - mean) * (v[j] - mean);
  }
  const float var = sum(q) / cols;
  return make_float2(mean, 1.f / sqrtf(var + eps));
}

template <typename T, int V>
__device__ void layer_norm_fwd_v(const T* x, const T* w, const T* b, T* y, int cols, int rows,
                                 float eps) {
  ROW(row, rows)
  const size_t off = row * cols;
  const float2 mr = row_moments<T, V>(x + off, cols, eps);
  for (int i = threadIdx.x * V; i < cols; i += blockDim.x * V) {
    float xv[V], wv[V], bv[V], yv[V];
    load_f<T, V>(x + off + i, xv);
    load_f<T, V>(w + i, wv);
    load_f<T, V>(b + i, bv);
    for (int j = 0; j < V; j++) yv[j] = (xv[j] - mr.x) * mr.y * wv[j] + bv[j];
    store_f<T, V>(y + off + i, yv);
  }
}

template <typename T>
__device__ void layer_norm_fwd(const T* x, const T* w, const T* b, T* y, int cols, int rows,
                               float eps) {
  constexpr int V = 16 / sizeof(T);
  if (cols % V == 0 && aligned16(x, y, w, b))
    layer_norm_fwd_v<T, V>(x, w, b, y, cols, rows, eps);
  else
    layer_norm_fwd_v<T, 1>(x, w, b, y, cols, rows, eps);
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

// The whole backward in one pass over x and g (the three kernels above
// read x four times and g twice from memory; they remain for rows too long
// for this one). A warp per row writes dx as layer_norm_bwd_x does; meanwhile
// each warp adds g * x̂ and g into accumulators of its own in shared memory,
// where a lane owns columns lane, lane + 32, ..., so no two threads add
// into one value. A block (32, warps) takes `per` consecutive rows, its warp
// w rows w, w + warps, ...; at the end the block adds its warps'
// accumulators, in order, into partial [blockIdx.x, 2, cols], which
// layer_norm_bwd_wb_final adds over the blocks. The launcher keeps
// warps * 2 * cols within LN_SHARED. A lane takes 16-byte packs where it
// can (load_f), and owns each of its packs' columns; a pack's V columns are
// kept V planes apart (column c at (c % V) * cols / V + c / V), so the 32
// lanes' adds for one value of the pack fall on 32 different banks.
#define LN_SHARED 12288  // floats: 48 KiB, the most a block may declare
template <typename T, int V>
__device__ void layer_norm_bwd_v(const T* x, const T* w, const T* g, T* dx, float* partial,
                                 int cols, int rows, int per, float eps, float* acc) {
  const int lane = threadIdx.x, warp = threadIdx.y, warps = blockDim.y;
  float* dw = acc + (size_t)warp * 2 * cols;
  float* db = dw + cols;
  const int plane = cols / V;  // column i + j of a pack at i / V + j * plane
  for (int i = lane; i < cols; i += 32) {
    dw[i] = 0.f;
    db[i] = 0.f;
  }
  const int r1 = min(rows, (int)blockIdx.x * per + per);
  for (int row = blockIdx.x * per + warp; row < r1; row += warps) {
    const size_t off = (size_t)row * cols;
    const float2 mr = row_moments<T, V, true>(x + off, cols, eps);
    float a = 0.f, c = 0.f;
    for (int i = lane * V; i < cols; i += 32 * V) {
      float xv[V], gv[V], wv[V];
      load_f<T, V>(x + off + i, xv);
      load_f<T, V>(g + off + i, gv);
      load_f<T, V>(w + i, wv);
      for (int j = 0; j < V; j++) {
        const float gw = gv[j] * wv[j];
        a += gw;
        c += gw * (xv[j] - mr.x) * mr.y;
      }
    }
    a = warp_sum(a) / cols;
    c = warp_sum(c) / cols;
    for (int i = lane * V; i < cols; i += 32 * V) {
      float xv[V], gv[V], wv[V], out[V];
      load_f<T, V>(x + off + i, xv);
      load_f<T, V>(g + off + i, gv);
      load_f<T, V>(w + i, wv);
      for (int j = 0; j < V; j++) {
        const float xh = (xv[j] - mr.x) * mr.y;
        out[j] = mr.y * (gv[j] * wv[j] - a - xh * c);
        dw[i / V + j * plane] += gv[j] * xh;
        db[i / V + j * plane] += gv[j];
      }
      store_f<T, V>(dx + off + i, out);
    }
  }
  __syncthreads();
  for (int k = warp * 32 + lane; k < 2 * cols; k += 32 * warps) {
    const int half = k >= cols, c = k - half * cols;
    const int at = half * cols + c / V + (c % V) * plane;
    float s = 0.f;
    for (int v = 0; v < warps; v++) s += acc[(size_t)v * 2 * cols + at];
    partial[((size_t)blockIdx.x * 2) * cols + k] = s;
  }
}

template <typename T>
__device__ void layer_norm_bwd(const T* x, const T* w, const T* g, T* dx, float* partial,
                               int cols, int rows, int per, float eps) {
  // Declared here, once: each of the two paths declaring its own would
  // give the kernel both, twice the 48 KiB a block may declare.
  __shared__ float acc[LN_SHARED];
  constexpr int V = 16 / sizeof(T);
  if (cols % V == 0 && aligned16(x, w, g, dx))
    layer_norm_bwd_v<T, V>(x, w, g, dx, partial, cols, rows, per, eps, acc);
  else
    layer_norm_bwd_v<T, 1>(x, w, g, dx, partial, cols, rows, per, eps, acc);
}

// out [2, cols] = the partial sums added over chunks (sum_chunks).
template <typename T>
__device__ void layer_norm_bwd_wb_final(const float* partial, T* out, int chunks, int cols) {
  sum_chunks(partial, out, chunks, 2 * cols);
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
  extern "C" __global__ void layer_norm_bwd_##S(const T* x, const T* w, const T* g, T* dx,      \
                                             float* partial, int cols, int rows, int per,   \
                                             float eps) {                                   \
    layer_norm_bwd(x, w, g, dx, partial, cols, rows, per, eps);                             \
  }                                                                                         \
  extern "C" __global__ void layer_norm_bwd_wb_final_##S(const float* partial, T* out,      \
                                                         int chunks, int cols) {            \
    layer_norm_bwd_wb_final(partial, out, chunks, cols);                                    \
  }
FOR_FLOAT_TYPES(ROWS)
