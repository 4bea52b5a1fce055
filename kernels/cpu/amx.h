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

/* CALL(r0, n) for each tile of R's rows, 16 at a time then the rest: n a constant at each call (accumulators in
   registers). */
#define EACH_ROW_TILE(R, CALL)                                                                         \
    for (int64_t r0_ = 0; r0_ < (R); r0_ += 16)                                                        \
        switch ((R) - r0_ < 16 ? (int)((R) - r0_) : 16) {                                              \
            case 1: CALL(r0_, 1); break;   case 2: CALL(r0_, 2); break;   case 3: CALL(r0_, 3); break;   \
            case 4: CALL(r0_, 4); break;   case 5: CALL(r0_, 5); break;   case 6: CALL(r0_, 6); break;   \
            case 7: CALL(r0_, 7); break;   case 8: CALL(r0_, 8); break;   case 9: CALL(r0_, 9); break;   \
            case 10: CALL(r0_, 10); break; case 11: CALL(r0_, 11); break; case 12: CALL(r0_, 12); break; \
            case 13: CALL(r0_, 13); break; case 14: CALL(r0_, 14); break; case 15: CALL(r0_, 15); break; \
            case 16: CALL(r0_, 16); break; default: break;                                             \
        }
#endif
#endif
