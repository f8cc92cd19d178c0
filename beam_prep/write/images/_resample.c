/* The resize kernel's loops: Pillow's bicubic resample (libImaging/Resample.c), one pass over
 * contiguous rows.
 *
 * Built by setup.py as the optional extension beam_prep.write.images._resample (where it is not
 * built, beam-prep resizes with Pillow's own loops: the same pixels). beam_prep/write/images/
 * resample.py holds every rule of Pillow's resize (pass order, shortcuts, box checks) and calls
 * resample_image, the whole resize in one call: Pillow's image read by its line pointers, both
 * passes, the output written into the image Pillow made for it. coefficients, filter_rows,
 * transpose and filter_pixels are its steps one by one (the tests call them).
 * docs/design/resizing.md says why the result is Pillow's byte for byte: the weights are Pillow's
 * few double operations in its order (compiled with -ffp-contract=off, so no fused multiply-add
 * changes a rounding), the rest is integer arithmetic. phash.py calls the perceptual hash
 * (_phash.h), which shares the weights' code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define PRECISION_BITS (32 - 8 - 2) /* Pillow's, for 8-bit images */

/* The vector loops (_resample_simd.h) are built for SSE4.1, AVX2 and AVX-512 on x86-64 with GCC or
 * clang, each function for its own target, and the one this CPU runs is chosen when the module
 * loads (set_isa overrides it): no build that another CPU cannot run. Elsewhere (another compiler
 * or CPU), the scalar loops alone. Integer arithmetic: the same bytes on every path. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define X86_VECTORS 1
#include <cpuid.h>
#include <immintrin.h>
#endif

static inline uint8_t
clip8(int32_t sum) {
    int32_t v = sum >> PRECISION_BITS;
    return v < 0 ? 0 : (v > 255 ? 255 : (uint8_t)v);
}

static inline uint32_t
load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline void
store_u32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
}

static inline double
bicubic_filter(double x) {
    /* Pillow's, a = -0.5, operations in its order */
    if (x < 0.0) {
        x = -x;
    }
    if (x < 1.0) {
        return ((-0.5 + 2.0) * x - (-0.5 + 3.0)) * x * x + 1;
    }
    if (x < 2.0) {
        return (((x - 5) * x + 8) * x - 4) * -0.5;
    }
    return 0.0;
}

/* a * b * c into *out, all non-negative; -1 where the product does not fit in a Py_ssize_t. */
static int
product(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, Py_ssize_t *out) {
    if (a < 0 || b < 0 || c < 0) {
        return -1;
    }
    if (b != 0 && a > PY_SSIZE_T_MAX / b) {
        return -1;
    }
    Py_ssize_t ab = a * b;
    if (c != 0 && ab > PY_SSIZE_T_MAX / c) {
        return -1;
    }
    *out = ab * c;
    return 0;
}

/* The size a * b * c, or -1 with ValueError where it does not fit (a hostile size). */
static Py_ssize_t
size_of(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, const char *name) {
    Py_ssize_t out;
    if (product(a, b, c, &out) < 0) {
        PyErr_Format(PyExc_ValueError, "%s's size overflows", name);
        return -1;
    }
    return out;
}

/* Whether two buffers share a byte: a writable one must not alias another. */
static int
overlap(const Py_buffer *a, const Py_buffer *b) {
    const char *a0 = a->buf, *b0 = b->buf;
    return a->len > 0 && b->len > 0 && a0 < b0 + b->len && b0 < a0 + a->len;
}

/* A writable or read-only buffer of at least `need` bytes, contiguous. */
static int
get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t need, int writable, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        return -1;
    }
    if (view->len < need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zd needed", name, view->len, need);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Whether every int32 buffer given is aligned to 4 bytes: the loops read and write them as int32_t (a
 * misaligned one is undefined behaviour, and the vectorised loops may assume the alignment). */
static int
aligned_4(const Py_buffer *const *views, int count) {
    for (int i = 0; i < count; i++) {
        if ((uintptr_t)views[i]->buf % 4) {
            PyErr_SetString(PyExc_ValueError, "int32 buffers must be aligned to 4 bytes");
            return 0;
        }
    }
    return 1;
}

/* Pillow's precompute_coeffs and normalize_coeffs_8bpc for one axis (filter and its support at scale
 * 1 as Pillow's struct filter holds them) into bounds (out_size x 2) and kk (out_size x taps), with
 * k (taps doubles) as scratch; NULL, or why the arguments cannot be Pillow's (nothing is raised). */
