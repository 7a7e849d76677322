// fp32 matrix products y = x @ W.T (+ bias) for CPUs without native bf16 (AVX2 + FMA), from one
// packed copy of W held either as fp32 or as bf16 (widened in registers: a decode step reads half
// the bytes, and a checkpoint stored in bf16 loses nothing).
//
// Layouts, 16 output columns per block as in gemm.h:
// * bf16: gemm.h's [ceil(N/16), P, 16, 2] pairs. A 32-bit word holds (W[c][2p], W[c][2p+1]): its
//   low half shifted up is the even K value as fp32 and the word with its low half cleared is the
//   odd one, so 8 columns' pairs widen into two vectors with one shift and one mask;
// * fp32: [ceil(N/16), K, 16], zero padded: K row k of a block is its 16 columns' W[c][k].
// A register tile is up to 6 rows of x by up to 3 blocks (2 x 8 lanes a block, 12 accumulators at
// most): for each K value the block's 16 weights are loaded once and multiplied by each row's x
// value broadcast. Threads split the columns into panels of 3 blocks, and each panel is walked down
// every row of x: the panel stays in L2 while x streams past it (a prompt chunk's x from L2 or L3, at
// ~1.3 bytes a cycle of fmas). Where many row tiles pass over a bf16 panel (prompts, large batches)
// it is widened once into a thread's fp32 copy first: no tile widens it again, and the bf16 weight
// is read from memory once a call (taking x in L2-sized chunks, it was read once a chunk). A decode
// step's few rows read the bf16 panels in place, a thread taking runs of panels: while one panel's
// row tiles compute, the next panel is prefetched into L2, so memory streams beside the arithmetic
// (at 8 rows a 6-row pass from memory, then a 2-row pass from L2 that left memory idle).
//
// A row's output never depends on the other rows of the call: every output column is one fma chain
// over k = 0, 1, ..., K-1 starting from its bias, whatever the tile's height or width, the thread
// or the weight's storage (bf16-stored weights give the bits of the same values stored as fp32).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__FMA__)
#include <immintrin.h>
#endif

#include "gemm.h"
#include "ops.h"
#include "worker_pool.h"

namespace {

using formwork::gemm::kBlock;
constexpr int64_t kPanel = 3;      // blocks per thread work unit
constexpr int64_t kTileRows = 6;   // rows of x per register tile

// 8 lanes as one value; GCC lowers them to one AVX register (to narrower vectors elsewhere)
typedef float F8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));

inline F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline F8 splat(float s) { return F8{s, s, s, s, s, s, s, s}; }

