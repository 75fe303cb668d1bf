// Workspace sizes of the CPU backend: one scratch slot per thread (plus the backward globals).
#include "cpu/backend.hpp"
#include "cpu/driver.hpp"

namespace fkt::cpu {
namespace {

template <typename Real>
Sizes sizes_for(const Problem& p) {
  Carver globals;
  BackwardGlobals<Real>::carve(globals, p);
  const uint64_t slots = static_cast<uint64_t>(num_slots(p));
  return {slots * slot_bytes<Real>(p, false), globals.bytes() + slots * slot_bytes<Real>(p, true)};
}

}  // namespace

int num_slots(const Problem& p) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_threads(), p.N * p.HV)));
}

Sizes plan_sizes(const Problem& p) { return p.fp64 ? sizes_for<double>(p) : sizes_for<float>(p); }

}  // namespace fkt::cpu
