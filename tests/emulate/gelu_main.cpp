// Runs kernels/gelu.cu and kernels/add.cu on the CPU (cuda_emu.hpp) for
// tests/emulated_kernels.rs, launched as src/kernels/cuda.rs's map1 and
// map2 launch them (a thread per 8 values, 256 a block).
//   gelu_main IN OUT
// IN: bf16 (u32: 1 for bf16 storage, 0 for f32), n (u32), shift (u32: the
// values start this many elements past an aligned buffer), then x and g
// (f32 x n each, rounded to the storage type). OUT: gelu(x), then
// g * gelu'(x), then x + g (f32 x n each).
#include "add.cu"
#include "gelu.cu"

#include <cstdio>
#include <vector>

template <typename T> bool get(FILE* f, T* p, size_t n) { return fread(p, sizeof(T), n, f) == n; }

template <typename T>
int run(FILE* in, FILE* out, uint32_t n, uint32_t shift, void (*fwd)(const T*, T*, size_t),
        void (*bwd)(const T*, const T*, T*, size_t), void (*sum)(const T*, const T*, T*, size_t)) {
  std::vector<float> xf(n), gf(n);
  if (!get(in, xf.data(), n) || !get(in, gf.data(), n)) return 2;
  // 16-byte aligned buffers, the values `shift` elements in.
  struct alignas(16) Chunk {
    unsigned char b[16];
  };
  const size_t chunks = ((n + shift) * sizeof(T) + 15) / 16;
  std::vector<Chunk> bx(chunks), bg(chunks), by(chunks), bd(chunks), bs(chunks);
  T* x = reinterpret_cast<T*>(bx.data()) + shift;
  T* g = reinterpret_cast<T*>(bg.data()) + shift;
  T* y = reinterpret_cast<T*>(by.data()) + shift;
  T* d = reinterpret_cast<T*>(bd.data()) + shift;
  T* s = reinterpret_cast<T*>(bs.data()) + shift;
  for (uint32_t i = 0; i < n; i++) {
    x[i] = from_f<T>(xf[i]);
    g[i] = from_f<T>(gf[i]);
  }
  const unsigned blocks = std::max(1u, (unsigned)(((n + 7) / 8 + 255) / 256));
  emu::launch(fwd, dim3{blocks, 1, 1}, dim3{256, 1, 1}, (const T*)x, y, (size_t)n);
  emu::launch(bwd, dim3{blocks, 1, 1}, dim3{256, 1, 1}, (const T*)x, (const T*)g, d, (size_t)n);
  emu::launch(sum, dim3{blocks, 1, 1}, dim3{256, 1, 1}, (const T*)x, (const T*)g, s, (size_t)n);
  std::vector<float> all;
  for (uint32_t i = 0; i < n; i++) all.push_back(to_f(y[i]));
  for (uint32_t i = 0; i < n; i++) all.push_back(to_f(d[i]));
  for (uint32_t i = 0; i < n; i++) all.push_back(to_f(s[i]));
  return fwrite(all.data(), 4, all.size(), out) == all.size() ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: gelu_main IN OUT\n");
    return 2;
  }
  FILE* in = fopen(argv[1], "rb");
  uint32_t h[3];
  if (!in || !get(in, h, 3)) return 2;
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 1;
  const int rc = h[0] ? run<__nv_bfloat16>(in, out, h[1], h[2], gelu_fwd_bf16, gelu_bwd_bf16,
                                           add_bf16)
                      : run<float>(in, out, h[1], h[2], gelu_fwd_f32, gelu_bwd_f32, add_f32);
  fclose(in);
  return fclose(out) == 0 ? rc : 1;
}