// a * b + c rounded once: an explicit fma, which -ffast-math never splits or reorders
inline F8 fma8(F8 a, F8 b, F8 c) {
#if defined(__FMA__)
  return (F8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  F8 r;
  for (int i = 0; i < 8; ++i) r[i] = std::fma(a[i], b[i], c[i]);
  return r;
#endif
}

// Where one call's operands are. x rows are strided; y is [m, n] contiguous.
struct Operands {
  const float* x;
  int64_t x_stride, m, k;
  const void* w;  // packed: uint16_t (bf16 pairs) or float
  bool bf16_weights;
  const float* bias;  // [n] or nullptr
  float* y;
  int64_t n;
  int64_t num_blocks() const { return (n + kBlock - 1) / kBlock; }
};

// The 16 weights of block b at K value k, as the lanes of columns 0-7 and 8-15: the even or the odd
// half of each pair, by k's parity (a constant where the caller steps k = 2p, 2p + 1).
struct Bf16Pairs {
  const uint16_t* w;
  int64_t block_stride;  // elements between blocks
  explicit Bf16Pairs(const Operands& op)
      : w(static_cast<const uint16_t*>(op.w)), block_stride(formwork::gemm::padded_pairs(op.k) * 2 * kBlock) {}
  void load(int64_t b, int64_t k, F8 (&column)[2]) const {
    const uint16_t* at = w + b * block_stride + k / 2 * 2 * kBlock;
    for (int h = 0; h < 2; ++h) {
      U8 pairs;
      std::memcpy(&pairs, at + 16 * h, sizeof pairs);
      column[h] = (F8)(k % 2 ? pairs & 0xFFFF0000u : pairs << 16);
    }
  }
};

// The 16 weights of block b at K value k, from K rows of 16 fp32 columns; blocks from first_block on
// (a panel widened from bf16 holds its own blocks only).
struct Fp32Rows {
  const float* w;
  int64_t block_stride, first_block = 0;
  explicit Fp32Rows(const Operands& op) : w(static_cast<const float*>(op.w)), block_stride(op.k * kBlock) {}
  Fp32Rows(const float* panel, int64_t k, int64_t first) : w(panel), block_stride(k * kBlock), first_block(first) {}
  void load(int64_t b, int64_t k, F8 (&column)[2]) const {
    const float* at = w + (b - first_block) * block_stride + k * kBlock;
    column[0] = load8(at), column[1] = load8(at + 8);
  }
};

// The next panel's bf16 weights pulled toward L2 a few lines a K pair while this panel's tiles
// compute: the memory stream then runs beside the arithmetic instead of in turns with it (a decode
// step's tiles otherwise wait on memory for the panel's first pass and leave it idle for the others).
struct Prefetch {
  const char* next = nullptr;
  const char* end = nullptr;
  int64_t lines_per_pair = 0;
  void pair() {
    for (int64_t i = 0; i < lines_per_pair && next < end; ++i, next += 64) __builtin_prefetch(next, 0, 2);  // to L2
  }
};

// blocks [b0, b0 + nb) of bf16 pairs widened once into Fp32Rows' layout at panel: when many row
// tiles pass over a panel, each then reads fp32 weights instead of widening them again
void widen_panel(const Operands& op, int64_t b0, int64_t nb, float* __restrict panel) {
  const Bf16Pairs weights(op);
  for (int64_t j = 0; j < nb; ++j) {
    const uint16_t* pairs = weights.w + (b0 + j) * weights.block_stride;
    float* rows = panel + j * op.k * kBlock;
    for (int64_t p = 0; p < op.k / 2; ++p)  // one 64-byte row of 16 pairs: K rows 2p and 2p + 1
      for (int h = 0; h < 2; ++h) {
        U8 word;
        std::memcpy(&word, pairs + p * 2 * kBlock + 16 * h, sizeof word);
        const F8 even = (F8)(word << 16), odd = (F8)(word & 0xFFFF0000u);
        std::memcpy(rows + 2 * p * kBlock + 8 * h, &even, sizeof even);
        std::memcpy(rows + (2 * p + 1) * kBlock + 8 * h, &odd, sizeof odd);
      }
    if (op.k % 2) {
      F8 column[2];
      weights.load(b0 + j, op.k - 1, column);
      std::memcpy(rows + (op.k - 1) * kBlock, column, sizeof column);
    }
  }
}

// One K value into a register tile: the 16 weights of each block loaded once, each row's x value
// broadcast, one fma per accumulator. A step keeps live only its accumulators, one block's two
// weight vectors and a broadcast (15 of AVX2's 16 registers at 6 x 1 or 2 x 3): from fp32 weights,
// the prompts' case, no accumulator spills to the stack, where each fma would wait on a store.
template <typename Weights, int MR, int NB>
__attribute__((always_inline)) inline void step(F8 (&acc)[MR][NB][2], const Weights& weights, const float* x,
                                                int64_t x_stride, int64_t b0, int64_t k) {
  for (int j = 0; j < NB; ++j) {
    F8 column[2];
    weights.load(b0 + j, k, column);
    for (int m = 0; m < MR; ++m) {
      const F8 xk = splat(x[m * x_stride + k]);
      acc[m][j][0] = fma8(column[0], xk, acc[m][j][0]);
      acc[m][j][1] = fma8(column[1], xk, acc[m][j][1]);
    }
  }
}

// rows [m0, m0 + MR) x blocks [b0, b0 + NB)
template <typename Weights, int MR, int NB>
void tile(const Operands& op, const Weights& weights, int64_t m0, int64_t b0, Prefetch& prefetch) {
  F8 acc[MR][NB][2];
  for (int j = 0; j < NB; ++j) {
    float start[kBlock] = {};
    const int64_t col = (b0 + j) * kBlock, cols = std::min<int64_t>(kBlock, op.n - col);
    if (op.bias != nullptr) std::memcpy(start, op.bias + col, cols * sizeof(float));
    for (int m = 0; m < MR; ++m) acc[m][j][0] = load8(start), acc[m][j][1] = load8(start + 8);
  }
  const float* x = op.x + m0 * op.x_stride;
  // k = 0, 1, ..., K - 1: one chain per column; stepped in pairs so that a bf16 pair's half is known
  for (int64_t p = 0; p < op.k / 2; ++p) {
    // from bf16 weights only: an L2-resident widened panel's tiles keep every register for their sums
    if constexpr (std::is_same_v<Weights, Bf16Pairs>) prefetch.pair();
    step(acc, weights, x, op.x_stride, b0, 2 * p);
    step(acc, weights, x, op.x_stride, b0, 2 * p + 1);
  }
  if (op.k % 2) step(acc, weights, x, op.x_stride, b0, op.k - 1);
  for (int j = 0; j < NB; ++j) {
    const int64_t col = (b0 + j) * kBlock, cols = std::min<int64_t>(kBlock, op.n - col);
    for (int m = 0; m < MR; ++m) {
      float* out = op.y + (m0 + m) * op.n + col;
      if (cols == kBlock) {
        std::memcpy(out, &acc[m][j][0], sizeof(F8));
        std::memcpy(out + 8, &acc[m][j][1], sizeof(F8));
      } else {
        float sums[kBlock];
        std::memcpy(sums, &acc[m][j][0], sizeof(F8));
        std::memcpy(sums + 8, &acc[m][j][1], sizeof(F8));
        std::memcpy(out, sums, cols * sizeof(float));
      }
    }
  }
}

// rows [m0, m0 + MR) x blocks [b0, b0 + nb): as many blocks per tile as 12 accumulators hold
template <typename Weights, int MR>
void tiles(const Operands& op, const Weights& weights, int64_t m0, int64_t b0, int64_t nb, Prefetch& prefetch) {
  constexpr int64_t kMaxBlocks = std::min<int64_t>(kPanel, std::max(1, 6 / MR));
  for (int64_t b = b0; b < b0 + nb; b += kMaxBlocks) {
    const int64_t blocks = std::min(kMaxBlocks, b0 + nb - b);
    if (blocks >= 3) tile<Weights, MR, (kMaxBlocks >= 3 ? 3 : 1)>(op, weights, m0, b, prefetch);
    else if (blocks == 2) tile<Weights, MR, (kMaxBlocks >= 2 ? 2 : 1)>(op, weights, m0, b, prefetch);
    else tile<Weights, MR, 1>(op, weights, m0, b, prefetch);
  }
}

template <typename Weights>
void row_tile(const Operands& op, const Weights& weights, int64_t m0, int64_t rows, int64_t b0, int64_t nb,
              Prefetch& prefetch) {
  switch (rows) {
    case 1: return tiles<Weights, 1>(op, weights, m0, b0, nb, prefetch);
    case 2: return tiles<Weights, 2>(op, weights, m0, b0, nb, prefetch);
    case 3: return tiles<Weights, 3>(op, weights, m0, b0, nb, prefetch);
    case 4: return tiles<Weights, 4>(op, weights, m0, b0, nb, prefetch);
    case 5: return tiles<Weights, 5>(op, weights, m0, b0, nb, prefetch);
    default: return tiles<Weights, 6>(op, weights, m0, b0, nb, prefetch);
  }
}

// K pairs the tiles of one panel of nb blocks step through over m rows (Prefetch's pace)
int64_t panel_pairs(int64_t m, int64_t k, int64_t nb) {
  int64_t tiles = 0;
  for (int64_t m0 = 0; m0 < m; m0 += kTileRows) {
    const int64_t rows = std::min(kTileRows, m - m0), per_tile = std::min<int64_t>(kPanel, std::max<int64_t>(1, 6 / rows));
    tiles += (nb + per_tile - 1) / per_tile;
  }
  return tiles * std::max<int64_t>(1, k / 2);
}

// Weights: how the packed copy is read (Bf16Pairs or Fp32Rows)
template <typename Weights>
void multiply(const Operands& op) {
  const Weights weights(op);
  constexpr bool kWidens = std::is_same_v<Weights, Bf16Pairs>;
  const int64_t num_blocks = op.num_blocks(), num_panels = (num_blocks + kPanel - 1) / kPanel;
  // one thread only for the smallest products; above that the helpers share the weight read, in
  // about 8 runs of panels (each panel prefetches the next of its run), claimed as threads free up
  const int64_t work = op.n * op.k * (1 + op.m / 8);
  const int64_t chunk_panels = work < (1 << 17) ? num_panels : std::max<int64_t>(1, (num_panels + 7) / 8);
  const int64_t num_chunks = (num_panels + chunk_panels - 1) / chunk_panels;
  // bf16 weights for more than a few row tiles: each panel widened once, then every row tile reads it
  const bool widen = kWidens && op.m > 2 * kTileRows;
  formwork::parallel_chunks(num_chunks, [&](int64_t chunk) {
    thread_local std::vector<float> widened;
    const int64_t last = std::min(num_panels, (chunk + 1) * chunk_panels);
    for (int64_t panel = chunk * chunk_panels; panel < last; ++panel) {
      const int64_t b0 = panel * kPanel, nb = std::min(kPanel, num_blocks - b0);
      Prefetch prefetch;
      if (kWidens && !widen && panel + 1 < last) {  // bf16 read in place: the next panel of the run
        const int64_t block_bytes = weights.block_stride * sizeof(uint16_t);
        const int64_t lines = std::min(kPanel, num_blocks - b0 - nb) * block_bytes / 64;
        const int64_t pairs = panel_pairs(op.m, op.k, nb);
        prefetch.next = static_cast<const char*>(op.w) + (b0 + nb) * block_bytes;
        prefetch.end = prefetch.next + lines * 64;
        prefetch.lines_per_pair = (lines + pairs - 1) / pairs;
      }
      if (widen) {
        widened.resize(kPanel * op.k * kBlock);
        widen_panel(op, b0, nb, widened.data());
        const Fp32Rows rows(widened.data(), op.k, b0);
        for (int64_t m0 = 0; m0 < op.m; m0 += kTileRows)
          row_tile(op, rows, m0, std::min(kTileRows, op.m - m0), b0, nb, prefetch);
        continue;
      }
      for (int64_t m0 = 0; m0 < op.m; m0 += kTileRows)
        row_tile(op, weights, m0, std::min(kTileRows, op.m - m0), b0, nb, prefetch);
    }
  });
}

}  // namespace

