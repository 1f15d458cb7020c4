// The CNN's convolution (a k x k kernel, p zeros on each side, stride 1)
// and 2x2 max-pool on CUDA (src/kernels/conv_cuda.rs; src/kernels/conv.rs
// and conv_cpu.rs are the CPU reference). The convolution's products are
// cuBLAS's; these are the element work around them: im2col and its
// adjoint, the bias planes, the bias gradient. Every index is a thread's
// own output, so no atomics and no zero-fill.
#include "common.cuh"

// The convolution's geometry: input planes h x w, a k x k kernel, p zeros
// on each side, output planes ho x wo (h + 2p - k + 1 by w + 2p - k + 1).
struct Geom {
  int h, w, k, p, ho, wo;
};

// im2col of x [B, C, H, W] (zeros outside the image): a thread per value
// (n of them), sample b's row (c*k*k + ky*k + kx) at b*sb + row*sr, so the
// products read it as [B, C*k*k, Ho*Wo] (sb = C*k*k*Ho*Wo, sr = Ho*Wo) or
// [C*k*k, B, Ho*Wo] (sb = Ho*Wo, sr = B*Ho*Wo). Column oy*Wo + ox of a row
// reads x[b, c, oy + ky - p, ox + kx - p].
template <typename T>
__device__ void im2col(const T* x, T* col, size_t n, int c, Geom g, size_t sb, size_t sr) {
  const size_t hw = (size_t)g.h * g.w, ohw = (size_t)g.ho * g.wo;
  const int kk = g.k * g.k;
  FOR_EACH(i, n) {
    const size_t q = i % ohw, r = i / ohw;
    const int t = (int)(r % kk);
    const size_t plane = r / kk, b = plane / c, row = r - b * c * kk;
    const int y = (int)(q / g.wo) + t / g.k - g.p, xx = (int)(q % g.wo) + t % g.k - g.p;
    col[b * sb + row * sr + q] = (y >= 0 && y < g.h && xx >= 0 && xx < g.w)
                                     ? x[plane * hw + (size_t)y * g.w + xx]
                                     : from_f<T>(0.f);
  }
}

// dst [D1, D0, inner] = src [D0, D1, inner] (the output gradient as
// [O, B, Ho*Wo] for the weight gradient's one product).
template <typename T> __device__ void swap01(const T* src, T* dst, size_t n, int d0, int d1, int inner) {
  FOR_EACH(i, n) {
    const size_t p = i % inner, r = i / inner;
    const size_t a = r / d1, b = r % d1;
    dst[(b * d0 + a) * inner + p] = src[i];
  }
}

// dx [B, C, H, W] = im2col's adjoint of col [B, C*k*k, Ho*Wo]: each input
// value gathers the (up to) k*k columns that read it, summed in f32 in
// the order of (ky, kx).
template <typename T> __device__ void col2im(const T* col, T* dx, size_t n, Geom g) {
  const size_t hw = (size_t)g.h * g.w, ohw = (size_t)g.ho * g.wo;
  const size_t kk = (size_t)g.k * g.k;
  FOR_EACH(i, n) {
    const size_t q = i % hw, plane = i / hw;
    const int y = (int)(q / g.w), xx = (int)(q % g.w);
    float s = 0.f;
    for (int ky = 0; ky < g.k; ky++) {
      const int oy = y - ky + g.p;
      if (oy < 0 || oy >= g.ho) continue;
      for (int kx = 0; kx < g.k; kx++) {
        const int ox = xx - kx + g.p;
        if (ox < 0 || ox >= g.wo) continue;
        s += to_f(col[(plane * kk + ky * g.k + kx) * ohw + (size_t)oy * g.wo + ox]);
      }
    }
    dx[i] = from_f<T>(s);
  }
}

// y [B, O, Ho*Wo] = b[o] on every plane: what the forward product adds onto.
template <typename T> __device__ void bias_planes(const T* b, T* y, size_t n, int o, int hw) {
  FOR_EACH(i, n) y[i] = b[(i / hw) % o];
}

