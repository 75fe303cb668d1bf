// The CPU backward: per (sequence, value head) it recomputes the forward (states entering each
// chunk and the new values), then walks the chunks in reverse: B1, B2, B3, B4, B6, B7. The GVA
// reduction and l2norm backward (B5, B8) and the parameter-gradient sums follow in a fixed order.
#include "core/error.hpp"
#include "cpu/backend.hpp"
#include "cpu/driver.hpp"

namespace fkt::cpu {

template <typename Real>
void bwd_prepare(const Problem& p, const Real* dq_heads, const Real* dk_heads, const fkt_backward_io& io);

namespace {

template <typename Real>
void recompute_forward(const Problem& p, const Sequence& seq, int64_t n, int64_t head, Scratch<Real>& s) {
  load_state(p, View(p.initial_state), n, head, s.state);
  const int64_t KV = p.K * p.V;
  for (int64_t j = 0; j < num_chunks(p, seq); ++j) {
    const ChunkPos c = chunk_pos(p, seq, head, j);
    fwd_chunk_local(p, c, s);
    fwd_state_new_values(p, c, s);
    std::copy(s.state, s.state + KV, s.states + j * KV);
    std::copy(s.delta, s.delta + c.rows * p.V, s.deltas + j * p.chunk * p.V);
    fwd_state_advance(p, c, s);
  }
}

template <typename Real>
void run_backward(const Problem& p, const fkt_backward_io& io) {
  const int slots = num_slots(p);
  const uint64_t per_slot = slot_bytes<Real>(p, true);
  char* base = buffer_bytes(io.workspace, "workspace");
  Carver globals_carver(base);
  const BackwardGlobals<Real> globals = BackwardGlobals<Real>::carve(globals_carver, p);
  char* slot_base = base + globals_carver.bytes();
  const View d_o(io.d_o, "d_o"), d_ht(io.d_final_state, "d_final_state"), dh0(io.dh0, "dh0");

  for_each_task(p, slots, [&](int64_t n, int64_t head, int slot) {
    Carver carver(slot_base + slot * per_slot);
    Scratch<Real> s = Scratch<Real>::carve(carver, p, true);
    const Sequence& seq = p.sequences[n];
    const int64_t K = p.K, V = p.V, KV = p.K * p.V;
    recompute_forward(p, seq, n, head, s);
    load_state(p, d_ht, n, head, s.d_state);
    const ParamGradPartials partials{globals.dA_log_parts + n * p.HV + head,
                                     globals.ddt_bias_parts + (n * p.HV + head) * K};
    partials.dA_log[0] = 0;
    std::fill(partials.ddt_bias, partials.ddt_bias + K, 0.0);
    for (int64_t j = num_chunks(p, seq) - 1; j >= 0; --j) {
      const ChunkPos c = chunk_pos(p, seq, head, j);
      fwd_chunk_local(p, c, s);
      std::copy(s.deltas + j * p.chunk * V, s.deltas + (j * p.chunk + c.rows) * V, s.delta);
      for (int64_t r = 0; r < c.rows; ++r) {
        for (int64_t e = 0; e < V; ++e) s.d_o[r * V + e] = d_o.get<Real>(seq.b, c.first + r, head, e);
      }
      bwd_dp(p, c, s);
      bwd_state(p, c, s);
      bwd_wy_inter(p, c, s, s.states + j * KV);
      bwd_intra(p, c, s);
      bwd_gate_cumsum(p, c, s);
      bwd_gate(p, c, s, io, partials);
      for (int64_t r = 0; r < c.rows; ++r) {
        const int64_t row = ((seq.b * p.T + c.first + r) * p.HV + head) * K;
        std::copy(s.dq + r * K, s.dq + (r + 1) * K, globals.dq_heads + row);
        std::copy(s.dk + r * K, s.dk + (r + 1) * K, globals.dk_heads + row);
      }
      std::swap(s.d_state, s.d_state_next);
    }
    store_state(p, dh0, n, head, s.d_state);
  });

  bwd_prepare<Real>(p, globals.dq_heads, globals.dk_heads, io);
  const View dA_log(io.dA_log, "dA_log"), ddt_bias(io.ddt_bias, "ddt_bias");
  for (int64_t head = 0; head < p.HV; ++head) {
    double sum = 0;
    for (int64_t n = 0; n < p.N; ++n) sum += globals.dA_log_parts[n * p.HV + head];
    if (dA_log.present()) dA_log.set_flat<double>(head, sum);
    for (int64_t d = 0; d < p.K; ++d) {
      double bias_sum = 0;
      for (int64_t n = 0; n < p.N; ++n) bias_sum += globals.ddt_bias_parts[(n * p.HV + head) * p.K + d];
      if (ddt_bias.present()) ddt_bias.set_flat<double>(head * p.K + d, bias_sum);
    }
  }
}

}  // namespace

void backward(const Problem& p, const fkt_backward_io& io) {
  if (p.fp64) run_backward<double>(p, io);
  else run_backward<float>(p, io);
}

}  // namespace fkt::cpu
