/* The perceptual hash's work in one call (beam_prep/write/images/phash.py says what the hash is):
 * Pillow's convert("L"), its BOX resize to 32x32 and the hash's DCT, median and bits, on the
 * pixels the resize kernel has just written, with no image, array or Python object between them.
 * Included by _resample.c, whose coefficients (fill_coefficients) and rounding (clip8) are Pillow's:
 * the thumbnail is Pillow's byte for byte (tests/write/test_phash.py checks it), and the DCT is
 * phash.py's, in float64 with the same rounding to 6 decimals. */

#define PHASH_SIDE 32 /* phash.THUMBNAIL */
#define PHASH_KEPT 8  /* the coefficients kept per axis */
#define PHASH_BLOCK 8 /* rows greyed and filtered at once, a vector of sums a tap */

static double
box_filter(double x) {
    /* Pillow's */
    if (x > -0.5 && x <= 0.5) {
        return 1.0;
    }
    return 0.0;
}

/* The last axes' coefficients, most images being of one or two sizes: read and written with the
 * GIL held, and copied out, so that a thread hashing without it never reads one being replaced. */
#define PHASH_KEPT_AXES 2
#define PHASH_KEPT_TAPS 33 /* axes up to 512 pixels */
static struct {
    Py_ssize_t in_size; /* 0: empty */
    int taps;
    int32_t bounds[PHASH_SIDE * 2];
    int32_t kk[PHASH_SIDE * PHASH_KEPT_TAPS];
} kept_axes[PHASH_KEPT_AXES];
static int next_kept_axis;

/* One axis's BOX coefficients from in_size to PHASH_SIDE over the whole axis, in memory of their own;
 * NULL with an exception set. Called with the GIL held. */
static int32_t *
box_coefficients(Py_ssize_t in_size, int *taps, int32_t *bounds) {
    float in1 = (float)in_size; /* Pillow takes the box in float32 */
    double scale = (double)in1 / PHASH_SIDE;
    *taps = (int)ceil(0.5 * (scale < 1.0 ? 1.0 : scale)) * 2 + 1;
    int32_t *kk = PyMem_RawMalloc((size_t)PHASH_SIDE * *taps * sizeof(int32_t));
    if (!kk) {
        PyErr_NoMemory();
        return NULL;
    }
    for (int i = 0; i < PHASH_KEPT_AXES; i++) {
        if (kept_axes[i].in_size == in_size && kept_axes[i].taps == *taps) {
            memcpy(bounds, kept_axes[i].bounds, sizeof(kept_axes[i].bounds));
            memcpy(kk, kept_axes[i].kk, (size_t)PHASH_SIDE * *taps * sizeof(int32_t));
            return kk;
        }
    }
    double *k = PyMem_RawMalloc((size_t)*taps * sizeof(double));
    const char *error = k ? fill_coefficients((int)in_size, 0.0f, in1, PHASH_SIDE, *taps, box_filter, 0.5, bounds,
                                              kk, k)
                          : NULL;
    PyMem_RawFree(k);
    if (!k || error) {
        PyMem_RawFree(kk);
        if (error) {
            PyErr_SetString(PyExc_ValueError, error);
        } else {
            PyErr_NoMemory();
        }
        return NULL;
    }
    if (*taps <= PHASH_KEPT_TAPS) {
        int i = next_kept_axis;
        next_kept_axis = (i + 1) % PHASH_KEPT_AXES;
        kept_axes[i].in_size = in_size;
        kept_axes[i].taps = *taps;
        memcpy(kept_axes[i].bounds, bounds, sizeof(kept_axes[i].bounds));
        memcpy(kept_axes[i].kk, kk, (size_t)PHASH_SIDE * *taps * sizeof(int32_t));
    }
    return kk;
}

