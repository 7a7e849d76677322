// One paged-attention call's inputs, and the walk over a request's K or V rows in the cache blocks:
// what the kernels of paged_attention.cpp, paged_attention_bf16.h and paged_attention_avx2.h share.
//
// Layout (engine/attention/base.py): cache [2, num_blocks, block_size, num_kv_heads, head_dim];
// token t of request i lives at block_table[i][t / block_size], offset t % block_size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace formwork::paged {

constexpr int kKeys = 16;  // keys scored together, and the softmax's block
// the score of a padding lane: exp() takes it to 0 (finite: -ffast-math assumes no infinities)
constexpr float kPadScore = -1e30f;

// n scores padded to whole blocks: the row stride of a query's score rows
inline int64_t padded_keys(int64_t n) { return (n + kKeys - 1) / kKeys * kKeys; }

#if defined(__AVX512F__)
// the lanes [lo, hi) of 16, as a mask (lo, hi clamped to 0 .. 16)
inline __mmask16 lanes_between(int64_t lo, int64_t hi) {
  lo = std::clamp<int64_t>(lo, 0, kKeys), hi = std::clamp<int64_t>(hi, 0, kKeys);
  return static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
}
#endif

// a thread's buffer of at least n floats, 64-byte aligned (it only grows: no refill per item)
inline float* aligned_floats(std::vector<float>& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n + 16) buffer.resize(n + 16);
  const auto address = reinterpret_cast<uintptr_t>(buffer.data());
  return buffer.data() + ((64 - address % 64) % 64) / sizeof(float);
}

// One call's inputs as raw pointers. q and out rows are strided by token (views of the fused QKV
// projection's output); within a token, heads are contiguous rows of head_dim.
template <typename scalar_t>
struct Step {
  const scalar_t* q;
  int64_t q_stride;
  const scalar_t* k_cache;
  const scalar_t* v_cache;
  const int64_t* query_ids;
  const int32_t* block_table;  // [num_queries, max_blocks]
  const int32_t* seq_lens;
  scalar_t* out;
  int64_t out_stride, num_queries, max_blocks, block_size, num_heads, num_kv_heads, head_dim;
  float scale;
  int64_t sliding_window;  // 0: every key
  float softcap;  // 0: none

  int64_t group() const { return num_heads / num_kv_heads; }
  int64_t row_stride() const { return num_kv_heads * head_dim; }  // between consecutive tokens of a block
  // the first key this query sees: the window's start, or 0
  int64_t first_key(int64_t seq_len) const {
    return sliding_window > 0 ? std::max<int64_t>(0, seq_len - sliding_window) : 0;
  }
};

// listed queries [begin, end) that share one block-table row: the same request's keys
struct Run {
  int64_t begin, end;
};

// the step's runs of consecutive queries with equal block-table rows, at most max_run queries each
template <typename scalar_t>
std::vector<Run> query_runs(const Step<scalar_t>& st, int64_t max_run) {
  std::vector<Run> runs;
  const size_t row_bytes = st.max_blocks * sizeof(int32_t);
  for (int64_t i = 0; i < st.num_queries; ++i) {
    const int32_t* row = st.block_table + i * st.max_blocks;
    if (!runs.empty() && runs.back().end - runs.back().begin < max_run
        && std::memcmp(row, row - st.max_blocks, row_bytes) == 0)
      ++runs.back().end;
    else
      runs.push_back({i, i + 1});
  }
  return runs;
}

// One request's K or V rows at one kv head, in position order from `first`; the next block's rows
// are prefetched on entering a block (blocks lie anywhere in the cache, so the hardware prefetcher
// loses the stream at every block edge: 5-30% faster with cold caches), unless the caller prefetches
// rows itself (prefetch_blocks false). `query` names the block-table row, and its seq_len bounds the
// prefetch.
template <typename scalar_t>
class KeyRows {
 public:
  KeyRows(const Step<scalar_t>& st, const scalar_t* cache, int64_t query, int64_t kv_head, int64_t first,
          bool prefetch_blocks = true)
      : st_(st), cache_(cache + kv_head * st.head_dim), blocks_(st.block_table + query * st.max_blocks),
        num_blocks_(prefetch_blocks ? (st.seq_lens[query] + st.block_size - 1) / st.block_size : 0),
        block_(first / st.block_size), offset_(first % st.block_size) {
    enter_block();
  }

  const scalar_t* next() {
    if (offset_ == st_.block_size) {
      ++block_;
      offset_ = 0;
      enter_block();
    }
    return base_ + offset_++ * st_.row_stride();
  }

 private:
  const scalar_t* block_rows(int64_t b) const {
    return cache_ + static_cast<int64_t>(blocks_[b]) * st_.block_size * st_.row_stride();
  }
  void enter_block() {
    base_ = block_rows(block_);
    if (block_ + 1 >= num_blocks_) return;
    const char* x = reinterpret_cast<const char*>(block_rows(block_ + 1));
    const int64_t row_bytes = st_.head_dim * sizeof(scalar_t), stride = st_.row_stride() * sizeof(scalar_t);
    for (int64_t i = 0; i < st_.block_size; ++i, x += stride)
      for (int64_t d = 0; d < row_bytes; d += 64) __builtin_prefetch(x + d, 0, 3);
  }

  const Step<scalar_t>& st_;
  const scalar_t* cache_;
  const int32_t* blocks_;
  int64_t num_blocks_, block_, offset_;
  const scalar_t* base_ = nullptr;
};

}  // namespace formwork::paged
