// B1: dP = s * tril(dO delta^T) (the gradient of M_qk) and the intra part of d_delta, P^T dO.
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void bwd_dp(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t V = p.V, C = p.chunk, l = c.rows;
  const Real scale = static_cast<Real>(p.scale);
  for (int64_t r = 0; r < l; ++r) {
    const Real* dor = s.d_o + r * V;
    for (int64_t i = 0; i <= r; ++i) {
      const Real* di = s.delta + i * V;
      Real acc = 0;
      for (int64_t e = 0; e < V; ++e) acc += dor[e] * di[e];
      s.dP[r * C + i] = scale * acc;
    }
  }
  for (int64_t i = 0; i < l; ++i) {
    Real* ddi = s.d_delta + i * V;
    for (int64_t e = 0; e < V; ++e) ddi[e] = 0;
    for (int64_t r = i; r < l; ++r) {
      const Real pr = s.P[r * C + i];
      const Real* dor = s.d_o + r * V;
      for (int64_t e = 0; e < V; ++e) ddi[e] += pr * dor[e];
    }
  }
}

template void bwd_dp<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void bwd_dp<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
