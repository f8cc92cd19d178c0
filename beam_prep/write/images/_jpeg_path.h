/* The JPEG fast path (jpeg_image): one call from a JPEG file's bytes to its record's image, the work of
 * imaging.process_image for the common case, with the GIL released while it decodes, resizes, hashes
 * and encodes.
 *
 * Its bytes are the Pillow path's: it calls the very libjpeg Pillow's _imaging loaded (found with
 * dlsym through _imaging's own dependencies: no JPEG library is linked here; libjpeg/README.md) with
 * Pillow's settings, and the resize and the hash are the kernel's. What Pillow reads of a JPEG before
 * it decodes (its markers, the EXIF orientation, the draft scale) is mirrored for the files Pillow
 * reads plainly; anything else (a marker out of place, EXIF Pillow reads by its own lenient rules, a
 * warning or an error of libjpeg's, CMYK, 12-bit, arithmetic coding, an MPO) is declined with a
 * reason, and the caller gives the file to Pillow, which answers as it always did.
 * tests/write/test_jpeg_path.py holds the two paths to the same bytes; docs/design/jpeg-path.md says why.
 */
#if defined(__unix__) || defined(__APPLE__)
#define JPEG_PATH 1
#include <dlfcn.h>
#include <setjmp.h>
#include <stdio.h>

#include "libjpeg/jpeglib.h"

/* libjpeg's entry points, from Pillow's copy. */
static struct {
    int state; /* 0: not looked for; 1: found; -1: not found (why: jpeg_missing) */
    char why[200];
    __typeof__(jpeg_std_error) *std_error;
    __typeof__(jpeg_CreateDecompress) *create_decompress;
    __typeof__(jpeg_mem_src) *mem_src;
    __typeof__(jpeg_read_header) *read_header;
    __typeof__(jpeg_start_decompress) *start_decompress;
    __typeof__(jpeg_read_scanlines) *read_scanlines;
    __typeof__(jpeg_skip_scanlines) *skip_scanlines;
    __typeof__(jpeg_crop_scanline) *crop_scanline;
    __typeof__(jpeg_finish_decompress) *finish_decompress;
    __typeof__(jpeg_destroy_decompress) *destroy_decompress;
    __typeof__(jpeg_CreateCompress) *create_compress;
    __typeof__(jpeg_mem_dest) *mem_dest;
    __typeof__(jpeg_set_defaults) *set_defaults;
    __typeof__(jpeg_set_quality) *set_quality;
    __typeof__(jpeg_start_compress) *start_compress;
    __typeof__(jpeg_write_scanlines) *write_scanlines;
    __typeof__(jpeg_write_marker) *write_marker;
    __typeof__(jpeg_finish_compress) *finish_compress;
    __typeof__(jpeg_destroy_compress) *destroy_compress;
} jl;

/* libjpeg's errors end the call (longjmp); its warnings and messages are counted, never printed. */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
} jpeg_errors;

static void
jpeg_error_exit(j_common_ptr cinfo) {
    longjmp(((jpeg_errors *)cinfo->err)->jump, 1);
}

static void
jpeg_quiet(j_common_ptr cinfo) {
    (void)cinfo;
}

/* libjpeg's standard error manager in `errors`, but that errors jump to errors->jump (set by the caller's
 * setjmp) and nothing is printed. */
static struct jpeg_error_mgr *
quiet_errors(jpeg_errors *errors) {
    struct jpeg_error_mgr *err = jl.std_error(&errors->pub);
    err->error_exit = jpeg_error_exit;
    err->output_message = jpeg_quiet;
    return err;
}

/* Finds libjpeg's entry points through the module at `imaging` (PIL._imaging's file, loaded): 0, or -1
 * with jl.why set. Called with the GIL held. */
static int
find_libjpeg(const char *imaging) {
    void *handle = dlopen(imaging, RTLD_LAZY | RTLD_NOLOAD);
    if (!handle) {
        snprintf(jl.why, sizeof(jl.why), "Pillow's _imaging is not loaded (%s)", imaging);
        return -1;
    }
#define FIND(field, name)                                                                                    \
    if (!(*(void **)&jl.field = dlsym(handle, name))) {                                                     \
        snprintf(jl.why, sizeof(jl.why), "Pillow's _imaging does not load a libjpeg with %s", name);         \
        dlclose(handle);                                                                                     \
        return -1;                                                                                           \
    }
    FIND(std_error, "jpeg_std_error")
    FIND(create_decompress, "jpeg_CreateDecompress")
    FIND(mem_src, "jpeg_mem_src")
    FIND(read_header, "jpeg_read_header")
    FIND(start_decompress, "jpeg_start_decompress")
    FIND(read_scanlines, "jpeg_read_scanlines")
    FIND(skip_scanlines, "jpeg_skip_scanlines")
    FIND(crop_scanline, "jpeg_crop_scanline")
    FIND(finish_decompress, "jpeg_finish_decompress")
    FIND(destroy_decompress, "jpeg_destroy_decompress")
    FIND(create_compress, "jpeg_CreateCompress")
    FIND(mem_dest, "jpeg_mem_dest")
    FIND(set_defaults, "jpeg_set_defaults")
    FIND(set_quality, "jpeg_set_quality")
    FIND(start_compress, "jpeg_start_compress")
    FIND(write_scanlines, "jpeg_write_scanlines")
    FIND(write_marker, "jpeg_write_marker")
    FIND(finish_compress, "jpeg_finish_compress")
    FIND(destroy_compress, "jpeg_destroy_compress")
#undef FIND
    dlclose(handle); /* Pillow's module holds it loaded, and with it libjpeg */
    /* A library of another interface (libjpeg 8's, 9's) refuses this struct: found here, not per image. */
    struct jpeg_decompress_struct cinfo;
    jpeg_errors errors;
    memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = quiet_errors(&errors);
    if (setjmp(errors.jump)) {
        jl.destroy_decompress(&cinfo);
        snprintf(jl.why, sizeof(jl.why), "Pillow's libjpeg has another interface than libjpeg 6.2's");
        return -1;
    }
    jl.create_decompress(&cinfo, JPEG_LIB_VERSION, sizeof(cinfo));
    jl.destroy_decompress(&cinfo);
    return 0;
}

