"""The orders Parley's CPU products hold codes in, with plain NumPy for each.

- Q4_K/Q5_K/Q6_K super-blocks (kernels/cpu/kgemm.c): the file's bytes (scales, d, dmin where the file has them), only
  the codes reordered so that each int32 lane of a 64-code chunk's integer dot sums four weights of one group of 16.
  Q5_K's 32 fifth-bit bytes stay where the file has its qh (bytes 16-47), re-ordered: held byte p holds, for each
  interleaved chunk c, the fifth bit of position p at bit c and of position p + 32 at bit 4 + c (the kernel shifts
  one copy of the 32 bytes left by 4, so that both halves of a chunk take theirs with one shift by c and a mask).
  The library's `parley_kq_interleave` does the same at load (kernels/cpu_kgemm.interleave).
- Byte codes in blocks of 32 (kernels/cpu/q8gemm.c): the same idea over units of 256 (or a last 128) weights; Q5_0's
  codes packed in 5 bits a weight in that order (`pack_fifths`)."""
from __future__ import annotations

import numpy as np

BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}  # per super-block of 256 weights
NIBBLES_AT = {"Q4_K": 16, "Q5_K": 48, "Q6_K": 0}  # where the 128 bytes of low 4 bits start, in the file and as held
# Q5_K's held fifth bits: row 2c + h of a chunk's (c, half h of 32) bits sits at bit c + 4h of byte p
_FIFTH_SHIFTS = np.array([c + 4 * h for c in range(4) for h in range(2)], dtype=np.uint8)[:, None]


def interleave(raw: np.ndarray, type_name: str) -> np.ndarray:
    """Rows of Q4_K/Q5_K/Q6_K super-blocks (n, S · bytes) with their codes reordered for kgemm.c, same size and the
    same header bytes: weight 16g + 4c + t (group g of 16, chunk c, t < 4) goes to position 64c + 4g + t, so that
    each int32 lane of a chunk's integer dot sums four weights of one group. The low 4 bits: byte p of pair P holds
    chunk 2P's code p (low nibble) and chunk 2P + 1's (high). Q5_K: then the fifth bits as the module's note says.
    Q6_K: then 64 bytes, byte p the top 2 bits of chunk c's code p at bits 2c."""
    size = BYTES[type_name]
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(raw.shape[0], -1, size)
    lead = b.shape[:2]
    chunks = natural_codes(b, type_name).reshape(*lead, 16, 4, 4).swapaxes(2, 3).reshape(*lead, 4, 64)
    out = b.copy()
    lo = chunks & 0x0F
    at = NIBBLES_AT[type_name]
    out[..., at:at + 128] = (lo[:, :, 0::2] | (lo[:, :, 1::2] << 4)).reshape(*lead, 128)
    if type_name == "Q5_K":
        fifth = (chunks >> 4).reshape(*lead, 8, 32)  # row 2c + h: chunk c's positions 32h .. 32h + 31
        out[..., 16:48] = np.bitwise_or.reduce(fifth << _FIFTH_SHIFTS, axis=2)
    elif type_name == "Q6_K":
        top = (chunks >> 4) & 3
        out[..., 128:192] = top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6)
    return out.reshape(raw.shape[0], -1)


def file_order(held: np.ndarray, type_name: str) -> np.ndarray:
    """`interleave`'s inverse: the super-blocks as the file stores them."""
    size = BYTES[type_name]
    b = np.ascontiguousarray(held, dtype=np.uint8).reshape(held.shape[0], -1, size)
    lead = b.shape[:2]
    at = NIBBLES_AT[type_name]
    pairs = b[..., at:at + 128].reshape(*lead, 2, 64)
    lo = np.stack([pairs & 0x0F, pairs >> 4], axis=3).reshape(*lead, 4, 64)
    codes = (lo | (_held_tops(b, type_name) << 4)).reshape(*lead, 4, 16, 4).swapaxes(2, 3).reshape(*lead, 256)
    out = b.copy()
    _write_codes(out, codes, type_name)
    return out.reshape(held.shape[0], -1)