static const char *
fill_coefficients(int in_size, float in0, float in1, int out_size, int taps, double (*filter)(double),
                  double filter_support, int32_t *bounds, int32_t *kk, double *k) {
    double scale = (double)(in1 - in0) / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = filter_support * filterscale;
    double inv_filterscale = 1.0 / filterscale;
    for (Py_ssize_t xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        /* Pillow's (int) then clip, clipped first: the same ints, and no cast out of int's range */
        double lo = center - support + 0.5, hi = center + support + 0.5;
        int xmin = lo < 0 ? 0 : (int)lo;
        int xmax = hi >= in_size ? in_size : (int)hi;
        xmax -= xmin;
        if (xmax < 0 || xmax > taps) {
            return "a pixel's taps do not fit";
        }
        int x;
        for (x = 0; x < xmax; x++) {
            double w = filter((x + xmin - center + 0.5) * inv_filterscale);
            k[x] = w;
            ww += w;
        }
        if (ww != 0.0) {
            for (x = 0; x < xmax; x++) {
                k[x] /= ww;
            }
        }
        for (; x < taps; x++) {
            k[x] = 0;
        }
        for (x = 0; x < taps; x++) {
            double scaled = k[x] * (1 << PRECISION_BITS);
            if (!(scaled > -INT_MAX && scaled < INT_MAX)) {
                return "a weight does not fit in 32 bits";
            }
            kk[xx * taps + x] = k[x] < 0 ? (int)(-0.5 + scaled) : (int)(0.5 + scaled);
        }
        bounds[xx * 2 + 0] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    return NULL;
}

PyDoc_STRVAR(coefficients_doc,
"coefficients(in_size, in0, in1, out_size, taps, bounds, weights)\n\n"
"Pillow's precompute_coeffs and normalize_coeffs_8bpc for one axis: fills bounds (int32,\n"
"out_size x 2: first source pixel, tap count) and weights (int32, out_size x taps).");

static PyObject *
coefficients(PyObject *self, PyObject *args) {
    int in_size, out_size, taps;
    float in0, in1;
    PyObject *bounds_obj, *weights_obj;
    Py_buffer bounds_view, weights_view;
    if (!PyArg_ParseTuple(args, "iffiiOO", &in_size, &in0, &in1, &out_size, &taps, &bounds_obj, &weights_obj)) {
        return NULL;
    }
    /* _imaging.c's checks, each written so that NaN fails it (float against int, as there) */
    if (out_size < 1 || in_size < 1 || !(in0 >= 0) || !(in1 <= in_size) || !(in1 - in0 >= 0)) {
        PyErr_SetString(PyExc_ValueError, "sizes or box out of range");
        return NULL;
    }
    double scale = (double)(in1 - in0) / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * filterscale;
    if (support >= INT_MAX / 4 || taps != (int)ceil(support) * 2 + 1) {
        PyErr_SetString(PyExc_ValueError, "sizes or taps do not match the box");
        return NULL;
    }
    Py_ssize_t bounds_size = size_of(out_size, 2, 4, "bounds"), weights_size = size_of(out_size, taps, 4, "weights");
    if (bounds_size < 0 || weights_size < 0) {
        return NULL;
    }
    if (get_buffer(bounds_obj, &bounds_view, bounds_size, 1, "bounds") < 0) {
        return NULL;
    }
    if (get_buffer(weights_obj, &weights_view, weights_size, 1, "weights") < 0) {
        PyBuffer_Release(&bounds_view);
        return NULL;
    }
    if (overlap(&bounds_view, &weights_view)) {
        PyErr_SetString(PyExc_ValueError, "bounds and weights overlap");
        goto release;
    }
    const Py_buffer *int32_views[] = {&bounds_view, &weights_view};
    if (!aligned_4(int32_views, 2)) {
        goto release;
    }
    int32_t *bounds = bounds_view.buf, *kk = weights_view.buf;
    double *k = PyMem_Malloc(taps * sizeof(double));
    if (!k) {
        PyErr_NoMemory();
        goto release;
    }
    const char *error = fill_coefficients(in_size, in0, in1, out_size, taps, bicubic_filter, 2.0, bounds, kk, k);
    if (error) {
        PyErr_SetString(PyExc_ValueError, error);
        goto free_k;
    }
    PyMem_Free(k);
    PyBuffer_Release(&bounds_view);
    PyBuffer_Release(&weights_view);
    Py_RETURN_NONE;
free_k:
    PyMem_Free(k);
release:
    PyBuffer_Release(&bounds_view);
    PyBuffer_Release(&weights_view);
    return NULL;
}

/* The scalar loops: the reference every vector path is checked against, and the path where none
 * is built. Each row of out: the weighted sum of the rows of src its bounds name, clipped to 8
 * bits. Integer sums in any order are Pillow's exactly: every sum fits in 32 bits (filter_rows
 * checks it), and the int32 arithmetic wraps nowhere else. */
#if defined(X86_VECTORS) && defined(__GNUC__) && !defined(__clang__)
/* where the vector paths are built, the scalar one stays scalar: a reference of its own. Elsewhere
 * (ARM) it is the only path, and the compiler vectorises it (NEON): integer sums, the same bytes. */
#define SCALAR __attribute__((optimize("no-tree-vectorize")))
#else
#define SCALAR
#endif

SCALAR static void
vertical_scalar(const uint8_t *src, Py_ssize_t width, const int32_t *bounds, const int32_t *weights, int taps,
                Py_ssize_t src_first, uint8_t *out, Py_ssize_t out_rows, int32_t *acc) {
    for (Py_ssize_t yy = 0; yy < out_rows; yy++) {
        const Py_ssize_t first = bounds[yy * 2] - src_first;
        const int count = bounds[yy * 2 + 1];
        const int32_t *k = &weights[yy * taps];
        for (Py_ssize_t i = 0; i < width; i++) {
            acc[i] = 1 << (PRECISION_BITS - 1);
        }
        for (int y = 0; y < count; y++) {
            const uint8_t *row = src + (first + y) * width;
            const int32_t w = k[y];
            for (Py_ssize_t i = 0; i < width; i++) {
                acc[i] += row[i] * w;
            }
        }
        uint8_t *line = out + yy * width;
        for (Py_ssize_t i = 0; i < width; i++) {
            line[i] = clip8(acc[i]);
        }
    }
}

/* The horizontal pass over rows of 4-byte pixels, each output pixel's 4 channels the weighted sum
 * of the source pixels its bounds name; xw: each tap's weight 4 times (expand_weights). */
SCALAR static void
horizontal4_scalar(const uint8_t *src, Py_ssize_t stride, Py_ssize_t rows, Py_ssize_t src_cols,
                   const int32_t *bounds, const int32_t *xw, int xtaps, uint8_t *out, Py_ssize_t out_w) {
    (void)src_cols;
    for (Py_ssize_t y = 0; y < rows; y++) {
        for (Py_ssize_t x = 0; x < out_w; x++) {
            const uint8_t *p = src + y * stride + (Py_ssize_t)bounds[x * 2] * 4;
            const int count = bounds[x * 2 + 1];
            const int32_t *k = xw + x * xtaps * 4;
            int32_t a[4] = {1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1),
                            1 << (PRECISION_BITS - 1)};
            for (int t = 0; t < count; t++) {
                for (int c = 0; c < 4; c++) {
                    a[c] += p[t * 4 + c] * k[t * 4 + c];
                }
            }
            uint8_t *o = out + (y * out_w + x) * 4;
            for (int c = 0; c < 4; c++) {
                o[c] = clip8(a[c]);
            }
        }
    }
}

#ifdef X86_VECTORS
#define SUFFIX sse4
#define TARGET __attribute__((target("sse4.1")))
#define VEC __m128i
#define LANES 4
#define STRIP 8
#define V_PIXELS(p) _mm_cvtepu8_epi32(_mm_cvtsi32_si128(load_u32(p)))
#define V_WEIGHTS(p) _mm_loadu_si128((const __m128i *)(p))
#define V_SET1(w) _mm_set1_epi32(w)
#define V_ZERO() _mm_setzero_si128()
#define V_ADD(a, b) _mm_add_epi32((a), (b))
#define V_MUL(a, b) _mm_mullo_epi32((a), (b))
#define V_STORE(p, v) store_u32((p), (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16( \
    _mm_packs_epi32(_mm_srai_epi32((v), PRECISION_BITS), _mm_setzero_si128()), _mm_setzero_si128())))
#define V_FOLD(v) (v)
#include "_resample_simd.h"
#undef SUFFIX
#undef TARGET
#undef VEC
#undef LANES
#undef STRIP
#undef V_PIXELS
#undef V_WEIGHTS
#undef V_SET1
#undef V_ZERO
#undef V_ADD
#undef V_MUL
#undef V_STORE
#undef V_FOLD

#define SUFFIX avx2
#define TARGET __attribute__((target("avx2")))
#define VEC __m256i
#define LANES 8
#define STRIP 8
#define V_PIXELS(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define V_WEIGHTS(p) _mm256_loadu_si256((const __m256i *)(p))
#define V_SET1(w) _mm256_set1_epi32(w)
#define V_ZERO() _mm256_setzero_si256()
#define V_ADD(a, b) _mm256_add_epi32((a), (b))
#define V_MUL(a, b) _mm256_mullo_epi32((a), (b))
#define V_STORE(p, v) avx2_store((p), (v))
#define V_FOLD(v) _mm_add_epi32(_mm256_extracti128_si256((v), 0), _mm256_extracti128_si256((v), 1))
TARGET static inline void
avx2_store(uint8_t *p, __m256i v) {
    v = _mm256_srai_epi32(v, PRECISION_BITS);
    __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(words, words));
}
#include "_resample_simd.h"
#undef SUFFIX
#undef TARGET
#undef VEC
#undef LANES
#undef STRIP
#undef V_PIXELS
#undef V_WEIGHTS
#undef V_SET1
#undef V_ZERO
#undef V_ADD
#undef V_MUL
#undef V_STORE
#undef V_FOLD

