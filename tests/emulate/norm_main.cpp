// Runs kernels/norm.cu on the CPU (cuda_emu.hpp) for tests/emulated_kernels.rs.
//   norm_main IN OUT
// IN: the number of tensors (u64), max_norm (f64), then for each tensor n
// (u64) and n f32 values. OUT: the sum of all their squares (f64),
// launched as src/kernels/norm.rs's sum_squares_all launches it (each
// tensor's partial sums into its part of one buffer, then one block of
// 1024 threads sums the buffer), then clipping's factor for max_norm (f32).
#include "norm.cu"

#include <cstdio>
#include <vector>

static unsigned blocks_for(uint64_t n) {
  return (unsigned)std::min<uint64_t>(std::max<uint64_t>((n + 255) / 256, 1), 1024);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = fopen(argv[1], "rb");
  uint64_t count = 0;
  double max_norm = 0.0;
  if (!in || fread(&count, 8, 1, in) != 1 || fread(&max_norm, 8, 1, in) != 1) return 2;
  std::vector<std::vector<float>> xs(count);
  size_t total = 0;
  for (auto& x : xs) {
    uint64_t n = 0;
    if (fread(&n, 8, 1, in) != 1) return 2;
    x.resize(n);
    if (fread(x.data(), 4, n, in) != n) return 2;
    total += blocks_for(n);
  }
  fclose(in);
  std::vector<double> part(total);
  size_t at = 0;
  for (auto& x : xs) {
    const unsigned blocks = blocks_for(x.size());
    emu::launch(sum_squares_part_f32, dim3{blocks, 1, 1}, dim3{256, 1, 1}, x.data(), x.size(),
                part.data() + at);
    at += blocks;
  }
  double out = 0.0;
  emu::launch(sum_squares_finish, dim3{1, 1, 1}, dim3{1024, 1, 1}, part.data(), (int)total, &out);
  float factor = 0.f;
  emu::launch(clip_factor, dim3{1, 1, 1}, dim3{1, 1, 1}, (const double*)&out, max_norm, &factor);
  FILE* f = fopen(argv[2], "wb");
  if (!f || fwrite(&out, 8, 1, f) != 1 || fwrite(&factor, 4, 1, f) != 1) return 1;
  return fclose(f) == 0 ? 0 : 1;
}
