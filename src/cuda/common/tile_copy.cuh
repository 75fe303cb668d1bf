// Row-block copies between global and shared memory. Loads are asynchronous (cp.async, sm_80+):
// a stage enqueues all of a tile's loads at once, or the next chunk's operands while it computes
// on the current ones, instead of waiting one memory latency per element. PTX ISA, "cp.async": a
// src-size below the copy size zero-fills the rest; groups complete in the order they were committed.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"
#include "cuda/common/batched.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/fast_exp.cuh"
#include "cuda/common/shared_address.cuh"
#include "cuda/common/vec4.cuh"

namespace fkt::cuda {

// 16-byte copies bypass L1 (.cg: the tiles are read once, from shared memory); smaller ones cannot.
template <int kBytes>
__device__ __forceinline__ void cp_async(float* dst, const float* src, bool valid) {
  const uint32_t to = shared_address(dst);
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(valid ? 16 : 0));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(to), "l"(src), "n"(kBytes),
                 "r"(valid ? kBytes : 0));
  }
}

// Asks L2 for the 128-byte line holding p (PTX ISA "prefetch": a hint, no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Asks L2 (by the whole block) for the lines of global rows [0, rows) x bytes [0, row_bytes) of a
// block whose rows start stride_bytes apart, so that a later phase's loads of them wait on L2
// rather than on memory. A row's last address is asked too, for rows that do not start on a line.
__device__ __forceinline__ void prefetch_rows_l2(const void* base, int64_t stride_bytes, int rows, int row_bytes) {
  const int lines = row_bytes / 128 + 1;
  for (int x = threadIdx.x; x < rows * lines; x += blockDim.x) {
    const int r = x / lines, at = min(x % lines * 128, row_bytes - 1);
    prefetch_l2(static_cast<const char*>(base) + r * stride_bytes + at);
  }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Calls f(r, c, g, s) for the cells of a [rows, cells] grid, strided over `threads` threads in
// row-major order (thread i < threads takes cells i, i + threads, ...), a cell being kWidth
// consecutive elements: c is the cell's first column, g and s its element offsets in a global array
// (row stride global_ld) and a shared one (row stride shared_ld). The offsets advance by additions:
// one division per thread, not one 64-bit multiply and division per cell (the state passes run these
// loops once per chunk).
template <int kWidth, typename F>
__device__ __forceinline__ void for_each_cell_of(unsigned thread, unsigned threads, int rows, int cells,
                                                 int64_t global_ld, int shared_ld, F f) {
  if (cells <= 0) return;
  const int step_r = threads / cells, step_c = threads % cells;
  int r = thread / cells, c = thread % cells;
  int64_t g = r * global_ld + c * kWidth;
  int s = r * shared_ld + c * kWidth;
  const int64_t g_step = step_r * global_ld + step_c * kWidth, g_wrap = global_ld - cells * kWidth;
  const int s_step = step_r * shared_ld + step_c * kWidth, s_wrap = shared_ld - cells * kWidth;
  while (r < rows) {
    f(r, c * kWidth, g, s);
    r += step_r;
    c += step_c;
    g += g_step;
    s += s_step;
    if (c >= cells) {
      c -= cells;
      ++r;
      g += g_wrap;
      s += s_wrap;
    }
  }
}

// for_each_cell_of by the whole block.
template <int kWidth, typename F>
__device__ __forceinline__ void for_each_cell(int rows, int cells, int64_t global_ld, int shared_ld, F f) {
  for_each_cell_of<kWidth>(threadIdx.x, blockDim.x, rows, cells, global_ld, shared_ld, f);
}

// copy_rows_async by copies of kWidth floats (cols and valid_cols multiples of kWidth).
template <int kWidth>
__device__ __forceinline__ void copy_cells_async(float* dst, int ld, const float* src, int64_t stride, int rows,
                                                 int cols, int valid_rows, int valid_cols) {
  for_each_cell<kWidth>(rows, cols / kWidth, stride, ld, [&](int r, int c, int64_t g, int s) {
    const bool in = r < valid_rows && c < valid_cols;
    cp_async<4 * kWidth>(dst + s, in ? src + g : src, in);
  });
}

// Enqueues (by the whole block) the copy of a [rows, cols] block of fp32 rows with global row
// stride `stride` floats into shared memory with row stride ld, zero-filling rows >= valid_rows and
// columns >= valid_cols. 16-byte copies when every row start is 16-byte aligned, else 4-byte ones.
__device__ __forceinline__ void copy_rows_async(float* dst, int ld, const float* src, int64_t stride, int rows,
                                                int cols, int valid_rows, int valid_cols) {
  const bool vector = stride % 4 == 0 && ld % 4 == 0 && cols % 4 == 0 && valid_cols % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (vector) copy_cells_async<4>(dst, ld, src, stride, rows, cols, valid_rows, valid_cols);
  else copy_cells_async<1>(dst, ld, src, stride, rows, cols, valid_rows, valid_cols);
}

// Enqueues (by the whole block) the copy of a [rows, cols] block of 16-bit rows with global row
// stride `stride` elements into shared memory with row stride ld elements, zero-filling rows >=
// valid_rows and columns >= valid_cols: the elements as they are, no conversion. 16-byte cp.async
// copies when every row start is 16-byte aligned, else one synchronous copy per element.
template <typename T>
__device__ __forceinline__ void copy_rows16_async(T* dst, int ld, const T* src, int64_t stride, int rows, int cols,
                                                  int valid_rows, int valid_cols) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  const bool vector = stride % 8 == 0 && ld % 8 == 0 && cols % 8 == 0 && valid_cols % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (vector) {
    for_each_cell<8>(rows, cols / 8, stride, ld, [&](int r, int c, int64_t g, int s) {
      const bool in = r < valid_rows && c < valid_cols;
      cp_async<16>(reinterpret_cast<float*>(dst + s), reinterpret_cast<const float*>(in ? src + g : src), in);
    });
    return;
  }
  for_each_cell<1>(rows, cols, stride, ld, [&](int r, int c, int64_t g, int s) {
    dst[s] = r < valid_rows && c < valid_cols ? src[g] : T(0.f);
  });
}

