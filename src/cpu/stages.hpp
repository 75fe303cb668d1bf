// The CPU backend: the chunked algorithm of kda-math.md sections 3 and 4, one stage per file,
// named as the CUDA stages are. Every stage works on one chunk of one (sequence, value head);
// matrices are row-major with the extents given in the comments (l = valid rows of the chunk).
#pragma once

#include <cstdint>

#include "core/carver.hpp"
#include "core/problem.hpp"
#include "cpu/tensor_io.hpp"

namespace fkt::cpu {

// Per-thread scratch for one chunk (and, for backward, one whole sequence of states).
template <typename Real>
struct Scratch {
  // chunk inputs after F0/F1 activation
  Real* q;      // [C, K] (l2-normalised when requested)
  Real* k;      // [C, K]
  Real* v;      // [C, V]
  Real* a;      // [C, K] activated log decay
  Real* beta;   // [C] activated beta
  // forward intermediates
  Real* gamma;  // [C, K] chunk-local cumulative log decay (natural log)
  Real* decay;  // [C, C, K] exp(gamma_r - gamma_i) for i <= r
  Real* P;      // [C, C] s * M_qk, lower triangle incl. diagonal
  Real* A;      // [C, C] diag(beta) * M_kk, strictly lower
  Real* Tinv;   // [C, C] (I + A)^-1
  Real* k_up;   // [C, K] k * exp(gamma)
  Real* k_down; // [C, K] k * exp(gamma_L - gamma)
  Real* q_up;   // [C, K] q * exp(gamma)
  Real* W;      // [C, K]
  Real* U;      // [C, V]
  Real* delta;  // [C, V] new values
  Real* o;      // [C, V]
  Real* state;  // [K, V] running state
  // backward only (null in forward)
  Real* states;       // [NT_max, K, V] state entering each chunk of the sequence
  Real* deltas;       // [L_max, V] new values of the whole sequence
  Real* d_o;          // [C, V]
  Real* dP;           // [C, C] gradient of M_qk
  Real* dA;           // [C, C] gradient of A
  Real* dT;           // [C, C]
  Real* d_delta;      // [C, V]
  Real* d_state;      // [K, V] running state gradient
  Real* d_state_next; // [K, V]
  Real* dW;           // [C, K]
  Real* Yu;           // [C, V]
  Real* Yw;           // [C, K]
  Real* dq;           // [C, K] gradient of the (normalised) q of this value head
  Real* dk;           // [C, K]
  Real* dv;           // [C, V]
  Real* dq_rows;      // [C, K] B4 row-side terms
  Real* dk_rows;      // [C, K]
  Real* dk_cols;      // [C, K] B4 column-side terms
  Real* dgamma;       // [C, K]
  Real* dbeta;        // [C]
  Real* da;           // [C, K]

  static Scratch carve(Carver& carver, const Problem& p, bool backward);
};

// Where one chunk lives: sequence, value head, chunk index, valid rows.
struct ChunkPos {
  const Sequence* seq;
  int64_t head;        // value head
  int64_t chunk;       // index inside the sequence
  int64_t first;       // first token (within the batch row)
  int64_t rows;        // valid rows l
};

// F0 + gate activation of F1: loads a chunk, normalising q and k and activating g and beta.
template <typename Real>
void fwd_prepare(const Problem& p, const ChunkPos& c, Scratch<Real>& s);
// F1: chunk-local cumulative sum of the log decay.
template <typename Real>
void fwd_gate_cumsum(const Problem& p, const ChunkPos& c, Scratch<Real>& s);
// F2: decay table, P, A and the triangular inverse T = (I + A)^-1.
template <typename Real>
void fwd_intra(const Problem& p, const ChunkPos& c, Scratch<Real>& s);
// F3: WY vectors W, U and the pre-gated keys and queries.
template <typename Real>
void fwd_wy(const Problem& p, const ChunkPos& c, Scratch<Real>& s);
// F0 to F3 of one chunk: everything the state pass and the output read.
template <typename Real>
void fwd_chunk_local(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  fwd_prepare(p, c, s);
  fwd_gate_cumsum(p, c, s);
  fwd_intra(p, c, s);
  fwd_wy(p, c, s);
}
// F4: new values from the entering state, then the state advance over the chunk.
template <typename Real>
void fwd_state_new_values(const Problem& p, const ChunkPos& c, Scratch<Real>& s);
template <typename Real>
void fwd_state_advance(const Problem& p, const ChunkPos& c, Scratch<Real>& s);
// F5: output of the chunk from the entering state and the new values.
template <typename Real>
void fwd_output(const Problem& p, const ChunkPos& c, Scratch<Real>& s);

// B1: gradient of the intra-chunk output term.
template <typename Real>
void bwd_dp(const Problem& p, const ChunkPos& c, Scratch<Real>& s);
// B2: one reverse step of the state recurrence (d_state -> d_state_next, total d_delta).
template <typename Real>
void bwd_state(const Problem& p, const ChunkPos& c, Scratch<Real>& s);
// B3: WY and inter-chunk gradients (dq, dk, dv, dbeta, dgamma partials and dA).
template <typename Real>
void bwd_wy_inter(const Problem& p, const ChunkPos& c, Scratch<Real>& s, const Real* entering_state);
// B4: intra-chunk gradients through P and A.
template <typename Real>
void bwd_intra(const Problem& p, const ChunkPos& c, Scratch<Real>& s);
// B6: reverse chunk-local cumsum of the gate gradient.
template <typename Real>
void bwd_gate_cumsum(const Problem& p, const ChunkPos& c, Scratch<Real>& s);

// Per-task partial sums of the parameter gradients, reduced in a fixed order afterwards.
struct ParamGradPartials {
  double* dA_log;    // [1] for this (sequence, value head)
  double* ddt_bias;  // [K] for this (sequence, value head)
};
// B7 + the beta half of B8: writes dv, dbeta and dg of the chunk, accumulating parameter partials.
template <typename Real>
void bwd_gate(const Problem& p, const ChunkPos& c, Scratch<Real>& s, const fkt_backward_io& io,
              ParamGradPartials partials);

// Shared elementwise math of the activations (kda-math.md sections 2.2 and 2.3).
template <typename Real>
inline Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}
template <typename Real>
inline Real softplus(Real x) {
  return x > Real(20) ? x : std::log1p(std::exp(x));
}
template <typename Real>
inline Real l2norm_rstd(const Real* x, int64_t n) {
  Real sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += x[d] * x[d];
  return Real(1) / std::sqrt(sum + Real(1e-6));
}

}  // namespace fkt::cpu