#define SUFFIX avx512
#define TARGET __attribute__((target("avx512f")))
#define VEC __m512i
#define LANES 16
#define STRIP 8
#define V_PIXELS(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define V_WEIGHTS(p) _mm512_loadu_si512((const void *)(p))
#define V_SET1(w) _mm512_set1_epi32(w)
#define V_ZERO() _mm512_setzero_si512()
#define V_ADD(a, b) _mm512_add_epi32((a), (b))
#define V_MUL(a, b) _mm512_mullo_epi32((a), (b))
#define V_STORE(p, v) _mm_storeu_si128((__m128i *)(p), _mm512_cvtusepi32_epi8( \
    _mm512_max_epi32(_mm512_srai_epi32((v), PRECISION_BITS), _mm512_setzero_si512())))
#define V_FOLD(v) avx512_fold(v)
TARGET static inline __m128i
avx512_fold(__m512i v) {
    __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}
#include "_resample_simd.h"
#undef SUFFIX
#undef TARGET
#undef VEC
#undef LANES
#undef STRIP
#undef V_PIXELS
#undef V_WEIGHTS
#undef V_SET1
#undef V_ZERO
#undef V_ADD
#undef V_MUL
#undef V_STORE
#undef V_FOLD
#endif /* X86_VECTORS */

/* The instruction sets, the loops of each, and the one in use (chosen at load, or by set_isa). */
enum { ISA_SCALAR, ISA_SSE4, ISA_AVX2, ISA_AVX512, ISA_COUNT };
static const char *const ISA_NAMES[ISA_COUNT] = {"scalar", "sse4", "avx2", "avx512"};
static int isa = ISA_SCALAR;
static int preferred = ISA_SCALAR; /* the one chosen at load */

/* Whether this build has the loops for `which` and this CPU (and its OS) runs them. */
static int
isa_runs(int which) {
    switch (which) {
    case ISA_SCALAR:
        return 1;
#ifdef X86_VECTORS
    case ISA_SSE4:
        return __builtin_cpu_supports("sse4.1");
    case ISA_AVX2:
        return __builtin_cpu_supports("avx2");
    case ISA_AVX512:
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

/* Whether this CPU runs AVX-512 as two 256-bit halves: AMD family 19h (Zen 4), where the RGB loops'
 * 512-bit multiplies cost more than AVX2's (measured: docs/design/resizing.md). */
static int
split_avx512(void) {
#ifdef X86_VECTORS
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
        return 0;
    }
    const int amd = ebx == 0x68747541 && edx == 0x69746e65 && ecx == 0x444d4163; /* "AuthenticAMD" */
    if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
        return 0;
    }
    const unsigned int family = ((eax >> 8) & 0xf) + ((eax >> 8 & 0xf) == 0xf ? (eax >> 20) & 0xff : 0);
    return family == 0x19;
#else
    return 0;
#endif
}

/* Each of out's out_rows rows (width bytes) the weighted sum of the rows of src its bounds name,
 * src's first row being row `first` of the bounds' axis; acc: scratch of width int32 (the scalar
 * loops'). */
static void
vertical(const uint8_t *src, Py_ssize_t width, const int32_t *bounds, const int32_t *weights, int taps,
         Py_ssize_t first, uint8_t *out, Py_ssize_t out_rows, int32_t *acc) {
    switch (isa) {
#ifdef X86_VECTORS
    case ISA_SSE4:
        vertical_sse4(src, width, bounds, weights, taps, first, out, out_rows);
        return;
    case ISA_AVX2:
        vertical_avx2(src, width, bounds, weights, taps, first, out, out_rows);
        return;
    case ISA_AVX512:
        vertical_avx512(src, width, bounds, weights, taps, first, out, out_rows);
        return;
#endif
    default:
        vertical_scalar(src, width, bounds, weights, taps, first, out, out_rows, acc);
    }
}

static void
horizontal4(const uint8_t *src, Py_ssize_t stride, Py_ssize_t rows, Py_ssize_t src_cols, const int32_t *bounds,
            const int32_t *xw, int xtaps, uint8_t *out, Py_ssize_t out_w) {
    switch (isa) {
#ifdef X86_VECTORS
    case ISA_SSE4:
        horizontal4_sse4(src, stride, rows, src_cols, bounds, xw, xtaps, out, out_w);
        return;
    case ISA_AVX2:
        horizontal4_avx2(src, stride, rows, src_cols, bounds, xw, xtaps, out, out_w);
        return;
    case ISA_AVX512:
        horizontal4_avx512(src, stride, rows, src_cols, bounds, xw, xtaps, out, out_w);
        return;
#endif
    default:
        horizontal4_scalar(src, stride, rows, src_cols, bounds, xw, xtaps, out, out_w);
    }
}

/* Whether every row's bounds stay inside src and its taps, and its weights keep every partial sum
 * in 32 bits (Pillow's weights do, by far); written so that no check overflows. */
static int
rows_are_safe(const int32_t *bounds, const int32_t *weights, int taps, Py_ssize_t out_rows, Py_ssize_t src_rows) {
    for (Py_ssize_t yy = 0; yy < out_rows; yy++) {
        const int32_t first = bounds[yy * 2], count = bounds[yy * 2 + 1];
        if (first < 0 || count < 0 || count > taps || first > src_rows - count) {
            PyErr_Format(PyExc_ValueError, "row %zd's taps reach outside the source", yy);
            return 0;
        }
        int64_t total = 0; /* at most taps * 2**31 < 2**62 */
        for (int y = 0; y < count; y++) {
            int64_t w = weights[yy * taps + y];
            total += w < 0 ? -w : w;
        }
        if (total > (INT32_MAX - (1 << (PRECISION_BITS - 1))) / 255) {
            PyErr_Format(PyExc_ValueError, "row %zd's weights could overflow a 32-bit sum", yy);
            return 0;
        }
    }
    return 1;
}

PyDoc_STRVAR(filter_rows_doc,
"filter_rows(src, src_rows, width, bounds, weights, taps, out, out_rows, acc)\n\n"
"Each of out's out_rows rows of width bytes (uint8) is the weighted sum of the rows of src\n"
"(src_rows x width) its bounds name, with Pillow's rounding and clipping; acc: int32 scratch\n"
"of width. The GIL is released while it runs.");

