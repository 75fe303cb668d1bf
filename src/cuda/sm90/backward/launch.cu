// Host side of the CUDA backward: recompute the forward intermediates (F1 to F4, keeping T and the
// activated inputs) unless the forward kept them (keep_forward), then B1 to B8 and the
// parameter-gradient reduction, for all heads or one head group after the other (head_groups.hpp).
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
#include "cuda/sm90/backward/head_groups.hpp"
#include "cuda/sm90/launch.cuh"
#include "cuda/sm90/tensor_map.hpp"

namespace fkt::cuda {
namespace {

BackwardParams make_params(const Problem& p, const fkt_backward_io& io) {
  Carver carver(TensorRef(io.workspace, "workspace").bytes());
  BackwardParams params{};
  const int bytes = operand_bytes(products_for(p));
  const ForwardWorkspace fwd = ForwardWorkspace::carve(carver, p, true, bytes);
  params.fwd = forward_params(p, fwd);
  params.ws = BackwardWorkspace::carve(carver, p, fwd, bytes);
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
  return params;
}

unsigned tiles(int64_t extent, int tile) { return static_cast<unsigned>(ceil_div(extent, tile)); }

// The backward summary's workspace: F1 to F3 write into the forward's part (without what only B3
// to B8 read), B1 into the backward's. One layout for sizing and for the run.
void carve_summary(Carver& m, const Problem& p, BackwardParams& params) {
  const int bytes = operand_bytes(kSummaryProducts);
  const ForwardWorkspace fwd = ForwardWorkspace::carve(m, p, false, bytes);
  params.fwd = forward_params(p, fwd);
  params.ws = BackwardWorkspace::carve(m, p, fwd, bytes);
}

// bwd_state_wgmma's arguments: the tensor maps of the rows it reads, in boxes of one chunk's tokens.
BwdStateWgmmaParams wgmma_params(const Problem& p, const BackwardParams& params) {
  const ForwardWorkspace& ws = params.fwd.ws;
  const int64_t tokens = p.B * p.T;
  BwdStateWgmmaParams wgmma{};
  wgmma.p = params;
  wgmma.k_down = row_tensor_map(ws.k_down, DType::kBF16, p.K, p.HV, p.K, tokens, p.chunk);
  wgmma.w = row_tensor_map(ws.W, DType::kBF16, p.K, p.HV, p.K, tokens, p.chunk);
  wgmma.q_up = row_tensor_map(ws.q_up, DType::kBF16, p.K, p.HV, p.K, tokens, p.chunk);
  wgmma.d_o = row_tensor_map(params.d_o, DType::kBF16, p.V, p.HV, p.V, tokens, p.chunk, params.fwd.io_HV * p.V);
  return wgmma;
}

// Whether B2 runs on wgmma (bwd_state_wgmma), given the common shape with bf16 products and a bf16
// dO: for a dO that starts 16-byte aligned (TMA copies it) and a scale s whose inverse is a normal
// float too (the pass holds dS / s).
bool backward_state_on_wgmma(const BackwardParams& params) {
  const float scale = params.fwd.scale;
  return reinterpret_cast<uintptr_t>(params.d_o) % 16 == 0 && std::isnormal(scale) && std::isnormal(1.f / scale);
}

// B2: on wgmma where backward_state_on_wgmma says so, else the mma.sync pass.
template <Products kP, typename Dims, typename DoT>
void backward_state_pass(const Problem& p, const BackwardParams& params, cudaStream_t s) {
  if constexpr (kBf16DoAtCommonShape<Dims, DoT>) {
    if (backward_state_on_wgmma(params)) {
      using L = BwdStateWgmmaLayout;
      prefer_max_shared(bwd_state_wgmma_kernel);
      return launch(bwd_state_wgmma_kernel, state_pass_grid(p, L::kTile), L::kThreads, L::launch_bytes, s,
                    wgmma_params(p, params));
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
// on wgmma (kBf16DoAtCommonShape and backward_state_on_wgmma: they store their fp32 results rounded
// to TF32, which those products read as they are), else all on mma.sync.
template <Products kP, typename Dims, typename DoT>
void wy_inter_pass(const Problem& p, const BackwardParams& params, cudaStream_t s) {
  const dim3 per_chunk(static_cast<unsigned>(ForwardWorkspace::chunks(p)), static_cast<unsigned>(p.HV));
  const int C = p.chunk, K = static_cast<int>(p.K), V = static_cast<int>(p.V);
  WyInterParams args{};
  args.p = params;
  if constexpr (kBf16DoAtCommonShape<Dims, DoT>) {
    if (!backward_state_on_wgmma(params)) {
      return launch(bwd_wy_inter_kernel<kP, RuntimeDims, DoT>, per_chunk, WyInterConfig::kThreads,
                    WyInterLayout::bytes(C, K, V, false), s, args);
    }
    const ForwardWorkspace& ws = params.fwd.ws;
    const int64_t tokens = p.B * p.T, chunks = ForwardWorkspace::chunks(p);
    args.states = block_tensor_map(ws.states, DType::kF32, V, p.HV * K, chunks, K);
    args.d_states = block_tensor_map(params.ws.d_states, DType::kF32, V, p.HV * K, chunks, K);
    args.delta = row_tensor_map(ws.delta, DType::kF32, V, p.HV, V, tokens, C);
    args.d_delta = row_tensor_map(params.ws.d_delta, DType::kF32, V, p.HV, V, tokens, C);
    args.d_o = row_tensor_map(params.d_o, DType::kBF16, V, p.HV, V, tokens, C, params.fwd.io_HV * V);
  }
  launch(bwd_wy_inter_kernel<kP, Dims, DoT>, per_chunk, WyInterConfig::kThreads,
         WyInterLayout::bytes(C, K, V, kBf16DoAtCommonShape<Dims, DoT>), s, args);
}

// B0 to B8 of the heads of p (a head group's problem and params, or the call's).
void backward_heads(const Problem& p, const BackwardParams& params, void* stream) {
  const DeviceGuard device(p.device.device_id);
  const auto s = static_cast<cudaStream_t>(stream);
  const int C = p.chunk, K = static_cast<int>(p.K), V = static_cast<int>(p.V);
  const dim3 per_chunk(static_cast<unsigned>(ForwardWorkspace::chunks(p)), static_cast<unsigned>(p.HV));

  // B0: the forward's intermediates again, keeping T and the activated inputs (no output), unless
  // the workspace is the forward's, which wrote them (keep_forward, c_api.h).
  const Products products = products_for(p);
  if (!p.keep_forward) forward_stages(p, params.fwd, products, stream);

  with_products(products, [&](auto kp) {
    constexpr Products kP = decltype(kp)::value;
    with_dims<kP>(p, [&](auto dims) {
      with_d_o_storage<kP>(params.d_o_dtype, [&](auto stored) {
        using DoT = decltype(stored);
        launch(bwd_dp_kernel<kP, decltype(dims), DoT>, per_chunk, DpConfig::kThreads, DpConfig::smem_bytes<DoT>(C, V), s,
               params);
      });
    });
    with_d_o_storage<kP>(params.d_o_dtype, [&](auto d_o) {
      with_dims<kP>(p, [&](auto dims) { backward_state_pass<kP, decltype(dims), decltype(d_o)>(p, params, s); });
    });
    with_dims<kP>(p, [&](auto dims) {
      using Dims = decltype(dims);
      with_d_o_storage<kP>(params.d_o_dtype,
                           [&](auto stored) { wy_inter_pass<kP, Dims, decltype(stored)>(p, params, s); });
      with_qk_storage<kP>(p.q.dtype, [&](auto qk) {
        with_qk_scales(p.l2norm, [&](auto scaled) {
          using Qk = decltype(qk);
          const auto kernel = bwd_intra_kernel<kP, Dims, Qk, decltype(scaled)::value>;
          prefer_max_shared(kernel);  // two blocks of about 109 KB with 16-bit q and k
          launch(kernel, per_chunk, BwdIntraConfig<Qk>::kThreads, BwdIntraLayout<Qk>(C, K).bytes, s, params);
        });
      });
    });
  });
  with_gate_element(p.g.dtype, [&](auto element) {
    launch(bwd_gate_kernel<decltype(element)>, per_chunk, BwdGateConfig::kThreads, BwdGateConfig::smem_bytes(C, K, V),
           s, params);
  });
  if (!params.qk_in_intra) {
    const int64_t qk_rows = p.B * p.T * p.H;
    launch(bwd_prepare_kernel, dim3(tiles(qk_rows, BwdPrepareConfig::kWarps)), BwdPrepareConfig::kThreads,
           BwdPrepareConfig::smem_bytes(C, K, V), s, params);
  }
  if (p.gate != GateMode::kPrecomputed && (params.dA_log || params.ddt_bias)) {
    launch(bwd_params_kernel, dim3(tiles(p.HV * p.K, BwdParamsConfig::kThreads)), BwdParamsConfig::kThreads,
           BwdParamsConfig::smem_bytes(C, K, V), s, params);
  }
}

}  // namespace

// One head group's workspace (head_groups.hpp), used by each group in turn.
uint64_t backward_workspace_bytes(const Problem& p) {
  Carver measure;
  const int bytes = operand_bytes(products_for(p));
  const Problem part = head_group_problem(p, backward_head_groups(p));
  BackwardWorkspace::carve(measure, part, ForwardWorkspace::carve(measure, part, true, bytes), bytes);
  return measure.bytes();
}

void backward(const Problem& p, const fkt_backward_io& io, void* stream) {
  FKT_CHECK(TensorRef(io.d_o, "d_o").contiguous()) << "d_o: the CUDA backend reads a contiguous gradient";
  FKT_CHECK(!io.d_final_state || TensorRef(io.d_final_state, "d_final_state").contiguous())
      << "d_final_state: the CUDA backend reads a contiguous gradient";
  const int groups = backward_head_groups(p);
  if (groups == 1) return backward_heads(p, make_params(p, io), stream);
  const Problem part = head_group_problem(p, groups);
  const BackwardParams params = make_params(part, io);
  for (int group = 0; group < groups; ++group) {
    backward_heads(part, head_group_params(params, p, part, group), stream);
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