std::string gemm_fp32_isa() {
#if defined(__AVX2__) && defined(__FMA__)
  return "avx2_fma";
#else
  return "portable";
#endif
}

// GFLOP/s of the inner loop alone on every thread of the pool: the 6-row tile walking 60 rows of x
// down one panel of 3 blocks at the default model's K (576: x 135 KiB, the panel 54 KiB as bf16,
// 108 KiB as fp32, in L2), `repeats` tiles per thread
double gemm_fp32_inner_loop_gflops(int64_t repeats, bool bf16_weights) {
  constexpr int64_t k = 576, rows = 60;
  const int64_t threads = at::get_num_threads(), walks = std::max<int64_t>(1, repeats / (rows / kTileRows));
  const auto start = std::chrono::steady_clock::now();
  formwork::parallel_chunks(threads, [&](int64_t) {
    std::vector<float> x(rows * k, 1.f), w32(kPanel * k * kBlock, 1.f), y(rows * kPanel * kBlock);
    std::vector<uint16_t> w16(kPanel * formwork::gemm::padded_pairs(k) * 2 * kBlock, 0x3F80);
    const Operands op{x.data(), k, rows, k, bf16_weights ? static_cast<const void*>(w16.data()) : w32.data(),
                      bf16_weights, nullptr, y.data(), kPanel * kBlock};
    Prefetch none;
    for (int64_t r = 0; r < walks; ++r)
      for (int64_t m0 = 0; m0 < rows; m0 += kTileRows) {
        if (bf16_weights) tiles<Bf16Pairs, kTileRows>(op, Bf16Pairs(op), m0, 0, kPanel, none);
        else tiles<Fp32Rows, kTileRows>(op, Fp32Rows(op), m0, 0, kPanel, none);
      }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * rows * kPanel * kBlock * k * walks * threads / seconds / 1e9;
}

// weight [N, K] float -> [ceil(N/16), K, 16] float, zero padded, written straight into its one allocation
torch::Tensor pack_weight_fp32(torch::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat, "weight: 2-D float32");
  const int64_t n = weight.size(0), k = weight.size(1), num_blocks = (n + kBlock - 1) / kBlock;
  auto packed = torch::zeros({num_blocks, k, kBlock}, weight.options());
  const float* w = weight.data_ptr<float>();
  float* p = packed.data_ptr<float>();
  const int64_t row_stride = weight.stride(0), col_stride = weight.stride(1);
  at::parallel_for(0, num_blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t c = 0; c < std::min<int64_t>(kBlock, n - b * kBlock); ++c) {
        const float* row = w + (b * kBlock + c) * row_stride;
        float* column = p + b * k * kBlock + c;
        for (int64_t i = 0; i < k; ++i) column[i * kBlock] = row[i * col_stride];
      }
  });
  return packed;
}