/* ---- What Pillow reads before it decodes (JpegImagePlugin._open, Image.getexif), for plain files ---- */

enum {
    RESIZE_CENTER_CROP,
    RESIZE_STRETCH,
    RESIZE_PAD,
    RESIZE_SHORTER_SIDE,
    RESIZE_NONE,
};

/* Why a file is declined: the keys of jpeg_path.REASONS. */
#define DECLINE_MARKERS "markers"
#define DECLINE_CODING "coding"
#define DECLINE_CHANNELS "channels"
#define DECLINE_MPO "mpo"
#define DECLINE_EXIF "exif"
#define DECLINE_DAMAGED "damaged"
#define DECLINE_TOO_LARGE "too_large"
#define DECLINE_GEOMETRY "geometry"

typedef struct {
    int width, height, layers;
    int orientation;
    const uint8_t *comment; /* the last COM segment's bytes (Pillow's info["comment"]), or NULL */
    size_t comment_size;
} jpeg_header;

static inline unsigned
be16(const uint8_t *p) {
    return (unsigned)p[0] << 8 | p[1];
}

static inline uint32_t
read32(const uint8_t *p, int little) {
    return little ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
                  : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline unsigned
read16(const uint8_t *p, int little) {
    return little ? (unsigned)p[0] | (unsigned)p[1] << 8 : be16(p);
}

/* The bytes of each EXIF type Pillow loads (TiffImagePlugin's _load_dispatch); 0: a type it skips. */
static int
exif_unit(unsigned type) {
    static const int units[17] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4, 0, 0, 8};
    return type < 17 ? units[type] : 0;
}

/* The EXIF entries Pillow's reading decides on: Orientation, and the two tags whose values its
 * _read_dpi_from_exif reads (an odd type there can make Image.open itself fail). */
typedef struct {
    int orientation;           /* 0: none */
    int has_unit, has_xres;    /* ResolutionUnit, XResolution: present */
    int plain_unit, plain_xres; /* of a type and count Pillow reads without raising */
} exif_found;

/* IFD0 of the EXIF block (the APP1 payload after "Exif\0\0") as Pillow's ImageFileDirectory_v2.load
 * reads it: entries of a type it does not know skipped, a value past the block's end ending the read
 * (the entries before it kept), a later entry of a tag replacing an earlier one. 0, or -1 to decline
 * (a header Pillow refuses or reads another way, an IFD past the end). */
static int
read_exif(const uint8_t *d, size_t n, exif_found *found) {
    memset(found, 0, sizeof(*found));
    if (n == 0) {
        return 0; /* Pillow: no EXIF */
    }
    if (n >= 6 && memcmp(d, "Exif\0\0", 6) == 0) {
        return -1; /* Pillow strips it again */
    }
    if (n < 8) {
        return -1;
    }
    int little;
    if (memcmp(d, "II*\0", 4) == 0) {
        little = 1;
    } else if (memcmp(d, "MM\0*", 4) == 0) {
        little = 0;
    } else {
        return -1; /* not TIFF, BigTIFF, or a prefix Pillow reads its own way */
    }
    const uint32_t ifd = read32(d + 4, little);
    if (ifd > n || n - ifd < 2) {
        return -1;
    }
    const unsigned count = read16(d + ifd, little);
    for (unsigned i = 0; i < count; i++) {
        const size_t at = ifd + 2 + (size_t)i * 12;
        if (at + 12 > n) {
            return -1; /* a cut-short directory: Pillow keeps what it read; rare enough to leave to it */
        }
        const uint8_t *e = d + at;
        const unsigned tag = read16(e, little), type = read16(e + 2, little);
        const uint32_t values = read32(e + 4, little);
        const int unit = exif_unit(type);
        if (!unit) {
            continue;
        }
        const uint64_t size = (uint64_t)values * (uint64_t)unit;
        if (size > 4) {
            const uint32_t offset = read32(e + 8, little);
            if (offset > n || n - offset < size) {
                break; /* Pillow's read raises here: the entries after it are lost */
            }
        }
        if (size == 0) {
            continue;
        }
        if (tag == 0x0112) {
            if (type != 3 || values != 1) {
                return -1;
            }
            const unsigned v = read16(e + 8, little);
            found->orientation = v >= 1 && v <= 8 ? (int)v : -1; /* -1: present, not a turn (Pillow: 1) */
        } else if (tag == 0x0128) {
            found->has_unit = 1, found->plain_unit = type == 3 && values == 1;
        } else if (tag == 0x011A) {
            found->has_xres = 1, found->plain_xres = (type == 5 || type == 3 || type == 4) && values == 1;
        }
    }
    return 0;
}

/* The digit Pillow's getexif takes from XMP (tiff:Orientation="N" or >N), or 0. */
static int
xmp_orientation(const uint8_t *d, size_t n) {
    static const char key[] = "tiff:Orientation";
    const size_t k = sizeof(key) - 1;
    for (size_t i = 0; i + k + 1 < n; i++) {
        if (d[i] == 't' && memcmp(d + i, key, k) == 0) {
            const uint8_t *p = d + i + k;
            size_t left = n - i - k;
            if (left >= 3 && p[0] == '=' && p[1] == '"' && p[2] >= '0' && p[2] <= '9') {
                return p[2] - '0' ? p[2] - '0' : -1;
            }
            if (left >= 2 && p[0] == '>' && p[1] >= '0' && p[1] <= '9') {
                return p[1] - '0' ? p[1] - '0' : -1;
            }
        }
    }
    return 0;
}

/* Whether Pillow's reading of a Photoshop APP13 block stops without an exception (its loop catches
 * struct.error only: a name length past the end raises IndexError, and Image.open fails). */