/* Pillow's rgb2l (ITU-R 601-2) of an RGB(X) pixel */
static inline uint8_t
grey_of(const uint8_t *p) {
    return (uint8_t)((p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
}

#ifdef X86_VECTORS
/* grey_of for PHASH_BLOCK rows of RGBX pixels (stride bytes apart) at once, 8 columns at a time,
 * stored in column order (grey: PHASH_BLOCK bytes a column): 8 rows' greys of 8 pixels in 32-bit
 * lanes, packed to bytes and turned into columns by shuffles. Returns the columns done (the rest,
 * under 8, are the caller's). */
#if (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
__attribute__((target("avx2"))) static Py_ssize_t
grey_block_avx2(const uint8_t *lines, Py_ssize_t stride, Py_ssize_t width, uint8_t *grey) {
    /* each pixel's (R, B) and (G, G) as pairs of int16, multiplied and summed by madd: R * 19595 +
     * B * 7471 and G * 19235 * 2 (38470 does not fit in an int16), exactly rgb2l's integer sum */
    const __m256i red_blue = _mm256_setr_epi8(0, -1, 2, -1, 4, -1, 6, -1, 8, -1, 10, -1, 12, -1, 14, -1,
                                              0, -1, 2, -1, 4, -1, 6, -1, 8, -1, 10, -1, 12, -1, 14, -1);
    const __m256i green = _mm256_setr_epi8(1, -1, 1, -1, 5, -1, 5, -1, 9, -1, 9, -1, 13, -1, 13, -1,
                                           1, -1, 1, -1, 5, -1, 5, -1, 9, -1, 9, -1, 13, -1, 13, -1);
    const __m256i k_red_blue = _mm256_set1_epi32(7471 << 16 | 19595), k_green = _mm256_set1_epi32(19235 << 16 | 19235);
    const __m256i half = _mm256_set1_epi32(0x8000);
    /* in each 128-bit lane, 4 rows x 4 columns of bytes to 4 columns x 4 rows */
    const __m256i columns = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                             0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    Py_ssize_t x = 0;
    for (; x + 8 <= width; x += 8) {
        __m256i y[PHASH_BLOCK];
        for (int r = 0; r < PHASH_BLOCK; r++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(lines + r * stride + x * 4));
            const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(_mm256_shuffle_epi8(v, red_blue), k_red_blue),
                                                 _mm256_madd_epi16(_mm256_shuffle_epi8(v, green), k_green));
            y[r] = _mm256_srli_epi32(_mm256_add_epi32(sum, half), 16);
        }
        /* lane 0: rows 0-3 (then 4-7) of columns 0-3; lane 1: of columns 4-7 */
        const __m256i top = _mm256_packus_epi16(_mm256_packus_epi32(y[0], y[1]), _mm256_packus_epi32(y[2], y[3]));
        const __m256i bottom = _mm256_packus_epi16(_mm256_packus_epi32(y[4], y[5]), _mm256_packus_epi32(y[6], y[7]));
        const __m256i t = _mm256_shuffle_epi8(top, columns), b = _mm256_shuffle_epi8(bottom, columns);
        const __m256i lo = _mm256_unpacklo_epi32(t, b), hi = _mm256_unpackhi_epi32(t, b); /* columns 0,1|4,5; 2,3|6,7 */
        _mm256_storeu_si256((__m256i *)(grey + x * PHASH_BLOCK), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(grey + x * PHASH_BLOCK + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    return x;
}

/* The horizontal pass of a block of rows (grey in column order, as grey_block_avx2 leaves it): each
 * thumbnail column the weighted sum of its taps, a vector of the block's rows a tap, rounded and
 * clipped as clip8 (the packs saturate to 0..255), stored down the column of out (rows x 32).
 * Returns the columns done: all of them. */
__attribute__((target("avx2"))) static int
box_columns_avx2(const uint8_t *grey, const int32_t *bounds, const int32_t *kk, int taps, int block, uint8_t *out) {
    for (int xx = 0; xx < PHASH_SIDE; xx++) {
        const uint8_t *g = grey + (Py_ssize_t)bounds[xx * 2] * PHASH_BLOCK;
        const int32_t *k = kk + (Py_ssize_t)xx * taps;
        __m256i acc = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
        for (int t = 0; t < bounds[xx * 2 + 1]; t++) {
            const __m256i pixels = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + t * PHASH_BLOCK)));
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(pixels, _mm256_set1_epi32(k[t])));
        }
        const __m256i shifted = _mm256_srai_epi32(acc, PRECISION_BITS);
        const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(shifted), _mm256_extracti128_si256(shifted, 1));
        uint8_t column[16];
        _mm_storeu_si128((__m128i *)column, _mm_packus_epi16(words, words));
        for (int r = 0; r < block; r++) {
            out[r * PHASH_SIDE + xx] = column[r];
        }
    }
    return PHASH_SIDE;
}
#else /* big-endian: the scalar loops alone */
static Py_ssize_t
grey_block_avx2(const uint8_t *lines, Py_ssize_t stride, Py_ssize_t width, uint8_t *grey) {
    (void)lines, (void)stride, (void)width, (void)grey;
    return 0;
}

