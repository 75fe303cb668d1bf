// Host helpers shared by the forward and backward launchers.
#pragma once

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/error.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device_limits.hpp"
#include "cuda/common/products.hpp"
#include "cuda/common/round_up.hpp"
#include "cuda/sm90/dims.hpp"
#include "cuda/sm90/forward/params.hpp"
#include "cuda/sm90/forward/state_config.hpp"

namespace fkt::cuda {

// Raises a kernel's attribute on the current device to `value` (a shared-memory size or carveout:
// larger admits more) unless an earlier call set at least that much: cudaFuncSetAttribute took about
// 9 us of host time per call on the H200 machine, paid before every launch, while the GPU may be
// waiting for the launch. Thread-safe; a device reset (which drops the attributes) is not tracked.
inline void raise_kernel_attribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, int> raised;  // (kernel, device, attribute) -> value
  int device = 0;
  FKT_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(kernel, device, static_cast<int>(attribute));
  const auto at = raised.find(key);
  if (at != raised.end() && at->second >= value) return;
  FKT_CUDA_CHECK(cudaFuncSetAttribute(kernel, attribute, value));
  raised[key] = value;
}

// Launches a kernel taking one params struct, with `smem` bytes of dynamic shared memory; an empty
// grid launches nothing. Every launch is checked.
template <typename Kernel, typename Params>
void launch(Kernel kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream, const Params& params) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  raise_kernel_attribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
  kernel<<<grid, threads, smem, stream>>>(params);
  FKT_CUDA_CHECK(cudaGetLastError());
}

// The precision of a call's tensor-core products (common/mma.cuh): one TF32 product when the
// inputs are bfloat16 (they carry 8 significant bits, a TF32 operand 11), split 3xTF32 for float16
// and float32 inputs, whose results then match the CPU backend's to fp32 rounding. The
// context-parallel summaries take kSummaryProducts.
inline Products products_for(const Problem& p) {
  return p.input_dtype == DType::kBF16 ? Products::kTf32 : Products::kSplit3;
}

// The one place where the runtime choice becomes the kernels' template argument: calls
// f(std::integral_constant<Products, ...>).
template <typename F>
void with_products(Products products, F f) {
  if (products == Products::kTf32) f(std::integral_constant<Products, Products::kTf32>{});
  else f(std::integral_constant<Products, Products::kSplit3>{});
}

// The one place where the call's chunk size and head dims become the chunk kernels' template
// argument (sm90/dims.hpp): calls f(CommonDims{}) for the common shape with bf16 products (the
// shape and precision of bf16 training, compiled twice), else f(RuntimeDims{}).
template <Products kP, typename F>
void with_dims(const Problem& p, F f) {
  if constexpr (kP == Products::kTf32) {
    if (CommonDims::matches(p)) return f(CommonDims{});
  }
  f(RuntimeDims{});
}

// Asks for the largest shared-memory carveout, under which the kernel's blocks that fit by shared
// memory (three of fwd_intra at the common shape, two elsewhere; two or three of fwd_state and of
// bwd_state) share an SM.
template <typename Kernel>
void prefer_max_shared(Kernel kernel) {
  raise_kernel_attribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
}

// The element type of the gate g and its gradient dg (bfloat16, float16 or float32, which
// check_supported admits), the one place where g's dtype becomes the gate kernels' template argument:
// calls f(element) with a value of that type.
template <typename F>
void with_gate_element(DType g, F f) {
  if (g == DType::kBF16) return f(__nv_bfloat16{});
  if (g == DType::kF16) return f(__half{});
  f(float{});
}

// The gate mode (kda-math.md section 2.2) as bwd_gate's template argument, the one place where it
// becomes one: calls f(std::integral_constant<GateMode, ...>).
template <typename F>
void with_gate_mode(GateMode mode, F f) {
  if (mode == GateMode::kSoftplus) return f(std::integral_constant<GateMode, GateMode::kSoftplus>{});
  if (mode == GateMode::kBoundedSigmoid) return f(std::integral_constant<GateMode, GateMode::kBoundedSigmoid>{});
  f(std::integral_constant<GateMode, GateMode::kPrecomputed>{});
}

