// B6: da_t = sum of dgamma_r over r >= t inside the chunk (the adjoint of the chunk-local cumsum).
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void bwd_gate_cumsum(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t K = p.K, last = c.rows - 1;
  for (int64_t d = 0; d < K; ++d) s.da[last * K + d] = s.dgamma[last * K + d];
  for (int64_t r = last - 1; r >= 0; --r) {
    for (int64_t d = 0; d < K; ++d) s.da[r * K + d] = s.da[(r + 1) * K + d] + s.dgamma[r * K + d];
  }
}

template void bwd_gate_cumsum<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void bwd_gate_cumsum<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