static int
box_columns_avx2(const uint8_t *grey, const int32_t *bounds, const int32_t *kk, int taps, int block, uint8_t *out) {
    (void)grey, (void)bounds, (void)kk, (void)taps, (void)block, (void)out;
    return 0;
}
#endif
#endif

#ifdef X86_VECTORS
/* The vertical pass over the horizontal pass's rows (32 bytes each, from the first one read): each
 * thumbnail row the weighted sum of the rows its bounds name, a vector of 8 columns a tap, rounded
 * and clipped as clip8 (avx2_store's packs saturate to 0..255). */
__attribute__((target("avx2"))) static void
box_rows_avx2(const uint8_t *rows, Py_ssize_t first, const int32_t *bounds, const int32_t *kk, int taps,
              uint8_t *thumb) {
    for (int yy = 0; yy < PHASH_SIDE; yy++) {
        const uint8_t *src = rows + (bounds[yy * 2] - first) * PHASH_SIDE;
        const int32_t *k = kk + (Py_ssize_t)yy * taps;
        const int count = bounds[yy * 2 + 1];
        __m256i acc[PHASH_SIDE / 8];
        for (int i = 0; i < PHASH_SIDE / 8; i++) {
            acc[i] = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
        }
        for (int t = 0; t < count; t++) {
            const __m256i w = _mm256_set1_epi32(k[t]);
            for (int i = 0; i < PHASH_SIDE / 8; i++) {
                const __m256i pixels = _mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)(src + t * PHASH_SIDE + i * 8)));
                acc[i] = _mm256_add_epi32(acc[i], _mm256_mullo_epi32(pixels, w));
            }
        }
        for (int i = 0; i < PHASH_SIDE / 8; i++) {
            avx2_store(thumb + yy * PHASH_SIDE + i * 8, acc[i]);
        }
    }
}
#endif

/* The 32x32 thumbnail of ImagingResample: horizontal pass first (over the rows the vertical pass
 * reads), then vertical; a pass is skipped where its axis is 32 already. The horizontal pass takes
 * PHASH_BLOCK rows at a time, greyed into column order (grey: width x PHASH_BLOCK), so that each
 * tap is one weight times a vector of rows; the vertical pass, one weight times a row of 32. */