static int
photoshop_reads(const uint8_t *s, size_t n) {
    size_t offset = 14;
    while (offset + 4 <= n && memcmp(s + offset, "8BIM", 4) == 0) {
        offset += 4;
        if (offset + 2 > n) {
            return 1;
        }
        offset += 2;
        if (offset >= n) {
            return 0; /* IndexError */
        }
        offset += 1 + s[offset];
        offset += offset & 1;
        if (offset + 4 > n) {
            return 1;
        }
        const size_t size = read32(s + offset, 0);
        offset += 4;
        /* ResolutionInfo reads 14 bytes of its data: struct.error where fewer, caught */
        if (size > n - (offset < n ? offset : n)) {
            return 1; /* the data runs past the end; the next signature cannot follow */
        }
        offset += size;
        offset += offset & 1;
    }
    return 1;
}

/* Reads the markers up to the first scan as Pillow's JpegImageFile._open does, for a file laid out
 * plainly; NULL, or the reason to decline. */
static const char *
read_header(const uint8_t *d, size_t n, jpeg_header *h) {
    memset(h, 0, sizeof(*h));
    size_t at = 2; /* after SOI; the caller checked FF D8 FF */
    const uint8_t *exif = NULL, *xmp = NULL;
    size_t exif_n = 0, xmp_n = 0;
    int frames = 0, dpi_from_jfif = 0;
    while (1) {
        if (at + 4 > n || d[at] != 0xFF) {
            return DECLINE_MARKERS; /* junk, fill bytes or the end: Pillow skips or fails its own way */
        }
        const unsigned marker = 0xFF00 | d[at + 1];
        const size_t length = be16(d + at + 2);
        if (length < 2 || length - 2 > n - at - 4) {
            return DECLINE_MARKERS;
        }
        const uint8_t *s = d + at + 4;
        const size_t len = length - 2;
        if (marker == 0xFFDA) { /* the first scan: what Pillow reads ends here */
            break;
        } else if (marker == 0xFFC0 || marker == 0xFFC1 || marker == 0xFFC2) {
            if (frames++ || len < 6) {
                return DECLINE_MARKERS;
            }
            if (s[0] != 8) {
                return DECLINE_CODING; /* 12-bit: Pillow refuses it */
            }
            h->height = (int)be16(s + 1), h->width = (int)be16(s + 3), h->layers = s[5];
            if (h->layers != 1 && h->layers != 3) {
                return DECLINE_CHANNELS; /* CMYK, or a count Pillow refuses */
            }
            if (len != 6 + 3 * (size_t)h->layers) {
                return DECLINE_MARKERS;
            }
        } else if ((marker >= 0xFFC3 && marker <= 0xFFCF && marker != 0xFFC4) || marker == 0xFFDE) {
            return DECLINE_CODING; /* lossless, hierarchical, arithmetic */
        } else if (marker == 0xFFDB) { /* DQT: Pillow checks each table's length */
            size_t i = 0;
            while (i < len) {
                const size_t table = 1 + (s[i] >> 4 ? 128 : 64);
                if (len - i < table) {
                    return DECLINE_MARKERS;
                }
                i += table;
            }
        } else if (marker >= 0xFFE0 && marker <= 0xFFEF) {
            if (marker == 0xFFE0 && len >= 4 && memcmp(s, "JFIF", 4) == 0) {
                if (len < 7) {
                    return DECLINE_MARKERS; /* Pillow reads its version by struct, uncaught */
                }
                dpi_from_jfif |= len >= 12 && (s[7] == 1 || s[7] == 2); /* its density, where it reads one */
            } else if (marker == 0xFFE1 && len >= 6 && memcmp(s, "Exif\0\0", 6) == 0) {
                if (exif) {
                    return DECLINE_EXIF; /* Pillow joins them */
                }
                exif = s + 6, exif_n = len - 6;
            } else if (marker == 0xFFE1 && len >= 29 && memcmp(s, "http://ns.adobe.com/xap/1.0/\0", 29) == 0) {
                xmp = s + 29, xmp_n = len - 29; /* the last one counts */
            } else if (marker == 0xFFE2 && len >= 4 && memcmp(s, "MPF\0", 4) == 0) {
                return DECLINE_MPO;
            } else if (marker == 0xFFE2 && len >= 12 && memcmp(s, "ICC_PROFILE\0", 12) == 0 && len < 14) {
                return DECLINE_MARKERS; /* Pillow indexes its sequence bytes */
            } else if (marker == 0xFFED && len >= 14 && memcmp(s, "Photoshop 3.0\0", 14) == 0 &&
                       !photoshop_reads(s, len)) {
                return DECLINE_MARKERS;
            } else if (marker == 0xFFEE && len >= 5 && memcmp(s, "Adobe", 5) == 0 && len < 7) {
                return DECLINE_MARKERS;
            }
        } else if (marker == 0xFFFE) {
            h->comment = s, h->comment_size = len;
        } else if (marker != 0xFFC4 && marker != 0xFFDD) {
            return DECLINE_MARKERS; /* DHT, DRI and COM are read; SOI, EOI, RSTn, DNL, JPGn... are not plain */
        }
        at += 2 + length;
    }
    if (frames != 1 || h->width < 1 || h->height < 1) {
        return DECLINE_MARKERS;
    }
    exif_found found;
    if (exif && read_exif(exif, exif_n, &found) < 0) {
        return DECLINE_EXIF;
    }
    if (!exif) {
        memset(&found, 0, sizeof(found));
    }
    if (!dpi_from_jfif && exif && found.has_unit && found.has_xres && !(found.plain_unit && found.plain_xres)) {
        return DECLINE_EXIF; /* Pillow's dpi from EXIF may raise in Image.open */
    }
    int orientation = found.orientation;
    if (orientation == 0 && xmp) {
        orientation = xmp_orientation(xmp, xmp_n);
    }
    h->orientation = orientation >= 1 && orientation <= 8 ? orientation : 1;
    return NULL;
}

