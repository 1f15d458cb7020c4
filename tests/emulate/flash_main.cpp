// Runs kernels/flash.cu on the CPU (cuda_emu.hpp) for tests/emulated_kernels.rs.
//   flash_main B T HEADS HD DTYPE IN OUT [misaligned] [r32]
// IN holds qkv [B, T, 3C] then dy [B, T, C] as little-endian f32, C = HEADS
// x HD; DTYPE is bf16 or f16 (inputs are rounded to it). OUT gets y, the
// log-sum-exp [B x HEADS, T] and dqkv, as f32. `misaligned` puts qkv and dy
// one value past a 16-byte boundary, for the kernels' one-value loads;
// `r32` runs the kernels whose warps own 32 rows (2 warps a block) instead
// of 16 (4 warps).
#include "flash.cu"

#include <cstdio>
#include <cstdlib>
#include <string>

template <typename T> using Fwd = void (*)(const T*, T*, float*, int, int, float);
template <typename T>
using Dq = void (*)(const T*, const T*, const T*, const float*, float*, T*, int, int, float);
template <typename T> using Dkv = void (*)(const T*, const T*, const float*, const float*, T*, int, int, float);

template <typename T> struct Kernels {
  Fwd<T> fwd;
  Dq<T> dq;
  Dkv<T> dkv;
};

#define PICK(S, HD)                                                                         \
  if (hd == HD && !r32)                                                                     \
    return {flash_forward_##S##_##HD, flash_backward_dq_##S##_##HD, flash_backward_dkv_##S##_##HD}; \
  if (hd == HD && r32)                                                                      \
    return {flash_forward_##S##_##HD##_r32, flash_backward_dq_##S##_##HD##_r32,             \
            flash_backward_dkv_##S##_##HD##_r32};
Kernels<__nv_bfloat16> pick(int hd, bool r32, __nv_bfloat16) {
  PICK(bf16, 16) PICK(bf16, 32) PICK(bf16, 64);
  std::abort();
}
Kernels<__half> pick(int hd, bool r32, __half) {
  PICK(f16, 16) PICK(f16, 32) PICK(f16, 64);
  std::abort();
}

template <typename T>
int run(int b, int t, int heads, int hd, const std::vector<float>& in, bool misaligned, bool r32,
        FILE* out) {
  const size_t c = (size_t)heads * hd, n3 = b * t * 3 * c, n = b * t * c, rows = (size_t)b * heads * t;
  std::vector<T> qkv_at(n3 + 1), dy_at(n + 1), y(n), dqkv(n3);
  T* qkv = qkv_at.data() + misaligned;
  T* dy = dy_at.data() + misaligned;
  for (size_t i = 0; i < n3; i++) qkv[i] = from_f<T>(in[i]);
  for (size_t i = 0; i < n; i++) dy[i] = from_f<T>(in[n3 + i]);
  std::vector<float> lse(rows), delta(rows);
  const Kernels<T> k = pick(hd, r32, T{});
  const float scale = 1.f / std::sqrt((float)hd);
  const dim3 grid{(unsigned)((t + ROWS - 1) / ROWS), (unsigned)(b * heads), 1};
  const dim3 block{r32 ? 64u : 128u, 1, 1};
  emu::launch(k.fwd, grid, block, qkv, y.data(), lse.data(), t, heads, scale);
  emu::launch(k.dq, grid, block, qkv, y.data(), dy, lse.data(), delta.data(), dqkv.data(), t,
              heads, scale);
  emu::launch(k.dkv, grid, block, qkv, dy, lse.data(), delta.data(), dqkv.data(), t, heads,
              scale);
  std::vector<float> all;
  for (auto v : y) all.push_back(to_f(v));
  all.insert(all.end(), lse.begin(), lse.end());
  for (auto v : dqkv) all.push_back(to_f(v));
  return fwrite(all.data(), 4, all.size(), out) == all.size() ? 0 : 1;
}

int main(int argc, char** argv) {
  bool misaligned = false, r32 = false;
  for (int i = 8; i < argc; i++) {
    const std::string flag = argv[i];
    misaligned |= flag == "misaligned";
    r32 |= flag == "r32";
    if (flag != "misaligned" && flag != "r32") argc = 0;
  }
  if (argc < 8) {
    fprintf(stderr, "usage: flash_main B T HEADS HD bf16|f16 IN OUT [misaligned] [r32]\n");
    return 2;
  }
  const int b = atoi(argv[1]), t = atoi(argv[2]), heads = atoi(argv[3]), hd = atoi(argv[4]);
  const std::string dtype = argv[5];
  const size_t count = (size_t)b * t * heads * hd * 4;
  std::vector<float> in(count);
  FILE* f = fopen(argv[6], "rb");
  if (!f || fread(in.data(), 4, count, f) != count) {
    fprintf(stderr, "flash_main: %s does not hold %zu f32 values\n", argv[6], count);
    return 2;
  }
  fclose(f);
  FILE* out = fopen(argv[7], "wb");
  if (!out) return 2;
  const int rc = dtype == "f16" ? run<__half>(b, t, heads, hd, in, misaligned, r32, out)
                              : run<__nv_bfloat16>(b, t, heads, hd, in, misaligned, r32, out);
  return fclose(out) == 0 ? rc : 1;
}