static void
box_thumbnail(const uint8_t *pixels, Py_ssize_t width, int pixelsize, const int32_t *h_bounds, const int32_t *h_kk,
              int h_taps, int32_t *v_bounds, const int32_t *v_kk, int v_taps, Py_ssize_t height, uint8_t *grey,
              uint8_t *rows, uint8_t *thumb) {
    const int horizontal = width != PHASH_SIDE, vertical = height != PHASH_SIDE;
    const Py_ssize_t first = vertical ? v_bounds[0] : 0;
    const Py_ssize_t last = vertical ? v_bounds[(PHASH_SIDE - 1) * 2] + v_bounds[(PHASH_SIDE - 1) * 2 + 1] : PHASH_SIDE;
    for (Py_ssize_t y0 = first; y0 < last; y0 += PHASH_BLOCK) {
        const int block = last - y0 < PHASH_BLOCK ? (int)(last - y0) : PHASH_BLOCK;
        const uint8_t *lines = pixels + y0 * width * pixelsize;
        const Py_ssize_t stride = width * pixelsize;
        Py_ssize_t done = 0; /* the columns greyed so far */
#ifdef X86_VECTORS
        if (block == PHASH_BLOCK && pixelsize == 4 && isa >= ISA_AVX2) {
            done = grey_block_avx2(lines, stride, width, grey);
        }
#endif
        for (int r = 0; r < block; r++) {
            for (Py_ssize_t x = done; x < width; x++) {
                const uint8_t *p = lines + r * stride + x * pixelsize;
                grey[x * PHASH_BLOCK + r] = pixelsize == 4 ? grey_of(p) : p[0];
            }
        }
        uint8_t *out = rows + (y0 - first) * PHASH_SIDE;
        int xx = 0; /* the thumbnail columns done so far */
#ifdef X86_VECTORS
        if (horizontal && isa >= ISA_AVX2) {
            xx = box_columns_avx2(grey, h_bounds, h_kk, h_taps, block, out);
        }
#endif
        for (; xx < PHASH_SIDE; xx++) {
            int32_t acc[PHASH_BLOCK];
            for (int r = 0; r < PHASH_BLOCK; r++) {
                acc[r] = 1 << (PRECISION_BITS - 1);
            }
            if (horizontal) {
                const uint8_t *g = grey + (Py_ssize_t)h_bounds[xx * 2] * PHASH_BLOCK;
                const int32_t *k = h_kk + (Py_ssize_t)xx * h_taps;
                for (int t = 0; t < h_bounds[xx * 2 + 1]; t++) {
                    for (int r = 0; r < PHASH_BLOCK; r++) {
                        acc[r] += g[t * PHASH_BLOCK + r] * k[t];
                    }
                }
                for (int r = 0; r < block; r++) {
                    out[r * PHASH_SIDE + xx] = clip8(acc[r]);
                }
            } else {
                for (int r = 0; r < block; r++) {
                    out[r * PHASH_SIDE + xx] = grey[xx * PHASH_BLOCK + r];
                }
            }
        }
    }
    if (!vertical) {
        memcpy(thumb, rows, PHASH_SIDE * PHASH_SIDE);
        return;
    }
#ifdef X86_VECTORS
    if (isa >= ISA_AVX2) {
        box_rows_avx2(rows, first, v_bounds, v_kk, v_taps, thumb);
        return;
    }
#endif
    for (int yy = 0; yy < PHASH_SIDE; yy++) {
        int32_t acc[PHASH_SIDE];
        for (int xx = 0; xx < PHASH_SIDE; xx++) {
            acc[xx] = 1 << (PRECISION_BITS - 1);
        }
        const uint8_t *src = rows + (v_bounds[yy * 2] - first) * PHASH_SIDE; /* the rows begin at the first read */
        const int32_t *k = v_kk + (Py_ssize_t)yy * v_taps;
        for (int t = 0; t < v_bounds[yy * 2 + 1]; t++) {
            for (int xx = 0; xx < PHASH_SIDE; xx++) {
                acc[xx] += src[t * PHASH_SIDE + xx] * k[t];
            }
        }
        for (int xx = 0; xx < PHASH_SIDE; xx++) {
            thumb[yy * PHASH_SIDE + xx] = clip8(acc[xx]);
        }
    }
}

static int
compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* phash.py's DCT (dct @ thumb @ dct.T, rounded to 6 decimals as numpy rounds), median and bits. Each
 * sum is taken in order, and no multiply-add is fused (-ffp-contract=off). */
