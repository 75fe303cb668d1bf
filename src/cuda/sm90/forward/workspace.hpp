// The workspace of the CUDA forward: what one stage hands to the next (kda-math.md section 3),
// carved by one function for sizing (on the host) and for the run.
#pragma once

#include <cstdint>

#include "core/carver.hpp"
#include "core/problem.hpp"
#include "cuda/sm90/dims.hpp"

namespace fkt::cuda {

// The states kept in fp16 (ForwardWorkspace::half_states) and their gradients take one scale per
// this many columns of a state row: the state passes' V-tile.
inline constexpr int kStateScaleCols = 64;

// Where the scales of the rows of state block `block` (chunk * HV + value head), columns from e on,
// start in state_scales or d_state_scales ([chunks, HV, V / kStateScaleCols, K]).
__host__ __device__ constexpr int64_t state_scales_at(int64_t block, int e, int V, int K) {
  return (block * (V / kStateScaleCols) + e / kStateScaleCols) * K;
}

// Which layout a forward workspace is carved in.
enum class ForwardUse {
  kOwn,       // the forward alone: P for F4 in the operands' type
  kSaving,    // the forward given `saved`, where F2 writes P for F4: no region for it here
  kBackward,  // the backward's, whose first part keep_forward's forward fills and B0 recomputes
};

struct ForwardWorkspace {
  float* gamma;            // [B*T, HV, K] chunk-local cumulative log decay, which F2 computes (F1) in
                           // shared memory and writes here for the backward's stages; nullptr in the
                           // forward's own layout
  // P holds elements of P_dtype, the operands' (bf16 for bf16 products, else fp32), in every
  // layout: F5 reads it as TF32 operands (which hold bf16 exactly) or as bf16 wgmma operands inside
  // F4, B1 widens it. In the backward's layout P and T are rows of the inputs as given ((b * io_T +
  // t) * io_HV + head, the rows that every other layout shares with the workspace): with `recompute`
  // the forward's saved ones (sm90/saved.hpp), seen through the part's view (backward/views.hpp).
  // There P's region keeps the fp32 size, which dA takes once B1 and B2 have read P.
  void* P;                 // [B*T, HV, C] s * M_qk, row = token, column = key position in its chunk (F2)
  DType P_dtype;
  // W, K_down and Q_up hold operand_bytes(products) per element (common/products.hpp): bf16 for
  // bf16 inputs. W and K_down share one region, which the backward's dk takes whole; Q_up's is
  // sized for the backward's dq (fp32) when the backward reads this layout.
  void* W;                 // [B*T, HV, K] (F3); K_up = k_hat exp(gamma) with values_from_t
  void* k_down;            // [B*T, HV, K] (F3)
  void* q_up;              // [B*T, HV, K] (F3)
  float* g_last;           // [chunks, HV, K] gamma of each chunk's last row (F2), read by F4 and B2
  float* U;                // [B*T, HV, V] (F3); nullptr with values_from_t
  float* delta;            // [B*T, HV, V] new values (F4), in U's place: F4 writes the new values
                           // of a chunk's rows and columns after reading the same rows and columns of U
  // The states hold elements of states_dtype: bf16 in the forward's own layout for bf16 products,
  // where F5 alone reads them, else fp32 (the backward's layout: B3 reads them as fp32).
  void* states;            // [chunks, HV, K, V] state entering each chunk (F4); nullptr with
                           // output_in_state_pass
  DType states_dtype;
  // The backward's layout at the common shape with bf16 products keeps the states in fp16, not
  // states_dtype, with a power-of-two scale per (state row, 64-column V-tile) in state_scales
  // (state_scales_at; fwd_state_wgmma<__half>, common/scaled_half.cuh): B3 and F5 widen them.
  bool half_states;
  float* state_scales;
  // F5 runs inside F4 (fwd_state_wgmma's output variant) where o is the last reader of the states
  // and delta: the forward's own layout at the common shape with bf16 operands. The states are not
  // kept then, and delta is not written.
  bool output_in_state_pass;
  // With output_in_state_pass, where the forward runs whole (forward_pieces: F4 not beside F2), F4's
  // blocks are at least the SMs and v is bf16 and 16-byte aligned, F4 forms the new values from K_up,
  // v and T (kda-math.md section 3): F2 writes K_up in W's place, T, and no U. Elsewhere U - W S,
  // whose F4 steps are shorter (docs/design.md, "The new values from T where F4 fills the GPU").
  bool values_from_t;
  int64_t* chunk_offsets;  // [N + 1] first chunk of each sequence (varlen)
  // [N] varlen: the sequences by decreasing chunk count, ties in order (chunk_offsets_kernel; the
  // identity past ChunkOffsetsConfig::kMostOrdered sequences), so that the wgmma state passes'
  // blocks take the longest sequences first (WgmmaStateBlock).
  int32_t* sequence_order;
  // The backward's recompute (B0) of a forward that saved T and P: F2 reads T instead of forming
  // P, A and the inverse. Neither is carved then: the backward points P and T at `saved`, as a
  // forward that saves them (`p_saved`) points P.
  bool recompute;
  // For the backward (written by F2 in the forward: into `saved` in its own layout, into the
  // workspace with keep_forward; read by F2 with recompute), and for F4 with values_from_t (in the
  // forward's own layout, when nothing is saved); nullptr otherwise:
  float* T;                // [B*T, HV, C] (I + A)^-1 of each chunk, row = token
  // q_hat = q * scale_q and k_hat = k * scale_k, formed by the backward's stages from q and k as
  // F2 forms them: the row scales of use_qk_l2norm_in_kernel, nullptr without it (scale 1).
  float* scale_q;          // [B*T, H] per (token, query/key head)
  float* scale_k;          // [B*T, H]
  float* beta_act;         // [B*T, HV] activated beta