// copy_rows_async of bf16 rows (copy_rows16_async): one name for the state passes' operands,
// whatever their element type (Operand in common/mma_pairs.cuh).
__device__ __forceinline__ void copy_rows_async(__nv_bfloat16* dst, int ld, const __nv_bfloat16* src, int64_t stride,
                                                int rows, int cols, int valid_rows, int valid_cols) {
  copy_rows16_async(dst, ld, src, stride, rows, cols, valid_rows, valid_cols);
}

// N pointers, passed by value (a by-reference array could be left in local memory).
template <typename P, int N>
struct Pointers {
  P at[N];
  // at[j] for a j known only at run time, by selects rather than an indexed (local-memory) load.
  __device__ __forceinline__ P operator[](int j) const {
    P p = at[0];
#pragma unroll
    for (int i = 1; i < N; ++i) p = i == j ? at[i] : p;
    return p;
  }
};

// Loads (by the whole block) [rows, cols] blocks of rows with stride `stride` elements of T, one
// from each src[j], into fp32 shared memory dst[j] with row stride ld, zero-filling rows >=
// valid_rows and columns >= valid_cols. The blocks are interleaved in one block-strided loop
// (element x of block x % N), so their loads are in flight together. 16-byte loads, each thread's
// issued before its stores, when every row start is 16-byte aligned.
template <int N, typename T>
__device__ __forceinline__ void load_rows_as_float(Pointers<float*, N> dst, int ld, Pointers<const T*, N> src,
                                                   int64_t stride, int rows, int cols, int valid_rows, int valid_cols) {
  constexpr int kPer = 16 / sizeof(T);
  bool vector = stride % kPer == 0 && cols % kPer == 0 && valid_cols % kPer == 0 && ld % 4 == 0;
#pragma unroll
  for (int j = 0; j < N; ++j) vector = vector && reinterpret_cast<uintptr_t>(src.at[j]) % 16 == 0;
  if (vector) {
    const int vecs = cols / kPer;
    batched(
        N * rows * vecs,
        [&](int x) {
          const int y = x / N, r = y / vecs, c = y % vecs * kPer;
          return r < valid_rows && c < valid_cols ? *reinterpret_cast<const uint4*>(src[x % N] + r * stride + c)
                                                  : make_uint4(0u, 0u, 0u, 0u);
        },
        [&](int x, uint4 raw) {
          const int y = x / N;
          float* out = dst[x % N] + y / vecs * ld + y % vecs * kPer;
          const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int i = 0; i < kPer; i += 4) {
            *reinterpret_cast<float4*>(out + i) = make_float4(to_float(e[i]), to_float(e[i + 1]), to_float(e[i + 2]),
                                                             to_float(e[i + 3]));
          }
        });
    return;
  }
  batched(
      N * rows * cols,
      [&](int x) {
        const int y = x / N, r = y / cols, c = y % cols;
        return r < valid_rows && c < valid_cols ? to_float(src[x % N][r * stride + c]) : 0.f;
      },
      [&](int x, float v) {
        const int y = x / N;
        dst[x % N][y / cols * ld + y % cols] = v;
      });
}

