// Varlen planning on the device, from the device copy of cu_seqlens, so the run path needs no
// host-to-device copy: chunk_offsets[n] = sum over earlier sequences of ceil(L / C), the order in
// which the wgmma state passes take the sequences (ForwardWorkspace::sequence_order), and the
// offsets of a group of sequences as a call of its own (sequence_groups.hpp).
#pragma once

#include <cub/block/block_scan.cuh>

#include "cuda/sm90/forward/chunks.cuh"

namespace fkt::cuda {

struct ChunkOffsetsConfig {
  static constexpr int kThreads = 256;  // one block scans all sequences, kThreads at a time
  // Sequences ordered by length: a thread each, its rank counted over all of them (kThreads steps
  // at most, on the forward's critical path); more sequences keep their order.
  static constexpr int kMostOrdered = kThreads;
};

__global__ void __launch_bounds__(ChunkOffsetsConfig::kThreads)
    chunk_offsets_kernel(const __grid_constant__ ForwardParams p) {
  using Scan = cub::BlockScan<int64_t, ChunkOffsetsConfig::kThreads>;
  constexpr int kOrdered = ChunkOffsetsConfig::kMostOrdered;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int64_t carry;
  __shared__ int64_t chunks_of[kOrdered];
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < p.N; base += ChunkOffsetsConfig::kThreads) {
    const int64_t n = base + threadIdx.x;
    const int64_t chunks = n < p.N ? (offset_at(p, n + 1) - offset_at(p, n) + p.chunk - 1) / p.chunk : 0;
    if (n < kOrdered) chunks_of[n] = chunks;
    int64_t before, tile_total;
    Scan(scan_storage).ExclusiveSum(chunks, before, tile_total);
    if (n < p.N) p.ws.chunk_offsets[n] = carry + before;
    __syncthreads();
    if (threadIdx.x == 0) carry += tile_total;
    __syncthreads();
  }
  if (threadIdx.x == 0) p.ws.chunk_offsets[p.N] = carry;
  // Sequence n's place: those with more chunks, or as many and an earlier index, come first.
  for (int64_t n = threadIdx.x; n < p.N; n += ChunkOffsetsConfig::kThreads) {
    int64_t rank = n;
    if (p.N <= kOrdered) {
      rank = 0;
      for (int64_t m = 0; m < p.N; ++m) {
        rank += chunks_of[m] > chunks_of[n] || (chunks_of[m] == chunks_of[n] && m < n);
      }
    }
    p.ws.sequence_order[rank] = static_cast<int32_t>(n);
  }
}

struct RebasedOffsetsParams {
  const void* cu_seqlens;  // the call's, on the device
  DType offsets_dtype;     // int32 or int64
  int64_t first;           // the group's first sequence
  int64_t count;           // its sequences
  int64_t* out;            // [count + 1] int64
};

// out[i] = cu_seqlens[first + i] - cu_seqlens[first] for i <= count, kThreads at a time.
__global__ void __launch_bounds__(ChunkOffsetsConfig::kThreads)
    rebased_offsets_kernel(const __grid_constant__ RebasedOffsetsParams p) {
  const int64_t base = offset_at(p.cu_seqlens, p.offsets_dtype, p.first);
  for (int64_t i = threadIdx.x; i <= p.count; i += ChunkOffsetsConfig::kThreads) {
    p.out[i] = offset_at(p.cu_seqlens, p.offsets_dtype, p.first + i) - base;
  }
}

}  // namespace fkt::cuda