/* ---- The geometry: imaging.py's, in its order of double operations ---- */

static int
swaps(int orientation) {
    return orientation >= 5;
}

/* _scaled_size: the size the whole (oriented) image is scaled to; 0 for resize mode none. */
static int
scaled_size(double width, double height, int mode, int out_w, int out_h, double *sw, double *sh) {
    double scale;
    switch (mode) {
    case RESIZE_NONE:
        return 0;
    case RESIZE_STRETCH:
        *sw = out_w, *sh = out_h;
        return 1;
    case RESIZE_CENTER_CROP:
        scale = fmax((double)out_w / width, (double)out_h / height);
        break;
    case RESIZE_PAD:
        scale = fmin((double)out_w / width, (double)out_h / height);
        break;
    default: /* shorter_side */
        scale = (double)out_h / fmin(width, height);
    }
    *sw = width * scale, *sh = height * scale;
    return 1;
}

/* exif_transpose's turn of rows x cols pixels of `size` bytes (1 or 4) from src into dst. */
static void
turn(const uint8_t *src, int w, int h, int size, int orientation, uint8_t *dst) {
    const int ow = swaps(orientation) ? h : w, oh = swaps(orientation) ? w : h;
    for (int y = 0; y < oh; y++) {
        for (int x = 0; x < ow; x++) {
            int sx, sy;
            switch (orientation) {
            case 2: sx = w - 1 - x, sy = y; break;              /* FLIP_LEFT_RIGHT */
            case 3: sx = w - 1 - x, sy = h - 1 - y; break;      /* ROTATE_180 */
            case 4: sx = x, sy = h - 1 - y; break;              /* FLIP_TOP_BOTTOM */
            case 5: sx = y, sy = x; break;                      /* TRANSPOSE */
            case 6: sx = y, sy = h - 1 - x; break;              /* ROTATE_270 */
            case 7: sx = w - 1 - y, sy = h - 1 - x; break;      /* TRANSVERSE */
            default: sx = w - 1 - y, sy = x; break;             /* 8: ROTATE_90 */
            }
            memcpy(dst + ((size_t)y * ow + x) * size, src + ((size_t)sy * w + sx) * size, size);
        }
    }
}

/* One run of the resize step (resample.resize's choices, for one plain call): */
enum { STEP_KEEP, STEP_COPY, STEP_CROP, STEP_KERNEL };

static inline int
f32_is_whole(float v) {
    return v == truncf(v);
}

/* _taps: precompute_coeffs' taps a pixel, or 0 where Pillow raises MemoryError. */
static int
pillow_taps(float in0, float in1, int out_size) {
    const float diff = in1 - in0;
    const double scale = (double)diff / out_size;
    const double support = 2.0 * (scale < 1.0 ? 1.0 : scale);
    const double taps = ceil(support) * 2 + 1;
    if (taps * 8 > INT_MAX || out_size > INT_MAX / (taps * 8)) {
        return 0;
    }
    return (int)taps;
}

/* What resample.resize does for (in_w, in_h) -> (out_w, out_h) over `box` (float32): a STEP_, or -1
 * where Pillow raises or resizes by rules the path does not take. */
static int
resize_step(int in_w, int in_h, int out_w, int out_h, const float *b, int tall_first, int horizontal_always,
            int *need_h, int *need_v) {
    if (tall_first && in_h > (double)in_w * 100 && out_h < in_h) {
        return -1; /* vertically first, in two calls */
    }
    if (out_w < 1 || out_h < 1 || b[0] < 0 || b[1] < 0 || b[2] > (float)in_w || b[3] > (float)in_h ||
        (float)(b[2] - b[0]) < 0 || (float)(b[3] - b[1]) < 0) {
        return -1; /* Pillow's ValueError */
    }
    if (f32_is_whole(b[0]) && (float)(b[2] - b[0]) == (float)out_w && f32_is_whole(b[1]) &&
        (float)(b[3] - b[1]) == (float)out_h) {
        return STEP_CROP;
    }
    if (out_w > INT_MAX / 4 - 1) {
        return -1;
    }
    *need_h = out_w != in_w || b[0] != 0 || b[2] != (float)out_w;
    *need_v = out_h != in_h || b[1] != 0 || b[3] != (float)out_h;
    if (!pillow_taps(b[1], b[3], out_h) || ((horizontal_always || *need_h) && !pillow_taps(b[0], b[2], out_w))) {
        return -1;
    }
    return *need_h || *need_v ? STEP_KERNEL : STEP_COPY;
}

/* Whether Pillow's image of w x h pixels of `size` bytes lies in several blocks of its arena's
 * `block_size` (Storage.c's ImagingAllocateArray, lines unpadded): its pixels cannot be handed over
 * whole, so resample.resize has Pillow's loops resize it. */
static int
several_blocks(int w, int h, int size, long long block_size) {
    const long long line = (long long)w * size, lines = block_size / line;
    return h > (lines > 1 ? lines : 1);
}

/* ---- The call ---- */

/* Everything one image needs, planned with the GIL held. */
typedef struct {
    const uint8_t *data;
    size_t size;
    jpeg_header head;
    int scale;              /* the draft's 1/scale */
    int gray_decode;        /* libjpeg decodes to grayscale (draft to L, or a 1-layer file) */
    int dec_w, dec_h;       /* the decoded grid */
    int win[4];             /* the part of it the resize reads (x0, y0, x1, y1): the rest is not decoded */
    int px;                 /* bytes a pixel from the decode on: 1 (L) or 4 (RGB as RGBX) */
    int to_rgb, to_grey;    /* L to RGB (a grey file, 3 channels), RGB to L (undrafted, 1 channel) */
    int turned_w, turned_h; /* after the EXIF turn */
    int step;               /* STEP_ of the resize, or STEP_KEEP: no resize (mode none, or unchanged) */
    int sized_w, sized_h;   /* the resize's output */
    int crop_x, crop_y;     /* STEP_CROP: where */
    int out_w, out_h;       /* the final image (the canvas, for pad) */
    int pad_x, pad_y;       /* pad: where the resized image lies on it */
    int quality, hash;
    int resized;            /* what resample.resize tallies: 0 nothing, 1 the kernel, 2 Pillow */
    int pillow_loops;       /* STEP_KERNEL where resample.resize has Pillow's loops resize (same pixels) */
    int keeps_comment;      /* the image saved is the decoded one's or Pillow's copy or resize of it, whose
                               info holds the source's comment (Image._new copies it; the kernel's image
                               and pad's canvas, made for every image pad resizes, are new) */
    resize_plan resize;
    phash_plan ph;
} jpeg_job;

