/* The resize kernel's vector loops, written once and included by _resample.c once per instruction
 * set (SSE4.1, AVX2, AVX-512), each compiled for its own target: the same operations on vectors of
 * LANES int32, so that every path gives the same bytes (tests/write/test_resample_isa.py checks it).
 *
 * Pillow's exact arithmetic: 8-bit pixels widened to int32, multiplied by Pillow's int32 weights
 * (mullo: the low 32 bits, exact since filter_rows and filter_pixels check that every sum fits),
 * summed from Pillow's rounding constant, shifted by PRECISION_BITS and clipped to 0..255.
 *
 * The includer defines, before each inclusion:
 *   SUFFIX            the functions' name suffix (sse4, avx2, avx512)
 *   TARGET            the target attribute
 *   VEC, LANES        the vector type and its int32 lanes; G = LANES / 4, the taps of a pixel one
 *                     vector holds in the horizontal pass
 *   STRIP             the vectors of sums the vertical pass keeps in registers (half the registers or
 *                     more; then STRIP / 2, so that a row's tail is at most one vector short of it)
 *   V_PIXELS(p)       LANES bytes at p widened to LANES int32
 *   V_WEIGHTS(p)      LANES int32 at p
 *   V_SET1(w), V_ZERO(), V_ADD, V_MUL
 *   V_STORE(p, v)     (v >> PRECISION_BITS) clipped to 0..255, stored as LANES bytes at p
 *   V_FOLD(v)         the sum of v's G groups of 4 lanes, as an __m128i
 */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define G (LANES / 4)
/* GCC's partial redundancy elimination copies each register of sums once a tap (4 instructions in
 * 21 of the vertical loop): off in these loops */
#if defined(__GNUC__) && !defined(__clang__)
#define LOOPS TARGET __attribute__((optimize("no-tree-pre")))
#else
#define LOOPS TARGET
#endif

/* One pixel (4 lanes) of SSE4.1 in any of the targets: the taps past the last whole vector. */
#define X_PIXEL(p) _mm_cvtepu8_epi32(_mm_cvtsi32_si128(load_u32(p)))
#define X_STORE(p, v) store_u32((p), (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16( \
    _mm_packs_epi32(_mm_srai_epi32((v), PRECISION_BITS), _mm_setzero_si128()), _mm_setzero_si128())))

/* N vectors of the row from i: their sums in registers for all of the row's taps */
#define VERTICAL_STRIP(N)                                                                           \
    do {                                                                                            \
        VEC a[N];                                                                                   \
        for (int u = 0; u < N; u++) {                                                               \
            a[u] = round;                                                                           \
        }                                                                                           \
        const uint8_t *p = base + i;                                                                \
        for (int y = 0; y < count; y++, p += width) {                                               \
            const VEC w = V_SET1(k[y]);                                                             \
            for (int u = 0; u < N; u++) {                                                           \
                a[u] = V_ADD(V_MUL(V_PIXELS(p + u * LANES), w), a[u]);                              \
            }                                                                                       \
        }                                                                                           \
        for (int u = 0; u < N; u++) {                                                               \
            V_STORE(line + i + u * LANES, a[u]);                                                    \
        }                                                                                           \
    } while (0)

/* filter_rows' loop: each output row the weighted sum of the source rows its bounds name (src's
 * first row being row `first`), over strips of STRIP vectors whose sums stay in registers for all
 * the taps. */
LOOPS static void
CAT(vertical, SUFFIX)(const uint8_t *src, Py_ssize_t width, const int32_t *bounds, const int32_t *weights,
                      int taps, Py_ssize_t first, uint8_t *out, Py_ssize_t out_rows) {
    const VEC round = V_SET1(1 << (PRECISION_BITS - 1));
    for (Py_ssize_t yy = 0; yy < out_rows; yy++) {
        const uint8_t *base = src + ((Py_ssize_t)bounds[yy * 2] - first) * width;
        const int count = bounds[yy * 2 + 1];
        const int32_t *k = &weights[(Py_ssize_t)yy * taps];
        uint8_t *line = out + yy * width;
        Py_ssize_t i = 0;
        for (; i + STRIP * LANES <= width; i += STRIP * LANES) {
            VERTICAL_STRIP(STRIP);
        }
        for (; i + STRIP / 2 * LANES <= width; i += STRIP / 2 * LANES) { /* a half strip: no tail of single vectors */
            VERTICAL_STRIP(STRIP / 2);
        }
        for (; i + LANES <= width; i += LANES) {
            VEC a = round;
            const uint8_t *p = base + i;
            for (int y = 0; y < count; y++, p += width) {
                a = V_ADD(a, V_MUL(V_PIXELS(p), V_SET1(k[y])));
            }
            V_STORE(line + i, a);
        }
        for (; i + 4 <= width; i += 4) {
            __m128i a = _mm_set1_epi32(1 << (PRECISION_BITS - 1));
            const uint8_t *p = base + i;
            for (int y = 0; y < count; y++, p += width) {
                a = _mm_add_epi32(a, _mm_mullo_epi32(X_PIXEL(p), _mm_set1_epi32(k[y])));
            }
            X_STORE(line + i, a);
        }
        for (; i < width; i++) {
            int32_t a = 1 << (PRECISION_BITS - 1);
            for (int y = 0; y < count; y++) {
                a += base[y * width + i] * k[y];
            }
            line[i] = clip8(a);
        }
    }
}

