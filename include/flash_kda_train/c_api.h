/* flash_kda_train: the C ABI. Framework-free; one shared library serves every caller.
 *
 * Tensors cross the boundary as DLPack tensors: fkt_tensor has exactly the layout of DLPack's
 * DLTensor (data, device, ndim, dtype, shape, strides, byte_offset), so a DLManagedTensor's
 * dl_tensor can be passed as it is. strides == NULL means compact row-major.
 *
 * Every function returns 0 on success. On failure it returns non-zero and fkt_last_error()
 * (per thread) holds "file:line: message" naming the argument, what was given and what is
 * expected. No function allocates device memory, synchronizes or copies to the host after
 * fkt_plan_sizes: callers own outputs and the workspace, which overlap no input (the CUDA forward
 * in time slices refuses a final_state that overlaps initial_state, which it reads meanwhile). The
 * backward recomputes what it needs from the inputs; what passes from fkt_forward to fkt_backward
 * besides them is `saved` (fkt_sizes.saved_bytes, when not 0), or the forward's workspace itself
 * with backward_reads_forward_workspace.
 */
#ifndef FLASH_KDA_TRAIN_C_API_H_
#define FLASH_KDA_TRAIN_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FKT_API __declspec(dllexport)
#else
#define FKT_API __attribute__((visibility("default")))
#endif

/* DLPack device types and dtype codes used here (values fixed by the DLPack ABI). */
enum { FKT_DEVICE_CPU = 1, FKT_DEVICE_CUDA = 2 };
enum { FKT_DTYPE_INT = 0, FKT_DTYPE_FLOAT = 2, FKT_DTYPE_BFLOAT = 4 };

typedef struct fkt_device {
  int32_t device_type;
  int32_t device_id;
} fkt_device;

typedef struct fkt_dtype {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} fkt_dtype;

typedef struct fkt_tensor {
  void* data;
  fkt_device device;
  int32_t ndim;
  fkt_dtype dtype;
  int64_t* shape;
  int64_t* strides; /* in elements; NULL = compact row-major */
  uint64_t byte_offset;
} fkt_tensor;

enum fkt_backend { FKT_BACKEND_AUTO = 0, FKT_BACKEND_CPU = 1, FKT_BACKEND_CUDA = 2 };

/* The options of chunk_kda (kda-math.md section 1.2); scale is already resolved. */
typedef struct fkt_options {
  double scale;
  double lower_bound;              /* read only when has_lower_bound */
  int32_t has_lower_bound;
  int32_t chunk_size;              /* 32 or 64 */
  int32_t use_qk_l2norm_in_kernel;
  int32_t use_gate_in_kernel;
  int32_t use_beta_sigmoid_in_kernel;
  int32_t allow_neg_eigval;
  int32_t safe_gate;
  int32_t disable_recompute;
  int32_t state_v_first;
  int32_t backend;                 /* enum fkt_backend */
  /* How many pieces of its chunks the CUDA forward of dense inputs runs in (docs/design.md, "The
   * forward in pieces"): 0 or 1, the whole call at once; 2 to FKT_MOST_FORWARD_PIECES, up to that
   * many, F4 of one piece beside F2 of the next, the same bits as the whole call; -1, the planner's
   * choice, which may also run the pieces side by side from the states of an exact scan (results
   * within fp32 rounding of the whole call's). Other backends and calls ignore it. */
  int32_t forward_pieces;
} fkt_options;

#define FKT_MOST_FORWARD_PIECES 16

/* Inputs of chunk_kda. Optional tensors are NULL when absent. */
typedef struct fkt_inputs {
  const fkt_tensor* q;             /* [B, T, H, K] */
  const fkt_tensor* k;             /* [B, T, H, K] */
  const fkt_tensor* v;             /* [B, T, HV, V] */
  const fkt_tensor* g;             /* [B, T, HV, K] log decay, or raw gate with use_gate_in_kernel */
  const fkt_tensor* beta;          /* [B, T, HV] */
  const fkt_tensor* A_log;         /* HV elements, may be NULL */
  const fkt_tensor* dt_bias;       /* HV*K elements, may be NULL */
  const fkt_tensor* initial_state; /* [N, HV, K, V] ([N, HV, V, K] if state_v_first), may be NULL */
  const fkt_tensor* cu_seqlens;    /* [N+1] int32/int64, may be NULL */
  const fkt_tensor* cu_seqlens_cpu;/* host copy of cu_seqlens, may be NULL */
} fkt_inputs;

