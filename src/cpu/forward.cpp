// The CPU forward: per (sequence, value head), chunk after chunk, F0 to F5.
#include "core/error.hpp"
#include "cpu/backend.hpp"
#include "cpu/driver.hpp"

namespace fkt::cpu {
namespace {

template <typename Real>
void run_forward(const Problem& p, const fkt_forward_outputs& out) {
  const int slots = num_slots(p);
  const uint64_t per_slot = slot_bytes<Real>(p, false);
  char* base = buffer_bytes(out.workspace, "workspace");
  const View o(out.o, "o"), final_state(out.final_state, "final_state"), h0(p.initial_state);
  const View h_out(out.intermediate_states, "intermediate_states");
  for_each_task(p, slots, [&](int64_t n, int64_t head, int slot) {
    Carver carver(base + slot * per_slot);
    Scratch<Real> s = Scratch<Real>::carve(carver, p, false);
    const Sequence& seq = p.sequences[n];
    load_state(p, h0, n, head, s.state);
    for (int64_t j = 0; j < num_chunks(p, seq); ++j) {
      const ChunkPos c = chunk_pos(p, seq, head, j);
      if (h_out.present()) {
        for (int64_t d = 0; d < p.K; ++d) {
          for (int64_t e = 0; e < p.V; ++e) {
            const Real value = s.state[d * p.V + e];
            const int64_t row = seq.chunk_offset + j;
            if (p.state_v_first) h_out.set<Real>(value, seq.b, row, head, e, d);
            else h_out.set<Real>(value, seq.b, row, head, d, e);
          }
        }
      }
      fwd_chunk_local(p, c, s);
      fwd_state_new_values(p, c, s);
      fwd_output(p, c, s);
      fwd_state_advance(p, c, s);
      for (int64_t r = 0; r < c.rows; ++r) {
        for (int64_t e = 0; e < p.V; ++e) o.set<Real>(s.o[r * p.V + e], seq.b, c.first + r, head, e);
      }
    }
    store_state(p, final_state, n, head, s.state);
  });
}

}  // namespace

void forward(const Problem& p, const fkt_forward_outputs& out) {
  if (p.fp64) run_forward<double>(p, out);
  else run_forward<float>(p, out);
}

}  // namespace fkt::cpu