// x [M, K] float (rows strided) times a packed [N, K] weight (pack_weight of bf16, or of float32),
// plus bias [N] float when given: [M, N] float
torch::Tensor gemm_fp32(torch::Tensor x, torch::Tensor packed, int64_t n, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.stride(1) == 1,
              "x: 2-D float32 with contiguous rows");
  const int64_t m = x.size(0), k = x.size(1), num_blocks = (n + kBlock - 1) / kBlock;
  const bool bf16_weights = packed.scalar_type() == torch::kBFloat16;
  if (bf16_weights) {
    TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.size(0) == num_blocks
                && packed.size(1) == formwork::gemm::padded_pairs(k) && packed.size(2) == kBlock && packed.size(3) == 2,
                "packed: pack_weight of an [N, K] weight, K = x's columns");
  } else {
    TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kFloat && packed.is_contiguous()
                && packed.size(0) == num_blocks && packed.size(1) == k && packed.size(2) == kBlock,
                "packed: pack_weight of an [N, K] weight, K = x's columns");
  }
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == torch::kFloat && bias->is_contiguous(),
                "bias: contiguous float32 [N]");
  }
  auto y = torch::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  if (k == 0) return bias ? y.copy_(bias->expand({m, n})) : y.zero_();
  const Operands op{x.data_ptr<float>(), x.stride(0), m, k, packed.data_ptr(), bf16_weights,
                    bias ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>(), n};
  if (bf16_weights) multiply<Bf16Pairs>(op);
  else multiply<Fp32Rows>(op);
  return y;
}