/* Decodes (the draft scale, Pillow's out colour space) into px-byte pixels at `out`; 0, or -1 where
 * libjpeg failed or warned. */
static int
decode(const jpeg_job *job, uint8_t *out) {
    struct jpeg_decompress_struct cinfo;
    jpeg_errors errors;
    int ok = -1;
    memset(&cinfo, 0, sizeof(cinfo)); /* an error inside create leaves nothing for destroy to free */
    cinfo.err = quiet_errors(&errors);
    if (setjmp(errors.jump)) {
        jl.destroy_decompress(&cinfo);
        return -1;
    }
    jl.create_decompress(&cinfo, JPEG_LIB_VERSION, sizeof(cinfo));
    jl.mem_src(&cinfo, job->data, (unsigned long)job->size);
    jl.read_header(&cinfo, TRUE);
    if ((int)cinfo.image_width != job->head.width || (int)cinfo.image_height != job->head.height ||
        cinfo.num_components != job->head.layers) {
        goto done;
    }
    cinfo.out_color_space = job->gray_decode ? JCS_GRAYSCALE : JCS_EXT_RGBX;
    if (job->scale > 1) {
        cinfo.scale_num = 1, cinfo.scale_denom = (unsigned)job->scale;
    }
    jl.start_decompress(&cinfo);
    const int size = job->gray_decode ? 1 : 4;
    if ((int)cinfo.output_width != job->dec_w || (int)cinfo.output_height != job->dec_h ||
        cinfo.output_components != size) {
        goto done; /* unreachable for the sizes read_header found */
    }
    /* Only the window, widened by a whole iMCU each way (libjpeg aligns a crop to iMCUs, and its
     * upsampling reads a neighbour past each side): every pixel inside is the whole decode's. */
    const int across = cinfo.max_h_samp_factor * cinfo.min_DCT_scaled_size;
    const int down = cinfo.max_v_samp_factor * cinfo.min_DCT_scaled_size;
    const int x0 = job->win[0] - across > 0 ? job->win[0] - across : 0;
    const int x1 = job->win[2] + across < job->dec_w ? job->win[2] + across : job->dec_w;
    const int y0 = job->win[1] - 2 * down > 0 ? job->win[1] - 2 * down : 0;
    const int y1 = job->win[3] + 2 * down < job->dec_h ? job->win[3] + 2 * down : job->dec_h;
    JDIMENSION xoffset = 0, width = (JDIMENSION)job->dec_w;
    if (x0 > 0 || x1 < job->dec_w) {
        xoffset = (JDIMENSION)x0, width = (JDIMENSION)(x1 - x0);
        jl.crop_scanline(&cinfo, &xoffset, &width);
    }
    if (y0 > 0 && jl.skip_scanlines(&cinfo, (JDIMENSION)y0) != (JDIMENSION)y0) {
        goto done;
    }
    while ((int)cinfo.output_scanline < y1) {
        JSAMPROW rows[4];
        int n = 0;
        for (; n < 4 && (int)cinfo.output_scanline + n < y1; n++) {
            rows[n] = out + ((size_t)(cinfo.output_scanline + n) * job->dec_w + xoffset) * size;
        }
        if (jl.read_scanlines(&cinfo, rows, (JDIMENSION)n) == 0) {
            goto done;
        }
    }
    if (y1 < job->dec_h && jl.skip_scanlines(&cinfo, (JDIMENSION)(job->dec_h - y1)) != (JDIMENSION)(job->dec_h - y1)) {
        goto done;
    }
    jl.finish_decompress(&cinfo);
    ok = errors.pub.num_warnings ? -1 : 0;
done:
    jl.destroy_decompress(&cinfo);
    return ok;
}

/* Encodes rows of w x h pixels (1: L, 4: RGBX) as Pillow's save(..., "JPEG", quality=q) does (with the
 * COM segment `comment`, where Pillow's image carries one in its info), into
 * *buffer (malloc'd by libjpeg, *n bytes; the caller frees it); 0, or -1 where libjpeg failed. */
static int
encode(const uint8_t *pixels, int w, int h, int size, int quality, const uint8_t *comment, size_t comment_size,
       unsigned char **buffer, unsigned long *n) {
    struct jpeg_compress_struct cinfo;
    jpeg_errors errors;
    memset(&cinfo, 0, sizeof(cinfo));
    *buffer = NULL, *n = 0; /* the caller's: what libjpeg allocated is freed there, error or not */
    cinfo.err = quiet_errors(&errors);
    if (setjmp(errors.jump)) {
        jl.destroy_compress(&cinfo);
        return -1;
    }
    jl.create_compress(&cinfo, JPEG_LIB_VERSION, sizeof(cinfo));
    jl.mem_dest(&cinfo, buffer, n);
    cinfo.image_width = (JDIMENSION)w, cinfo.image_height = (JDIMENSION)h;
    cinfo.input_components = size == 1 ? 1 : 4;
    cinfo.in_color_space = size == 1 ? JCS_GRAYSCALE : JCS_EXT_RGBX;
    jl.set_defaults(&cinfo);
    jl.set_quality(&cinfo, quality, TRUE);
    jl.start_compress(&cinfo, TRUE);
    if (comment && comment_size > 0) {
        jl.write_marker(&cinfo, JPEG_COM, comment, (unsigned)comment_size);
    }
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = (JSAMPROW)(pixels + (size_t)cinfo.next_scanline * w * size);
        jl.write_scanlines(&cinfo, &row, 1);
    }
    jl.finish_compress(&cinfo);
    jl.destroy_compress(&cinfo);
    return 0;
}

