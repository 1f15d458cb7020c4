// Runs kernels/conv.cu on the CPU (cuda_emu.hpp) for
// tests/emulated_kernels.rs, launched as src/kernels/conv_cuda.rs launches
// it (256 threads a block), on a grid of at most 3 blocks so that the
// grid-stride loops go round.
//   conv_main IN OUT
// IN: u32 bf16 (1: bf16 storage, 0: f32), then B, C, H, W, k, p (u32);
// then f32 values, rounded to the storage type: x [B, C, H, W],
// col [B, C*k*k, Ho*Wo] (col2im's input) and dy [B, C, H/2, W/2] (the
// pool's output gradient). OUT (f32): im2col of x as [B, C*k*k, Ho*Wo],
// im2col of x as [C*k*k, B, Ho*Wo], col2im of col [B, C, H, W], the
// channel sums of x [C], swap01 of x as [C, B, H*W], the 2x2 max-pool of x
// [B, C, H/2, W/2] and its input gradient for dy [B, C, H, W].
#include "conv.cu"

#include <cstdio>
#include <vector>

template <typename T> bool get(FILE* f, T* p, size_t n) { return fread(p, sizeof(T), n, f) == n; }

static dim3 grid_for(size_t n) {
  return dim3{(unsigned)std::min<size_t>(std::max<size_t>((n + 255) / 256, 1), 3), 1, 1};
}

template <typename T> struct Conv {
  void (*im2col)(const T*, T*, size_t, int, Geom, size_t, size_t);
  void (*col2im)(const T*, T*, size_t, Geom);
  void (*channel_sum)(const T*, T*, int, int, int);
  void (*swap01)(const T*, T*, size_t, int, int, int);
  void (*pool_fwd)(const T*, T*, size_t, int, int);
  void (*pool_bwd)(const T*, const T*, T*, size_t, int, int);
};

template <typename T> std::vector<T> read(FILE* in, size_t n, bool* ok) {
  std::vector<float> f(n);
  *ok = *ok && get(in, f.data(), n);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; i++) v[i] = from_f<T>(f[i]);
  return v;
}

template <typename T> int run(FILE* in, FILE* out, const uint32_t* d, Conv<T> k) {
  const int b = d[0], c = d[1], h = d[2], w = d[3], kk = d[4], p = d[5];
  const Geom g{h, w, kk, p, h + 2 * p - kk + 1, w + 2 * p - kk + 1};
  if (g.ho <= 0 || g.wo <= 0) return 2;
  const size_t hw = (size_t)h * w, ohw = (size_t)g.ho * g.wo, taps = (size_t)c * kk * kk;
  const size_t pooled = (size_t)b * c * (h / 2) * (w / 2);
  bool ok = true;
  auto x = read<T>(in, b * c * hw, &ok);
  auto col = read<T>(in, b * taps * ohw, &ok);
  auto dy = read<T>(in, pooled, &ok);
  if (!ok) return 2;
  std::vector<float> all;
  auto put = [&](const std::vector<T>& v) {
    for (const T& e : v) all.push_back(to_f(e));
  };
  const dim3 threads{256, 1, 1};
  // im2col, a sample's rows together, then a row's samples together.
  size_t n = b * taps * ohw;
  std::vector<T> y(n);
  emu::launch(k.im2col, grid_for(n), threads, (const T*)x.data(), y.data(), n, c, g, taps * ohw,
              ohw);
  put(y);
  emu::launch(k.im2col, grid_for(n), threads, (const T*)x.data(), y.data(), n, c, g, ohw,
              b * ohw);
  put(y);
  n = b * c * hw;
  std::vector<T> dx(n);
  emu::launch(k.col2im, grid_for(n), threads, (const T*)col.data(), dx.data(), n, g);
  put(dx);
  std::vector<T> sums(c);
  emu::launch(k.channel_sum, dim3{(unsigned)c, 1, 1}, threads, (const T*)x.data(), sums.data(), b,
              c, (int)hw);
  put(sums);
  emu::launch(k.swap01, grid_for(n), threads, (const T*)x.data(), dx.data(), n, b, c, (int)hw);
  put(dx);
  std::vector<T> py(pooled);
  emu::launch(k.pool_fwd, grid_for(pooled), threads, (const T*)x.data(), py.data(), pooled, h, w);
  put(py);
  emu::launch(k.pool_bwd, grid_for(n), threads, (const T*)x.data(), (const T*)dy.data(),
              dx.data(), n, h, w);
  put(dx);
  return fwrite(all.data(), 4, all.size(), out) == all.size() ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: conv_main IN OUT\n");
    return 2;
  }
  FILE* in = fopen(argv[1], "rb");
  uint32_t d[7];
  if (!in || !get(in, d, 7)) return 2;
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 1;
  const int rc =
      d[0] ? run<__nv_bfloat16>(in, out, d + 1,
                                {im2col_bf16, col2im_bf16, channel_sum_bf16, swap01_bf16,
                                 max_pool_fwd_bf16, max_pool_bwd_bf16})
           : run<float>(in, out, d + 1,
                        {im2col_f32, col2im_f32, channel_sum_f32, swap01_f32, max_pool_fwd_f32,
                         max_pool_bwd_f32});
  fclose(in);
  return fclose(out) == 0 ? rc : 1;
}
