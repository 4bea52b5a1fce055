/* What Parley's products on Intel's AMX tiles share (amxgemm.c, amxkgemm.c): whether they build here, the tiles'
   configuration, and the process's permission to use them (parley_amx_ready, in amxgemm.c). */
#ifndef PARLEY_AMX_H
#define PARLEY_AMX_H

#include <stdint.h>
#include <string.h>
#include <immintrin.h>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__)
#define PARLEY_AMX 1

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

int parley_amx_ready(void);

/* Tiles 0, 1: activations (`rows` rows × `a_bytes` of K); 2, 3: codes (a_bytes / 4 rows of 64 bytes); 4..7: sums. */
static inline void amx_configure(int rows, int a_bytes) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = (uint8_t)rows, c.colsb[t] = 64;
    c.colsb[0] = c.colsb[1] = (uint16_t)a_bytes;
    c.rows[2] = c.rows[3] = (uint8_t)(a_bytes / 4);
    _tile_loadconfig(&c);
}
#endif
#endif