static PyObject *
filter_rows(PyObject *self, PyObject *args) {
    PyObject *src_obj, *bounds_obj, *weights_obj, *out_obj, *acc_obj;
    Py_ssize_t src_rows, width;
    int taps, out_rows;
    Py_buffer src, bounds, weights, out, acc;
    if (!PyArg_ParseTuple(args, "OnnOOiOiO", &src_obj, &src_rows, &width, &bounds_obj, &weights_obj, &taps,
                          &out_obj, &out_rows, &acc_obj)) {
        return NULL;
    }
    if (src_rows < 0 || width < 0 || taps < 1 || out_rows < 0) {
        PyErr_SetString(PyExc_ValueError, "negative size");
        return NULL;
    }
    Py_ssize_t src_size = size_of(src_rows, width, 1, "src"), bounds_size = size_of(out_rows, 2, 4, "bounds"),
               weights_size = size_of(out_rows, taps, 4, "weights"), out_size = size_of(out_rows, width, 1, "out"),
               acc_size = size_of(width, 4, 1, "acc");
    if (src_size < 0 || bounds_size < 0 || weights_size < 0 || out_size < 0 || acc_size < 0) {
        return NULL;
    }
    if (get_buffer(src_obj, &src, src_size, 0, "src") < 0) {
        return NULL;
    }
    if (get_buffer(bounds_obj, &bounds, bounds_size, 0, "bounds") < 0) {
        goto release_src;
    }
    if (get_buffer(weights_obj, &weights, weights_size, 0, "weights") < 0) {
        goto release_bounds;
    }
    if (get_buffer(out_obj, &out, out_size, 1, "out") < 0) {
        goto release_weights;
    }
    if (get_buffer(acc_obj, &acc, acc_size, 1, "acc") < 0) {
        goto release_out;
    }
    if (overlap(&out, &src) || overlap(&out, &bounds) || overlap(&out, &weights) || overlap(&out, &acc) ||
        overlap(&acc, &src) || overlap(&acc, &bounds) || overlap(&acc, &weights)) {
        PyErr_SetString(PyExc_ValueError, "out or acc overlaps another buffer");
        goto release_acc;
    }
    const Py_buffer *int32_views[] = {&bounds, &weights, &acc};
    if (!aligned_4(int32_views, 3) || !rows_are_safe(bounds.buf, weights.buf, taps, out_rows, src_rows)) {
        goto release_acc;
    }
    Py_BEGIN_ALLOW_THREADS
    vertical(src.buf, width, bounds.buf, weights.buf, taps, 0, out.buf, out_rows, acc.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&acc);
    PyBuffer_Release(&out);
    PyBuffer_Release(&weights);
    PyBuffer_Release(&bounds);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
release_acc:
    PyBuffer_Release(&acc);
release_out:
    PyBuffer_Release(&out);
release_weights:
    PyBuffer_Release(&weights);
release_bounds:
    PyBuffer_Release(&bounds);
release_src:
    PyBuffer_Release(&src);
    return NULL;
}

PyDoc_STRVAR(filter_pixels_doc,
"filter_pixels(src, src_rows, src_cols, y0, rows, bounds, weights, taps, out, out_w)\n\n"
"The horizontal pass over 4-byte pixels, in place: each of out's rows x out_w pixels (uint8,\n"
"4 bytes each) is the weighted sum of the pixels of src's row y0 + its row (src: src_rows x\n"
"src_cols pixels) its bounds (int32, out_w x 2: first source pixel, tap count) and weights\n"
"(int32, out_w x taps) name, with Pillow's rounding and clipping. The GIL is released while it runs.");

static PyObject *
filter_pixels(PyObject *self, PyObject *args) {
    PyObject *src_obj, *bounds_obj, *weights_obj, *out_obj;
    Py_ssize_t src_rows, src_cols, y0, rows, out_w;
    int taps;
    Py_buffer src, bounds, weights, out;
    if (!PyArg_ParseTuple(args, "OnnnnOOiOn", &src_obj, &src_rows, &src_cols, &y0, &rows, &bounds_obj,
                          &weights_obj, &taps, &out_obj, &out_w)) {
        return NULL;
    }
    /* a difference of non-negative sizes: no sum that could overflow */
    if (src_rows < 0 || src_cols < 0 || y0 < 0 || rows < 0 || out_w < 0 || taps < 1 || y0 > src_rows - rows) {
        PyErr_SetString(PyExc_ValueError, "the rows are not inside the source");
        return NULL;
    }
    Py_ssize_t src_size = size_of(src_rows, src_cols, 4, "src"), bounds_size = size_of(out_w, 2, 4, "bounds"),
               weights_size = size_of(out_w, taps, 4, "weights"), out_size = size_of(rows, out_w, 4, "out"),
               expanded_size = size_of(out_w, ((Py_ssize_t)taps + 3) / 4, 64, "the expanded weights");
    if (src_size < 0 || bounds_size < 0 || weights_size < 0 || out_size < 0 || expanded_size < 0) {
        return NULL;
    }
    if (get_buffer(src_obj, &src, src_size, 0, "src") < 0) {
        return NULL;
    }
    if (get_buffer(bounds_obj, &bounds, bounds_size, 0, "bounds") < 0) {
        goto release_src;
    }
    if (get_buffer(weights_obj, &weights, weights_size, 0, "weights") < 0) {
        goto release_bounds;
    }
    if (get_buffer(out_obj, &out, out_size, 1, "out") < 0) {
        goto release_weights;
    }
    if (overlap(&out, &src) || overlap(&out, &bounds) || overlap(&out, &weights)) {
        PyErr_SetString(PyExc_ValueError, "out overlaps another buffer");
        goto release_out;
    }
    if (!rows_are_safe(bounds.buf, weights.buf, taps, out_w, src_cols)) {
        goto release_out;
    }
    if (rows > 0 && out_w > 0) { /* else no pixel: y0 may be src_rows */
        /* each tap's weight once a channel, so that a vector of taps multiplies a vector of pixels */
        int32_t *expanded = PyMem_RawMalloc(expanded_size);
        if (!expanded) {
            PyErr_NoMemory();
            goto release_out;
        }
        const int32_t *w = weights.buf, *b = bounds.buf;
        const int xtaps = (taps + 3) / 4 * 4; /* whole vectors of 4 taps, the most AVX-512 reads at once */
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t x = 0; x < out_w; x++) {
            for (int t = 0; t < xtaps; t++) {
                const int32_t v = t < b[x * 2 + 1] ? w[x * taps + t] : 0;
                int32_t *e = expanded + (x * xtaps + t) * 4;
                e[0] = e[1] = e[2] = e[3] = v;
            }
        }
        horizontal4((const uint8_t *)src.buf + y0 * src_cols * 4, src_cols * 4, rows, src_cols, bounds.buf, expanded,
                    xtaps, out.buf, out_w);
        Py_END_ALLOW_THREADS
        PyMem_RawFree(expanded);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&weights);
    PyBuffer_Release(&bounds);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
release_out:
    PyBuffer_Release(&out);
release_weights:
    PyBuffer_Release(&weights);
release_bounds:
    PyBuffer_Release(&bounds);
release_src:
    PyBuffer_Release(&src);
    return NULL;
}

PyDoc_STRVAR(isas_doc,
"isas()\n\n"
"The instruction sets whose loops this build has and this CPU runs, slowest first: scalar, then\n"
"any of sse4, avx2, avx512.");

static PyObject *
isas(PyObject *self, PyObject *unused) {
    PyObject *names = PyList_New(0);
    for (int i = 0; names && i < ISA_COUNT; i++) {
        if (isa_runs(i)) {
            PyObject *name = PyUnicode_FromString(ISA_NAMES[i]);
            if (!name || PyList_Append(names, name) < 0) {
                Py_XDECREF(name);
                Py_CLEAR(names);
                break;
            }
            Py_DECREF(name);
        }
    }
    return names;
}

PyDoc_STRVAR(get_isa_doc, "get_isa()\n\nThe instruction set whose loops run: preferred_isa(), or set_isa's.");

static PyObject *
get_isa(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(ISA_NAMES[isa]);
}

PyDoc_STRVAR(preferred_isa_doc,
"preferred_isa()\n\n"
"The instruction set chosen when the module loaded: the widest of isas(), but avx2 on a CPU that\n"
"runs AVX-512 as two 256-bit halves (AMD's Zen 4), where it is slower.");

