// Runs adamw_mixed_bf16 of kernels/adamw.cu on the CPU (cuda_emu.hpp) for
// tests/emulated_kernels.rs.   adamw_main IN OUT
// IN: n (u64), scale (f32), kept (u32: 1 if the factor is read from memory,
// as on CUDA when clipping's factor stays on the device), the factor there
// (f32), the 8 floats of Hyper, then theta (f32 x n),
// g (bf16 bits, u16 x n), m and v (f32 x n). OUT: theta, m, v (f32 x n)
// and the working copy (bf16 bits, u16 x n).
#include "adamw.cu"

#include <cstdio>
#include <vector>

template <typename T> bool get(FILE* f, T* p, size_t n) { return fread(p, sizeof(T), n, f) == n; }
template <typename T> bool put(FILE* f, const T* p, size_t n) { return fwrite(p, sizeof(T), n, f) == n; }

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: adamw_main IN OUT\n");
    return 2;
  }
  FILE* in = fopen(argv[1], "rb");
  uint64_t n = 0;
  float scale = 0.f, at = 0.f;
  uint32_t kept = 0;
  Hyper h;
  if (!in || !get(in, &n, 1) || !get(in, &scale, 1) || !get(in, &kept, 1) || !get(in, &at, 1) ||
      !get(in, &h, 1))
    return 2;
  std::vector<float> theta(n), m(n), v(n);
  std::vector<__nv_bfloat16> g(n), work(n);
  if (!get(in, theta.data(), n) || !get(in, g.data(), n) || !get(in, m.data(), n) || !get(in, v.data(), n)) {
    fprintf(stderr, "adamw_main: %s is short\n", argv[1]);
    return 2;
  }
  fclose(in);
  // As src/kernels/cuda.rs's `elementwise` launches: 256 threads a block.
  const dim3 grid{(unsigned)((n + 255) / 256), 1, 1}, block{256, 1, 1};
  emu::launch(adamw_mixed_bf16, grid, block, theta.data(), g.data(), scale,
              kept ? (const float*)&at : (const float*)nullptr, m.data(), v.data(), work.data(),
              (size_t)n, h);
  FILE* out = fopen(argv[2], "wb");
  if (!out || !put(out, theta.data(), n) || !put(out, m.data(), n) || !put(out, v.data(), n) ||
      !put(out, work.data(), n))
    return 1;
  return fclose(out) == 0 ? 0 : 1;
}
