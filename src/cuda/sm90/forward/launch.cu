// Host side of the CUDA forward: what it supports, its workspace, and the launches F1 to F5 (F1 runs
// inside F2).
// No allocation, no copy and no synchronisation: everything is enqueued on the caller's stream.
#include <cstdint>

#include "core/error.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device_guard.cuh"
#include "cuda/common/device_limits.hpp"
#include "cuda/common/side_stream.hpp"
#include "cuda/sm90/cp/params.hpp"
#include "cuda/sm90/launch.cuh"
#include "cuda/sm90/forward/chunk_offsets.cuh"
#include "cuda/sm90/forward/fwd_intra.cuh"
#include "cuda/sm90/forward/fwd_output.cuh"
#include "cuda/sm90/forward/fwd_state.cuh"
#include "cuda/sm90/forward/fwd_state_wgmma.cuh"
#include "cuda/sm90/forward/pieces.hpp"
#include "cuda/sm90/saved.hpp"
#include "cuda/sm90/segments.hpp"
#include "cuda/sm90/tensor_map.hpp"

namespace fkt::cuda {
namespace {

constexpr int kMaxHeadDim = 128;  // shared-memory plan of the fp32 stage kernels

// The forward's workspace: the stages' (with keep_forward laid out as the backward's, whose first part
// the forward fills, T and the activated inputs included, for the backward to read), then what its
// pieces hand on (forward/pieces.hpp). One layout for sizing and for the run.
struct ForwardLayout {
  ForwardWorkspace ws;
  ForwardPieces pieces;
  float* carry;         // pieces one after another: like initial_state, fp32
  float* summaries;     // time slices: [slices - 1, N, HV, K, V + K] fp32 (SliceSummary)
  float* slice_states;  // time slices: the states entering slices 1 on, each like initial_state
};

// keep_forward lays the forward out as the backward (a `saved` given then is not written); else a
// forward given `saved` writes T and P there.
ForwardUse forward_use(const Problem& p, bool saved_given) {
  return p.keep_forward ? ForwardUse::kBackward : saved_given ? ForwardUse::kSaving : ForwardUse::kOwn;
}

ForwardLayout carve_forward(Carver& m, const Problem& p, ForwardUse use) {
  ForwardLayout layout{};
  const int bytes = operand_bytes(products_for(p));
  const dim3 f4 = state_pass_grid(p, FwdStateWgmmaLayout<void>::kTile);
  const int64_t f4_blocks = static_cast<int64_t>(f4.x) * f4.y;
  Carver measure;  // the pieces follow from the layout's kind, the layout's values_from_t from the pieces
  layout.pieces = forward_pieces(p, ForwardWorkspace::carve(measure, p, use, bytes), f4_blocks);
  // F4 from T where its blocks are at least the SMs: its longer steps cost less than F2's W and U
  // products where they are many, more where few (docs/design.md, "The new values from T where F4
  // fills the GPU").
  const bool from_t = layout.pieces.count == 1 && f4_blocks >= device_limits(p.device.device_id).sms;
  layout.ws = ForwardWorkspace::carve(m, p, use, bytes, from_t);
  // forward_workspace_bytes sizes keep_forward's layout as the backward's, which has no carry.
  FKT_CHECK(!p.keep_forward || layout.pieces.count == 1) << "internal: pieces with the forward's workspace kept";
  const int64_t states = segment_state_elements(p);
  if (layout.pieces.slices) {
    layout.summaries = m.take<float>((layout.pieces.count - 1) * states / p.V * (p.V + p.K));
    layout.slice_states = m.take<float>((layout.pieces.count - 1) * states);
  } else if (layout.pieces.count > 1) {
    layout.carry = m.take<float>(states);
  }
  return layout;
}

// F4 on wgmma (fwd_state_wgmma_kernel<Stored, kFromT>): a block per (sequence, 64-column tile of
// `columns` state columns, value head) and time slice (`slices` along z) on `s`.
template <typename Stored, bool kFromT = false>
void state_wgmma_launch(const Problem& p, const FwdStateWgmmaParams& args, int64_t columns, int64_t slices,
                        cudaStream_t s) {
  using L = FwdStateWgmmaLayout<Stored, kFromT>;
  const auto kernel = fwd_state_wgmma_kernel<Stored, kFromT>;
  prefer_max_shared(kernel);
  dim3 grid = state_pass_grid(p, L::kTile);
  grid.x = static_cast<unsigned>(p.N * ceil_div(columns, L::kTile));
  grid.z = static_cast<unsigned>(slices);
  launch(kernel, grid, L::kThreads, L::launch_bytes, s, args);
}

// F4: on wgmma at the common shape (bf16 products: CommonDims), 64-column V-tiles with the state in
// registers (fwd_state_wgmma), else the mma.sync pass. With ws.output_in_state_pass the wgmma pass
// writes o (F5) and keeps the states on chip (with ws.values_from_t forming the new values from T),
// else it writes the states in fp16 with row scales (ws.half_states) and delta in fp32 rounded to
// TF32, as B3's TF32 wgmma products (backward/wy_inter_state_wgmma.cuh) read them.
template <Products kP, typename Dims>
void state_pass(const Problem& p, const ForwardParams& params, cudaStream_t s) {
  if constexpr (std::is_same_v<Dims, CommonDims>) {
    const FwdStateWgmmaParams args = fwd_state_wgmma_params(p, params);
    if (params.ws.values_from_t) return state_wgmma_launch<void, true>(p, args, p.V, 1, s);
    if (params.ws.output_in_state_pass) return state_wgmma_launch<void>(p, args, p.V, 1, s);
    FKT_CHECK(params.ws.half_states) << "internal: fp16 states expected at the common shape";
    state_wgmma_launch<__half>(p, args, p.V, 1, s);
  } else {
    const size_t smem = FwdStateLayout::bytes(p.chunk, p.K, operand_bytes(kP));
    with_state_residency<kP>(p, smem, [&](auto residency) {
      using R = decltype(residency);
      const auto kernel = fwd_state_kernel<kP, R, Dims>;
      if constexpr (R::blocks_per_sm > 1) prefer_max_shared(kernel);
      launch(kernel, state_pass_grid(p), R::threads, smem, s, params);
    });
  }
}

// The forward's own layout (nothing kept for a backward), with products of precision `products`.
uint64_t own_workspace_bytes(const Problem& p, Products products) {
  Carver measure;
  ForwardWorkspace::carve(measure, p, ForwardUse::kOwn, operand_bytes(products));
  return measure.bytes();
}

// Varlen: params.ws.chunk_offsets of params' sequences, on the device (forward/chunk_offsets.cuh).
void chunk_offsets(const Problem& p, const ForwardParams& params, void* stream) {
  const DeviceGuard device(p.device.device_id);
  launch(chunk_offsets_kernel, dim3(1), ChunkOffsetsConfig::kThreads, 0, static_cast<cudaStream_t>(stream), params);
}

// F2 (F1 inside) over `chunks` chunks of every value head: the call's, or a piece's
// (ForwardParams::piece_begin), on `s` of the current device.
void intra_stage(const Problem& p, const ForwardParams& params, Products products, unsigned chunks, cudaStream_t s) {
  const unsigned heads = static_cast<unsigned>(p.HV);
  with_products(products, [&](auto kp) {
    constexpr Products kP = decltype(kp)::value;
    with_intra_storage(p.q.dtype, p.v.dtype, [&](auto in) {
      using In = decltype(in);
      // kTf32 is chosen for bfloat16 q only (products_for), __half storage for float16 q only.
      if constexpr (kP == Products::kTf32 && std::is_same_v<In, __half>) {
        return;  // a pair that never occurs: not instantiated
      } else {
        with_dims<kP>(p, [&](auto dims) {
          // Named here: nvcc takes decltype(dims) in the lambdas below for a reference type.
          using Dims = decltype(dims);
          with_flag(params.ws.recompute, [&](auto recompute) {
            with_flag(params.ws.values_from_t, [&](auto from_t) {
              constexpr bool kRecompute = decltype(recompute)::value, kFromT = decltype(from_t)::value;
              constexpr bool kCommon = std::is_same_v<Dims, CommonDims>;
              // Not instantiated, never chosen: K_up and T stored elsewhere than in the forward's own layout
              // at the common shape with bf16 inputs (values_from_t).
              if constexpr (kFromT && (kRecompute || kP != Products::kTf32 || !kCommon ||
                                       !std::is_same_v<In, __nv_bfloat16>)) {
                FKT_CHECK(false) << "internal: F2 has no kernel for these inputs and workspace layout";
              } else {
                with_flag(params.l2norm, [&](auto scaled) {
                  const auto kernel = fwd_intra_kernel<kP, In, Dims, kRecompute, decltype(scaled)::value, kFromT>;
                  prefer_max_shared(kernel);  // three blocks of 71 KB (the recompute's 70 KB) at the common shape
                  launch(kernel, dim3(chunks, heads), IntraConfig<In>::kThreads,
                         IntraLayout<In, kRecompute>(p.chunk, static_cast<int>(p.K), static_cast<int>(p.V)).bytes,
                         s, params);
                });
              }
            });
          });
        });
      }
    });
  });
}

// F2 and F4 (F5 inside) piece by piece (forward/pieces.hpp): F2 on the caller's stream, F4 on the side
// stream after F2 of its piece, and the caller's stream then after the last F4.
void forward_in_pieces(const Problem& p, const ForwardParams& params, const ForwardLayout& layout, cudaStream_t s) {
  FKT_CHECK(params.ws.output_in_state_pass) << "internal: pieces without F5 inside F4";
  const DeviceGuard device(p.device.device_id);
  Fork fork(SideStream::current(), s);
  FwdStateWgmmaParams f4 = fwd_state_wgmma_params(p, params);
  ForwardParams& piece = f4.p;
  for (int64_t i = 0; i < layout.pieces.count; ++i) {
    piece.piece_begin = i * layout.pieces.chunks;
    piece.piece_end = std::min(piece.piece_begin + layout.pieces.chunks, params.chunks_per_row);
    piece.initial_state = i == 0 ? params.initial_state : layout.carry;
    piece.final_state = i + 1 == layout.pieces.count ? params.final_state : layout.carry;
    intra_stage(p, piece, products_for(p), static_cast<unsigned>(p.B * (piece.piece_end - piece.piece_begin)), s);
    fork.follow();
    state_wgmma_launch<void>(p, f4, p.V, 1, fork.stream());
  }
  fork.join();
}

// F2 of every chunk, the summaries of the time slices but the last, the fold of the summaries into
// the state entering each slice, and F4 (F5 inside) of every slice at once (forward/pieces.hpp).
void forward_in_slices(const Problem& p, const ForwardParams& params, const ForwardLayout& layout, cudaStream_t s) {
  FKT_CHECK(params.ws.output_in_state_pass) << "internal: time slices without F5 inside F4";
  // The last slice's blocks write the final state while the first slice's read the initial state.
  const auto in = reinterpret_cast<uintptr_t>(params.initial_state), out = reinterpret_cast<uintptr_t>(params.final_state);
  const auto state_bytes = static_cast<uintptr_t>(sizeof(float) * segment_state_elements(p));
  FKT_CHECK(in == 0 || out == 0 || out + state_bytes <= in || in + state_bytes <= out)
      << "final_state: overlaps initial_state, which the forward in time slices (forward_pieces=-1) reads while "
         "it writes the final state; pass a separate final_state";
  forward_local_stages(p, params, products_for(p), s);
  const DeviceGuard device(p.device.device_id);
  const int64_t slices = layout.pieces.count;
  FwdStateWgmmaParams f4 = fwd_state_wgmma_params(p, params);
  f4.p.piece_end = layout.pieces.chunks;  // slice z: chunks z * piece_end on (fwd_state_wgmma)
  f4.slices = slices;
  f4.slice_states = layout.slice_states;
  f4.summaries = layout.summaries;
  state_wgmma_launch<SliceSummary>(p, f4, p.V + p.K, slices - 1, s);
  CpFoldParams fold{};
  fold.summaries = layout.summaries;
  fold.initial = params.initial_state;
  fold.after_each = layout.slice_states;
  fold.count = slices - 1;
  fold.HV = static_cast<int32_t>(p.N * p.HV);
  fold.K = static_cast<int32_t>(p.K);
  fold.V = static_cast<int32_t>(p.V);
  fold.state_v_first = p.state_v_first;
  fold_states(fold, s);
  state_wgmma_launch<void>(p, f4, p.V, slices, s);
}

}  // namespace

FwdStateWgmmaParams fwd_state_wgmma_params(const Problem& p, const ForwardParams& params) {
  const int64_t tokens = p.B * p.T;
  FwdStateWgmmaParams wgmma{};
  wgmma.p = params;
  wgmma.w = row_tensor_map(params.ws.W, DType::kBF16, p.K, p.HV, p.K, tokens, p.chunk);
  wgmma.k_down = row_tensor_map(params.ws.k_down, DType::kBF16, p.K, p.HV, p.K, tokens, p.chunk);
  if (!params.ws.values_from_t) {
    wgmma.u = row_tensor_map(params.ws.U, DType::kF32, p.V, p.HV, p.V, tokens, p.chunk);
  } else {  // the new values from T (K_up in W's place)
    wgmma.v = row_tensor_map(params.v, DType::kBF16, p.V, p.HV, p.V, tokens, p.chunk);
    wgmma.T = row_tensor_map(params.ws.T, DType::kF32, p.chunk, p.HV, p.chunk, tokens, p.chunk);
  }
  if (params.ws.output_in_state_pass) {  // F5 inside
    wgmma.q_up = row_tensor_map(params.ws.q_up, DType::kBF16, p.K, p.HV, p.K, tokens, p.chunk);
    wgmma.P = row_tensor_map(params.ws.P, DType::kBF16, p.chunk, p.HV, p.chunk, tokens, p.chunk);
  }
  return wgmma;
}

void check_supported(const Problem& p) {
  for (const TensorRef* t : {&p.q, &p.k, &p.v, &p.g, &p.beta}) {
    FKT_CHECK(t->dtype != DType::kF64) << t->name << ": the CUDA backend reads bfloat16, float16 or float32, got float64";
    FKT_CHECK(t->contiguous()) << t->name << ": the CUDA backend reads contiguous tensors, got strides "
                               << shape_str(t->strides) << " for shape " << t->shape_str();
  }
  FKT_CHECK(!p.initial_state.present() || p.initial_state.contiguous())
      << "initial_state: the CUDA backend reads a contiguous tensor, got strides " << shape_str(p.initial_state.strides);
  FKT_CHECK(p.K <= kMaxHeadDim && p.V <= kMaxHeadDim)
      << "q, v: the CUDA backend supports head dims K, V <= " << kMaxHeadDim << ", got K = " << p.K << ", V = " << p.V;
  FKT_CHECK(p.HV <= 65535) << "v: the CUDA backend supports at most 65535 value heads, got " << p.HV;
  FKT_CHECK(p.B * p.T <= INT32_MAX) << "q: the CUDA backend supports at most " << INT32_MAX
                                    << " token rows (B * T, 32-bit TMA coordinates), got " << p.B * p.T;
  const DeviceLimits& device = device_limits(p.device.device_id);
  FKT_CHECK(device.major == 9 && device.minor == 0)
      << "q: the CUDA backend is built for Hopper (sm_90a); cuda:" << p.device.device_id << " has compute capability "
      << device.major << "." << device.minor;
}

uint64_t forward_workspace_bytes(const Problem& p, bool saving) {
  if (p.keep_forward) return backward_workspace_bytes(p);  // carve_forward's layout is its first part
  Carver measure;
  carve_forward(measure, p, forward_use(p, saving));
  return measure.bytes();
}

void rebased_offsets(const Problem& p, int64_t first, int64_t count, int64_t* out, void* stream) {
  const DeviceGuard device(p.device.device_id);
  RebasedOffsetsParams params{};
  params.cu_seqlens = p.cu_seqlens_device.bytes();
  params.offsets_dtype = p.cu_seqlens_device.dtype;
  params.first = first;
  params.count = count;
  params.out = out;
  launch(rebased_offsets_kernel, dim3(1), ChunkOffsetsConfig::kThreads, 0, static_cast<cudaStream_t>(stream), params);
}

void forward_local_stages(const Problem& p, const ForwardParams& params, Products products, void* stream) {
  if (p.varlen) chunk_offsets(p, params, stream);
  const DeviceGuard device(p.device.device_id);
  intra_stage(p, params, products, static_cast<unsigned>(ForwardWorkspace::chunks(p)), static_cast<cudaStream_t>(stream));
}

void forward_stages(const Problem& p, const ForwardParams& params, Products products, void* stream) {
  forward_local_stages(p, params, products, stream);
  const DeviceGuard device(p.device.device_id);
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned chunks = static_cast<unsigned>(ForwardWorkspace::chunks(p));
  const unsigned heads = static_cast<unsigned>(p.HV);
  with_products(products, [&](auto kp) {
    constexpr Products kP = decltype(kp)::value;
    with_dims<kP>(p, [&](auto dims) { state_pass<kP, decltype(dims)>(p, params, s); });
    if (params.o == nullptr || params.ws.output_in_state_pass) return;
    const dim3 grid(chunks * ceil_div(static_cast<unsigned>(p.V), OutputConfig::kTileV), heads);
    with_states_storage<kP>(params.ws.states_dtype, [&](auto stored) {
      using Stored = decltype(stored);
      with_dims<kP>(p, [&](auto dims) {
        launch(fwd_output_kernel<kP, Stored, decltype(dims)>, grid, OutputConfig::kThreads,
               OutputConfig::smem_bytes<Operand<kP>, Stored>(p.chunk, p.K), s, params);
      });
    });
  });
}

uint64_t saved_bytes(const Problem& p) {
  Carver measure;
  SavedLayout::carve(measure, p, operand_bytes(products_for(p)));
  return measure.bytes();
}

void forward(const Problem& p, const fkt_forward_outputs& out, void* stream) {
  const ForwardUse use = forward_use(p, out.saved != nullptr);
  Carver carver(TensorRef(out.workspace, "workspace").bytes());
  const ForwardLayout layout = carve_forward(carver, p, use);
  ForwardParams params = forward_params(p, layout.ws);
  params.o = data_or_null(out.o, "o");
  params.final_state = static_cast<float*>(data_or_null(out.final_state, "final_state"));
  params.intermediate_states = data_or_null(out.intermediate_states, "intermediate_states");
  if (use == ForwardUse::kSaving) {  // F2 keeps T and P, F4 the segments' entering states
    Carver saved_carver(TensorRef(out.saved, "saved").bytes());
    const SavedLayout saved = SavedLayout::carve(saved_carver, p, operand_bytes(products_for(p)));
    params.ws.T = saved.T;
    params.ws.P = saved.P;  // of ws.P's dtype: F4 or F5 read it there
    if (const TimeSegments segments = time_segments(p); segments.count > 1) {
      params.segment_states = saved.segment_states;
      params.segment_chunks = segments.length / p.chunk;
    }
  }
  if (layout.pieces.slices) return forward_in_slices(p, params, layout, static_cast<cudaStream_t>(stream));
  if (layout.pieces.count > 1) return forward_in_pieces(p, params, layout, static_cast<cudaStream_t>(stream));
  forward_stages(p, params, products_for(p), stream);
}

// F1 to F3 write into the forward's own layout (nothing kept for a backward); the widened F4 keeps
// its state in shared memory.
uint64_t cp_forward_summary_workspace_bytes(const Problem& p) { return own_workspace_bytes(p, kSummaryProducts); }

void cp_forward_summary(const Problem& p, int64_t sequence, float* summary, char* workspace, void* stream) {
  Carver carver(workspace);
  CpForwardSummaryParams params{};
  params.fwd = forward_params(p, ForwardWorkspace::carve(carver, p, ForwardUse::kOwn, operand_bytes(kSummaryProducts)));
  params.sequence = sequence;
  params.summary = summary;
  forward_local_stages(p, params.fwd, kSummaryProducts, stream);
  const DeviceGuard device(p.device.device_id);
  launch(cp_forward_summary_kernel, cp_summary_grid(p), StateConfig::kThreads,
         FwdStateLayout::bytes(p.chunk, p.K, operand_bytes(kSummaryProducts)),
         static_cast<cudaStream_t>(stream), params);
}

}  // namespace fkt::cuda
