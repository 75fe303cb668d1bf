// The validated description of one chunk_kda call: shapes, dtypes, options, sequences.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.hpp"
#include "flash_kda_train/c_api.h"

namespace fkt {

// How the log decay a_t is obtained from g (kda-math.md section 2.2).
enum class GateMode { kPrecomputed, kSoftplus, kBoundedSigmoid };
// How beta is activated (kda-math.md section 2.3).
enum class BetaMode { kPlain, kSigmoid, kTwoSigmoid };
enum class Backend { kCpu, kCuda };

// One sequence: batch row b, tokens [t_begin, t_begin + length) of that row.
struct Sequence {
  int64_t b;
  int64_t t_begin;
  int64_t length;
  int64_t chunk_offset;  // row of its first chunk in intermediate_states
};

struct Problem {
  int64_t B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0;
  int64_t N = 0;            // sequences (B dense, len(cu_seqlens) - 1 varlen)
  int64_t num_chunks = 0;   // NT of intermediate_states: per batch row dense, total varlen
  int64_t max_length = 0;   // longest sequence
  bool varlen = false;
  std::vector<Sequence> sequences;

  GateMode gate = GateMode::kPrecomputed;
  BetaMode beta_mode = BetaMode::kPlain;
  double scale = 1.0;
  double lower_bound = 0.0;
  int chunk = 64;
  bool l2norm = false;
  bool state_v_first = false;
  // disable_recompute on a backend that keeps the forward's intermediates for the backward (CUDA):
  // the forward writes them into its workspace and the backward reads them from it.
  bool keep_forward = false;
  int forward_pieces = 0;   // fkt_options::forward_pieces, validated
  bool fp64 = false;        // inputs are float64: the CPU backend then computes in float64
  DType input_dtype = DType::kF32;
  Backend backend = Backend::kCpu;
  fkt_device device{FKT_DEVICE_CPU, 0};

  TensorRef q, k, v, g, beta, A_log, dt_bias, initial_state;
  TensorRef cu_seqlens;         // the offsets the planner read on the host (cu_seqlens_cpu when given)
  TensorRef cu_seqlens_device;  // varlen on CUDA: the offsets CUDA kernels read (contiguous, N + 1)

  int64_t group() const { return HV / H; }
  // DType every state tensor (initial, final, dh0, d_final_state) must have.
  DType state_dtype() const { return fp64 ? DType::kF64 : DType::kF32; }
  // Shape of one state tensor for N sequences, in its storage layout.
  std::vector<int64_t> state_shape() const;
};

// Validates the inputs and options; throws fkt::Error naming what is wrong and what is expected.
Problem make_problem(const fkt_inputs& in, const fkt_options& opt);

// Output, workspace and saved-buffer checks. `output_dtype_f64` is set for the gold oracle, whose
// outputs are float64.
void check_forward_outputs(const Problem& p, const fkt_forward_outputs& out, uint64_t workspace_bytes,
                           uint64_t saved_bytes);
void check_backward_io(const Problem& p, const fkt_backward_io& io, uint64_t workspace_bytes, uint64_t saved_bytes,
                       bool output_dtype_f64);
// A caller-owned contiguous, aligned uint8 buffer of at least `bytes` on `device` (none needed at 0).
void expect_buffer(const fkt_tensor* raw, const char* name, uint64_t bytes, const fkt_device& device);
// The upstream gradient of o: any float dtype, o's shape, q's device.
void expect_d_o(const Problem& p, const fkt_tensor* raw);
void check_gold_forward_outputs(const Problem& p, const fkt_tensor* o, const fkt_tensor* final_state);

}  // namespace fkt
