// F5: O = s Q_up S + P delta, with S the state entering the chunk.
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void fwd_output(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t K = p.K, V = p.V, C = p.chunk;
  const Real scale = static_cast<Real>(p.scale);
  for (int64_t r = 0; r < c.rows; ++r) {
    Real* orow = s.o + r * V;
    for (int64_t e = 0; e < V; ++e) orow[e] = 0;
    for (int64_t d = 0; d < K; ++d) {
      const Real qd = scale * s.q_up[r * K + d];
      const Real* Sd = s.state + d * V;
      for (int64_t e = 0; e < V; ++e) orow[e] += qd * Sd[e];
    }
    for (int64_t i = 0; i <= r; ++i) {
      const Real pr = s.P[r * C + i];
      const Real* di = s.delta + i * V;
      for (int64_t e = 0; e < V; ++e) orow[e] += pr * di[e];
    }
  }
}

template void fwd_output<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void fwd_output<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