def _write_codes(out: np.ndarray, codes: np.ndarray, type_name: str) -> None:
    """Natural-order codes (n, S, 256) into super-blocks `out` (n, S, bytes) where the file keeps them."""
    lead, at = codes.shape[:2], NIBBLES_AT[type_name]
    if type_name != "Q6_K":  # four chunks of 64: weights l and l + 32 share byte l of 32
        c = codes.reshape(*lead, 4, 2, 32) & 0x0F
        out[..., at:at + 128] = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).reshape(*lead, 128)
    if type_name == "Q5_K":  # qh byte l: bit j the fifth bit of weight 32j + l
        fifth = (codes >> 4).reshape(*lead, 8, 32)
        out[..., 16:48] = np.bitwise_or.reduce(fifth << np.arange(8, dtype=np.uint8)[:, None], axis=2)
    if type_name == "Q6_K":  # halves of 128: ql bytes l, l + 32 hold weights (l, l + 64) and (l + 32, l + 96)
        c = codes.reshape(*lead, 2, 4, 32)
        low, high = c & 0x0F, c >> 4
        out[..., :128] = np.stack([low[:, :, :, 0] | (low[:, :, :, 2] << 4),
                                   low[:, :, :, 1] | (low[:, :, :, 3] << 4)], axis=3).reshape(*lead, 128)
        out[..., 128:192] = (high[:, :, :, 0] | (high[:, :, :, 1] << 2) | (high[:, :, :, 2] << 4)
                             | (high[:, :, :, 3] << 6)).reshape(*lead, 64)


def _held_tops(b: np.ndarray, type_name: str) -> np.ndarray:
    """(n, S, 4, 64) the bits above the low 4 of each interleaved chunk's codes, as held."""
    lead = b.shape[:2]
    if type_name == "Q4_K":
        return np.zeros(lead + (4, 64), dtype=np.uint8)
    if type_name == "Q5_K":
        return ((b[..., None, 16:48] >> _FIFTH_SHIFTS) & 1).reshape(*lead, 4, 64)
    hb = b[..., 128:192][:, :, None, :]
    return (hb >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]) & 3


