// The per-thread scratch layout of the CPU backend (used for sizing and for carving).
#include "cpu/stages.hpp"

namespace fkt::cpu {

template <typename Real>
Scratch<Real> Scratch<Real>::carve(Carver& m, const Problem& p, bool backward) {
  const int64_t C = p.chunk, K = p.K, V = p.V;
  Scratch s{};
  s.q = m.take<Real>(C * K);
  s.k = m.take<Real>(C * K);
  s.v = m.take<Real>(C * V);
  s.a = m.take<Real>(C * K);
  s.beta = m.take<Real>(C);
  s.gamma = m.take<Real>(C * K);
  s.decay = m.take<Real>(C * C * K);
  s.P = m.take<Real>(C * C);
  s.A = m.take<Real>(C * C);
  s.Tinv = m.take<Real>(C * C);
  s.k_up = m.take<Real>(C * K);
  s.k_down = m.take<Real>(C * K);
  s.q_up = m.take<Real>(C * K);
  s.W = m.take<Real>(C * K);
  s.U = m.take<Real>(C * V);
  s.delta = m.take<Real>(C * V);
  s.o = m.take<Real>(C * V);
  s.state = m.take<Real>(K * V);
  if (!backward) return s;
  const int64_t max_chunks = (p.max_length + C - 1) / C;
  s.states = m.take<Real>(max_chunks * K * V);
  s.deltas = m.take<Real>(max_chunks * C * V);
  s.d_o = m.take<Real>(C * V);
  s.dP = m.take<Real>(C * C);
  s.dA = m.take<Real>(C * C);
  s.dT = m.take<Real>(C * C);
  s.d_delta = m.take<Real>(C * V);
  s.d_state = m.take<Real>(K * V);
  s.d_state_next = m.take<Real>(K * V);
  s.dW = m.take<Real>(C * K);
  s.Yu = m.take<Real>(C * V);
  s.Yw = m.take<Real>(C * K);
  s.dq = m.take<Real>(C * K);
  s.dk = m.take<Real>(C * K);
  s.dv = m.take<Real>(C * V);
  s.dq_rows = m.take<Real>(C * K);
  s.dk_rows = m.take<Real>(C * K);
  s.dk_cols = m.take<Real>(C * K);
  s.dgamma = m.take<Real>(C * K);
  s.dbeta = m.take<Real>(C);
  s.da = m.take<Real>(C * K);
  return s;
}

template struct Scratch<float>;
template struct Scratch<double>;

}  // namespace fkt::cpu