static uint64_t
dct_bits(const uint8_t *thumb, const double *dct) {
    double half[PHASH_KEPT][PHASH_SIDE], low[PHASH_KEPT * PHASH_KEPT], sorted[PHASH_KEPT * PHASH_KEPT];
    for (int k = 0; k < PHASH_KEPT; k++) { /* each sum over n in order, a row of 32 at a time */
        for (int c = 0; c < PHASH_SIDE; c++) {
            half[k][c] = 0.0;
        }
        for (int n = 0; n < PHASH_SIDE; n++) {
            for (int c = 0; c < PHASH_SIDE; c++) {
                half[k][c] += dct[k * PHASH_SIDE + n] * thumb[n * PHASH_SIDE + c];
            }
        }
    }
    for (int k = 0; k < PHASH_KEPT; k++) {
        for (int j = 0; j < PHASH_KEPT; j++) {
            double s = 0.0;
            for (int c = 0; c < PHASH_SIDE; c++) {
                s += half[k][c] * dct[j * PHASH_SIDE + c];
            }
            low[k * PHASH_KEPT + j] = sorted[k * PHASH_KEPT + j] = nearbyint(s * 1e6) / 1e6;
        }
    }
    qsort(sorted, PHASH_KEPT * PHASH_KEPT, sizeof(double), compare_doubles);
    const int middle = PHASH_KEPT * PHASH_KEPT / 2;
    const double median = (sorted[middle - 1] + sorted[middle]) / 2;
    uint64_t bits = 0;
    for (int i = 0; i < PHASH_KEPT * PHASH_KEPT; i++) {
        bits = bits << 1 | (low[i] > median);
    }
    return bits;
}

/* The hash of one image size: its thumbnail's coefficients and scratch, planned with the GIL held,
 * run without it. */
typedef struct {
    Py_ssize_t width, height;
    int32_t h_bounds[PHASH_SIDE * 2], v_bounds[PHASH_SIDE * 2];
    int h_taps, v_taps;
    int32_t *h_kk, *v_kk;
    uint8_t *grey, *rows;
} phash_plan;

static void
release_phash(phash_plan *p) {
    PyMem_RawFree(p->rows);
    PyMem_RawFree(p->grey);
    PyMem_RawFree(p->v_kk);
    PyMem_RawFree(p->h_kk);
    p->rows = p->grey = NULL, p->v_kk = p->h_kk = NULL;
}

/* Plans the hash of a width x height image (each side 1 to INT_MAX / 4); -1 with an exception, nothing
 * left to release. Called with the GIL held. */