def natural_codes(b: np.ndarray, type_name: str) -> np.ndarray:
    """(n, S, bytes) file super-blocks -> (n, S, 256) unsigned codes in weight order."""
    lead = b.shape[:2]
    if type_name in ("Q4_K", "Q5_K"):  # four chunks of 64 weights: 32 bytes, low nibbles then high nibbles
        qs = b[..., NIBBLES_AT[type_name]:].reshape(*lead, 4, 32)
        codes = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(*lead, 256)
        if type_name == "Q4_K":
            return codes
        # Q5_K: qh byte l, bit j is weight 32j + l's fifth bit
        fifth = (b[..., None, 16:48] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
        return codes | (fifth.reshape(*lead, 256) << 4)
    # Q6_K, per half of 128: ql bytes l and l + 32 hold weights (l, l + 64) and (l + 32, l + 96) in their nibbles,
    # qh byte l those four weights' top 2 bits at bits 0, 2, 4, 6
    ql, qh = b[..., 0:128].reshape(*lead, 2, 2, 32), b[..., 128:192].reshape(*lead, 2, 1, 32)
    low, high = ql & 0x0F, ql >> 4  # (.., half, [l, l + 32], 32) and [l + 64, l + 96]
    shifts = np.array([[0, 2], [4, 6]], dtype=np.uint8)[None, None, None, :, :, None]
    top = (qh[..., None, :, :] >> shifts) & 3  # (.., half, low/high, 2, 32)
    return (np.stack([low, high], axis=3) | (top << 4)).reshape(*lead, 256)


def interleave_units(codes: np.ndarray) -> np.ndarray:
    """Byte codes (n, K) in blocks of 32, K a multiple of 128, in kernels/cpu/q8gemm.c's order: units of 256 weights
    (the last of 128 when K is an odd number of 128s); in a unit of W, weight (W/16)·g + 4c + t goes to position
    64c + 4g + t, so that int32 lane g of a 64-byte chunk's dot sums group g."""
    return _units(np.ascontiguousarray(codes), forward=True)


def natural_units(held: np.ndarray) -> np.ndarray:
    """`interleave_units`'s inverse."""
    return _units(np.ascontiguousarray(held), forward=False)


def _units(codes: np.ndarray, forward: bool) -> np.ndarray:
    # a weight's 4 bytes t move together: as one uint32 the copy moves a quarter of the elements (the embedded model's
    # load, under cProfile: 0.68 s in these copies -> 0.23 s)
    n, k = codes.shape
    words, full = codes.view(np.uint32), k // 256 * 64
    out = np.empty_like(words)
    for start, stop, chunks in ((0, full, 4), (full, k // 4, 2)):
        if stop == start:
            continue
        part = words[:, start:stop].reshape(n, -1, 16, chunks) if forward else \
            words[:, start:stop].reshape(n, -1, chunks, 16)
        out[:, start:stop] = part.swapaxes(2, 3).reshape(n, stop - start)  # (group, chunk) <-> (chunk, group)
    return out.view(np.uint8)


FIFTHS_ZERO = 112  # a Q5_0 code q is held as the byte u = q + 112 (zero 128, as Q8_0's)


def pack_fifths(held: np.ndarray) -> np.ndarray:
    """Interleaved byte codes u = q + 112 (n, K), q < 32, K a multiple of 64 -> (n, 5K/8) as kernels/cpu/q8gemm.c
    unpacks them: per chunk of 64 positions, 32 bytes (position p in byte p's low nibble, 32 + p in its high one)
    then 8 bytes whose bit p is position p's fifth bit."""
    n, k = held.shape
    q = held.reshape(n, k // 64, 64) - np.uint8(FIFTHS_ZERO)
    if q.size and q.max() > 31:  # wrapped below 112 or above 143: not a 5-bit code
        raise ValueError("codes outside Q5_0's range cannot be packed in 5 bits")
    nibbles = (q[..., :32] & 0x0F) | ((q[..., 32:] & 0x0F) << 4)
    fifths = np.packbits(q >> 4, axis=-1, bitorder="little")
    return np.concatenate([nibbles, fifths], axis=-1).reshape(n, k // 8 * 5)


def unpack_fifths(packed: np.ndarray) -> np.ndarray:
    """`pack_fifths`'s inverse."""
    n = packed.shape[0]
    b = np.ascontiguousarray(packed).reshape(n, -1, 40)
    low = np.concatenate([b[..., :32] & 0x0F, b[..., :32] >> 4], axis=-1)
    fifths = np.unpackbits(b[..., 32:], axis=-1, bitorder="little")
    return ((low | (fifths << 4)) + np.uint8(FIFTHS_ZERO)).reshape(n, -1)


TILE_COLUMNS = 16  # columns a group of kernels/cpu/amxgemm.c's layout holds


def tile_order(codes: np.ndarray) -> np.ndarray:
    """Byte codes (n, K) in weight order, n a multiple of 16 and K of 32 -> kernels/cpu/amxgemm.c's order, shape (n, K):
    per group of 16 columns and block of 32 weights, 512 codes, code 64i + 4c + t holding column c's weight 4i + t (the
    tiles' pair-of-words form), groups and blocks in order."""
    n, k = codes.shape
    words = np.ascontiguousarray(codes).view(np.uint32)  # a weight's 4 bytes t move together
    grouped = words.reshape(n // TILE_COLUMNS, TILE_COLUMNS, k // 32, 8).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(grouped).view(np.uint8).reshape(n, k)


def natural_order(held: np.ndarray) -> np.ndarray:
    """`tile_order`'s inverse."""
    n, k = held.shape
    words = np.ascontiguousarray(held).view(np.uint32).reshape(n // TILE_COLUMNS, k // 32, 8, TILE_COLUMNS)
    return np.ascontiguousarray(words.transpose(0, 3, 1, 2)).view(np.uint8).reshape(n, k)


def tile_codes(codes: np.ndarray, bits: int = 8) -> np.ndarray:
    """Byte codes u = q + 128 (n, K) in weight order -> amxgemm.c's codes: `tile_order`'s, as signed bytes q (bits 8,
    (n, K)), or Q5_0's (u = q5 + 112, q5 < 32) packed in 5 bits by `pack_fifths` over each 64 (bits 5, (n, 5K/8))."""
    n, k = codes.shape
    ordered = tile_order(codes)
    if bits == 8:
        return ordered ^ np.uint8(0x80)
    return pack_fifths(ordered.reshape(-1, 64)).reshape(n, k // 8 * 5)


def untile_codes(held: np.ndarray, bits: int = 8) -> np.ndarray:
    """`tile_codes`'s inverse: the codes u = q + 128 in weight order."""
    n = held.shape[0]
    if bits == 8:
        return natural_order(held ^ np.uint8(0x80))
    k = held.shape[1] // 5 * 8
    return natural_order(unpack_fifths(held.reshape(-1, 40)).reshape(n, k))


def tile_scales(scales: np.ndarray) -> np.ndarray:
    """Per-block scales (n, K/32) -> amxgemm.c's order: per group of 16 columns and block, the 16 in column order."""
    n, nb = scales.shape
    return np.ascontiguousarray(scales.reshape(n // TILE_COLUMNS, TILE_COLUMNS, nb).transpose(0, 2, 1)).reshape(n, nb)


def untile_scales(held: np.ndarray) -> np.ndarray:
    """`tile_scales`'s inverse."""
    n, nb = held.shape
    return np.ascontiguousarray(held.reshape(n // TILE_COLUMNS, nb, TILE_COLUMNS).transpose(0, 2, 1)).reshape(n, nb)


TILED_TYPES = ("Q4_K", "Q5_K")  # super-blocks kernels/cpu/amxkgemm.c takes in groups of 16 columns, the file's bytes


def tile_superblocks(raw: np.ndarray, type_name: str) -> np.ndarray:
    """Rows of Q4_K/Q5_K super-blocks as the file stores them (n, S · bytes), n a multiple of 16 -> amxkgemm.c's
    layout (n, S · bytes, the same bytes regrouped): per group of 16 columns and super-block, d[16] and dmin[16] (fp16),
    the packed scales' 12 bytes, byte k of column c at 16k + c, Q5_K's fifth bits (per sub-block j, 64 bytes: bit p is
    tile code p's),
    then per pair of sub-blocks 512 bytes, byte 64i + 4c + t holding column c's weight 4i + t of sub-block 2P (low
    nibble) and 2P + 1 (high); groups, then super-blocks, in order."""
    n, size = raw.shape[0], BYTES[type_name]
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, -1, size)
    s, groups = b.shape[1], n // TILE_COLUMNS

    def per_group(a: np.ndarray) -> np.ndarray:  # (n, S, m) column-wise -> (G, S, m·16), columns innermost
        m = a.shape[-1]
        return a.reshape(groups, TILE_COLUMNS, s, m).transpose(0, 2, 3, 1).reshape(groups, s, m * TILE_COLUMNS)

    def halves(a: np.ndarray) -> np.ndarray:  # fp16 bytes (n, S, 2) -> (G, S, 32), column c's at 2c
        return a.reshape(groups, TILE_COLUMNS, s, 2).transpose(0, 2, 1, 3).reshape(groups, s, 32)

    out = np.empty((groups, s, TILE_COLUMNS * size), dtype=np.uint8)
    out[..., 0:32], out[..., 32:64], out[..., 64:256] = halves(b[..., 0:2]), halves(b[..., 2:4]), per_group(b[..., 4:16])
    # the file's byte 32P + l of a column holds weights l of sub-blocks 2P (low nibble) and 2P + 1 (high), as a pair's
    # bytes do: the codes move as words of 4 bytes (weights 4i .. 4i + 3), word i of column c to word 16i + c
    at = NIBBLES_AT[type_name]
    words = np.ascontiguousarray(b[..., at:at + 128]).view(np.uint32).reshape(groups, TILE_COLUMNS, s, 4, 8)
    out[..., -2048:] = words.transpose(0, 2, 3, 4, 1).reshape(groups, s, -1).view(np.uint8)
    if type_name == "Q5_K":  # qh byte l, bit j: weight 32j + l's fifth bit -> sub-block j's bit 64i + 4c + t
        bits = np.unpackbits(b[..., 16:48], axis=-1, bitorder="little").reshape(groups, TILE_COLUMNS, s, 8, 4, 8)
        out[..., 256:768] = np.packbits(bits.transpose(0, 2, 5, 3, 1, 4), axis=None, bitorder="little").reshape(
            groups, s, 512)
    return out.reshape(n, s * size)


def untile_superblocks(held: np.ndarray, type_name: str) -> np.ndarray:
    """`tile_superblocks`' inverse: the file's super-blocks (n, S · bytes)."""
    n, size, cols = held.shape[0], BYTES[type_name], TILE_COLUMNS
    groups = n // cols
    s = held.shape[1] // size
    h = np.ascontiguousarray(held).reshape(groups, s, cols * size)

    def columns(a: np.ndarray, m: int) -> np.ndarray:  # (G, S, m·16) columns innermost -> (n, S, m)
        return a.reshape(groups, s, m, cols).transpose(0, 3, 1, 2).reshape(n, s, m)

    d, dmin = (h[..., at:at + 32].reshape(groups, s, cols, 2).transpose(0, 2, 1, 3).reshape(n, s, 2)
               for at in (0, 32))
    at = 256 + (512 if type_name == "Q5_K" else 0)
    pairs = h[..., at:at + 2048].reshape(groups, s, 4, 512)
    tiles = np.stack([pairs & 0x0F, pairs >> 4], axis=3).reshape(groups, s, 8, 512)
    if type_name == "Q5_K":
        fifths = np.unpackbits(h[..., 256:768].reshape(groups, s, 8, 64), axis=-1, bitorder="little")
        tiles = tiles | (fifths << 4)
    codes = tiles.reshape(groups, s, 8, 8, cols, 4).transpose(0, 4, 1, 2, 3, 5).reshape(n, s, 256)
    out = np.empty((n, s, size), dtype=np.uint8)
    out[..., 0:2], out[..., 2:4], out[..., 4:16] = d, dmin, columns(h[..., 64:256], 12)
    _write_codes(out, codes, type_name)
    return out.reshape(n, s * size)