  static int64_t chunks(const Problem& p) { return p.varlen ? p.num_chunks : p.B * p.num_chunks; }

  // from_t: F4 may form the new values from T (the forward runs whole and F4's blocks fill the SMs).
  static ForwardWorkspace carve(Carver& m, const Problem& p, ForwardUse use, int operand_bytes, bool from_t = false) {
    const bool for_backward = use == ForwardUse::kBackward;
    const int64_t rows = p.B * p.T * p.HV;
    ForwardWorkspace w{};
    // The forward's own layout with bf16 operands, where F5 is the last reader: the states in bf16.
    const bool compact = !for_backward && operand_bytes == 2;
    w.output_in_state_pass = compact && CommonDims::matches(p);
    // From T, F4 copies v's rows by TMA: bf16, 16-byte aligned.
    const bool v_by_tma = p.v.dtype == DType::kBF16 && reinterpret_cast<uintptr_t>(p.v.bytes()) % 16 == 0;
    w.values_from_t = w.output_in_state_pass && from_t && v_by_tma;
    w.states_dtype = compact ? DType::kBF16 : DType::kF32;
    w.P_dtype = operand_bytes == 2 ? DType::kBF16 : DType::kF32;
    w.recompute = for_backward && !p.keep_forward;
    w.gamma = for_backward ? m.take<float>(rows * p.K) : nullptr;
    const int64_t p_bytes = for_backward ? static_cast<int64_t>(sizeof(float)) : operand_bytes;
    w.P = w.recompute || use == ForwardUse::kSaving ? nullptr : m.take<char>(rows * p.chunk * p_bytes);
    // K_down's start, aligned as every carved array's.
    const auto operand = static_cast<int64_t>(Carver::aligned(static_cast<size_t>(rows * p.K * operand_bytes)));
    char* w_kd = m.take<char>(2 * operand);
    w.W = w_kd;
    w.k_down = w_kd + operand;
    const int64_t q_up_bytes = for_backward ? static_cast<int64_t>(sizeof(float)) : operand_bytes;
    w.q_up = m.take<char>(rows * p.K * q_up_bytes);
    w.U = w.values_from_t ? nullptr : m.take<float>(rows * p.V);
    w.delta = w.U;
    w.half_states = for_backward && operand_bytes == 2 && CommonDims::matches(p);
    const int64_t states_bytes = w.half_states ? 2 : dtype_bytes(w.states_dtype);
    w.states = w.output_in_state_pass ? nullptr : m.take<char>(chunks(p) * p.HV * p.K * p.V * states_bytes);
    if (w.half_states) w.state_scales = m.take<float>(state_scales_at(chunks(p) * p.HV, 0, p.V, p.K));
    w.g_last = m.take<float>(chunks(p) * p.HV * p.K);
    w.chunk_offsets = m.take<int64_t>(p.N + 1);
    w.sequence_order = m.take<int32_t>(p.N);
    if (for_backward) {
      w.T = w.recompute ? nullptr : m.take<float>(rows * p.chunk);
      if (p.l2norm) {
        w.scale_q = m.take<float>(p.B * p.T * p.H);
        w.scale_k = m.take<float>(p.B * p.T * p.H);
      }
      w.beta_act = m.take<float>(rows);
    } else if (w.values_from_t && use == ForwardUse::kOwn) {
      w.T = m.take<float>(rows * p.chunk);
    }
    return w;
  }
};

}  // namespace fkt::cuda