static int
plan_phash(phash_plan *p, Py_ssize_t width, Py_ssize_t height) {
    memset(p, 0, sizeof(*p));
    p->width = width, p->height = height, p->h_taps = p->v_taps = 1;
    if (!(p->h_kk = box_coefficients(width, &p->h_taps, p->h_bounds)) ||
        !(p->v_kk = box_coefficients(height, &p->v_taps, p->v_bounds))) {
        release_phash(p);
        return -1;
    }
    Py_ssize_t kept_rows = height == PHASH_SIDE ? PHASH_SIDE : p->v_bounds[(PHASH_SIDE - 1) * 2] +
                                                                   p->v_bounds[(PHASH_SIDE - 1) * 2 + 1] - p->v_bounds[0];
    for (int i = 0; i < PHASH_SIDE; i++) { /* fill_coefficients keeps every tap inside its axis */
        if (p->h_bounds[i * 2] < 0 || p->h_bounds[i * 2] > width - p->h_bounds[i * 2 + 1] || p->v_bounds[i * 2] < 0 ||
            p->v_bounds[i * 2] > height - p->v_bounds[i * 2 + 1]) {
            PyErr_SetString(PyExc_ValueError, "a thumbnail pixel's taps reach outside the image");
            release_phash(p);
            return -1;
        }
    }
    p->grey = PyMem_RawCalloc(width, PHASH_BLOCK); /* a last block's missing rows: zeros, never stored */
    p->rows = PyMem_RawMalloc(kept_rows * PHASH_SIDE);
    if (!p->grey || !p->rows) {
        release_phash(p);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The hash of the planned image's pixels (pixelsize 1 or 4, contiguous rows); its thumbnail into thumb
 * (32 x 32 bytes). No GIL needed. */
static uint64_t
run_phash(const phash_plan *p, const uint8_t *pixels, int pixelsize, const double *dct, uint8_t *thumb) {
    box_thumbnail(pixels, p->width, pixelsize, p->h_bounds, p->h_kk, p->h_taps, (int32_t *)p->v_bounds, p->v_kk,
                  p->v_taps, p->height, p->grey, p->rows, thumb);
    return dct_bits(thumb, dct);
}

PyDoc_STRVAR(phash_doc,
"phash(pixels, width, height, pixelsize, dct, thumbnail=None)\n\n"
"The 64-bit DCT hash (phash.phash) of an image of height rows of width pixels (uint8, C order;\n"
"pixelsize 1: L, or 4: RGB as Pillow holds it, RGBX): Pillow's convert('L') and BOX resize to\n"
"32x32, then the 8x8 lowest frequencies of dct (float64, 8 x 32) @ thumbnail @ dct.T, rounded\n"
"to 6 decimals, each bit: above their median. Image.resize's own rules are the caller's (its\n"
"copy of a 32x32 image is this call's too). thumbnail: a writable buffer of 32x32 bytes that\n"
"gets the grey thumbnail (for tests). The GIL is released while it runs.");

static PyObject *
phash(PyObject *self, PyObject *args) {
    PyObject *pixels_obj, *dct_obj, *thumbnail_obj = Py_None;
    Py_ssize_t width, height;
    int pixelsize;
    Py_buffer pixels, dct;
    if (!PyArg_ParseTuple(args, "OnniO|O", &pixels_obj, &width, &height, &pixelsize, &dct_obj, &thumbnail_obj)) {
        return NULL;
    }
    if (width < 1 || height < 1 || width > INT_MAX / 4 || height > INT_MAX / 4 || (pixelsize != 1 && pixelsize != 4)) {
        PyErr_SetString(PyExc_ValueError, "sizes out of range");
        return NULL;
    }
    Py_ssize_t pixels_size = size_of(height, width, pixelsize, "pixels");
    if (pixels_size < 0) {
        return NULL;
    }
    if (get_buffer(pixels_obj, &pixels, pixels_size, 0, "pixels") < 0) {
        return NULL;
    }
    if (get_buffer(dct_obj, &dct, PHASH_KEPT * PHASH_SIDE * sizeof(double), 0, "dct") < 0) {
        PyBuffer_Release(&pixels);
        return NULL;
    }
    PyObject *result = NULL;
    phash_plan plan;
    if ((uintptr_t)dct.buf % sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "dct must be aligned to 8 bytes");
        goto release;
    }
    if (plan_phash(&plan, width, height) < 0) {
        goto release;
    }
    uint8_t thumb[PHASH_SIDE * PHASH_SIDE];
    uint64_t bits;
    Py_BEGIN_ALLOW_THREADS
    bits = run_phash(&plan, pixels.buf, pixelsize, dct.buf, thumb);
    Py_END_ALLOW_THREADS
    release_phash(&plan);
    result = PyLong_FromUnsignedLongLong(bits);
    if (thumbnail_obj != Py_None) {
        Py_buffer given;
        if (get_buffer(thumbnail_obj, &given, sizeof(thumb), 1, "thumbnail") < 0) {
            Py_CLEAR(result);
            goto release;
        }
        memcpy(given.buf, thumb, sizeof(thumb));
        PyBuffer_Release(&given);
    }
release:
    PyBuffer_Release(&dct);
    PyBuffer_Release(&pixels);
    return result;
}