#if LANES == 8
/* AVX2's eight rows of one output pixel, each row's sums in a vector of 2 taps of 4 channels:
 * folded two rows a vector, rounded, shifted, packed, and stored 4 bytes a row. */
LOOPS static inline void
CAT(finish8, SUFFIX)(const VEC *a, uint8_t *o, Py_ssize_t out_stride) {
    const VEC rounding = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    VEC s[4]; /* rows 2r (low half) and 2r + 1 (high half) */
    for (int r = 0; r < 4; r++) {
        s[r] = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(_mm256_permute2x128_si256(a[2 * r], a[2 * r + 1], 0x20),
                                                                   _mm256_permute2x128_si256(a[2 * r], a[2 * r + 1], 0x31)),
                                                  rounding),
                                 PRECISION_BITS);
    }
    /* low half: rows 0, 2, 4, 6; high half: rows 1, 3, 5, 7 */
    const VEC bytes = _mm256_packus_epi16(_mm256_packs_epi32(s[0], s[1]), _mm256_packs_epi32(s[2], s[3]));
    const __m128i even = _mm256_castsi256_si128(bytes), odd = _mm256_extracti128_si256(bytes, 1);
    store_u32(o, (uint32_t)_mm_cvtsi128_si32(even));
    store_u32(o + 2 * out_stride, (uint32_t)_mm_extract_epi32(even, 1));
    store_u32(o + 4 * out_stride, (uint32_t)_mm_extract_epi32(even, 2));
    store_u32(o + 6 * out_stride, (uint32_t)_mm_extract_epi32(even, 3));
    store_u32(o + out_stride, (uint32_t)_mm_cvtsi128_si32(odd));
    store_u32(o + 3 * out_stride, (uint32_t)_mm_extract_epi32(odd, 1));
    store_u32(o + 5 * out_stride, (uint32_t)_mm_extract_epi32(odd, 2));
    store_u32(o + 7 * out_stride, (uint32_t)_mm_extract_epi32(odd, 3));
}
#define FINISH8(a, o, out_stride) (CAT(finish8, SUFFIX)((a), (o), (out_stride)), 1)
#else
#define FINISH8(a, o, out_stride) 0
#endif

/* One output pixel of ROWS (1, 4 or 8) rows from p (rows stride bytes apart): its taps G at a time
 * while a vector's load stays inside the row (`whole`: the taps rounded up to whole vectors, the
 * extra weights 0), the first vector's products the sums' first values, then one at a time; k
 * holds each tap's weight 4 times (one a channel), i indexes both; Pillow's rounding added once
 * the vector's taps are summed. Eight rows on AVX2 (FINISH8), or four rows' results at a time, are
 * packed together and stored 4 bytes a row. */
