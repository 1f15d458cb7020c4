// Runs adamw_mixed_bf16 of kernels/adamw.cu on the CPU (cuda_emu.hpp) for
// tests/emulated_kernels.rs.   adamw_main IN OUT [misaligned]
// IN: n (u64), scale (f32), kept (u32: 1 if the factor is read from memory,
// as on CUDA when clipping's factor stays on the device), the factor there
// (f32), the 8 floats of Hyper, then theta (f32 x n),
// g (bf16 bits, u16 x n), m and v (f32 x n). OUT: theta, m, v (f32 x n)
// and the working copy (bf16 bits, u16 x n). `misaligned` places every
// array one value past an aligned address, where the kernel takes a value
// at a time.
#include "adamw.cu"

#include <cstdio>
#include <vector>

template <typename T> bool get(FILE* f, T* p, size_t n) { return fread(p, sizeof(T), n, f) == n; }
template <typename T> bool put(FILE* f, const T* p, size_t n) { return fwrite(p, sizeof(T), n, f) == n; }

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    fprintf(stderr, "usage: adamw_main IN OUT [misaligned]\n");
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
  const size_t shift = argc == 4 ? 1 : 0;
  std::vector<float> theta_b(n + 1), m_b(n + 1), v_b(n + 1);
  std::vector<__nv_bfloat16> g_b(n + 1), work_b(n + 1);
  float *theta = theta_b.data() + shift, *m = m_b.data() + shift, *v = v_b.data() + shift;
  __nv_bfloat16 *g = g_b.data() + shift, *work = work_b.data() + shift;
  if (!get(in, theta, n) || !get(in, g, n) || !get(in, m, n) || !get(in, v, n)) {
    fprintf(stderr, "adamw_main: %s is short\n", argv[1]);
    return 2;
  }
  fclose(in);
  // As src/kernels/adamw_mixed.rs launches: 256 threads a block, a thread
  // per four values.
  const dim3 grid{(unsigned)(((n + 3) / 4 + 255) / 256), 1, 1}, block{256, 1, 1};
  emu::launch(adamw_mixed_bf16, grid, block, theta, (const __nv_bfloat16*)g, scale,
              kept ? (const float*)&at : (const float*)nullptr, m, v, work, (size_t)n, h);
  FILE* out = fopen(argv[2], "wb");
  if (!out || !put(out, theta, n) || !put(out, m, n) || !put(out, v, n) || !put(out, work, n))
    return 1;
  return fclose(out) == 0 ? 0 : 1;
}
