// Runs CUDA C++ kernels on the CPU, for tests on machines without a GPU
// (tests/emulated_kernels.rs). Force-included ahead of a kernel file, with
// include/ ahead on the include path for the CUDA headers it replaces.
//
// Each block runs alone, on one OS thread per CUDA thread, so `__shared__`
// (a function-local static here) is shared by the block's threads as on a
// GPU. __syncthreads is a barrier over the block, __syncwarp and the
// shuffles a barrier over the warp. The tensor-core product
// (kernels/mma.cuh) has its own f32 stand-in there, on the documented
// register layout, so a fragment loaded from the wrong place fails here too.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

// 16-byte aligned, as CUDA's: the tests build with UBSan's alignment
// check, so a kernel that reads a pack from an address that is not fails.
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {
struct Block {
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  // Per-warp exchange slots for the shuffles.
  std::vector<uint64_t> slots;
};
inline Block* block = nullptr;

inline unsigned lane_id() { return threadIdx.x % 32; }
inline unsigned warp_id() { return (threadIdx.x + blockDim.x * threadIdx.y) / 32; }

template <typename T> T shuffle(T v, unsigned from) {
  static_assert(sizeof(T) <= 8);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  uint64_t* slot = &block->slots[warp_id() * 32];
  slot[lane_id()] = bits;
  block->warps[warp_id()]->arrive_and_wait();
  bits = slot[from];
  block->warps[warp_id()]->arrive_and_wait();
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

// Runs `kernel(args...)` over `grid` blocks of `threads` threads (a
// multiple of 32), one block after another, on one OS thread per CUDA
// thread that goes from block to block. A thread that returns leaves its
// block's barriers, as an exited thread stops counting on a GPU.
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 threads, A... args) {
  gridDim = grid;
  blockDim = threads;
  const unsigned n = threads.x * threads.y * threads.z;
  const unsigned blocks = grid.x * grid.y * grid.z;
  std::barrier<> gate(n + 1);  // the workers and this thread, twice a block
  Block b;
  dim3 at;
  std::vector<std::thread> ts;
  for (unsigned i = 0; i < n; i++)
    ts.emplace_back([&, i] {
      threadIdx = {i % threads.x, i / threads.x % threads.y, i / (threads.x * threads.y)};
      for (unsigned k = 0; k < blocks; k++) {
        gate.arrive_and_wait();  // the block is set up
        blockIdx = at;
        kernel(P(args)...);
        b.all->arrive_and_drop();
        b.warps[i / 32]->arrive_and_drop();
        gate.arrive_and_wait();  // every thread is done with it
      }
    });
  for (unsigned k = 0; k < blocks; k++) {
    at = {k % grid.x, k / grid.x % grid.y, k / (grid.x * grid.y)};
    b.all = std::make_unique<std::barrier<>>(n);
    b.warps.clear();
    // A last, partial warp when the block is not a multiple of 32 threads.
    for (unsigned w = 0; w < (n + 31) / 32; w++)
      b.warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - 32 * w)));
    b.slots.assign(n, 0);
    block = &b;
    gate.arrive_and_wait();
    gate.arrive_and_wait();
  }
  for (auto& t : ts) t.join();
}
}  // namespace emu

inline void __syncthreads() { emu::block->all->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::block->warps[emu::warp_id()]->arrive_and_wait(); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int mask) {
  return emu::shuffle(v, emu::lane_id() ^ mask);
}
template <typename T> T __shfl_sync(unsigned, T v, int from) { return emu::shuffle(v, from % 32); }
using std::max;
using std::min;
