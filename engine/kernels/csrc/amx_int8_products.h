// What the int8 and 4-bit AMX kernels do alike once a group's tiles are loaded: the int8 products of
// A tiles 4-5 (ma row tiles) by B tiles 6-7 (nb column blocks) into the zeroed C tiles 0-3, then their
// int32 sums stored. Include only where the AMX-INT8 intrinsics are compiled in.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace formwork {

// C tile t's 16 x 16 int32 sums into sums[t] (t = 2 * row tile + column block); ma and nb are 1 or 2
inline void store_tile_products(int64_t ma, int64_t nb, int32_t (*sums)[16][16]) {
  // every product before any store: a store waits for its product's latency
  _tile_dpbsud(0, 4, 6);
  if (nb == 2) _tile_dpbsud(1, 4, 7);
  if (ma == 2) _tile_dpbsud(2, 5, 6);
  if (ma == 2 && nb == 2) _tile_dpbsud(3, 5, 7);
  _tile_stored(0, sums[0], 4 * 16);
  if (nb == 2) _tile_stored(1, sums[1], 4 * 16);
  if (ma == 2) _tile_stored(2, sums[2], 4 * 16);
  if (ma == 2 && nb == 2) _tile_stored(3, sums[3], 4 * 16);
}

}  // namespace formwork