typedef struct fkt_forward_outputs {
  fkt_tensor* o;                   /* [B, T, HV, V], q's dtype */
  fkt_tensor* final_state;         /* like initial_state, fp32; NULL if not requested */
  fkt_tensor* intermediate_states; /* [B, NT, HV, K, V] input dtype; NULL if not requested */
  fkt_tensor* workspace;           /* uint8 [forward_workspace_bytes], or
                                    * [saving_forward_workspace_bytes] with `saved`; NULL if 0 bytes */
  fkt_tensor* saved;               /* uint8 [saved_bytes], written for fkt_backward; NULL if 0 bytes,
                                    * or when no fkt_backward follows (the forward then keeps nothing) */
} fkt_forward_outputs;

/* Upstream gradients in, gradients out. A NULL output is not computed; d_final_state may be NULL. */
typedef struct fkt_backward_io {
  const fkt_tensor* d_o;           /* [B, T, HV, V] */
  const fkt_tensor* d_final_state; /* like the final state, fp32 */
  fkt_tensor* dq;                  /* like q */
  fkt_tensor* dk;                  /* like k */
  fkt_tensor* dv;                  /* like v */
  fkt_tensor* dg;                  /* like g */
  fkt_tensor* dbeta;               /* like beta */
  fkt_tensor* dA_log;              /* like A_log */
  fkt_tensor* ddt_bias;            /* like dt_bias */
  fkt_tensor* dh0;                 /* like initial_state */
  fkt_tensor* workspace;           /* uint8 [backward_workspace_bytes] */
  const fkt_tensor* saved;         /* the forward's `saved`, unmodified; NULL if 0 bytes */
} fkt_backward_io;

typedef struct fkt_sizes {
  uint64_t forward_workspace_bytes;
  uint64_t backward_workspace_bytes;
  int64_t num_sequences;           /* N */
  int64_t num_chunks;              /* NT of intermediate_states (dense: per batch row) */
  int32_t backend;                 /* the backend chosen (enum fkt_backend) */
  /* 1 when the backward reads the forward's intermediates instead of recomputing them (the option
   * disable_recompute on the CUDA backend): both workspace sizes are then equal, and fkt_backward
   * must get, as its workspace, the buffer fkt_forward was given, unmodified, with the same inputs
   * and options; it writes gradients over intermediates there, so the buffer serves one
   * fkt_backward. 0: the backward recomputes and its workspace is any buffer of its size. */
  int32_t backward_reads_forward_workspace;
  /* Bytes the forward writes into its `saved` output and the backward reads, with the same inputs
   * and options (any number of backwards): on CUDA, T = (I + A)^-1 (fp32) and P (in the products'
   * operand type) of every chunk, so that the backward's recompute forms neither, and the fp32
   * states at the starts of the time segments that the backward runs one after the other in one
   * segment's workspace (dense inputs of many chunks). 0: nothing passes. */
  uint64_t saved_bytes;
  /* Bytes of the forward's workspace when it is given `saved`, at most forward_workspace_bytes: on
   * CUDA the forward then forms P (and T, where its state pass forms the new values from T) in
   * `saved`, where it would otherwise need room for them in the workspace. */
  uint64_t saving_forward_workspace_bytes;
} fkt_sizes;

FKT_API const char* fkt_last_error(void);
FKT_API const char* fkt_version(void);
/* 1 when the library was built with the CUDA backend. */
FKT_API int fkt_has_cuda(void);

/* Validates the call and sizes the workspaces; may read cu_seqlens on the host. */
FKT_API int fkt_plan_sizes(const fkt_inputs* in, const fkt_options* opt, fkt_sizes* sizes);
FKT_API int fkt_forward(const fkt_inputs* in, const fkt_options* opt, fkt_forward_outputs* out,
                        void* stream);
FKT_API int fkt_backward(const fkt_inputs* in, const fkt_options* opt, fkt_backward_io* io,
                         void* stream);

/* The fp64 token-by-token recurrence and its exact backward (the gold oracle, CPU only).
 * Inputs of any supported float dtype; every output is float64 and shaped like its fp32 twin. */
FKT_API int fkt_gold_forward(const fkt_inputs* in, const fkt_options* opt, fkt_tensor* o,
                             fkt_tensor* final_state);
FKT_API int fkt_gold_backward(const fkt_inputs* in, const fkt_options* opt, fkt_backward_io* io);