// Columns a thread of bwd_gate takes (BwdGateConfig): two where `pairs` (gate_pairs), else one.
// Calls f(std::integral_constant<int, ...>).
template <typename F>
void with_gate_columns(bool pairs, F f) {
  if (pairs) return f(std::integral_constant<int, 2>{});
  f(std::integral_constant<int, 1>{});
}

// How fwd_intra keeps q, k and v in shared memory (IntraConfig): in their dtype when all three
// are bfloat16 or all float16, else as fp32. Calls f(element) with a value of that type.
template <typename F>
void with_intra_storage(DType q_dtype, DType v_dtype, F f) {
  if (q_dtype == v_dtype && q_dtype == DType::kBF16) return f(__nv_bfloat16{});
  if (q_dtype == v_dtype && q_dtype == DType::kF16) return f(__half{});
  f(float{});
}

// How B4 keeps q and k in shared memory (BwdIntraConfig): as given when they are 16-bit (bfloat16,
// which kTf32 comes with alone: products_for; float16), else fp32. Calls f(element) with a value of
// that type.
template <Products kP, typename F>
void with_qk_storage(DType qk, F f) {
  if constexpr (kP == Products::kTf32) {
    f(__nv_bfloat16{});
  } else if (qk == DType::kF16) {
    f(__half{});
  } else {
    f(float{});
  }
}

// A run-time flag as a kernel's template argument: whether F2 and B4 read the l2norm row scales
// (use_qk_l2norm_in_kernel; IntraTiles, BwdIntraConfig), whether F2 is the backward's recompute
// from the forward's saved T (ForwardWorkspace::recompute), whether it stores K_up and T for F4 to
// form the new values from (ForwardWorkspace::values_from_t). Calls f(std::true_type{}) or
// f(std::false_type{}).
template <typename F>
void with_flag(bool flag, F f) {
  if (flag) f(std::true_type{});
  else f(std::false_type{});
}

// How B1 and B3 keep dO in shared memory: bf16 as given for bf16 products and a bf16 gradient
// (copied with cp.async, widened exactly where read), else widened to fp32 as loaded. Calls
// f(element) with a value of that type.
template <Products kP, typename F>
void with_d_o_storage(DType d_o, F f) {
  if constexpr (kP == Products::kTf32) {
    if (d_o == DType::kBF16) return f(__nv_bfloat16{});
  }
  f(float{});
}

// The element type of the forward's states (ForwardWorkspace::states_dtype): bf16, which occurs
// with bf16 operands only (ForwardWorkspace::carve), or fp32. Calls f(element) with a value of that
// type.
template <Products kP, typename F>
void with_states_storage(DType states, F f) {
  if constexpr (kP == Products::kTf32) {
    if (states == DType::kBF16) return f(__nv_bfloat16{});
  }
  f(float{});
}

// The inputs, options and shapes every stage reads; outputs are left null for the caller to set.
inline ForwardParams forward_params(const Problem& p, const ForwardWorkspace& ws) {
  ForwardParams params{};
  params.q = p.q.bytes();
  params.k = p.k.bytes();
  params.v = p.v.bytes();
  params.beta = p.beta.bytes();
  params.gate = gate_inputs(p);
  params.initial_state = p.initial_state.present() ? reinterpret_cast<const float*>(p.initial_state.bytes()) : nullptr;
  params.cu_seqlens = p.varlen ? p.cu_seqlens_device.bytes() : nullptr;
  params.ws = ws;
  params.qk_dtype = p.q.dtype;
  params.v_dtype = p.v.dtype;
  params.beta_dtype = p.beta.dtype;
  params.o_dtype = p.input_dtype;
  params.offsets_dtype = p.varlen ? p.cu_seqlens_device.dtype : DType::kI64;
  params.beta_mode = p.beta_mode;
  params.l2norm = p.l2norm;
  params.state_v_first = p.state_v_first;
  params.scale = static_cast<float>(p.scale);
  params.T = p.T;
  params.N = p.N;
  params.chunks_per_row = (p.T + p.chunk - 1) / p.chunk;
  params.piece_begin = 0;
  params.piece_end = kNoPieceEnd;
  params.H = static_cast<int32_t>(p.H);
  params.HV = static_cast<int32_t>(p.HV);
  params.K = static_cast<int32_t>(p.K);
  params.V = static_cast<int32_t>(p.V);
  params.chunk = p.chunk;
  params.io_T = p.T;
  params.io_H = params.H;
  params.io_HV = params.HV;
  return params;
}