// The same for tensors whose dtype (bf16, fp16 or fp32, one for all) is known at run time; the
// blocks start at element `offset` of each base.
template <int N>
__device__ __forceinline__ void load_rows_as_float(Pointers<float*, N> dst, int ld, Pointers<const void*, N> base,
                                                   DType dtype, int64_t offset, int64_t stride, int rows, int cols,
                                                   int valid_rows, int valid_cols) {
  auto load = [&](auto element) {
    using T = decltype(element);
    Pointers<const T*, N> src;
#pragma unroll
    for (int j = 0; j < N; ++j) src.at[j] = static_cast<const T*>(base.at[j]) + offset;
    load_rows_as_float<N, T>(dst, ld, src, stride, rows, cols, valid_rows, valid_cols);
  };
  switch (dtype) {
    case DType::kBF16: return load(__nv_bfloat16{});
    case DType::kF16: return load(__half{});
    default: return load(float{});
  }
}

// One block: load_rows_as_float for a single tensor.
__device__ __forceinline__ void load_rows_as_float(float* dst, int ld, const void* base, DType dtype, int64_t offset,
                                                   int64_t stride, int rows, int cols, int valid_rows, int valid_cols) {
  load_rows_as_float<1>({{dst}}, ld, {{base}}, dtype, offset, stride, rows, cols, valid_rows, valid_cols);
}

// Stores (by the whole block) rows [0, rows) x columns [0, cols) of shared memory (row stride ld) to
// global rows with stride `stride` floats; 16-byte stores when every row start is 16-byte aligned.
__device__ __forceinline__ void store_rows(float* dst, int64_t stride, const float* src, int ld, int rows, int cols) {
  const bool vector = stride % 4 == 0 && ld % 4 == 0 && cols % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (vector) {
    for_each_cell<4>(rows, cols / 4, stride, ld, [&](int, int, int64_t g, int s) {
      *reinterpret_cast<float4*>(dst + g) = *reinterpret_cast<const float4*>(src + s);
    });
    return;
  }
  for_each_cell<1>(rows, cols, stride, ld, [&](int, int, int64_t g, int s) { dst[g] = src[s]; });
}

// Multiplies a [rows, cols] block of shared memory (row stride ld; cols and ld multiples of 4) by
// log2(e), by the whole block: log decays in the units exp2_fast takes.
__device__ __forceinline__ void to_log2_units(float* x, int rows, int cols, int ld) {
  for_each_cell<4>(rows, cols / 4, 0, ld, [&](int, int, int64_t, int s) {
    store4(x + s, map4([](float v) { return v * kLog2e; }, load4(x + s)));
  });
}

// Rows of kCells 16-byte cells of T (fp32 or 16-bit), cell c of row r at position c ^ (r % 8):
// the elements of a transposed accumulator (a warp's lanes write eight consecutive columns of
// four rows 2 apart) and whole rows read or written by consecutive threads are free of bank
// conflicts. Byte offsets of cell c of row r, and of element (r, col).
template <int kCells, typename T>
struct SwizzledByRow {
  static_assert(kCells % 8 == 0, "rows of whole 128-byte lines");
  static constexpr int kPerCell = 16 / sizeof(T);
  __device__ static __forceinline__ int cell(int r, int c) { return (r * kCells + (c ^ (r % 8))) * 16; }
  __device__ static __forceinline__ int at(int r, int col) {
    return cell(r, col / kPerCell) + col % kPerCell * static_cast<int>(sizeof(T));
  }
};

// Calls f(r, c) for this thread's cells of a [kRows, kCells] grid, cell x = r * kCells + c taken
// by thread x % kThreads: consecutive threads take a row's consecutive cells.
template <int kThreads, int kRows, int kCells, typename F>
__device__ __forceinline__ void for_each_cell16(F f) {
  static_assert(kThreads % kCells == 0, "a thread's cells share their column");
  constexpr int kTotal = kRows * kCells, kRowStep = kThreads / kCells;
  const int r0 = threadIdx.x / kCells, c = threadIdx.x % kCells;
#pragma unroll
  for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
    const int r = r0 + i * kRowStep;
    if (kTotal % kThreads != 0 && r >= kRows) break;
    f(r, c);
  }
}

// Stores (by the whole block of kThreads) rows [0, rows) of kCells 16-byte cells from shared
// memory, cell c of row r at src + at(r, c), to global row r at dst + r * stride_bytes.
template <int kThreads, int kRows, int kCells, typename At>
__device__ __forceinline__ void store_cells16(void* dst, int64_t stride_bytes, const char* src, int rows, At at) {
  for_each_cell16<kThreads, kRows, kCells>([&](int r, int c) {
    if (r < rows) {
      *reinterpret_cast<uint4*>(static_cast<char*>(dst) + r * stride_bytes + c * 16) =
          *reinterpret_cast<const uint4*>(src + at(r, c));
    }
  });
}

}  // namespace fkt::cuda
