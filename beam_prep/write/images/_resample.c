/* The resize kernel's loops: Pillow's bicubic resample (libImaging/Resample.c), one pass over
 * contiguous rows.
 *
 * Built by setup.py as the optional extension beam_prep.write.images._resample (where it is not
 * built, beam-prep resizes with Pillow's own loops: the same pixels). beam_prep/write/images/
 * resample.py calls these three functions and holds every rule of Pillow's resize (pass order,
 * shortcuts, box checks); docs/design/resizing.md says why the result is Pillow's byte for byte:
 * the weights are Pillow's few double operations in its order (compiled with -ffp-contract=off,
 * so no fused multiply-add changes a rounding), the rest is integer arithmetic.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define PRECISION_BITS (32 - 8 - 2) /* Pillow's, for 8-bit images */

/* The integer loops compiled twice on x86-64 Linux with GCC, for the baseline and for AVX2, the
 * one this CPU runs chosen when the module loads (an ifunc): wider vectors where the CPU has them,
 * and no build that another CPU cannot run. Integer arithmetic: the same bytes either way. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 6
#define WIDE_VECTORS __attribute__((target_clones("avx2", "default")))
#else
#define WIDE_VECTORS
#endif

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
    double inv_filterscale = 1.0 / filterscale;
    double *k = PyMem_Malloc(taps * sizeof(double));
    if (!k) {
        PyErr_NoMemory();
        goto release;
    }
    for (Py_ssize_t xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        /* Pillow's (int) then clip, clipped first: the same ints, and no cast out of int's range */
        double lo = center - support + 0.5, hi = center + support + 0.5;
        int xmin = lo < 0 ? 0 : (int)lo;
        int xmax = hi >= in_size ? in_size : (int)hi;
        xmax -= xmin;
        if (xmax < 0 || xmax > taps) {
            PyErr_SetString(PyExc_ValueError, "a pixel's taps do not fit");
            goto free_k;
        }
        int x;
        for (x = 0; x < xmax; x++) {
            double w = bicubic_filter((x + xmin - center + 0.5) * inv_filterscale);
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
                PyErr_SetString(PyExc_ValueError, "a weight does not fit in 32 bits");
                goto free_k;
            }
            kk[xx * taps + x] = k[x] < 0 ? (int)(-0.5 + scaled) : (int)(0.5 + scaled);
        }
        bounds[xx * 2 + 0] = xmin;
        bounds[xx * 2 + 1] = xmax;
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

/* Each row of out: the weighted sum of the rows of src its bounds name, clipped to 8 bits. The
 * inner loops run over whole contiguous rows (all channels), which gcc vectorises. Integer sums in
 * any order are Pillow's exactly: every partial sum fits in 32 bits (filter_rows checks it). */
WIDE_VECTORS static void
filter_rows_loop(const uint8_t *src, Py_ssize_t width, const int32_t *bounds, const int32_t *weights,
                 int taps, uint8_t *out, Py_ssize_t out_rows, int32_t *acc) {
    for (Py_ssize_t yy = 0; yy < out_rows; yy++) {
        const Py_ssize_t first = bounds[yy * 2];
        const int count = bounds[yy * 2 + 1];
        const int32_t *k = &weights[yy * taps];
        for (Py_ssize_t i = 0; i < width; i++) {
            acc[i] = 1 << (PRECISION_BITS - 1);
        }
        int y = 0;
        for (; y + 4 <= count; y += 4) {
            const uint8_t *restrict r0 = src + (first + y) * width, *restrict r1 = r0 + width,
                          *restrict r2 = r1 + width, *restrict r3 = r2 + width;
            const int32_t w0 = k[y], w1 = k[y + 1], w2 = k[y + 2], w3 = k[y + 3];
            for (Py_ssize_t i = 0; i < width; i++) {
                acc[i] += r0[i] * w0 + r1[i] * w1 + r2[i] * w2 + r3[i] * w3;
            }
        }
        for (; y < count; y++) {
            const uint8_t *restrict row = src + (first + y) * width;
            const int32_t w = k[y];
            for (Py_ssize_t i = 0; i < width; i++) {
                acc[i] += row[i] * w;
            }
        }
        uint8_t *restrict line = out + yy * width;
        for (Py_ssize_t i = 0; i < width; i++) {
            int32_t v = acc[i] >> PRECISION_BITS;
            line[i] = v < 0 ? 0 : (v > 255 ? 255 : v);
        }
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
    filter_rows_loop(src.buf, width, bounds.buf, weights.buf, taps, out.buf, out_rows, acc.buf);
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

/* out (cols x rows) = the rows x cols block of src at (y0, x0) transposed, in 4x4 tiles. */
#define TRANSPOSE(T)                                                                              \
    WIDE_VECTORS static void transpose_##T(const T *src, Py_ssize_t stride, Py_ssize_t rows, Py_ssize_t cols,  \
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

static PyMethodDef methods[] = {
    {"coefficients", coefficients, METH_VARARGS, coefficients_doc},
    {"filter_rows", filter_rows, METH_VARARGS, filter_rows_doc},
    {"transpose", transpose, METH_VARARGS, transpose_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_resample", "Pillow's bicubic resample loops, vectorised (see _resample.c).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__resample(void) {
    PyObject *m = PyModule_Create(&module);
#ifdef BEAM_PREP_EXACT_SCRATCH
    /* A sanitizer build (tests/write/test_resample_sanitized.py): resample.py then gives every call
     * scratch arrays of exact size, so that AddressSanitizer sees a read or write past one. */
    if (m && PyModule_AddIntConstant(m, "EXACT_SCRATCH", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