// Varlen, on `stream` (forward/chunk_offsets.cuh): the device offsets of p's sequences [first,
// first + count] rebased to the first's start, as int64 into `out` (a sequence group's:
// sequence_groups.hpp).
void rebased_offsets(const Problem& p, int64_t first, int64_t count, int64_t* out, void* stream);
// F1 to F3 (the chunk-local stages: chunk offsets, gamma, P, W, U, K_down, Q_up), on `stream`.
void forward_local_stages(const Problem& p, const ForwardParams& params, Products products, void* stream);
// F1 to F4, and F5 when params.o is set (the backward recomputes without it), on `stream`.
void forward_stages(const Problem& p, const ForwardParams& params, Products products, void* stream);
// F4 on wgmma's arguments for p (forward/fwd_state_wgmma.cuh): the tensor maps of the workspace rows
// it reads (bf16 operands, fp32 U), in boxes of one chunk's tokens.
struct FwdStateWgmmaParams;
FwdStateWgmmaParams fwd_state_wgmma_params(const Problem& p, const ForwardParams& params);

// The state passes (fwd_state, bwd_state and their wgmma passes): one block per (sequence, value head,
// V-tile of `tile` columns), x = sequence * tiles + tile.
inline dim3 state_pass_grid(const Problem& p, int tile = StateConfig::kTileV) {
  return dim3(static_cast<unsigned>(p.N * ceil_div(p.V, tile)), static_cast<unsigned>(p.HV));
}

// The state passes' residency (Residency in forward/state_config.hpp), the one place where it becomes
// their kernels' template argument: calls f(Residency<threads, blocks per SM>{}). A grid that the
// SMs hold one block each runs blocks of 16 warps (two per 16 state rows: more products in flight);
// a larger one blocks of 8 warps, as many per SM as the SM's shared memory holds of `smem_bytes`
// each: two, or, with bf16 operands and more blocks than two per SM hold, three (80 registers a
// thread: 65536 / 768, allocated by 8; fwd_state 72 KB, bwd_state 73.5 KB with a bf16 dO). Where
// one block alone fits (bwd_state with fp32 operands, 126.5 KB), one block of 16 warps per SM.
template <Products kP, typename F>
void with_state_residency(const Problem& p, size_t smem_bytes, F f) {
  constexpr int kNarrow = StateConfig::kThreads, kWide = 2 * StateConfig::kThreads;
  const DeviceLimits& device = device_limits(p.device.device_id);
  const dim3 grid = state_pass_grid(p);
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y;
  const size_t fit = static_cast<size_t>(device.smem_per_sm) /
                     (smem_bytes + static_cast<size_t>(device.reserved_smem_per_block));
  if (blocks <= device.sms) return f(Residency<kWide, 1>{});
  if constexpr (kP == Products::kTf32) {
    if (fit >= 3 && blocks > 2 * static_cast<int64_t>(device.sms)) return f(Residency<kNarrow, 3>{});
  }
  if (fit >= 2) return f(Residency<kNarrow, 2>{});
  f(Residency<kWide, 1>{});
}

// The context-parallel summaries: one block per (value head, 32-column tile of the V + K widened
// columns) of the one sequence.
inline dim3 cp_summary_grid(const Problem& p) {
  const int64_t tiles = ceil_div(p.V + p.K, StateConfig::kTileV);
  return dim3(1, static_cast<unsigned>(p.HV), static_cast<unsigned>(tiles));
}

inline void* data_or_null(const fkt_tensor* t, const char* name) { return t ? TensorRef(t, name).bytes() : nullptr; }

}  // namespace fkt::cuda
