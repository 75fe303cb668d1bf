// Host side of the CUDA backward: recompute the forward intermediates (F1 to F4, keeping T and the
// activated inputs) unless the forward kept them (keep_forward), then B1 to B8 and the
// parameter-gradient reduction, for the whole call or its parts one after the other (views.hpp).
// No allocation, no copy and no synchronisation: everything is enqueued on the caller's stream.
#include <cmath>
#include <cstdint>

#include "core/error.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/device_guard.cuh"
#include "cuda/sm90/backward/bwd_dp.cuh"
#include "cuda/sm90/backward/bwd_gate.cuh"
#include "cuda/sm90/backward/bwd_intra.cuh"
#include "cuda/sm90/backward/bwd_params.cuh"
#include "cuda/sm90/backward/bwd_prepare.cuh"
#include "cuda/sm90/backward/bwd_state.cuh"
#include "cuda/sm90/backward/bwd_state_wgmma.cuh"
#include "cuda/sm90/backward/bwd_wy_inter.cuh"
#include "cuda/sm90/backward/state_passes.cuh"
#include "cuda/sm90/backward/views.hpp"
#include "cuda/sm90/launch.cuh"
#include "cuda/sm90/saved.hpp"
#include "cuda/sm90/tensor_map.hpp"

namespace fkt::cuda {
namespace {

// The arrays of the parts, after one part's workspace. With time segments: the gradients of the
// states between segments, handed from a segment to the one before (two buffers, in turn). With
// sequence groups: the group's offsets rebased to its first token. With either and the gate in the
// kernel: every part's parameter-gradient partials (one array over the call's chunks, reduced once).
struct PartArrays {
  float* carry[2];
  int64_t* group_offsets;
  double* dA_log_parts;
  double* ddt_bias_parts;
};

// The backward's workspace: that of `part` (one time segment, the largest sequence group, one head
// group, or the whole call), then the parts' arrays. One layout for sizing and for the run.
struct BackwardLayout {
  ForwardWorkspace fwd;
  BackwardWorkspace bwd;
  PartArrays parts;
};

BackwardLayout carve_backward(Carver& m, const Problem& p, const BackwardPlan& plan) {
  const int bytes = operand_bytes(products_for(p));
  const bool segmented = plan.segmented(), grouped = plan.grouped();
  const Problem part = segmented ? segment_problem(p, plan.segments.length)
                       : grouped ? sequence_group_bound(p, plan.groups)
                                 : head_group_problem(p, plan.head_groups);
  BackwardLayout layout{};
  layout.fwd = ForwardWorkspace::carve(m, part, ForwardUse::kBackward, bytes);
  layout.bwd = BackwardWorkspace::carve(m, part, layout.fwd, bytes);
  if (segmented) {
    for (float*& carry : layout.parts.carry) carry = m.take<float>(segment_state_elements(p));
  }
  if (grouped) layout.parts.group_offsets = m.take<int64_t>(part.N + 1);
  if ((segmented || grouped) && p.gate != GateMode::kPrecomputed) {
    const int64_t chunks = ForwardWorkspace::chunks(p);
    layout.parts.dA_log_parts = m.take<double>(chunks * p.HV);
    layout.parts.ddt_bias_parts = m.take<double>(chunks * p.HV * p.K);
  }
  return layout;
}

// The stages' arguments for p (the call's problem or a part's) over the workspace arrays of `layout`,
// the call's tensors in io and what the forward saved for the call.
BackwardParams make_params(const Problem& p, const fkt_backward_io& io, const BackwardLayout& layout,
                           const SavedLayout& saved) {
  BackwardParams params{};
  params.fwd = forward_params(p, layout.fwd);
  if (layout.fwd.recompute) {
    params.fwd.ws.T = saved.T;
    params.fwd.ws.P = saved.P;
  }
  params.ws = layout.bwd;
  const TensorRef d_o(io.d_o, "d_o");
  params.d_o = d_o.bytes();
  params.d_o_dtype = d_o.dtype;
  params.d_final_state = static_cast<const float*>(data_or_null(io.d_final_state, "d_final_state"));
  params.qk_in_intra = p.HV == p.H && !p.l2norm;
  params.dq = data_or_null(io.dq, "dq");
  params.dk = data_or_null(io.dk, "dk");
  params.dv = data_or_null(io.dv, "dv");
  params.dg = data_or_null(io.dg, "dg");
  params.dbeta = data_or_null(io.dbeta, "dbeta");
  params.dA_log = data_or_null(io.dA_log, "dA_log");
  params.ddt_bias = data_or_null(io.ddt_bias, "ddt_bias");
  params.dh0 = static_cast<float*>(data_or_null(io.dh0, "dh0"));
  params.dv_dtype = p.v.dtype;
  params.dbeta_dtype = p.beta.dtype;
  params.dA_log_dtype = p.A_log.dtype;
  params.ddt_bias_dtype = p.dt_bias.dtype;
  params.chunks = ForwardWorkspace::chunks(p);
  return params;
}

unsigned tiles(int64_t extent, int tile) { return static_cast<unsigned>(ceil_div(extent, tile)); }

// The backward summary's workspace: F1 to F3 write into the forward's part (without what only B3
// to B8 read), B1 into the backward's. One layout for sizing and for the run.
void carve_summary(Carver& m, const Problem& p, BackwardParams& params) {
  const int bytes = operand_bytes(kSummaryProducts);
  const ForwardWorkspace fwd = ForwardWorkspace::carve(m, p, ForwardUse::kOwn, bytes);
  params.fwd = forward_params(p, fwd);
  params.ws = BackwardWorkspace::carve(m, p, fwd, bytes);
}

// bwd_state_wgmma's arguments: the tensor maps of the rows it reads, in boxes of one chunk's tokens.
BwdStateWgmmaParams bwd_state_wgmma_params(const Problem& p, const BackwardParams& params) {
  const ForwardWorkspace& ws = params.fwd.ws;
  const int64_t tokens = p.B * p.T, io_tokens = (p.B - 1) * params.fwd.io_T + p.T;  // dO: a view's rows
  BwdStateWgmmaParams wgmma{};
  wgmma.p = params;
  wgmma.k_down = row_tensor_map(ws.k_down, DType::kBF16, p.K, p.HV, p.K, tokens, p.chunk);
  wgmma.w = row_tensor_map(ws.W, DType::kBF16, p.K, p.HV, p.K, tokens, p.chunk);
  wgmma.q_up = row_tensor_map(ws.q_up, DType::kBF16, p.K, p.HV, p.K, tokens, p.chunk);
  wgmma.d_o = row_tensor_map(params.d_o, DType::kBF16, p.V, p.HV, p.V, io_tokens, p.chunk, params.fwd.io_HV * p.V);
  FKT_CHECK(ws.P_dtype == DType::kBF16) << "internal: bwd_state_wgmma reads P in bf16, the workspace holds "
                                        << dtype_name(ws.P_dtype);
  wgmma.P = row_tensor_map(ws.P, DType::kBF16, p.chunk, p.HV, p.chunk, io_tokens, p.chunk, params.fwd.io_HV * p.chunk);
  return wgmma;
}

// Whether B2 runs on wgmma (bwd_state_wgmma), given the common shape with bf16 products and a bf16
// dO: for a dO that starts 16-byte aligned (TMA copies it) and a scale s whose inverse is a normal
// float too (the pass holds dS / s). backward_part decides it once and hands it to B1, B2 and B3,
// which split B1's work between them only where it holds.
bool backward_state_on_wgmma(const BackwardParams& params) {
  const float scale = params.fwd.scale;
  return reinterpret_cast<uintptr_t>(params.d_o) % 16 == 0 && std::isnormal(scale) && std::isnormal(1.f / scale);
}

// B2: on wgmma where backward_state_on_wgmma holds (state_wgmma), else the mma.sync pass.
template <Products kP, typename Dims, typename DoT>
void backward_state_pass(const Problem& p, const BackwardParams& params, bool state_wgmma, cudaStream_t s) {
  if constexpr (kBf16DoAtCommonShape<Dims, DoT>) {
    if (state_wgmma) {
      using L = BwdStateWgmmaLayout;
      prefer_max_shared(bwd_state_wgmma_kernel);
      return launch(bwd_state_wgmma_kernel, state_pass_grid(p, L::kTile), L::kThreads, L::launch_bytes, s,
                    bwd_state_wgmma_params(p, params));
    }
  }
  const size_t smem = BwdStateLayout::bytes(p.chunk, static_cast<int>(p.K), operand_bytes(kP), sizeof(DoT));
  with_state_residency<kP>(p, smem, [&](auto residency) {
    using R = decltype(residency);
    const auto kernel = bwd_state_kernel<kP, R, Dims, DoT>;
    if constexpr (R::blocks_per_sm > 1) prefer_max_shared(kernel);
    launch(kernel, state_pass_grid(p), R::threads, smem, s, params);
  });
}

// B3: its products with the states on wgmma where the forward's and the backward's state passes ran
// on wgmma (kBf16DoAtCommonShape and state_wgmma: they store the states and their gradients in fp16
// with row scales, delta and d_delta rounded to TF32, which those products read as they are), else
// all on mma.sync.
template <Products kP, typename Dims, typename DoT>
void wy_inter_pass(const Problem& p, const BackwardParams& params, bool state_wgmma, cudaStream_t s) {
  const dim3 per_chunk(static_cast<unsigned>(ForwardWorkspace::chunks(p)), static_cast<unsigned>(p.HV));
  const int C = p.chunk, K = static_cast<int>(p.K), V = static_cast<int>(p.V);
  WyInterParams args{};
  args.p = params;
  if constexpr (kBf16DoAtCommonShape<Dims, DoT>) {
    if (!state_wgmma) {
      return launch(bwd_wy_inter_kernel<kP, RuntimeDims, DoT>, per_chunk, WyInterConfig::kThreads,
                    WyInterLayout::bytes(C, K, V, false), s, args);
    }
    const ForwardWorkspace& ws = params.fwd.ws;
    const int64_t tokens = p.B * p.T, chunks = ForwardWorkspace::chunks(p);
    const int64_t io_tokens = (p.B - 1) * params.fwd.io_T + p.T;  // dO: a view's rows
    args.states = block_tensor_map(ws.states, DType::kF16, V, p.HV * K, chunks, K);
    args.d_states = block_tensor_map(params.ws.d_states, DType::kF16, V, p.HV * K, chunks, K);
    args.delta = row_tensor_map(ws.delta, DType::kF32, V, p.HV, V, tokens, C);
    args.d_delta = row_tensor_map(params.ws.d_delta, DType::kF32, V, p.HV, V, tokens, C);
    args.d_o = row_tensor_map(params.d_o, DType::kBF16, V, p.HV, V, io_tokens, C, params.fwd.io_HV * V);
  }
  launch(bwd_wy_inter_kernel<kP, Dims, DoT>, per_chunk, WyInterConfig::kThreads,
         WyInterLayout::bytes(C, K, V, kBf16DoAtCommonShape<Dims, DoT>), s, args);
}

// Whether B7 computes dA_log or ddt_bias (the gate in the kernel, and either asked for).
bool parameter_gradients(const Problem& p, const BackwardParams& params) {
  return p.gate != GateMode::kPrecomputed && (params.dA_log || params.ddt_bias);
}

// Whether bwd_gate takes two adjacent columns a thread: K even and the rows it reads and writes
// (dgamma, g, dg; an absent one is null) aligned for one access of two elements.
bool gate_pairs(const BackwardParams& params, size_t gate_bytes) {
  auto aligned = [](const void* x, size_t bytes) { return reinterpret_cast<uintptr_t>(x) % (2 * bytes) == 0; };
  return params.fwd.K % 2 == 0 && aligned(params.ws.dgamma, sizeof(float)) && aligned(params.fwd.gate.g, gate_bytes) &&
         aligned(params.dg, gate_bytes);
}

// B7's reduction: dA_log and ddt_bias from the partials of every chunk, in a fixed order.
void reduce_parameter_gradients(const Problem& p, const BackwardParams& params, cudaStream_t s) {
  if (!parameter_gradients(p, params)) return;
  launch(bwd_params_kernel, dim3(tiles(p.HV * (p.K + 1), BwdParamsConfig::kThreads)), BwdParamsConfig::kThreads,
         BwdParamsConfig::smem_bytes(p.chunk, static_cast<int>(p.K), static_cast<int>(p.V)), s, params);
}

// state_passes_kernel's grid: the state passes' (chunk-sequence, V-tile) grid, once for each pass
// along z.
dim3 state_passes_grid(const Problem& p) {
  dim3 grid = state_pass_grid(p, BwdStateWgmmaLayout::kTile);
  grid.z = 2;
  return grid;
}

// Blocks per SM of B0's F4 and B2 side by side (state_passes_kernel), or 0 where they run one after
// the other; for the instance of bf16 products and a bf16 dO at the common shape
// (kBf16DoAtCommonShape, where F4 always runs on wgmma), B2 on wgmma too (state_wgmma) and F4 run
// again. One where the blocks of both fit the SMs one each, two where they fit them two each (most
// SMs then hold a block of each pass, a warpgroup each). Where more blocks than that share the SMs,
// each pass's SMs are busy already and the two together took as long as one after the other
// (docs/design.md, "The backward's state passes side by side").
int state_passes_per_sm(const Problem& p, bool state_wgmma) {
  if (p.keep_forward || !state_wgmma) return 0;
  const dim3 grid = state_passes_grid(p);
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  const DeviceLimits& device = device_limits(p.device.device_id);
  const bool two_fit = 2 * (kStatePassesBytes + device.reserved_smem_per_block) <= device.smem_per_sm;
  return blocks <= device.sms ? 1 : blocks <= 2 * device.sms && two_fit ? 2 : 0;
}

// B0's F4 and B2 in one launch, `per_sm` blocks per SM (state_passes_per_sm): one asks for all the
// shared memory that a block may have, so that no two share an SM's tensor cores; two ask for what
// a block needs, under the largest carveout.
void state_passes(const Problem& p, const BackwardParams& params, int per_sm, cudaStream_t s) {
  StatePassesParams args{};
  args.forward = fwd_state_wgmma_params(p, params.fwd);
  args.backward = bwd_state_wgmma_params(p, params);
  const DeviceLimits& device = device_limits(p.device.device_id);
  const int smem = per_sm == 1 ? device.smem_per_sm - device.reserved_smem_per_block : kStatePassesBytes;
  FKT_CHECK(smem >= kStatePassesBytes) << "internal: the state passes need " << kStatePassesBytes
                                       << " bytes of shared memory a block, the device has " << smem;
  if (per_sm > 1) prefer_max_shared(state_passes_kernel);
  launch(state_passes_kernel, state_passes_grid(p), BwdStateWgmmaLayout::kThreads, smem, s, args);
}

// B0 to B8 of p (a part's problem and params, or the call's).
void backward_part(const Problem& p, const BackwardParams& params, void* stream) {
  const DeviceGuard device(p.device.device_id);
  const auto s = static_cast<cudaStream_t>(stream);
  const int C = p.chunk, K = static_cast<int>(p.K), V = static_cast<int>(p.V);
  const dim3 per_chunk(static_cast<unsigned>(ForwardWorkspace::chunks(p)), static_cast<unsigned>(p.HV));
  const bool state_wgmma = backward_state_on_wgmma(params);

  const Products products = products_for(p);
  with_products(products, [&](auto kp) {
    constexpr Products kP = decltype(kp)::value;
    with_dims<kP>(p, [&](auto dims) {
      with_d_o_storage<kP>(params.d_o_dtype, [&](auto stored) {
        using Dims = decltype(dims);
        using DoT = decltype(stored);
        // B0: the forward's intermediates again, keeping T and the activated inputs (no output),
        // unless the workspace is the forward's, which wrote them (keep_forward, c_api.h); B1 and
        // B2. Where B2 runs on wgmma, B1 is not launched: B2 forms the intra part of d_delta and B3
        // forms dP. With the state passes together: F2, then F4 beside B2.
        constexpr bool kWgmmaShape = kBf16DoAtCommonShape<Dims, DoT>;
        const int together = kWgmmaShape ? state_passes_per_sm(p, state_wgmma) : 0;
        if (together > 0) {
          forward_local_stages(p, params.fwd, products, stream);
          return state_passes(p, params, together, s);
        }
        if (!p.keep_forward) forward_stages(p, params.fwd, products, stream);
        if (!(kWgmmaShape && state_wgmma)) {
          launch(bwd_dp_kernel<kP, Dims, DoT>, per_chunk, DpConfig::kThreads, DpConfig::smem_bytes<DoT>(C, V), s,
                 params);
        }
        backward_state_pass<kP, Dims, DoT>(p, params, state_wgmma, s);
      });
    });
    with_dims<kP>(p, [&](auto dims) {
      using Dims = decltype(dims);
      with_d_o_storage<kP>(params.d_o_dtype,
                           [&](auto stored) { wy_inter_pass<kP, Dims, decltype(stored)>(p, params, state_wgmma, s); });
      with_qk_storage<kP>(p.q.dtype, [&](auto qk) {
        with_flag(p.l2norm, [&](auto scaled) {
          using Qk = decltype(qk);
          const auto kernel = bwd_intra_kernel<kP, Dims, Qk, decltype(scaled)::value>;
          prefer_max_shared(kernel);  // two blocks of about 109 KB with 16-bit q and k
          launch(kernel, per_chunk, BwdIntraConfig<Qk>::kThreads, BwdIntraLayout<Qk>(C, K).bytes, s, params);
        });
      });
    });
  });
  with_gate_element(p.g.dtype, [&](auto element) {
    using GT = decltype(element);
    with_gate_mode(p.gate, [&](auto mode) {
      with_gate_columns(gate_pairs(params, sizeof(GT)), [&](auto columns) {
        using Config = BwdGateConfig<decltype(columns)::value>;
        launch(bwd_gate_kernel<GT, decltype(mode)::value, decltype(columns)::value>, per_chunk, Config::kThreads,
               Config::smem_bytes(C, K, V), s, params);
      });
    });
  });
  if (!params.qk_in_intra) {
    const int64_t qk_rows = p.B * p.T * p.H;
    launch(bwd_prepare_kernel, dim3(tiles(qk_rows, BwdPrepareConfig::kWarps)), BwdPrepareConfig::kThreads,
           BwdPrepareConfig::smem_bytes(C, K, V), s, params);
  }
  reduce_parameter_gradients(p, params, s);
}

// A part's params whose parameter-gradient partials fill the call's array from chunk row
// `first_chunk` (none with a precomputed gate), reduced once after the last part
// (reduce_call_partials). p is the call's problem.
void partials_into_call(const Problem& p, const PartArrays& arrays, int64_t first_chunk, BackwardParams& params) {
  params.dA_log = params.ddt_bias = nullptr;
  if (p.gate == GateMode::kPrecomputed) return;
  params.ws.dA_log_parts = arrays.dA_log_parts + first_chunk * p.HV;
  params.ws.ddt_bias_parts = arrays.ddt_bias_parts + first_chunk * p.HV * p.K;
}

// dA_log and ddt_bias of the call (its params: `call`) from the parts' partials in the call's array.
void reduce_call_partials(const Problem& p, BackwardParams call, const PartArrays& arrays, void* stream) {
  call.ws.dA_log_parts = arrays.dA_log_parts;
  call.ws.ddt_bias_parts = arrays.ddt_bias_parts;
  const DeviceGuard device(p.device.device_id);
  reduce_parameter_gradients(p, call, static_cast<cudaStream_t>(stream));
}

// The time segments from the last (segments.hpp): segment s starts from the state the forward kept
// for it (the initial state for the first) and from the gradient of the state leaving it (the
// later segment's dh0, or d_final_state for the last), and writes its rows of every gradient. The
// parameter-gradient partials of segment s fill the chunk rows after those of the earlier ones,
// reduced once at the end.
void backward_segments(const Problem& p, const TimeSegments& segments, const fkt_backward_io& io,
                       const BackwardLayout& layout, const SavedLayout& saved, void* stream) {
  const PartArrays& arrays = layout.parts;
  const float* kept = saved.segment_states;
  const int64_t states = segment_state_elements(p), last = segments.count - 1;
  const int64_t segment_chunks = p.B * (segments.length / p.chunk);  // of each but the last
  for (int64_t s = last; s >= 0; --s) {
    const int64_t t0 = segments.begin(s);
    const Problem part = segment_problem(p, segments.size(s, p.T));
    BackwardParams params = view_params(make_params(part, io, layout, saved), p, t0 * p.H, t0 * p.HV, 0);
    if (s > 0) params.fwd.initial_state = kept + (s - 1) * states;
    if (s < last) params.d_final_state = arrays.carry[(s + 1) % 2];
    if (s > 0) params.dh0 = arrays.carry[s % 2];
    partials_into_call(p, arrays, s * segment_chunks, params);
    backward_part(part, params, stream);
  }
  reduce_call_partials(p, make_params(p, io, layout, saved), arrays, stream);
}

// The sequence groups in order (sequence_groups.hpp): group g reads its rebased offsets, written
// into the workspace before it runs, and writes its rows of every gradient and its sequences'
// dh0. Its parameter-gradient partials fill the rows of its chunks in the call's array, reduced once
// at the end over the call's chunks: the sums of one pass, bit for bit.
void backward_sequence_groups(const Problem& p, const SequenceGroups& groups, const fkt_backward_io& io,
                              const BackwardLayout& layout, const SavedLayout& saved, void* stream) {
  const PartArrays& arrays = layout.parts;
  for (int64_t g = 0; g < groups.count(); ++g) {
    const Problem part = sequence_group_problem(p, groups, g);
    const Sequence& first = p.sequences[groups.first[g]];
    BackwardParams params = sequence_group_view(make_params(part, io, layout, saved), part, first.t_begin,
                                                groups.first[g], arrays.group_offsets);
    rebased_offsets(p, groups.first[g], part.N, arrays.group_offsets, stream);
    partials_into_call(p, arrays, first.chunk_offset, params);
    backward_part(part, params, stream);
  }
  reduce_call_partials(p, make_params(p, io, layout, saved), arrays, stream);
}

}  // namespace

// One part's workspace (views.hpp), used by each part in turn, and the parts' arrays.
uint64_t backward_workspace_bytes(const Problem& p) {
  Carver measure;
  carve_backward(measure, p, backward_plan(p));
  return measure.bytes();
}

void backward(const Problem& p, const fkt_backward_io& io, void* stream) {
  FKT_CHECK(TensorRef(io.d_o, "d_o").contiguous()) << "d_o: the CUDA backend reads a contiguous gradient";
  FKT_CHECK(!io.d_final_state || TensorRef(io.d_final_state, "d_final_state").contiguous())
      << "d_final_state: the CUDA backend reads a contiguous gradient";
  const BackwardPlan plan = backward_plan(p);
  Carver carver(TensorRef(io.workspace, "workspace").bytes());
  const BackwardLayout layout = carve_backward(carver, p, plan);
  Carver saved_carver(p.keep_forward ? nullptr : TensorRef(io.saved, "saved").bytes());
  const SavedLayout saved = SavedLayout::carve(saved_carver, p, operand_bytes(products_for(p)));
  if (plan.segmented()) return backward_segments(p, plan.segments, io, layout, saved, stream);
  if (plan.grouped()) return backward_sequence_groups(p, plan.groups, io, layout, saved, stream);
  const int groups = plan.head_groups;
  const Problem part = head_group_problem(p, groups);
  const BackwardParams params = make_params(part, io, layout, saved);
  for (int group = 0; group < groups; ++group) {
    backward_part(part, view_params(params, p, group * part.H, group * part.HV, group * part.HV), stream);
  }
}

uint64_t cp_backward_summary_workspace_bytes(const Problem& p) {
  Carver measure;
  BackwardParams unused{};
  carve_summary(measure, p, unused);
  return measure.bytes();
}

void cp_backward_summary(const Problem& p, const fkt_tensor* d_o, int64_t sequence, float* summary, char* workspace,
                         void* stream) {
  const TensorRef grad(d_o, "d_o");
  FKT_CHECK(grad.contiguous()) << "d_o: the CUDA backend reads a contiguous gradient";
  Carver carver(workspace);
  CpBackwardSummaryParams params{};
  carve_summary(carver, p, params.bwd);
  params.bwd.d_o = grad.bytes();
  params.bwd.d_o_dtype = grad.dtype;
  params.sequence = sequence;
  params.summary = summary;
  forward_local_stages(p, params.bwd.fwd, kSummaryProducts, stream);
  const DeviceGuard device(p.device.device_id);
  const auto s = static_cast<cudaStream_t>(stream);
  // B1 on zero new values, as the CPU summary runs it: the summary must not depend on the forward
  // from the true entering state, and B1's d_delta (P^T dO) does not; its dP comes out zero, unused.
  FKT_CUDA_CHECK(cudaMemsetAsync(params.bwd.fwd.ws.delta, 0, sizeof(float) * p.B * p.T * p.HV * p.V, s));
  launch(bwd_dp_kernel<kSummaryProducts, RuntimeDims, float>,
         dim3(static_cast<unsigned>(ForwardWorkspace::chunks(p)), static_cast<unsigned>(p.HV)),
         DpConfig::kThreads, DpConfig::smem_bytes<float>(p.chunk, p.V), s, params.bwd);
  launch(cp_backward_summary_kernel, cp_summary_grid(p), 2 * StateConfig::kThreads,
         BwdStateLayout::bytes(p.chunk, p.K, operand_bytes(kSummaryProducts), sizeof(float)), s, params);
}

}  // namespace fkt::cuda
