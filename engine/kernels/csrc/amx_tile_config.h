// The AMX tile configuration's memory layout (palette 1), which `_tile_loadconfig` reads; each
// thread loads its own (it is per-thread state).
#pragma once

#include <cstdint>

namespace formwork {

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace formwork
