// Runs the embedding lookup's gradient (kernels/embedding.cu) and the
// rotary position embedding (kernels/rope.cu), forward and back, on the CPU
// (cuda_emu.hpp) for tests/emulated_kernels.rs, launched as
// src/kernels/embedding.rs and rope.rs launch them (256-thread blocks over
// the elements; here at most 3 blocks, so the grid-stride loops go round).
//   lookup_main IN OUT
// IN: bf16 (u32: 1 for bf16 storage, 0 for f32), n, d, vocab, bh, t, half
// (u32), then g (f32 x n*d), ids (u32 x n), x (f32 x bh*t*2*half), cos and
// sin (f32 x t*half), g and x rounded to the storage type.
// OUT: the table's gradient (vocab*d), rope(x) and rope back (sign -1) of
// that (bh*t*2*half each), as f32.
#include "embedding.cu"
#include "rope.cu"

#include <cstdio>
#include <vector>

template <typename T> bool get(FILE* f, T* p, size_t n) { return fread(p, sizeof(T), n, f) == n; }

static dim3 grid_for(size_t n) { return dim3{(unsigned)std::min<size_t>((n + 255) / 256, 3), 1, 1}; }

template <typename T>
int run(FILE* in, FILE* out, const uint32_t* h, void (*add)(const T*, const uint32_t*, float*, size_t, int, uint32_t),
        void (*round)(const float*, T*, size_t),
        void (*rope)(const T*, const float*, const float*, T*, size_t, int, int, float)) {
  const size_t n = h[1], d = h[2], vocab = h[3], bh = h[4], t = h[5], half = h[6];
  const size_t nx = bh * t * 2 * half;
  std::vector<float> gf(n * d), xf(nx), cos(t * half), sin(t * half);
  std::vector<uint32_t> ids(n);
  if (!get(in, gf.data(), gf.size()) || !get(in, ids.data(), n) || !get(in, xf.data(), nx) ||
      !get(in, cos.data(), cos.size()) || !get(in, sin.data(), sin.size()))
    return 2;
  std::vector<T> g(n * d), x(nx), y(nx), back(nx), table(vocab * d);
  for (size_t i = 0; i < g.size(); i++) g[i] = from_f<T>(gf[i]);
  for (size_t i = 0; i < nx; i++) x[i] = from_f<T>(xf[i]);
  std::vector<float> acc(vocab * d, 0.f);
  const dim3 threads{256, 1, 1};
  emu::launch(add, grid_for(n * d), threads, (const T*)g.data(), (const uint32_t*)ids.data(),
              acc.data(), n, (int)d, (uint32_t)vocab);
  emu::launch(round, grid_for(vocab * d), threads, (const float*)acc.data(), table.data(),
              vocab * d);
  const size_t pairs = nx / 2;
  emu::launch(rope, grid_for(pairs), threads, (const T*)x.data(), (const float*)cos.data(),
              (const float*)sin.data(), y.data(), pairs, (int)t, (int)half, 1.f);
  emu::launch(rope, grid_for(pairs), threads, (const T*)y.data(), (const float*)cos.data(),
              (const float*)sin.data(), back.data(), pairs, (int)t, (int)half, -1.f);
  std::vector<float> all;
  for (const auto* v : {&table, &y, &back})
    for (auto e : *v) all.push_back(to_f(e));
  return fwrite(all.data(), 4, all.size(), out) == all.size() ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: lookup_main IN OUT\n");
    return 2;
  }
  FILE* in = fopen(argv[1], "rb");
  uint32_t h[7];
  if (!in || !get(in, h, 7)) return 2;
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 1;
  const int rc = h[0] ? run<__nv_bfloat16>(in, out, h, embedding_grad_add_bf16,
                                           embedding_grad_round_bf16, rope_i_bf16)
                      : run<float>(in, out, h, embedding_grad_add_f32, embedding_grad_round_f32,
                                   rope_i_f32);
  fclose(in);
  return fclose(out) == 0 ? rc : 1;
}
