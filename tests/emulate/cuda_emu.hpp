// Runs CUDA C++ kernels on the CPU, for tests on machines without a GPU
// (tests/emulated_kernels.rs). Force-included ahead of a kernel file, with
// include/ ahead on the include path for the CUDA headers it replaces.
//
// A block's threads are fibers on the calling OS thread, one
// block after another, so `__shared__` (a function-local static here) is
// shared by the block's threads as on a GPU. A fiber runs until it waits at
// a barrier: __syncthreads is one over the block, __syncwarp and the
// shuffles one over the warp. The scheduler runs one warp at a time as far
// as it can go (to the block's next barrier), the warps in order and then
// in reverse, so a warp that writes shared memory another still reads, or
// reads what another has not yet written, for want of a __syncthreads, does
// it here. (It was a
// thread per CUDA thread: std::barrier's spinning across hundreds of OS
// threads on two cores made the flash tests take minutes.) A block in which
// no fiber can go on (a barrier that some live thread never reaches) is
// reported, not hung on. The tensor-core product (kernels/mma.cuh) has its
// own f32 stand-in there, on the documented register layout, so a fragment
// loaded from the wrong place fails here too.
#pragma once
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
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
// threadIdx is the running fiber's: the scheduler sets it at each switch.
inline dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {
// A barrier over `expected` threads: the last to arrive starts the next
// phase, which lets the others go on.
struct Barrier {
  unsigned expected = 0, arrived = 0;
  uint64_t phase = 0;
};

// Room for a kernel's register arrays and UBSan's frames, below a guard page
// (an overflow faults instead of writing over the next fiber's stack).
constexpr size_t STACK = 256 << 10, GUARD = 4096;

// A saved execution context and the switch between two. On x86-64, the
// callee-saved registers pushed on the fiber's own stack and its stack
// pointer kept (a switch is a few instructions); elsewhere ucontext's
// swapcontext, which also saves the signal mask (two system calls a switch).
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");
struct Context {
  void* sp = nullptr;
};
inline void swap(Context& from, Context& to) { emu_switch(&from.sp, to.sp); }
// `to` starts `entry` (which never returns) on the stack [base, base + size):
// the first switch pops six zeroed registers and returns into it, with the
// stack aligned as at a call.
inline void start(Context& to, char* base, size_t size, void (*entry)()) {
  auto* top = reinterpret_cast<uintptr_t*>(reinterpret_cast<uintptr_t>(base + size) & ~uintptr_t{15});
  *--top = 0;  // entry's return address: never used
  *--top = reinterpret_cast<uintptr_t>(entry);
  for (int i = 0; i < 6; i++) *--top = 0;
  to.sp = top;
}
#else
struct Context {
  ucontext_t uc;
};
inline void swap(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
inline void start(Context& to, char* base, size_t size, void (*entry)()) {
  getcontext(&to.uc);
  to.uc.uc_stack.ss_sp = base;
  to.uc.uc_stack.ss_size = size;
  to.uc.uc_link = nullptr;
  makecontext(&to.uc, entry, 0);
}
#endif

struct Fiber {
  Context ctx;
  char* stack = nullptr;  // GUARD + STACK bytes, mapped on first use
  dim3 idx;
  bool done = false;
};

struct Block {
  Barrier all;
  std::vector<Barrier> warps;
  // Per-warp exchange slots for the shuffles.
  std::vector<uint64_t> slots;
  std::vector<Fiber> fibers;
  Context scheduler;
  Fiber* current = nullptr;
  std::function<void()> body;  // the kernel, with its arguments
  uint64_t progress = 0;       // arrivals and exits, to tell a stuck block
};
inline Block* block = nullptr;

inline unsigned lane_id() { return threadIdx.x % 32; }
inline unsigned warp_id() { return (threadIdx.x + blockDim.x * threadIdx.y) / 32; }

// State that an emulated intrinsic keeps for the running thread between
// calls (kernels/cp_async.cuh's queued copies), as thread_local would with
// an OS thread per CUDA thread: one T for each thread of a block.
template <typename T> T& fiber_local() {
  static std::vector<std::unique_ptr<T>> slots;
  const size_t i = block->current - block->fibers.data();
  if (slots.size() <= i) slots.resize(i + 1);
  if (!slots[i]) slots[i] = std::make_unique<T>();
  return *slots[i];
}

// Back to the scheduler; the fiber resumes here on a later pass.
inline void yield() { swap(block->current->ctx, block->scheduler); }

inline void wait(Barrier& b) {
  const uint64_t phase = b.phase;
  block->progress++;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    b.phase++;
    return;
  }
  while (b.phase == phase) yield();
}

// An exited thread stops counting, as on a GPU: if every thread still
// counted has arrived, the phase ends.
inline void drop(Barrier& b) {
  b.expected--;
  if (b.arrived > 0 && b.arrived == b.expected) {
    b.arrived = 0;
    b.phase++;
  }
}

template <typename T> T shuffle(T v, unsigned from) {
  static_assert(sizeof(T) <= 8);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  uint64_t* slot = &block->slots[warp_id() * 32];
  slot[lane_id()] = bits;
  wait(block->warps[warp_id()]);
  bits = slot[from];
  wait(block->warps[warp_id()]);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

inline void fiber_main() {
  block->body();
  Fiber* f = block->current;
  f->done = true;
  block->progress++;
  drop(block->all);
  drop(block->warps[warp_id()]);
  swap(f->ctx, block->scheduler);  // never resumed
}

// Runs `kernel(args...)` over `grid` blocks of `threads` threads, one block
// after another, each block's threads as fibers (see the top of this file).
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 threads, A... args) {
  gridDim = grid;
  blockDim = threads;
  const unsigned n = threads.x * threads.y * threads.z;
  const unsigned blocks = grid.x * grid.y * grid.z;
  Block b;
  b.body = [&] { kernel(P(args)...); };
  b.fibers.resize(n);
  for (auto& f : b.fibers) {
    void* m = mmap(nullptr, GUARD + STACK, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED || mprotect(m, GUARD, PROT_NONE) != 0) {
      perror("cuda_emu: a fiber's stack");
      abort();
    }
    f.stack = static_cast<char*>(m);
  }
  block = &b;
  for (unsigned k = 0; k < blocks; k++) {
    blockIdx = {k % grid.x, k / grid.x % grid.y, k / (grid.x * grid.y)};
    b.all = {n, 0, 0};
    b.warps.clear();
    // A last, partial warp when the block is not a multiple of 32 threads.
    for (unsigned w = 0; w < (n + 31) / 32; w++) b.warps.push_back({std::min(32u, n - 32 * w), 0, 0});
    b.slots.assign(n, 0);
    for (unsigned i = 0; i < n; i++) {
      Fiber& f = b.fibers[i];
      f.idx = {i % threads.x, i / threads.x % threads.y, i / (threads.x * threads.y)};
      f.done = false;
      start(f.ctx, f.stack + GUARD, STACK, fiber_main);
    }
    // Round after round over the warps, first to last and then last to
    // first: each warp runs on (its lanes in turn, in the round's order)
    // until every lane waits at the block's barrier or has exited, before
    // the next warp starts.
    const unsigned warps = (n + 31) / 32;
    unsigned left = n;
    for (bool forward = true; left > 0; forward = !forward) {
      const uint64_t round = b.progress;
      for (unsigned wi = 0; wi < warps; wi++) {
        const unsigned w = forward ? wi : warps - 1 - wi;
        const unsigned lanes = std::min(32u, n - 32 * w);
        uint64_t before;
        do {
          before = b.progress;
          for (unsigned li = 0; li < lanes; li++) {
            Fiber& f = b.fibers[32 * w + (forward ? li : lanes - 1 - li)];
            if (f.done) continue;
            b.current = &f;
            threadIdx = f.idx;
            swap(b.scheduler, f.ctx);
            left -= f.done;
          }
        } while (b.progress != before);
      }
      if (b.progress == round) {
        fprintf(stderr,
                "cuda_emu: block (%u, %u, %u) is stuck: %u of its %u threads wait at a barrier "
                "that the others never reach\n",
                blockIdx.x, blockIdx.y, blockIdx.z, left, n);
        abort();
      }
    }
  }
  block = nullptr;
  for (auto& f : b.fibers) munmap(f.stack, GUARD + STACK);
}
}  // namespace emu

inline void __syncthreads() { emu::wait(emu::block->all); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::wait(emu::block->warps[emu::warp_id()]); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int mask) {
  return emu::shuffle(v, emu::lane_id() ^ mask);
}
template <typename T> T __shfl_sync(unsigned, T v, int from) { return emu::shuffle(v, from % 32); }
// Atomic as on a GPU: a fiber is not switched out inside it.
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
using std::max;
using std::min;
