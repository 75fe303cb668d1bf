// The precision of the tensor-core products (common/mma.cuh describes both), a template argument of
// every product kernel, chosen per call on the host (sm90/launch.cuh, products_for).
#pragma once

namespace fkt::cuda {

enum class Products { kSplit3, kTf32 };

// Bytes of an element of the A operands that the forward stores for the state passes (W, K_down,
// Q_up; Operand in common/mma_pairs.cuh): bf16 for kTf32, fp32 for kSplit3.
constexpr int operand_bytes(Products p) { return p == Products::kTf32 ? 2 : 4; }

// The context-parallel summaries' products, whatever the inputs: a map of the entering state as
// exact as fp32 (sm90/launch.cuh, products_for, has the op's own).
constexpr Products kSummaryProducts = Products::kSplit3;

}  // namespace fkt::cuda