/* imaging._flat's colour of rows of w x h pixels (1 or 4 bytes; 3 bands of 4): "#rrggbb", or "" */
static void
flat_colour(const uint8_t *p, int w, int h, int size, char *colour) {
    const int bands = size == 1 ? 1 : 3;
    const int xs[4] = {0, w / 3, 2 * w / 3, w - 1}, ys[4] = {0, h / 3, 2 * h / 3, h - 1};
    int low[3] = {255, 255, 255}, high[3] = {0, 0, 0};
    colour[0] = 0;
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = p + ((size_t)ys[j] * w + xs[i]) * size;
            for (int b = 0; b < bands; b++) {
                low[b] = q[b] < low[b] ? q[b] : low[b], high[b] = q[b] > high[b] ? q[b] : high[b];
            }
        }
    }
    for (int b = 0; b < bands; b++) {
        if (high[b] - low[b] > 2) {
            return;
        }
    }
    const size_t count = (size_t)w * h;
    for (size_t i = 0; i < count; i++) {
        const uint8_t *q = p + i * size;
        for (int b = 0; b < bands; b++) {
            low[b] = q[b] < low[b] ? q[b] : low[b], high[b] = q[b] > high[b] ? q[b] : high[b];
        }
    }
    int mid[3];
    for (int b = 0; b < bands; b++) {
        if (high[b] - low[b] > 2) {
            return;
        }
        mid[b] = (low[b] + high[b]) / 2;
    }
    if (bands == 1) {
        mid[1] = mid[2] = mid[0];
    }
    snprintf(colour, 8, "#%02x%02x%02x", mid[0], mid[1], mid[2]);
}

/* Plans the image (jpeg_image's arguments in `job`, the header read): NULL, or the reason to decline.
 * Called with the GIL held; -1 in *error with an exception set where planning failed for want of
 * memory. */
static const char *
plan_job(jpeg_job *job, int mode, int out_w, int out_h, int channels, long long max_pixels, int no_upscale,
         double draft_gap, int tall_first, int horizontal_always, long long block_size, int *error) {
    jpeg_header *h = &job->head;
    const char *why = read_header(job->data, job->size, h);
    if (why) {
        return why;
    }
    if ((long long)h->width * h->height > max_pixels) {
        return DECLINE_TOO_LARGE;
    }
    const int swapped = swaps(h->orientation);
    if (no_upscale && mode == RESIZE_SHORTER_SIDE && (h->width < out_h || h->height < out_h)) {
        mode = RESIZE_NONE; /* _sized_for */
    }
    /* _draft: sized by the upright source */
    double region[4] = {0, 0, h->width, h->height};
    job->scale = 1;
    int l_draft = 0;
    double tw, th;
    if (scaled_size(swapped ? h->height : h->width, swapped ? h->width : h->height, mode, out_w, out_h, &tw, &th)) {
        double rw = ceil(tw * draft_gap), rh = ceil(th * draft_gap);
        if (swapped) {
            const double t = rw;
            rw = rh, rh = t;
        }
        if (rw < h->width && rh < h->height) {
            const long long s = (long long)h->width / (long long)rw < (long long)h->height / (long long)rh
                                    ? (long long)h->width / (long long)rw
                                    : (long long)h->height / (long long)rh;
            job->scale = s >= 8 ? 8 : s >= 4 ? 4 : s >= 2 ? 2 : 1;
            l_draft = h->layers == 3 && channels == 1;
            region[2] = (double)h->width / job->scale, region[3] = (double)h->height / job->scale;
        }
    }
    job->gray_decode = h->layers == 1 || l_draft;
    job->dec_w = (h->width + job->scale - 1) / job->scale, job->dec_h = (h->height + job->scale - 1) / job->scale;
    job->to_rgb = job->gray_decode && channels == 3;
    job->to_grey = !job->gray_decode && channels == 1;
    job->px = channels == 3 ? 4 : 1;
    /* exif_transpose, and _oriented's box */
    job->turned_w = swapped ? job->dec_h : job->dec_w, job->turned_h = swapped ? job->dec_w : job->dec_h;
    if (h->orientation != 1) {
        double left = region[0], top = region[1], right = region[2], bottom = region[3];
        const double width = job->dec_w, height = job->dec_h;
        const int o = h->orientation;
        if (o == 2 || o == 3 || o == 7 || o == 8) {
            const double l = width - right, r = width - left;
            left = l, right = r;
        }
        if (o == 3 || o == 4 || o == 6 || o == 7) {
            const double t = height - bottom, b = height - top;
            top = t, bottom = b;
        }
        if (swapped) {
            region[0] = top, region[1] = left, region[2] = bottom, region[3] = right;
        } else {
            region[0] = left, region[1] = top, region[2] = right, region[3] = bottom;
        }
    }
    /* _resize */
    job->step = STEP_KEEP;
    job->sized_w = job->out_w = job->turned_w, job->sized_h = job->out_h = job->turned_h;
    const double width = region[2] - region[0], height = region[3] - region[1];
    double sw, sh;
    float box[4];
    if (scaled_size(width, height, mode, out_w, out_h, &sw, &sh)) {
        if (mode == RESIZE_CENTER_CROP) {
            const double scale = sw / width;
            const double crop_w = fmin(width, out_w / scale), crop_h = fmin(height, out_h / scale);
            const double left = region[0] + (width - crop_w) / 2, top = region[1] + (height - crop_h) / 2;
            box[0] = (float)left, box[1] = (float)top, box[2] = (float)(left + crop_w), box[3] = (float)(top + crop_h);
            job->sized_w = out_w, job->sized_h = out_h;
            job->step = -2;
        } else {
            const double rw = nearbyint(sw), rh = nearbyint(sh);
            job->sized_w = rw < 1 ? 1 : (int)rw, job->sized_h = rh < 1 ? 1 : (int)rh;
            if (!(job->sized_w == job->turned_w && job->sized_h == job->turned_h && region[0] == 0 && region[1] == 0 &&
                  region[2] == job->turned_w && region[3] == job->turned_h)) {
                for (int i = 0; i < 4; i++) {
                    box[i] = (float)region[i];
                }
                job->step = -2;
            }
        }
        if (job->step == -2) {
            for (int i = 0; i < 4; i++) {
                if (!isfinite(box[i])) {
                    return DECLINE_GEOMETRY;
                }
            }
            int need_h = 0, need_v = 0;
            job->step = resize_step(job->turned_w, job->turned_h, job->sized_w, job->sized_h, box, tall_first,
                                    horizontal_always, &need_h, &need_v);
            if (job->step < 0) {
                return DECLINE_GEOMETRY;
            }
            /* resample.resize leaves a source Pillow keeps in several blocks to Pillow's loops (the same
             * pixels, in an image that keeps the source's info) */
            job->pillow_loops = job->step == STEP_KERNEL &&
                                several_blocks(job->turned_w, job->turned_h, job->px, block_size);
            job->resized = job->step == STEP_KERNEL && !job->pillow_loops ? 1 : 2;
            if (job->step == STEP_CROP) {
                job->crop_x = (int)box[0], job->crop_y = (int)box[1];
            } else if (job->step == STEP_KERNEL) {
                if (plan_resize(&job->resize, job->px, job->turned_w, job->turned_h, job->sized_w, job->sized_h, box[0],
                                box[1], box[2], box[3], need_h, need_v, 0) < 0) {
                    *error = -1;
                    return NULL;
                }
            }
        }
        job->out_w = job->sized_w, job->out_h = job->sized_h;
        if (mode == RESIZE_PAD) {
            job->out_w = out_w, job->out_h = out_h;
            job->pad_x = (out_w - job->sized_w) / 2, job->pad_y = (out_h - job->sized_h) / 2;
        }
    }
    if (job->out_w > JPEG_MAX_DIMENSION || job->out_h > JPEG_MAX_DIMENSION) {
        return DECLINE_GEOMETRY; /* too large a JPEG: Pillow's save fails, after all the work */
    }
    job->keeps_comment = mode != RESIZE_PAD && (job->step != STEP_KERNEL || job->pillow_loops);
    /* The window the resize reads, where the decoded grid is what it reads (upright, no conversion). */
    job->win[0] = job->win[1] = 0, job->win[2] = job->dec_w, job->win[3] = job->dec_h;
    if (h->orientation == 1 && !job->to_rgb && !job->to_grey) {
        if (job->step == STEP_KERNEL) {
            const resize_plan *p = &job->resize;
            if (p->need_h) {
                job->win[0] = (int)p->h->first, job->win[2] = (int)p->h->end;
            }
            if (p->need_v) {
                job->win[1] = (int)p->v->first, job->win[3] = (int)p->v->end;
            }
        } else if (job->step == STEP_CROP) {
            job->win[0] = job->crop_x, job->win[1] = job->crop_y;
            job->win[2] = job->crop_x + job->sized_w, job->win[3] = job->crop_y + job->sized_h;
        }
    }
    if (job->hash) {
        if (job->out_h > (double)job->out_w * 100) {
            return DECLINE_GEOMETRY; /* phash.phash hashes these with Pillow's own steps */
        }
        if (plan_phash(&job->ph, job->out_w, job->out_h) < 0) {
            *error = -1;
            return NULL;
        }
    }
    return NULL;
}