// db [O] = the sum of dy [B, O, Ho*Wo] over batch and plane: a block per
// channel, accumulated in f32.
template <typename T> __device__ void channel_sum(const T* dy, T* db, int b, int o, int hw) {
  const int c = blockIdx.x;
  float s = 0.f;
  for (int bi = 0; bi < b; bi++) {
    const T* plane = dy + ((size_t)bi * o + c) * hw;
    for (int p = threadIdx.x; p < hw; p += blockDim.x) s += to_f(plane[p]);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) db[c] = from_f<T>(s);
}

// The maximum of the window at `a` (rows a[0..2] and a[w..w+2]) and its
// place 0..3: the first of equal maxima row by row, a leading NaN kept,
// as window_max in src/kernels/conv.rs.
template <typename T> __device__ __forceinline__ int window_arg(const T* a, int w, float* m) {
  float best = to_f(a[0]);
  int k = 0;
  const float v[3] = {to_f(a[1]), to_f(a[w]), to_f(a[w + 1])};
  for (int j = 0; j < 3; j++) {
    if (v[j] > best) {
      best = v[j];
      k = j + 1;
    }
  }
  *m = best;
  return k;
}

// y [P, H/2, W/2] from x [P, H, W]: a thread per output.
template <typename T> __device__ void max_pool_fwd(const T* x, T* y, size_t n, int h, int w) {
  const int h2 = h / 2, w2 = w / 2;
  FOR_EACH(i, n) {
    const int j = (int)(i % w2);
    const size_t r = i / w2;
    const int io = (int)(r % h2);
    const size_t plane = r / h2;
    float m;
    window_arg(x + plane * h * w + (size_t)2 * io * w + 2 * j, w, &m);
    y[i] = from_f<T>(m);
  }
}

// dx [P, H, W]: each input value takes its window's gradient if it is the
// window's maximum, else 0 (and 0 in an odd last row or column).
template <typename T>
__device__ void max_pool_bwd(const T* x, const T* dy, T* dx, size_t n, int h, int w) {
  const int h2 = h / 2, w2 = w / 2;
  FOR_EACH(i, n) {
    const int xx = (int)(i % w);
    const size_t r = i / w;
    const int y = (int)(r % h);
    const size_t plane = r / h;
    const int io = y / 2, j = xx / 2;
    float g = 0.f;
    if (io < h2 && j < w2) {
      float m;
      const int k = window_arg(x + plane * h * w + (size_t)2 * io * w + 2 * j, w, &m);
      if (k == (y % 2) * 2 + xx % 2) g = to_f(dy[(plane * h2 + io) * w2 + j]);
    }
    dx[i] = from_f<T>(g);
  }
}

#define CONV(T, S)                                                                           \
  extern "C" __global__ void im2col_##S(const T* x, T* col, size_t n, int c, Geom g,         \
                                        size_t sb, size_t sr) {                              \
    im2col(x, col, n, c, g, sb, sr);                                                         \
  }                                                                                          \
  extern "C" __global__ void swap01_##S(const T* src, T* dst, size_t n, int d0, int d1,      \
                                        int inner) {                                         \
    swap01(src, dst, n, d0, d1, inner);                                                      \
  }                                                                                          \
  extern "C" __global__ void col2im_##S(const T* col, T* dx, size_t n, Geom g) {             \
    col2im(col, dx, n, g);                                                                   \
  }                                                                                          \
  extern "C" __global__ void bias_planes_##S(const T* b, T* y, size_t n, int o, int hw) {    \
    bias_planes(b, y, n, o, hw);                                                             \
  }                                                                                          \
  extern "C" __global__ void channel_sum_##S(const T* dy, T* db, int b, int o, int hw) {     \
    channel_sum(dy, db, b, o, hw);                                                           \
  }                                                                                          \
  extern "C" __global__ void max_pool_fwd_##S(const T* x, T* y, size_t n, int h, int w) {    \
    max_pool_fwd(x, y, n, h, w);                                                             \
  }                                                                                          \
  extern "C" __global__ void max_pool_bwd_##S(const T* x, const T* dy, T* dx, size_t n,      \
                                              int h, int w) {                                \
    max_pool_bwd(x, dy, dx, n, h, w);                                                        \
  }
FOR_FLOAT_TYPES(CONV)
