// F1: chunk-local inclusive cumulative sum of the log decay (natural log; the CPU uses exp, not exp2).
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
void fwd_gate_cumsum(const Problem& p, const ChunkPos& c, Scratch<Real>& s) {
  const int64_t K = p.K;
  for (int64_t d = 0; d < K; ++d) s.gamma[d] = s.a[d];
  for (int64_t r = 1; r < c.rows; ++r) {
    for (int64_t d = 0; d < K; ++d) s.gamma[r * K + d] = s.gamma[(r - 1) * K + d] + s.a[r * K + d];
  }
}

template void fwd_gate_cumsum<float>(const Problem&, const ChunkPos&, Scratch<float>&);
template void fwd_gate_cumsum<double>(const Problem&, const ChunkPos&, Scratch<double>&);

}  // namespace fkt::cpu