/* The work without the GIL: decode, turn, convert, resize, pad, hash, look for one colour, encode.
 * The encoded bytes (malloc'd) or NULL with *why set. */
static unsigned char *
run_job(jpeg_job *job, const double *dct, uint64_t *bits, char *colour, unsigned long *n, const char **why) {
    const int dec_px = job->gray_decode ? 1 : 4;
    uint8_t *decoded = NULL, *turned = NULL, *converted = NULL, *sized = NULL, *canvas = NULL;
    unsigned char *encoded = NULL;
    *why = "memory";
    decoded = malloc((size_t)job->dec_w * job->dec_h * dec_px);
    if (!decoded) {
        goto done;
    }
    if (decode(job, decoded) < 0) {
        *why = DECLINE_DAMAGED;
        goto done;
    }
    const uint8_t *image = decoded;
    if (job->head.orientation != 1) {
        if (!(turned = malloc((size_t)job->dec_w * job->dec_h * dec_px))) {
            goto done;
        }
        turn(decoded, job->dec_w, job->dec_h, dec_px, job->head.orientation, turned);
        image = turned;
    }
    const size_t count = (size_t)job->turned_w * job->turned_h;
    if (job->to_rgb || job->to_grey) { /* Pillow's convert: L to RGB copies; RGB to L as its L24 */
        if (!(converted = malloc(count * job->px))) {
            goto done;
        }
        for (size_t i = 0; i < count; i++) {
            if (job->to_rgb) {
                converted[i * 4] = converted[i * 4 + 1] = converted[i * 4 + 2] = image[i], converted[i * 4 + 3] = 255;
            } else {
                converted[i] = grey_of(image + i * 4);
            }
        }
        image = converted;
    }
    const int px = job->px;
    if (job->step != STEP_KEEP) {
        if (!(sized = malloc((size_t)job->sized_w * job->sized_h * px))) {
            goto done;
        }
        if (job->step == STEP_KERNEL) {
            run_resize(&job->resize, image, sized);
        } else { /* a crop (STEP_COPY: of the whole image) */
            for (int y = 0; y < job->sized_h; y++) {
                memcpy(sized + (size_t)y * job->sized_w * px,
                       image + ((size_t)(y + job->crop_y) * job->turned_w + job->crop_x) * px, (size_t)job->sized_w * px);
            }
        }
        image = sized;
    }
    if (job->out_w != job->sized_w || job->out_h != job->sized_h) { /* pad: on a black canvas */
        if (!(canvas = calloc((size_t)job->out_w * job->out_h, px))) {
            goto done;
        }
        for (int y = 0; y < job->sized_h; y++) {
            memcpy(canvas + ((size_t)(y + job->pad_y) * job->out_w + job->pad_x) * px, image + (size_t)y * job->sized_w * px,
                   (size_t)job->sized_w * px);
        }
        image = canvas;
    }
    if (job->hash) {
        uint8_t thumb[PHASH_SIDE * PHASH_SIDE];
        *bits = run_phash(&job->ph, image, px, dct, thumb);
    }
    flat_colour(image, job->out_w, job->out_h, px, colour);
    unsigned char *buffer = NULL;
    if (encode(image, job->out_w, job->out_h, px, job->quality, job->keeps_comment ? job->head.comment : NULL,
               job->head.comment_size, &buffer, n) < 0) {
        free(buffer);
        *why = DECLINE_DAMAGED; /* Pillow's encode answers (its error, as the Pillow path reports it) */
    } else {
        encoded = buffer;
    }
done:
    free(canvas);
    free(sized);
    free(converted);
    free(turned);
    free(decoded);
    return encoded;
}