static PyObject *
preferred_isa(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(ISA_NAMES[preferred]);
}

PyDoc_STRVAR(set_isa_doc,
"set_isa(name)\n\n"
"Runs the loops of instruction set `name` (one of isas()) from now on, in this process: to\n"
"compare the paths. ValueError for a name this build or CPU does not run.");

static PyObject *
set_isa(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) {
        return NULL;
    }
    for (int i = 0; i < ISA_COUNT; i++) {
        if (strcmp(name, ISA_NAMES[i]) == 0) {
            if (!isa_runs(i)) {
                PyErr_Format(PyExc_ValueError, "this %s does not run the %s loops",
                             i == ISA_AVX512 || i == ISA_AVX2 || i == ISA_SSE4 ? "build or CPU" : "build", name);
                return NULL;
            }
            isa = i;
            Py_RETURN_NONE;
        }
    }
    PyErr_Format(PyExc_ValueError, "no instruction set %R: one of scalar, sse4, avx2, avx512", arg);
    return NULL;
}

/* out (cols x rows) = the rows x cols block of src at (y0, x0) transposed, in 4x4 tiles. */
#define TRANSPOSE(T)                                                                              \
    static void transpose_##T(const T *src, Py_ssize_t stride, Py_ssize_t rows, Py_ssize_t cols,  \
                              T *out) {                                                           \
        Py_ssize_t whole_rows = rows - rows % 4, whole_cols = cols - cols % 4;                    \
        for (Py_ssize_t r0 = 0; r0 < whole_rows; r0 += 4) {                                       \
            for (Py_ssize_t c0 = 0; c0 < whole_cols; c0 += 4) {                                   \
                for (int i = 0; i < 4; i++) {                                                     \
                    for (int j = 0; j < 4; j++) {                                                 \
                        out[(c0 + j) * rows + r0 + i] = src[(r0 + i) * stride + c0 + j];          \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            for (Py_ssize_t c = whole_cols; c < cols; c++) {                                      \
                for (int i = 0; i < 4; i++) {                                                     \
                    out[c * rows + r0 + i] = src[(r0 + i) * stride + c];                          \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        for (Py_ssize_t r = whole_rows; r < rows; r++) {                                          \
            for (Py_ssize_t c = 0; c < cols; c++) {                                               \
                out[c * rows + r] = src[r * stride + c];                                          \
            }                                                                                     \
        }                                                                                         \
    }
TRANSPOSE(uint8_t)
TRANSPOSE(uint32_t)

PyDoc_STRVAR(transpose_doc,
"transpose(src, src_rows, src_cols, y0, x0, rows, cols, itemsize, out)\n\n"
"out (cols x rows pixels of itemsize 1 or 4 bytes) = the rows x cols block of src (src_rows x\n"
"src_cols pixels, C order) at (y0, x0), transposed. The GIL is released while it runs.");

static PyObject *
transpose(PyObject *self, PyObject *args) {
    PyObject *src_obj, *out_obj;
    Py_ssize_t src_rows, src_cols, y0, x0, rows, cols;
    int itemsize;
    Py_buffer src, out;
    if (!PyArg_ParseTuple(args, "OnnnnnniO", &src_obj, &src_rows, &src_cols, &y0, &x0, &rows, &cols, &itemsize,
                          &out_obj)) {
        return NULL;
    }
    /* each a difference of non-negative sizes: no sum that could overflow */
    if ((itemsize != 1 && itemsize != 4) || src_rows < 0 || src_cols < 0 || y0 < 0 || x0 < 0 || rows < 0 ||
        cols < 0 || y0 > src_rows - rows || x0 > src_cols - cols) {
        PyErr_SetString(PyExc_ValueError, "the block is not inside the source");
        return NULL;
    }
    Py_ssize_t src_size = size_of(src_rows, src_cols, itemsize, "src"), out_size = size_of(rows, cols, itemsize, "out");
    if (src_size < 0 || out_size < 0) {
        return NULL;
    }
    if (get_buffer(src_obj, &src, src_size, 0, "src") < 0) {
        return NULL;
    }
    if (get_buffer(out_obj, &out, out_size, 1, "out") < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (overlap(&src, &out)) {
        PyErr_SetString(PyExc_ValueError, "out overlaps src");
        goto release;
    }
    if (itemsize == 4 && ((uintptr_t)src.buf % 4 || (uintptr_t)out.buf % 4)) {
        PyErr_SetString(PyExc_ValueError, "4-byte pixels must be aligned");
        goto release;
    }
    if (rows > 0 && cols > 0) { /* else no pixel: the block's corner may lie past src's end */
        Py_BEGIN_ALLOW_THREADS
        if (itemsize == 4) {
            transpose_uint32_t((const uint32_t *)src.buf + y0 * src_cols + x0, src_cols, rows, cols, out.buf);
        } else {
            transpose_uint8_t((const uint8_t *)src.buf + y0 * src_cols + x0, src_cols, rows, cols, out.buf);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
release:
    PyBuffer_Release(&out);
    PyBuffer_Release(&src);
    return NULL;
}

#include "_phash.h"

/* ---- The whole resize in one call (resample_image): Pillow's image in, Pillow's image out ---- */

/* The head of Pillow's struct ImagingMemoryInstance (libImaging/Imaging.h), up to the line size: before
 * Pillow 12.0 the mode is its name (char[7]), from 12.0 its number (ModeID); the fields after it are
 * the same in both (resample_loader.PillowRules.mode_name says which a version has). */
#define IMAGING_HEAD                                                                                   \
    int type;                                                                                          \
    int depth;                                                                                         \
    int bands;                                                                                         \
    int xsize;                                                                                         \
    int ysize;                                                                                         \
    void *palette;                                                                                     \
    uint8_t **image8;                                                                                  \
    int32_t **image32;                                                                                 \
    char **image;                                                                                      \
    char *block;                                                                                       \
    void *blocks;                                                                                      \
    int pixelsize;                                                                                     \
    int linesize;
typedef struct {
    char mode[7];
    IMAGING_HEAD
} imaging_head_named;
typedef struct {
    int mode;
    IMAGING_HEAD
} imaging_head_numbered;
#undef IMAGING_HEAD

/* The line pointers of the Pillow image `core` (an ImagingCore: Image.im), checked to be width x
 * height pixels of pixelsize bytes in lines of width * pixelsize bytes; -1 with TypeError (not an
 * image core) or ValueError (not that image, or a struct not laid out as `mode_name` says). */
static int
pillow_lines(PyObject *core, int mode_name, Py_ssize_t width, Py_ssize_t height, int pixelsize, uint8_t ***lines) {
    PyObject *capsule = PyObject_GetAttrString(core, "ptr");
    if (!capsule || !PyCapsule_IsValid(capsule, "Pillow Imaging")) {
        Py_XDECREF(capsule);
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "src and dst must be Pillow image cores (Image.im)");
        return -1;
    }
    const void *im = PyCapsule_GetPointer(capsule, "Pillow Imaging");
    Py_DECREF(capsule); /* the capsule does not own the image: core does, and the caller holds core */
    int xsize, ysize, size, linesize;
    uint8_t **found;
    char **image;
    if (mode_name) {
        const imaging_head_named *head = im;
        xsize = head->xsize, ysize = head->ysize, size = head->pixelsize, linesize = head->linesize;
        found = size == 1 ? head->image8 : (uint8_t **)head->image32, image = head->image;
    } else {
        const imaging_head_numbered *head = im;
        xsize = head->xsize, ysize = head->ysize, size = head->pixelsize, linesize = head->linesize;
        found = size == 1 ? head->image8 : (uint8_t **)head->image32, image = head->image;
    }
    if (xsize != width || ysize != height || size != pixelsize || linesize != width * pixelsize || !found ||
        (void *)found != (void *)image) {
        PyErr_Format(PyExc_ValueError,
                     "an image core is not %zd x %zd pixels of %d bytes, or Pillow's image struct is not laid out "
                     "as this version's was",
                     width, height, pixelsize);
        return -1;
    }
    *lines = found;
    return 0;
}

/* Whether the lines lie one after the other from the first (Pillow pads them, PILLOW_ALIGNMENT, or
 * keeps them in several blocks, each line in one). */
static int
lines_follow(uint8_t *const *lines, Py_ssize_t height, Py_ssize_t linesize) {
    for (Py_ssize_t y = 1; y < height; y++) {
        if (lines[y] != lines[0] + y * linesize) {
            return 0;
        }
    }
    return 1;
}

/* One axis's bounds and weights (Pillow's, checked as rows_are_safe checks them) and, for the
 * horizontal pass over 4-byte pixels, each weight once a channel (expanded). Counted references:
 * the last axes are kept for the next image of the same geometry (kept_resize_axes), and a resize
 * holds its own reference while it runs without the GIL; both taken and dropped with the GIL held. */
typedef struct {
    Py_ssize_t refs;
    int in_size, out_size;
    uint32_t in0_bits, in1_bits; /* the box, as float32 bits */
    int taps, xtaps;             /* xtaps: the taps rounded up to whole vectors of 4 (expanded's) */
    int32_t *bounds, *kk, *expanded;
    Py_ssize_t first, end; /* the first source pixel any output reads, and one past the last */
} resize_axis;

#define KEPT_RESIZE_AXES 4
#define KEPT_RESIZE_BYTES (1 << 22) /* an axis kept whole, expanded weights included: up to 4 MB */
static resize_axis *kept_resize_axes[KEPT_RESIZE_AXES];
static int next_resize_axis;

static void
axis_release(resize_axis *axis) {
    if (axis && --axis->refs == 0) {
        PyMem_RawFree(axis->expanded);
        PyMem_RawFree(axis->kk);
        PyMem_RawFree(axis->bounds);
        PyMem_RawFree(axis);
    }
}

/* A new axis (one reference) with Pillow's coefficients from in_size to out_size over [in0, in1];
 * NULL with ValueError (coefficients' checks) or MemoryError. */
static resize_axis *
axis_new(int in_size, float in0, float in1, int out_size) {
    if (out_size < 1 || in_size < 1 || !(in0 >= 0) || !(in1 <= in_size) || !(in1 - in0 >= 0)) {
        PyErr_SetString(PyExc_ValueError, "sizes or box out of range");
        return NULL;
    }
    double scale = (double)(in1 - in0) / out_size;
    double support = 2.0 * (scale < 1.0 ? 1.0 : scale);
    if (support >= INT_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "sizes or taps do not match the box");
        return NULL;
    }
    int taps = (int)ceil(support) * 2 + 1;
    Py_ssize_t bounds_size = size_of(out_size, 2, 4, "bounds"), weights_size = size_of(out_size, taps, 4, "weights");
    if (bounds_size < 0 || weights_size < 0) {
        return NULL;
    }
    resize_axis *axis = PyMem_RawCalloc(1, sizeof(resize_axis));
    double *k = PyMem_RawMalloc((size_t)taps * sizeof(double));
    if (axis) {
        axis->refs = 1;
        axis->bounds = PyMem_RawMalloc(bounds_size);
        axis->kk = PyMem_RawMalloc(weights_size);
    }
    if (!axis || !k || !axis->bounds || !axis->kk) {
        PyMem_RawFree(k);
        axis_release(axis);
        PyErr_NoMemory();
        return NULL;
    }
    axis->in_size = in_size, axis->out_size = out_size, axis->taps = taps, axis->xtaps = (taps + 3) / 4 * 4;
    memcpy(&axis->in0_bits, &in0, 4);
    memcpy(&axis->in1_bits, &in1, 4);
    const char *error = fill_coefficients(in_size, in0, in1, out_size, taps, bicubic_filter, 2.0, axis->bounds, axis->kk, k);
    PyMem_RawFree(k);
    if (error) {
        PyErr_SetString(PyExc_ValueError, error);
        axis_release(axis);
        return NULL;
    }
    if (!rows_are_safe(axis->bounds, axis->kk, taps, out_size, in_size)) {
        axis_release(axis);
        return NULL;
    }
    axis->first = in_size, axis->end = 0;
    for (int i = 0; i < out_size; i++) {
        Py_ssize_t first = axis->bounds[i * 2], end = first + axis->bounds[i * 2 + 1];
        axis->first = first < axis->first ? first : axis->first;
        axis->end = end > axis->end ? end : axis->end;
    }
    if (axis->first > axis->end) { /* no output reads a pixel: an empty range */
        axis->first = axis->end;
    }
    return axis;
}

/* The axis for this geometry, kept or new, with a reference for the caller, and its expanded weights
 * where `expand`; NULL with an exception. Called with the GIL held. */
static resize_axis *
axis_get(int in_size, float in0, float in1, int out_size, int expand) {
    uint32_t in0_bits, in1_bits;
    memcpy(&in0_bits, &in0, 4);
    memcpy(&in1_bits, &in1, 4);
    resize_axis *axis = NULL;
    for (int i = 0; i < KEPT_RESIZE_AXES; i++) {
        resize_axis *kept = kept_resize_axes[i];
        if (kept && kept->in_size == in_size && kept->out_size == out_size && kept->in0_bits == in0_bits &&
            kept->in1_bits == in1_bits) {
            axis = kept;
            axis->refs++;
            break;
        }
    }
    if (!axis) {
        axis = axis_new(in_size, in0, in1, out_size);
        if (!axis) {
            return NULL;
        }
        Py_ssize_t bytes;
        if (product(out_size, (Py_ssize_t)axis->taps * 4 + 8 + (Py_ssize_t)axis->xtaps * 16, 1, &bytes) == 0 &&
            bytes <= KEPT_RESIZE_BYTES) {
            int i = next_resize_axis;
            next_resize_axis = (i + 1) % KEPT_RESIZE_AXES;
            axis_release(kept_resize_axes[i]);
            kept_resize_axes[i] = axis;
            axis->refs++;
        }
    }
    if (expand && !axis->expanded) {
        Py_ssize_t expanded_size = size_of(out_size, axis->xtaps, 16, "the expanded weights");
        int32_t *expanded = expanded_size < 0 ? NULL : PyMem_RawMalloc(expanded_size);
        if (!expanded) {
            if (expanded_size >= 0) {
                PyErr_NoMemory();
            }
            axis_release(axis);
            return NULL;
        }
        const int32_t *w = axis->kk, *b = axis->bounds;
        for (Py_ssize_t x = 0; x < out_size; x++) {
            for (int t = 0; t < axis->xtaps; t++) {
                const int32_t v = t < b[x * 2 + 1] ? w[x * axis->taps + t] : 0;
                int32_t *e = expanded + (x * axis->xtaps + t) * 4;
                e[0] = e[1] = e[2] = e[3] = v;
            }
        }
        axis->expanded = expanded;
    }
    return axis;
}

/* A horizontal pass: rows x in_w pixels of `channels` bytes at src (contiguous rows) to rows x out_w
 * at out. by_pixels: along the rows, 4-byte pixels, the axis's expanded weights; else down the
 * columns of a transposed copy (columns, across: scratch of (end - first) x rows and out_w x rows
 * pixels; acc: rows * channels int32). */
static void
horizontal_pass(const uint8_t *src, Py_ssize_t in_w, Py_ssize_t rows, int channels, const resize_axis *h,
                int by_pixels, uint8_t *out, uint8_t *columns, uint8_t *across, int32_t *acc) {
    const Py_ssize_t out_w = h->out_size;
    if (rows == 0) {
        return;
    }
    if (by_pixels) {
        horizontal4(src, in_w * 4, rows, in_w, h->bounds, h->expanded, h->xtaps, out, out_w);
        return;
    }
    const Py_ssize_t cols = h->end - h->first;
    if (channels == 4) {
        transpose_uint32_t((const uint32_t *)src + h->first, in_w, rows, cols, (uint32_t *)columns);
    } else {
        transpose_uint8_t(src + h->first, in_w, rows, cols, columns);
    }
    vertical(columns, rows * channels, h->bounds, h->kk, h->taps, h->first, across, out_w, acc);
    if (channels == 4) {
        transpose_uint32_t((const uint32_t *)across, rows, out_w, rows, (uint32_t *)out);
    } else {
        transpose_uint8_t(across, rows, out_w, rows, out);
    }
}

/* A resize of contiguous rows into contiguous rows: planned with the GIL held (the axes, kept or new;
 * the scratch, each of its exact size, so that the sanitizer build sees past any), run without it. */
typedef struct {
    int channels, in_w, out_w, out_h, need_h, need_v, v_first, by_pixels;
    resize_axis *h, *v;
    Py_ssize_t first, rows; /* horizontal first: the source rows the vertical pass reads */
    uint8_t *mid, *columns, *across;
    int32_t *acc;
} resize_plan;

static void
release_resize(resize_plan *p) {
    PyMem_RawFree(p->acc);
    PyMem_RawFree(p->across);
    PyMem_RawFree(p->columns);
    PyMem_RawFree(p->mid);
    axis_release(p->v);
    axis_release(p->h);
    memset(p, 0, sizeof(*p));
}

/* Plans Pillow's resample of the box (x0, y0, x1, y1) of in_w x in_h pixels of `channels` bytes (1 or 4)
 * to out_w x out_h, the passes as given (resample_image's arguments, checked by its caller); -1 with
 * an exception, nothing left to release. Called with the GIL held. */
static int
plan_resize(resize_plan *p, int channels, int in_w, int in_h, int out_w, int out_h, float x0, float y0, float x1,
            float y1, int need_h, int need_v, int v_first) {
    memset(p, 0, sizeof(*p));
    p->channels = channels, p->in_w = in_w, p->out_w = out_w, p->out_h = out_h;
    p->need_h = need_h, p->need_v = need_v, p->v_first = v_first;
    p->by_pixels = channels == 4 && isa != ISA_SCALAR;
    if ((need_h && !(p->h = axis_get(in_w, x0, x1, out_w, p->by_pixels))) ||
        (need_v && !(p->v = axis_get(in_h, y0, y1, out_h, 0)))) {
        release_resize(p);
        return -1;
    }
    const Py_ssize_t in_row = (Py_ssize_t)in_w * channels, out_row = (Py_ssize_t)out_w * channels;
    Py_ssize_t mid_size = 0, columns_size = 0, across_size = 0, acc_size = out_row > in_row ? out_row : in_row;
    if (need_h) {
        if (v_first) {
            p->rows = out_h;
        } else {
            p->first = need_v ? p->v->first : 0, p->rows = need_v ? p->v->end - p->v->first : in_h;
        }
        if (need_v) {
            mid_size = v_first ? size_of(out_h, in_row, 1, "mid") : size_of(p->rows, out_row, 1, "mid");
        }
        if (!p->by_pixels) {
            columns_size = size_of(p->h->end - p->h->first, p->rows, channels, "columns");
            across_size = size_of(out_w, p->rows, channels, "across");
            acc_size = p->rows * channels > acc_size ? p->rows * channels : acc_size;
        }
    }
    if (mid_size < 0 || columns_size < 0 || across_size < 0 || acc_size > PY_SSIZE_T_MAX / 4) {
        if (acc_size > PY_SSIZE_T_MAX / 4) {
            PyErr_SetString(PyExc_ValueError, "the sums' size overflows");
        }
        release_resize(p);
        return -1;
    }
    p->mid = PyMem_RawMalloc(mid_size), p->columns = PyMem_RawMalloc(columns_size);
    p->across = PyMem_RawMalloc(across_size), p->acc = PyMem_RawMalloc(acc_size * 4);
    if (!p->mid || !p->columns || !p->across || !p->acc) {
        release_resize(p);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Runs a planned resize from src (contiguous rows) into final (out_h contiguous rows); no GIL needed. */
static void
run_resize(const resize_plan *p, const uint8_t *src, uint8_t *final) {
    const Py_ssize_t in_row = (Py_ssize_t)p->in_w * p->channels, out_row = (Py_ssize_t)p->out_w * p->channels;
    if (p->v_first) {
        vertical(src, in_row, p->v->bounds, p->v->kk, p->v->taps, 0, p->need_h ? p->mid : final, p->out_h, p->acc);
        if (p->need_h) {
            horizontal_pass(p->mid, p->in_w, p->rows, p->channels, p->h, p->by_pixels, final, p->columns, p->across,
                            p->acc);
        }
        return;
    }
    if (p->need_h) {
        horizontal_pass(src + p->first * in_row, p->in_w, p->rows, p->channels, p->h, p->by_pixels,
                        p->need_v ? p->mid : final, p->columns, p->across, p->acc);
    }
    if (p->need_v) {
        vertical(p->need_h ? p->mid : src, out_row, p->v->bounds, p->v->kk, p->v->taps, p->need_h ? p->first : 0,
                 final, p->out_h, p->acc);
    }
}

/* The rows a resample_image call reads and writes where the image's lines are one buffer: a
 * read-only buffer that keeps the image core (its owner) alive. */
typedef struct {
    PyObject_HEAD
    PyObject *owner;
    void *buf;
    Py_ssize_t len;
} RowsObject;

static int
rows_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    RowsObject *rows = (RowsObject *)self;
    return PyBuffer_FillInfo(view, self, rows->buf, rows->len, 1, flags);
}

static void
rows_dealloc(PyObject *self) {
    Py_XDECREF(((RowsObject *)self)->owner);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs rows_as_buffer = {rows_getbuffer, NULL};

static PyTypeObject RowsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "beam_prep.write.images._resample.Rows",
    .tp_basicsize = sizeof(RowsObject),
    .tp_dealloc = rows_dealloc,
    .tp_as_buffer = &rows_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The rows of an image resample_image made: a read-only buffer that keeps the image alive.",
};

PyDoc_STRVAR(resample_image_doc,
"resample_image(src, dst, mode_name, channels, in_w, in_h, out_w, out_h, x0, y0, x1, y1,\n"
"               horizontal, vertical, vertical_first)\n\n"
"Pillow's bicubic resample of the box (x0, y0, x1, y1) of the image core src (Image.im:\n"
"in_w x in_h pixels of `channels` bytes, 1 or 4) into the image core dst (out_w x out_h, made\n"
"for it), in one call: Pillow's coefficients (the last axes' kept for the next image of the\n"
"same geometry), the horizontal pass where `horizontal` (over the rows the vertical pass reads),\n"
"the vertical pass where `vertical`, in that order, or vertical first where `vertical_first`.\n"
"mode_name: Pillow's image struct begins with the mode's name (before Pillow 12). The GIL is\n"
"released while the loops run.\n\n"
"Returns False where src's lines do not lie one after the other (nothing is done); else the\n"
"resized rows (a read-only buffer of out_h x out_w * channels bytes that keeps dst alive), or\n"
"None where dst's lines do not lie one after the other (its rows were written line by line).\n"
"ValueError for arguments that are not those images' or not Pillow's geometry, TypeError where\n"
"src or dst is not an image core.");

static PyObject *
resample_image(PyObject *self, PyObject *args) {
    PyObject *src_core, *dst_core;
    int mode_name, channels, in_w, in_h, out_w, out_h, need_h, need_v, v_first;
    float x0, y0, x1, y1;
    if (!PyArg_ParseTuple(args, "OOiiiiiiffffppp", &src_core, &dst_core, &mode_name, &channels, &in_w, &in_h, &out_w,
                          &out_h, &x0, &y0, &x1, &y1, &need_h, &need_v, &v_first)) {
        return NULL;
    }
    if ((channels != 1 && channels != 4) || in_w < 1 || in_h < 1 || out_w < 1 || out_h < 1) {
        PyErr_SetString(PyExc_ValueError, "channels must be 1 or 4, and every side at least 1");
        return NULL;
    }
    if ((!need_h && out_w != in_w) || (!need_v && out_h != in_h) || (!need_h && !need_v) || (v_first && !need_v)) {
        PyErr_SetString(PyExc_ValueError, "a pass not run must leave its side as it is, and one must run");
        return NULL;
    }
    if (src_core == dst_core) {
        PyErr_SetString(PyExc_ValueError, "dst is src");
        return NULL;
    }
    uint8_t **src_lines, **dst_lines;
    if (pillow_lines(src_core, mode_name, in_w, in_h, channels, &src_lines) < 0 ||
        pillow_lines(dst_core, mode_name, out_w, out_h, channels, &dst_lines) < 0) {
        return NULL;
    }
    const Py_ssize_t in_row = (Py_ssize_t)in_w * channels, out_row = (Py_ssize_t)out_w * channels;
    if (!lines_follow(src_lines, in_h, in_row)) {
        Py_RETURN_FALSE;
    }
    const int dst_whole = lines_follow(dst_lines, out_h, out_row);
    const uint8_t *src = src_lines[0];
    /* each product of two ints: no overflow in a Py_ssize_t */
    if (dst_whole && (const uint8_t *)dst_lines[0] < src + (Py_ssize_t)in_h * in_row &&
        src < (const uint8_t *)dst_lines[0] + (Py_ssize_t)out_h * out_row) {
        PyErr_SetString(PyExc_ValueError, "dst overlaps src");
        return NULL;
    }
    if (channels == 4 && (uintptr_t)src % 4) {
        PyErr_SetString(PyExc_ValueError, "4-byte pixels must be aligned");
        return NULL;
    }
    resize_plan plan;
    if (plan_resize(&plan, channels, in_w, in_h, out_w, out_h, x0, y0, x1, y1, need_h, need_v, v_first) < 0) {
        return NULL;
    }
    Py_ssize_t final_size = dst_whole ? 0 : size_of(out_h, out_row, 1, "out");
    PyObject *result = NULL;
    uint8_t *final = NULL;
    if (final_size < 0) {
        goto release;
    }
    final = dst_whole ? dst_lines[0] : PyMem_RawMalloc(final_size);
    if (!final) {
        PyErr_NoMemory();
        goto release;
    }
    Py_BEGIN_ALLOW_THREADS
    run_resize(&plan, src, final);
    if (!dst_whole) {
        for (Py_ssize_t y = 0; y < out_h; y++) {
            memcpy(dst_lines[y], final + y * out_row, out_row);
        }
    }
    Py_END_ALLOW_THREADS
    if (!dst_whole) {
        Py_INCREF(Py_None);
        result = Py_None;
    } else if ((result = PyType_GenericAlloc(&RowsType, 0))) {
        RowsObject *made = (RowsObject *)result;
        Py_INCREF(dst_core);
        made->owner = dst_core, made->buf = dst_lines[0], made->len = out_h * out_row;
    }
release:
    if (!dst_whole) {
        PyMem_RawFree(final);
    }
    release_resize(&plan);
    return result;
}

#include "_jpeg_path.h"

static PyMethodDef methods[] = {
    {"coefficients", coefficients, METH_VARARGS, coefficients_doc},
    {"filter_rows", filter_rows, METH_VARARGS, filter_rows_doc},
    {"transpose", transpose, METH_VARARGS, transpose_doc},
    {"filter_pixels", filter_pixels, METH_VARARGS, filter_pixels_doc},
    {"isas", isas, METH_NOARGS, isas_doc},
    {"get_isa", get_isa, METH_NOARGS, get_isa_doc},
    {"set_isa", set_isa, METH_O, set_isa_doc},
    {"preferred_isa", preferred_isa, METH_NOARGS, preferred_isa_doc},
    {"phash", phash, METH_VARARGS, phash_doc},
    {"resample_image", resample_image, METH_VARARGS, resample_image_doc},
#ifdef JPEG_PATH
    {"find_jpeg_library", find_jpeg_library, METH_O, find_jpeg_library_doc},
    {"jpeg_image", jpeg_image, METH_VARARGS, jpeg_image_doc},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_resample", "Pillow's bicubic resample loops, vectorised, and the perceptual hash (see _resample.c).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__resample(void) {
    if (PyType_Ready(&RowsType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (!m) {
        return NULL;
    }
#ifdef X86_VECTORS
    __builtin_cpu_init();
#endif
    /* The widest this CPU runs, but AVX2 where AVX-512 runs as two 256-bit halves (AMD's Zen 4),
     * which makes the RGB loops slower there (docs/design/resizing.md). */
    for (int i = ISA_COUNT - 1; i >= 0; i--) {
        if (isa_runs(i) && !(i == ISA_AVX512 && split_avx512())) {
            isa = preferred = i;
            break;
        }
    }
#ifdef BEAM_PREP_EXACT_SCRATCH
    /* A sanitizer build (tests/write/test_resample_sanitized.py), said to its fuzz: resample_image's
     * scratch is always allocated at its exact size, so that AddressSanitizer sees a read or write
     * past it (the older entry points take the caller's arrays). */
    if (m && PyModule_AddIntConstant(m, "EXACT_SCRATCH", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
