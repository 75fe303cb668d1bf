// Where chunks and sequences lie in the packed token rows (kda-math.md section 5), on the device.
#pragma once

#include "cuda/sm90/forward/params.hpp"

namespace fkt::cuda {

// Offset i of cu_seqlens (int32 or int64 elements).
__device__ __forceinline__ int64_t offset_at(const void* cu_seqlens, DType dtype, int64_t i) {
  return dtype == DType::kI64 ? static_cast<const int64_t*>(cu_seqlens)[i] : static_cast<const int32_t*>(cu_seqlens)[i];
}

__device__ __forceinline__ int64_t offset_at(const ForwardParams& p, int64_t i) {
  return offset_at(p.cu_seqlens, p.offsets_dtype, i);
}

struct SequenceSpan {
  int64_t first_row;   // packed token row (b * T + t) of its first token
  int64_t length;
  int64_t first_chunk; // row of its first chunk in ws.states
  int64_t io_row;      // the same in the tensors as given (b * io_T + t)
};

__device__ __forceinline__ SequenceSpan sequence_span(const ForwardParams& p, int64_t n) {
  if (p.cu_seqlens == nullptr) return {n * p.T, p.T, n * p.chunks_per_row, n * p.io_T};
  const int64_t begin = offset_at(p, n);
  return {begin, offset_at(p, n + 1) - begin, p.ws.chunk_offsets[n], begin};
}

struct ChunkSpan {
  int64_t first_row;  // packed token row of its first token
  int64_t rows;       // valid rows l
  int64_t batch;      // batch row b (0 when varlen)
  int64_t index;      // chunk index inside its sequence
  int64_t io_row;     // the same in the tensors as given (b * io_T + t)
};

// Chunk c of the packed chunk list (dense: row-major over batch rows; varlen: sequence order).
__device__ __forceinline__ ChunkSpan chunk_span(const ForwardParams& p, int64_t c) {
  if (p.cu_seqlens == nullptr) {
    const int64_t b = c / p.chunks_per_row, j = c % p.chunks_per_row;
    const int64_t first = j * p.chunk;
    return {b * p.T + first, min(static_cast<int64_t>(p.chunk), p.T - first), b, j, b * p.io_T + first};
  }
  // The last sequence n with chunk_offsets[n] <= c; it has chunk_offsets[n + 1] > c, so empty
  // sequences (which share their offset with the next one) are never chosen.
  int64_t lo = 0, hi = p.N;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (p.ws.chunk_offsets[mid] <= c) lo = mid;
    else hi = mid;
  }
  const int64_t j = c - p.ws.chunk_offsets[lo];
  const int64_t begin = offset_at(p, lo), end = offset_at(p, lo + 1);
  const int64_t first = begin + j * p.chunk;
  return {first, min(static_cast<int64_t>(p.chunk), end - first), 0, j, first};
}

// The chunk of the packed chunk list that block x of a chunk-parallel launch takes: x itself, or in
// a piece (dense, ForwardParams::piece_begin), chunk piece_begin + x % n of batch row x / n, n the
// piece's chunks of a row.
__device__ __forceinline__ int64_t launched_chunk(const ForwardParams& p, int64_t x) {
  if (p.piece_end == kNoPieceEnd) return x;
  const int64_t n = min(p.piece_end, p.chunks_per_row) - p.piece_begin;
  return x / n * p.chunks_per_row + p.piece_begin + x % n;
}

// Element (d, e) of the state of (sequence n, value head) in a [N, HV, K, V] or [N, HV, V, K] tensor
// as given (io_HV heads).
__device__ __forceinline__ int64_t state_index(const ForwardParams& p, int64_t n, int head, int d, int e) {
  const int64_t base = (n * p.io_HV + head) * static_cast<int64_t>(p.K) * p.V;
  return base + (p.state_v_first ? static_cast<int64_t>(e) * p.K + d : static_cast<int64_t>(d) * p.V + e);
}

}  // namespace fkt::cuda
