/* flash_kda_train: the C ABI. Framework-free; one shared library serves every caller.
 *
 * Tensors cross the boundary as DLPack tensors: fkt_tensor has exactly the layout of DLPack's
 * DLTensor (data, device, ndim, dtype, shape, strides, byte_offset), so a DLManagedTensor's
 * dl_tensor can be passed as it is. strides == NULL means compact row-major.
 *
 * Every function returns 0 on success. On failure it returns non-zero and fkt_last_error()
 * (per thread) holds "file:line: message" naming the argument, what was given and what is
 * expected. No function allocates device memory, synchronizes or copies to the host after
 * fkt_plan_sizes: callers own outputs, the workspace and the saved-for-backward buffer.
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
} fkt_options;

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
  fkt_tensor* saved;               /* uint8 [saved_bytes]: what backward reads; NULL if 0 bytes */
  fkt_tensor* workspace;           /* uint8 [forward_workspace_bytes]; NULL if 0 bytes */
} fkt_forward_outputs;

/* Upstream gradients in, gradients out. A NULL output is not computed; d_final_state may be NULL. */
typedef struct fkt_backward_io {
  const fkt_tensor* d_o;           /* [B, T, HV, V] */
  const fkt_tensor* d_final_state; /* like the final state, fp32 */
  const fkt_tensor* saved;         /* as written by fkt_forward */
  fkt_tensor* dq;                  /* like q */
  fkt_tensor* dk;                  /* like k */
  fkt_tensor* dv;                  /* like v */
  fkt_tensor* dg;                  /* like g */
  fkt_tensor* dbeta;               /* like beta */
  fkt_tensor* dA_log;              /* like A_log */
  fkt_tensor* ddt_bias;            /* like dt_bias */
  fkt_tensor* dh0;                 /* like initial_state */
  fkt_tensor* workspace;           /* uint8 [backward_workspace_bytes] */
} fkt_backward_io;

typedef struct fkt_sizes {
  uint64_t forward_workspace_bytes;
  uint64_t backward_workspace_bytes;
  uint64_t saved_bytes;
  int64_t num_sequences;           /* N */
  int64_t num_chunks;              /* NT of intermediate_states (dense: per batch row) */
  int32_t backend;                 /* the backend chosen (enum fkt_backend) */
} fkt_sizes;

FKT_API const char* fkt_last_error(void);
FKT_API const char* fkt_version(void);
/* 1 when the library was built with the CUDA backend. */
FKT_API int fkt_has_cuda(void);

/* Validates the call and sizes workspace and saved buffer; may read cu_seqlens on the host. */
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

#ifdef __cplusplus
}
#endif

#endif /* FLASH_KDA_TRAIN_C_API_H_ */
