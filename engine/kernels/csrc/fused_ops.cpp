// The decoder's elementwise steps, fused, for CPUs: residual add + RMSNorm, SiLU-and-multiply,
// rotary embedding in place. In torch each of these is several ops, and with OMP_WAIT_POLICY=PASSIVE
// every op over more than 32K elements wakes the sleeping OpenMP threads (about 50 us a wake on this
// VM, measured), which at 64 decodes cost more than the arithmetic. Here a decode batch runs on the
// calling thread; only prompt-sized inputs are split across threads, on the same helpers as the GEMM
// and the attention (worker_pool.h), so that a prefill's kernels share one set of threads instead of
// two pools taking turns on the cores. Math is fp32 for every dtype.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "conversions.h"
#include "worker_pool.h"

namespace {

using formwork::from_float;
using formwork::to_float;

// rows per thread: a decode batch (<= a few hundred rows of a few thousand values) stays on one thread
constexpr int64_t kRowGrain = 256;

// fn(begin, end) over [0, rows) in pieces of kRowGrain rows, split across the kernels' helpers
template <typename Fn>
void for_row_chunks(int64_t rows, const Fn& fn) {
  formwork::parallel_chunks((rows + kRowGrain - 1) / kRowGrain, [&](int64_t chunk) {
    fn(chunk * kRowGrain, std::min(rows, (chunk + 1) * kRowGrain));
  });
}

// 16 floats as one value: GCC lowers the arithmetic to whatever vectors the target has, lane by
// lane, and never re-vectorizes (or re-splits) a loop over it
typedef float Lanes __attribute__((vector_size(64)));
constexpr int kLanes = 16;

// The sum of the squares of row[0, n), in one fixed order: 16 partial sums over whole blocks, the
// tail's squares added into lanes 0.., then a fixed tree. A row's norm is then the same bits
// whatever row of the batch it is and wherever the buffers lie (an `omp simd` reduction may split
// its lanes by the address of the data).
float sum_of_squares(const float* row, int64_t n) {
  Lanes acc = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Lanes v;
    std::memcpy(&v, row + i, sizeof v);
    acc += v * v;
  }
  float tail[kLanes] = {};
  for (int l = 0; i < n; ++i, ++l) tail[l] = row[i] * row[i];
  Lanes t;
  std::memcpy(&t, tail, sizeof t);
  acc += t;
  float lanes[kLanes];
  std::memcpy(lanes, &acc, sizeof lanes);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0];
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, ": 2-D with contiguous rows");
}

}  // namespace

// residual += delta (when given), then returns rms_norm(residual) * weight. residual: [n, H] updated in place.
torch::Tensor add_rms_norm(torch::Tensor residual, c10::optional<torch::Tensor> delta, torch::Tensor weight,
                           double eps) {
  check_rows(residual, "residual");
  TORCH_CHECK(residual.is_contiguous() && weight.is_contiguous() && weight.numel() == residual.size(1),
              "residual contiguous, weight [H]");
  if (delta) {
    check_rows(*delta, "delta");
    TORCH_CHECK(delta->sizes() == residual.sizes() && delta->scalar_type() == residual.scalar_type(),
                "delta: the residual's shape and dtype");
  }
  TORCH_CHECK(weight.scalar_type() == residual.scalar_type(), "weight: the residual's dtype");
  auto out = torch::empty_like(residual);
  const int64_t rows = residual.size(0), hidden = residual.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, residual.scalar_type(), "add_rms_norm", [&] {
    scalar_t* res = residual.data_ptr<scalar_t>();
    const scalar_t* add = delta ? delta->data_ptr<scalar_t>() : nullptr;
    const int64_t add_stride = delta ? delta->stride(0) : 0;
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for_row_chunks(rows, [&](int64_t begin, int64_t end) {
      std::vector<float> row_buffer(hidden);
      float* __restrict row = row_buffer.data();
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* __restrict res_row = res + r * hidden;
        if (add) {  // the residual rounds to its dtype first: normalize what it now holds, as the unfused ops do
          const scalar_t* __restrict add_row = add + r * add_stride;
          _Pragma("omp simd")
          for (int64_t i = 0; i < hidden; ++i) res_row[i] = from_float<scalar_t>(to_float(res_row[i]) + to_float(add_row[i]));
        }
        _Pragma("omp simd")
        for (int64_t i = 0; i < hidden; ++i) row[i] = to_float(res_row[i]);
        const float inv_rms = 1.f / std::sqrt(sum_of_squares(row, hidden) / hidden + static_cast<float>(eps));
        scalar_t* __restrict o_row = o + r * hidden;
        _Pragma("omp simd")
        for (int64_t i = 0; i < hidden; ++i) o_row[i] = from_float<scalar_t>(row[i] * inv_rms * to_float(w[i]));
      }
    });
  });
  return out;
}

// gate_up: [n, 2I] (gate, then up) -> silu(gate) * up: [n, I]
torch::Tensor silu_and_mul(torch::Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up: an even number of columns");
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2, in_stride = gate_up.stride(0);
  auto out = torch::empty({rows, inter}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* in = gate_up.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for_row_chunks(rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* __restrict gate = in + r * in_stride;
        const scalar_t* __restrict up = gate + inter;
        scalar_t* __restrict o_row = o + r * inter;
        _Pragma("omp simd")
        for (int64_t i = 0; i < inter; ++i) {
          const float g = to_float(gate[i]);
          o_row[i] = from_float<scalar_t>(g / (1.f + std::exp(-g)) * to_float(up[i]));
        }
      }
    });
  });
  return out;
}

// Rotates the first num_rotated heads of each row of qkv in place ("rotate half" convention):
// qkv: [n, >= num_rotated * head_dim] (q heads, then k heads, then anything); cos, sin: [n, head_dim].
void rotary_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t num_rotated, int64_t head_dim) {
  check_rows(qkv, "qkv");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == qkv.size(0) && cos.size(-1) == head_dim
              && cos.scalar_type() == qkv.scalar_type() && sin.scalar_type() == qkv.scalar_type(),
              "cos, sin: contiguous [n, head_dim] in qkv's dtype");
  TORCH_CHECK(head_dim % 2 == 0 && num_rotated * head_dim <= qkv.size(1), "rotary shapes");
  const int64_t rows = qkv.size(0), half = head_dim / 2, stride = qkv.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rotary_", [&] {
    scalar_t* x = qkv.data_ptr<scalar_t>();
    const scalar_t* c = cos.data_ptr<scalar_t>();
    const scalar_t* s = sin.data_ptr<scalar_t>();
    for_row_chunks(rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* cr = c + r * head_dim;
        const scalar_t* sr = s + r * head_dim;
        for (int64_t h = 0; h < num_rotated; ++h) {
          scalar_t* v = x + r * stride + h * head_dim;
          // element i and i + half never overlap for i < half
          _Pragma("omp simd")
          for (int64_t i = 0; i < half; ++i) {
            const float a = to_float(v[i]), b = to_float(v[i + half]);
            // out = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
            v[i] = from_float<scalar_t>(a * to_float(cr[i]) - b * to_float(sr[i]));
            v[i + half] = from_float<scalar_t>(b * to_float(cr[i + half]) + a * to_float(sr[i + half]));
          }
        }
      }
    });
  });
}
