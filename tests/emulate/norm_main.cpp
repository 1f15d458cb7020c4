// Runs kernels/norm.cu on the CPU (cuda_emu.hpp) for tests/emulated_kernels.rs.
//   norm_main IN OUT    IN: n (u64), max_norm (f64), then n f32 values;
// OUT: the sum of their squares (f64), launched as src/kernels/norm.rs
// launches it, then clipping's factor for max_norm (f32).
#include "norm.cu"

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = fopen(argv[1], "rb");
  uint64_t n = 0;
  double max_norm = 0.0;
  if (!in || fread(&n, 8, 1, in) != 1 || fread(&max_norm, 8, 1, in) != 1) return 2;
  std::vector<float> x(n);
  if (fread(x.data(), 4, n, in) != n) return 2;
  fclose(in);
  const unsigned blocks = (unsigned)std::min<uint64_t>(std::max<uint64_t>((n + 255) / 256, 1), 1024);
  std::vector<double> part(blocks);
  double out = 0.0;
  emu::launch(sum_squares_part_f32, dim3{blocks, 1, 1}, dim3{256, 1, 1}, x.data(), (size_t)n, part.data());
  emu::launch(sum_squares_finish, dim3{1, 1, 1}, dim3{256, 1, 1}, part.data(), (int)blocks, &out);
  float factor = 0.f;
  emu::launch(clip_factor, dim3{1, 1, 1}, dim3{1, 1, 1}, (const double*)&out, max_norm, &factor);
  FILE* f = fopen(argv[2], "wb");
  if (!f || fwrite(&out, 8, 1, f) != 1 || fwrite(&factor, 4, 1, f) != 1) return 1;
  return fclose(f) == 0 ? 0 : 1;
}