/* Test hooks, not part of the chunk_kda contract: each runs one stage alone on the device of the
 * inputs (the CPU twin for CPU tensors, the CUDA kernel for CUDA tensors), so that every CUDA stage
 * can be compared with its CPU twin. Inputs are validated as for fkt_forward. On CUDA with
 * cu_seqlens, pass both cu_seqlens (on the device, read by the kernel) and cu_seqlens_cpu (the
 * same offsets on the host, read by the planner). */

/* F1 (kda-math.md section 3.3): gamma [B, T, HV, K] float32, contiguous = the chunk-local inclusive
 * cumulative sum of the activated log decay, in natural log (not yet scaled to base 2). */
FKT_API int fkt_stage_gate_cumsum(const fkt_inputs* in, const fkt_options* opt, fkt_tensor* gamma,
                                  void* stream);

/* Context parallelism (kda-math.md section 9). Each rank of a process group holds a contiguous slice
 * of the packed token stream; a sequence cut by slice edges continues across ranks. The state
 * recurrence over a sequence slice is affine, so a rank summarises one sequence as a map that the
 * others apply, and the caller exchanges the summaries (one all-gather per direction, e.g. with
 * torch.distributed). Everything below is exact in floating point: nothing is truncated by decay.
 *
 * A summary is a contiguous tensor [HV, K, V + K] of the state dtype (float32; float64 for float64
 * inputs), always in the [K, ...] layout whatever state_v_first says:
 *   forward  [S_ext | M]:   S_out = M S_in + S_ext over the sequence, where
 *            M = prod_j (Diag(exp(Gamma_L,j)) - K_down_j^T W_j)   (K x K, later chunks on the left)
 *            S_ext = the state after the sequence from a zero initial state (K x V).
 *   backward [dS_ext | dM]: dS_in = dM dS_out + dS_ext, where
 *            dM = prod_j (Diag(exp(Gamma_L,j)) - W_j^T K_down_j)  (earlier chunks on the left)
 *            dS_ext = the gradient of the state entering the sequence for a zero gradient of the
 *            state leaving it (it holds the d_o contributions of the sequence).
 * An empty sequence has the summary [0 | I].
 *
 * The summaries read the inputs exactly as fkt_forward does (validated the same way) and summarise
 * sequence `sequence` (0 <= sequence < N; dense inputs: batch row) alone; initial_state is not read.
 * Workspace: a uint8 buffer of the size fkt_cp_plan_sizes returns (NULL when 0 bytes). CUDA tensors
 * run on the CUDA backend (its supported configurations), enqueued on `stream` like fkt_forward. */

typedef struct fkt_cp_sizes {
  uint64_t forward_summary_workspace_bytes;
  uint64_t backward_summary_workspace_bytes;
  int32_t backend;                 /* the backend chosen (enum fkt_backend) */
} fkt_cp_sizes;

FKT_API int fkt_cp_plan_sizes(const fkt_inputs* in, const fkt_options* opt, fkt_cp_sizes* sizes);
FKT_API int fkt_cp_forward_summary(const fkt_inputs* in, const fkt_options* opt, int64_t sequence,
                                   fkt_tensor* summary, fkt_tensor* workspace, void* stream);
/* d_o: [B, T, HV, V], the gradient of o (any float dtype, as for fkt_backward). */
FKT_API int fkt_cp_backward_summary(const fkt_inputs* in, const fkt_options* opt, const fkt_tensor* d_o,
                                    int64_t sequence, fkt_tensor* summary, fkt_tensor* workspace,
                                    void* stream);

enum fkt_cp_direction { FKT_CP_FORWARD = 0, FKT_CP_BACKWARD = 1 };

/* Applies gathered summaries [R, HV, K, V + K] (contiguous, float32 or float64) of ranks
 * first .. first + count - 1 to a zero state and writes the result to `state`, one sequence's state
 * [HV, K, V] ([HV, V, K] if state_v_first) of the summaries' dtype, contiguous, same device:
 *   FKT_CP_FORWARD:  S = 0;  for r = first .. first + count - 1 (nearest last):  S = M_r S + S_ext_r
 *                    (the state entering a sequence that started count ranks earlier);
 *   FKT_CP_BACKWARD: dS = 0; for r = first + count - 1 down to first (nearest last):
 *                    dS = dM_r dS + dS_ext_r (the gradient of the state leaving a sequence that
 *                    continues on count later ranks).
 * count == 0 writes zeros. No workspace. CUDA tensors: float32, K, V <= 128, enqueued on `stream`. */
FKT_API int fkt_cp_fold(const fkt_tensor* summaries, int64_t first, int64_t count, int32_t direction,
                        int32_t state_v_first, fkt_tensor* state, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* FLASH_KDA_TRAIN_C_API_H_ */