PyDoc_STRVAR(find_jpeg_library_doc,
"find_jpeg_library(imaging)\n\n"
"Finds libjpeg's entry points through the loaded module at `imaging` (PIL._imaging's file): None,\n"
"or why the JPEG path cannot run. Once; later calls answer the same.");

static PyObject *
find_jpeg_library(PyObject *self, PyObject *arg) {
    if (jl.state == 0) {
        const char *path = PyUnicode_AsUTF8(arg);
        if (!path) {
            return NULL;
        }
        jl.state = find_libjpeg(path) == 0 ? 1 : -1;
    }
    if (jl.state > 0) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(jl.why);
}

PyDoc_STRVAR(jpeg_image_doc,
"jpeg_image(data, dct, resize_mode, width, height, channels, quality, max_pixels, no_upscale,\n"
"           draft_gap, perceptual_hash, tall_first, horizontal_always, block_size)\n\n"
"imaging.process_image's JPEG output for the JPEG file `data`, as the Pillow path makes it: a tuple\n"
"(encoded, width, height, phash or None, flat colour or None, upright width, upright height, the\n"
"file's channels 1 or 3, resized: 0 none, 1 the kernel, 2 Pillow's crop, copy or loops), or a str,\n"
"the reason it is declined (jpeg_path.REASONS). resize_mode: 0 center_crop, 1 stretch, 2 pad,\n"
"3 shorter_side, 4 none.\n"
"block_size: the bytes of a block of Pillow's images (Image.core.get_block_size()).\n"
"find_jpeg_library must have found libjpeg. The GIL is released while it decodes, resizes and encodes.");

static PyObject *
jpeg_image(PyObject *self, PyObject *args) {
    Py_buffer data, dct;
    int mode, out_w, out_h, channels, quality, no_upscale, hash, tall_first, horizontal_always;
    long long max_pixels, block_size;
    double draft_gap;
    if (!PyArg_ParseTuple(args, "y*y*iiiiiLpdpppL", &data, &dct, &mode, &out_w, &out_h, &channels, &quality,
                          &max_pixels, &no_upscale, &draft_gap, &hash, &tall_first, &horizontal_always,
                          &block_size)) {
        return NULL;
    }
    PyObject *result = NULL;
    jpeg_job job;
    memset(&job, 0, sizeof(job));
    if (jl.state <= 0) {
        PyErr_SetString(PyExc_RuntimeError, "find_jpeg_library has not found libjpeg");
        goto release;
    }
    if (mode < RESIZE_CENTER_CROP || mode > RESIZE_NONE || (channels != 1 && channels != 3) || quality < 1 ||
        quality > 100 || (mode != RESIZE_NONE && (out_w < 1 || out_h < 1)) ||
        dct.len < (Py_ssize_t)(PHASH_KEPT * PHASH_SIDE * sizeof(double)) || (uintptr_t)dct.buf % sizeof(double) ||
        block_size < 1) {
        PyErr_SetString(PyExc_ValueError, "arguments out of range");
        goto release;
    }
    if (data.len < 3 || memcmp(data.buf, "\xff\xd8\xff", 3) != 0) {
        result = PyUnicode_FromString("not_jpeg");
        goto release;
    }
    job.data = data.buf, job.size = (size_t)data.len, job.quality = quality, job.hash = hash;
    int error = 0;
    const char *why = plan_job(&job, mode, out_w, out_h, channels, max_pixels, no_upscale, draft_gap, tall_first,
                               horizontal_always, block_size, &error);
    if (error) {
        goto release;
    }
    if (why) {
        result = PyUnicode_FromString(why);
        goto release;
    }
    uint64_t bits = 0;
    char colour[8];
    unsigned long n = 0;
    unsigned char *encoded;
    Py_BEGIN_ALLOW_THREADS
    encoded = run_job(&job, dct.buf, &bits, colour, &n, &why);
    Py_END_ALLOW_THREADS
    if (!encoded) {
        result = PyUnicode_FromString(why);
        goto release;
    }
    const int swapped = swaps(job.head.orientation);
    PyObject *hashed = hash ? PyLong_FromUnsignedLongLong(bits) : (Py_INCREF(Py_None), Py_None);
    if (hashed) {
        result = Py_BuildValue("(y#iiN" "ziiii)", (const char *)encoded, (Py_ssize_t)n, job.out_w, job.out_h, hashed,
                               colour[0] ? colour : NULL, swapped ? job.head.height : job.head.width,
                               swapped ? job.head.width : job.head.height, job.head.layers, job.resized);
    }
    free(encoded);
release:
    release_phash(&job.ph);
    release_resize(&job.resize);
    PyBuffer_Release(&dct);
    PyBuffer_Release(&data);
    return result;
}

#endif /* unix */