#define HORIZONTAL_PIXEL(ROWS)                                                                      \
    do {                                                                                            \
        VEC a[ROWS];                                                                                \
        Py_ssize_t i = 0;                                                                           \
        if (whole > 0) {                                                                            \
            const VEC w = V_WEIGHTS(k);                                                             \
            for (int r = 0; r < ROWS; r++) {                                                        \
                a[r] = V_MUL(V_PIXELS(p + r * stride), w);                                          \
            }                                                                                       \
            i = LANES;                                                                              \
        } else {                                                                                    \
            for (int r = 0; r < ROWS; r++) {                                                        \
                a[r] = V_ZERO();                                                                    \
            }                                                                                       \
        }                                                                                           \
        for (; i < whole; i += LANES) {                                                             \
            const VEC w = V_WEIGHTS(k + i);                                                         \
            for (int r = 0; r < ROWS; r++) {                                                        \
                a[r] = V_ADD(V_MUL(V_PIXELS(p + r * stride + i), w), a[r]);                         \
            }                                                                                       \
        }                                                                                           \
        if (ROWS == 8 && i >= count * 4 && FINISH8(a, o, out_stride)) {                             \
            break;                                                                                  \
        }                                                                                           \
        __m128i b[ROWS];                                                                            \
        for (int r = 0; r < ROWS; r++) {                                                            \
            b[r] = _mm_add_epi32(V_FOLD(a[r]), _mm_set1_epi32(1 << (PRECISION_BITS - 1)));          \
        }                                                                                           \
        for (; i < count * 4; i += 4) {                                                             \
            const __m128i w = _mm_loadu_si128((const __m128i *)(k + i));                            \
            for (int r = 0; r < ROWS; r++) {                                                        \
                b[r] = _mm_add_epi32(_mm_mullo_epi32(X_PIXEL(p + r * stride + i), w), b[r]);        \
            }                                                                                       \
        }                                                                                           \
        if (ROWS == 1) {                                                                            \
            X_STORE(o, b[0]);                                                                       \
        }                                                                                           \
        for (int r = 0; r + 4 <= ROWS; r += 4) {                                                    \
            const __m128i bytes = _mm_packus_epi16(                                                 \
                _mm_packs_epi32(_mm_srai_epi32(b[r], PRECISION_BITS), _mm_srai_epi32(b[r + 1], PRECISION_BITS)), \
                _mm_packs_epi32(_mm_srai_epi32(b[r + 2], PRECISION_BITS), _mm_srai_epi32(b[r + 3], PRECISION_BITS))); \
            store_u32(o + r * out_stride, (uint32_t)_mm_cvtsi128_si32(bytes));                      \
            store_u32(o + (r + 1) * out_stride, (uint32_t)_mm_extract_epi32(bytes, 1));             \
            store_u32(o + (r + 2) * out_stride, (uint32_t)_mm_extract_epi32(bytes, 2));             \
            store_u32(o + (r + 3) * out_stride, (uint32_t)_mm_extract_epi32(bytes, 3));             \
        }                                                                                           \
    } while (0)

/* ROWS rows of horizontal4 (1, 4 or 8 at once). */
#define HORIZONTAL_ROWS(ROWS)                                                                       \
    LOOPS static void CAT(horizontal_rows##ROWS, SUFFIX)(const uint8_t *src, Py_ssize_t stride,      \
        Py_ssize_t src_cols, const int32_t *bounds, const int32_t *xw, int xtaps, uint8_t *o,       \
        Py_ssize_t out_w, Py_ssize_t out_stride) {                                                  \
        for (Py_ssize_t x = 0; x < out_w; x++, o += 4) {                                            \
            const Py_ssize_t first = bounds[x * 2];                                                 \
            const int count = bounds[x * 2 + 1];                                                    \
            const Py_ssize_t rounded = (count + G - 1) / G * G;                                     \
            const Py_ssize_t whole = (first + rounded <= src_cols ? rounded : count / G * G) * 4;   \
            const uint8_t *p = src + first * 4;                                                     \
            const int32_t *k = xw + x * xtaps * 4;                                                  \
            HORIZONTAL_PIXEL(ROWS);                                                                 \
        }                                                                                           \
    }
HORIZONTAL_ROWS(1)
HORIZONTAL_ROWS(4)
HORIZONTAL_ROWS(8)
#undef HORIZONTAL_ROWS

/* filter_pixels' loop: the horizontal pass over 4-byte pixels in place (no transposed copy), eight
 * rows at a time so that each weight is loaded once for eight pixels. xw: each pixel's weights, taps
 * rounded up to a multiple of 4 (xtaps), each 4 times, 0 past its count. */
TARGET static void
CAT(horizontal4, SUFFIX)(const uint8_t *src, Py_ssize_t stride, Py_ssize_t rows, Py_ssize_t src_cols,
                         const int32_t *bounds, const int32_t *xw, int xtaps, uint8_t *out, Py_ssize_t out_w) {
    Py_ssize_t y = 0;
    for (; y + 8 <= rows; y += 8) {
        CAT(horizontal_rows8, SUFFIX)(src + y * stride, stride, src_cols, bounds, xw, xtaps, out + y * out_w * 4,
                                      out_w, out_w * 4);
    }
    for (; y + 4 <= rows; y += 4) {
        CAT(horizontal_rows4, SUFFIX)(src + y * stride, stride, src_cols, bounds, xw, xtaps, out + y * out_w * 4,
                                      out_w, out_w * 4);
    }
    for (; y < rows; y++) {
        CAT(horizontal_rows1, SUFFIX)(src + y * stride, stride, src_cols, bounds, xw, xtaps, out + y * out_w * 4,
                                      out_w, out_w * 4);
    }
}

#undef HORIZONTAL_PIXEL
#undef FINISH8
#undef VERTICAL_STRIP
#undef X_PIXEL
#undef X_STORE
#undef G
#undef LOOPS
#undef CAT
#undef CAT_
